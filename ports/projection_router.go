package ports

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-redisstream/pkg/redisstream"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/redis/go-redis/v9"

	"github.com/checkins/checkins/adapters"
	"github.com/checkins/checkins/app/projection"
	"github.com/checkins/checkins/domain"
)

// Outcomes of handling one event, as reported to a ProjectionObserver.
const (
	OutcomeApplied  = "applied"
	OutcomeFailed   = "failed"   // an attempt failed (it may be retried)
	OutcomePoisoned = "poisoned" // parked in the poison queue
)

// ProjectionObserver sees every handled event (metrics hook up here).
type ProjectionObserver interface {
	Handled(projection, outcome string, d time.Duration)
}

type noObserver struct{}

func (noObserver) Handled(string, string, time.Duration) {}

// ProjectionTarget is one projection version fed by the router.
type ProjectionTarget struct {
	Projection projection.Projection
	Version    int
}

// ProjectionRouterConfig wires the shared machinery every projection gets.
type ProjectionRouterConfig struct {
	Keys    adapters.KeySpace
	Targets []ProjectionTarget
	// Redis is used by the projection stores and the poison queue (not by subscribers).
	Redis redis.UniversalClient
	// NewSubscriber returns a fresh subscriber for a consumer group.
	NewSubscriber  func(group string) (message.Subscriber, error)
	Retry          RetryPolicy
	HandlerTimeout time.Duration
	CloseTimeout   time.Duration
	Observer       ProjectionObserver
	Logger         *slog.Logger
}

// ProjectionRouter is the Watermill router that feeds every projection from the event stream,
// one handler and one consumer group per projection version.
type ProjectionRouter struct {
	cfg       ProjectionRouterConfig
	router    *message.Router
	poison    *adapters.PoisonQueue
	handlers  map[string]*message.Handler
	transient map[string]*throttledLog
	running   atomic.Bool
	log       *slog.Logger
}

// NewProjectionRouter builds the router; Run starts it.
func NewProjectionRouter(cfg ProjectionRouterConfig) (*ProjectionRouter, error) {
	if cfg.Redis == nil || cfg.NewSubscriber == nil || cfg.Logger == nil {
		return nil, errors.New("ports: ProjectionRouter needs Redis, NewSubscriber and Logger")
	}
	if err := cfg.Retry.Validate(); err != nil {
		return nil, err
	}
	if cfg.Observer == nil {
		cfg.Observer = noObserver{}
	}
	if cfg.CloseTimeout <= 0 {
		cfg.CloseTimeout = 30 * time.Second
	}
	wlog := watermill.NewSlogLogger(cfg.Logger)
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: cfg.CloseTimeout}, wlog)
	if err != nil {
		return nil, err
	}
	r := &ProjectionRouter{cfg: cfg, router: router, poison: adapters.NewPoisonQueue(cfg.Redis, cfg.Keys),
		handlers: map[string]*message.Handler{}, transient: map[string]*throttledLog{}, log: cfg.Logger}
	seen := map[string]bool{}
	for _, t := range cfg.Targets {
		name := t.Projection.Name()
		if !validProjectionName(name) {
			return nil, fmt.Errorf("projection name %q: use lower-case letters, digits and _ only", name)
		}
		group := cfg.Keys.Group(name, t.Version)
		if seen[group] {
			return nil, fmt.Errorf("projection %s v%d listed twice", name, t.Version)
		}
		seen[group] = true
		store, err := adapters.NewProjectionStore(cfg.Redis, cfg.Keys, name, t.Version)
		if err != nil {
			return nil, err
		}
		sub, err := cfg.NewSubscriber(group)
		if err != nil {
			return nil, fmt.Errorf("subscriber for %s: %w", group, err)
		}
		h := router.AddConsumerHandler(group, cfg.Keys.Stream(), sub, r.handlerFunc(t.Projection, store))
		r.transient[group] = &throttledLog{interval: 10 * time.Second}
		// The first added is the outermost: poison queue, then retry, then a per-attempt timeout,
		// then panic recovery innermost, so a panic is retried and parked like any failure.
		h.AddMiddleware(
			r.poisonMiddleware(name, group),
			retryMiddleware(cfg.Retry),
			timeoutMiddleware(cfg.HandlerTimeout),
			middleware.Recoverer,
		)
		r.handlers[group] = h
	}
	return r, nil
}

func validProjectionName(s string) bool {
	if s == "" || len(s) > 64 {
		return false
	}
	for _, c := range s {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_') {
			return false
		}
	}
	return true
}

// Run blocks until ctx ends (then closes gracefully) or the router stops on its own, which is
// always an error: a projector that silently stopped consuming must not keep running.
func (r *ProjectionRouter) Run(ctx context.Context) error {
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	stopped := make(chan string, len(r.handlers))
	for name, h := range r.handlers {
		go func() {
			select {
			case <-h.Started():
			case <-runCtx.Done():
				return
			}
			r.running.Store(true)
			select {
			case <-h.Stopped():
				stopped <- name
			case <-runCtx.Done():
			}
		}()
	}
	errc := make(chan error, 1)
	go func() { errc <- r.router.Run(runCtx) }()
	select {
	case <-ctx.Done():
		r.running.Store(false)
		err := <-errc
		if err != nil {
			return fmt.Errorf("projection router: %w", err)
		}
		return nil
	case name := <-stopped:
		r.running.Store(false)
		_ = r.router.Close()
		<-errc
		return fmt.Errorf("projection router: handler %s stopped unexpectedly", name)
	case err := <-errc:
		r.running.Store(false)
		if err == nil {
			err = errors.New("stopped unexpectedly")
		}
		return fmt.Errorf("projection router: %w", err)
	}
}

// Running reports whether every handler is consuming.
func (r *ProjectionRouter) Running() bool { return r.running.Load() && r.router.IsRunning() }

// Close stops consuming, lets in-flight handlers finish and acks what finished.
func (r *ProjectionRouter) Close() error { return r.router.Close() }

func (r *ProjectionRouter) handlerFunc(p projection.Projection, store projection.Store) message.NoPublishHandlerFunc {
	name := p.Name()
	return func(msg *message.Message) error {
		start := time.Now()
		err := handleEvent(msg, p, store)
		outcome := OutcomeApplied
		if err != nil {
			outcome = OutcomeFailed
		}
		r.cfg.Observer.Handled(name, outcome, time.Since(start))
		return err
	}
}

func handleEvent(msg *message.Message, p projection.Projection, store projection.Store) error {
	fields, err := adapters.DecodeFields(msg)
	if err != nil {
		return permanent(err)
	}
	ev, err := domain.ParseEvent(fields)
	if err != nil {
		return permanent(err)
	}
	switch e := ev.(type) {
	case domain.CheckinRecorded:
		if h, ok := p.(projection.CheckinRecordedHandler); ok {
			return h.OnCheckinRecorded(msg.Context(), e, store)
		}
	}
	return nil
}

// poisonMiddleware parks an event whose handling failed for good, then acks the original, so
// nothing behind it stalls. Transient failures (Redis down) are never parked: they are nacked
// and redelivered after the subscriber's nack delay, logged once per interval.
func (r *ProjectionRouter) poisonMiddleware(name, group string) message.HandlerMiddleware {
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
				if ok, n := r.transient[group].allow(); ok {
					r.log.Warn("projection cannot reach Redis, will retry", "projection", name, "group", group,
						"error", err, "suppressed", n)
				}
				return nil, err
			}
			entry := adapters.PoisonEntry{
				Stream: msg.Metadata.Get(adapters.MetaStream), EntryID: msg.Metadata.Get(adapters.MetaEntryID),
				Projection: name, Error: err.Error(), Attempts: max(counter.n, 1), FailedAt: time.Now(),
				Fields: originalFields(msg),
			}
			if entry.Stream == "" {
				entry.Stream = r.cfg.Keys.Stream()
			}
			// The message context may be cancelled by a timeout; parking must not depend on it.
			ctx, cancel := context.WithTimeout(context.WithoutCancel(msg.Context()), 5*time.Second)
			defer cancel()
			id, perr := r.poison.Park(ctx, entry)
			if perr != nil {
				r.log.Error("could not park failed event, will retry", "projection", name, "entry_id", entry.EntryID, "error", perr)
				return nil, perr
			}
			r.cfg.Observer.Handled(name, OutcomePoisoned, 0)
			r.log.Error("event parked in poison queue", "projection", name, "entry_id", entry.EntryID, "poison_id", id,
				"attempts", entry.Attempts, "error", err, "correlation_id", msg.Metadata.Get(adapters.MetaCorrelationID))
			return nil, nil
		}
	}
}

// originalFields rebuilds the stream entry's fields from the message, so the poison entry keeps
// the event unchanged (including raw fields of an entry that could not be decoded).
func originalFields(msg *message.Message) map[string]string {
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

// ReplayPoisoned runs one parked event through its projection's handler again, directly against
// the projection's store (dedupe makes this safe), and removes it from the queue on success.
func ReplayPoisoned(ctx context.Context, e adapters.PoisonEntry, p projection.Projection, store projection.Store) error {
	ev, err := domain.ParseEvent(e.Fields)
	if err != nil {
		return fmt.Errorf("poison entry %s cannot be replayed: %w", e.ID, err)
	}
	if c, ok := ev.(domain.CheckinRecorded); ok {
		if h, ok := p.(projection.CheckinRecordedHandler); ok {
			return h.OnCheckinRecorded(ctx, c, store)
		}
	}
	return nil
}

// Groups lists the consumer groups the router feeds.
func (r *ProjectionRouter) Groups() []string {
	out := make([]string, 0, len(r.handlers))
	for g := range r.handlers {
		out = append(out, g)
	}
	return out
}

var _ = strconv.Itoa
