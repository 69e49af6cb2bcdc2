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

// earlierDestroyFinishedLua is destroyFinishedLua as ae7590d (the previous build) ran it: it
// marks the member removing with a JSON boolean.
var earlierDestroyFinishedLua = redis.NewScript(`
local field = 'live:' .. ARGV[1]
local raw = redis.call('HGET', KEYS[1], field)
if not raw then return 0 end
local m = cjson.decode(raw)
local rec = m[ARGV[2]]
if not rec or rec.own ~= 'done' then return 0 end
if not rec.removing then
  rec.removing = true
  redis.call('HSET', KEYS[1], field, cjson.encode(m))
end
redis.call('HDEL', KEYS[1], 'acked:' .. ARGV[2], 'seen:' .. ARGV[2])
if redis.call('EXISTS', KEYS[2]) == 1 then
  for _, g in ipairs(redis.call('XINFO', 'GROUPS', KEYS[2])) do
    for x = 1, #g, 2 do
      if g[x] == 'name' and g[x+1] == ARGV[2] then redis.call('XGROUP', 'DESTROY', KEYS[2], ARGV[2]) end
    end
  end
end
return 1
`)

// TestMarkOfAnEarlierBuildIsTakenUp: a build of 2026-12-07 (ae7590d) marked a finished
// backfill's removal as "removing": true; its removal was cut short after the checked destroy.
// The membership still reads (the mark a string now), and the next run takes the removal up and
// clears the mark.
func TestMarkOfAnEarlierBuildIsTakenUp(t *testing.T) {
	t.Parallel()
	env := newProjEnv(t)
	ctx := context.Background()
	c, keys := env.client, env.keys
	l := adapters.NewLiveGroups(c, keys)
	stream := keys.Stream()
	require.NoError(t, c.XAdd(ctx, &redis.XAddArgs{Stream: stream, Values: []any{"k", "v"}}).Err())
	require.NoError(t, c.XGroupCreate(ctx, stream, "live", "$").Err())
	_, err := l.Join(ctx, "live", "users.v1")
	require.NoError(t, err)
	_, err = l.FinishBackfill(ctx, "live", "users.v1", time.Now().Add(-time.Hour))
	require.NoError(t, err)
	marker := keys.MarkerPrefix("users.v1") + "{0}"
	require.NoError(t, c.ZAdd(ctx, marker, redis.Z{Score: 1, Member: "identity"}).Err())

	// The previous build's run: checked destroy, then cut short before removing the markers.
	reg := keys.Partitions().Registry(0)
	require.NoError(t, earlierDestroyFinishedLua.Run(ctx, c, []string{reg, stream}, "live", "users.v1").Err())
	raw := c.HGet(ctx, reg, "live:live").Val()
	t.Logf("membership left by ae7590d: %s", raw)

	// The upgraded build.
	_, _, err = l.ReadAll(ctx)
	assert.NoError(t, err, "ReadAll of a membership marked by the previous build")
	_, err = l.Read(ctx, "live")
	assert.NoError(t, err, "Read of a membership marked by the previous build")
	rb := removalRun(t, adapters.NewOpsBackend(c, keys), time.Millisecond)
	for range 3 {
		assert.NoError(t, rb.RemoveFinishedBackfills(ctx))
	}
	n, err := c.Exists(ctx, marker).Result()
	require.NoError(t, err)
	assert.Zero(t, n, "the cut-short removal is taken up by the upgraded build")
	raw = c.HGet(ctx, reg, "live:live").Val()
	assert.NotContains(t, raw, "removing", "the mark is cleared, or the disband is refused for good")
}
