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
	if b.Live == nil || b.Keys == nil || b.Observations == nil || b.Poison == nil {
		return nil, errors.New("command: DropMovedVersion needs the live groups, the projection keys, the observations and the poison queue")
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
	rep, err := c.b.Live.DropMoved(ctx, member, c.minIdle, false)
	if err != nil || len(rep.Positions) == 0 {
		if err == nil {
			err = c.notMoved(ctx, member)
		}
		return rep, err
	}
	// Events it parked: a replay after its next run could not tell whether that run went
	// through them (it counts them twice if it did, and drops them if RETENTION trimmed them
	// before it began); no projector parks new ones for it meanwhile (none runs it).
	if n, err := c.parkedBy(ctx, name, version); err != nil {
		return rep, ops.Unavailable(err)
	} else if n > 0 {
		return rep, fmt.Errorf("%w %s: %d events it parked are in the poison queue: purge them (checkins poison purge --all --projection %s --version %d; run again, the version goes through them itself) or replay them, and run this again",
			ops.ErrDropRefused, member, n, name, version)
	}
	if dryRun {
		return rep, nil
	}
	if rep, err = c.b.Live.DropMoved(ctx, member, c.minIdle, true); err != nil {
		return rep, err
	}
	// Its own group is gone; a dropping mark holds joins off until its read model is gone too.
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

// parkedBy counts the poison queue's entries that version of projection name parked.
func (c *DropMovedVersion) parkedBy(ctx context.Context, name string, version int) (int, error) {
	n, after := 0, ""
	for {
		es, err := c.b.Poison.Range(ctx, after, "+", 500)
		if err != nil {
			return 0, err
		}
		for _, e := range es {
			if e.Projection == name && failedVersion(e) == version {
				n++
			}
		}
		if len(es) < 500 {
			return n, nil
		}
		after = es[len(es)-1].ID
	}
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
