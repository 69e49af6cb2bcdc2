package ports

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"math/rand/v2"
	"net"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-redisstream/pkg/redisstream"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"

	"github.com/checkins/checkins/adapters"
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
	case p.Multiplier < 1:
		return fmt.Errorf("retry multiplier must be >= 1, got %g", p.Multiplier)
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
	// A closed client or pipeline means the process is stopping: not the event's fault either.
	for _, target := range []error{io.EOF, io.ErrUnexpectedEOF, syscall.ECONNREFUSED, syscall.ECONNRESET, syscall.EPIPE,
		redis.ErrClosed, redis.ErrPoolTimeout, adapters.ErrPipelineClosed} {
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

// timeoutMiddleware bounds one attempt. The attempt runs on a copy of the message carrying the
// deadline, so the message itself never holds a cancelled context (the next attempt and the
// poison publish would otherwise fail on it). A handler that ignores its context is abandoned
// at the deadline rather than allowed to hold the message, and with it the consumer, forever;
// whatever it still writes goes through the store's dedupe, so it cannot double count.
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
				if r.err != nil && errors.Is(ctx.Err(), context.DeadlineExceeded) && orig.Err() == nil {
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

// maxPoisonErrorLen caps the error text stored with a parked event (a recovered panic carries
// its whole stack trace).
const maxPoisonErrorLen = 4000

// poisonMiddleware parks an event whose handling failed for good, then acks the original, so
// nothing behind it stalls. Transient failures (Redis down) are never parked: they are nacked
// and redelivered after the subscriber's nack delay, logged once per interval. A failure to
// park is a nack too: the event stays pending and comes back, it is never dropped.
func (r *ProjectionRouter) poisonMiddleware(name, group string) message.HandlerMiddleware {
	transient := &throttledLog{interval: 10 * time.Second}
	parkFailed := &throttledLog{interval: 10 * time.Second}
	return func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			counter := &attemptCounter{}
			msg.SetContext(context.WithValue(msg.Context(), attemptsKey{}, counter))
			out, err := h(msg)
			if err == nil {
				return out, nil
			}
			if msg.Context().Err() != nil {
				return nil, err // shutting down: leave it pending for whoever runs next
			}
			if IsTransient(err) {
				if ok, n := transient.allow(); ok {
					r.log.Warn("projection cannot reach Redis, will retry", "projection", name, "group", group,
						"error", err, "suppressed", n)
				}
				return nil, err
			}
			errText := err.Error()
			if len(errText) > maxPoisonErrorLen {
				errText = errText[:maxPoisonErrorLen] + "...(truncated)"
			}
			// The message context may be cancelled by a timeout; parking must not depend on it.
			ctx, cancel := context.WithTimeout(context.WithoutCancel(msg.Context()), 5*time.Second)
			defer cancel()
			entry := adapters.PoisonEntry{
				Stream: msg.Metadata.Get(adapters.MetaStream), EntryID: msg.Metadata.Get(adapters.MetaEntryID),
				Projection: name, Group: group, Error: errText, Attempts: max(counter.n, 1), FailedAt: time.Now(),
			}
			if entry.Stream == "" {
				entry.Stream = r.cfg.Keys.Stream()
			}
			entry.EntryID, entry.Fields = r.originalEntry(ctx, msg, entry.Stream, entry.EntryID, group)
			id, perr := r.poison.Park(ctx, entry)
			if perr != nil {
				if ok, n := parkFailed.allow(); ok {
					r.log.Error("could not park failed event, it stays pending and is retried", "projection", name,
						"entry_id", entry.EntryID, "error", perr, "handler_error", errText, "suppressed", n)
				}
				return nil, perr
			}
			r.cfg.Observer.Handled(name, OutcomePoisoned, 0)
			r.log.Error("event parked in poison queue", "projection", name, "group", group, "entry_id", entry.EntryID,
				"poison_id", id, "attempts", entry.Attempts, "error", errText,
				"correlation_id", msg.Metadata.Get(adapters.MetaCorrelationID))
			return nil, nil
		}
	}
}

// originalEntry returns the entry ID and the exact fields of the stream entry behind msg, read
// back from the stream (which is never trimmed), so the poison entry keeps the event unchanged.
// The batched subscriber tells the entry ID; the stock one does not, so the group's pending
// entries are searched for the one that decodes to this message. When nothing is found (Redis
// failing), the fields are rebuilt from the message.
func (r *ProjectionRouter) originalEntry(ctx context.Context, msg *message.Message, stream, entryID, group string) (string, map[string]string) {
	if entryID != "" {
		if fields, err := adapters.EntryFields(ctx, r.cfg.Redis, stream, entryID); err == nil {
			return entryID, fields
		}
		return entryID, messageFields(msg)
	}
	id, fields, err := adapters.FindPendingEntry(ctx, r.cfg.Redis, stream, group, 200, func(values map[string]any) bool {
		return sameMessage(msg, values)
	})
	if err != nil || id == "" {
		return "", messageFields(msg)
	}
	return id, fields
}

// sameMessage reports whether a stream entry decodes to msg.
func sameMessage(msg *message.Message, values map[string]any) bool {
	if u, ok := values[redisstream.UUIDHeaderKey].(string); ok && u != msg.UUID {
		return false
	}
	m, err := adapters.FlatMarshaller{}.Unmarshal(values)
	if err != nil || !bytes.Equal(m.Payload, msg.Payload) {
		return false
	}
	for k, v := range m.Metadata {
		if msg.Metadata.Get(k) != v {
			return false
		}
	}
	return true
}

// messageFields rebuilds the stream entry's fields from the message (a fallback when the entry
// cannot be read back), including the raw fields of an entry that could not be decoded.
func messageFields(msg *message.Message) map[string]string {
	out := map[string]string{}
	raw := false
	for k, v := range msg.Metadata {
		if rest, ok := strings.CutPrefix(k, "_raw."); ok {
			out[rest] = v
			raw = true
		}
	}
	if raw {
		return out
	}
	if fields, err := adapters.DecodeFields(msg); err == nil {
		maps.Copy(out, fields)
	} else {
		out["payload"] = string(msg.Payload)
	}
	for k, v := range msg.Metadata {
		if strings.HasPrefix(k, "_") || k == adapters.MetaDecodeError {
			continue
		}
		out[adapters.MetaFieldPrefix+k] = v
	}
	out[redisstream.UUIDHeaderKey] = msg.UUID
	return out
}

// quietHandlerErrors keeps Watermill's router from logging every nack at error level ("Handler
// returned error"): the poison middleware logs the failures that matter itself, once per
// interval for a Redis outage, where the router would log every attempt of every message.
type quietHandlerErrors struct{ watermill.LoggerAdapter }

func (q quietHandlerErrors) Error(msg string, err error, fields watermill.LogFields) {
	if msg == "Handler returned error" {
		q.LoggerAdapter.Debug(msg, fields.Add(watermill.LogFields{"error": err}))
		return
	}
	q.LoggerAdapter.Error(msg, err, fields)
}

func (q quietHandlerErrors) With(fields watermill.LogFields) watermill.LoggerAdapter {
	return quietHandlerErrors{q.LoggerAdapter.With(fields)}
}

func newRouterLogger(l *slog.Logger) watermill.LoggerAdapter {
	return quietHandlerErrors{watermill.NewSlogLogger(l)}
}

// watchedSubscriber tells when its subscription's channel closed, i.e. the handler stopped
// consuming. Watermill's Handler.Stopped() cannot be used for that: RunHandlers assigns the
// channel after closing Started(), without synchronisation (a data race under -race).
type watchedSubscriber struct {
	message.Subscriber
	ended chan struct{}
	once  sync.Once
}

func watchSubscription(s message.Subscriber) message.Subscriber {
	return &watchedSubscriber{Subscriber: s, ended: make(chan struct{})}
}

// Subscribe forwards the inner subscription and closes ended after it closed.
func (w *watchedSubscriber) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	in, err := w.Subscriber.Subscribe(ctx, topic)
	if err != nil {
		return nil, err
	}
	out := make(chan *message.Message)
	go func() {
		defer w.once.Do(func() { close(w.ended) })
		defer close(out)
		for m := range in {
			out <- m
		}
	}()
	return out, nil
}

// subscriptionEnded is closed when s's subscription ended; never for other subscribers.
func subscriptionEnded(s message.Subscriber) <-chan struct{} {
	if w, ok := s.(*watchedSubscriber); ok {
		return w.ended
	}
	return nil
}

// throttledErrorLogger logs each distinct error message at most once per interval, with how many
// were suppressed. The stock watermill-redisstream subscriber logs every failed read (twice a
// second per consumer group) while Redis is down; an outage should be one line per interval.
type throttledErrorLogger struct {
	watermill.LoggerAdapter
	interval time.Duration
	mu       *sync.Mutex
	byMsg    map[string]*throttledLog
}

// NewThrottledErrorLogger wraps l so that repeated errors are logged once per interval.
func NewThrottledErrorLogger(l watermill.LoggerAdapter, interval time.Duration) watermill.LoggerAdapter {
	return throttledErrorLogger{LoggerAdapter: l, interval: interval, mu: &sync.Mutex{}, byMsg: map[string]*throttledLog{}}
}

func (t throttledErrorLogger) Error(msg string, err error, fields watermill.LogFields) {
	t.mu.Lock()
	tl, ok := t.byMsg[msg]
	if !ok {
		tl = &throttledLog{interval: t.interval}
		t.byMsg[msg] = tl
	}
	t.mu.Unlock()
	if ok, n := tl.allow(); ok {
		t.LoggerAdapter.Error(msg, err, fields.Add(watermill.LogFields{"suppressed": n}))
	}
}

func (t throttledErrorLogger) With(fields watermill.LogFields) watermill.LoggerAdapter {
	return throttledErrorLogger{LoggerAdapter: t.LoggerAdapter.With(fields), interval: t.interval, mu: t.mu, byMsg: t.byMsg}
}
