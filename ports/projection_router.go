package ports

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

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
	// Pipeline, when set, batches the projection updates of concurrent handlers into pipelines.
	Pipeline *adapters.AutoPipeline
	Keys     adapters.KeySpace
	Targets  []ProjectionTarget
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

	// Dynamic handlers (SetTargets): mu guards handlers, transient, subs and retired once the
	// router runs; runCtx is Run's context, which handlers added later run under.
	mu      sync.Mutex
	runCtx  context.Context
	subs    map[string]message.Subscriber
	retired map[string]bool
	stopped chan string
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
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: cfg.CloseTimeout}, newRouterLogger(cfg.Logger))
	if err != nil {
		return nil, err
	}
	r := &ProjectionRouter{cfg: cfg, router: router, poison: adapters.NewPoisonQueue(cfg.Redis, cfg.Keys),
		handlers: map[string]*message.Handler{}, transient: map[string]*throttledLog{}, log: cfg.Logger,
		subs: map[string]message.Subscriber{}, retired: map[string]bool{}, stopped: make(chan string, 64)}
	for _, t := range cfg.Targets {
		if err := r.addTarget(t); err != nil {
			return nil, err
		}
	}
	return r, nil
}

// addTarget adds the handler of one projection version; callers hold r.mu once Run started.
func (r *ProjectionRouter) addTarget(t ProjectionTarget) error {
	cfg := r.cfg
	name := t.Projection.Name()
	if !validProjectionName(name) {
		return fmt.Errorf("projection name %q: use lower-case letters, digits and _ only", name)
	}
	group := cfg.Keys.Group(name, t.Version)
	if _, dup := r.handlers[group]; dup {
		return fmt.Errorf("projection %s v%d listed twice", name, t.Version)
	}
	store, err := adapters.NewProjectionStore(cfg.Redis, cfg.Keys, name, t.Version)
	if err != nil {
		return err
	}
	if cfg.Pipeline != nil {
		store.WithAutoPipeline(cfg.Pipeline)
	}
	sub, err := cfg.NewSubscriber(group)
	if err != nil {
		return fmt.Errorf("subscriber for %s: %w", group, err)
	}
	sub = watchSubscription(sub)
	h := r.router.AddConsumerHandler(group, cfg.Keys.Stream(), sub, r.handlerFunc(t.Projection, store))
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
	r.subs[group] = sub
	return nil
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
	r.mu.Lock()
	r.runCtx = runCtx
	for group, h := range r.handlers {
		go r.watchHandler(runCtx, group, h)
	}
	r.mu.Unlock()
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
	case name := <-r.stopped:
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

// watchHandler marks the router running once a handler consumes and reports a handler that
// stops on its own; a handler retired by SetTargets stops on purpose.
func (r *ProjectionRouter) watchHandler(ctx context.Context, group string, h *message.Handler) {
	select {
	case <-h.Started():
	case <-ctx.Done():
		return
	}
	r.running.Store(true)
	r.mu.Lock()
	ended := subscriptionEnded(r.subs[group])
	r.mu.Unlock()
	select {
	case <-ended:
		r.mu.Lock()
		retired := r.retired[group]
		r.mu.Unlock()
		if !retired {
			select {
			case r.stopped <- group:
			default:
			}
		}
	case <-ctx.Done():
	}
}

// ErrRouterNotRunning is returned by SetTargets before Run started consuming.
var ErrRouterNotRunning = errors.New("projection router is not running yet")

// SetTargets makes the running router feed exactly targets: it adds (and starts) a handler for
// each projection version it does not run yet, and stops and forgets the handlers of versions no
// longer listed. This is how a rebuild's new version starts and a retired one stops without a
// restart. It returns once retired handlers have stopped.
func (r *ProjectionRouter) SetTargets(targets []ProjectionTarget) (added, removed []string, err error) {
	if !r.router.IsRunning() {
		return nil, nil, ErrRouterNotRunning
	}
	stopping, added, removed, err := r.swapTargets(targets)
	// Wait (without the lock: watchHandler takes it) until retired handlers have finished their
	// in-flight events and their subscriptions are closed. Only then may the version's group be
	// destroyed: a subscription still reading would recreate a group it finds missing.
	for _, rt := range stopping {
		<-rt.h.Stopped()
		if cerr := rt.sub.Close(); cerr != nil {
			r.log.Warn("closing subscriber of retired projection version", "group", rt.group, "error", cerr)
		}
		r.log.Info("projection handler stopped: version retired", "group", rt.group)
	}
	return added, removed, err
}

type retiringHandler struct {
	group string
	h     *message.Handler
	sub   message.Subscriber
}

func (r *ProjectionRouter) swapTargets(targets []ProjectionTarget) (stopping []retiringHandler, added, removed []string, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.runCtx == nil || r.runCtx.Err() != nil || r.router.IsClosed() {
		return nil, nil, nil, ErrRouterNotRunning
	}
	want := map[string]bool{}
	for _, t := range targets {
		group := r.cfg.Keys.Group(t.Projection.Name(), t.Version)
		want[group] = true
		if _, ok := r.handlers[group]; ok {
			continue
		}
		if err := r.addTarget(t); err != nil {
			return nil, added, nil, err
		}
		added = append(added, group)
	}
	if len(added) > 0 {
		if err := r.router.RunHandlers(r.runCtx); err != nil {
			return nil, added, nil, fmt.Errorf("start handlers %v: %w", added, err)
		}
		for _, g := range added {
			go r.watchHandler(r.runCtx, g, r.handlers[g])
			r.log.Info("projection handler started", "group", g)
		}
	}
	// Stopping after starting keeps the router from ever having zero handlers, which would close it.
	for group, h := range r.handlers {
		if want[group] {
			continue
		}
		r.retired[group] = true
		h.Stop()
		stopping = append(stopping, retiringHandler{group, h, r.subs[group]})
		delete(r.handlers, group)
		delete(r.subs, group)
		removed = append(removed, group)
	}
	return stopping, added, removed, nil
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
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]string, 0, len(r.handlers))
	for g := range r.handlers {
		out = append(out, g)
	}
	return out
}
