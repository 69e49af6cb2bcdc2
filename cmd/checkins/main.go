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
	"syscall"
)

const usage = `checkins: event-sourced check-ins on Redis Streams.

Usage:
  checkins [serve]     HTTP API and all projections in one process (default)
  checkins api         HTTP API only
  checkins project     projections only (--projections users,locations); run several to share work

Run "checkins <command> --help" for the flags of a command. Every flag has an environment
variable of the same meaning (shown in --help); flags win over the environment.
`

func main() {
	os.Exit(run(os.Args[1:], os.Getenv, os.Stdout, os.Stderr))
}

// command is one subcommand of the binary.
type command struct {
	summary string
	run     func(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error
}

func commands() map[string]command {
	cmds := map[string]command{
		"serve":   {"HTTP API and all projections", serviceCommand("serve", Mode{API: true, Projections: true})},
		"api":     {"HTTP API only", serviceCommand("api", Mode{API: true})},
		"project": {"projections only", serviceCommand("project", Mode{Projections: true})},
	}
	for _, more := range []map[string]command{opsCommands(), projectionCommands(), benchCommands()} {
		maps.Copy(cmds, more)
	}
	return cmds
}

func run(args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	if len(args) > 0 && (args[0] == "help" || args[0] == "-h" || args[0] == "--help") {
		fmt.Fprint(stdout, usage)
		return 0
	}
	name := "serve"
	if len(args) > 0 && args[0] != "" && args[0][0] != '-' {
		name, args = args[0], args[1:]
	}
	cmd, ok := commands()[name]
	if !ok {
		fmt.Fprintf(stderr, "checkins: unknown command %q\n\n%s", name, usage)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := cmd.run(ctx, args, getenv, stdout, stderr); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		fmt.Fprintf(stderr, "checkins %s: %v\n", name, err)
		return 1
	}
	return 0
}

func newLogger(w io.Writer, level slog.Level) *slog.Logger {
	return slog.New(slog.NewJSONHandler(w, &slog.HandlerOptions{Level: level}))
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
			cfg.RedisURL = url
		}
		svc, err := NewService(ctx, cfg, mode, log)
		if err != nil {
			return err
		}
		return svc.Run(ctx)
	}
}
