package adapters_test

import (
	"context"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/checkins/checkins/adapters"
	"github.com/checkins/checkins/adapters/redistest"
	"github.com/checkins/checkins/app/command"
	"github.com/checkins/checkins/domain"
)

// countingHook counts the commands a client sends, singly or in pipelines.
type countingHook struct{ n atomic.Int64 }

func (h *countingHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *countingHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error { h.n.Add(1); return next(ctx, cmd) }
}
func (h *countingHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error { h.n.Add(int64(len(cmds))); return next(ctx, cmds) }
}

// TestRateLimitAndReservationShareOneCommand: counting a request against its user's limit and
// reserving its checkinId is one script call, the user's rate key and reservation share a slot,
// a refused request reserves nothing, and a second reservation of the same checkinId answers
// with the first record, as Reserve does.
func TestRateLimitAndReservationShareOneCommand(t *testing.T) {
	t.Parallel()
	t.Run("standalone", func(t *testing.T) {
		t.Parallel()
		srv := redistest.Start(t, redistest.Options{})
		client, err := adapters.NewRedisClient(adapters.ClientOptions{URL: srv.URL()})
		require.NoError(t, err)
		t.Cleanup(func() { _ = client.Close() })
		check := redistest.Client(t, srv.URL())
		rateLimitAndReservation(t, client, check, adapters.KeySpace{Prefix: "rl"})
		all, err := check.Keys(context.Background(), "*").Result()
		require.NoError(t, err)
		for _, k := range all {
			assert.True(t, strings.HasPrefix(k, "rl:"), "%s is under KEY_PREFIX, where an ACL limited to the prefix allows it", k)
		}
	})
	t.Run("cluster", func(t *testing.T) {
		t.Parallel()
		env := redistest.OpenCluster(t)
		keys, err := adapters.NewKeySpace(env.Prefix, true)
		require.NoError(t, err)
		rateLimitAndReservation(t, redistest.ClusterClient(t, env.URL), redistest.ClusterClient(t, env.URL), keys)
	})
}

func rateLimitAndReservation(t *testing.T, client, check redis.UniversalClient, keys adapters.KeySpace) {
	hook := &countingHook{}
	client.AddHook(hook)
	idem := adapters.NewIdempotencyStore(client, keys, time.Hour)
	policy, err := command.ParseRateLimit("1/m,burst=3")
	require.NoError(t, err)
	l, err := adapters.NewRedisRateLimiter(client, nil, keys, policy)
	require.NoError(t, err)
	l.WithReservations(idem)
	ctx := context.Background()
	rec := func(user int64, id string) command.IdempotencyRecord {
		return command.IdempotencyRecord{Fingerprint: "fp-" + id, RecordedAt: 1,
			Checkin: domain.Checkin{ID: id, UserID: user, LocationID: 3, StarRating: 4, Timestamp: 5}}
	}
	// The store asks once whether legacy records may exist, and a cluster's master loads the
	// script on its first call; after that, one command a request.
	_, _, err = l.AllowAndReserve(ctx, rec(99, "warm-up"))
	require.NoError(t, err)
	for _, u := range []int64{7, 8} {
		_, err = l.Allow(ctx, u)
		require.NoError(t, err)
	}

	assert.Equal(t, adapters.KeySlot(keys.RateLimitUser(7)), adapters.KeySlot(keys.Idempotency(7, "a")),
		"the user's rate key and reservations share a slot, so one script may touch both on a cluster")
	hook.n.Store(0)
	d, existing, err := l.AllowAndReserve(ctx, rec(7, "a"))
	require.NoError(t, err)
	assert.True(t, d.Allowed)
	assert.Nil(t, existing, "a new checkinId")
	assert.Equal(t, int64(1), hook.n.Load(), "the limit and the reservation go in one command")
	v, err := check.Get(ctx, keys.Idempotency(7, "a")).Result()
	require.NoError(t, err)
	assert.Equal(t, byte('R'), v[0], "reserved")
	ttl, err := check.PTTL(ctx, keys.Idempotency(7, "a")).Result()
	require.NoError(t, err)
	assert.InDelta(t, time.Hour.Seconds(), ttl.Seconds(), 60, "with the store's TTL")

	d, existing, err = l.AllowAndReserve(ctx, rec(7, "a"))
	require.NoError(t, err)
	assert.True(t, d.Allowed)
	require.NotNil(t, existing, "a retry meets its own reservation")
	assert.Equal(t, "fp-a", existing.Fingerprint)
	assert.False(t, existing.Published)

	d, existing, err = l.AllowAndReserve(ctx, rec(7, "b"))
	require.NoError(t, err)
	assert.False(t, d.Allowed, "the burst of 3 is spent")
	assert.Nil(t, existing)
	assert.Greater(t, d.RetryAfter, 50*time.Second)
	n, err := check.Exists(ctx, keys.Idempotency(7, "b")).Result()
	require.NoError(t, err)
	assert.Zero(t, n, "a refused request reserves nothing")
	assert.Equal(t, int64(3), hook.n.Load())

	d, err = l.Allow(ctx, 8)
	require.NoError(t, err)
	assert.True(t, d.Allowed, "another user has a budget of its own")
	assert.Equal(t, 1, d.Remaining)
	// The state is redis_rate's: a TAT in seconds since 2017.
	tat, err := check.Get(ctx, keys.RateLimitUser(8)).Result()
	require.NoError(t, err)
	f, err := strconv.ParseFloat(tat, 64)
	require.NoError(t, err)
	assert.InDelta(t, float64(time.Now().Unix()-1483228800+2*60), f, 5, "two requests of user 8 at 1/m")
}

// TestRateLimitRemainingIsExact: a user's first request leaves exactly burst-1, whatever the
// policy's interval. The TAT is seconds since 2017 (about 3.1e8, so a double holds it to about
// 6e-8 s), and with the arithmetic done at that magnitude 10/s,burst=20 answered r=18 to a
// user's first request. This calls Allow's script; the ingest script (ReservingPublisher)
// shares gcra, and ports' TestRateLimitHeadersNameEveryLimit reads its remaining.
func TestRateLimitRemainingIsExact(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t, redistest.Options{})
	client := redistest.Client(t, srv.URL())
	keys := adapters.KeySpace{Prefix: "rle"}
	ctx := context.Background()
	user := int64(0)
	for _, p := range []string{"10/s,burst=20", "3/s,burst=5", "100/s,burst=7", "1/m,burst=3", "7/h,burst=1", "1000/s,burst=1000", "9/s,burst=10"} {
		policy, err := command.ParseRateLimit(p)
		require.NoError(t, err)
		l, err := adapters.NewRedisRateLimiter(client, nil, keys, policy)
		require.NoError(t, err)
		for range 50 { // fifty fresh users, at fifty different instants
			user++
			d, err := l.Allow(ctx, user)
			require.NoError(t, err)
			require.True(t, d.Allowed, p)
			require.Equal(t, policy.Burst-1, d.Remaining, "%s: a user's first request", p)
			interval := time.Duration(float64(policy.Period) / float64(policy.Rate))
			require.InDelta(t, interval.Microseconds(), d.ResetAfter.Microseconds(), 1, "%s: the quota is back one interval later", p)
		}
	}
	// A burst of 5 at 1/m: each request within the same minute leaves one fewer, and the sixth is
	// refused until an interval has passed since the first.
	policy, err := command.ParseRateLimit("1/m,burst=5")
	require.NoError(t, err)
	l, err := adapters.NewRedisRateLimiter(client, nil, keys, policy)
	require.NoError(t, err)
	user++
	for want := 4; want >= 0; want-- {
		d, err := l.Allow(ctx, user)
		require.NoError(t, err)
		require.True(t, d.Allowed)
		require.Equal(t, want, d.Remaining)
	}
	d, err := l.Allow(ctx, user)
	require.NoError(t, err)
	assert.False(t, d.Allowed)
	assert.Zero(t, d.Remaining)
	assert.InDelta(t, time.Minute.Seconds(), d.RetryAfter.Seconds(), 2)
	assert.InDelta(t, 5*time.Minute.Seconds(), d.ResetAfter.Seconds(), 2)
}
