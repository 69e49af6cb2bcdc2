package adapters_test

import (
	"context"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/checkins/checkins/adapters"
	"github.com/checkins/checkins/app/command"
	"github.com/checkins/checkins/app/projection"
)

// TestDisbandKeepsOtherGroupsMarkers: disbanding "live" removes its applied markers by
// the pattern <prefix>:applied:live:*, which also matches the markers of every running
// "live:<a>,<b>" group (<prefix>:applied:live:users:{...}). A redelivery in that group is then
// applied again: counted twice.
func TestDisbandKeepsOtherGroupsMarkers(t *testing.T) {
	t.Parallel()
	eachEnv(t, func(t *testing.T, env projEnv) {
		ctx := context.Background()
		env.keys.Cluster = env.cluster
		a := env.applier(t, env.client)
		ev := recorded("ck-1", 42, 7, 4, 1_700_000_000_000)
		apply := func() projection.Outcome {
			us, err := projection.Updates(ctx, projection.UserStats{}, ev)
			require.NoError(t, err)
			out, err := a.Apply(ctx, []projection.Work{{Group: "live:users", Projection: "users", Version: 1,
				Event: projection.RefOf(ev, entry(1_700_000_000_001)), Updates: us}}, nil)
			require.NoError(t, err)
			return out[0]
		}
		// A projector of the new set "live:users" applied an entry and has not acknowledged it yet.
		require.Equal(t, projection.Applied, apply())

		// The old group "live" (locations.v1) is disbanded, its projectors stopped.
		require.NoError(t, env.client.XAdd(ctx, &redis.XAddArgs{Stream: env.keys.Stream(), Values: []any{"k", "v"}}).Err())
		_, err := adapters.NewLiveGroups(env.client, env.keys).Join(ctx, "live", "locations.v1")
		require.NoError(t, err)
		d, err := command.NewDisbandLiveGroup(adapters.NewOpsBackend(env.client, env.keys), command.DefaultClaimIdle)
		require.NoError(t, err)
		_, err = d.Run(ctx, "live", false)
		require.NoError(t, err)

		// live:users' entry is delivered again (a crash before its XACK, a takeover).
		assert.Equal(t, projection.AlreadyApplied, apply(), "live:users' markers must survive disbanding live")
		assert.Equal(t, int64(1), env.userStats(t, 42).NumCheckins)
	})
}
