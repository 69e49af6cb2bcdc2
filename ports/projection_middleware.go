package ports

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"
)

// RetryPolicy is exponential backoff with jitter between handler attempts.
type RetryPolicy struct {
	InitialInterval time.Duration
	Multiplier      float64
	MaxInterval     time.Duration
	MaxAttempts     int // including the first
}

// DefaultRetryPolicy: 100ms, 200ms, 400ms, 800ms between 5 attempts.
func DefaultRetryPolicy() RetryPolicy {
	return RetryPolicy{InitialInterval: 100 * time.Millisecond, Multiplier: 2, MaxInterval: 5 * time.Second, MaxAttempts: 5}
}

// Validate names the first bad setting.
func (p RetryPolicy) Validate() error {
	switch {
	case p.InitialInterval <= 0:
		return errors.New("retry initial interval must be > 0")
	case p.Multiplier < 1:
		return errors.New("retry multiplier must be >= 1")
	case p.MaxInterval < p.InitialInterval:
		return errors.New("retry max interval must be >= the initial interval")
	case p.MaxAttempts < 1:
		return errors.New("retry max attempts must be >= 1")
	}
	return nil
}

// ErrPermanent marks failures that no retry can fix (an undecodable or invalid event).
var ErrPermanent = errors.New("permanent failure")

// ErrHandlerTimeout is returned when a handler attempt ran past its timeout.
var ErrHandlerTimeout = errors.New("handler timed out")

func permanent(err error) error { return fmt.Errorf("%w: %w", ErrPermanent, err) }

// IsTransient reports infrastructure failures (Redis down or restarting) that say nothing about
// the event: those are retried forever with backoff and never parked in the poison queue.
func IsTransient(err error) bool {
	if err == nil || errors.Is(err, ErrPermanent) || errors.Is(err, ErrHandlerTimeout) {
		return false
	}
	var ne net.Error
	if errors.As(err, &ne) {
		return true
	}
	for _, target := range []error{io.EOF, io.ErrUnexpectedEOF, syscall.ECONNREFUSED, syscall.ECONNRESET, syscall.EPIPE, redis.ErrClosed, redis.ErrPoolTimeout} {
		if errors.Is(err, target) {
			return true
		}
	}
	msg := err.Error()
	for _, p := range []string{"LOADING", "READONLY", "MASTERDOWN", "TRYAGAIN", "CLUSTERDOWN", "connection refused", "broken pipe", "connection reset"} {
		if strings.Contains(msg, p) {
			return true
		}
	}
	return false
}

type attemptsKey struct{}

// attemptCounter travels in the message context from the poison middleware to the retry one.
type attemptCounter struct{ n int }

func attemptsOf(ctx context.Context) *attemptCounter {
	if c, ok := ctx.Value(attemptsKey{}).(*attemptCounter); ok {
		return c
	}
	return &attemptCounter{}
}

// retryMiddleware retries failed attempts with exponential backoff and jitter. Permanent failures
// are not retried. It never spins: every retry waits, and waiting stops when the message's
// context ends (shutdown).
func retryMiddleware(p RetryPolicy) message.HandlerMiddleware {
	return func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			counter := attemptsOf(msg.Context())
			delay := p.InitialInterval
			for attempt := 1; ; attempt++ {
				counter.n = attempt
				out, err := h(msg)
				if err == nil || attempt >= p.MaxAttempts || errors.Is(err, ErrPermanent) {
					return out, err
				}
				// Jitter in [delay/2, delay*3/2) keeps many consumers failing together from retrying in lockstep.
				sleep := delay/2 + rand.N(delay)
				t := time.NewTimer(sleep)
				select {
				case <-t.C:
				case <-msg.Context().Done():
					t.Stop()
					return nil, fmt.Errorf("%w (gave up retrying: %w)", err, msg.Context().Err())
				}
				delay = min(time.Duration(float64(delay)*p.Multiplier), p.MaxInterval)
			}
		}
	}
}

// timeoutMiddleware bounds one attempt and restores the message context afterwards, so the next
// attempt (and the poison middleware) never sees a cancelled context.
func timeoutMiddleware(d time.Duration) message.HandlerMiddleware {
	return func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			if d <= 0 {
				return h(msg)
			}
			orig := msg.Context()
			ctx, cancel := context.WithTimeout(orig, d)
			defer cancel()
			msg.SetContext(ctx)
			defer msg.SetContext(orig)
			out, err := h(msg)
			if err != nil && errors.Is(ctx.Err(), context.DeadlineExceeded) && orig.Err() == nil {
				return out, fmt.Errorf("%w after %s: %w", ErrHandlerTimeout, d, err)
			}
			return out, err
		}
	}
}

// throttledLog logs a repeating condition at most once per interval, with how often it happened.
type throttledLog struct {
	mu         sync.Mutex
	interval   time.Duration
	last       time.Time
	suppressed int
}

func (t *throttledLog) allow() (bool, int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if time.Since(t.last) < t.interval {
		t.suppressed++
		return false, 0
	}
	n := t.suppressed
	t.last, t.suppressed = time.Now(), 0
	return true, n
}
