package ports

import (
	"encoding/json"
	"flag"
	"io"
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
	Poll  time.Duration
	Close func()
}

// Connect parses args on fs (the verb's flags, plus the service's settings that cmd adds) and
// connects; name is the verb ("poison list").
type Connect func(name string, fs *flag.FlagSet, args []string) (*CLISession, error)

// PermuteArgs moves positional arguments after the flags, because package flag stops at the
// first non-flag. Flags not listed in boolFlags take a value unless written --name=value.
func PermuteArgs(args []string, boolFlags map[string]bool) []string {
	var flags, pos []string
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
	return append(flags, pos...)
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
		io.WriteString(stderr, usage+"\nFlags:\n")
		fs.PrintDefaults()
	}
	return fs
}
