package adapters_test

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-redisstream/pkg/redisstream"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/checkins/checkins/adapters"
	"github.com/checkins/checkins/adapters/redistest"
	"github.com/checkins/checkins/app/command"
	"github.com/checkins/checkins/domain"
)

type ingestEnv struct {
	keys  adapters.KeySpace
	check *redis.Client
	pipe  *adapters.AutoPipeline
	pub   *adapters.EventPublisher
	idem  *adapters.IdempotencyStore
	hook  *countingHook // on the auto-pipeline's client: the commands that reach Redis
	sent  *argsHook     // the same commands' arguments
}

// argsHook keeps the arguments of the last pipeline a client sent.
type argsHook struct {
	mu   sync.Mutex
	last [][]any
}

func (h *argsHook) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (h *argsHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (h *argsHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.mu.Lock()
		h.last = h.last[:0]
		for _, c := range cmds {
			h.last = append(h.last, c.Args())
		}
		h.mu.Unlock()
		return next(ctx, cmds)
	}
}

func (h *argsHook) lastArgs() [][]any {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.last)
}

func newIngestEnv(t *testing.T, prefix string) ingestEnv {
	t.Helper()
	srv := redistest.Start(t, redistest.Options{})
	newClient := func() redis.UniversalClient {
		c, err := adapters.NewRedisClient(adapters.ClientOptions{URL: srv.URL()})
		require.NoError(t, err)
		t.Cleanup(func() { _ = c.Close() })
		return c
	}
	e := ingestEnv{keys: adapters.KeySpace{Prefix: prefix}, check: redistest.Client(t, srv.URL()), hook: &countingHook{}, sent: &argsHook{}}
	pipeClient := newClient()
	pipeClient.AddHook(e.hook)
	pipeClient.AddHook(e.sent)
	e.pipe = adapters.NewAutoPipeline(pipeClient, 64, 2)
	t.Cleanup(func() { _ = e.pipe.Close() })
	var err error
	e.pub, err = adapters.NewPipelinedEventPublisher(newClient(), e.pipe, e.keys, watermill.NopLogger{})
	require.NoError(t, err)
	e.idem = adapters.NewIdempotencyStore(newClient(), e.keys, time.Hour).WithAutoPipeline(e.pipe)
	return e
}

func ingestRecord(user int64, id string, location int64) command.IdempotencyRecord {
	return command.IdempotencyRecord{Fingerprint: "fp-" + id, RecordedAt: time.Now().UnixMilli(), Owner: "o1",
		Checkin: domain.Checkin{ID: id, UserID: user, LocationID: location, StarRating: 4, Timestamp: 5}}
}

// TestReservingPublisherRecordsInOneCommand: the limit, the reservation and Watermill's XADD are
// one script call; the record is stored as published with the store's TTL, and the entry is
// the publisher's; the same checkinId again finds the record and adds nothing; a refused
// request writes nothing.
func TestReservingPublisherRecordsInOneCommand(t *testing.T) {
	t.Parallel()
	e := newIngestEnv(t, "ing")
	ctx := context.Background()
	policy, err := command.ParseRateLimit("1/m,burst=3")
	require.NoError(t, err)
	l, err := adapters.NewRedisRateLimiter(e.check, e.pipe, e.keys, policy)
	require.NoError(t, err)
	rp, err := adapters.NewReservingPublisher(e.pub, e.pipe, e.idem, l.WithReservations(e.idem))
	require.NoError(t, err)
	// The store asks once whether legacy records may exist; after that, one command a request.
	_, _, ok, err := rp.ReserveAndPublish(ctx, ingestRecord(99, "warm-up", 1), "", true)
	require.NoError(t, err)
	require.True(t, ok)
	_, err = l.Allow(ctx, 7)
	require.NoError(t, err)

	e.hook.n.Store(0)
	d, existing, ok, err := rp.ReserveAndPublish(ctx, ingestRecord(7, "a", 3), "corr-1", true)
	require.NoError(t, err)
	require.True(t, ok)
	assert.True(t, d.Allowed)
	assert.Equal(t, 1, d.Remaining, "two of the burst of 3 are spent")
	assert.Nil(t, existing, "a new checkinId")
	assert.Equal(t, int64(1), e.hook.n.Load(), "limit, reservation and XADD in one command")
	assert.InDelta(t, (2 * time.Minute).Seconds(), d.ResetAfter.Seconds(), 5, "the burst is back after two periods")
	rateTTL, err := e.check.TTL(ctx, e.keys.RateLimitUser(7)).Result()
	require.NoError(t, err)
	assert.True(t, rateTTL > 170*time.Second && rateTTL <= 3*time.Minute,
		"the rate key lives the policy's window (3 min), which every reset after is within: %v", rateTTL)
	sent := e.sent.lastArgs()
	require.Len(t, sent, 1)
	for _, name := range []string{redisstream.UUIDHeaderKey, domain.FieldCheckinID, domain.FieldUserID, "*", "60"} {
		assert.NotContains(t, sent[0][3:], name, "the script holds the entry's field names and the policy: the request sends values (%v)", sent[0])
	}
	v, err := e.check.Get(ctx, e.keys.Idempotency(7, "a")).Result()
	require.NoError(t, err)
	assert.Equal(t, byte('P'), v[0], "stored as published: no mark follows")
	ttl, err := e.check.PTTL(ctx, e.keys.Idempotency(7, "a")).Result()
	require.NoError(t, err)
	assert.InDelta(t, time.Hour.Seconds(), ttl.Seconds(), 60, "with the store's TTL")
	entries, err := e.check.XRange(ctx, e.keys.Stream(), "-", "+").Result()
	require.NoError(t, err)
	require.Len(t, entries, 2)
	f := entries[1].Values
	assert.Equal(t, "a", f[domain.FieldCheckinID])
	assert.Equal(t, "7", f[domain.FieldUserID])
	assert.Equal(t, "fp-a", f[domain.FieldFingerprint])
	assert.Equal(t, "corr-1", f[adapters.MetaFieldPrefix+adapters.MetaCorrelationID], "Watermill's own message, metadata included")
	assert.NotEmpty(t, f[redisstream.UUIDHeaderKey])

	// A retry, or a concurrent request of the same checkinId: the record answers, nothing is added.
	e.hook.n.Store(0)
	d, existing, ok, err = rp.ReserveAndPublish(ctx, ingestRecord(7, "a", 9), "", true)
	require.NoError(t, err)
	require.True(t, ok)
	assert.True(t, d.Allowed)
	require.NotNil(t, existing)
	assert.True(t, existing.Published)
	assert.Equal(t, "fp-a", existing.Fingerprint)
	assert.Equal(t, int64(3), existing.Checkin.LocationID)
	assert.Equal(t, int64(1), e.hook.n.Load())
	n, err := e.check.XLen(ctx, e.keys.Stream()).Result()
	require.NoError(t, err)
	assert.Equal(t, int64(2), n, "a checkinId taken adds no entry")
	after, err := e.check.Get(ctx, e.keys.Idempotency(7, "a")).Result()
	require.NoError(t, err)
	assert.Equal(t, v, after, "and leaves the record as it was")

	d, existing, ok, err = rp.ReserveAndPublish(ctx, ingestRecord(7, "b", 3), "", true)
	require.NoError(t, err)
	require.True(t, ok)
	assert.False(t, d.Allowed, "the burst of 3 is spent")
	assert.Greater(t, d.RetryAfter, 50*time.Second)
	assert.Nil(t, existing)
	exists, err := e.check.Exists(ctx, e.keys.Idempotency(7, "b")).Result()
	require.NoError(t, err)
	assert.Zero(t, exists, "a refused request reserves nothing")
	n, err = e.check.XLen(ctx, e.keys.Stream()).Result()
	require.NoError(t, err)
	assert.Equal(t, int64(2), n, "and publishes nothing")

	// Without a limit: the reservation and the XADD, nothing counted.
	free, err := adapters.NewReservingPublisher(e.pub, e.pipe, e.idem, nil)
	require.NoError(t, err)
	d, existing, ok, err = free.ReserveAndPublish(ctx, ingestRecord(7, "c", 3), "", false)
	require.NoError(t, err)
	require.True(t, ok)
	assert.True(t, d.Allowed)
	assert.Nil(t, existing)
	n, err = e.check.XLen(ctx, e.keys.Stream()).Result()
	require.NoError(t, err)
	assert.Equal(t, int64(3), n)
	_, _, ok, err = free.ReserveAndPublish(ctx, ingestRecord(7, "d", 3), "", true)
	require.NoError(t, err)
	assert.False(t, ok, "asked to limit without a limiter: declined, nothing done")

	// An entry with other fields than the API's (here no fingerprint) goes with its field names.
	plain := ingestRecord(7, "e", 4)
	plain.Fingerprint = ""
	_, existing, ok, err = free.ReserveAndPublish(ctx, plain, "corr-e", false)
	require.NoError(t, err)
	require.True(t, ok)
	assert.Nil(t, existing)
	entries, err = e.check.XRange(ctx, e.keys.Stream(), "-", "+").Result()
	require.NoError(t, err)
	require.Len(t, entries, 4)
	f = entries[3].Values
	assert.Equal(t, "e", f[domain.FieldCheckinID])
	assert.Equal(t, "4", f[domain.FieldLocationID])
	assert.Equal(t, "corr-e", f[adapters.MetaFieldPrefix+adapters.MetaCorrelationID])
	assert.NotContains(t, f, domain.FieldFingerprint)
	assert.Len(t, f, len(entries[1].Values)-1, "every other field of the entry")
	assert.Contains(t, e.sent.lastArgs()[0], redisstream.UUIDHeaderKey, "sent with its field names")
}

// TestReservingPublisherLeavesTheCheckinIdFreeWhenTheXAddFails: an XADD refused inside the script
// (here the stream's key holds a string) takes the reservation back, so a retry is a new
// attempt, not a "recorded" answer for an event that is nowhere.
func TestReservingPublisherLeavesTheCheckinIdFreeWhenTheXAddFails(t *testing.T) {
	t.Parallel()
	e := newIngestEnv(t, "ingfail")
	ctx := context.Background()
	rp, err := adapters.NewReservingPublisher(e.pub, e.pipe, e.idem, nil)
	require.NoError(t, err)
	_, _, ok, err := rp.ReserveAndPublish(ctx, ingestRecord(99, "warm-up", 1), "", false) // the legacy question
	require.NoError(t, err)
	require.True(t, ok)
	require.NoError(t, e.check.Del(ctx, e.keys.Stream()).Err())
	require.NoError(t, e.check.Set(ctx, e.keys.Stream(), "not a stream", 0).Err())
	_, _, ok, err = rp.ReserveAndPublish(ctx, ingestRecord(7, "a", 3), "", false)
	require.True(t, ok)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "WRONGTYPE")
	n, err := e.check.Exists(ctx, e.keys.Idempotency(7, "a")).Result()
	require.NoError(t, err)
	assert.Zero(t, n, "the reservation is gone with the failed XADD")

	require.NoError(t, e.check.Del(ctx, e.keys.Stream()).Err())
	_, existing, ok, err := rp.ReserveAndPublish(ctx, ingestRecord(7, "a", 3), "", false)
	require.NoError(t, err)
	require.True(t, ok)
	assert.Nil(t, existing, "the retry records it")
	xl, err := e.check.XLen(ctx, e.keys.Stream()).Result()
	require.NoError(t, err)
	assert.Equal(t, int64(1), xl)
}

// TestReservingPublisherDeclines: while legacy idempotency records may exist (their lookup is a
// command of its own) it declines and does nothing; it refuses a publisher whose XADDs do not
// go through its auto-pipeline (they would be sent without the reservation).
func TestReservingPublisherDeclines(t *testing.T) {
	t.Parallel()
	e := newIngestEnv(t, "ingold")
	ctx := context.Background()
	// A deployment of the earlier version: an event stream, and no mark of scoped keys.
	require.NoError(t, e.check.XAdd(ctx, &redis.XAddArgs{Stream: e.keys.Stream(), Values: map[string]any{"x": "y"}}).Err())
	rp, err := adapters.NewReservingPublisher(e.pub, e.pipe, e.idem, nil)
	require.NoError(t, err)
	_, _, ok, err := rp.ReserveAndPublish(ctx, ingestRecord(7, "a", 3), "", false)
	require.NoError(t, err)
	assert.False(t, ok, "legacy records may exist: the two-step path looks them up")
	n, err := e.check.XLen(ctx, e.keys.Stream()).Result()
	require.NoError(t, err)
	assert.Equal(t, int64(1), n, "nothing published")

	plain, err := adapters.NewEventPublisher(e.check, e.keys, watermill.NopLogger{})
	require.NoError(t, err)
	_, err = adapters.NewReservingPublisher(plain, e.pipe, e.idem, nil)
	require.ErrorContains(t, err, "does not send its XADDs through this auto-pipeline")
}
