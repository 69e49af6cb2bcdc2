// Package command holds the use cases that change state.
package command

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/checkins/checkins/domain"
)

// EventPublisher appends events to the event stream. It returns only once the event is stored.
type EventPublisher interface {
	// PublishCheckinRecorded returns an error wrapping ErrNotPublished when the event is known
	// not to be on the stream; any other error leaves open whether it was stored.
	PublishCheckinRecorded(ctx context.Context, e domain.CheckinRecorded, correlationID string) error
}

// ErrNotPublished marks a publish error after which the event is certainly not on the stream
// (it was refused before it was sent).
var ErrNotPublished = errors.New("event not published")

// FencedPublisher is an EventPublisher that can have the stream refuse an event that reaches it
// too late. The handler gives the time left, by its own clock, until shortly before another
// attempt may take the reservation over, so an XADD that reached Redis late (held up in the
// network, or behind a paused or busy server) cannot add the event after a taker added it too.
// A duration, not a time: the publisher turns it into a deadline of the stream's own clock,
// whatever this process's clock and Redis's say.
type FencedPublisher interface {
	// PublishCheckinRecordedWithin is PublishCheckinRecorded, except that the event is not
	// stored when it would be added more than within from now: the error then wraps
	// ErrNotPublished and ErrPublishTooLate.
	PublishCheckinRecordedWithin(ctx context.Context, e domain.CheckinRecorded, correlationID string, within time.Duration) error
}

// ErrPublishTooLate is a fenced publish refused: the reservation could be taken over by then.
var ErrPublishTooLate = errors.New("the stream refused the event: its reservation could be taken over by then")

// fenceMargin is how long before a reservation may be taken over its owner's XADD is refused:
// the clocks of the taker's process, the owner's and Redis may differ by up to that much
// together (a quarter of the takeover age when that is shorter).
const fenceMargin = time.Second

// IdempotencyRecord is what was first accepted under a checkinId.
type IdempotencyRecord struct {
	Fingerprint string
	Checkin     domain.Checkin
	RecordedAt  int64
	Published   bool // the event is known to be on the stream
	// Owner is the token of the attempt that holds an unpublished reservation ("" in records
	// written before reservations had owners); ReservedAt (ms since epoch) is when it took it.
	Owner      string
	ReservedAt int64
}

// IdempotencyStore remembers which checkinIds were accepted, so a retry is answered without a
// second event and a different check-in reusing the ID is refused.
type IdempotencyStore interface {
	// Reserve stores rec under its checkinId unless one exists; it returns the existing one, or
	// nil when rec was stored.
	Reserve(ctx context.Context, rec IdempotencyRecord) (*IdempotencyRecord, error)
	// MarkPublished records that the event of rec (as reserved) is on the stream.
	MarkPublished(ctx context.Context, rec IdempotencyRecord) error
	// TakeOver atomically replaces the reservation seen with next, if it is still unpublished
	// and held by seen.Owner; otherwise it returns what is stored now (nil: nothing).
	TakeOver(ctx context.Context, seen, next IdempotencyRecord) (taken bool, current *IdempotencyRecord, err error)
	// Release deletes the reservation rec, only if it is still exactly rec (unpublished, ours).
	Release(ctx context.Context, rec IdempotencyRecord) error
}

// BatchMarker is an IdempotencyStore that marks many records published at once (one round
// trip). With one, the handler queues the marks to a single writer instead of starting a
// goroutine, a context and a timer per check-in.
type BatchMarker interface {
	// MarkPublishedAll marks each of recs as MarkPublished does; errs[i] is recs[i]'s outcome.
	MarkPublishedAll(ctx context.Context, recs []IdempotencyRecord) (errs []error)
}

// RecordCheckin is the command to accept one check-in.
type RecordCheckin struct {
	Input         domain.CheckinInput
	CorrelationID string
	// LimitUser is the user whose rate limit (WithUserLimit) the request counts against, the
	// token's subject; 0: none. It is counted before anything is reserved, also when the input
	// is invalid, and a request over the limit fails with *RateLimitedError having written
	// nothing.
	LimitUser int64
}

// RecordCheckinResult is the accepted check-in and whether this call recorded it (false: a
// retry), and the user's rate limit after this request when it was counted (set with an error
// too, except for a failure to count).
type RecordCheckinResult struct {
	Checkin  domain.Checkin
	Replayed bool
	Rate     *RateDecision
}

// DefaultTakeoverAge is how old an unpublished reservation must be before a request presumes
// its owner dead and publishes the check-in itself. An owner younger than that may still be
// publishing, and taking over would write the event twice (counted once, but listed twice).
const DefaultTakeoverAge = 5 * time.Second

const (
	// A request that finds another one's reservation polls it: first soon (a normal XADD takes
	// well under a millisecond), then less often.
	pollMin = 2 * time.Millisecond
	pollMax = 50 * time.Millisecond
	// Releasing a reservation is cleanup after the request has failed, possibly because its
	// context ended: it gets a short context of its own.
	releaseTimeout = 500 * time.Millisecond
	// Marking a reservation published happens after the answer, on a context of its own.
	markTimeout = 5 * time.Second
	// The queued marks of a BatchMarker: at most markBatch per round trip; past markQueue
	// waiting, a mark gets a goroutine of its own, as without a BatchMarker.
	markBatch = 256
	markQueue = 4096
)

// RecordCheckinHandler validates a check-in and records it as a CheckinRecorded event.
type RecordCheckinHandler struct {
	publisher   EventPublisher
	idem        IdempotencyStore
	now         func() time.Time
	newID       func() string
	log         *slog.Logger
	takeoverAge time.Duration
	flights     flightGroup[RecordCheckinResult]
	ownerPrefix string        // random per handler: owner tokens differ across processes
	ownerSeq    atomic.Uint64 // ... and across the attempts of one process
	marks       sync.WaitGroup
	limiter     UserLimiter // nil: RecordCheckin.LimitUser is refused
	// oneStep, when set, records a check-in in one step where it can; its limit must be
	// limiter's.
	oneStep ReservingPublisher

	// The mark writer of a BatchMarker store (markQ nil: none), started with the first mark;
	// markMu guards markQ's sends against Close closing it.
	batch     BatchMarker
	markMu    sync.RWMutex
	markQ     chan queuedMark
	markOnce  sync.Once
	markShut  bool
	markAlive sync.WaitGroup
}

type queuedMark struct {
	ctx context.Context // the request's, for the values its logs carry
	rec IdempotencyRecord
}

// NewRecordCheckinHandler fails fast on missing dependencies.
func NewRecordCheckinHandler(p EventPublisher, idem IdempotencyStore, now func() time.Time, newID func() string, log *slog.Logger) (*RecordCheckinHandler, error) {
	if p == nil || idem == nil || now == nil || newID == nil || log == nil {
		return nil, errors.New("command: RecordCheckinHandler needs a publisher, an idempotency store, a clock, an ID source and a logger")
	}
	var b [9]byte
	if _, err := rand.Read(b[:]); err != nil {
		return nil, fmt.Errorf("command: owner token: %w", err)
	}
	h := &RecordCheckinHandler{publisher: p, idem: idem, now: now, newID: newID, log: log,
		takeoverAge: DefaultTakeoverAge, ownerPrefix: base64.RawURLEncoding.EncodeToString(b[:])}
	if bm, ok := idem.(BatchMarker); ok {
		h.batch, h.markQ = bm, make(chan queuedMark, markQueue)
	}
	return h, nil
}

// WithTakeoverAge sets how old another attempt's unpublished reservation must be before this
// handler takes it over (DefaultTakeoverAge unless set; d <= 0 keeps it).
func (h *RecordCheckinHandler) WithTakeoverAge(d time.Duration) *RecordCheckinHandler {
	if d > 0 {
		h.takeoverAge = d
	}
	return h
}

// WithUserLimit counts RecordCheckin.LimitUser's requests with l; a ReservingLimiter counts and
// reserves in one step.
func (h *RecordCheckinHandler) WithUserLimit(l UserLimiter) *RecordCheckinHandler {
	h.limiter = l
	return h
}

// WithReservingPublisher records check-ins through p where it can: counting, reserving and
// publishing in one step (one round trip instead of two in a row, and no mark after the
// answer). p must count against the same limit as the UserLimiter (WithUserLimit), if any.
func (h *RecordCheckinHandler) WithReservingPublisher(p ReservingPublisher) *RecordCheckinHandler {
	h.oneStep = p
	return h
}

// Handle answers only after the event is stored: an acknowledged check-in is never lost. The
// same checkinId with the same body is safe to retry, also concurrently: one request publishes,
// the others wait for it and answer as retries. With a different body it is a conflict.
func (h *RecordCheckinHandler) Handle(ctx context.Context, cmd RecordCheckin) (RecordCheckinResult, error) {
	if cmd.LimitUser != 0 && h.limiter == nil {
		return RecordCheckinResult{}, errors.New("command: RecordCheckin.LimitUser set without a user limiter (WithUserLimit)")
	}
	now := h.now()
	c, err := domain.NewCheckin(cmd.Input, now, h.newID)
	if err != nil {
		return h.CountRejected(ctx, cmd.LimitUser, err)
	}
	rec := IdempotencyRecord{Fingerprint: cmd.Input.Fingerprint(), Checkin: c, RecordedAt: now.UnixMilli()}
	if cmd.Input.CheckinID == nil {
		return h.record(ctx, rec, cmd.CorrelationID, cmd.LimitUser) // a generated checkinId is nobody else's
	}
	// Requests of this process for the same check-in share the first one's outcome, so only
	// that one talks to Redis. A different body has another key: it meets the reservation in
	// Redis and is refused at once.
	res, leader, err := h.flights.do(ctx, c.ID+"\x00"+rec.Fingerprint, func() (RecordCheckinResult, error) {
		return h.record(ctx, rec, cmd.CorrelationID, cmd.LimitUser)
	})
	var limited *RateLimitedError
	if !leader && errors.As(err, &limited) {
		// The first request was refused by its limit, which says nothing of the check-in: this
		// one is counted and recorded on its own (it meets the first one's reservation, if any,
		// as a retry would), rather than charged and answered with another request's refusal.
		return h.record(ctx, rec, cmd.CorrelationID, cmd.LimitUser)
	}
	if !leader && cmd.LimitUser != 0 {
		// A request that shared another's outcome counts against its limit all the same.
		rate, lerr := h.count(ctx, cmd.LimitUser)
		if lerr != nil {
			return RecordCheckinResult{Rate: rate}, lerr
		}
		res.Rate = rate
	}
	if err != nil {
		if !leader && ctx.Err() != nil {
			return RecordCheckinResult{Rate: res.Rate}, fmt.Errorf("wait for checkinId %q: %w: %w", c.ID, domain.ErrUnavailable, err)
		}
		return RecordCheckinResult{Rate: res.Rate}, err
	}
	res.Replayed = res.Replayed || !leader
	return res, nil
}

// CountRejected counts a request refused before it could be recorded (an unreadable or
// invalid body) against user's rate limit, as every request is counted (0: none): its answer is
// the limit's refusal when it is over, cause otherwise.
func (h *RecordCheckinHandler) CountRejected(ctx context.Context, user int64, cause error) (RecordCheckinResult, error) {
	if user == 0 || h.limiter == nil {
		return RecordCheckinResult{}, cause
	}
	rate, err := h.count(ctx, user)
	var limited *RateLimitedError
	if errors.As(err, &limited) {
		return RecordCheckinResult{Rate: rate}, err
	}
	// A limiter that could not count (Redis unavailable, or the request's deadline gone while
	// the body trickled in) does not hide why the request is refused.
	return RecordCheckinResult{Rate: rate}, cause
}

// count counts one request of user; over the limit it fails with *RateLimitedError.
func (h *RecordCheckinHandler) count(ctx context.Context, user int64) (*RateDecision, error) {
	d, err := h.limiter.Allow(ctx, user)
	if err != nil {
		return nil, fmt.Errorf("rate limit of user %d: %w: %w", user, domain.ErrUnavailable, err)
	}
	if !d.Allowed {
		return &d, &RateLimitedError{Decision: d}
	}
	return &d, nil
}

// reserve is the first reservation of a request, counted against user's limit first (0: none),
// in the same round trip where the limiter can.
func (h *RecordCheckinHandler) reserve(ctx context.Context, rec IdempotencyRecord, user int64) (*RateDecision, *IdempotencyRecord, error) {
	if user == 0 {
		existing, err := h.idem.Reserve(ctx, rec)
		return nil, existing, err
	}
	if rl, ok := h.limiter.(ReservingLimiter); ok && user == rec.Checkin.UserID {
		d, existing, err := rl.AllowAndReserve(ctx, rec)
		switch {
		case err != nil:
			return nil, nil, err
		case !d.Allowed:
			return &d, nil, &RateLimitedError{Decision: d}
		}
		return &d, existing, nil
	}
	rate, err := h.count(ctx, user)
	if err != nil {
		return rate, nil, err
	}
	existing, err := h.idem.Reserve(ctx, rec)
	return rate, existing, err
}

// record reserves the checkinId (counting the request against limitUser's rate limit, 0:
// none) and publishes; if another attempt holds the reservation, it waits for that one's
// outcome, or takes over a reservation old enough to be abandoned.
func (h *RecordCheckinHandler) record(ctx context.Context, rec IdempotencyRecord, correlationID string, limitUser int64) (RecordCheckinResult, error) {
	rec.Owner, rec.ReservedAt = h.newOwner(), rec.RecordedAt
	if h.oneStep != nil && (limitUser == 0 || limitUser == rec.Checkin.UserID) {
		if res, ok, err := h.recordInOneStep(ctx, rec, correlationID, limitUser); ok {
			return res, err
		}
	}
	rate, existing, err := h.reserve(ctx, rec, limitUser)
	var limited *RateLimitedError
	if errors.As(err, &limited) || (err != nil && errors.Is(err, domain.ErrUnavailable)) {
		return RecordCheckinResult{Rate: rate}, err
	}
	res, err := h.settle(ctx, rec, correlationID, existing, err)
	res.Rate = rate
	return res, err
}

// recordInOneStep is record through the ReservingPublisher; ok false: it declined, nothing
// was done.
func (h *RecordCheckinHandler) recordInOneStep(ctx context.Context, rec IdempotencyRecord, correlationID string, limitUser int64) (RecordCheckinResult, bool, error) {
	d, existing, ok, err := h.oneStep.ReserveAndPublish(ctx, rec, correlationID, limitUser != 0)
	if !ok {
		return RecordCheckinResult{}, false, nil
	}
	var rate *RateDecision
	if limitUser != 0 && d.Remaining >= 0 { // Remaining -1: the script's answer is unknown
		rate = &d
	}
	switch {
	case err != nil:
		return RecordCheckinResult{Rate: rate}, true, fmt.Errorf("record checkinId %q: %w: %w", rec.Checkin.ID, domain.ErrUnavailable, err)
	case !d.Allowed:
		return RecordCheckinResult{Rate: rate}, true, &RateLimitedError{Decision: d}
	case existing == nil:
		return RecordCheckinResult{Checkin: rec.Checkin, Rate: rate}, true, nil
	}
	res, err := h.settle(ctx, rec, correlationID, existing, nil)
	res.Rate = rate
	return res, true, err
}

// settle takes the first reservation's outcome (existing, err) to its end: publish, a retry's
// answer, a conflict, or waiting for another attempt's outcome.
func (h *RecordCheckinHandler) settle(ctx context.Context, rec IdempotencyRecord, correlationID string, existing *IdempotencyRecord, err error) (RecordCheckinResult, error) {
	id := rec.Checkin.ID
	for delay := pollMin; ; delay = min(2*delay, pollMax) {
		if err != nil {
			return RecordCheckinResult{}, fmt.Errorf("reserve checkinId %q: %w: %w", id, domain.ErrUnavailable, err)
		}
		if existing == nil {
			return h.publish(ctx, rec, correlationID, false)
		}
		if existing.Fingerprint != rec.Fingerprint {
			return RecordCheckinResult{}, fmt.Errorf("checkinId %q: %w", id, domain.ErrConflict)
		}
		if existing.Published {
			return RecordCheckinResult{Checkin: existing.Checkin, Replayed: true}, nil
		}
		if existing.Owner == rec.Owner {
			// This attempt's own reservation: its command ran twice and the second run found
			// what the first wrote (a client that sends a command again when its reply was late;
			// the auto-pipeline's does not, adapters.sendOnce). Owners are unique per attempt,
			// so nobody else publishes it. What is stored is what it publishes: after a takeover
			// run twice, the original check-in (rec is this retry's, with its own recording
			// time, and would be another identity than an original that landed after all).
			tookOver := existing.Checkin != rec.Checkin || existing.RecordedAt != rec.RecordedAt
			return h.publish(ctx, *existing, correlationID, tookOver)
		}
		// Another attempt holds the reservation. Reservation times come from the clocks of
		// several processes: the takeover age must stay well above their skew.
		now := h.now()
		if now.Sub(time.UnixMilli(existing.ReservedAt)) >= h.takeoverAge {
			next := *existing
			next.Owner, next.ReservedAt = rec.Owner, now.UnixMilli()
			taken, current, terr := h.idem.TakeOver(ctx, *existing, next)
			switch {
			case terr != nil:
				return RecordCheckinResult{}, fmt.Errorf("take over checkinId %q: %w: %w", id, domain.ErrUnavailable, terr)
			case taken:
				// Its owner presumably died before publishing: publish the original. Should it
				// have published after all, projections dedupe by checkinId.
				h.log.InfoContext(ctx, "took over an abandoned reservation", "checkin_id", id,
					"owner", existing.Owner, "reserved_at", existing.ReservedAt)
				return h.publish(ctx, next, correlationID, true)
			case current == nil: // released or expired meanwhile: reserve it at once
				rec.ReservedAt = now.UnixMilli()
				existing, err = h.idem.Reserve(ctx, rec)
				continue
			case current.Owner != existing.Owner: // another taker won, or the owner published
				existing = current
				continue
			}
			// The same owner, yet not taken: a record the store does not read as this owner's
			// reservation. Wait as for a live owner rather than spin on it.
		}
		if err := sleep(ctx, delay); err != nil {
			return RecordCheckinResult{}, fmt.Errorf("wait for checkinId %q: %w: %w", id, domain.ErrUnavailable, err)
		}
		// Polling by reserving: one command, and a released checkinId becomes ours at once.
		rec.ReservedAt = h.now().UnixMilli()
		existing, err = h.idem.Reserve(ctx, rec)
	}
}

// publish stores the event of the reservation rec, which this attempt holds (tookOver: from
// another attempt, whose answer is a retry's).
func (h *RecordCheckinHandler) publish(ctx context.Context, rec IdempotencyRecord, correlationID string, tookOver bool) (RecordCheckinResult, error) {
	ev := domain.CheckinRecorded{Checkin: rec.Checkin, RecordedAt: rec.RecordedAt, Fingerprint: rec.Fingerprint}
	var err error
	if fp, ok := h.publisher.(FencedPublisher); ok && rec.ReservedAt > 0 {
		// The XADD runs only while nobody may take this reservation over yet; a taker's
		// reservation has a later ReservedAt, so its own XADD has a later deadline.
		err = fp.PublishCheckinRecordedWithin(ctx, ev, correlationID, h.fence(rec).Sub(h.now()))
	} else {
		err = h.publisher.PublishCheckinRecorded(ctx, ev, correlationID)
	}
	if err != nil {
		if errors.Is(err, ErrNotPublished) && !tookOver {
			// Nothing is on the stream: free the checkinId, so waiting requests need not wait
			// out the takeover age. When the event may be stored, the reservation must stay:
			// released, the checkinId could be taken by a different check-in. After a takeover
			// it may be: the attempt that reserved it first may have published before it died.
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), releaseTimeout)
			if rerr := h.idem.Release(rctx, rec); rerr != nil {
				h.log.WarnContext(ctx, "could not release reservation", "checkin_id", rec.Checkin.ID, "error", rerr)
			}
			cancel()
		}
		return RecordCheckinResult{}, fmt.Errorf("publish %s %q: %w: %w", domain.EventCheckinRecorded, rec.Checkin.ID, domain.ErrUnavailable, err)
	}
	// The event is stored, which is what the answer promises: the request does not wait for the
	// reservation to be marked published (one Redis round trip less per check-in). Until the
	// mark lands, a retry finds the reservation held and waits for it, as it would for a request
	// still publishing. Should the mark fail (or the process die first), a retry takes the
	// reservation over after the takeover age and publishes a duplicate that projections count
	// once: the same as a mark failing before the answer.
	if h.queueMark(ctx, rec) {
		return RecordCheckinResult{Checkin: rec.Checkin, Replayed: tookOver}, nil
	}
	h.marks.Add(1)
	go func() {
		defer h.marks.Done()
		mctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), markTimeout)
		defer cancel()
		if err := h.idem.MarkPublished(mctx, rec); err != nil {
			h.log.WarnContext(ctx, "could not mark check-in as published", "checkin_id", rec.Checkin.ID, "error", err)
		}
	}()
	return RecordCheckinResult{Checkin: rec.Checkin, Replayed: tookOver}, nil
}

// queueMark hands rec's mark to the mark writer; false when there is none (no BatchMarker, or
// closed) or its queue is full.
func (h *RecordCheckinHandler) queueMark(ctx context.Context, rec IdempotencyRecord) bool {
	if h.markQ == nil {
		return false
	}
	h.markOnce.Do(func() {
		h.markAlive.Add(1)
		go h.writeMarks()
	})
	h.markMu.RLock()
	defer h.markMu.RUnlock()
	if h.markShut {
		return false
	}
	select {
	case h.markQ <- queuedMark{ctx: ctx, rec: rec}:
		return true
	default:
		return false
	}
}

// writeMarks writes the queued marks, those waiting together, until Close.
func (h *RecordCheckinHandler) writeMarks() {
	defer h.markAlive.Done()
	batch := make([]queuedMark, 0, markBatch)
	recs := make([]IdempotencyRecord, 0, markBatch)
	for m := range h.markQ {
		batch, recs = append(batch[:0], m), append(recs[:0], m.rec)
	fill:
		for len(batch) < markBatch {
			select {
			case m, ok := <-h.markQ:
				if !ok {
					break fill
				}
				batch, recs = append(batch, m), append(recs, m.rec)
			default:
				break fill
			}
		}
		ctx, cancel := context.WithTimeout(context.Background(), markTimeout)
		errs := h.batch.MarkPublishedAll(ctx, recs)
		cancel()
		for i, err := range errs {
			if err != nil {
				h.log.WarnContext(batch[i].ctx, "could not mark check-in as published", "checkin_id", batch[i].rec.Checkin.ID, "error", err)
			}
		}
		clear(batch) // no request contexts kept alive until the next batch
	}
}

// Close waits for the published marks still being written (call it before closing the
// idempotency store's connection).
func (h *RecordCheckinHandler) Close() error {
	if h.markQ != nil {
		h.markMu.Lock()
		if !h.markShut {
			h.markShut = true
			close(h.markQ)
		}
		h.markMu.Unlock()
		h.markOnce.Do(func() {}) // never started: nothing queued
		h.markAlive.Wait()
	}
	h.marks.Wait()
	return nil
}

// fence is the deadline of rec's XADD: the takeover age after the reservation, less
// fenceMargin, by the clock that set ReservedAt (this process's: a reservation this attempt holds
// is one it took).
func (h *RecordCheckinHandler) fence(rec IdempotencyRecord) time.Time {
	return time.UnixMilli(rec.ReservedAt).Add(h.takeoverAge - min(fenceMargin, h.takeoverAge/4))
}

func (h *RecordCheckinHandler) newOwner() string {
	return h.ownerPrefix + "." + strconv.FormatUint(h.ownerSeq.Add(1), 36)
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
