package main

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/checkins/checkins/adapters"
)

// evictionGuard keeps the service off a Redis that may delete its data: with a maxmemory-policy
// other than noeviction, Redis evicts keys under memory pressure (the event stream, pending
// entries, dedupe state, idempotency keys) and every guarantee is void without a single error.
// BullMQ and Sidekiq refuse or warn on the same setting.
//
// At start the service refuses to run on such a Redis unless ALLOW_EVICTING_REDIS is set, and
// then warns every warnEvery. Every interval it reads the policy again: one set to evict later
// makes the process not ready (with the reason) and logs an error every warnEvery. A Redis that
// will not tell (INFO and CONFIG refused, as some managed services do) is said so once.
type evictionGuard struct {
	client    redis.UniversalClient
	allow     bool
	log       *slog.Logger
	interval  time.Duration
	warnEvery time.Duration

	mu         sync.Mutex
	known      bool // the policy has been read (or Redis said it will not tell)
	problem    string
	lastWarn   time.Time
	toldUnseen bool
}

const (
	evictionCheckInterval = time.Minute
	evictionWarnEvery     = 5 * time.Minute
)

func newEvictionGuard(client redis.UniversalClient, allow bool, log *slog.Logger) *evictionGuard {
	return &evictionGuard{client: client, allow: allow, log: log, interval: evictionCheckInterval, warnEvery: evictionWarnEvery}
}

// errEvictingRedis is the refusal to start.
func errEvictingRedis(policy string) error {
	return fmt.Errorf("redis maxmemory-policy is %q: under memory pressure Redis would delete keys (events, pending entries, "+
		"dedupe state, idempotency keys) without an error. Set maxmemory-policy noeviction (CONFIG SET maxmemory-policy "+
		"noeviction, and in redis.conf), or ALLOW_EVICTING_REDIS=true to run anyway", policy)
}

// Start checks once before the service starts: an error refuses to start. A Redis that does
// not answer yet is checked by Run later.
func (g *evictionGuard) Start(ctx context.Context) error {
	m, err := adapters.ReadMemoryInfo(ctx, g.client)
	if err != nil {
		return nil // unreachable or failing: not the policy's fault; Run looks again
	}
	if m.Evicts() && !g.allow {
		return errEvictingRedis(m.Policy)
	}
	g.judge(m, time.Now())
	return nil
}

// Run checks every interval until ctx ends; every second until it has read the policy once
// (Redis did not answer at start), so that a Redis that comes up evicting is caught at once, not
// an interval later.
func (g *evictionGuard) Run(ctx context.Context) error {
	t := time.NewTimer(g.next())
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		t.Reset(g.next())
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		m, err := adapters.ReadMemoryInfo(cctx, g.client)
		cancel()
		if err == nil {
			g.judge(m, time.Now())
		}
	}
}

func (g *evictionGuard) next() time.Duration {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.known {
		return g.interval
	}
	return min(time.Second, g.interval)
}

func (g *evictionGuard) judge(m adapters.MemoryInfo, now time.Time) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.known = true
	due := now.Sub(g.lastWarn) >= g.warnEvery
	switch {
	case m.Policy == "":
		g.problem = ""
		if !g.toldUnseen {
			g.toldUnseen = true
			g.log.Warn("cannot read Redis's maxmemory-policy (INFO and CONFIG are not available to this user): make sure it is noeviction, " +
				"or evictions may delete events and dedupe state without an error")
		}
	case m.Evicts() && g.allow:
		g.problem = ""
		if due {
			g.lastWarn = now
			g.log.Warn("ALLOW_EVICTING_REDIS is set and Redis may evict keys: under memory pressure events, pending entries, "+
				"dedupe state and idempotency keys can be deleted without an error", "maxmemory_policy", m.Policy)
		}
	case m.Evicts():
		g.problem = errEvictingRedis(m.Policy).Error()
		if due {
			g.lastWarn = now
			g.log.Error("Redis may now evict keys: not ready until maxmemory-policy is noeviction", "maxmemory_policy", m.Policy)
		}
	default:
		if g.problem != "" {
			g.log.Info("Redis maxmemory-policy is noeviction again", "maxmemory_policy", m.Policy)
		}
		g.problem = ""
	}
}

// Problem is why the process should not be ready ("" when it may): until the policy has been
// read, that it is not known.
func (g *evictionGuard) Problem() string {
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.known {
		return "redis maxmemory-policy not read yet: Redis has not answered since the start"
	}
	return g.problem
}
