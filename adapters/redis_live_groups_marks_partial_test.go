package adapters_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/checkins/checkins/adapters"
	"github.com/checkins/checkins/adapters/redistest"
	"github.com/checkins/checkins/app/command"
	"github.com/checkins/checkins/app/ops"
)

// failNthHDel fails the n-th HDEL of a field with prefix (counting from 1), as a connection
// dropped between the per-partition HDELs that clear a mark.
type failNthHDel struct {
	prefix string
	n      int
	seen   *int
}

func (f failNthHDel) DialHook(next redis.DialHook) redis.DialHook { return next }
func (f failNthHDel) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if args := cmd.Args(); cmd.Name() == "hdel" && len(args) > 2 {
			if field, _ := args[2].(string); strings.HasPrefix(field, f.prefix) {
				*f.seen++
				if *f.seen == f.n {
					err := errors.New("connection reset (injected)")
					cmd.SetErr(err)
					return err
				}
			}
		}
		return next(ctx, cmd)
	}
}
func (f failNthHDel) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// liveOnTwoPartitions is users.v1 in live group live on two partitions, whose one entry each
// the group delivered and acknowledged, its consumer idle for a few milliseconds since.
func liveOnTwoPartitions(t *testing.T, env projEnv) (redis.UniversalClient, adapters.KeySpace, adapters.Partitions, *adapters.LiveGroups) {
	t.Helper()
	ctx := context.Background()
	c := env.client
	keys, err := env.keys.WithPartitions(2)
	require.NoError(t, err)
	parts := keys.Partitions()
	l := adapters.NewLiveGroups(c, keys)
	for _, stream := range parts.Streams() {
		require.NoError(t, c.XAdd(ctx, &redis.XAddArgs{Stream: stream, Values: []any{"k", "v"}}).Err())
	}
	_, err = l.Join(ctx, "live", "users.v1")
	require.NoError(t, err)
	for _, stream := range parts.Streams() {
		res, err := c.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "live", Consumer: "c1", Streams: []string{stream, ">"}, Block: -1}).Result()
		require.NoError(t, err)
		require.NoError(t, c.XAck(ctx, stream, "live", res[0].Messages[0].ID).Err())
	}
	time.Sleep(5 * time.Millisecond)
	return c, keys, parts, l
}

// TestEndDisbandCutShortHoldsTheNextJoinWhole: with two partitions, the disband of "live" is cut
// short inside EndDisband, between its two HDELs. A projector of the old set starts meanwhile
// (what the mark is for). The marks were cleared from partition 0 on: it joined "live" on
// partition 0, where the mark was gone, and was refused on partition 1, half joined; the disband
// run again was refused (the member backfilled on partition 0) and the projector stayed refused
// on partition 1: neither could leave that state (found by a review). Cleared from the last
// partition down, the mark left is partition 0's: the join is refused before it joins anything,
// and the disband run again finishes.
func TestEndDisbandCutShortHoldsTheNextJoinWhole(t *testing.T) {
	t.Parallel()
	env := newProjEnv(t)
	ctx := context.Background()
	c, keys, parts, l := liveOnTwoPartitions(t, env)

	hooked := redistest.Client(t, env.url)
	seen := 0
	hooked.AddHook(failNthHDel{prefix: "disbanding:", n: 2, seen: &seen})
	b := adapters.NewOpsBackend(hooked, keys)
	d, err := command.NewDisbandLiveGroup(b, time.Millisecond)
	require.NoError(t, err)
	_, err = d.Run(ctx, "live", false)
	require.ErrorContains(t, err, "run it again")

	// A projector of the old set starts (PROJECTIONS unset): refused, on partition 1.
	for _, stream := range parts.Streams() {
		require.NoError(t, c.XAdd(ctx, &redis.XAddArgs{Stream: stream, Values: []any{"k", "v2"}}).Err())
	}
	_, err = l.Join(ctx, "live", "users.v1")
	require.ErrorIs(t, err, ops.ErrDisbandUnfinished)

	// The operator runs the disband again, as told.
	_, err = d.Run(ctx, "live", false)
	require.NoError(t, err, "a rerun of a disband cut short finishes it")
	_, err = l.Join(ctx, "live:users", "users.v1")
	require.NoError(t, err, "the moved version joins its new set")
}

// TestEndDropCutShortHoldsTheNextJoinWhole: the same with a drop, cut short inside EndDrop (its
// read model already gone). Cleared from partition 0 on, a projector that runs the version joined
// it on partition 0 and was refused on partition 1, and the drop run again was refused (JOINED);
// cleared from the last partition down, the join is refused whole, and the drop run again
// finishes.
func TestEndDropCutShortHoldsTheNextJoinWhole(t *testing.T) {
	t.Parallel()
	env := newProjEnv(t)
	ctx := context.Background()
	c, keys, _, l := liveOnTwoPartitions(t, env)
	b := adapters.NewOpsBackend(c, keys)
	d, err := command.NewDisbandLiveGroup(b, time.Millisecond)
	require.NoError(t, err)
	_, err = d.Run(ctx, "live", false)
	require.NoError(t, err)

	hooked := redistest.Client(t, env.url)
	seen := 0
	hooked.AddHook(failNthHDel{prefix: "dropping:", n: 2, seen: &seen})
	drop, err := command.NewDropMovedVersion(adapters.NewOpsBackend(hooked, keys), time.Millisecond)
	require.NoError(t, err)
	_, err = drop.Run(ctx, "users.v1", false)
	require.ErrorContains(t, err, "run this again to finish")

	_, err = l.Join(ctx, "live:users", "users.v1")
	require.ErrorIs(t, err, ops.ErrDropUnfinished, "refused whole")

	_, err = drop.Run(ctx, "users.v1", false)
	require.NoError(t, err, "a drop cut short is finished by a rerun")
	_, err = l.Join(ctx, "live:users", "users.v1")
	require.NoError(t, err, "then the version runs again")
}
