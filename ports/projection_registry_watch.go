package ports

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/checkins/checkins/app/command"
	"github.com/checkins/checkins/app/projection"
	"github.com/checkins/checkins/app/query"
)

// RegistryWatch keeps a projector in step with the projections registry: every interval it
// makes the router feed the versions the registry asks for (a new building version, not a
// retired one), removes finished backfills and drives the rebuilds in progress, including those
// that bring a projection to its current layout.
type RegistryWatch struct {
	Router   *ProjectionRouter
	Versions *query.ProjectionVersions
	Rebuild  *command.RebuildProjection
	// Projections are those this process runs.
	Projections []projection.Projection
	Interval    time.Duration
	Logger      *slog.Logger
	// Paused, when set and true, makes a poll change nothing: a partition migration runs (its
	// quiesce), and translates the live groups' memberships, the backfills' groups and the
	// versions' keys as its projectors left them.
	Paused func() bool
}

// Run watches until ctx ends.
func (w RegistryWatch) Run(ctx context.Context) error {
	t := time.NewTicker(w.Interval)
	defer t.Stop()
	failing := &throttledLog{interval: time.Minute}
	for {
		if w.Paused != nil && w.Paused() {
			select {
			case <-ctx.Done():
				return nil
			case <-t.C:
				continue
			}
		}
		err := w.reconcile(ctx)
		if err != nil && ctx.Err() == nil && !errors.Is(err, ErrRouterNotRunning) {
			if ok, n := failing.allow(); ok {
				w.Logger.Warn("cannot set up the projections from the registry, will retry", "error", err, "suppressed", n)
			}
		}
		if ctx.Err() == nil && !errors.Is(err, ErrRouterNotRunning) {
			w.Router.ReportSetup(err)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

func (w RegistryWatch) reconcile(ctx context.Context) error {
	// First, so a version's layout is decided before anything feeds it.
	if err := w.Rebuild.UpgradeLayouts(ctx, w.Projections); err != nil {
		return err
	}
	targets, err := w.Versions.Targets(ctx, w.Projections)
	if err != nil {
		return err
	}
	_, _, waiting := w.Router.SetTargets(ctx, targets)
	if waiting != nil && !JoinWaits(waiting) {
		return waiting
	}
	// A target that waits for a disband or drop holds off nothing else: the other projections'
	// backfills are removed and their rebuilds stepped all the same.
	if err := w.Rebuild.RemoveFinishedBackfills(ctx); err != nil {
		return errors.Join(waiting, err)
	}
	return errors.Join(waiting, w.Rebuild.StepAll(ctx, w.Projections))
}
