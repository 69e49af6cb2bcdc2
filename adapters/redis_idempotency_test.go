package adapters_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"strconv"
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
		"other user":           input(ptr("ck-2"), 43, 7, 4, &ts),
		"other location":       input(ptr("ck-2"), 42, 8, 4, &ts),
		"other timestamp":      input(ptr("ck-2"), 42, 7, 4, ptr(ts+1)),
		"timestamp now absent": input(ptr("ck-2"), 42, 7, 4, nil),
	} {
		_, err := e.handler.Handle(ctx, command.RecordCheckin{Input: in})
		assert.ErrorIs(t, err, domain.ErrConflict, name)
	}
	assert.Equal(t, int64(1), e.xlen(t))
}

func TestRecordCheckinInvalidWritesNothing(t *testing.T) {
	t.Parallel()
	e := newCmdEnv(t, nil)
	_, err := e.handler.Handle(context.Background(), command.RecordCheckin{Input: input(ptr("ck-3"), 0, 7, 4, nil)})
	var ve *domain.ValidationError
	require.ErrorAs(t, err, &ve)
	assert.Equal(t, "userId", ve.Field)
	assert.Equal(t, int64(0), e.xlen(t))
	n, err := e.client.Exists(context.Background(), e.keys.Idempotency("ck-3")).Result()
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

	_, err = e.handler.Handle(ctx, command.RecordCheckin{Input: in})
	require.NoError(t, err)
	assert.Equal(t, int64(1), e.xlen(t), "once published, a retry does not publish again")
}

// flakyPublisher fails its first n publishes, like Redis dropping the connection mid-request.
type flakyPublisher struct {
	inner command.EventPublisher
	fails atomic.Int64
}

func (p *flakyPublisher) PublishCheckinRecorded(ctx context.Context, e domain.CheckinRecorded, corr string) error {
	if p.fails.Add(-1) >= 0 {
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

	res, err := e.handler.Handle(ctx, cmd)
	require.NoError(t, err)
	assert.Equal(t, int64(1), e.xlen(t))
	assert.Equal(t, strconv.FormatInt(res.Checkin.Timestamp, 10), e.entries(t)[0].Values["timestamp"])
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

func TestIdempotencyStore(t *testing.T) {
	t.Parallel()
	env := newProjEnv(t)
	ctx := context.Background()
	store := adapters.NewIdempotencyStore(env.client, env.keys, time.Hour)
	rec := command.IdempotencyRecord{Fingerprint: "fp", RecordedAt: 11,
		Checkin: domain.Checkin{ID: "ck-8", UserID: 1, LocationID: 2, StarRating: 3, Timestamp: 10}}

	got, err := store.Reserve(ctx, rec)
	require.NoError(t, err)
	assert.Nil(t, got, "first reservation stores")

	other := rec
	other.Fingerprint, other.Checkin.StarRating, other.RecordedAt = "other", 5, 99
	got, err = store.Reserve(ctx, other)
	require.NoError(t, err)
	require.NotNil(t, got)
	assert.Equal(t, rec, *got, "the existing record comes back unchanged")

	require.NoError(t, store.MarkPublished(ctx, rec))
	got, err = store.Reserve(ctx, rec)
	require.NoError(t, err)
	require.NotNil(t, got)
	assert.True(t, got.Published)
	ttl, err := env.client.PTTL(ctx, env.keys.Idempotency("ck-8")).Result()
	require.NoError(t, err)
	assert.Greater(t, ttl, time.Duration(0), "MarkPublished keeps the TTL")

	never := rec
	never.Checkin.ID = "never-reserved"
	require.NoError(t, store.MarkPublished(ctx, never))
	n, err := env.client.Exists(ctx, env.keys.Idempotency("never-reserved")).Result()
	require.NoError(t, err)
	assert.Zero(t, n, "MarkPublished must not create a record")

	require.NoError(t, env.client.Set(ctx, env.keys.Idempotency("corrupt"), "{not json", 0).Err())
	rec.Checkin.ID = "corrupt"
	_, err = store.Reserve(ctx, rec)
	assert.ErrorContains(t, err, "corrupt")
}
