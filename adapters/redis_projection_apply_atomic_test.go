package adapters_test

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/checkins/checkins/adapters"
	"github.com/checkins/checkins/app/projection"
	"github.com/checkins/checkins/domain"
)

// halfway counts a check-in in two keys of its user's slot, the second after the first: when
// the second is of another type, the first increment has landed by the time the command fails.
type halfway struct{}

func (halfway) Name() string { return "halfway" }

func (halfway) OnCheckinRecorded(_ context.Context, e domain.CheckinRecorded, s projection.Store) error {
	return s.Apply(context.Background(), projection.NewUpdate("user:"+strconv.FormatInt(e.UserID, 10)).
		HIncrBy("good", "n", 1).ZIncrBy("board", 1, "all").HIncrBy("bad", "n", 1))
}

// TestItemFailingHalfwayIsTakenBack: Redis takes nothing back when a command of a script fails,
// so a key of another type under a projection (written by hand, or by another program) failed
// the apply script after the item's marker and first updates had landed: the retry, and the
// one-by-one search for the failing work, then found the marker and answered "already applied",
// and the check-in was lost without an error and without a parked event. The item (what one
// group's projections do for one event in one slot) is now taken back: its markers and its
// increments; every retry fails alike until the key is fixed, and then it counts once.
func TestItemFailingHalfwayIsTakenBack(t *testing.T) {
	t.Parallel()
	eachEnv(t, testItemFailingHalfwayIsTakenBack)
}

func testItemFailingHalfwayIsTakenBack(t *testing.T, env projEnv) {
	a, err := adapters.NewProjectionApplier(env.client, env.keys, 0)
	require.NoError(t, err)
	ctx := context.Background()
	const t0 = 1_700_000_000_000
	ev := recorded("ck-half", 7, 1, 4, 1_000)
	key := func(p, k string) string { return env.keys.ProjectionKey(p, 1, "user:7", k) }
	require.NoError(t, env.client.Set(ctx, key("halfway", "bad"), "not a hash", 0).Err())
	// A counter that exists already is taken back to its value, not removed.
	require.NoError(t, env.client.ZAdd(ctx, key("halfway", "board"), redis.Z{Score: 5, Member: "all"}).Err())
	work := func(p projection.Projection) projection.Work {
		us, err := projection.Updates(ctx, p, ev)
		require.NoError(t, err)
		return projection.Work{Group: "live", Projection: p.Name(), Version: 1, Event: projection.RefOf(ev, entry(t0)), Updates: us}
	}
	apply := func() ([]projection.Outcome, error) {
		return a.Apply(ctx, []projection.Work{work(projection.UserStats{}), work(halfway{})}, nil)
	}
	snapshot := func() map[string]string {
		out := map[string]string{}
		var mu sync.Mutex // the masters of a cluster are read at once
		require.NoError(t, forEachNode(ctx, env.client, func(ctx context.Context, c *redis.Client) error {
			ks, err := c.Keys(ctx, env.keys.Prefix+":*").Result() // the cluster is shared with other tests
			for _, k := range ks {
				if k == key("users", "stats") {
					continue // its latest check-in, a value set (below)
				}
				d, derr := c.Dump(ctx, k).Result()
				if derr != nil {
					return derr
				}
				mu.Lock()
				out[k] = d
				mu.Unlock()
			}
			return err
		}))
		return out
	}
	before := snapshot()
	for range 3 { // each try fails alike, names the work that failed, and leaves nothing behind
		_, err = apply()
		require.ErrorContains(t, err, "WRONGTYPE")
		var wf *projection.WorkFailure
		require.ErrorAs(t, err, &wf)
		assert.Equal(t, 1, wf.Work, "halfway's work failed, not users'")
		assert.Equal(t, before, snapshot(), "the item is taken back: its markers, the registry's entry and its increments")
		// What it set stays (users' latest check-in), and comes out the same when it is applied.
		assert.ErrorIs(t, env.client.HGet(ctx, key("users", "stats"), "numCheckins").Err(), redis.Nil, "the count is taken back")
	}

	// The key fixed, the event (replayed) counts once in both.
	require.NoError(t, env.client.Del(ctx, key("halfway", "bad")).Err())
	outs, err := apply()
	require.NoError(t, err)
	assert.Equal(t, []projection.Outcome{projection.Applied, projection.Applied}, outs)
	outs, err = apply()
	require.NoError(t, err)
	assert.Equal(t, []projection.Outcome{projection.AlreadyApplied, projection.AlreadyApplied}, outs)
	assert.Equal(t, "1", env.client.HGet(ctx, key("halfway", "good"), "n").Val())
	assert.Equal(t, float64(6), env.client.ZScore(ctx, key("halfway", "board"), "all").Val())
	assert.Equal(t, "1", env.client.HGet(ctx, key("halfway", "bad"), "n").Val())
	st, err := projection.UserStats{}.Get(ctx, adapters.NewProjectionReader(env.client, env.keys, "users"), 7)
	require.NoError(t, err)
	assert.Equal(t, int64(1), st.NumCheckins)
}

// twoSlots counts a check-in in its user's slot and in its location's slot, as leaderboards
// does across its shards: one work, and on a cluster two items, each in a call of its own.
type twoSlots struct{}

func (twoSlots) Name() string { return "twoslots" }

func (twoSlots) OnCheckinRecorded(ctx context.Context, e domain.CheckinRecorded, s projection.Store) error {
	if err := s.Apply(ctx, projection.NewUpdate("user:"+strconv.FormatInt(e.UserID, 10)).HIncrBy("good", "n", 1)); err != nil {
		return err
	}
	return s.Apply(ctx, projection.NewUpdate("loc:"+strconv.FormatInt(e.LocationID, 10)).HIncrBy("bad", "n", 1))
}

// TestWorkFailingInOneOfItsSlotsIsRetriedWhole: on a cluster a work's update in one slot can
// land while its update in another fails and is taken back. Named as the culprit, the work was
// parked, and its replay (under markers of its own) counted the landed update twice. The error
// now says the work was applied in part, so that the group applies it again until it goes
// through, and its markers make the landed part a no-op. On a single server one item holds the
// whole work: it is named.
func TestWorkFailingInOneOfItsSlotsIsRetriedWhole(t *testing.T) {
	t.Parallel()
	eachEnv(t, testWorkFailingInOneOfItsSlotsIsRetriedWhole)
}

func testWorkFailingInOneOfItsSlotsIsRetriedWhole(t *testing.T, env projEnv) {
	a, err := adapters.NewProjectionApplier(env.client, env.keys, 0)
	require.NoError(t, err)
	ctx := context.Background()
	const t0 = 1_700_000_000_000
	ev := recorded("ck-two", 7, 3, 4, 1_000)
	good := env.keys.ProjectionKey("twoslots", 1, "user:7", "good")
	bad := env.keys.ProjectionKey("twoslots", 1, "loc:3", "bad")
	require.NoError(t, env.client.Set(ctx, bad, "not a hash", 0).Err())
	apply := func() ([]projection.Outcome, error) {
		us, err := projection.Updates(ctx, twoSlots{}, ev)
		require.NoError(t, err)
		return a.Apply(ctx, []projection.Work{{Group: "live", Projection: "twoslots", Version: 1, Event: projection.RefOf(ev, entry(t0)), Updates: us}}, nil)
	}
	for range 2 {
		_, err = apply()
		require.ErrorContains(t, err, "WRONGTYPE")
		var wf *projection.WorkFailure
		if env.cluster {
			assert.ErrorIs(t, err, projection.ErrAppliedInPart)
			assert.False(t, errors.As(err, &wf), "not to be parked: %v", err)
		} else {
			assert.ErrorAs(t, err, &wf)
			assert.NotErrorIs(t, err, projection.ErrAppliedInPart)
		}
	}
	require.NoError(t, env.client.Del(ctx, bad).Err())
	outs, err := apply()
	require.NoError(t, err)
	assert.Equal(t, []projection.Outcome{projection.Applied}, outs)
	assert.Equal(t, "1", env.client.HGet(ctx, good, "n").Val(), "counted once in the slot that had landed")
	assert.Equal(t, "1", env.client.HGet(ctx, bad, "n").Val())
}
