package command

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/checkins/checkins/app/ops"
	"github.com/checkins/checkins/domain"
)

// DefaultClaimIdle is CLAIM_IDLE's default.
const DefaultClaimIdle = 30 * time.Second

// DisbandLiveGroup takes the projection versions of a live group out of it, so that projectors
// can run them in other PROJECTIONS sets: a version is fed by one live group at a time, so
// without it a version stays in the group of the set it was first run in, and a process that
// runs it in another set stops at start (ports.ErrLiveGroupConflict).
//
// The group's projectors must be stopped first (a clean stop acknowledges what they held).
// Each version then gets an own group, <name>.v<N>, at the position the live group had
// delivered through, which holds its place (and the dedupe registry's floor) until a projector
// joins it to its new live group; its own group then catches up from there, as a backfill.
// Nothing is read twice or skipped: the disband refuses while entries are pending.
type DisbandLiveGroup struct {
	b       ops.Backend
	minIdle time.Duration
}

// NewDisbandLiveGroup is the use case on b. minIdle is how long every consumer of the group must
// have been idle (CLAIM_IDLE: a projector that stood still longer holds nothing it may still
// write).
func NewDisbandLiveGroup(b ops.Backend, minIdle time.Duration) (*DisbandLiveGroup, error) {
	if b.Live == nil || b.Keys == nil || b.Observations == nil {
		return nil, errors.New("command: DisbandLiveGroup needs the live groups, the projection keys and the observations")
	}
	if minIdle <= 0 {
		return nil, fmt.Errorf("command: DisbandLiveGroup needs a positive idle time, got %s", minIdle)
	}
	return &DisbandLiveGroup{b: b, minIdle: minIdle}, nil
}

// Run disbands group ("live", or "live:<a>,<b>" for a PROJECTIONS subset); with dryRun it only
// checks and reports what it would do.
func (c *DisbandLiveGroup) Run(ctx context.Context, group string, dryRun bool) (ops.DisbandReport, error) {
	if group != "live" && !strings.HasPrefix(group, "live:") {
		return ops.DisbandReport{}, fmt.Errorf("%q is not a live group: live groups are named live or live:<projection>,<projection>,... (see `checkins status`)", group)
	}
	// A migration's quiesce pauses the projectors: their consumers look idle, and they would
	// join the group again when it ends.
	if err := notMigrating(ctx, c.b.Migration); err != nil {
		return ops.DisbandReport{}, err
	}
	rep, err := c.b.Live.Disband(ctx, group, c.minIdle, !dryRun)
	if err != nil {
		return rep, err
	}
	if len(rep.Positions) == 0 && !rep.Unfinished {
		groups, _, err := c.b.Live.ReadAll(ctx)
		if err != nil {
			return rep, err
		}
		names := make([]string, 0, len(groups))
		for g := range groups {
			names = append(names, g)
		}
		slices.Sort(names)
		return rep, fmt.Errorf("%w: no live group %q (the live groups are: %s)", domain.ErrNotFound, group, strings.Join(names, ", "))
	}
	if dryRun {
		return rep, nil
	}
	if err := c.forget(ctx, group); err != nil {
		return rep, fmt.Errorf("disbanded %s, but %w (run it again)", group, err)
	}
	if err := c.b.Live.EndDisband(ctx, group); err != nil {
		return rep, fmt.Errorf("disbanded %s, but %w (run it again)", group, err)
	}
	rep.Done = true
	return rep, nil
}

// forget removes what a disbanded group leaves besides: its applied markers and the stall
// check's observation.
func (c *DisbandLiveGroup) forget(ctx context.Context, group string) error {
	if _, err := c.b.Keys.RemoveMarkers(ctx, group); err != nil {
		return fmt.Errorf("removing the markers of %s failed: %w", group, err)
	}
	if err := c.b.Observations.Forget(ctx, group); err != nil {
		return fmt.Errorf("forgetting the observation of %s failed: %w", group, err)
	}
	return nil
}
