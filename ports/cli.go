package ports

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/checkins/checkins/app"
)

// The CLI's operational verbs (checkins status, poison ..., projections ...) drive the same use
// cases as the /ops routes: each verb declares its flags, has cmd connect (read the service's
// settings from the same flag set and the environment, build the adapters and the use cases),
// calls the use case and prints text or JSON.

// CLISession is a connected verb: the application to drive and what is left of its arguments.
type CLISession struct {
	App  app.Application
	Args []string // positional arguments
	// Poll is how often a verb that waits (projections rebuild) looks again.
	Poll time.Duration
	// Settle is how long a partition migration waits, after setting the quiesce flag, for every
	// process to see it and for requests admitted before to finish (poll interval plus
	// REQUEST_TIMEOUT).
	Settle time.Duration
	// RequestTimeout is the REQUEST_TIMEOUT that Settle allows for (this process's own): a
	// migration waits longer when an API process records a longer one.
	RequestTimeout time.Duration
	// MinReplicas and ReplicaTimeout (INGEST_MIN_REPLICAS, INGEST_REPLICA_TIMEOUT): a migration's
	// copy counts as written once that many replicas of each new partition have it.
	MinReplicas    int
	ReplicaTimeout time.Duration
	Close          func()
}

// Connect parses args on fs (the verb's flags, plus the service's settings that cmd adds) and
// connects; name is the verb ("poison list").
type Connect func(name string, fs *flag.FlagSet, args []string) (*CLISession, error)

// PermuteArgs moves positional arguments after the flags, because package flag stops at the
// first non-flag. Flags not listed in boolFlags take a value unless written --name=value.
func PermuteArgs(args []string, boolFlags map[string]bool) []string {
	flags, pos := splitArgs(args, boolFlags)
	if len(pos) == 0 {
		return flags
	}
	return append(append(flags, "--"), pos...) // positional, whatever they look like
}

// splitArgs parts args into flags (each with its value, boolFlags take none) and positional
// arguments, in their order; everything after "--" is positional.
func splitArgs(args []string, boolFlags map[string]bool) (flags, pos []string) {
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			pos = append(pos, args[i+1:]...)
			break
		}
		if !strings.HasPrefix(a, "-") || a == "-" {
			pos = append(pos, a)
			continue
		}
		flags = append(flags, a)
		name := strings.TrimLeft(a, "-")
		if strings.Contains(name, "=") || boolFlags[name] {
			continue
		}
		if i+1 < len(args) {
			flags = append(flags, args[i+1])
			i++
		}
	}
	return flags, pos
}

// pickVerb reads the verb, one of verbs: the first argument that is neither a flag nor a
// flag's value (boolFlags take none), so that flags may also come before it ("poison --json
// list"). It returns the verb and the other arguments, flags first; otherwise it prints usage
// and says what is wrong (flag.ErrHelp for -h).
func pickVerb(args []string, boolFlags map[string]bool, usage string, stderr io.Writer, verbs ...string) (string, []string, error) {
	alternatives := verbs[0]
	if len(verbs) > 1 {
		alternatives = strings.Join(verbs[:len(verbs)-1], ", ") + " or " + verbs[len(verbs)-1]
	}
	flags, pos := splitArgs(args, boolFlags)
	if len(pos) == 0 {
		fmt.Fprint(stderr, usage)
		if slices.Contains(flags, "-h") || slices.Contains(flags, "--help") || slices.Contains(flags, "-help") {
			return "", nil, flag.ErrHelp
		}
		return "", nil, errors.New("missing verb: " + alternatives)
	}
	if !slices.Contains(verbs, pos[0]) {
		fmt.Fprint(stderr, usage)
		return "", nil, fmt.Errorf("unknown verb %q: use %s", pos[0], alternatives)
	}
	if len(pos) > 1 {
		flags = append(append(flags, "--"), pos[1:]...) // positional, whatever they look like
	}
	return pos[0], flags, nil
}

// listOnly is for a verb that takes no positional arguments.
func listOnly(s *CLISession) error {
	if len(s.Args) > 0 {
		return fmt.Errorf("unexpected arguments: %v", s.Args)
	}
	return nil
}

// printAs writes v as JSON or, for people, with text.
func printAs[T any](w io.Writer, asJSON bool, v T, text func(io.Writer, T) error) error {
	if asJSON {
		return WriteJSON(w, v)
	}
	return text(w, v)
}

// WriteJSON prints v as indented JSON, as every `--json` of the CLI does.
func WriteJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// newVerbFlags is the flag set of one verb, printing usage and its flags on --help.
func newVerbFlags(name, usage string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("checkins "+name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, usage, "\nFlags:\n")
		fs.PrintDefaults()
	}
	return fs
}

// DecimalInt defines an integer flag read in base 10 only, as JSON writes integers: the flag
// package's Int reads "010" as 8 and "0x10" as 16, so `token --user 010` minted a token for user
// 8 and `partitions migrate --to 010` moved the stream to 8 partitions.
func DecimalInt[T int | int64](fs *flag.FlagSet, name string, def T, usage string) *T {
	v := def
	fs.Var(decimalFlag[T]{&v}, name, usage)
	return &v
}

type decimalFlag[T int | int64] struct{ v *T }

func (d decimalFlag[T]) String() string {
	if d.v == nil {
		return "0"
	}
	return strconv.FormatInt(int64(*d.v), 10)
}

func (d decimalFlag[T]) Set(s string) error {
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || !asJSONInteger(s) || int64(T(n)) != n {
		return fmt.Errorf("must be a decimal integer (no leading zero, sign or base prefix), got %q", s)
	}
	*d.v = T(n)
	return nil
}
