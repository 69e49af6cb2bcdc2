package ports

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/checkins/checkins/app/ops"
	"github.com/checkins/checkins/app/projection"
	"github.com/checkins/checkins/domain"
)

// ErrForeignMember means a live group lists a projection this process does not run: another
// build (a newer one, during a rolling deploy) joined it. This process then leaves the group's
// entries to the processes that run every member, since an entry is applied for all of them at
// once or not at all.
var ErrForeignMember = errors.New("the live group has a member this process does not run")

// feed is one consumer group's batch handler: the live group, fed to every member whose join
// position an entry is past, or a member's own group, which backfills it up to its join
// position.
type feed struct {
	r      *ProjectionRouter
	group  string
	member string // "" for the live group
}

// member is a projection version this process can apply.
type memberRef struct {
	proj    projection.Projection
	version int
	m       ops.LiveMember
}

// on is the member's join position and legacy bound on the entry's partition; ok is false
// when it has not joined that partition yet (the entry is then not for it: it is at or below
// the position it will join at there, which its own group backfills).
func (m memberRef) on(stream string) (join, legacy string, ok bool) {
	if m.m.Parts == nil {
		return m.m.Join, m.m.Legacy, true
	}
	p, ok := m.m.Parts[stream]
	return p.Join, p.Legacy, ok
}

// backfillDone says whether m's own group finished its backfill on stream.
func (m memberRef) backfillDone(stream string) bool {
	lm, ok := m.m.On(stream)
	return ok && lm.Own == ops.BackfillDone
}

// units lists every unit of b: each entry for each member it is for. lost lists the entries of
// an own group's partitions where the member's join is gone (Redis lost it): the join that made
// the group there made the membership with it, so nothing says what they are for until the
// router joins the partition again; they are not applied, and not acknowledged, meanwhile.
// Entries done (resolved) are left out.
func (f *feed) units(b *batch, ms ops.Membership, done []bool, parked func(ops.UnitRef) bool) (units []unit, refs map[string]memberRef, lost map[int]string, err error) {
	refs = map[string]memberRef{}
	for name, m := range ms.Members {
		if f.member != "" && name != f.member {
			continue
		}
		pname, version, ok := ops.ParseMemberName(name)
		if !ok {
			return nil, nil, nil, fmt.Errorf("live group %s: member %q is not <projection>.v<N>", f.group, name)
		}
		p, ok := f.r.projectionOf(name, pname)
		if !ok {
			return nil, nil, nil, fmt.Errorf("%w: %s (in %s)", ErrForeignMember, name, f.group)
		}
		refs[name] = memberRef{proj: p, version: version, m: m}
	}
	var out []unit
	for i, d := range b.events {
		if done != nil && done[i] {
			continue // acknowledged on its own by an earlier attempt
		}
		if f.member != "" && len(refs) == 0 && f.r.isTarget(f.member) {
			// The member is on no partition while the router still feeds it: its join is lost
			// on every one. Acknowledged now, its entries would never be applied. (One that
			// left retired: the router stops this handler, and nothing here is for it.)
			if lost == nil {
				lost = map[int]string{}
			}
			lost[i] = d.Stream
			continue
		}
		n := len(out)
		for name, ref := range refs {
			join, _, ok := ref.on(d.Stream)
			if !ok && f.member != "" {
				if lost == nil {
					lost = map[int]string{}
				}
				lost[i] = d.Stream
				continue
			}
			if !ok || (f.member != "" && ref.backfillDone(d.Stream)) {
				continue // a finished backfill applies nothing more: all it had to is acknowledged
			}
			after := ops.CompareEntryIDs(d.ID, join) > 0
			if after == (f.member == "") && !parked(ops.UnitRef{Group: f.group, Stream: f.r.streamOf(d), Entry: d.ID, Member: name}) {
				out = append(out, unit{entry: i, member: name})
			}
		}
		if d.Err != nil && len(out) > n {
			// Not an event at all: one unit for the group, parked once, whoever it was for.
			out = out[:n]
			if !parked(ops.UnitRef{Group: f.group, Stream: f.r.streamOf(d), Entry: d.ID}) {
				out = append(out, unit{entry: i})
			}
		}
	}
	return out, refs, lost, nil
}

// metaDeliveries is the batched subscriber's delivery count of a message (batchsub.MetaDeliveries:
// "1" for a first read; more for an entry read from a consumer's pending list again, after a
// restart or a takeover).
const metaDeliveries = "_deliveries"

// parkedUnits says which units of b are parked and must not be applied: those this process
// parked (their batch was nacked after the park), and, for entries Redis delivered before (taken
// over from a process that died between a park and its acknowledgement, say), those the poison
// queue records until their entries are acknowledged. Applied on such a redelivery, an
// intermittent failure's unit was counted, and counted again by its replay. The batched
// subscriber's first deliveries are not asked about, so they cost no round trip; with the stock
// subscriber, which tells no delivery count, every batch is.
func (f *feed) parkedUnits(ctx context.Context, b *batch, ms ops.Membership) (func(ops.UnitRef) bool, error) {
	var ask []ops.UnitRef
	for i, m := range b.msgs {
		// Without a count (the stock subscriber tells none) every entry is asked about, and so
		// is one whose park failed here (it may have landed).
		d := b.events[i]
		stream := f.r.streamOf(d)
		if n, err := strconv.Atoi(m.Metadata.Get(metaDeliveries)); err == nil && n < 2 &&
			!f.r.isUnsure(ops.UnitRef{Group: f.group, Stream: stream, Entry: d.ID}) {
			continue
		}
		ask = append(ask, ops.UnitRef{Group: f.group, Stream: stream, Entry: d.ID}) // an entry that is no event
		for name := range ms.Members {
			if f.member == "" || name == f.member {
				ask = append(ask, ops.UnitRef{Group: f.group, Stream: stream, Entry: d.ID, Member: name})
			}
		}
	}
	if len(ask) == 0 {
		return f.r.wasParked, nil
	}
	held, err := f.r.backend.Parked(ctx, ask)
	if err != nil {
		return nil, err
	}
	inQueue := map[ops.UnitRef]bool{}
	for i, ok := range held {
		if ok {
			inQueue[ask[i]] = true
		}
	}
	return func(u ops.UnitRef) bool { return inQueue[u] || f.r.wasParked(u) }, nil
}

// handle is the router's handler function for a batch message.
func (f *feed) handle(msg *message.Message) (_ []*message.Message, err error) {
	var lost map[int]string
	defer func() {
		// Whatever ends an attempt that left a lost partition's entries out (a transient error,
		// a timeout), the batch must come back whole: a retry of the units this attempt found
		// would leave them out, and once the router joined the partition again, acknowledge
		// them unapplied (see aroundLost and the retry middleware).
		// (Not a refusal for the lease: the batch comes back whole for it already, and the
		// wrap would hide it from the middlewares.)
		if len(lost) > 0 && err != nil && !errors.Is(err, errNotJoinedThere) && !errors.Is(err, projection.ErrLeaseExpired) {
			err = fmt.Errorf("%v; and %w: entries of %s on a partition it is not joined on wait", err, errNotJoinedThere, f.member)
		}
	}()
	b, err := batchOf(msg)
	if err != nil {
		return nil, err
	}
	ctx := msg.Context()
	plan := planOf(ctx)
	b.decodeOnce.Do(func() {
		b.events = make([]projection.Entry, len(b.msgs))
		f.r.backend.DecodeEntries(b.msgs, b.events)
	})
	for _, d := range b.events {
		if d.ID == "" {
			// Which side of a join position an entry is on, and its time for the dedupe
			// window, come from its ID: without it nothing can be decided (not parked: the
			// subscriber could not tell, which says nothing about the event).
			return nil, errors.New("a stream entry came without its entry ID; will retry")
		}
	}
	ms, err := f.r.membership(ctx)
	if err != nil {
		return nil, err
	}
	f.r.noteJoins(ms.Joins)
	done := b.resolvedNow()
	parked, err := f.parkedUnits(ctx, b, ms)
	if err != nil {
		return nil, err
	}
	var all []unit
	var refs map[string]memberRef
	all, refs, lost, err = f.units(b, ms, done, parked)
	if err != nil {
		f.r.foreign(err)
		return nil, err
	}
	units := plan.units
	if units == nil {
		units = all
	} else if len(lost) > 0 || done != nil {
		kept := make([]unit, 0, len(units))
		for _, u := range units {
			if _, gone := lost[u.entry]; !gone && (done == nil || !done[u.entry]) {
				kept = append(kept, u)
			}
		}
		units = kept
	}
	plan.progress.units.Store(units)
	start := time.Now()

	// Run the handlers: pure functions of the event that return updates.
	results := make([]unitResult, len(units))
	failedEntry := map[int]bool{}
	for i, u := range units {
		plan.progress.current.Store(u)
		d := b.events[u.entry]
		ref, ok := refs[u.member]
		if !ok && d.Err == nil {
			// The member left the group since the plan was made (a retired version): nothing to do.
			continue
		}
		if d.Err != nil {
			results[i].err = permanent(d.Err)
		} else {
			results[i].updates, results[i].err = runHandler(ctx, ref.proj, d.Event)
		}
		if results[i].err != nil {
			failedEntry[u.entry] = true
		}
		if ctx.Err() != nil {
			return nil, fmt.Errorf("%w (%s)", ErrHandlerTimeout, ctx.Err())
		}
	}

	// Apply the entries whose every unit succeeded, unless held: an entry is applied as a whole.
	works := make([]projection.Work, 0, len(units))
	workUnits := make([]int, 0, len(units))
	var failure BatchFailure
	// An entry's EventRef (its identity is a SHA-256) is made once for all of its units.
	entryRefs := make([]projection.EventRef, len(b.events))
	haveRef := make([]bool, len(b.events))
	for i, u := range units {
		ref, ok := refs[u.member]
		switch {
		case results[i].err != nil:
			failure.Failed = append(failure.Failed, unitFailure{unit: u, err: results[i].err})
		case !ok:
		case failedEntry[u.entry] || plan.hold[u.entry]:
			failure.Held = append(failure.Held, u)
		case len(results[i].updates) > 0:
			d := b.events[u.entry]
			ev, ok := d.Event.(domain.CheckinRecorded)
			if !ok {
				failure.Failed = append(failure.Failed, unitFailure{unit: u, err: permanent(fmt.Errorf("updates for a %s event cannot be deduplicated", d.Event.EventName()))})
				continue
			}
			if !haveRef[u.entry] {
				entryRefs[u.entry], haveRef[u.entry] = projection.RefOf(ev, d.ID), true
			}
			evRef := entryRefs[u.entry]
			if _, legacy, _ := ref.on(d.Stream); legacy != "" && d.ID != "" && ops.CompareEntryIDs(d.ID, legacy) <= 0 {
				evRef.LegacyID = ev.ID
			}
			works = append(works, projection.Work{Group: f.group, Projection: ref.proj.Name(), Version: ref.version, Event: evRef, Updates: results[i].updates})
			workUnits = append(workUnits, i)
		}
	}
	plan.progress.flushing.Store(true)
	if ctx.Err() != nil {
		return nil, fmt.Errorf("%w (%s)", ErrHandlerTimeout, ctx.Err())
	}
	ctx = f.leased(ctx, b, units, workUnits)
	outcomes, err := f.r.cfg.Applier.Apply(ctx, works, f.r.prune)
	if err != nil {
		if f.r.isTransient(err) || ctx.Err() != nil || errors.Is(err, projection.ErrLeaseExpired) {
			return nil, err
		}
		// Something about the updates themselves (a key of another type, say): find which.
		if outcomes, err = f.applyAround(ctx, works, workUnits, units, err, &failure); err != nil {
			return nil, err
		}
	}
	f.observe(failure.Failed, works, outcomes, refs, time.Since(start))
	if len(lost) > 0 {
		return nil, f.aroundLost(b, lost, &failure, plan)
	}
	if len(failure.Failed) > 0 || len(failure.Held) > 0 {
		return nil, &failure
	}
	return nil, nil
}

// aroundLost acknowledges, each on its own, the entries of b that are done (applied whole, or
// nothing in them for the member), and returns the error that has the batch's other entries
// delivered again: those of the partitions where the member's join is lost, and any whose units
// failed or were held, which are retried (and parked) once the router has joined the partition
// again. Without it one lost partition's entries, joined into every batch with the others',
// failed them all: the member's backfill stalled on every partition, and its checkpoints with it.
func (f *feed) aroundLost(b *batch, lost map[int]string, failure *BatchFailure, plan *attemptPlan) error {
	open := map[int]bool{}
	for _, u := range failure.Failed {
		open[u.unit.entry] = true
	}
	for _, u := range failure.Held {
		open[u.entry] = true
	}
	streams := map[string]bool{}
	for i := range b.msgs {
		if s, gone := lost[i]; gone {
			streams[s] = true
			continue
		}
		if !open[i] && !plan.hold[i] {
			b.resolve(i)
		}
	}
	names := make([]string, 0, len(streams))
	for s := range streams {
		names = append(names, s)
	}
	sort.Strings(names)
	err := fmt.Errorf("%w: %s is not a member of live group %s on %s (Redis lost its join there?); their entries wait until the router joins it again",
		errNotJoinedThere, f.member, f.r.cfg.LiveGroup, strings.Join(names, ", "))
	if len(failure.Failed) > 0 {
		// Told, not wrapped: a BatchFailure would have the middlewares park the failed units
		// and then acknowledge the batch, the lost partition's entries with it.
		err = fmt.Errorf("%w; and %v", err, failure)
	}
	return err
}

// applyAround applies works after err, an error of applying them together that is about the
// updates themselves, leaving out the entries that fail: the unit whose work failed fails (the
// retry and poison middlewares take it from there) and the other units of its entry are held,
// so that its other projections are applied once it is parked. An entry's works go together,
// as they share one marker per slot: one applied alone would mark the others applied. When
// the error does not say which work failed, each entry is tried alone, and all the units of
// one that fails fail.
func (f *feed) applyAround(ctx context.Context, works []projection.Work, workUnits []int, units []unit, err error, failure *BatchFailure) ([]projection.Outcome, error) {
	outcomes := make([]projection.Outcome, len(works))
	out := map[int]bool{} // entries left out
	leaveOut := func(e int, culprit int, err error) {
		out[e] = true
		for w := range works {
			if u := units[workUnits[w]]; u.entry == e {
				if culprit < 0 || w == culprit {
					failure.Failed = append(failure.Failed, unitFailure{unit: u, err: err})
				} else {
					failure.Held = append(failure.Held, u)
				}
			}
		}
	}
	apply := func(keep func(w int) bool) (at []int, o []projection.Outcome, err error) {
		sub := make([]projection.Work, 0, len(works))
		for w := range works {
			if !out[units[workUnits[w]].entry] && keep(w) {
				sub, at = append(sub, works[w]), append(at, w)
			}
		}
		if len(sub) == 0 {
			return nil, nil, nil
		}
		o, err = f.r.cfg.Applier.Apply(ctx, sub, f.r.prune)
		return at, o, err
	}
	named := func(err error, at []int) int { // the work err names, by its index in works; -1: none
		var wf *projection.WorkFailure
		if errors.As(err, &wf) && wf.Work >= 0 && wf.Work < len(at) {
			return at[wf.Work]
		}
		return -1
	}
	at := make([]int, len(works)) // the works of the call that failed, by their place in it
	for w := range at {
		at[w] = w
	}
	for {
		if errors.Is(err, projection.ErrAppliedInPart) || errors.Is(err, projection.ErrLeaseExpired) {
			return nil, err // only this group applying it again completes it exactly
		}
		w := named(err, at)
		if w < 0 {
			break
		}
		leaveOut(units[workUnits[w]].entry, w, err)
		var o []projection.Outcome
		if at, o, err = apply(func(int) bool { return true }); err == nil {
			for i, w := range at {
				outcomes[w] = o[i]
			}
			return outcomes, nil
		}
		if f.r.isTransient(err) || ctx.Err() != nil || errors.Is(err, projection.ErrLeaseExpired) {
			return nil, err
		}
	}
	// Not told which work failed: each entry alone.
	tried := map[int]bool{}
	for w := range works {
		e := units[workUnits[w]].entry
		if out[e] || tried[e] {
			continue
		}
		tried[e] = true
		at, o, err := apply(func(v int) bool { return units[workUnits[v]].entry == e })
		if err != nil {
			if f.r.isTransient(err) || ctx.Err() != nil || errors.Is(err, projection.ErrAppliedInPart) || errors.Is(err, projection.ErrLeaseExpired) {
				return nil, err
			}
			leaveOut(e, named(err, at), err)
			continue
		}
		for i, v := range at {
			outcomes[v] = o[i]
		}
	}
	return outcomes, nil
}

// leased is ctx with the lease of the entries units[workUnits] are of (ProjectorBackend.LeaseOf):
// the applier writes nothing for them from the moment another consumer may have taken one of
// them over (a process that stood still longer than CLAIM_IDLE between reading and applying).
func (f *feed) leased(ctx context.Context, b *batch, units []unit, workUnits []int) context.Context {
	msgs := make([]*message.Message, 0, len(workUnits))
	last := -1
	for _, wu := range workUnits {
		if e := units[wu].entry; e != last { // an entry's units are next to each other
			msgs, last = append(msgs, b.msgs[e]), e
		}
	}
	if until, ok := f.r.backend.LeaseOf(msgs); ok {
		return projection.WithLease(ctx, until)
	}
	return ctx
}

// runHandler runs p on e, turning a panic into an error of that unit.
func runHandler(ctx context.Context, p projection.Projection, e domain.Event) (us []*projection.Update, err error) {
	defer func() {
		if rec := recover(); rec != nil {
			err = fmt.Errorf("panic in projection %s: %v\n%s", p.Name(), rec, debug.Stack())
		}
	}()
	return projection.Updates(ctx, p, e)
}

// observe reports the batch's outcomes per projection: every failed attempt, whether its
// handler failed or applying its updates did (a key of another type, say: those were retried and
// parked without a failed attempt counted), and what was applied.
func (f *feed) observe(failed []unitFailure, works []projection.Work, outcomes []projection.Outcome, refs map[string]memberRef, d time.Duration) {
	obs := f.r.cfg.Observer
	type key struct{ projection, outcome string }
	counts := map[key]int{}
	for _, uf := range failed {
		if ref, ok := refs[uf.unit.member]; ok {
			counts[key{ref.proj.Name(), OutcomeFailed}]++
		}
	}
	for i, w := range works {
		if i >= len(outcomes) || outcomes[i] == 0 {
			continue // not applied: its unit failed applying, or is held with one that did
		}
		outcome := OutcomeApplied
		if outcomes[i] == projection.Duplicate {
			outcome = OutcomeDuplicate
		}
		counts[key{w.Projection, outcome}]++
	}
	for k, n := range counts {
		obs.Handled(k.projection, k.outcome, n, d)
	}
}

type unitResult struct {
	updates []*projection.Update
	err     error
}
