package command

import (
	"context"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
)

// Rate limits on recording check-ins: the policy and a limiter's answer. The HTTP port limits
// per client address in process; the per-user limit is counted by RecordCheckinHandler
// (RecordCheckin.LimitUser), in the same round trip as the reservation where the limiter can.

// RateLimit is a GCRA policy: Rate requests per Period on average, Burst at once.
type RateLimit struct {
	Rate   int
	Period time.Duration
	Burst  int
}

// Off reports the zero policy: no limit.
func (l RateLimit) Off() bool { return l.Rate == 0 }

// Window is how long a full burst takes to come back: the "w" of the RateLimit-Policy header.
func (l RateLimit) Window() time.Duration {
	return time.Duration(int64(l.Period) * int64(l.Burst) / int64(l.Rate))
}

// String writes the policy the way ParseRateLimit reads it.
func (l RateLimit) String() string {
	if l.Off() {
		return "off"
	}
	unit := map[time.Duration]string{time.Second: "s", time.Minute: "m", time.Hour: "h"}[l.Period]
	return fmt.Sprintf("%d/%s,burst=%d", l.Rate, unit, l.Burst)
}

// ParseRateLimit reads "off" or "<n>/<s|m|h>[,burst=<b>]" (burst defaults to n).
func ParseRateLimit(v string) (RateLimit, error) {
	v = strings.TrimSpace(v)
	if v == "off" {
		return RateLimit{}, nil
	}
	bad := fmt.Errorf("must be off or like 10/s,burst=20 (a rate per s, m or h, and an optional burst), got %q", v)
	spec, burst, hasBurst := strings.Cut(v, ",")
	n, unit, ok := strings.Cut(strings.TrimSpace(spec), "/")
	if !ok {
		return RateLimit{}, bad
	}
	rate, err := strconv.Atoi(n)
	if err != nil || rate < 1 {
		return RateLimit{}, bad
	}
	period, ok := map[string]time.Duration{"s": time.Second, "m": time.Minute, "h": time.Hour}[unit]
	if !ok {
		return RateLimit{}, bad
	}
	l := RateLimit{Rate: rate, Period: period, Burst: rate}
	if hasBurst {
		k, b, ok := strings.Cut(strings.TrimSpace(burst), "=")
		if !ok || k != "burst" {
			return RateLimit{}, bad
		}
		if l.Burst, err = strconv.Atoi(b); err != nil || l.Burst < 1 {
			return RateLimit{}, bad
		}
	}
	// The limiters count in nanoseconds: one request's share of the period, and a burst's.
	// Beyond them the share was 0 (no limit) or the burst's window overflowed negative (every
	// request refused; found by a review).
	iv := period / time.Duration(rate)
	if iv == 0 {
		return RateLimit{}, fmt.Errorf("must be at most 1000000000/s, got %q", v)
	}
	if int64(l.Burst) > math.MaxInt64/int64(iv) {
		return RateLimit{}, fmt.Errorf("burst must be at most %d at %d/%s (its window, burst x period/rate, must fit), got %q", math.MaxInt64/int64(iv), rate, unit, v)
	}
	return l, nil
}

// RateDecision is the limiter's answer for one request.
type RateDecision struct {
	Allowed    bool
	Remaining  int           // requests that could be made at once now
	RetryAfter time.Duration // when refused: until the next one is allowed
	ResetAfter time.Duration // until the full burst is back
}

// UserLimiter counts a request against its user's rate limit (adapters.RedisRateLimiter).
type UserLimiter interface {
	Allow(ctx context.Context, user int64) (RateDecision, error)
}

// ReservingLimiter is a UserLimiter that, when it allows a request, also reserves the check-in
// in the same step (one round trip instead of two in a row), answering as
// IdempotencyStore.Reserve does; a refused request reserves nothing.
type ReservingLimiter interface {
	UserLimiter
	AllowAndReserve(ctx context.Context, rec IdempotencyRecord) (RateDecision, *IdempotencyRecord, error)
}

// ReservingPublisher records a check-in in one step: it counts the request against its user's
// limit (when limit), reserves the checkinId and, only when both let it, publishes the event and
// records the reservation as published, all or nothing. ok false: it cannot here and now (the
// handler takes the other path: limit and reserve, then publish). With ok: a refused request
// (!d.Allowed) wrote nothing; existing is what holds the checkinId (nothing was published); an
// error leaves open whether the check-in was recorded, reservation and event together. d is the
// limiter's answer when limit and Redis answered; otherwise its Remaining is -1 (no decision).
type ReservingPublisher interface {
	ReserveAndPublish(ctx context.Context, rec IdempotencyRecord, correlationID string, limit bool) (d RateDecision, existing *IdempotencyRecord, ok bool, err error)
}

// RateLimitedError is the answer to a request over its user's limit: nothing was reserved or
// written.
type RateLimitedError struct{ Decision RateDecision }

func (e *RateLimitedError) Error() string {
	return fmt.Sprintf("rate limited: retry in %s", e.Decision.RetryAfter.Round(time.Millisecond))
}
