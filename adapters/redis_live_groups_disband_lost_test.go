package adapters_test

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/checkins/checkins/adapters"
)

// TestJoinOfAMovedVersionWhoseGroupIsLost: the moved record says where the version's
// own group starts (pos: what the old live group applied), but joinLua only looks at the group
// itself. With the group missing (lost, destroyed by hand or by RemoveFinishedBackfills' second
// destroy, see the race test) a moved version joining a new live group is taken for a first
// start: joined at 0-0, backfill "done", the live group created at "0". The whole history the
// old live group applied is delivered to it again, and the moved record is deleted, so nothing
// tells afterwards.
func TestJoinOfAMovedVersionWhoseGroupIsLost(t *testing.T) {
	t.Parallel()
	env := newProjEnv(t)
	ctx := context.Background()
	c, keys := env.client, env.keys
	l := adapters.NewLiveGroups(c, keys)
	stream := keys.Stream()
	_, err := l.Join(ctx, "live", "users.v1")
	require.NoError(t, err)
	for range 5 {
		require.NoError(t, c.XAdd(ctx, &redis.XAddArgs{Stream: stream, Values: []any{"k", "v"}}).Err())
	}
	res, err := c.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "live", Consumer: "c1", Streams: []string{stream, ">"}, Block: -1}).Result()
	require.NoError(t, err)
	for _, m := range res[0].Messages {
		require.NoError(t, c.XAck(ctx, stream, "live", m.ID).Err())
	}
	time.Sleep(5 * time.Millisecond)
	_, err = l.Disband(ctx, "live", time.Millisecond, true)
	require.NoError(t, err)
	moved, err := l.ReadMoved(ctx)
	require.NoError(t, err)
	pos := moved[stream]["users.v1"].Pos
	require.NoError(t, c.XGroupDestroy(ctx, stream, "users.v1").Err()) // the group is lost

	ms, err := l.Join(ctx, "live:users", "users.v1")
	require.NoError(t, err)
	m := ms.Members["users.v1"]
	t.Logf("moved at %s; joined: %+v", pos, m)
	gs, err := c.XInfoGroups(ctx, stream).Result()
	require.NoError(t, err)
	for _, g := range gs {
		t.Logf("group %s at %s", g.Name, g.LastDeliveredID)
		// Whatever feeds users.v1 next must start after what it applied.
		if g.Name == "users.v1" || g.Name == "live:users" && m.Join == "0-0" {
			assert.Equal(t, pos, g.LastDeliveredID, "%s would deliver again what users.v1 applied through %s", g.Name, pos)
		}
	}
}
