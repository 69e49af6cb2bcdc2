package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/checkins/checkins/adapters"
	"github.com/checkins/checkins/ports"
)

const poisonUsage = `Usage:
  checkins poison list [--projection P] [--limit N] [--cursor ID] [--json]
  checkins poison show <id>
  checkins poison replay <id> | --all [--projection P] [--json]
  checkins poison purge <id> | --all [--projection P]

Parked events live in the stream <KEY_PREFIX>:events:poison. Replay runs an event through the
projection that failed, against its store (which dedupes: a replay never double counts), and
deletes the entry on success; a failed replay keeps the entry with the new error. --all works in
chunks of 100 and only on the entries present when it starts.
Connection flags (--redis-url, --key-prefix, ...) are those of "checkins serve --help".
`

// opsCommands are the operational verbs (poison, status).
func opsCommands() map[string]subcommand {
	return map[string]subcommand{
		"poison": {"inspect, replay and purge the poison queue", poisonCommand},
		"status": {"consumer groups, consumers, pending, lag, poison counts", statusCommand},
	}
}

// wireOps adds the /ops HTTP routes to the service.
func (s *Service) wireOps() error {
	projs := allProjections(s.cfg)
	applier, err := adapters.NewProjectionApplier(s.client, s.keys, s.cfg.DedupeWindow)
	if err != nil {
		return err
	}
	poison, err := ports.NewPoisonOps(ports.PoisonOpsConfig{Redis: s.client, Keys: s.keys, Projections: projs, Applier: applier, Logger: s.log})
	if err != nil {
		return err
	}
	status, err := ports.NewStatusOps(s.client, s.keys, projs)
	if err != nil {
		return err
	}
	status.WithStallAfter(s.cfg.StallAfter)
	return ports.RegisterOpsRoutes(s.http.OpsEcho(), poison, status)
}

// opsFlags are the flags of the ops verbs, on top of the service's connection settings.
type opsFlags struct {
	json       bool
	all        bool
	projection string
	limit      int
	cursor     string
}

// opsEnv is what an ops verb needs: parsed flags, positional arguments and the ops objects.
type opsEnv struct {
	flags  opsFlags
	args   []string
	poison *ports.PoisonOps
	status *ports.StatusOps
	close  func()
}

// setupOps parses flags (anywhere on the line: `show <id> --json` works) and connects to Redis.
func setupOps(name string, args []string, getenv func(string) string, stderr io.Writer, usage string) (*opsEnv, error) {
	fs := flag.NewFlagSet("checkins "+name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	var f opsFlags
	fs.BoolVar(&f.json, "json", false, "print JSON")
	fs.BoolVar(&f.all, "all", false, "every entry (replay, purge)")
	fs.StringVar(&f.projection, "projection", "", "only entries of this projection")
	fs.IntVar(&f.limit, "limit", ports.DefaultPoisonListLimit, "entries per page (list)")
	fs.StringVar(&f.cursor, "cursor", "", "continue a list after this entry ID")
	fs.Usage = func() {
		fmt.Fprint(stderr, usage, "\nFlags:\n")
		fs.PrintDefaults()
	}
	cfg, rest, err := parseConfig(fs, permuteArgs(args, map[string]bool{"json": true, "all": true, "h": true, "help": true}), getenv)
	if err != nil {
		return nil, err
	}
	if cfg.RedisURL == "" {
		return nil, errors.New("REDIS_URL (or --redis-url) is required")
	}
	client, err := adapters.NewRedisClient(adapters.ClientOptions{URL: cfg.RedisURL, DialTimeout: 2 * time.Second,
		ReadTimeout: 5 * time.Second, WriteTimeout: 5 * time.Second})
	if err != nil {
		return nil, err
	}
	keys := adapters.KeySpace{Prefix: cfg.KeyPrefix}
	log := newLogger(stderr, cfg.LogLevel)
	projs := allProjections(cfg)
	applier, err := adapters.NewProjectionApplier(client, keys, cfg.DedupeWindow)
	if err != nil {
		_ = client.Close()
		return nil, err
	}
	poison, err := ports.NewPoisonOps(ports.PoisonOpsConfig{Redis: client, Keys: keys, Projections: projs, Applier: applier, Logger: log})
	if err != nil {
		_ = client.Close()
		return nil, err
	}
	status, err := ports.NewStatusOps(client, keys, projs)
	if err != nil {
		_ = client.Close()
		return nil, err
	}
	status.WithStallAfter(cfg.StallAfter)
	return &opsEnv{flags: f, args: rest, poison: poison, status: status, close: func() { _ = client.Close() }}, nil
}

// permuteArgs moves positional arguments after the flags, because package flag stops at the
// first non-flag. Flags not listed in boolFlags take a value unless written --name=value.
func permuteArgs(args []string, boolFlags map[string]bool) []string {
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

func statusCommand(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	env, err := setupOps("status", args, getenv, stderr, "Usage:\n  checkins status [--json]\n")
	if err != nil {
		return err
	}
	defer env.close()
	if len(env.args) > 0 {
		return fmt.Errorf("unexpected arguments: %v", env.args)
	}
	st, err := env.status.Status(ctx)
	if err != nil {
		return err
	}
	if env.flags.json {
		return writeJSON(stdout, st)
	}
	return ports.WriteStatusText(stdout, st)
}

func poisonCommand(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	if len(args) == 0 || strings.HasPrefix(args[0], "-") {
		fmt.Fprint(stderr, poisonUsage)
		if len(args) > 0 && (args[0] == "-h" || args[0] == "--help") {
			return flag.ErrHelp
		}
		return errors.New("missing verb: list, show, replay or purge")
	}
	verb := args[0]
	switch verb {
	case "list", "show", "replay", "purge":
	default:
		fmt.Fprint(stderr, poisonUsage)
		return fmt.Errorf("unknown verb %q: use list, show, replay or purge", verb)
	}
	env, err := setupOps("poison "+verb, args[1:], getenv, stderr, poisonUsage)
	if err != nil {
		return err
	}
	defer env.close()
	f := env.flags
	switch verb {
	case "list":
		if len(env.args) > 0 {
			return fmt.Errorf("unexpected arguments: %v", env.args)
		}
		page, err := env.poison.List(ctx, ports.PoisonFilter{Projection: f.projection, Cursor: f.cursor, Limit: f.limit})
		if err != nil {
			return err
		}
		if f.json {
			return writeJSON(stdout, page)
		}
		return ports.WritePoisonText(stdout, page)
	case "show":
		id, err := oneID(env.args, false)
		if err != nil {
			return err
		}
		e, err := env.poison.Show(ctx, id)
		if err != nil {
			return err
		}
		return writeJSON(stdout, e)
	case "replay":
		id, err := oneID(env.args, f.all)
		if err != nil {
			return err
		}
		if f.all {
			res, err := env.poison.ReplayAll(ctx, ports.BulkRequest{Projection: f.projection})
			if werr := writeBulk(stdout, res, f.json, "replayed"); werr != nil {
				return werr
			}
			if err != nil {
				return err
			}
			if res.Failed+res.NotReplayable > 0 {
				return fmt.Errorf("%d replays failed and %d entries cannot be replayed; they stay in the queue", res.Failed, res.NotReplayable)
			}
			return nil
		}
		res, err := env.poison.Replay(ctx, id)
		if f.json {
			if werr := writeJSON(stdout, res); werr != nil {
				return werr
			}
		} else if err == nil {
			fmt.Fprintf(stdout, "replayed %s into %s (applied: %t; false means it was already counted), entry deleted\n", id, res.Projection, res.Applied)
		}
		return err
	case "purge":
		id, err := oneID(env.args, f.all)
		if err != nil {
			return err
		}
		if f.all {
			res, err := env.poison.PurgeAll(ctx, ports.BulkRequest{Projection: f.projection})
			if werr := writeBulk(stdout, res, f.json, "purged"); werr != nil {
				return werr
			}
			return err
		}
		if err := env.poison.Purge(ctx, id); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "purged %s\n", id)
		return nil
	}
	return nil
}

// oneID reads the single <id> argument, or none with --all.
func oneID(args []string, all bool) (string, error) {
	switch {
	case all && len(args) > 0:
		return "", fmt.Errorf("give either an entry ID or --all, not both (got %v)", args)
	case all:
		return "", nil
	case len(args) == 0:
		return "", errors.New("missing poison entry ID (see `checkins poison list`), or --all")
	case len(args) > 1:
		return "", fmt.Errorf("expected one poison entry ID, got %d: %v", len(args), args)
	}
	return args[0], nil
}

func writeBulk(w io.Writer, res ports.BulkResult, asJSON bool, what string) error {
	if asJSON {
		return writeJSON(w, res)
	}
	if what == "purged" {
		_, err := fmt.Fprintf(w, "purged %d entries\n", res.Purged)
		return err
	}
	fmt.Fprintf(w, "replayed %d, failed %d (kept with the new error), not replayable %d (kept)\n", res.Replayed, res.Failed, res.NotReplayable)
	for _, f := range res.Failures {
		kept := f.ID
		if f.NewID != "" {
			kept = f.NewID
		}
		fmt.Fprintf(w, "  %s %s: %s (kept as %s)\n", f.Projection, f.Status, f.Error, kept)
	}
	if res.Next != "" {
		_, err := fmt.Fprintf(w, "stopped early; continue after %s (until %s)\n", res.Next, strconv.Quote(res.Until))
		return err
	}
	return nil
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}
