package ports_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/checkins/checkins/adapters"
	"github.com/checkins/checkins/adapters/redistest"
	"github.com/checkins/checkins/app/ops"
	"github.com/checkins/checkins/app/projection"
	"github.com/checkins/checkins/domain"
	"github.com/checkins/checkins/ports"
)

// behaviour decides what the test projection does with one delivery of an event: attempt counts
// deliveries of that checkinId from 1.
type behaviour func(ctx context.Context, checkinID string, attempt int) error

// faultyProjection counts check-ins like a real projection (one idempotent update per event)
// but fails the way its behaviour says. Its behaviour can be swapped at run time ("fixed").
type faultyProjection struct {
	name string
	mu   sync.Mutex
	do   behaviour
	hits map[string]int
	when map[string][]time.Time
}

func newFaulty(name string, b behaviour) *faultyProjection {
	return &faultyProjection{name: name, do: b, hits: map[string]int{}, when: map[string][]time.Time{}}
}

func (p *faultyProjection) Name() string { return p.name }

func (p *faultyProjection) setBehaviour(b behaviour) {
	p.mu.Lock()
	p.do = b
	p.mu.Unlock()
}

func (p *faultyProjection) attempts(id string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.hits[id]
}

func (p *faultyProjection) times(id string) []time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]time.Time(nil), p.when[id]...)
}

func (p *faultyProjection) OnCheckinRecorded(ctx context.Context, e domain.CheckinRecorded, s projection.Store) error {
	p.mu.Lock()
	p.hits[e.ID]++
	n := p.hits[e.ID]
	p.when[e.ID] = append(p.when[e.ID], time.Now())
	do := p.do
	p.mu.Unlock()
	if do != nil {
		if err := do(ctx, e.ID, n); err != nil {
			return err
		}
	}
	return s.Apply(ctx, projection.NewUpdate("all").HIncrBy("stats", "count", 1).HIncrBy("stats", "stars", int64(e.StarRating)))
}

// syncBuffer is a log sink the router's goroutines can share.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func (b *syncBuffer) count(s string) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return strings.Count(b.buf.String(), s)
}

// testApplier applies the projections' updates on client with the default dedupe window.
func testApplier(t *testing.T, client redis.UniversalClient, keys adapters.KeySpace) *adapters.ProjectionApplier {
	t.Helper()
	a, err := adapters.NewProjectionApplier(client, keys, 0)
	require.NoError(t, err)
	return a
}

// harness is a running projection router on real Redis, fed by the chosen subscriber.
type harness struct {
	t      *testing.T
	keys   adapters.KeySpace
	client *redis.Client
	proj   *faultyProjection
	logs   *syncBuffer
	url    string
	router *ports.ProjectionRouter
	apply  *adapters.ProjectionApplier
}

type harnessOptions struct {
	subscriber     string // batched | watermill
	retry          ports.RetryPolicy
	handlerTimeout time.Duration
	nackDelay      time.Duration
	applier        func(redis.UniversalClient, adapters.KeySpace) *adapters.ProjectionApplier // nil: the router's default
	targets        []ops.ProjectionTarget                                                     // nil: p as version 1
	before         func(h *harness)                                                           // runs before the router starts
	observer       ports.ProjectionObserver                                                   // nil: none
	paused         func() bool                                                                // nil: never (a partition migration's quiesce)
}

const testGroup = "live"

func startHarness(t *testing.T, p *faultyProjection, o harnessOptions) *harness {
	t.Helper()
	env := redistest.Open(t)
	h := &harness{t: t, keys: adapters.KeySpace{Prefix: env.Prefix}, client: redistest.Client(t, env.URL), proj: p, logs: &syncBuffer{}, url: env.URL}
	if o.retry.MaxAttempts == 0 {
		o.retry = ports.RetryPolicy{InitialInterval: 10 * time.Millisecond, Multiplier: 2, MaxInterval: 50 * time.Millisecond, MaxAttempts: 3}
	}
	if o.nackDelay == 0 {
		o.nackDelay = 100 * time.Millisecond
	}
	log := slog.New(slog.NewJSONHandler(h.logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
	wlog := watermill.NewSlogLogger(log)
	// Subscribers' clients are closed after the router stopped (a t.Cleanup registered while the
	// router runs would close them first, under a draining subscriber).
	var subClients []*redis.Client
	var subMu sync.Mutex
	subClient := func() *redis.Client {
		opt, err := redis.ParseURL(env.URL)
		require.NoError(t, err)
		c := redis.NewClient(opt)
		subMu.Lock()
		subClients = append(subClients, c)
		subMu.Unlock()
		return c
	}
	newSub := adapters.Subscribers{Kind: o.subscriber, NewClient: func() (redis.UniversalClient, error) { return subClient(), nil },
		Consumer: "c1", BatchSize: 50, MaxInFlight: 100, BlockTime: 50 * time.Millisecond, NackDelay: o.nackDelay,
		ClaimInterval: time.Second, ClaimIdle: 5 * time.Second, DrainTimeout: 5 * time.Second, Logger: wlog, Paused: o.paused}.New
	applier := testApplier(t, h.client, h.keys)
	if o.applier != nil {
		applier = o.applier(h.client, h.keys)
	}
	if o.before != nil {
		o.before(h)
	}
	targets := o.targets
	if targets == nil {
		targets = []ops.ProjectionTarget{{Projection: p, Version: 1}}
	}
	r, err := ports.NewProjectionRouter(ports.ProjectionRouterConfig{
		Targets: targets, Backend: adapters.NewProjectorBackend(h.client, h.keys), Applier: applier,
		NewSubscriber: newSub, Retry: o.retry, HandlerTimeout: o.handlerTimeout, CloseTimeout: 10 * time.Second, Logger: log,
		Observer: o.observer, Paused: o.paused,
	})
	require.NoError(t, err)
	h.router, h.apply = r, applier
	t.Cleanup(func() {
		subMu.Lock()
		defer subMu.Unlock()
		for _, c := range subClients {
			_ = c.Close()
		}
	})
	redistest.Background(t, "router", 20*time.Second, r.Run) // stops before the clients close
	require.Eventually(t, r.Running, 10*time.Second, 10*time.Millisecond, "router never started")
	return h
}

// add writes a check-in event straight to the stream in the publisher's format and returns its entry ID.
func (h *harness) add(id string, stars int) string {
	h.t.Helper()
	e := domain.CheckinRecorded{Checkin: domain.Checkin{ID: id, UserID: 1, LocationID: 2, StarRating: stars, Timestamp: time.Now().UnixMilli()},
		RecordedAt: time.Now().UnixMilli()}
	return h.xadd(h.values(e, "corr-"+id))
}

// values is e as the publisher writes it to the stream.
func (h *harness) values(e domain.CheckinRecorded, correlationID string) map[string]any {
	h.t.Helper()
	msg, err := adapters.NewEventMessage(e.Fields(), correlationID)
	require.NoError(h.t, err)
	values, err := adapters.FlatMarshaller{}.Marshal(h.keys.Stream(), msg)
	require.NoError(h.t, err)
	return values
}

// windowOf is a harness applier with the given dedupe window, pruning markers in one of every
// pruneEvery calls.
func windowOf(window time.Duration, pruneEvery int) func(redis.UniversalClient, adapters.KeySpace) *adapters.ProjectionApplier {
	return func(c redis.UniversalClient, keys adapters.KeySpace) *adapters.ProjectionApplier {
		a, err := adapters.NewProjectionApplier(c, keys, window)
		if err != nil {
			panic(err)
		}
		return a.PruneEvery(pruneEvery)
	}
}

func (h *harness) xadd(values map[string]any) string {
	h.t.Helper()
	entryID, err := h.client.XAdd(context.Background(), &redis.XAddArgs{Stream: h.keys.Stream(), Values: values}).Result()
	require.NoError(h.t, err)
	return entryID
}

func (h *harness) count() int64 {
	v, err := h.client.HGet(context.Background(), h.keys.ProjectionKey(h.proj.name, 1, "all", "stats"), "count").Int64()
	if errors.Is(err, redis.Nil) {
		return 0
	}
	require.NoError(h.t, err)
	return v
}

func (h *harness) poison() []ops.PoisonEntry {
	es, _, err := adapters.NewPoisonQueue(h.client, h.keys).List(context.Background(), "", 1000)
	require.NoError(h.t, err)
	return es
}

func (h *harness) pending() int64 {
	p, err := h.client.XPending(context.Background(), h.keys.Stream(), testGroup).Result()
	require.NoError(h.t, err)
	return p.Count
}

// settled waits until want events were counted and nothing is pending in the group.
func (h *harness) settled(want int64) {
	h.t.Helper()
	require.Eventually(h.t, func() bool { return h.count() == want && h.pending() == 0 }, 15*time.Second, 20*time.Millisecond,
		"want count %d and nothing pending; have count %d, pending %d", want, h.count(), h.pending())
}

var subscribers = []string{"batched", "watermill"}

func TestRouterRetriesAFailingHandlerAndCountsOnce(t *testing.T) {
	t.Parallel()
	for _, sub := range subscribers {
		t.Run(sub, func(t *testing.T) {
			t.Parallel()
			p := newFaulty("faulty", func(_ context.Context, id string, attempt int) error {
				if id == "flaky" && attempt <= 2 {
					return fmt.Errorf("flaky failure %d", attempt)
				}
				return nil
			})
			h := startHarness(t, p, harnessOptions{subscriber: sub})
			h.add("before", 1)
			h.add("flaky", 2)
			h.add("after", 3)
			h.settled(3)
			assert.Equal(t, 3, p.attempts("flaky"), "failed twice, succeeded on the third attempt")
			assert.Empty(t, h.poison(), "a handler that eventually succeeds is not parked")
		})
	}
}

func TestRouterParksAnEventAfterMaxAttempts(t *testing.T) {
	t.Parallel()
	for _, sub := range subscribers {
		t.Run(sub, func(t *testing.T) {
			t.Parallel()
			p := newFaulty("faulty", func(_ context.Context, id string, _ int) error {
				if id == "bad" {
					return errors.New("boom: cannot project this one")
				}
				return nil
			})
			h := startHarness(t, p, harnessOptions{subscriber: sub})
			before := time.Now().Add(-time.Second)
			h.add("one", 1)
			badID := h.add("bad", 5)
			for i := range 20 {
				h.add("later-"+strconv.Itoa(i), 1)
			}
			h.settled(21)
			assert.Equal(t, 3, p.attempts("bad"), "RETRY_MAX_ATTEMPTS attempts, then parked")

			es := h.poison()
			require.Len(t, es, 1)
			e := es[0]
			assert.Equal(t, h.keys.Stream(), e.Stream)
			assert.Equal(t, badID, e.EntryID, "the original entry ID, whichever subscriber")
			assert.Equal(t, "faulty", e.Projection)
			assert.Equal(t, testGroup, e.Group)
			assert.Contains(t, e.Error, "boom: cannot project this one")
			assert.Equal(t, 3, e.Attempts)
			assert.WithinRange(t, e.FailedAt, before, time.Now().Add(time.Second))
			assert.Equal(t, ops.DecisionCounted, e.Decision, "parked with its dedupe decision, for the replay")
			// The original event, unchanged, field by field.
			orig, err := h.client.XRange(context.Background(), h.keys.Stream(), badID, badID).Result()
			require.NoError(t, err)
			require.Len(t, orig, 1)
			for k, v := range orig[0].Values {
				assert.Equal(t, v, e.Fields[k], "field %s of the parked event", k)
			}
			assert.Len(t, e.Fields, len(orig[0].Values))
		})
	}
}

func TestRouterParksATimedOutHandler(t *testing.T) {
	t.Parallel()
	cases := map[string]behaviour{
		// Honours its context: the classic case where the message context ends up cancelled.
		"honours context": func(ctx context.Context, id string, _ int) error {
			if id != "slow" {
				return nil
			}
			<-ctx.Done()
			return ctx.Err()
		},
		// Ignores its context: it is abandoned at the deadline instead of holding the consumer.
		"ignores context": func(_ context.Context, id string, _ int) error {
			if id == "slow" {
				time.Sleep(2 * time.Second)
				return errors.New("too late")
			}
			return nil
		},
	}
	for name, b := range cases {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			p := newFaulty("faulty", b)
			h := startHarness(t, p, harnessOptions{handlerTimeout: 100 * time.Millisecond,
				retry: ports.RetryPolicy{InitialInterval: 10 * time.Millisecond, Multiplier: 1, MaxInterval: 10 * time.Millisecond, MaxAttempts: 2}})
			h.add("slow", 1)
			h.add("fast", 1)
			h.settled(1)
			es := h.poison()
			require.Len(t, es, 1, "parked although the failure was a timeout (the poison publish must not use the cancelled context)")
			assert.Equal(t, "slow", es[0].Fields[domain.FieldCheckinID])
			assert.Contains(t, es[0].Error, "handler timed out after 100ms")
			assert.Equal(t, 2, es[0].Attempts)
		})
	}
}

func TestRouterParksAPanickingHandler(t *testing.T) {
	t.Parallel()
	p := newFaulty("faulty", func(_ context.Context, id string, _ int) error {
		if id == "panics" {
			panic("handler bug")
		}
		return nil
	})
	h := startHarness(t, p, harnessOptions{})
	h.add("panics", 1)
	h.add("fine", 1)
	h.settled(1)
	es := h.poison()
	require.Len(t, es, 1)
	assert.Contains(t, es[0].Error, "handler bug")
	assert.Equal(t, 3, es[0].Attempts, "a panic is retried like any failure")
}

func TestRouterParksMalformedEntriesAndKeepsConsuming(t *testing.T) {
	t.Parallel()
	garbage := []struct {
		values map[string]any
		reason string
	}{
		{map[string]any{"hello": "world"}, "missing event type"}, // what `redis-cli XADD s * hello world` writes
		{map[string]any{"type": "checkin.deleted.v9", "checkinId": "x"}, `unknown event type "checkin.deleted.v9"`},
		{map[string]any{"type": domain.EventCheckinRecorded, "checkinId": "bad-user", "userId": "abc", "locationId": "1", "starRating": "1", "timestamp": "1"}, "userId"},
		{map[string]any{"type": domain.EventCheckinRecorded, "checkinId": "bad-stars", "userId": "1", "locationId": "1", "starRating": "9", "timestamp": "1"}, "starRating"},
		{map[string]any{"_watermill_message_uuid": "u-1", "type": domain.EventCheckinRecorded}, "is missing"},
	}
	for _, sub := range subscribers {
		t.Run(sub, func(t *testing.T) {
			t.Parallel()
			p := newFaulty("faulty", nil)
			h := startHarness(t, p, harnessOptions{subscriber: sub})
			h.add("first", 1)
			want := map[string]int{}
			for i, g := range garbage {
				want[h.xadd(g.values)] = i
			}
			h.add("last", 1)
			h.settled(2)
			es := h.poison()
			require.Len(t, es, len(garbage), "each malformed entry is parked once")
			for _, e := range es {
				i, ok := want[e.EntryID]
				require.True(t, ok, "parked entry %s names its original entry", e.EntryID)
				assert.Contains(t, e.Error, garbage[i].reason, "parked with the reason")
				assert.Equal(t, 1, e.Attempts, "a malformed entry is not retried")
				assert.Empty(t, e.Decision, "what is not a check-in is never counted, nor decided")
				assert.Len(t, e.Fields, len(garbage[i].values), "the entry is kept as it was written, nothing added")
				for k, v := range garbage[i].values {
					assert.Equal(t, v, e.Fields[k])
				}
			}
		})
	}
}

func TestRouterNeverParksTransientFailuresAndDoesNotSpin(t *testing.T) {
	t.Parallel()
	const failures = 8 // more than max attempts: would be parked if it were not transient
	p := newFaulty("faulty", func(_ context.Context, id string, attempt int) error {
		if id == "outage" && attempt <= failures {
			return fmt.Errorf("dial tcp 127.0.0.1:6379: %w", syscall.ECONNREFUSED)
		}
		return nil
	})
	nack := 200 * time.Millisecond
	h := startHarness(t, p, harnessOptions{nackDelay: nack})
	h.add("outage", 1)
	h.settled(1)
	assert.Empty(t, h.poison(), "Redis being unreachable says nothing about the event")
	assert.Equal(t, failures+1, p.attempts("outage"))
	// Attempts 3 and 4 are separated by a nack (3 attempts per delivery): no hot loop.
	ts := p.times("outage")
	assert.GreaterOrEqual(t, ts[3].Sub(ts[2]), nack, "a nacked event waits NACK_DELAY before it comes back")
	assert.LessOrEqual(t, h.logs.count("projection cannot reach Redis"), 1, "an outage is logged once per interval, not per attempt")
	assert.Zero(t, h.logs.count("Handler returned error"), "the router does not log every nack at error level")
}

// closingSubscriber ends its subscription on its own, as the stock subscriber does after an
// unmarshal error.
type closingSubscriber struct{}

func (closingSubscriber) Subscribe(context.Context, string) (<-chan *message.Message, error) {
	ch := make(chan *message.Message)
	go func() {
		time.Sleep(200 * time.Millisecond)
		close(ch)
	}()
	return ch, nil
}

func (closingSubscriber) Close() error { return nil }

func TestRouterRunFailsWhenASubscriptionEndsUnexpectedly(t *testing.T) {
	t.Parallel()
	env := redistest.Open(t)
	r, err := ports.NewProjectionRouter(ports.ProjectionRouterConfig{
		Targets: []ops.ProjectionTarget{{Projection: newFaulty("faulty", nil), Version: 1}},
		Backend: adapters.NewProjectorBackend(redistest.Client(t, env.URL), adapters.KeySpace{Prefix: env.Prefix}),
		Applier: testApplier(t, redistest.Client(t, env.URL), adapters.KeySpace{Prefix: env.Prefix}), Retry: ports.DefaultRetryPolicy(), Logger: slog.New(slog.DiscardHandler),
		NewSubscriber: func(string, func(context.Context, string) (string, error)) (message.Subscriber, error) {
			return closingSubscriber{}, nil
		},
	})
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() { done <- r.Run(context.Background()) }()
	select {
	case err := <-done:
		require.Error(t, err, "a projector that stopped consuming must not look healthy")
		assert.Contains(t, err.Error(), "stopped")
	case <-time.After(15 * time.Second):
		t.Fatal("Run kept running after its only subscription ended")
	}
}

func TestRouterNeverDropsAnEventItCannotPark(t *testing.T) {
	t.Parallel()
	p := newFaulty("faulty", func(_ context.Context, id string, _ int) error {
		if id == "bad" {
			return errors.New("boom")
		}
		return nil
	})
	h := startHarness(t, p, harnessOptions{})
	ctx := context.Background()
	// The poison stream cannot be written (wrong key type): parking fails.
	require.NoError(t, h.client.Set(ctx, h.keys.PoisonStream(), "not a stream", 0).Err())
	h.add("bad", 1)
	h.add("good", 1)
	require.Eventually(t, func() bool { return h.count() == 1 && p.attempts("bad") >= 6 }, 15*time.Second, 20*time.Millisecond,
		"the event is retried after a failed park")
	assert.Equal(t, int64(1), h.pending(), "not acked: it stays pending until it is parked")
	// Once parking works again, it is parked and acked.
	require.NoError(t, h.client.Del(ctx, h.keys.PoisonStream()).Err())
	h.settled(1)
	es := h.poison()
	require.Len(t, es, 1)
	assert.Equal(t, "bad", es[0].Fields[domain.FieldCheckinID])
}

func TestIsTransient(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		err  error
		want bool
	}{
		{"nil", nil, false},
		{"connection refused", fmt.Errorf("apply: %w", &net.OpError{Op: "dial", Err: syscall.ECONNREFUSED}), true},
		{"reset", fmt.Errorf("apply: %w", syscall.ECONNRESET), true},
		{"client closed", fmt.Errorf("apply: %w", redis.ErrClosed), true},
		{"pipeline closed", fmt.Errorf("apply: %w", adapters.ErrPipelineClosed), true},
		{"loading", redisReply("LOADING Redis is loading the dataset in memory"), true},
		{"read-only replica", redisReply("READONLY You can't write against a read only replica."), true},
		{"out of memory", fmt.Errorf("apply: %w", redisReply("OOM command not allowed when used memory > 'maxmemory'. script: 1f2e, on @user_script:20.")), true},
		{"busy script", redisReply("BUSY Redis is busy running a script. You can only call SCRIPT KILL or SHUTDOWN NOSCRIPT."), true},
		{"lost scripts", redisReply("NOSCRIPT No matching script. Please use EVAL."), true},
		{"failover", redisReply("MASTERDOWN Link with MASTER is down and replica-serve-stale-data is set to 'no'."), true},
		{"cluster", redisReply("CLUSTERDOWN The cluster is down"), true},
		{"resharding", redisReply("TRYAGAIN Multiple keys request during rehashing of slot"), true},
		{"text that mentions LOADING but is not a reply", errors.New("LOADING Redis is loading the dataset in memory"), false},
		{"bug", errors.New("index out of range"), false},
		{"script error", redisReply("ERR Error running script: unknown op"), false},
		{"wrong type", redisReply("WRONGTYPE Operation against a key holding the wrong kind of value"), false},
		{"invalid event", fmt.Errorf("%w: userId: is missing", ports.ErrPermanent), false},
		{"timeout", fmt.Errorf("%w after 1s: %w", ports.ErrHandlerTimeout, context.DeadlineExceeded), false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			assert.Equal(t, c.want, ports.IsTransient(adapters.RedisErrors{}, c.err))
		})
	}
}

// redisReply is an error reply as go-redis returns it from a server.
type redisReply string

func (e redisReply) Error() string { return string(e) }
func (redisReply) RedisError()     {}

// TestRouterPrunesTheDedupeRegistryBehindEveryGroup: the router tells the applier how far every
// group has got, and the registry then keeps only the window before that, not every check-in.
func TestRouterPrunesTheDedupeRegistryBehindEveryGroup(t *testing.T) {
	t.Parallel()
	p := newFaulty("faulty", nil)
	h := startHarness(t, p, harnessOptions{applier: windowOf(time.Minute, 1)})
	ctx := context.Background()
	start := time.Now().Add(-3 * time.Hour).UnixMilli()
	for i := range 30 { // three hours of history of user 1, one check-in every 5 minutes
		e := domain.CheckinRecorded{Checkin: domain.Checkin{ID: "old-" + strconv.Itoa(i), UserID: 1, LocationID: 2, StarRating: 1, Timestamp: start},
			RecordedAt: start}
		id := strconv.FormatInt(start+int64(i)*300_000, 10) + "-0"
		require.NoError(t, h.client.XAdd(ctx, &redis.XAddArgs{Stream: h.keys.Stream(), ID: id, Values: h.values(e, "corr")}).Err())
	}
	h.settled(30)
	// Copies older than the window before the last old check-in: none may stay.
	old := func() int64 {
		n, err := h.client.ZCount(ctx, h.keys.Registry(1), "-inf", "("+strconv.FormatInt(adapters.ScoreOfTime(time.UnixMilli(start+29*300_000-60_000)), 10)).Result()
		require.NoError(t, err)
		return n
	}
	require.Eventually(t, func() bool {
		h.add("now-"+strconv.FormatInt(time.Now().UnixNano(), 10), 1) // a call that prunes her registry
		return old() == 0
	}, 10*time.Second, 100*time.Millisecond, "the registry keeps the window before the floor only (has %d older)", old())
}

// TestRouterSweepsTheRegistriesOnceQuiet: a burst decided with an old floor leaves a user's
// registry holding far more than the window, grown past Redis's compact encoding. Once every
// group is quiet the router has the applier sweep the registries it wrote: the window before
// the floor is what stays, compact.
func TestRouterSweepsTheRegistriesOnceQuiet(t *testing.T) {
	t.Parallel()
	p := newFaulty("faulty", nil)
	h := startHarness(t, p, harnessOptions{applier: windowOf(time.Minute, adapters.DefaultPruneEvery)})
	ctx := context.Background()
	const n = 300
	start := time.Now().Add(-time.Hour).UnixMilli()
	pipe := h.client.Pipeline()
	for i := range n { // five minutes of user 1's history, a check-in a second, in one burst
		at := start + int64(i)*1_000
		e := domain.CheckinRecorded{Checkin: domain.Checkin{ID: "burst-" + strconv.Itoa(i), UserID: 1, LocationID: 2, StarRating: 1, Timestamp: at},
			RecordedAt: at}
		pipe.XAdd(ctx, &redis.XAddArgs{Stream: h.keys.Stream(), ID: strconv.FormatInt(at, 10) + "-0", Values: h.values(e, "corr")})
	}
	_, err := pipe.Exec(ctx)
	require.NoError(t, err)
	h.settled(n)
	reg := h.keys.Registry(1)
	require.Eventually(t, func() bool {
		card, err := h.client.ZCard(ctx, reg).Result()
		require.NoError(t, err)
		enc, err := h.client.ObjectEncoding(ctx, reg).Result()
		require.NoError(t, err)
		return card <= 61 && enc == "listpack"
	}, 15*time.Second, 50*time.Millisecond, "the registry keeps the window before the floor, compact")
	assert.Equal(t, int64(n), h.count())
}

// TestRouterCountsOnceAWriteThatLandedAfterItsTimeout: Redis, held by another client's long
// script, runs the projector's apply after the attempt's HANDLER_TIMEOUT has passed: the write
// lands although the attempt failed. The batch goes again and finds it applied (its markers):
// every event counts once, and none is parked (a timeout while applying is Redis being slow, not
// the event's fault), so no replay can apply such a write twice.
func TestRouterCountsOnceAWriteThatLandedAfterItsTimeout(t *testing.T) {
	t.Parallel()
	const spin = `local t0 = redis.call('TIME') local s = t0[1] * 1000000 + t0[2]
while true do local t = redis.call('TIME') if t[1] * 1000000 + t[2] - s > 400000 then return 1 end end`
	var spins sync.WaitGroup
	var other *redis.Client
	// Every fifth check-in's first attempt holds Redis in another client's 400 ms script before
	// the projector applies, so that the apply waits past the 100 ms HANDLER_TIMEOUT and lands
	// after the attempt has failed: the overlap is made, not left to the scheduler.
	p := newFaulty("faulty", func(ctx context.Context, id string, n int) error {
		i, _ := strconv.Atoi(strings.TrimPrefix(id, "late-"))
		if n == 1 && i%5 == 0 {
			spins.Go(func() { _ = other.Eval(context.Background(), spin, nil).Err() })
			time.Sleep(30 * time.Millisecond) // the script is running when the apply is sent
		}
		return nil
	})
	h := startHarness(t, p, harnessOptions{handlerTimeout: 100 * time.Millisecond})
	other = redistest.Client(t, h.url)
	const n = 20
	for i := range n {
		h.add("late-"+strconv.Itoa(i), 2)
		time.Sleep(20 * time.Millisecond)
	}
	h.settled(n)
	spins.Wait()
	require.Positive(t, h.logs.count("HANDLER_TIMEOUT"), "some apply must have timed out and landed later")
	assert.Equal(t, int64(2*n), h.stars())
	assert.Empty(t, h.poison(), "never parked for Redis being slow")
}

// TestRouterDoesNotRecreateAnOwnGroupWithoutItsMember: a version backfilling through its own
// group when Redis loses the live group's membership (a server that came back empty) must not
// get that group recreated before it joined again: a group made then would deliver entries that
// nothing applies to the version and acknowledge them, and the join would take them as
// backfilled (the version would never count them).
func TestRouterDoesNotRecreateAnOwnGroupWithoutItsMember(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	p := newFaulty("lostown", func(ctx context.Context, _ string, _ int) error {
		select {
		case <-release:
		case <-ctx.Done():
		}
		return nil
	})
	h := startHarness(t, p, harnessOptions{handlerTimeout: time.Minute, before: func(h *harness) {
		for i := range 5 {
			h.add(fmt.Sprintf("before-%d", i), 3)
		}
		// A live group that has delivered them already: the version joins behind it, at the
		// stream's end, and its own group backfills them.
		require.NoError(t, h.client.XGroupCreate(context.Background(), h.keys.Stream(), testGroup, "$").Err())
	}})
	t.Cleanup(func() { close(release) })
	own := "lostown.v1"
	ctx := context.Background()
	groups := func() []string {
		gs, err := h.client.XInfoGroups(ctx, h.keys.Stream()).Result()
		require.NoError(t, err)
		var names []string
		for _, g := range gs {
			names = append(names, g.Name)
		}
		return names
	}
	require.Eventually(t, func() bool { return p.attempts("before-0") > 0 }, 10*time.Second, 10*time.Millisecond, "the backfill runs")
	require.Contains(t, groups(), own)

	// Redis loses the registry (membership and checkpoints) and the groups.
	require.NoError(t, h.client.Del(ctx, h.keys.Projections()).Err())
	require.NoError(t, h.client.XGroupDestroy(ctx, h.keys.Stream(), own).Err())
	require.NoError(t, h.client.XGroupDestroy(ctx, h.keys.Stream(), testGroup).Err())
	// Several checkpoint intervals (250 ms) and subscriber retries later, neither is back.
	time.Sleep(2 * time.Second)
	assert.NotContains(t, groups(), own, "the own group of a version that is not in the live group")
	assert.NotContains(t, groups(), testGroup, "the live group without members")
}

// TestRouterBackfillKeepsTheRegistryItDecidesBy: a running projector's registry floors are
// what every group had passed (here, the present) when a rebuild starts: version 2 joins the
// live group and its own group backfills two hours old history. Its first call registers a
// check-in far below the floors, and pruned them right away. Its copy 10 s later came after a
// checkpoint, which let go of the group's marker of the first copy: counted again in version 2.
// The router holds the floors when a backfill starts, until a checkpoint takes the backfill's
// position into account.
func TestRouterBackfillKeepsTheRegistryItDecidesBy(t *testing.T) {
	t.Parallel()
	// Version 2 handles the copy (the dup's fourth handling, after version 1's two and its
	// own first) a second late: checkpoints (every 250 ms) run meanwhile.
	p := newFaulty("backfill", func(ctx context.Context, id string, n int) error {
		if id == "dup" && n == 4 {
			select {
			case <-time.After(time.Second):
			case <-ctx.Done():
			}
		}
		return nil
	})
	old := time.Now().Add(-2 * time.Hour).UnixMilli()
	const fillers = 400
	h := startHarness(t, p, harnessOptions{
		applier:        windowOf(time.Minute, 1),
		handlerTimeout: 10 * time.Second,
		before: func(h *harness) {
			ctx := context.Background()
			at := func(ms int64, e domain.CheckinRecorded) {
				require.NoError(t, h.client.XAdd(ctx, &redis.XAddArgs{Stream: h.keys.Stream(), ID: strconv.FormatInt(ms, 10) + "-0",
					Values: h.values(e, "corr")}).Err())
			}
			dup := domain.CheckinRecorded{Checkin: domain.Checkin{ID: "dup", UserID: 1, LocationID: 2, StarRating: 3, Timestamp: old}, RecordedAt: old}
			at(old, dup)
			for i := range fillers { // more than the subscriber hands out at once: the copy comes in a later call
				e := domain.CheckinRecorded{Checkin: domain.Checkin{ID: "fill-" + strconv.Itoa(i), UserID: int64(2 + i), LocationID: 2, StarRating: 1, Timestamp: old},
					RecordedAt: old}
				at(old+1+int64(i), e)
			}
			at(old+10_000, dup) // the same check-in again, 10 s later: within the window
		},
	})
	ctx := context.Background()
	countOf := func(version int) int64 {
		v, err := h.client.HGet(ctx, h.keys.ProjectionKey(p.name, version, "all", "stats"), "count").Int64()
		if errors.Is(err, redis.Nil) {
			return 0
		}
		require.NoError(t, err)
		return v
	}
	backfilled := func(group string) bool { // group delivered the history, nothing pending
		gs, err := h.client.XInfoGroups(ctx, h.keys.Stream()).Result()
		require.NoError(t, err)
		for _, g := range gs {
			if g.Name == group {
				return g.Lag == 0 && g.Pending == 0 && g.EntriesRead >= fillers+2
			}
		}
		return false
	}
	require.Eventually(t, func() bool { return backfilled(testGroup) }, 15*time.Second, 20*time.Millisecond, "version 1 went through the history")
	require.Equal(t, int64(fillers+1), countOf(1))

	// The floors of a projector that has been running: everything up to now was passed.
	require.NoError(t, h.apply.SetRegistryFloor(strconv.FormatInt(time.Now().UnixMilli(), 10)+"-0"))
	added, _, err := h.router.SetTargets(ctx, []ops.ProjectionTarget{{Projection: p, Version: 1}, {Projection: p, Version: 2}})
	require.NoError(t, err)
	require.Contains(t, added, "backfill.v2")
	require.Eventually(t, func() bool { return backfilled("backfill.v2") }, 15*time.Second, 20*time.Millisecond, "version 2 backfilled")
	assert.Equal(t, int64(fillers+1), countOf(2), "the copy 10 s later is a duplicate in version 2, as in version 1")
}

// failingSubscriber fails Subscribe while fail is above zero (counting it down), as when Redis
// answers LOADING or OOM while a group is created.
// closeCounting counts the Close calls of a group's subscribers.
type closeCounting struct {
	message.Subscriber
	closed *atomic.Int32
}

func (c closeCounting) Close() error {
	c.closed.Add(1)
	return c.Subscriber.Close()
}

type failingSubscriber struct {
	message.Subscriber
	fail *atomic.Int32
}

func (f failingSubscriber) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	if f.fail.Add(-1) >= 0 {
		return nil, errors.New("LOADING Redis is loading the dataset in memory (injected)")
	}
	return f.Subscriber.Subscribe(ctx, topic)
}

// TestBackfillWhoseSubscriptionFailedStartsLaterOrRetires: a new version's own group whose
// subscription fails once is started by the next SetTargets (it was left added and never
// started, so the version was "running" with nothing feeding it); and retiring a version whose
// handler never started returns at once (it waited for the start for good, holding the
// router's lock, so checkpoints and Groups stopped too).
func TestBackfillWhoseSubscriptionFailedStartsLaterOrRetires(t *testing.T) {
	t.Parallel()
	env := redistest.Open(t)
	keys := adapters.KeySpace{Prefix: env.Prefix}
	client := redistest.Client(t, env.URL)
	fails := &atomic.Int32{}
	var subClients []*redis.Client
	var subMu sync.Mutex
	t.Cleanup(func() {
		for _, c := range subClients {
			_ = c.Close()
		}
	})
	newSub := func(group string, start func(ctx context.Context, stream string) (string, error)) (message.Subscriber, error) {
		o, err := redis.ParseURL(env.URL)
		require.NoError(t, err)
		s, err := adapters.Subscribers{NewClient: func() (redis.UniversalClient, error) {
			c := redis.NewClient(o)
			subMu.Lock()
			subClients = append(subClients, c)
			subMu.Unlock()
			return c, nil
		}, Consumer: "c1", BatchSize: 50, MaxInFlight: 100, BlockTime: 50 * time.Millisecond, NackDelay: 100 * time.Millisecond,
			ClaimInterval: time.Second, ClaimIdle: 5 * time.Second, DrainTimeout: 2 * time.Second, Logger: watermill.NopLogger{}}.New(group, start)
		if err != nil || group == testGroup {
			return s, err
		}
		return failingSubscriber{s, fails}, nil
	}
	p := newFaulty("p", nil)
	r, err := ports.NewProjectionRouter(ports.ProjectionRouterConfig{
		Targets: []ops.ProjectionTarget{{Projection: p, Version: 1}}, Backend: adapters.NewProjectorBackend(client, keys),
		Applier: testApplier(t, client, keys), NewSubscriber: newSub, Retry: ports.DefaultRetryPolicy(), CloseTimeout: 5 * time.Second,
		Logger: slog.New(slog.DiscardHandler),
	})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(t.Context())
	runErr := make(chan error, 1)
	go func() { runErr <- r.Run(ctx) }()
	require.Eventually(t, r.Running, 10*time.Second, 10*time.Millisecond)
	h := &harness{t: t, keys: keys, client: client}
	for i := range 5 {
		h.add("e"+strconv.Itoa(i), 1)
	}
	count := func(version int) int64 {
		n, _ := client.HGet(ctx, keys.ProjectionKey("p", version, "all", "stats"), "count").Int64()
		return n
	}
	require.Eventually(t, func() bool { return count(1) == 5 }, 10*time.Second, 20*time.Millisecond)

	both := []ops.ProjectionTarget{{Projection: p, Version: 1}, {Projection: p, Version: 2}}
	fails.Store(1)
	_, _, err = r.SetTargets(ctx, both)
	require.ErrorContains(t, err, "LOADING", "the failed start is reported (readiness shows it)")
	_, _, err = r.SetTargets(ctx, both)
	require.NoError(t, err, "the next call starts it")
	require.Eventually(t, func() bool { return count(2) == 5 }, 10*time.Second, 20*time.Millisecond, "v2 backfills")

	// A version whose handler never starts is retired without waiting for it.
	three := []ops.ProjectionTarget{{Projection: p, Version: 1}, {Projection: p, Version: 2}, {Projection: p, Version: 3}}
	fails.Store(1 << 20)
	_, _, err = r.SetTargets(ctx, three)
	require.Error(t, err)
	done := make(chan error, 1)
	go func() {
		_, removed, err := r.SetTargets(ctx, both)
		assert.Equal(t, []string{"p.v3"}, removed)
		done <- err
	}()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("retiring a version whose handler never started blocks SetTargets")
	}
	assert.NotContains(t, r.Groups(), "p.v3")
	assert.True(t, r.Running())
	h.add("e5", 1)
	require.Eventually(t, func() bool { return count(1) == 6 && count(2) == 6 }, 10*time.Second, 20*time.Millisecond, "the others go on")
	// Stopping with a handler that never started (v4's subscription fails) does not wait the
	// close timeout (5 s here) for it, nor end in an error.
	_, _, err = r.SetTargets(ctx, []ops.ProjectionTarget{{Projection: p, Version: 1}, {Projection: p, Version: 2}, {Projection: p, Version: 4}})
	require.Error(t, err)
	stopping := time.Now()
	cancel()
	select {
	case err := <-runErr:
		require.NoError(t, err, "a clean stop: no handler left that never ends")
		assert.Less(t, time.Since(stopping), 4*time.Second, "not the whole close timeout")
	case <-time.After(20 * time.Second):
		t.Fatal("the router did not stop")
	}
}

// TestRouterWithoutHandlersStopsWithItsContext: a router that never got a handler (Redis was
// down at the start, so the registry watch could not set its targets) ends when its context
// does; Watermill's Run waited for a Close that never came, and SIGTERM for SIGKILL.
func TestRouterWithoutHandlersStopsWithItsContext(t *testing.T) {
	t.Parallel()
	env := redistest.Open(t)
	client := redistest.Client(t, env.URL)
	keys := adapters.KeySpace{Prefix: env.Prefix}
	r, err := ports.NewProjectionRouter(ports.ProjectionRouterConfig{Backend: adapters.NewProjectorBackend(client, keys),
		Applier: testApplier(t, client, keys), NewSubscriber: adapters.Subscribers{NewClient: func() (redis.UniversalClient, error) {
			return redistest.Client(t, env.URL), nil
		}, Consumer: "c1", Logger: watermill.NopLogger{}}.New, Retry: ports.DefaultRetryPolicy(), CloseTimeout: 2 * time.Second,
		Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	time.Sleep(200 * time.Millisecond)
	cancel()
	select {
	case err := <-done:
		assert.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("a router without handlers did not stop with its context")
	}
}

// TestHandlerDroppedBeforeRunNeverConsumesAndCanComeBack: the registry watch and Run start
// together, so SetTargets may drop a handler before Run started Watermill. Watermill still held
// it: Run started it with a real subscription that nobody watched (the dropped version's own
// group was consumed), and wanting the version again added a second handler of the same name,
// which Watermill answers with a panic.
func TestHandlerDroppedBeforeRunNeverConsumesAndCanComeBack(t *testing.T) {
	t.Parallel()
	env := redistest.Open(t)
	keys := adapters.KeySpace{Prefix: env.Prefix}
	client := redistest.Client(t, env.URL)
	h := &harness{t: t, keys: keys, client: client}
	for i := range 5 {
		h.add("e"+strconv.Itoa(i), 1)
	}
	p := newFaulty("p", nil)
	v2Closed := &atomic.Int32{}
	newSub := func(group string, start func(ctx context.Context, stream string) (string, error)) (message.Subscriber, error) {
		s, err := adapters.Subscribers{NewClient: func() (redis.UniversalClient, error) {
			return redistest.Client(t, env.URL), nil
		}, Consumer: "c1", BatchSize: 50, MaxInFlight: 100, BlockTime: 50 * time.Millisecond, Logger: watermill.NopLogger{}}.New(group, start)
		if err != nil || group != "p.v2" {
			return s, err
		}
		return closeCounting{s, v2Closed}, nil
	}
	newRouter := func() *ports.ProjectionRouter {
		r, err := ports.NewProjectionRouter(ports.ProjectionRouterConfig{
			Projections: []projection.Projection{p}, Backend: adapters.NewProjectorBackend(client, keys), Applier: testApplier(t, client, keys),
			NewSubscriber: newSub,
			Retry:         ports.DefaultRetryPolicy(), CloseTimeout: 5 * time.Second, Logger: slog.New(slog.DiscardHandler),
		})
		require.NoError(t, err)
		return r
	}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	count := func(version int) int64 {
		n, _ := client.HGet(ctx, keys.ProjectionKey("p", version, "all", "stats"), "count").Int64()
		return n
	}
	v1 := []ops.ProjectionTarget{{Projection: p, Version: 1}}
	both := []ops.ProjectionTarget{{Projection: p, Version: 1}, {Projection: p, Version: 2}}
	// A first run of v1 alone: the live group delivers e0-e4.
	first := newRouter()
	_, _, err := first.SetTargets(ctx, v1)
	require.NoError(t, err)
	firstCtx, stopFirst := context.WithCancel(ctx)
	firstErr := make(chan error, 1)
	go func() { firstErr <- first.Run(firstCtx) }()
	require.Eventually(t, func() bool { return count(1) == 5 }, 10*time.Second, 20*time.Millisecond)
	stopFirst()
	require.NoError(t, <-firstErr)

	// The next start: v2 (a rebuild) joins at the stream's end with an own group to backfill
	// e0-e4, and is dropped again before Run (the registry said otherwise a moment later).
	r := newRouter()
	added, _, err := r.SetTargets(ctx, both)
	require.NoError(t, err)
	require.Equal(t, []string{"live", "p.v2"}, added)
	_, removed, err := r.SetTargets(ctx, v1)
	require.NoError(t, err)
	require.Equal(t, []string{"p.v2"}, removed)

	runErr := make(chan error, 1)
	go func() { runErr <- r.Run(ctx) }()
	require.Eventually(t, r.Running, 10*time.Second, 10*time.Millisecond)
	time.Sleep(500 * time.Millisecond) // a handler left running would have backfilled v2 by now
	require.Zero(t, count(2), "the dropped handler consumed its group")
	assert.Equal(t, int32(1), v2Closed.Load(), "the dropped handler's subscriber is closed (the stock one holds a client)")

	added, _, err = r.SetTargets(ctx, both)
	require.NoError(t, err)
	assert.Equal(t, []string{"p.v2"}, added)
	require.Eventually(t, func() bool { return count(2) == 5 }, 10*time.Second, 20*time.Millisecond, "v2 backfills once wanted again")
	h.add("e5", 1)
	require.Eventually(t, func() bool { return count(1) == 6 && count(2) == 6 }, 10*time.Second, 20*time.Millisecond)
	cancel()
	select {
	case err := <-runErr:
		require.NoError(t, err)
	case <-time.After(20 * time.Second):
		t.Fatal("the router did not stop")
	}
}
