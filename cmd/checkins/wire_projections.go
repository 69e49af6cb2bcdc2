package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/checkins/checkins/adapters"
	"github.com/checkins/checkins/app"
	"github.com/checkins/checkins/app/projection"
	"github.com/checkins/checkins/ports"
)

const projectionsUsage = `Usage:
  checkins projections list [--json]
  checkins projections rebuild <name> [--no-wait] [--json]

list shows, per projection, the version serving reads, the version being rebuilt if any, their
consumer groups, lag, pending and state, and the last rebuild's progress.

rebuild builds a fresh copy of <name> from the whole event stream under version N+1 (consumer
group <name>.v<N+1> from the start of the stream, keys <prefix>:p:<name>:v<N+1>:...) while
version N keeps serving. Running projectors (serve, project) start it within
PROJECTION_POLL_INTERVAL; when it has caught up, reads switch to it in one step, projectors stop
version N, and after PROJECTION_RETIRE_GRACE its keys and group are removed. The command waits
and reports progress (unless --no-wait); stopping it does not stop the rebuild: projectors carry
it on. Running it again for a rebuild in progress resumes watching it.
Connection flags (--redis-url, --key-prefix, ...) are those of "checkins serve --help".
`

// projectionCommands are the projection verbs (projections list|rebuild).
func projectionCommands() map[string]subcommand {
	return map[string]subcommand{
		"projections": {"list projection versions; rebuild a projection without downtime", projectionsCommand},
	}
}

func projectionsCommand(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	if len(args) == 0 || strings.HasPrefix(args[0], "-") {
		fmt.Fprint(stderr, projectionsUsage)
		if len(args) > 0 && (args[0] == "-h" || args[0] == "--help") {
			return flag.ErrHelp
		}
		return errors.New("missing verb: list or rebuild")
	}
	verb := args[0]
	if verb != "list" && verb != "rebuild" {
		fmt.Fprint(stderr, projectionsUsage)
		return fmt.Errorf("unknown verb %q: use list or rebuild", verb)
	}
	fs := flag.NewFlagSet("checkins projections "+verb, flag.ContinueOnError)
	fs.SetOutput(stderr)
	asJSON := fs.Bool("json", false, "print JSON")
	noWait := fs.Bool("no-wait", false, "rebuild: start it and return; projectors carry it out")
	fs.Usage = func() {
		fmt.Fprint(stderr, projectionsUsage, "\nFlags:\n")
		fs.PrintDefaults()
	}
	cfg, rest, err := parseConfig(fs, permuteArgs(args[1:], map[string]bool{"json": true, "no-wait": true, "h": true, "help": true}), getenv)
	if err != nil {
		return err
	}
	if cfg.RedisURL == "" {
		return errors.New("REDIS_URL (or --redis-url) is required")
	}
	client, err := adapters.NewRedisClient(adapters.ClientOptions{URL: cfg.RedisURL, DialTimeout: 2 * time.Second,
		ReadTimeout: 5 * time.Second, WriteTimeout: 5 * time.Second})
	if err != nil {
		return err
	}
	defer client.Close()
	ops, err := ports.NewProjectionOps(ports.ProjectionOpsConfig{Redis: client, Keys: adapters.KeySpace{Prefix: cfg.KeyPrefix},
		Projections: allProjections(cfg), RetireGrace: cfg.RetireGrace, StallAfter: cfg.StallAfter, Logger: newLogger(stderr, max(cfg.LogLevel, slog.LevelWarn))})
	if err != nil {
		return err
	}
	switch verb {
	case "list":
		if len(rest) > 0 {
			return fmt.Errorf("unexpected arguments: %v", rest)
		}
		rep, err := ops.List(ctx)
		if err != nil {
			return err
		}
		if *asJSON {
			return writeJSON(stdout, rep)
		}
		return ports.WriteProjectionsText(stdout, rep)
	default:
		if len(rest) != 1 {
			return fmt.Errorf("rebuild takes one projection name, got %d arguments %v", len(rest), rest)
		}
		return rebuildCommand(ctx, ops, rest[0], cfg.ProjectionPoll, *noWait, *asJSON, stdout)
	}
}

func rebuildCommand(ctx context.Context, ops *ports.ProjectionOps, name string, poll time.Duration, noWait, asJSON bool, stdout io.Writer) error {
	rp, err := ops.Rebuild(ctx, name)
	if err != nil {
		return err
	}
	if !asJSON {
		fmt.Fprintf(stdout, "rebuild of %s: v%d serves reads while v%d is built from the start of the stream\n", name, rp.From, rp.To)
	}
	if noWait {
		if asJSON {
			return writeJSON(stdout, rp)
		}
		return nil
	}
	last := ""
	rp, err = ops.Drive(ctx, name, poll, func(p ports.RebuildProgress) {
		if asJSON {
			return
		}
		line := fmt.Sprintf("%s: %s", name, p.State)
		switch p.State {
		case ports.RebuildBuilding:
			if p.Lag >= 0 {
				line += fmt.Sprintf(", v%d has %d of %d entries to go, %d pending", p.To, p.Lag, p.StreamLength, p.Pending)
			} else {
				line += fmt.Sprintf(", waiting for a projector to start v%d", p.To)
			}
		case ports.RebuildRetiring:
			line += fmt.Sprintf(", reads switched to v%d; v%d is removed after the grace period", p.To, p.From)
		case ports.RebuildDone:
			line += fmt.Sprintf(", v%d serves reads, v%d removed", p.To, p.From)
		}
		if line != last {
			fmt.Fprintln(stdout, line)
			last = line
		}
	})
	if errors.Is(err, context.Canceled) {
		fmt.Fprintln(stdout, "stopped waiting; running projectors carry the rebuild on (see: checkins projections list)")
		return nil
	}
	if err != nil {
		return err
	}
	if asJSON {
		return writeJSON(stdout, rp)
	}
	return nil
}

// projectionWiring is what wireProjections and the service's projection parts share.
type projectionWiring struct {
	registry *prometheus.Registry
	metrics  *ports.Metrics
	ops      *ports.ProjectionOps
	ready    *ports.ProgressMonitor // nil in an API-only process
	projs    []projection.Projection
}

// initProjections builds metrics and projection operations; it runs before the router, which
// reports to the metrics.
func (s *Service) initProjections(mode Mode) error {
	w := &projectionWiring{registry: prometheus.NewRegistry()}
	w.registry.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	var err error
	if w.metrics, err = ports.NewMetrics(w.registry); err != nil {
		return err
	}
	all := allProjections(s.cfg)
	if w.ops, err = ports.NewProjectionOps(ports.ProjectionOpsConfig{Redis: s.client, Keys: s.keys, Projections: all,
		RetireGrace: s.cfg.RetireGrace, StallAfter: s.cfg.StallAfter, Logger: s.log}); err != nil {
		return err
	}
	names := func(ps []projection.Projection) []string {
		out := make([]string, len(ps))
		for i, p := range ps {
			out[i] = p.Name()
		}
		return out
	}
	w.registry.MustRegister(ports.NewRedisMemoryCollector(s.client, 2*time.Second))
	// Metrics cover every projection of this build; readiness only those this process runs.
	w.registry.MustRegister(ports.NewStreamCollector(
		ports.NewProgressMonitor(s.client, s.keys, s.cfg.StallAfter, w.ops.ActiveGroups(names(all))), 2*time.Second))
	if mode.Projections {
		if w.projs, err = selectProjections(s.cfg); err != nil {
			return err
		}
		w.ready = ports.NewProgressMonitor(s.client, s.keys, s.cfg.StallAfter, w.ops.ActiveGroups(names(w.projs)))
	}
	s.proj = w
	return nil
}

// projectionQueries adds the read models of the projections shipped with leaderboards.
func (s *Service) projectionQueries(q *app.Queries) {
	q.Leaderboards = app.LeaderboardQueries{Reader: adapters.NewProjectionReader(s.client, s.keys, projection.Leaderboards{}.Name()),
		Leaderboard: projection.Leaderboards{MinCheckins: s.cfg.LeaderboardMinCheckins}}
	q.Recent = app.RecentCheckinQueries{Reader: adapters.NewProjectionReader(s.client, s.keys, projection.RecentCheckins{}.Name())}
	q.Daily = app.DailyCheckinQueries{Reader: adapters.NewProjectionReader(s.client, s.keys, projection.DailyCheckins{}.Name())}
}

// initialTargets are the versions the router starts with. When Redis cannot tell yet, it starts
// with none rather than guess a version (a wrong guess would rebuild a retired one); the
// registry watcher adds them as soon as Redis answers.
func (s *Service) initialTargets(ctx context.Context) ([]ports.ProjectionTarget, error) {
	targets, err := s.proj.ops.Targets(ctx, s.proj.projs)
	if err != nil {
		if ports.IsTransient(err) || errors.Is(err, context.DeadlineExceeded) {
			s.log.Warn("projections registry unreachable: projections start when Redis answers", "error", err)
			return nil, nil
		}
		return nil, err
	}
	return targets, nil
}

// projectionBackground are the loops a projector runs next to its router: the registry watcher
// (rebuilds start and retire versions without a restart) and the stream trimmer.
func (s *Service) projectionBackground() ([]func(context.Context) error, error) {
	if s.router == nil {
		return nil, nil
	}
	out := []func(context.Context) error{func(ctx context.Context) error {
		return s.proj.ops.Watch(ctx, s.router, s.proj.projs, s.cfg.ProjectionPoll)
	}}
	if s.cfg.Retention.Enabled() {
		t, err := ports.NewStreamTrimmer(s.client, s.keys, s.cfg.Retention, s.log)
		if err != nil {
			return nil, err
		}
		out = append(out, func(ctx context.Context) error { return t.Run(ctx, s.cfg.RetentionInterval) })
	}
	return out, nil
}

// projectionsReady fails while a projection this process runs is stalled.
func (s *Service) projectionsReady(ctx context.Context) error {
	if s.proj == nil || s.proj.ready == nil {
		return nil
	}
	return s.proj.ready.Stalled(ctx)
}

// wireProjections adds projection query routes, metrics and rebuild support to the service.
func (s *Service) wireProjections() error {
	// The metrics middleware is HTTPConfig.Observe, on both listeners (wire_access.go).
	s.http.RegisterProjectionRoutes()
	ops := s.http.OpsEcho()
	ports.RegisterProjectionOpsRoutes(ops, s.proj.ops)
	ports.RegisterMetricsRoute(ops, ports.MetricsHandler(s.proj.registry))
	return nil
}
