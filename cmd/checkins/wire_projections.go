package main

import (
	"context"
	"errors"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/checkins/checkins/adapters"
	"github.com/checkins/checkins/app"
	"github.com/checkins/checkins/app/command"
	"github.com/checkins/checkins/app/ops"
	"github.com/checkins/checkins/app/projection"
	"github.com/checkins/checkins/app/query"
	"github.com/checkins/checkins/ports"
)

// projectionWiring is what wireProjections and the service's projection parts share.
type projectionWiring struct {
	registry *prometheus.Registry
	metrics  *ports.Metrics
	ready    *query.ProgressMonitor // nil in an API-only process
	projs    []projection.Projection
}

// initProjections builds metrics and the stall checks; it runs before the router, which reports
// to the metrics. a holds the ops use cases (addOps).
func (s *Service) initProjections(mode Mode, a app.Application) error {
	w := &projectionWiring{registry: prometheus.NewRegistry()}
	w.registry.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	var err error
	if w.metrics, err = ports.NewMetrics(w.registry); err != nil {
		return err
	}
	all := allProjections(s.cfg)
	names := func(ps []projection.Projection) []string {
		out := make([]string, len(ps))
		for i, p := range ps {
			out[i] = p.Name()
		}
		return out
	}
	b := adapters.NewOpsBackend(s.client, s.keys)
	versions := a.Queries.ProjectionVersions
	w.registry.MustRegister(adapters.NewRedisMemoryCollector(s.client, 2*time.Second))
	// Metrics cover every projection of this build; readiness only those this process runs.
	w.registry.MustRegister(ports.NewStreamCollector(
		query.NewProgressMonitor(b, s.cfg.StallAfter, versions.ActiveGroups(names(all))), b, 2*time.Second))
	if mode.Projections {
		if w.projs, err = selectProjections(s.cfg); err != nil {
			return err
		}
		w.ready = query.NewProgressMonitor(b, s.cfg.StallAfter, versions.ActiveGroups(names(w.projs)))
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
func (s *Service) initialTargets(ctx context.Context, versions *query.ProjectionVersions, rebuild *command.RebuildProjection) ([]ops.ProjectionTarget, error) {
	// Layouts first: a new deployment's versions are decided to be of the current layout before
	// the router feeds them (projection.Layouts).
	err := rebuild.UpgradeLayouts(ctx, s.proj.projs)
	var targets []ops.ProjectionTarget
	if err == nil {
		targets, err = versions.Targets(ctx, s.proj.projs)
	}
	if err != nil {
		// A stop (SIGTERM) while Redis does not answer yet cancels ctx: Run then ends at once,
		// with exit 0 as any stop, rather than the start failing with "context canceled".
		if ports.IsTransient(adapters.RedisErrors{}, err) || errors.Is(err, context.DeadlineExceeded) || ctx.Err() != nil {
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
	a := s.app
	watch := ports.RegistryWatch{Router: s.router, Versions: a.Queries.ProjectionVersions, Rebuild: a.Commands.RebuildProjection,
		Projections: s.proj.projs, Interval: s.cfg.ProjectionPoll, Logger: s.log, Paused: s.quiesced}
	out := []func(context.Context) error{watch.Run}
	if s.cfg.Retention.Enabled() {
		out = append(out, func(ctx context.Context) error {
			return ports.RunRetention(ctx, a.Commands.TrimStream, s.cfg.RetentionInterval, s.log, s.quiesced)
		})
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

// wireProjections adds projection query routes, metrics and the ops routes to the service.
func (s *Service) wireProjections() error {
	// The metrics middleware is HTTPConfig.Observe, on both listeners (wire_access.go).
	s.http.RegisterProjectionRoutes()
	// The ops routes and /metrics live on the ops listener.
	ops := s.http.OpsEcho()
	if err := ports.RegisterOpsRoutes(ops, s.app); err != nil {
		return err
	}
	ports.RegisterMetricsRoute(ops, ports.MetricsHandler(s.proj.registry))
	return nil
}
