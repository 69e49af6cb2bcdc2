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

// DropMovedVersion drops a projection version that a disband took out of its live group and
// that no PROJECTIONS set runs any more: without it, such a version keeps its own group and its
// moved record for good, which hold `partitions migrate` off, and its read model stays where it
// stopped.
//
// It removes the version's own group and its read model, so that nothing of it is left to build
// on: run again by a projector later, it starts like a new projection, from the start of the
// stream (were only its group removed, that start would count the history again onto the read
// model it kept). A drop cut short leaves a dropping mark, which holds joins off and which the
// next run finishes.
type DropMovedVersion struct {
	b       ops.Backend
	minIdle time.Duration
}

// NewDropMovedVersion is the use case on b; minIdle is CLAIM_IDLE (see NewDisbandLiveGroup).
func NewDropMovedVersion(b ops.Backend, minIdle time.Duration) (*DropMovedVersion, error) {
	if b.Live == nil || b.Keys == nil || b.Observations == nil || b.Registry == nil || b.Stream == nil {
		return nil, errors.New("command: DropMovedVersion needs the live groups, the projection keys, the observations, the registry and the stream")
	}
	if minIdle <= 0 {
		return nil, fmt.Errorf("command: DropMovedVersion needs a positive idle time, got %s", minIdle)
	}
	return &DropMovedVersion{b: b, minIdle: minIdle}, nil
}

// Run drops member ("<name>.v<N>"); with dryRun it only checks and reports what it would do.
func (c *DropMovedVersion) Run(ctx context.Context, member string, dryRun bool) (ops.DropReport, error) {
	name, version, ok := ops.ParseMemberName(member)
	if !ok {
		return ops.DropReport{}, fmt.Errorf("%q is not a projection version: versions are named <projection>.v<N> (a moved version's own group has its name)", member)
	}
	if err := notMigrating(ctx, c.b.Migration); err != nil {
		return ops.DropReport{}, err
	}
	rep, err := c.b.Live.DropMoved(ctx, member, c.minIdle, !dryRun)
	if err != nil {
		return rep, err
	}
	if len(rep.Positions) == 0 {
		return rep, c.notMoved(ctx, member)
	}
	if dryRun {
		return rep, nil
	}
	// Its own group is gone; a dropping mark holds joins off until its read model is gone too.
	// Where its next run begins, as for a rebuild's build: the start of the stream, now. A
	// replay of an entry the version parked before the drop then counts as gone through by that
	// run (which applies the entry or parks its own copy), not once more.
	at, err := c.b.Registry.ServerTime(ctx)
	if err != nil {
		return rep, ops.Unavailable(err)
	}
	starts, err := c.b.Stream.Starts(ctx)
	if err != nil {
		return rep, ops.Unavailable(err)
	}
	if err := c.b.Registry.SetBuildStart(ctx, name, version, ops.BuildStart{At: at, Streams: starts}); err != nil {
		return rep, fmt.Errorf("dropped the group of %s, but recording where its next run begins failed: %w (run this again to finish)", member, err)
	}
	n, err := c.b.Keys.RemoveVersion(ctx, name, version)
	rep.KeysRemoved += n
	if err != nil {
		return rep, fmt.Errorf("dropped the group of %s, but removing its read model failed: %w (run this again to finish)", member, err)
	}
	// Markers of its own group: none in the usual case (no projector read it since the disband),
	// but a group of that name may have had some.
	n, err = c.b.Keys.RemoveMarkers(ctx, member)
	rep.KeysRemoved += n
	if err != nil {
		return rep, fmt.Errorf("dropped %s, but removing its group's markers failed: %w (run this again to finish)", member, err)
	}
	// The markers of replays into it: run again, it would find them and take the events it
	// parks again for counted already, and drop them.
	n, err = c.b.Keys.RemoveMarkers(ctx, ReplayGroup(name, version))
	rep.KeysRemoved += n
	if err != nil {
		return rep, fmt.Errorf("dropped %s, but removing the markers of replays into it failed: %w (run this again to finish)", member, err)
	}
	if err := c.b.Observations.Forget(ctx, member); err != nil {
		return rep, fmt.Errorf("dropped %s, but forgetting its group's observation failed: %w (run this again to finish)", member, err)
	}
	if err := c.b.Live.EndDrop(ctx, member); err != nil {
		return rep, fmt.Errorf("dropped %s, but %w (run this again to finish)", member, err)
	}
	return rep, nil
}

// notMoved is the error for a member that is neither moved nor being dropped: it names the
// versions that are.
func (c *DropMovedVersion) notMoved(ctx context.Context, member string) error {
	moved, err := c.b.Live.ReadMoved(ctx)
	if err != nil {
		return err
	}
	var names []string
	for _, ms := range moved {
		for n := range ms {
			if !slices.Contains(names, n) {
				names = append(names, n)
			}
		}
	}
	slices.Sort(names)
	list := "there are none"
	if len(names) > 0 {
		list = "they are: " + strings.Join(names, ", ")
	}
	return fmt.Errorf("%w: %s is not a version a disband took out of its live group (only those are dropped; %s)", domain.ErrNotFound, member, list)
}
