package adapters_test

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/checkins/checkins/adapters"
	"github.com/checkins/checkins/app/command"
	"github.com/checkins/checkins/app/ops"
	"github.com/checkins/checkins/domain"
	"github.com/checkins/checkins/ports"
)

// markersFailOnce fails the first removal of markers (the command cut short there).
type markersFailOnce struct {
	ops.ProjectionKeys
	failed *bool
}

func (m markersFailOnce) RemoveMarkers(ctx context.Context, group string) (int64, error) {
	if !*m.failed {
		*m.failed = true
		return 0, errors.New("connection reset (injected)")
	}
	return m.ProjectionKeys.RemoveMarkers(ctx, group)
}

// TestDisbandCutShortHoldsJoinsUntilARerunFinishes: a disband removes the live group and then, in
// a second step, its applied markers. Cut short between the two, it leaves a disbanding mark: a
// projector of the old set started meanwhile may not join a group of that name (its markers
// would go with the old ones: a redelivered entry counted twice), while the moved versions join
// their new groups. Run again, with nothing moved any more, the command still finishes: the
// markers go, and so does the mark.
func TestDisbandCutShortHoldsJoinsUntilARerunFinishes(t *testing.T) {
	t.Parallel()
	env := newProjEnv(t)
	ctx := context.Background()
	c, keys := env.client, env.keys
	l := adapters.NewLiveGroups(c, keys)
	stream := keys.Stream()
	require.NoError(t, c.XAdd(ctx, &redis.XAddArgs{Stream: stream, Values: []any{"k", "v"}}).Err())
	_, err := l.Join(ctx, "live", "users.v1")
	require.NoError(t, err)
	res, err := c.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "live", Consumer: "c1", Streams: []string{stream, ">"}, Block: -1}).Result()
	require.NoError(t, err)
	require.NoError(t, c.XAck(ctx, stream, "live", res[0].Messages[0].ID).Err())
	marker := keys.MarkerPrefix("live") + "{user:7}"
	require.NoError(t, c.ZAdd(ctx, marker, redis.Z{Score: 1, Member: "applied-through-live"}).Err())
	time.Sleep(5 * time.Millisecond)

	b := adapters.NewOpsBackend(c, keys)
	failed := false
	b.Keys = markersFailOnce{ProjectionKeys: b.Keys, failed: &failed}
	d, err := command.NewDisbandLiveGroup(b, time.Millisecond)
	require.NoError(t, err)
	_, err = d.Run(ctx, "live", false)
	require.ErrorContains(t, err, "disbanded live, but removing the markers of live failed")
	assert.Equal(t, int64(1), c.Exists(ctx, marker).Val(), "cut short before the markers went")

	_, err = l.Join(ctx, "live", "users.v1")
	require.ErrorIs(t, err, ops.ErrDisbandUnfinished, "a projector of the old set waits")
	_, err = l.Join(ctx, "live:users", "users.v1")
	require.NoError(t, err, "the moved version joins its new group")

	var out bytes.Buffer
	rep, err := d.Run(ctx, "live", true)
	require.NoError(t, err)
	assert.True(t, rep.Unfinished)
	require.NoError(t, ports.WriteDisbandText(&out, rep))
	assert.Contains(t, out.String(), "removing its applied markers was cut short: run this again without --dry-run to finish")
	assert.Equal(t, int64(1), c.Exists(ctx, marker).Val(), "a check changes nothing")

	rep, err = d.Run(ctx, "live", false)
	require.NoError(t, err)
	assert.True(t, rep.Done)
	out.Reset()
	require.NoError(t, ports.WriteDisbandText(&out, rep))
	assert.Contains(t, out.String(), "finished removing what its disband left")
	assert.Zero(t, c.Exists(ctx, marker).Val(), "the markers went")
	_, err = d.Run(ctx, "live", false)
	require.ErrorIs(t, err, domain.ErrNotFound, "nothing left to finish")
	_, err = l.Join(ctx, "live", "locations.v1")
	require.NoError(t, err, "a group of that name is joined again")
}
