package ports

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/checkins/checkins/app/ops"
	"github.com/checkins/checkins/app/projection"
	"github.com/checkins/checkins/domain"
)

// RetryPolicy is exponential backoff with jitter between handler attempts.
type RetryPolicy struct {
	InitialInterval time.Duration
	Multiplier      float64
	MaxInterval     time.Duration
	MaxAttempts     int // including the first
}

// DefaultRetryPolicy: 100ms, 200ms, 400ms, 800ms (each jittered) between 5 attempts.
func DefaultRetryPolicy() RetryPolicy {
	return RetryPolicy{InitialInterval: 100 * time.Millisecond, Multiplier: 2, MaxInterval: 5 * time.Second, MaxAttempts: 5}
}

// Validate names the first bad setting.
func (p RetryPolicy) Validate() error {
	switch {
	case p.InitialInterval <= 0:
		return fmt.Errorf("retry initial interval must be > 0, got %s", p.InitialInterval)
	case math.IsNaN(p.Multiplier) || math.IsInf(p.Multiplier, 0) || p.Multiplier < 1:
		return fmt.Errorf("retry multiplier must be a finite number >= 1, got %g", p.Multiplier)
	case p.MaxInterval < p.InitialInterval:
		return fmt.Errorf("retry max interval %s must be >= the initial interval %s", p.MaxInterval, p.InitialInterval)
	case p.MaxAttempts < 1:
		return fmt.Errorf("retry max attempts must be >= 1, got %d", p.MaxAttempts)
	}
	return nil
}

// ErrPermanent marks failures that no retry can fix (an undecodable or invalid event).
var ErrPermanent = errors.New("permanent failure")

// ErrHandlerTimeout is returned when a handler attempt ran past its timeout.
var ErrHandlerTimeout = errors.New("handler timed out")

func permanent(err error) error { return fmt.Errorf("%w: %w", ErrPermanent, err) }

// IsTransient reports infrastructure failures (Redis down, restarting, out of memory, busy)
// that say nothing about the event: those are retried for as long as they last and never parked
// in the poison queue. The classification itself is the backend's (adapters.TransientReason).
func IsTransient(f ops.Failures, err error) bool {
	if err == nil || errors.Is(err, ErrPermanent) || errors.Is(err, ErrHandlerTimeout) {
		return false
	}
	_, ok := f.TransientReason(err)
	return ok
}

func (r *ProjectionRouter) isTransient(err error) bool { return IsTransient(r.backend, err) }

// retryMiddleware retries the failed units of a batch with exponential backoff and jitter, and
// a whole batch whose handling failed (Redis). Permanent failures are not retried, and their
// entries are held back (not applied) until the poison middleware has parked them. It never
// spins: every retry waits, and waiting stops when the message's context ends (shutdown).
func retryMiddleware(p RetryPolicy) message.HandlerMiddleware {
	return func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			base := planOf(msg.Context())
			units := base.units
			hold := map[int]bool{}
			for e := range base.hold {
				hold[e] = true
			}
			attempts := map[unit]int{}
			var final []unitFailure // permanent failures, kept for the poison middleware
			delay := p.InitialInterval
			for attempt := 1; ; attempt++ {
				plan := &attemptPlan{units: units, hold: hold, progress: &attemptProgress{}}
				out, err := h(withPlan(msg, plan))
				if err == nil {
					if len(final) > 0 {
						return nil, &BatchFailure{Failed: final}
					}
					return out, nil
				}
				if errors.Is(err, projection.ErrLeaseExpired) {
					// Another consumer may hold the entries now: retrying here would be refused
					// again. The subscriber finds out whose they are, and lets them go or renews
					// them.
					return nil, err
				}
				if errors.Is(err, errNotJoinedThere) {
					// Entries of a partition whose join is lost: the batch goes back as it is (its
					// done entries acknowledged), and comes again whole. A retry of the units this
					// attempt found would leave those entries out, and, once the router has joined
					// the partition again, acknowledge them unapplied.
					return nil, err
				}
				bf, partial := asBatchFailure(err)
				if !partial && errors.Is(err, ErrHandlerTimeout) && !plan.progress.flushing.Load() {
					// A handler ran past the deadline: that unit failed, the others of the
					// attempt go again. (A timeout while applying is Redis being slow: the
					// whole batch goes again, and is never parked for it.)
					if cur, ok := plan.progress.current.Load().(unit); ok {
						bf, partial = timedOut(cur, plan.progress.all(), err), true
					}
				}
				if !partial {
					if attempt >= p.MaxAttempts {
						return nil, err
					}
					if units == nil {
						units = plan.progress.all()
					}
				} else {
					var retry []unitFailure
					for _, f := range bf.Failed {
						attempts[f.unit]++
						f.attempts = attempts[f.unit]
						if errors.Is(f.err, ErrPermanent) {
							final = append(final, f)
							hold[f.unit.entry] = true
						} else {
							retry = append(retry, f)
						}
					}
					if len(retry) == 0 || attempt >= p.MaxAttempts {
						// A unit that has not spent its attempts (it began failing after the
						// others, held back with their entries until then) is held, not failed:
						// the poison middleware parks the failed ones and runs it again.
						failed, held := final, bf.Held
						for _, f := range retry {
							if f.attempts >= p.MaxAttempts {
								failed = append(failed, f)
							} else {
								held = append(held, f.unit)
							}
						}
						return nil, &BatchFailure{Failed: failed, Held: held}
					}
					units = make([]unit, 0, len(retry)+len(bf.Held))
					for _, f := range retry {
						units = append(units, f.unit)
					}
					units = append(units, bf.Held...)
				}
				// Jitter in [delay/2, delay*3/2) keeps many consumers failing together from
				// retrying in lockstep.
				sleep := delay/2 + rand.N(delay) // #nosec G404 -- retry jitter, not a secret
				t := time.NewTimer(sleep)
				select {
				case <-t.C:
				case <-msg.Context().Done():
					t.Stop()
					return nil, fmt.Errorf("%w (gave up retrying: %w)", err, msg.Context().Err())
				}
				// In float first: a large multiplier overflowed the Duration to a negative wait,
				// and rand.N of it panicked outside the recoverer, so nothing was ever parked.
				delay = time.Duration(min(float64(delay)*p.Multiplier, float64(p.MaxInterval)))
			}
		}
	}
}

// timedOut is the failure of an attempt whose handler for cur ran past its deadline.
func timedOut(cur unit, all []unit, err error) *BatchFailure {
	bf := &BatchFailure{Failed: []unitFailure{{unit: cur, err: err}}}
	for _, u := range all {
		if u != cur {
			bf.Held = append(bf.Held, u)
		}
	}
	return bf
}

// timeoutMiddleware bounds one attempt. The attempt runs on a copy of the message carrying the
// deadline, so the message itself never holds a cancelled context (the next attempt and the
// poison publish would otherwise fail on it). A handler that ignores its context is abandoned
// at the deadline rather than allowed to hold the batch, and with it the consumer, forever; an
// abandoned attempt applies nothing (the batch handler checks its context before applying), and
// whatever it might still write goes through the markers, so it cannot double count.
func timeoutMiddleware(d time.Duration) message.HandlerMiddleware {
	return func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			if d <= 0 {
				return h(msg)
			}
			orig := msg.Context()
			ctx, cancel := context.WithTimeout(orig, d)
			defer cancel()
			attempt := msg.Copy()
			attempt.SetContext(ctx)
			type result struct {
				out []*message.Message
				err error
			}
			done := make(chan result, 1)
			go func() {
				out, err := h(attempt)
				done <- result{out, err}
			}()
			select {
			case r := <-done:
				if r.err != nil && errors.Is(ctx.Err(), context.DeadlineExceeded) && orig.Err() == nil && !errors.Is(r.err, ErrHandlerTimeout) {
					return r.out, fmt.Errorf("%w after %s: %w", ErrHandlerTimeout, d, r.err)
				}
				return r.out, r.err
			case <-ctx.Done():
				if orig.Err() != nil {
					return nil, fmt.Errorf("handler abandoned: %w", orig.Err())
				}
				return nil, fmt.Errorf("%w after %s (the handler ignored its context and was abandoned)", ErrHandlerTimeout, d)
			}
		}
	}
}

// maxPoisonErrorLen caps the error text stored with a parked event (a recovered panic carries
// its whole stack trace).
const maxPoisonErrorLen = 4000

// poisonMiddleware parks the units of a batch that failed for good, then applies what their
// entries still owe the other projections, then acks, so nothing behind them stalls. Transient
// failures (Redis down, out of memory, busy) are never parked: the batch is nacked and
// redelivered after the subscriber's nack delay, logged once per interval. A failure to park is
// a nack too: nothing of such an entry was applied, it stays pending and comes back, never lost.
func (r *ProjectionRouter) poisonMiddleware(group string) message.HandlerMiddleware {
	transient := &throttledLog{interval: 10 * time.Second}
	parkFailed := &throttledLog{interval: 10 * time.Second}
	leaseLost := &throttledLog{interval: 10 * time.Second}
	return func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			b, err := batchOf(msg)
			if err != nil {
				return nil, err
			}
			plan := planOf(msg.Context())
			for round := 0; ; round++ {
				_, err := h(withPlan(msg, plan))
				if err == nil {
					r.transientCleared(group)
					r.forgetParked(group, b) // acknowledged now: never delivered here again
					return nil, nil
				}
				if msg.Context().Err() != nil {
					return nil, err // shutting down: leave it pending for whoever runs next
				}
				if errors.Is(err, projection.ErrLeaseExpired) {
					// Counted, not a readiness problem: the subscriber sorts it out at once.
					r.cfg.Observer.Transient(group, ReasonLeaseExpired)
					if ok, n := leaseLost.allow(); ok {
						r.log.Warn("this projector's hold on a batch ran out (it stood still, or could not reach Redis, longer than CLAIM_IDLE): nothing of it is written here until its subscriber has found whose its events are now",
							"group", group, "error", err, "suppressed", n)
					}
					return nil, err
				}
				bf, partial := asBatchFailure(err)
				var stuck []unitFailure
				if partial {
					for _, f := range bf.Failed {
						if r.isTransient(f.err) {
							stuck = append(stuck, f)
						}
					}
				}
				if !partial || len(stuck) > 0 || round >= 3 {
					cause := err
					if len(stuck) > 0 {
						cause = stuck[0].err
					}
					r.transientFailure(group, cause)
					if ok, n := transient.allow(); ok {
						r.log.Warn("projections cannot apply a batch now, will retry", "group", group,
							"reason", r.transientReasonText(cause), "error", cause, "suppressed", n)
					}
					return nil, err
				}
				if err := r.park(msg.Context(), b, group, bf.Failed, parkFailed); err != nil {
					return nil, err
				}
				// Resolve entries with nothing left to apply now, so that a later nack of the
				// batch does not park them again.
				left := map[int]bool{}
				for _, u := range bf.Held {
					left[u.entry] = true
				}
				for _, f := range bf.Failed {
					if !left[f.unit.entry] {
						b.resolve(f.unit.entry)
					}
				}
				if len(bf.Held) == 0 {
					r.forgetParked(group, b)
					return nil, nil
				}
				plan = &attemptPlan{units: bf.Held}
			}
		}
	}
}

// park puts each failed unit in the poison queue with its reason and the entry's exact fields.
func (r *ProjectionRouter) park(ctx context.Context, b *batch, group string, failed []unitFailure, parkFailed *throttledLog) error {
	// The message context may be cancelled by a timeout; parking must not depend on it.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	counts := map[string]int{}
	for _, f := range failed {
		name, version, _ := ops.ParseMemberName(f.unit.member)
		m := b.msgs[f.unit.entry]
		errText := f.err.Error()
		if len(errText) > maxPoisonErrorLen {
			errText = errText[:maxPoisonErrorLen] + "...(truncated)"
		}
		entry, correlationID := r.backend.PoisonEntryOf(ctx, m)
		entry.Projection, entry.Version, entry.Group = name, version, group
		entry.Error, entry.Attempts, entry.FailedAt = errText, max(f.attempts, 1), time.Now()
		parkCtx := ctx
		if until, ok := r.backend.LeaseOf([]*message.Message{m}); ok {
			parkCtx = projection.WithLease(ctx, until) // decided and parked by whoever holds the entry
		}
		var err error
		entry.Decision, err = r.decision(parkCtx, entry)
		if errors.Is(err, projection.ErrLeaseExpired) {
			return err // neither decided nor parked: the entry may be another projector's now
		}
		if err != nil {
			if ok, n := parkFailed.allow(); ok {
				r.log.Error("could not decide whether a failed event counts; it stays pending and is retried", "projection", name,
					"entry_id", entry.EntryID, "error", err, "handler_error", errText, "suppressed", n)
			}
			return err
		}
		id, err := r.backend.Park(parkCtx, entry)
		if errors.Is(err, projection.ErrLeaseExpired) {
			return err // not parked: the entry may be another projector's now
		}
		if err != nil {
			if b.events != nil {
				d := b.events[f.unit.entry]
				r.markUnsure(ops.UnitRef{Group: group, Stream: r.streamOf(d), Entry: d.ID})
			}
			if ok, n := parkFailed.allow(); ok {
				r.log.Error("could not park a failed event; it stays pending and is retried", "projection", name,
					"entry_id", entry.EntryID, "error", err, "handler_error", errText, "suppressed", n)
			}
			return err
		}
		counts[name]++
		if b.events != nil {
			d := b.events[f.unit.entry]
			r.markParked(ops.UnitRef{Group: group, Stream: r.streamOf(d), Entry: d.ID, Member: f.unit.member})
		}
		r.log.Error("event parked in poison queue", "projection", name, "group", group, "entry_id", entry.EntryID,
			"poison_id", id, "attempts", entry.Attempts, "error", errText,
			"correlation_id", correlationID)
	}
	for name, n := range counts {
		r.cfg.Observer.Handled(name, OutcomePoisoned, n, 0)
	}
	return nil
}

// decision is the dedupe decision for a check-in about to be parked, kept with it so that a
// replay decides as every other projection did, whatever the registry forgets meanwhile ("" for
// an entry that is not a check-in: it is never counted).
func (r *ProjectionRouter) decision(ctx context.Context, e ops.PoisonEntry) (string, error) {
	parsed, err := domain.ParseEvent(e.EntryID, e.Fields)
	if err != nil {
		return "", nil
	}
	ev, ok := parsed.(domain.CheckinRecorded)
	if !ok {
		return "", nil
	}
	counted, err := r.cfg.Applier.Decide(ctx, []projection.EventRef{projection.RefOf(ev, e.EntryID)})
	if err != nil {
		return "", err
	}
	if counted[0] {
		return ops.DecisionCounted, nil
	}
	return ops.DecisionDuplicate, nil
}

// transientReasonText is the short reason of a transient failure, for logs and readiness.
func (r *ProjectionRouter) transientReasonText(err error) string {
	if reason, ok := r.backend.TransientReason(err); ok {
		return reason
	}
	if errors.Is(err, ErrHandlerTimeout) {
		return "applying took longer than HANDLER_TIMEOUT (redis slow?)"
	}
	if errors.Is(err, ErrForeignMember) {
		return "the live group has a member this build does not run"
	}
	if errors.Is(err, errNotJoinedThere) {
		return "a projection version's join on a partition is lost (Redis failover?); the router joins it again"
	}
	return err.Error()
}
