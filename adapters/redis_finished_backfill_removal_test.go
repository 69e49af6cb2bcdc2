package adapters_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/checkins/checkins/adapters"
	"github.com/checkins/checkins/adapters/redistest"
	"github.com/checkins/checkins/app/command"
	"github.com/checkins/checkins/app/projection"
	"github.com/checkins/checkins/domain"
)

// markersOf lists every marker of group (member@score), on the single server.
func markersOf(t *testing.T, c *redis.Client, keys adapters.KeySpace, group string) []string {
	t.Helper()
	ctx := context.Background()
	var out []string
	iter := c.Scan(ctx, 0, keys.MarkerPrefix(group)+"{*}", 1000).Iterator()
	for iter.Next(ctx) {
		zs, err := c.ZRangeWithScores(ctx, iter.Val(), 0, -1).Result()
		require.NoError(t, err)
		for _, z := range zs {
			out = append(out, z.Member.(string))
		}
	}
	require.NoError(t, iter.Err())
	return out
}

// TestFinishedBackfillMarkersOnALaterJoinedPartitionGo: every partition is joined at its own
// stream's last entry, so a backfill's joins differ, and its markers of a partition joined later
// lie above the earliest join. Removing the finished backfill removes all of them (a removal up
// to the earliest join left those for good: nothing prunes the markers of a group that is gone).
func TestFinishedBackfillMarkersOnALaterJoinedPartitionGo(t *testing.T) {
	t.Parallel()
	client, base, parts, u0, u1 := twoPartitions(t)
	ctx := context.Background()
	keys, err := base.WithPartitions(2)
	require.NoError(t, err)
	ev := func(id string, user int64, stream, entryID string) domain.CheckinRecorded {
		v := checkinValues(id, user)
		require.NoError(t, client.XAdd(ctx, &redis.XAddArgs{Stream: stream, ID: entryID, Values: v}).Err())
		fields := map[string]string{}
		for k, x := range v {
			fields[k] = x.(string)
		}
		parsed, err := domain.ParseEvent(entryID, fields)
		require.NoError(t, err)
		return parsed.(domain.CheckinRecorded)
	}
	a := ev("a", u0, parts.Stream(0), "1000-1")
	b := ev("b", u1, parts.Stream(1), "2000-1")
	c := ev("c", u1, parts.Stream(1), "3000-1")
	// The live group has delivered every entry on each partition (a running service).
	for _, s := range parts.Streams() {
		require.NoError(t, client.XGroupCreate(ctx, s, "live", "$").Err())
	}
	l := adapters.NewLiveGroups(client, keys)
	ms, err := l.Join(ctx, "live", "users.v1")
	require.NoError(t, err)
	m := ms.Members["users.v1"]
	require.Equal(t, "1000-1", m.Parts[parts.Stream(0)].Join)
	require.Equal(t, "3000-1", m.Parts[parts.Stream(1)].Join)

	// The own group's backfill applies every entry up to the join on each partition.
	applier, err := adapters.NewProjectionApplier(client, keys, 0)
	require.NoError(t, err)
	for _, x := range []struct {
		e  domain.CheckinRecorded
		id string
	}{{a, "1000-1"}, {b, "2000-1"}, {c, "3000-1"}} {
		out, err := applier.ApplyEvent(ctx, "users.v1", projection.UserStats{}, 1, x.e, x.id)
		require.NoError(t, err)
		require.Equal(t, projection.Applied, out)
	}
	require.Len(t, markersOf(t, client, keys, "users.v1"), 3)
	_, err = l.FinishBackfill(ctx, "live", "users.v1", time.Now().Add(-time.Hour))
	require.NoError(t, err)

	rb := removalRun(t, adapters.NewOpsBackend(client, keys), time.Second)
	require.NoError(t, rb.RemoveFinishedBackfills(ctx))
	require.NoError(t, rb.RemoveFinishedBackfills(ctx)) // and again, as every projector does periodically

	for _, s := range parts.Streams() {
		gs, err := client.XInfoGroups(ctx, s).Result()
		require.NoError(t, err)
		for _, g := range gs {
			require.NotEqual(t, "users.v1", g.Name, "the finished backfill's group was destroyed on %s", s)
		}
	}
	assert.Empty(t, markersOf(t, client, keys, "users.v1"),
		"markers of the destroyed finished backfill users.v1 left behind for good (no group of that name will prune them)")
}

// failingScan fails the first SCAN for marker keys: a transient error (or a crash) right after
// the checked destroy of a finished backfill's group.
type failingScan struct{ failed bool }

func (f *failingScan) DialHook(next redis.DialHook) redis.DialHook { return next }
func (f *failingScan) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if !f.failed && strings.EqualFold(cmd.Name(), "scan") {
			for _, a := range cmd.Args() {
				if s, ok := a.(string); ok && strings.Contains(s, ":applied:") {
					f.failed = true
					err := errors.New("i/o timeout (injected)")
					cmd.SetErr(err)
					return err
				}
			}
		}
		return next(ctx, cmd)
	}
}
func (f *failingScan) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// TestFinishedBackfillRemovalCutShortIsTakenUpAgain: the finished backfill's group goes first,
// then what it left (markers, observation); when that fails once (a timeout, a restart in
// between), the member stays marked removing and the next run takes the removal up again, where
// it used to skip a member whose group was gone and leave its markers for good.
func TestFinishedBackfillRemovalCutShortIsTakenUpAgain(t *testing.T) {
	t.Parallel()
	env := newProjEnv(t)
	ctx := context.Background()
	c, keys := env.client, env.keys
	stream := keys.Stream()
	l := adapters.NewLiveGroups(c, keys)
	add := func() string {
		id, err := c.XAdd(ctx, &redis.XAddArgs{Stream: stream, Values: checkinValues("x", 1)}).Result()
		require.NoError(t, err)
		return id
	}
	first := add()
	require.NoError(t, c.XGroupCreate(ctx, stream, "live", "$").Err())
	ms, err := l.Join(ctx, "live", "users.v1")
	require.NoError(t, err)
	require.Equal(t, first, ms.Members["users.v1"].Join)
	marker := keys.MarkerPrefix("users.v1") + "{0}"
	s, _ := adapters.ScoreOfEntry(first)
	require.NoError(t, c.ZAdd(ctx, marker, redis.Z{Score: float64(s), Member: "identity-of-x"}).Err())
	_, err = l.FinishBackfill(ctx, "live", "users.v1", time.Now().Add(-time.Hour))
	require.NoError(t, err)

	newRB := func(client redis.UniversalClient) *command.RebuildProjection {
		return removalRun(t, adapters.NewOpsBackend(client, keys), time.Second)
	}
	flaky := redistest.Client(t, env.url)
	flaky.AddHook(&failingScan{})
	err = newRB(flaky).RemoveFinishedBackfills(ctx)
	require.Error(t, err, "the injected failure")
	t.Logf("first run: %v", err)
	// Every later run (any projector, every interval) finds nothing to do.
	for range 3 {
		require.NoError(t, newRB(c).RemoveFinishedBackfills(ctx))
	}
	n, err := c.Exists(ctx, marker).Result()
	require.NoError(t, err)
	assert.Zero(t, n, "the finished backfill's markers (%v) stay for good after one failed removal", c.ZRange(ctx, marker, 0, -1).Val())
}
