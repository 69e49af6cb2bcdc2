package command

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/checkins/checkins/app/ops"
	"github.com/checkins/checkins/app/projection"
	"github.com/checkins/checkins/domain"
)

// DefaultRetireGrace is how long a switch waits before removing the old version: longer than
// every projector's registry poll, so none still writes to the old keys when they go.
const DefaultRetireGrace = 10 * time.Second

// ErrRebuildBusy is returned when a rebuild cannot start now (the previous one still removes
// its old version).
var ErrRebuildBusy = errors.New("cannot start a rebuild now")

// RebuildProjectionConfig wires RebuildProjection.
type RebuildProjectionConfig struct {
	Backend     ops.Backend
	Projections []projection.Projection // every projection this build knows
	RetireGrace time.Duration           // 0: DefaultRetireGrace
	Logger      *slog.Logger
	Now         func() time.Time // default time.Now
	// RemovalHold is how long a run's hold on removing a finished backfill's leftovers lasts
	// without being renewed (0: RemovalHold).
	RemovalHold time.Duration
}

// RebuildProjection rebuilds a projection without downtime.
//
// A rebuild of projection p serving version N:
//  1. marks N+1 as building in the registry and creates its own group p.v<N+1> at "0";
//  2. every projector polls the registry; the first to see N+1 joins it to its live group at
//     the stream's last entry J: from then on the live group feeds N+1 next to N (writing under
//     the key prefix of N+1), and the own group backfills N+1 with everything up to J, while
//     reads still go to N;
//  3. once the backfill has delivered and acknowledged everything up to J (BackfillCaughtUp),
//     N+1 is exactly as current as N (the live group feeds both from the same batches), and
//     whoever drives the rebuild switches reads to N+1 in one registry write (compare-and-set, so
//     concurrent drivers switch once) and takes N out of the live group;
//  4. after RetireGrace (batches in flight finish) the driver unlinks N's keys.
//
// Every step is idempotent and its state lives in the registry, so the driver may be the CLI,
// the HTTP request's process or any projector, and a driver that dies is simply replaced:
// projectors drive every rebuild in progress.
type RebuildProjection struct {
	b     ops.Backend
	projs []projection.Projection
	grace time.Duration
	log   *slog.Logger
	now   func() time.Time
	hold  time.Duration // RemovalHold, unless configured
}

// NewRebuildProjection fails fast on missing dependencies.
func NewRebuildProjection(cfg RebuildProjectionConfig) (*RebuildProjection, error) {
	b := cfg.Backend
	if b.Stream == nil || b.Registry == nil || b.Live == nil || b.Keys == nil || b.Observations == nil || cfg.Logger == nil {
		return nil, errors.New("command: RebuildProjection needs the backend's Stream, Registry, Live, Keys and Observations, and a Logger")
	}
	if cfg.RetireGrace <= 0 {
		cfg.RetireGrace = DefaultRetireGrace
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	hold := cfg.RemovalHold
	if hold <= 0 {
		hold = RemovalHold
	}
	return &RebuildProjection{b: cfg.Backend, projs: cfg.Projections, grace: cfg.RetireGrace, log: cfg.Logger, now: cfg.Now, hold: hold}, nil
}

// KnownProjection returns domain.ErrNotFound, naming the known ones, unless name is one of projs.
func KnownProjection(projs []projection.Projection, name string) error {
	names := make([]string, len(projs))
	for i, p := range projs {
		if p.Name() == name {
			return nil
		}
		names[i] = p.Name()
	}
	return fmt.Errorf("projection %q (known: %s): %w", name, strings.Join(names, ", "), domain.ErrNotFound)
}

// projection is the known projection called name (nil if none).
func (h *RebuildProjection) projection(name string) projection.Projection {
	for _, p := range h.projs {
		if p.Name() == name {
			return p
		}
	}
	return nil
}

// UpgradeLayouts brings every projection of projs that has layouts (projection.Layouts) to its
// current layout; projectors run it at start, before they feed anything, and at each registry
// poll.
//   - A serving version with no layout recorded was written by a release before layouts, or
//     never written: if a live group feeds it or it has a group of its own, it is layout 1;
//     else nothing has written it yet and it is the current layout (a new deployment builds the
//     current layout at once).
//   - A serving version of an older layout is rebuilt (Start), once no rebuild is in progress:
//     it keeps serving reads, written in its own layout, until the new version has caught up.
func (h *RebuildProjection) UpgradeLayouts(ctx context.Context, projs []projection.Projection) error {
	var info *ops.StreamInfo
	var groups map[string]ops.Membership
	for _, p := range projs {
		if _, ok := p.(projection.Layouts); !ok {
			continue
		}
		name, current := p.Name(), projection.CurrentLayout(p)
		st, err := h.b.Registry.State(ctx, name)
		if err != nil {
			return err
		}
		layout := st.ServingLayout
		if layout == 0 {
			if info == nil {
				i, err := h.b.Stream.Info(ctx)
				if err != nil {
					return err
				}
				if groups, _, err = h.b.Live.ReadAll(ctx); err != nil {
					return err
				}
				info = &i
			}
			member := ops.MemberName(name, st.Serving)
			decide := current
			if _, _, fed := ops.MemberOf(groups, member); fed || info.Group(member) != nil {
				decide = 1
			}
			if layout, err = h.b.Registry.DecideLayout(ctx, name, decide); err != nil {
				return err
			}
			h.log.Info("projection layout recorded", "projection", name, "version", st.Serving, "layout", layout)
		}
		if layout >= current || st.Building > 0 || st.Retiring > 0 {
			continue
		}
		h.log.Info("projection version of an earlier layout: rebuilding it in the current one", "projection", name,
			"version", st.Serving, "layout", layout, "current_layout", current)
		// A partition migration refuses a rebuild's start until it is done: the next poll
		// starts it then (a projector started meanwhile exited on it; found by a review).
		if _, err := h.Start(ctx, name); err != nil && !errors.Is(err, ErrRebuildBusy) && !errors.Is(err, domain.ErrMigrating) {
			return err
		}
	}
	return nil
}

// Start starts a rebuild of name, or returns the one in progress (so it can be resumed).
func (h *RebuildProjection) Start(ctx context.Context, name string) (ops.RebuildProgress, error) {
	if err := KnownProjection(h.projs, name); err != nil {
		return ops.RebuildProgress{}, err
	}
	// One start at a time (projectors starting together after a deploy that changed a layout
	// all start the rebuild): another start, between reading the state and looking for a
	// leftover group, would find this one's new group and remove it as abandoned.
	release, err := h.lockStart(ctx, name)
	if err != nil {
		return ops.RebuildProgress{}, err
	}
	defer func() {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if err := release(rctx); err != nil {
			h.log.Warn("could not release the rebuild's start (it expires by itself)", "projection", name, "error", err)
		}
	}()
	// A rebuild creates groups on the stream, which a migration would leave behind.
	if err := notMigrating(ctx, h.b.Migration); err != nil {
		return ops.RebuildProgress{}, err
	}
	st, err := h.b.Registry.State(ctx, name)
	if err != nil {
		return ops.RebuildProgress{}, ops.Unavailable(err)
	}
	if st.Building == 0 && st.Retiring == 0 {
		// No build of N+1 ever switched, so a group N+1 is a leftover of a build abandoned by hand
		// (its handler only wrote keys once the group existed); start from nothing. Checking the
		// group first spares a SCAN of the whole keyspace in the usual case.
		info, err := h.b.Stream.Info(ctx)
		if err != nil {
			return ops.RebuildProgress{}, ops.Unavailable(err)
		}
		if info.Group(ops.MemberName(name, st.Serving+1)) != nil {
			if _, err := h.removeVersion(ctx, name, st.Serving+1); err != nil {
				return ops.RebuildProgress{}, ops.Unavailable(err)
			}
		}
	}
	from, to, started, err := h.b.Registry.BeginBuild(ctx, name, projection.CurrentLayout(h.projection(name)))
	if errors.Is(err, ops.ErrRetiring) {
		return ops.RebuildProgress{}, fmt.Errorf("%w: %w", ErrRebuildBusy, err)
	}
	if err != nil {
		return ops.RebuildProgress{}, ops.Unavailable(err)
	}
	if !started {
		// A start cut short after BeginBuild (Redis out of memory, a crash, the network) left
		// the build without its group or the record of where it began, and without its
		// progress: this start completes them (the start lock makes it the only one). Without
		// the record, a replay of an entry an earlier version parked took where the stream
		// begins now for where the build began, and once retention had trimmed past it,
		// counted into the new version an entry its build had counted already.
		if _, ok, err := h.b.Registry.BuildStart(ctx, name, to); err != nil {
			return ops.RebuildProgress{}, ops.Unavailable(err)
		} else if !ok {
			h.log.Warn("a rebuild's start was cut short: completing it", "projection", name, "from", from, "to", to)
			return h.beginBuild(ctx, name, from, to)
		}
		rp, ok := ops.ParseRebuildProgress(st.Rebuild)
		if !ok || rp.To != to {
			rp = ops.RebuildProgress{Projection: name, State: ops.RebuildBuilding, From: from, To: to, StartedAt: h.now().UTC(), Lag: -1}
			if err := h.saveProgress(ctx, rp); err != nil {
				return rp, err
			}
		}
		h.log.Info("rebuild already in progress, resuming", "projection", name, "from", from, "to", to)
		return rp, nil
	}
	return h.beginBuild(ctx, name, from, to)
}

// beginBuild creates the group of version to of name, records where its build begins and saves
// the rebuild's first progress: what a start does once the registry says to is being built.
// Each step may run again (a start cut short, completed by the next).
func (h *RebuildProjection) beginBuild(ctx context.Context, name string, from, to int) (ops.RebuildProgress, error) {
	// Creating the group here, at "0", makes the build's lag visible at once and pins its start
	// to the beginning of the stream whichever projector subscribes first. Anything parked from
	// now on may be this build's: its time is the clock's that stamps parked entries (Redis's,
	// not this process's, which may be an operator's machine seconds off).
	at, err := h.b.Registry.ServerTime(ctx)
	if err != nil {
		return ops.RebuildProgress{}, ops.Unavailable(err)
	}
	if err := h.b.Stream.CreateGroup(ctx, ops.MemberName(name, to), "0"); err != nil {
		return ops.RebuildProgress{}, ops.Unavailable(err)
	}
	// Where the build begins: a replay of an entry parked by an earlier version (or an earlier
	// build of this number) tells by it whether this build went through that entry itself
	// (ReplayPoisoned). It is read once the group exists, which holds retention's trims below
	// it (Stream.TrimBelow), so it is the first entry the group reads: read before, a trim by
	// another projector in between would leave it below what the group can read, and a replay
	// would take entries the build never saw for gone through. A replay in the moment between
	// the two falls back to where the stream begins, which is the same.
	starts, err := h.b.Stream.Starts(ctx)
	if err != nil {
		return ops.RebuildProgress{}, ops.Unavailable(err)
	}
	if err := h.b.Registry.SetBuildStart(ctx, name, to, ops.BuildStart{At: at, Streams: starts}); err != nil {
		return ops.RebuildProgress{}, ops.Unavailable(err)
	}
	rp := ops.RebuildProgress{Projection: name, State: ops.RebuildBuilding, From: from, To: to, StartedAt: h.now().UTC(), Lag: -1}
	if err := h.saveProgress(ctx, rp); err != nil {
		return rp, err
	}
	h.log.Info("rebuild started", "projection", name, "from", from, "to", to)
	return rp, nil
}

// startLockTTL is how long a start holds the lock after its process died (a live one extends it
// until it is done).
const startLockTTL = time.Minute

// lockStart waits (until ctx ends) for name's rebuild start to be free and holds it.
func (h *RebuildProjection) lockStart(ctx context.Context, name string) (func(context.Context) error, error) {
	for delay := 20 * time.Millisecond; ; delay = min(2*delay, time.Second) {
		release, ok, err := h.b.Registry.LockStart(ctx, name, startLockTTL)
		if err != nil {
			return nil, ops.Unavailable(err)
		}
		if ok {
			return release, nil
		}
		select {
		case <-ctx.Done():
			return nil, ops.Unavailable(fmt.Errorf("another start of the rebuild of %s holds it: %w", name, ctx.Err()))
		case <-time.After(delay):
		}
	}
}

// BackfillCaughtUp is the caught-up rule of a version still backfilling: its own group (b) has
// delivered everything up to the join position and has nothing pending, so the live group,
// which feeds it everything after, has made it exactly as current as the serving version.
//
// With stream partitions the rule holds on every partition whose backfill runs, each against
// its own join position.
func BackfillCaughtUp(m ops.LiveMember, b *ops.GroupInfo) bool {
	if m.Own != ops.BackfillRunning || b == nil || m.Missing > 0 {
		return false // a version missing a partition (a join Redis lost) has none of its entries
	}
	if m.Parts == nil {
		return b.Pending == 0 && ops.CompareEntryIDs(b.LastDeliveredID, m.Join) >= 0
	}
	for stream, pm := range m.Parts {
		if pm.Own != ops.BackfillRunning {
			continue
		}
		pb, ok := b.On(stream)
		if !ok || pb.Pending != 0 || ops.CompareEntryIDs(pb.LastDeliveredID, pm.Join) < 0 {
			return false
		}
	}
	return true
}

// RebuildAction is what a rebuild step does next, from the registry's state.
type RebuildAction int

// Rebuild actions.
const (
	RebuildNothing       RebuildAction = iota // no rebuild in progress
	RebuildWatchBuilding                      // the new version builds: switch once it caught up
	RebuildWaitGrace                          // switched; the grace has not passed yet
	RebuildRemoveOld                          // switched and the grace passed: remove the old version
)

// NextRebuildAction is the rebuild state machine: building until it has caught up, then
// retiring for the grace period, then the old version goes.
func NextRebuildAction(st ops.VersionState, now time.Time, grace time.Duration) RebuildAction {
	switch {
	case st.Building > 0:
		return RebuildWatchBuilding
	case st.Retiring > 0 && now.Sub(time.UnixMilli(st.SwitchedAt)) < grace:
		return RebuildWaitGrace
	case st.Retiring > 0:
		return RebuildRemoveOld
	}
	return RebuildNothing
}

// Step advances name's rebuild by what can be done now: switch reads once the new version has
// caught up, remove the old version once the grace has passed. It is idempotent and safe to run
// from several processes at once.
func (h *RebuildProjection) Step(ctx context.Context, name string) (ops.RebuildProgress, error) {
	st, err := h.b.Registry.State(ctx, name)
	if err != nil {
		return ops.RebuildProgress{}, err
	}
	rp, ok := ops.ParseRebuildProgress(st.Rebuild)
	if !ok {
		rp = ops.RebuildProgress{Projection: name, From: st.Serving, To: st.Building, StartedAt: h.now().UTC()}
	}
	switch NextRebuildAction(st, h.now(), h.grace) {
	case RebuildWatchBuilding:
		info, err := h.b.Stream.Info(ctx)
		if err != nil {
			return rp, err
		}
		rp.State, rp.From, rp.To, rp.StreamLength = ops.RebuildBuilding, st.Serving, st.Building, info.Length
		b := info.Group(ops.MemberName(name, st.Building))
		groups, _, err := h.b.Live.ReadAll(ctx)
		if err != nil {
			return rp, err
		}
		building := ops.MemberName(name, st.Building)
		lg, m, member := ops.MemberOf(groups, building)
		rp.Lag, rp.Pending = -1, 0
		if b != nil {
			if rp.Lag, err = ops.GroupLag(ctx, h.b.Stream, info, b); err != nil {
				return rp, err
			}
			if n, ok := ops.BackfillLag(m, b); ok && member && m.Own == ops.BackfillRunning {
				rp.Lag = n // up to its join: the live group feeds what came after
			}
			rp.Pending = b.Pending
		}
		// Caught up: the version is in a live group (fed with v<serving> from the same batches)
		// and its backfill of what came before delivered and acknowledged everything.
		if member && BackfillCaughtUp(m, b) {
			// What the projectors' checkpoints find too.
			if _, err := h.b.Live.FinishBackfill(ctx, lg, building, h.now()); err != nil {
				return rp, err
			}
			m.Own = ops.BackfillDone
		}
		if member && m.Own == ops.BackfillDone {
			now := h.now().UTC()
			switched, err := h.b.Registry.Promote(ctx, name, st.Serving, st.Building, now)
			if err != nil {
				return rp, err
			}
			if !switched {
				// Another driver switched first; its progress record stands.
				return h.storedProgress(ctx, name, rp)
			}
			rp.State, rp.SwitchedAt = ops.RebuildRetiring, &now
			h.log.Info("rebuild caught up: reads switched", "projection", name, "from", st.Serving, "to", st.Building,
				"live_group", lg)
			if err := h.leave(ctx, groups, ops.MemberName(name, st.Serving)); err != nil {
				return rp, err
			}
		}
		return rp, h.saveProgress(ctx, rp)
	case RebuildWaitGrace:
		rp.State = ops.RebuildRetiring
		switchedAt := time.UnixMilli(st.SwitchedAt).UTC()
		rp.SwitchedAt = &switchedAt
		return rp, h.saveProgress(ctx, rp)
	case RebuildRemoveOld:
		rp.State = ops.RebuildRetiring
		switchedAt := time.UnixMilli(st.SwitchedAt).UTC()
		rp.SwitchedAt = &switchedAt
		groups, _, err := h.b.Live.ReadAll(ctx)
		if err != nil {
			return rp, err
		}
		if err := h.leave(ctx, groups, ops.MemberName(name, st.Retiring)); err != nil {
			return rp, err
		}
		removed, err := h.removeVersion(ctx, name, st.Retiring)
		if err != nil {
			return rp, err
		}
		if err := h.b.Registry.Retired(ctx, name, st.Retiring); err != nil {
			return rp, err
		}
		now := h.now().UTC()
		rp.State, rp.FinishedAt = ops.RebuildDone, &now
		h.log.Info("rebuild done: old version removed", "projection", name, "version", st.Retiring, "keys_removed", removed)
		return rp, h.saveProgress(ctx, rp)
	default:
		if !ok {
			rp.State = ops.RebuildDone
			return rp, nil
		}
		if settled, _ := st.Progress(); settled.State != rp.State {
			// Nothing is built or retired any more, yet the record says otherwise
			// (VersionState.Progress): a CLI waiting for the rebuild never returned. Recorded
			// done now.
			now := h.now().UTC()
			rp.State, rp.FinishedAt = ops.RebuildDone, &now
			return rp, h.saveProgress(ctx, rp)
		}
		return rp, nil
	}
}

// StepAll steps the rebuild of each of projs that has one in progress (what every projector
// does at each registry poll). One projection's failure holds off no other's step: the errors
// are returned together, each naming its projection.
func (h *RebuildProjection) StepAll(ctx context.Context, projs []projection.Projection) error {
	var errs []error
	for _, p := range projs {
		if ctx.Err() != nil {
			return errors.Join(append(errs, ctx.Err())...)
		}
		st, err := h.b.Registry.State(ctx, p.Name())
		if err == nil && (st.Building > 0 || st.Retiring > 0) {
			_, err = h.Step(ctx, p.Name())
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("rebuild of %s: %w", p.Name(), err))
		}
	}
	return errors.Join(errs...)
}

// leave takes member out of whichever live group feeds it (a retired version): batches read
// after that do not feed it.
func (h *RebuildProjection) leave(ctx context.Context, groups map[string]ops.Membership, member string) error {
	for g, ms := range groups {
		if _, ok := ms.Members[member]; ok {
			if err := h.b.Live.Leave(ctx, g, member); err != nil {
				return fmt.Errorf("take %s out of live group %s: %w", member, g, err)
			}
		}
	}
	return nil
}

// Drive runs Step every interval until the rebuild is done or ctx ends, reporting each step.
func (h *RebuildProjection) Drive(ctx context.Context, name string, interval time.Duration, report func(ops.RebuildProgress)) (ops.RebuildProgress, error) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		rp, err := h.Step(ctx, name)
		if err != nil && ctx.Err() == nil {
			h.log.Warn("rebuild step failed, will retry", "projection", name, "error", err)
		}
		if err == nil && report != nil {
			report(rp)
		}
		if err == nil && rp.State == ops.RebuildDone {
			return rp, nil
		}
		select {
		case <-ctx.Done():
			return rp, ctx.Err()
		case <-t.C:
		}
	}
}

// storedProgress rereads name's stored progress (fallback when it cannot be read).
func (h *RebuildProjection) storedProgress(ctx context.Context, name string, fallback ops.RebuildProgress) (ops.RebuildProgress, error) {
	st, err := h.b.Registry.State(ctx, name)
	if err != nil {
		return fallback, err
	}
	if rp, ok := st.Progress(); ok {
		return rp, nil
	}
	return fallback, nil
}

// removeVersion destroys version's group and removes its keys; it returns how many keys went.
func (h *RebuildProjection) removeVersion(ctx context.Context, name string, version int) (int64, error) {
	group := ops.MemberName(name, version)
	if err := h.b.Stream.DestroyGroup(ctx, group); err != nil {
		return 0, err
	}
	removed, err := h.b.Keys.RemoveVersion(ctx, name, version)
	if err != nil {
		return removed, err
	}
	// Once more: a subscription of a projector that had not yet retired the version may have
	// recreated the group while the keys went.
	if err := h.b.Stream.DestroyGroup(ctx, group); err != nil {
		return removed, err
	}
	// The stall check's observation of the group goes with it, and the group's markers.
	if err := h.b.Observations.Forget(ctx, group); err != nil {
		return removed, err
	}
	// A disband may have taken it out of its live group while it was retiring (the switch's
	// driver stopped before it left): no projector will join it again, so its moved record
	// would hold partition migrations and the dedupe floors off for good.
	if err := h.b.Live.ForgetMoved(ctx, group); err != nil {
		return removed, err
	}
	n, err := h.removeOwnGroup(ctx, group)
	if err != nil {
		return removed + n, err
	}
	// The markers of replays into the version go with it: a version of the same number built
	// again (after a build abandoned by hand) would find them and report its own parked events
	// as counted already, dropping them.
	r, err := h.b.Keys.RemoveMarkers(ctx, ReplayGroup(name, version))
	return removed + n + r, err
}

// letGoOfRemoval leaves token's marks on member held by none, for the next run to take up at
// once: this run failed (its context may have ended).
func (h *RebuildProjection) letGoOfRemoval(ctx context.Context, lg, member, token string) {
	ectx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if err := h.b.Live.EndRemoval(ectx, lg, member, token, false); err != nil {
		h.log.Warn("could not let go of a finished backfill's removal; another run takes it over after RemovalHold",
			"group", member, "error", err)
	}
}

// removeLeftovers removes what a finished backfill's destroyed group left: its markers, the
// stall check's observation, and after an upgrade the earlier layout's sets; it returns how
// many keys went.
func (h *RebuildProjection) removeLeftovers(ctx context.Context, member string, m ops.LiveMember) (int64, error) {
	n, err := h.b.Keys.RemoveMarkers(ctx, member)
	if err != nil {
		return n, err
	}
	if err := h.b.Observations.Forget(ctx, member); err != nil {
		return n, err
	}
	if m.Legacy != "" {
		name, version, _ := ops.ParseMemberName(member)
		k, err := h.b.Keys.RemoveLegacyDedupe(ctx, name, version)
		if err != nil {
			return n, err
		}
		n += k
	}
	return n, nil
}

// RemovalHold is how long one run's removal of a finished backfill's leftovers keeps others off
// without renewing its hold: a run cut short (a crash, a process that stands still) is taken over
// once it has passed. The run renews it every quarter of it, and stops as soon as a renewal
// finds it taken over: two runs at once would let the one that finishes first clear the mark
// while the other still removes, and a disband then make a group whose markers it removes.
const RemovalHold = 10 * time.Minute

// errRemovalTakenOver: a renewal found another run holding the removal.
var errRemovalTakenOver = errors.New("another run took the removal over (this one had not renewed its hold within RemovalHold)")

// removeHeld removes what member's destroyed group left (removeLeftovers) while renewing token's
// hold every quarter of it; it stops, with an error, once a renewal finds the removal taken over.
func (h *RebuildProjection) removeHeld(ctx context.Context, lg, member, token string, m ops.LiveMember) (int64, error) {
	rctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	stop, renewing := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(renewing)
		t := time.NewTicker(h.hold / 4)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-rctx.Done():
				return
			case <-t.C:
			}
			held, err := h.b.Live.RenewRemoval(rctx, lg, member, token)
			if err != nil {
				// The next tick tries again: the hold lasts three more.
				h.log.Warn("could not renew the hold on a finished backfill's removal", "group", member, "error", err)
				continue
			}
			if !held {
				cancel(errRemovalTakenOver)
				return
			}
		}
	}()
	n, err := h.removeLeftovers(rctx, member, m)
	close(stop)
	<-renewing
	if cause := context.Cause(rctx); errors.Is(cause, errRemovalTakenOver) {
		return n, fmt.Errorf("removing what the finished backfill %s left: %w", member, cause)
	}
	return n, err
}

// removalToken names one run's removal of a finished backfill's leftovers.
func removalToken() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// removeOwnGroup destroys a version's own group once its backfill is over, with its markers and
// its recorded position; it returns how many keys went.
func (h *RebuildProjection) removeOwnGroup(ctx context.Context, group string) (int64, error) {
	if err := h.b.Stream.DestroyGroup(ctx, group); err != nil {
		return 0, err
	}
	n, err := h.b.Keys.RemoveMarkers(ctx, group)
	if err != nil {
		return n, err
	}
	if err := h.b.Live.ForgetAcked(ctx, group); err != nil {
		return n, err
	}
	return n, h.b.Observations.Forget(ctx, group)
}

// RemoveFinishedBackfills removes the own groups of versions whose backfill finished more than
// RetireGrace ago (every projector has stopped its handler by then), and, after an upgrade, the
// earlier layout's dedupe sets of those versions.
func (h *RebuildProjection) RemoveFinishedBackfills(ctx context.Context) error {
	groups, _, err := h.b.Live.ReadAll(ctx)
	if err != nil {
		return err
	}
	info, err := h.b.Stream.Info(ctx)
	if err != nil {
		return err
	}
	for lg, ms := range groups {
		for member, m := range ms.Members {
			if m.Own != ops.BackfillDone || info.Group(member) == nil && m.Removing == "" {
				continue
			}
			doneAt, err := strconv.ParseInt(m.DoneAt, 10, 64)
			if err != nil || h.now().Sub(time.UnixMilli(doneAt)) < h.grace {
				continue
			}
			// Only while it is still that live group's finished backfill, checked in the same
			// step as the group and its checkpoint go (what was read above may be old: a disband
			// may have made a group of that name since). The member is marked removing until
			// what the group left is gone: a disband waits for it (a group of that name made
			// meanwhile would lose its markers). Another projector's run may be at it too: one
			// run holds the removal at a time (until RemovalHold passes without it finishing, or
			// it fails and lets go), and only the holder clears the mark.
			token := removalToken()
			held, err := h.b.Live.DestroyFinishedOwnGroup(ctx, lg, member, token, h.hold)
			if err != nil {
				h.letGoOfRemoval(ctx, lg, member, token) // the partitions it held before the error
				return err
			}
			if !held {
				continue
			}
			n, err := h.removeHeld(ctx, lg, member, token, m)
			if err != nil {
				h.letGoOfRemoval(ctx, lg, member, token)
				return err
			}
			// Done even if ctx ends now (a SIGTERM): a mark left held would hold off every run
			// and a disband for RemovalHold.
			ectx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			err = h.b.Live.EndRemoval(ectx, lg, member, token, true)
			cancel()
			if err != nil {
				h.letGoOfRemoval(ctx, lg, member, token)
				return err
			}
			h.log.Info("backfill group removed", "group", member, "keys_removed", n)
		}
	}
	return nil
}

func (h *RebuildProjection) saveProgress(ctx context.Context, rp ops.RebuildProgress) error {
	b, err := json.Marshal(rp)
	if err != nil {
		return err
	}
	if err := h.b.Registry.SetRebuildStatus(ctx, rp.Projection, string(b)); err != nil {
		return ops.Unavailable(err)
	}
	return nil
}
