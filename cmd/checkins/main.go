// Command checkins is the check-in service: REST ingest, projections, and operations.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"os"
	"os/signal"
	"runtime/debug"
	"slices"
	"strings"
	"syscall"

	"github.com/google/uuid"

	"github.com/checkins/checkins/ports"
)

// usage lists every command from the registry, so the help can never miss one.
func usage() string {
	var b strings.Builder
	b.WriteString("checkins: event-sourced check-ins on Redis Streams.\n\nUsage:\n")
	cmds := commands()
	names := slices.Sorted(maps.Keys(cmds))
	// The service commands first, in the order people need them.
	order := append([]string{"serve", "api", "project"}, slices.DeleteFunc(names, func(n string) bool {
		return n == "serve" || n == "api" || n == "project"
	})...)
	for _, n := range order {
		label := "checkins " + n
		if n == "serve" {
			label = "checkins [serve]"
		}
		fmt.Fprintf(&b, "  %-22s %s\n", label, cmds[n].summary)
	}
	b.WriteString(`
Run "checkins <command> --help" for the flags of a command. Every flag has an environment
variable of the same meaning (shown in --help); flags win over the environment.
`)
	return b.String()
}

func main() {
	// Every request draws up to three UUIDs (correlation, checkinId, Watermill message): reading
	// crypto/rand in blocks instead of one getrandom syscall each is measurable on the hot path.
	uuid.EnableRandPool()
	setGCPercent(os.Getenv)
	os.Exit(run(os.Args[1:], os.Getenv, os.Stdout, os.Stderr))
}

// DefaultGCPercent is the garbage collector's target when GOGC is not set: the service's live
// heap is small (tens of MiB: connections, batches in flight, caches) and almost everything it
// allocates dies within a request or a batch, so collecting at 5x the live heap instead of 2x
// costs little memory and measurably less CPU (about 12% less Go CPU per check-in under ingest
// load here). GOGC (and GOMEMLIMIT) set in the environment win, as the Go runtime documents.
const DefaultGCPercent = 400

func setGCPercent(getenv func(string) string) {
	if getenv("GOGC") == "" {
		debug.SetGCPercent(DefaultGCPercent)
	}
}

// subcommand is one subcommand of the binary.
type subcommand struct {
	summary string
	run     func(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error
}

func commands() map[string]subcommand {
	cmds := map[string]subcommand{
		"serve":   {"HTTP API and all projections in one process (the default)", serviceCommand("serve", Mode{API: true, Projections: true})},
		"api":     {"HTTP API only", serviceCommand("api", Mode{API: true})},
		"project": {"projections only (--projections users,locations); run several to share the work", serviceCommand("project", Mode{Projections: true})},
	}
	for _, more := range []map[string]subcommand{opsCommands(), projectionCommands(), benchCommands(), tokenCommands()} {
		maps.Copy(cmds, more)
	}
	return cmds
}

func run(args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	if len(args) > 0 && (args[0] == "help" || args[0] == "-h" || args[0] == "--help") {
		fmt.Fprint(stdout, usage())
		return 0
	}
	name := "serve"
	if len(args) > 0 && args[0] != "" && args[0][0] != '-' {
		name, args = args[0], args[1:]
	}
	cmd, ok := commands()[name]
	if !ok {
		fmt.Fprintf(stderr, "checkins: unknown command %q\n\n%s", name, usage())
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	// The first signal starts the graceful stop; a second one (an operator's second Ctrl-C)
	// ends the process at once, as the signal's default does: what it holds is delivered again
	// (taken over after CLAIM_IDLE, or at the next start), and a request in flight gets no answer.
	context.AfterFunc(ctx, stop)
	if err := cmd.run(ctx, args, getenv, stdout, stderr); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		fmt.Fprintf(stderr, "checkins %s: %v\n", name, err)
		return 1
	}
	return 0
}

// newLogger logs JSON lines at level and up; a line logged with a request's context carries its
// correlation ID.
func newLogger(w io.Writer, level slog.Level) *slog.Logger {
	return slog.New(ports.CorrelationLogHandler(slog.NewJSONHandler(w, &slog.HandlerOptions{Level: level})))
}

func serviceCommand(name string, mode Mode) func(context.Context, []string, func(string) string, io.Writer, io.Writer) error {
	return func(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
		fs := flag.NewFlagSet("checkins "+name, flag.ContinueOnError)
		fs.SetOutput(stderr)
		cfg, rest, err := parseConfig(fs, args, getenv)
		if err != nil {
			return err
		}
		if len(rest) > 0 {
			return fmt.Errorf("unexpected arguments: %v", rest)
		}
		log := newLogger(stderr, cfg.LogLevel)
		if cfg.RedisURL == "" && name == "serve" {
			url, stopRedis, err := startEmbeddedRedis(log)
			if err != nil {
				return err
			}
			defer stopRedis()
			cfg.RedisURL, cfg.embeddedRedis = url, true
		}
		svc, err := NewService(ctx, cfg, mode, log)
		if err != nil {
			return err
		}
		svc.banner = stderr
		return svc.Run(ctx)
	}
}
