package projection

import (
	"context"
	"errors"
)

import "github.com/checkins/checkins/domain"

// What the projection machinery hands the applier (adapters.ProjectionApplier): the updates one
// projection version made for one event, with what deduplicating needs to know of that event.

// EventRef is what applying needs to know of the event an update comes from.
type EventRef struct {
	EntryID  string // stream entry ID; "" when unknown (RecordedAt is the clock then)
	UserID   int64  // whose registry decides
	Identity int64  // domain.Checkin.Identity
	// RecordedAt (ms) stands in for the entry's time when EntryID is empty.
	RecordedAt int64
	// LegacyID, when set, is the checkinId to look up in the dedupe sets of the service's earlier
	// layout (<...>:{<slot>}:seen): entries read before an upgrade may be applied there already.
	LegacyID string
	// Decision is the dedupe decision when it is known already: a parked event carries the one
	// made when it was parked, since the registry may have let go of its copies by the time it
	// is replayed. Applying then does not ask the registry.
	Decision Decision
}

// RefOf is the EventRef of e read from the stream at entryID.
func RefOf(e domain.CheckinRecorded, entryID string) EventRef {
	return EventRef{EntryID: entryID, UserID: e.UserID, Identity: e.Identity(), RecordedAt: e.RecordedAt}
}

// Decision is the dedupe decision for one event.
type Decision int8

// Decisions.
const (
	Undecided        Decision = iota
	DecidedCounted            // this copy is the one counted
	DecidedDuplicate          // another copy was counted
)

// Work is the updates one projection version made for one event, applied by one consumer group.
type Work struct {
	// Group is the consumer group the event came through: markers are kept per group, since
	// only the group that delivered an entry delivers it again. Every update one group makes
	// for one event in one slot is applied together, under one marker.
	Group      string
	Projection string
	Version    int
	Event      EventRef
	Updates    []*Update
}

// Prune tells, per consumer group, the stream position below which the group will deliver no
// entry again (its oldest pending entry, or its last delivered one): markers below it may go.
// ok false prunes nothing. A nil Prune prunes nothing.
type Prune func(group string) (before string, ok bool)

// Outcome of one Work.
type Outcome int8

// Outcomes.
const (
	Applied        Outcome = iota + 1 // at least one update was applied now
	AlreadyApplied                    // every update had landed before (a redelivery)
	Duplicate                         // another copy of this check-in was counted
	Ignored                           // the projection made no update for the event
)

// WorkFailure is an Apply error that one work's updates caused (a key of another type under
// the projection, say): Work is its index in the works given. Nothing of that work was applied,
// nor of the item it was part of (what its group did for its event, in its slot); other items
// may have been.
type WorkFailure struct {
	Work int
	Err  error
}

func (e *WorkFailure) Error() string { return e.Err.Error() }
func (e *WorkFailure) Unwrap() error { return e.Err }

// ErrAppliedInPart marks an Apply error after which a work's updates may have landed in some of
// its slots and not in others (a Redis Cluster runs each slot's in a call of its own): only the
// same group applying it again completes it exactly (its markers make the landed part a no-op),
// so the batch is retried whole until it goes through, never split or parked. A replay, under
// markers of its own, would count the landed part twice.
var ErrAppliedInPart = errors.New("a work's updates were applied in some slots and not others")

// ErrLeaseExpired is an Apply error: the consumer's hold on the entries it was applying ran out
// before Redis ran the call (the process stood still longer than CLAIM_IDLE: SIGSTOP, a paused
// VM; or its entries' node was out of reach that long), so another consumer may have taken them
// over and applied them. Nothing of that call was
// applied; earlier calls of the same Apply may have been (their markers make the landed part a
// no-op for whoever applies the entries next). The entries must not be acknowledged or parked
// by this consumer: they belong to whoever holds them now.
var ErrLeaseExpired = errors.New("the consumer's hold on these entries ran out (it stood still, or could not reach Redis, longer than CLAIM_IDLE); another consumer may have taken them over")

type leaseKey struct{}

// WithLease has Apply calls made with ctx refuse to write once Redis's clock reaches until (ms
// since the epoch, Redis TIME): the moment after which another consumer of the group may take
// the entries being applied over. until <= 0 leaves ctx as it is.
func WithLease(ctx context.Context, until int64) context.Context {
	if until <= 0 {
		return ctx
	}
	return context.WithValue(ctx, leaseKey{}, until)
}

// LeaseOf is the lease WithLease put in ctx; ok is false when there is none (applies are not
// fenced: a replay, a rebuild, or a subscriber that tells no lease).
func LeaseOf(ctx context.Context) (until int64, ok bool) {
	until, ok = ctx.Value(leaseKey{}).(int64)
	return until, ok
}

// Entry is one stream entry as the machinery hands it to the projections: its ID and its
// event, or why it is not one (undecodable or invalid: every projection parks it).
type Entry struct {
	ID string
	// Stream is the partition of the event stream the entry is in ("" when the subscriber did
	// not say: the stream has one partition).
	Stream string
	Event  domain.Event
	Err    error
}
