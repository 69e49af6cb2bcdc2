package adapters_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/checkins/checkins/adapters"
	"github.com/checkins/checkins/adapters/redistest"
	"github.com/checkins/checkins/app/command"
	"github.com/checkins/checkins/domain"
)

// cmdEnv is RecordCheckinHandler wired to real adapters on a private redis-server.
type cmdEnv struct {
	srv     *redistest.Server
	client  *redis.Client // for the test's own checks
	keys    adapters.KeySpace
	idem    *adapters.IdempotencyStore
	pub     *adapters.EventPublisher
	handler *command.RecordCheckinHandler
	clock   *stepClock
}

// stepClock moves one second per reading, so anything computed from "now" twice differs.
type stepClock struct {
	base time.Time
	n    atomic.Int64
}

func (c *stepClock) Now() time.Time { return c.base.Add(time.Duration(c.n.Add(1)) * time.Second) }

func newCmdEnv(t *testing.T, wrap func(command.EventPublisher) command.EventPublisher) *cmdEnv {
	t.Helper()
	srv := redistest.Start(t, redistest.Options{AppendOnly: true})
	e := &cmdEnv{srv: srv, client: redistest.Client(t, srv.URL()), keys: adapters.KeySpace{Prefix: "checkins"},
		clock: &stepClock{base: time.Now().Add(-time.Hour)}}
	newClient := func() *redis.Client {
		c, err := adapters.NewRedisClient(adapters.ClientOptions{URL: srv.URL(), DialTimeout: 500 * time.Millisecond,
			ReadTimeout: time.Second, WriteTimeout: time.Second})
		require.NoError(t, err)
		return c
	}
	appClient := newClient()
	t.Cleanup(func() { _ = appClient.Close() })
	e.idem = adapters.NewIdempotencyStore(appClient, e.keys, time.Hour)
	var err error
	e.pub, err = adapters.NewEventPublisher(newClient(), e.keys, watermill.NopLogger{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = e.pub.Close() })
	var pub command.EventPublisher = e.pub
	if wrap != nil {
		pub = wrap(pub)
	}
	e.handler, err = command.NewRecordCheckinHandler(pub, e.idem, e.clock.Now, uuid.NewString,
		slog.New(slog.NewTextHandler(io.Discard, nil)))
	require.NoError(t, err)
	return e
}

// waitMarked waits until the handler's mark of user's checkinId id as published has landed. The
// request answers before its mark is written; a retry before then waits for the reservation,
// and the step clock ages it a second per reading, so after a few polls (milliseconds of real
// time, where a service waits the 5s takeover age) the retry would take it over and publish
// again: a test of what a retry does after the mark waits for the mark first.
func (e *cmdEnv) waitMarked(t testing.TB, user int64, id string) {
	t.Helper()
	key := e.keys.Idempotency(user, id)
	require.Eventually(t, func() bool {
		v, err := e.client.Get(context.Background(), key).Result()
		return err == nil && strings.HasPrefix(v, "P")
	}, 10*time.Second, time.Millisecond, "%s marked published", key)
}

func (e *cmdEnv) xlen(t testing.TB) int64 {
	t.Helper()
	n, err := e.client.XLen(context.Background(), e.keys.Stream()).Result()
	require.NoError(t, err)
	return n
}

func (e *cmdEnv) entries(t testing.TB) []redis.XMessage {
	t.Helper()
	xs, err := e.client.XRange(context.Background(), e.keys.Stream(), "-", "+").Result()
	require.NoError(t, err)
	return xs
}

func input(id *string, user, loc, stars int64, ts *int64) domain.CheckinInput {
	return domain.CheckinInput{CheckinID: id, UserID: &user, LocationID: &loc, StarRating: &stars, Timestamp: ts}
}

func ptr[T any](v T) *T { return &v }

func TestRecordCheckinPublishesOnceAndRetriesAreIdempotent(t *testing.T) {
	t.Parallel()
	e := newCmdEnv(t, nil)
	ctx := context.Background()
	cmd := command.RecordCheckin{Input: input(ptr("ck-1"), 42, 7, 4, nil), CorrelationID: "corr-9"}

	first, err := e.handler.Handle(ctx, cmd)
	require.NoError(t, err)
	assert.False(t, first.Replayed)
	assert.Equal(t, "ck-1", first.Checkin.ID)
	require.Equal(t, int64(1), e.xlen(t))
	entry := e.entries(t)[0].Values
	assert.Equal(t, "ck-1", entry["checkinId"])
	assert.Equal(t, "42", entry["userId"])
	assert.Equal(t, strconv.FormatInt(first.Checkin.Timestamp, 10), entry["timestamp"])
	assert.Equal(t, "corr-9", entry["meta:correlation_id"])

	// The client omitted the timestamp; the clock has moved on, yet a retry answers the original.
	e.waitMarked(t, 42, "ck-1")
	for range 3 {
		again, err := e.handler.Handle(ctx, cmd)
		require.NoError(t, err)
		assert.True(t, again.Replayed)
		assert.Equal(t, first.Checkin, again.Checkin)
	}
	assert.Equal(t, int64(1), e.xlen(t), "a retry must not grow the stream")
}

func TestRecordCheckinGeneratesID(t *testing.T) {
	t.Parallel()
	e := newCmdEnv(t, nil)
	ctx := context.Background()
	a, err := e.handler.Handle(ctx, command.RecordCheckin{Input: input(nil, 1, 2, 3, nil)})
	require.NoError(t, err)
	b, err := e.handler.Handle(ctx, command.RecordCheckin{Input: input(nil, 1, 2, 3, nil)})
	require.NoError(t, err)
	require.NoError(t, uuid.Validate(a.Checkin.ID))
	assert.NotEqual(t, a.Checkin.ID, b.Checkin.ID, "without a checkinId every request is a new check-in")
	assert.Equal(t, int64(2), e.xlen(t))
}

func TestRecordCheckinConflict(t *testing.T) {
	t.Parallel()
	e := newCmdEnv(t, nil)
	ctx := context.Background()
	ts := e.clock.base.UnixMilli()
	_, err := e.handler.Handle(ctx, command.RecordCheckin{Input: input(ptr("ck-2"), 42, 7, 4, &ts)})
	require.NoError(t, err)

	for name, in := range map[string]domain.CheckinInput{
		"other stars":          input(ptr("ck-2"), 42, 7, 5, &ts),
		"other location":       input(ptr("ck-2"), 42, 8, 4, &ts),
		"other timestamp":      input(ptr("ck-2"), 42, 7, 4, ptr(ts+1)),
		"timestamp now absent": input(ptr("ck-2"), 42, 7, 4, nil),
	} {
		_, err := e.handler.Handle(ctx, command.RecordCheckin{Input: in})
		assert.ErrorIs(t, err, domain.ErrConflict, name)
	}
	assert.Equal(t, int64(1), e.xlen(t))

	// checkinIds are scoped by user: another user's ck-2 is another check-in, not a conflict.
	res, err := e.handler.Handle(ctx, command.RecordCheckin{Input: input(ptr("ck-2"), 43, 7, 4, &ts)})
	require.NoError(t, err)
	assert.False(t, res.Replayed)
	assert.Equal(t, int64(2), e.xlen(t))
}

func TestRecordCheckinInvalidWritesNothing(t *testing.T) {
	t.Parallel()
	e := newCmdEnv(t, nil)
	_, err := e.handler.Handle(context.Background(), command.RecordCheckin{Input: input(ptr("ck-3"), 0, 7, 4, nil)})
	var ve *domain.ValidationError
	require.ErrorAs(t, err, &ve)
	assert.Equal(t, "userId", ve.Field)
	assert.Equal(t, int64(0), e.xlen(t))
	n, err := e.client.Exists(context.Background(), e.keys.Idempotency(0, "ck-3"), e.keys.LegacyIdempotency("ck-3")).Result()
	require.NoError(t, err)
	assert.Zero(t, n, "nothing reserved for an invalid check-in")
}

func TestRecordCheckinPublishesUnpublishedReservation(t *testing.T) {
	t.Parallel()
	e := newCmdEnv(t, nil)
	ctx := context.Background()
	in := input(ptr("ck-4"), 5, 6, 2, nil)
	// An earlier attempt reserved the ID and died before XADD.
	orig := domain.Checkin{ID: "ck-4", UserID: 5, LocationID: 6, StarRating: 2, Timestamp: e.clock.base.UnixMilli() - 5000}
	existing, err := e.idem.Reserve(ctx, command.IdempotencyRecord{Fingerprint: in.Fingerprint(), Checkin: orig, RecordedAt: orig.Timestamp + 10})
	require.NoError(t, err)
	require.Nil(t, existing)
	require.Equal(t, int64(0), e.xlen(t))

	res, err := e.handler.Handle(ctx, command.RecordCheckin{Input: in})
	require.NoError(t, err)
	assert.Equal(t, orig, res.Checkin, "the original check-in, not a new timestamp")
	require.Equal(t, int64(1), e.xlen(t))
	entry := e.entries(t)[0].Values
	assert.Equal(t, strconv.FormatInt(orig.Timestamp, 10), entry["timestamp"])
	assert.Equal(t, strconv.FormatInt(orig.Timestamp+10, 10), entry["recordedAt"])

	e.waitMarked(t, 5, "ck-4")
	_, err = e.handler.Handle(ctx, command.RecordCheckin{Input: in})
	require.NoError(t, err)
	assert.Equal(t, int64(1), e.xlen(t), "once published, a retry does not publish again")
}

// flakyPublisher fails its first n publishes with err, like Redis dropping the connection
// mid-request ("connection reset": whether the XADD landed is unknown).
type flakyPublisher struct {
	inner command.EventPublisher
	fails atomic.Int64
	err   error
}

func (p *flakyPublisher) PublishCheckinRecorded(ctx context.Context, e domain.CheckinRecorded, corr string) error {
	if p.fails.Add(-1) >= 0 {
		if p.err != nil {
			return p.err
		}
		return errors.New("connection reset")
	}
	return p.inner.PublishCheckinRecorded(ctx, e, corr)
}

func TestRecordCheckinPublishFailureIsRetried(t *testing.T) {
	t.Parallel()
	flaky := &flakyPublisher{}
	flaky.fails.Store(1)
	e := newCmdEnv(t, func(p command.EventPublisher) command.EventPublisher { flaky.inner = p; return flaky })
	ctx := context.Background()
	cmd := command.RecordCheckin{Input: input(ptr("ck-5"), 1, 1, 1, nil)}
	_, err := e.handler.Handle(ctx, cmd)
	require.ErrorIs(t, err, domain.ErrUnavailable)
	assert.Equal(t, int64(0), e.xlen(t))
	// The event may have been stored: the reservation stays. The retry takes it over once it is
	// older than the takeover age (the step clock ages it a second per reading) and publishes
	// the original check-in.
	orig, err := e.idem.Reserve(ctx, command.IdempotencyRecord{Checkin: domain.Checkin{ID: "ck-5", UserID: 1}})
	require.NoError(t, err)
	require.NotNil(t, orig, "not released")
	require.False(t, orig.Published)

	res, err := e.handler.Handle(ctx, cmd)
	require.NoError(t, err)
	assert.Equal(t, orig.Checkin, res.Checkin)
	assert.Equal(t, int64(1), e.xlen(t))
	assert.Equal(t, strconv.FormatInt(res.Checkin.Timestamp, 10), e.entries(t)[0].Values["timestamp"])
}

func TestRecordCheckinRefusedPublishReleasesTheCheckinID(t *testing.T) {
	t.Parallel()
	flaky := &flakyPublisher{err: fmt.Errorf("%w: %w", command.ErrNotPublished, adapters.ErrPipelineClosed)}
	flaky.fails.Store(1)
	e := newCmdEnv(t, func(p command.EventPublisher) command.EventPublisher { flaky.inner = p; return flaky })
	ctx := context.Background()
	_, err := e.handler.Handle(ctx, command.RecordCheckin{Input: input(ptr("ck-10"), 1, 1, 1, nil)})
	require.ErrorIs(t, err, domain.ErrUnavailable)
	n, err := e.client.Exists(ctx, e.keys.Idempotency(1, "ck-10")).Result()
	require.NoError(t, err)
	assert.Zero(t, n, "nothing was sent: the reservation is released")

	res, err := e.handler.Handle(ctx, command.RecordCheckin{Input: input(ptr("ck-10"), 1, 1, 5, nil)})
	require.NoError(t, err, "the checkinId is free, even for another body")
	assert.False(t, res.Replayed)
	assert.Equal(t, 5, res.Checkin.StarRating)
	assert.Equal(t, int64(1), e.xlen(t))
}

func TestEventPublisherReportsWhatWasNotSent(t *testing.T) {
	t.Parallel()
	e := newCmdEnv(t, nil)
	ev := domain.CheckinRecorded{Checkin: domain.Checkin{ID: "ck-11", UserID: 1, LocationID: 1, Timestamp: 1}, RecordedAt: 2}

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	assert.ErrorIs(t, e.pub.PublishCheckinRecorded(ctx, ev, ""), command.ErrNotPublished, "context ended before the XADD")

	pipeClient := redistest.Client(t, e.srv.URL())
	p := adapters.NewAutoPipeline(pipeClient, 8, 1)
	pubClient := redistest.Client(t, e.srv.URL())
	pubClient.AddHook(p.Hook())
	pub, err := adapters.NewEventPublisher(pubClient, e.keys, watermill.NopLogger{})
	require.NoError(t, err)
	require.NoError(t, p.Close())
	assert.ErrorIs(t, pub.PublishCheckinRecorded(context.Background(), ev, ""), command.ErrNotPublished, "pipeline closed")
	assert.Equal(t, int64(0), e.xlen(t))

	// Once the XADD is on its way, a failure says nothing about whether it landed.
	e.srv.Kill()
	err = e.pub.PublishCheckinRecorded(context.Background(), ev, "")
	require.Error(t, err)
	assert.NotErrorIs(t, err, command.ErrNotPublished)
}

// gatedPublisher holds every publish until gate is closed.
type gatedPublisher struct {
	inner   command.EventPublisher
	gate    chan struct{}
	entered atomic.Int64
}

func (p *gatedPublisher) PublishCheckinRecorded(ctx context.Context, e domain.CheckinRecorded, corr string) error {
	p.entered.Add(1)
	<-p.gate
	return p.inner.PublishCheckinRecorded(ctx, e, corr)
}

// newProcess is another `checkins api` process on the env's server, wired as cmd/ wires one:
// clients of its own, one auto-pipeline for reservations and XADDs, the real clock.
func (e *cmdEnv) newProcess(t *testing.T, takeoverAge time.Duration, wrap func(command.EventPublisher) command.EventPublisher) *command.RecordCheckinHandler {
	t.Helper()
	newClient := func() *redis.Client {
		c, err := adapters.NewRedisClient(adapters.ClientOptions{URL: e.srv.URL(), DialTimeout: 500 * time.Millisecond,
			ReadTimeout: time.Second, WriteTimeout: time.Second})
		require.NoError(t, err)
		return c
	}
	appClient, pipeClient, pubClient := newClient(), newClient(), newClient()
	t.Cleanup(func() { _ = appClient.Close(); _ = pipeClient.Close() })
	p := adapters.NewAutoPipeline(pipeClient, 256, 2)
	t.Cleanup(func() { _ = p.Close() })
	pubClient.AddHook(p.Hook())
	pub, err := adapters.NewEventPublisher(pubClient, e.keys, watermill.NopLogger{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = pub.Close() })
	var cp command.EventPublisher = pub
	if wrap != nil {
		cp = wrap(pub)
	}
	h, err := command.NewRecordCheckinHandler(cp, adapters.NewIdempotencyStore(appClient, e.keys, time.Hour).WithAutoPipeline(p),
		time.Now, uuid.NewString, slog.New(slog.NewTextHandler(io.Discard, nil)))
	require.NoError(t, err)
	return h.WithTakeoverAge(takeoverAge)
}

// setCalls counts the SET commands the server ran (reservations and their polls).
func (e *cmdEnv) setCalls(t testing.TB) int {
	t.Helper()
	return redistest.CommandCalls(t, e.client, "set")
}

type handled struct {
	res command.RecordCheckinResult
	err error
}

func handleAll(ctx context.Context, h *command.RecordCheckinHandler, cmd command.RecordCheckin, n int) <-chan handled {
	out := make(chan handled, n)
	for range n {
		go func() {
			res, err := h.Handle(ctx, cmd)
			out <- handled{res, err}
		}()
	}
	return out
}

func TestRecordCheckinTwoProcessesPublishOnce(t *testing.T) {
	t.Parallel()
	e := newCmdEnv(t, nil)
	gate := &gatedPublisher{gate: make(chan struct{})}
	a := e.newProcess(t, 0, func(p command.EventPublisher) command.EventPublisher { gate.inner = p; return gate })
	b := e.newProcess(t, 0, nil)
	ctx := context.Background()
	ts := time.Now().Add(-time.Minute).UnixMilli()
	cmd := command.RecordCheckin{Input: input(ptr("ck-12"), 3, 4, 5, &ts)}

	first := handleAll(ctx, a, cmd, 1)
	require.Eventually(t, func() bool { return gate.entered.Load() == 1 }, 5*time.Second, time.Millisecond, "A reserved and publishes")
	sets := e.setCalls(t)
	others := handleAll(ctx, b, cmd, 25)
	require.Eventually(t, func() bool { return e.setCalls(t) >= sets+3 }, 5*time.Second, time.Millisecond, "B waits, polling")
	close(gate.gate)

	r := <-first
	require.NoError(t, r.err)
	assert.False(t, r.res.Replayed)
	for range 25 {
		o := <-others
		require.NoError(t, o.err)
		assert.True(t, o.res.Replayed)
		assert.Equal(t, r.res.Checkin, o.res.Checkin)
	}
	assert.Equal(t, int64(1), e.xlen(t), "exactly one XADD")
}

func TestRecordCheckinTakesOverAnAbandonedReservation(t *testing.T) {
	t.Parallel()
	e := newCmdEnv(t, nil)
	ctx := context.Background()
	now := time.Now().UnixMilli()
	// Owners that died between reserving and publishing: one of this format, one of the
	// format before owners (a state byte and the check-in as JSON).
	in := input(ptr("ck-13"), 5, 6, 2, nil)
	dead := command.IdempotencyRecord{Fingerprint: in.Fingerprint(), RecordedAt: now - 10, Owner: "dead", ReservedAt: now,
		Checkin: domain.Checkin{ID: "ck-13", UserID: 5, LocationID: 6, StarRating: 2, Timestamp: now - 20}}
	got, err := e.idem.Reserve(ctx, dead)
	require.NoError(t, err)
	require.Nil(t, got)
	oldIn := input(ptr("ck-14"), 5, 6, 3, nil)
	old := fmt.Sprintf(`R{"f":%q,"id":"ck-14","u":5,"l":6,"s":3,"t":%d,"r":%d}`, oldIn.Fingerprint(), now-20, now)
	require.NoError(t, e.client.Set(ctx, e.keys.Idempotency(5, "ck-14"), old, time.Hour).Err())

	// Three processes, several requests each, all waiting for the takeover age.
	const takeoverAge = 200 * time.Millisecond
	var outs []<-chan handled
	for range 3 {
		p := e.newProcess(t, takeoverAge, nil)
		outs = append(outs, handleAll(ctx, p, command.RecordCheckin{Input: in}, 4), handleAll(ctx, p, command.RecordCheckin{Input: oldIn}, 4))
	}
	for i, out := range outs {
		for range 4 {
			o := <-out
			require.NoError(t, o.err)
			assert.True(t, o.res.Replayed)
			if i%2 == 0 {
				assert.Equal(t, dead.Checkin, o.res.Checkin, "the original check-in")
			} else {
				assert.Equal(t, now-20, o.res.Checkin.Timestamp, "the original check-in")
			}
		}
	}
	entries := e.entries(t)
	require.Len(t, entries, 2, "each taken over and published exactly once")
	byID := map[string]map[string]any{}
	for _, x := range entries {
		byID[x.Values["checkinId"].(string)] = x.Values
	}
	assert.Equal(t, strconv.FormatInt(now-20, 10), byID["ck-13"]["timestamp"])
	assert.Equal(t, strconv.FormatInt(now-10, 10), byID["ck-13"]["recordedAt"])
	assert.Equal(t, strconv.FormatInt(now, 10), byID["ck-14"]["recordedAt"])
}

func TestRecordCheckinWaiterWhoseContextEndsIsUnavailable(t *testing.T) {
	t.Parallel()
	e := newCmdEnv(t, nil)
	p := e.newProcess(t, 0, nil)
	in := input(ptr("ck-15"), 5, 6, 2, nil)
	now := time.Now().UnixMilli()
	slow := command.IdempotencyRecord{Fingerprint: in.Fingerprint(), RecordedAt: now, Owner: "slow", ReservedAt: now,
		Checkin: domain.Checkin{ID: "ck-15", UserID: 5, LocationID: 6, StarRating: 2, Timestamp: now}}
	_, err := e.idem.Reserve(context.Background(), slow)
	require.NoError(t, err)

	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	_, err = p.Handle(ctx, command.RecordCheckin{Input: in})
	require.ErrorIs(t, err, domain.ErrUnavailable)
	assert.ErrorIs(t, err, context.DeadlineExceeded)
	got, err := e.idem.Reserve(context.Background(), slow)
	require.NoError(t, err)
	assert.Equal(t, slow, *got, "the reservation is left to its owner")
	assert.Equal(t, int64(0), e.xlen(t))
}

func TestRecordCheckinRedisDown(t *testing.T) {
	t.Parallel()
	e := newCmdEnv(t, nil)
	ctx := context.Background()
	_, err := e.handler.Handle(ctx, command.RecordCheckin{Input: input(ptr("ck-6"), 1, 1, 1, nil)})
	require.NoError(t, err)
	e.srv.Kill()

	// The deadline is far away: the handler must fail by itself, not by running out of time.
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for _, id := range []string{"ck-6", "ck-7"} {
		_, err = e.handler.Handle(ctx, command.RecordCheckin{Input: input(ptr(id), 1, 1, 1, nil)})
		require.Error(t, err)
		assert.ErrorIs(t, err, domain.ErrUnavailable, id)
		assert.NoError(t, ctx.Err(), "the handler waited for the request deadline instead of failing fast")
	}
}

// idemStores are the store as the tests use it and as the service wires it (auto-pipelined).
func idemStores(t *testing.T, env projEnv) map[string]*adapters.IdempotencyStore {
	t.Helper()
	pipeClient := redistest.Client(t, env.url)
	p := adapters.NewAutoPipeline(pipeClient, 64, 1)
	t.Cleanup(func() { _ = p.Close() })
	return map[string]*adapters.IdempotencyStore{
		"plain":     adapters.NewIdempotencyStore(env.client, env.with("plain").keys, time.Hour),
		"pipelined": adapters.NewIdempotencyStore(env.client, env.with("pipelined").keys, time.Hour).WithAutoPipeline(p),
	}
}

func TestIdempotencyStore(t *testing.T) {
	t.Parallel()
	env := newProjEnv(t)
	for name, store := range idemStores(t, env) {
		t.Run(name, func(t *testing.T) {
			keys := env.with(name).keys
			ctx := context.Background()
			rec := command.IdempotencyRecord{Fingerprint: "fp", RecordedAt: 11, Owner: "owner-1", ReservedAt: 11,
				Checkin: domain.Checkin{ID: "ck-8", UserID: 1, LocationID: 2, StarRating: 3, Timestamp: 10}}

			got, err := store.Reserve(ctx, rec)
			require.NoError(t, err)
			assert.Nil(t, got, "first reservation stores")

			other := rec
			other.Fingerprint, other.Checkin.StarRating, other.RecordedAt, other.Owner = "other", 5, 99, "owner-2"
			got, err = store.Reserve(ctx, other)
			require.NoError(t, err)
			require.NotNil(t, got)
			assert.Equal(t, rec, *got, "the existing record comes back unchanged")

			require.NoError(t, store.MarkPublished(ctx, rec))
			got, err = store.Reserve(ctx, rec)
			require.NoError(t, err)
			require.NotNil(t, got)
			assert.True(t, got.Published)
			assert.Empty(t, got.Owner, "a published record has no owner")
			ttl, err := env.client.PTTL(ctx, keys.Idempotency(1, "ck-8")).Result()
			require.NoError(t, err)
			assert.Greater(t, ttl, time.Duration(0), "MarkPublished keeps the TTL")

			never := rec
			never.Checkin.ID = "never-reserved"
			require.NoError(t, store.MarkPublished(ctx, never))
			n, err := env.client.Exists(ctx, keys.Idempotency(1, "never-reserved")).Result()
			require.NoError(t, err)
			assert.Zero(t, n, "MarkPublished must not create a record")

			require.NoError(t, env.client.Set(ctx, keys.Idempotency(1, "corrupt"), "{not json", 0).Err())
			rec.Checkin.ID = "corrupt"
			_, err = store.Reserve(ctx, rec)
			assert.ErrorContains(t, err, "corrupt")
		})
	}
}

// Records written before reservations had owners are a state byte and this JSON.
func TestIdempotencyStoreReadsOldRecords(t *testing.T) {
	t.Parallel()
	env := newProjEnv(t)
	ctx := context.Background()
	store := adapters.NewIdempotencyStore(env.client, env.keys, time.Hour)
	const old = `{"f":"fp","id":"%s","u":1,"l":2,"s":3,"t":10,"r":11}`
	want := command.IdempotencyRecord{Fingerprint: "fp", RecordedAt: 11, ReservedAt: 11,
		Checkin: domain.Checkin{UserID: 1, LocationID: 2, StarRating: 3, Timestamp: 10}}
	for _, state := range []string{"R", "P"} {
		id := "old-" + state
		require.NoError(t, env.client.Set(ctx, env.keys.Idempotency(1, id), state+fmt.Sprintf(old, id), time.Hour).Err())
		w := want
		w.Checkin.ID, w.Published = id, state == "P"
		got, err := store.Reserve(ctx, command.IdempotencyRecord{Fingerprint: "new", Owner: "o", Checkin: domain.Checkin{ID: id, UserID: 1}})
		require.NoError(t, err)
		require.NotNil(t, got)
		assert.Equal(t, w, *got, "an old record reads as reserved at its RecordedAt, by no owner")
	}

	// An old reservation can be taken over like any other.
	seen, err := store.Reserve(ctx, command.IdempotencyRecord{Checkin: domain.Checkin{ID: "old-R", UserID: 1}})
	require.NoError(t, err)
	next := *seen
	next.Owner, next.ReservedAt = "taker", 500
	taken, cur, err := store.TakeOver(ctx, *seen, next)
	require.NoError(t, err)
	assert.True(t, taken)
	assert.Nil(t, cur)
	got, err := store.Reserve(ctx, command.IdempotencyRecord{Checkin: domain.Checkin{ID: "old-R", UserID: 1}})
	require.NoError(t, err)
	assert.Equal(t, next, *got)
}

func TestIdempotencyStoreTakeOver(t *testing.T) {
	t.Parallel()
	env := newProjEnv(t)
	for name, store := range idemStores(t, env) {
		t.Run(name, func(t *testing.T) {
			keys := env.with(name).keys
			ctx := context.Background()
			dead := command.IdempotencyRecord{Fingerprint: "fp", RecordedAt: 11, Owner: "dead", ReservedAt: 11,
				Checkin: domain.Checkin{ID: "ck-t", UserID: 1, LocationID: 2, StarRating: 3, Timestamp: 10}}
			got, err := store.Reserve(ctx, dead)
			require.NoError(t, err)
			require.Nil(t, got)

			// Many takers at once: one wins, the others see the winner's reservation.
			const takers = 20
			type result struct {
				next    command.IdempotencyRecord
				taken   bool
				current *command.IdempotencyRecord
				err     error
			}
			results := make(chan result, takers)
			start := make(chan struct{})
			for i := range takers {
				go func() {
					next := dead
					next.Owner, next.ReservedAt = fmt.Sprintf("taker-%d", i), int64(100+i)
					<-start
					taken, cur, err := store.TakeOver(ctx, dead, next)
					results <- result{next, taken, cur, err}
				}()
			}
			close(start)
			var winner *command.IdempotencyRecord
			var losers []*command.IdempotencyRecord
			for range takers {
				r := <-results
				require.NoError(t, r.err)
				if r.taken {
					require.Nil(t, winner, "two takers won")
					winner = &r.next
					assert.Nil(t, r.current)
				} else {
					losers = append(losers, r.current)
				}
			}
			require.NotNil(t, winner)
			for _, l := range losers {
				assert.Equal(t, winner, l, "a loser sees the winner's reservation")
			}
			got, err = store.Reserve(ctx, dead)
			require.NoError(t, err)
			assert.Equal(t, *winner, *got)
			ttl, err := env.client.PTTL(ctx, keys.Idempotency(1, "ck-t")).Result()
			require.NoError(t, err)
			assert.Greater(t, ttl, time.Duration(0), "TakeOver keeps the TTL")

			// Published, a record is not taken over; gone, there is nothing to take.
			require.NoError(t, store.MarkPublished(ctx, *winner))
			taken, cur, err := store.TakeOver(ctx, *winner, dead)
			require.NoError(t, err)
			assert.False(t, taken)
			require.NotNil(t, cur)
			assert.True(t, cur.Published)
			gone := dead
			gone.Checkin.ID = "gone"
			taken, cur, err = store.TakeOver(ctx, gone, gone)
			require.NoError(t, err)
			assert.False(t, taken)
			assert.Nil(t, cur)
			n, err := env.client.Exists(ctx, keys.Idempotency(1, "gone")).Result()
			require.NoError(t, err)
			assert.Zero(t, n, "TakeOver creates nothing")
		})
	}
}

func TestIdempotencyStoreRelease(t *testing.T) {
	t.Parallel()
	env := newProjEnv(t)
	for name, store := range idemStores(t, env) {
		t.Run(name, func(t *testing.T) {
			keys := env.with(name).keys
			ctx := context.Background()
			exists := func(id string) bool {
				n, err := env.client.Exists(ctx, keys.Idempotency(1, id)).Result()
				require.NoError(t, err)
				return n == 1
			}
			mine := command.IdempotencyRecord{Fingerprint: "fp", RecordedAt: 11, Owner: "me", ReservedAt: 12,
				Checkin: domain.Checkin{ID: "ck-r", UserID: 1, LocationID: 2, StarRating: 3, Timestamp: 10}}

			_, err := store.Reserve(ctx, mine)
			require.NoError(t, err)
			require.NoError(t, store.Release(ctx, mine))
			assert.False(t, exists("ck-r"), "my own reservation is released")

			// Taken over: no longer mine.
			_, err = store.Reserve(ctx, mine)
			require.NoError(t, err)
			theirs := mine
			theirs.Owner, theirs.ReservedAt = "taker", 99
			taken, _, err := store.TakeOver(ctx, mine, theirs)
			require.NoError(t, err)
			require.True(t, taken)
			require.NoError(t, store.Release(ctx, mine))
			assert.True(t, exists("ck-r"), "another owner's reservation stays")

			// Published: the check-in is on the stream, the record must stay.
			require.NoError(t, store.MarkPublished(ctx, theirs))
			require.NoError(t, store.Release(ctx, theirs))
			assert.True(t, exists("ck-r"), "a published record stays")
		})
	}
}

// TestIdempotencyStoreScopesByUser: one checkinId is one record per user, so a user can neither
// replay nor block another user's check-in.
func TestIdempotencyStoreScopesByUser(t *testing.T) {
	t.Parallel()
	env := newProjEnv(t)
	for name, store := range idemStores(t, env) {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			a := command.IdempotencyRecord{Fingerprint: "fa", RecordedAt: 11, Owner: "a", ReservedAt: 11,
				Checkin: domain.Checkin{ID: "shared", UserID: 1, LocationID: 2, StarRating: 3, Timestamp: 10}}
			b := a
			b.Fingerprint, b.Owner, b.Checkin.UserID = "fb", "b", 2
			got, err := store.Reserve(ctx, a)
			require.NoError(t, err)
			require.Nil(t, got)
			got, err = store.Reserve(ctx, b)
			require.NoError(t, err)
			assert.Nil(t, got, "another user's checkinId is not this user's")
			require.NoError(t, store.MarkPublished(ctx, a))
			got, err = store.Reserve(ctx, b)
			require.NoError(t, err)
			require.NotNil(t, got)
			assert.Equal(t, "fb", got.Fingerprint, "user 2 sees only its own record")
		})
	}
}

// TestIdempotencyStoreAnswersFromLegacyRecords: records written before keys were scoped by user
// (one key per checkinId) still decide for their own user, within IDEMPOTENCY_TTL of the first
// start with scoped keys: a retry replays, another body conflicts; another user is not bound by
// them. A fresh keyspace (no event stream) never looks for them.
func TestIdempotencyStoreAnswersFromLegacyRecords(t *testing.T) {
	t.Parallel()
	env := newProjEnv(t)
	ctx := context.Background()
	const old = `P{"f":"fp-old","id":"%s","u":7,"l":2,"s":3,"t":10,"r":11}`
	upgraded := env.with("upgraded")
	// A deployment of the earlier version: an event stream and a legacy record of user 7.
	require.NoError(t, env.client.XAdd(ctx, &redis.XAddArgs{Stream: upgraded.keys.Stream(), Values: map[string]any{"x": "y"}}).Err())
	require.NoError(t, env.client.Set(ctx, upgraded.keys.LegacyIdempotency("c-old"), fmt.Sprintf(old, "c-old"), time.Hour).Err())
	store := adapters.NewIdempotencyStore(env.client, upgraded.keys, 2*time.Hour)

	other := command.IdempotencyRecord{Fingerprint: "fp-other", Owner: "o", Checkin: domain.Checkin{ID: "c-old", UserID: 8}}
	got, err := store.Reserve(ctx, other)
	require.NoError(t, err)
	assert.Nil(t, got, "another user's legacy record does not bind user 8")

	mine := command.IdempotencyRecord{Fingerprint: "fp-new", Owner: "o", Checkin: domain.Checkin{ID: "c-old", UserID: 7}}
	got, err = store.Reserve(ctx, mine)
	require.NoError(t, err)
	require.NotNil(t, got, "user 7's legacy record answers")
	assert.True(t, got.Published)
	assert.Equal(t, "fp-old", got.Fingerprint)
	ttl, err := env.client.PTTL(ctx, upgraded.keys.Idempotency(7, "c-old")).Result()
	require.NoError(t, err)
	assert.LessOrEqual(t, ttl, time.Hour, "copied with the legacy record's remaining TTL")
	assert.Greater(t, ttl, time.Duration(0))
	since, err := env.client.Get(ctx, upgraded.keys.IdempotencyScopedSince()).Int64()
	require.NoError(t, err)
	assert.InDelta(t, time.Now().UnixMilli(), since, float64(time.Minute.Milliseconds()))

	// A fresh keyspace marks that no legacy record can exist, and never reads one.
	fresh := env.with("fresh")
	require.NoError(t, env.client.Set(ctx, fresh.keys.LegacyIdempotency("c-old"), fmt.Sprintf(old, "c-old"), time.Hour).Err())
	fstore := adapters.NewIdempotencyStore(env.client, fresh.keys, 2*time.Hour)
	got, err = fstore.Reserve(ctx, mine)
	require.NoError(t, err)
	assert.Nil(t, got, "no event stream when scoped keys came: legacy keys are not looked up")
	v, err := env.client.Get(ctx, fresh.keys.IdempotencyScopedSince()).Result()
	require.NoError(t, err)
	assert.Equal(t, "0", v)

	// serve's projectors create the stream, empty, before the first check-in: still fresh.
	created := env.with("created")
	require.NoError(t, env.client.XGroupCreateMkStream(ctx, created.keys.Stream(), "live", "$").Err())
	require.NoError(t, env.client.Set(ctx, created.keys.LegacyIdempotency("c-old"), fmt.Sprintf(old, "c-old"), time.Hour).Err())
	got, err = adapters.NewIdempotencyStore(env.client, created.keys, 2*time.Hour).Reserve(ctx, mine)
	require.NoError(t, err)
	assert.Nil(t, got, "an empty stream that never held an entry: legacy keys are not looked up")
	v, err = env.client.Get(ctx, created.keys.IdempotencyScopedSince()).Result()
	require.NoError(t, err)
	assert.Equal(t, "0", v)

	// A stream trimmed to nothing still held entries once: an earlier version may have run.
	trimmed := env.with("trimmed")
	id, err := env.client.XAdd(ctx, &redis.XAddArgs{Stream: trimmed.keys.Stream(), Values: map[string]any{"x": "y"}}).Result()
	require.NoError(t, err)
	require.NoError(t, env.client.XDel(ctx, trimmed.keys.Stream(), id).Err())
	_, err = adapters.NewIdempotencyStore(env.client, trimmed.keys, 2*time.Hour).Reserve(ctx, other)
	require.NoError(t, err)
	since, err = env.client.Get(ctx, trimmed.keys.IdempotencyScopedSince()).Int64()
	require.NoError(t, err)
	assert.Positive(t, since, "a stream that held entries marks when scoped keys came")
}

// The hand-written record encoder writes what encoding/json writes, byte for byte: records in
// Redis are read back by json.Unmarshal and by the takeover script's cjson, and a release
// compares them byte for byte with what it encodes again.
func TestEncodeRecordIsEncodingJSON(t *testing.T) {
	t.Parallel()
	base := command.IdempotencyRecord{Fingerprint: "fp", RecordedAt: 1700000000123,
		Checkin: domain.Checkin{ID: "c-1", UserID: 42, LocationID: 7, StarRating: 4, Timestamp: 1609602085397}}
	for name, mod := range map[string]func(*command.IdempotencyRecord){
		"plain":             func(*command.IdempotencyRecord) {},
		"owner":             func(r *command.IdempotencyRecord) { r.Owner = "AbC-_x.1z" },
		"reserved later":    func(r *command.IdempotencyRecord) { r.Owner, r.ReservedAt = "o.2", r.RecordedAt+5000 },
		"reserved at zero":  func(r *command.IdempotencyRecord) { r.ReservedAt = 0 },
		"reserved same":     func(r *command.IdempotencyRecord) { r.ReservedAt = r.RecordedAt },
		"zeros":             func(r *command.IdempotencyRecord) { *r = command.IdempotencyRecord{} },
		"negative":          func(r *command.IdempotencyRecord) { r.Checkin.Timestamp, r.RecordedAt = -1, -2 },
		"escapes in the id": func(r *command.IdempotencyRecord) { r.Checkin.ID = "a\"b\\c\n\t<&>\u2028é" },
		"html characters":   func(r *command.IdempotencyRecord) { r.Checkin.ID, r.Owner, r.Fingerprint = "a<b", "&", ">" },
		"invalid utf-8":     func(r *command.IdempotencyRecord) { r.Checkin.ID, r.Owner = "a\xffb", "\x00" },
		"long fingerprint":  func(r *command.IdempotencyRecord) { r.Fingerprint = strings.Repeat("0123456789abcdef", 8) },
	} {
		rec := base
		mod(&rec)
		for _, state := range []byte{'R', 'P'} {
			want, err := adapters.EncodeRecordJSON(state, rec)
			require.NoError(t, err)
			got, err := adapters.EncodeRecord(state, rec)
			require.NoError(t, err)
			assert.Equal(t, string(want), string(got), "%s, state %c", name, state)
		}
	}
}

// MarkPublishedAll marks every reserved record of the batch published in one round trip, as
// MarkPublished would: the TTL kept, a record that does not exist (expired) not created.
func TestIdempotencyMarkPublishedAll(t *testing.T) {
	t.Parallel()
	e := newCmdEnv(t, nil)
	ctx := context.Background()
	rec := func(id string, user int64) command.IdempotencyRecord {
		return command.IdempotencyRecord{Fingerprint: "fp-" + id, RecordedAt: 1700000000000, ReservedAt: 1700000000000, Owner: "o.1",
			Checkin: domain.Checkin{ID: id, UserID: user, LocationID: 3, StarRating: 4, Timestamp: 1609602085397}}
	}
	a, b, gone := rec("a", 1), rec("b", 2), rec("gone", 3)
	for _, r := range []command.IdempotencyRecord{a, b} {
		existing, err := e.idem.Reserve(ctx, r)
		require.NoError(t, err)
		require.Nil(t, existing)
	}
	errs := e.idem.MarkPublishedAll(ctx, []command.IdempotencyRecord{a, gone, b})
	assert.Equal(t, []error{nil, nil, nil}, errs)
	for _, r := range []command.IdempotencyRecord{a, b} {
		got, err := e.idem.Reserve(ctx, r)
		require.NoError(t, err)
		require.NotNil(t, got)
		assert.True(t, got.Published, r.Checkin.ID)
		ttl, err := e.client.PTTL(ctx, e.keys.Idempotency(r.Checkin.UserID, r.Checkin.ID)).Result()
		require.NoError(t, err)
		assert.Positive(t, ttl, "the reservation's TTL is kept")
	}
	n, err := e.client.Exists(ctx, e.keys.Idempotency(gone.Checkin.UserID, gone.Checkin.ID)).Result()
	require.NoError(t, err)
	assert.Zero(t, n, "no record is created for a check-in that was not reserved")
}
