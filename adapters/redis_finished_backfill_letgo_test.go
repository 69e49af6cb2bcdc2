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
	"github.com/checkins/checkins/app/ops"
)

// cancelAfterForget cancels the run's context once the observation is forgotten: the leftovers
// are all gone, a SIGTERM arrives before EndRemoval.
type cancelAfterForget struct {
	ops.Observations
	cancel func()
}

func (c cancelAfterForget) Forget(ctx context.Context, group string) error {
	err := c.Observations.Forget(ctx, group)
	c.cancel()
	return err
}

// failDestroyOn fails the checked destroy (a 2-key script for the member) on one registry.
type failDestroyOn struct{ reg string }

func (f failDestroyOn) DialHook(next redis.DialHook) redis.DialHook { return next }
func (f failDestroyOn) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		n := strings.ToLower(cmd.Name())
		args := cmd.Args()
		if (n == "evalsha" || n == "eval") && len(args) > 4 && args[2] == int64(2) || (n == "evalsha" || n == "eval") && len(args) > 4 && args[2] == 2 {
			if args[3] == f.reg && len(args) > 6 && args[6] == "users.v1" {
				err := errors.New("i/o timeout (injected)")
				cmd.SetErr(err)
				return err
			}
		}
		return next(ctx, cmd)
	}
}
func (f failDestroyOn) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// finishedOnTwoPartitions: users.v1's backfill on two partitions applied an entry of each (a
// marker), acknowledged them, and finished at doneAt; base is the keyspace before partitions.
func finishedOnTwoPartitions(t *testing.T, doneAt time.Time) (*redis.Client, adapters.KeySpace, adapters.KeySpace, adapters.Partitions, *adapters.LiveGroups, string) {
	client, base, parts, u0, u1 := twoPartitions(t)
	ctx := context.Background()
	k2, err := base.WithPartitions(2)
	require.NoError(t, err)
	for i, u := range []int64{u0, u1} {
		require.NoError(t, client.XAdd(ctx, &redis.XAddArgs{Stream: parts.Stream(i), ID: "1-1", Values: checkinValues("a"+string(rune('0'+i)), u)}).Err())
		require.NoError(t, client.XGroupCreate(ctx, parts.Stream(i), "live", "$").Err())
	}
	l := adapters.NewLiveGroups(client, k2)
	_, err = l.Join(ctx, "live", "users.v1")
	require.NoError(t, err)
	for i := range 2 {
		_, err := client.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "users.v1", Consumer: "c", Streams: []string{parts.Stream(i), ">"}}).Result()
		require.NoError(t, err)
		require.NoError(t, client.XAck(ctx, parts.Stream(i), "users.v1", "1-1").Err())
	}
	marker := k2.MarkerPrefix("users.v1") + "{0}"
	require.NoError(t, client.ZAdd(ctx, marker, redis.Z{Score: 1, Member: "identity-of-a"}).Err())
	_, err = l.FinishBackfill(ctx, "live", "users.v1", doneAt)
	require.NoError(t, err)
	return client, base, k2, parts, l, marker
}

func removalMarks(t *testing.T, c *redis.Client, parts adapters.Partitions) []string {
	var out []string
	for i := range 2 {
		ms, err := adapters.ParseMembership("live", c.HGet(context.Background(), parts.Registry(i), "live:live").Val())
		require.NoError(t, err)
		out = append(out, string(ms.Members["users.v1"].Removing))
	}
	return out
}

// TestCancelledRemovalLetsGo: a run removed every leftover, then its context is cancelled
// (SIGTERM) before it ends its hold: it still clears the mark, so neither the next runs nor a
// disband wait RemovalHold (10 min) for a run that is gone.
func TestCancelledRemovalLetsGo(t *testing.T) {
	t.Parallel()
	client, _, k2, parts, l, marker := finishedOnTwoPartitions(t, time.Now().Add(-time.Hour))
	ctx, cancel := context.WithCancel(context.Background())
	b := adapters.NewOpsBackend(client, k2)
	b.Observations = cancelAfterForget{Observations: b.Observations, cancel: cancel}
	err := removalRun(t, b, time.Millisecond).RemoveFinishedBackfills(ctx)
	t.Logf("cancelled run: %v; marks: %q", err, removalMarks(t, client, parts))
	n, _ := client.Exists(context.Background(), marker).Result()
	require.Zero(t, n, "the markers went")

	require.NoError(t, removalRun(t, adapters.NewOpsBackend(client, k2), time.Millisecond).RemoveFinishedBackfills(context.Background()))
	marks := removalMarks(t, client, parts)
	t.Logf("after the next run: %q", marks)
	for _, m := range marks {
		assert.True(t, m == "" || strings.HasSuffix(m, " 0"), "the cancelled run let go of its mark (got %q)", m)
	}
	_, err = l.Disband(context.Background(), "live", time.Millisecond, false)
	assert.NoError(t, err, "nothing is left to remove, yet the disband is refused for RemovalHold")
}

// TestRemovalFailingOnALaterPartitionLetsGo: DestroyFinishedOwnGroup marks partition 0, then
// fails on partition 1 (a timeout): the run lets go of the partition it held, so the next run
// takes the whole removal up and clears every mark at once.
func TestRemovalFailingOnALaterPartitionLetsGo(t *testing.T) {
	t.Parallel()
	client, _, k2, parts, l, marker := finishedOnTwoPartitions(t, time.Now().Add(-time.Hour))
	flaky := redis.NewClient(client.Options())
	t.Cleanup(func() { _ = flaky.Close() })
	flaky.AddHook(failDestroyOn{reg: parts.Registry(1)})
	err := removalRun(t, adapters.NewOpsBackend(flaky, k2), time.Millisecond).RemoveFinishedBackfills(context.Background())
	require.Error(t, err, "the checked destroy fails on partition 1")
	t.Logf("failed run: %v; marks: %q", err, removalMarks(t, client, parts))

	require.NoError(t, removalRun(t, adapters.NewOpsBackend(client, k2), time.Millisecond).RemoveFinishedBackfills(context.Background()))
	n, _ := client.Exists(context.Background(), marker).Result()
	require.Zero(t, n, "the next run removed the markers")
	marks := removalMarks(t, client, parts)
	t.Logf("after the next run: %q", marks)
	for _, m := range marks {
		assert.True(t, m == "" || strings.HasSuffix(m, " 0"), "the failed run let go of its mark (got %q)", m)
	}
	_, err = l.Disband(context.Background(), "live", time.Millisecond, false)
	assert.NoError(t, err, "nothing is left to remove, yet the disband is refused for RemovalHold")
}
