package adapters_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/checkins/checkins/adapters"
	"github.com/checkins/checkins/adapters/redistest"
	"github.com/checkins/checkins/app/projection"
)

// TestApplyInAMigratingSlot: while a user's slot is migrating (MIGRATING on its master,
// IMPORTING on another, its keys not moved yet, as `redis-cli --cluster rebalance` leaves a slot
// between two MIGRATEs), the applier's scripts run on the master that still holds the keys and
// succeed, even when a prune empties a set the script touches (the dedupe registry, the group's
// marker set): Redis checks each command of a script as it checks a client's, and a command on a
// key that is gone, in a migrating slot, fails the script half-way with "Script attempted to
// access a non local key". Such a failure is no transient one: under a rebalance with load it
// parked an event, and a user's count stayed one short. The marker sweep, which writes a
// pruned set again in the compact encoding, must not lose the set there either.
func TestApplyInAMigratingSlot(t *testing.T) {
	t.Parallel()
	cl := redistest.StartCluster(t, redistest.ClusterOptions{})
	ctx := context.Background()
	client := redistest.ClusterClient(t, cl.URL())
	keys := adapters.KeySpace{Prefix: "mig"}
	env := projEnv{url: cl.URL(), cluster: true, client: client, keys: keys}
	const user, loc = 7, 3
	t0 := int64(1_700_000_000_000)

	a, err := adapters.NewProjectionApplier(client, keys, time.Second)
	require.NoError(t, err)
	a.PruneEvery(1)
	works := func(group string, id string, ms int64) []projection.Work {
		ev := recorded(id, user, loc, 4, ms)
		var ws []projection.Work
		for _, p := range []projection.Projection{projection.UserStats{}, projection.LocationStats{}} {
			us, err := projection.Updates(ctx, p, ev)
			require.NoError(t, err)
			ws = append(ws, projection.Work{Group: group, Projection: p.Name(), Version: 1, Event: projection.RefOf(ev, entry(ms)), Updates: us})
		}
		return ws
	}
	apply := func(ws []projection.Work, prune projection.Prune) []projection.Outcome {
		t.Helper()
		out, err := a.Apply(ctx, ws, prune)
		require.NoError(t, err, "apply in a migrating slot")
		return out
	}

	// Before the move: the first check-in, and 150 more of the user under another group without
	// pruning, so that group's marker set in the user's slot is large (Redis's skiplist encoding).
	apply(works("live", "ck-0", t0), nil)
	var many []projection.Work
	for i := range 150 {
		many = append(many, works("other", fmt.Sprintf("o-%d", i), t0+int64(i))...)
	}
	apply(many, nil)

	slot := adapters.KeySlot(keys.Registry(user))
	require.Equal(t, slot, adapters.KeySlot(keys.MarkerKey("live", "user:7")), "the registry and the markers share the user's slot")
	mig := cl.StartSlotMigration(t, slot)
	srcNode, dstNode := mig.SrcNode, mig.DstNode
	t.Cleanup(func() {
		_ = srcNode.Do(context.Background(), "cluster", "setslot", slot, "stable").Err()
		_ = dstNode.Do(context.Background(), "cluster", "setslot", slot, "stable").Err()
	})
	for _, k := range []string{keys.Registry(user), keys.MarkerKey("live", "user:7")} {
		n, err := srcNode.Exists(ctx, k).Result()
		require.NoError(t, err)
		require.EqualValues(t, 1, n, "%s is still on the migrating master", k)
	}

	// 10 s later, beyond the 1 s window: the registry's only identity and the group's only
	// marker are pruned in the call that decides and applies the second check-in.
	t1 := t0 + 10_000
	require.NoError(t, a.SetRegistryFloor(entry(t1)))
	out := apply(works("live", "ck-1", t1), func(string) (string, bool) { return entry(t1), true })
	assert.Equal(t, []projection.Outcome{projection.Applied, projection.Applied}, out)
	assert.EqualValues(t, 152, env.userStats(t, user).NumCheckins, "ck-1 counted in the migrating slot")
	for _, k := range []string{keys.Registry(user), keys.MarkerKey("live", "user:7")} {
		members, err := srcNode.ZRange(ctx, k, 0, -1).Result()
		require.NoError(t, err)
		assert.Len(t, members, 1, "%s holds the second check-in only", k)
	}
	// Delivered again: a marker says it landed.
	out = apply(works("live", "ck-1", t1), func(string) (string, bool) { return entry(t1), true })
	assert.Equal(t, []projection.Outcome{projection.AlreadyApplied, projection.AlreadyApplied}, out)
	assert.EqualValues(t, 152, env.userStats(t, user).NumCheckins)

	// A check-in with no update in the user's slot is decided by a call of its own
	// (decideScript), which prunes the registry too.
	t2 := t1 + 10_000
	require.NoError(t, a.SetRegistryFloor(entry(t2)))
	ev := recorded("ck-2", user, loc, 5, t2)
	us, err := projection.Updates(ctx, projection.LocationStats{}, ev)
	require.NoError(t, err)
	out = apply([]projection.Work{{Group: "live", Projection: "locations", Version: 1, Event: projection.RefOf(ev, entry(t2)), Updates: us}}, nil)
	assert.Equal(t, []projection.Outcome{projection.Applied}, out)
	ids, err := srcNode.ZRange(ctx, keys.Registry(user), 0, -1).Result()
	require.NoError(t, err)
	assert.Len(t, ids, 1, "the registry holds the third check-in only")

	// The sweep of the other group's markers below its 100th entry leaves 50, written again
	// compact, in the migrating slot.
	marker := keys.MarkerKey("other", "user:7")
	enc, err := srcNode.ObjectEncoding(ctx, marker).Result()
	require.NoError(t, err)
	require.Equal(t, "skiplist", enc)
	_, err = a.Sweep(ctx, "other", entry(t0+100))
	require.NoError(t, err, "sweep in a migrating slot")
	n, err := srcNode.ZCard(ctx, marker).Result()
	require.NoError(t, err)
	assert.EqualValues(t, 50, n, "the markers above the bound stay")
	enc, err = srcNode.ObjectEncoding(ctx, marker).Result()
	require.NoError(t, err)
	assert.Equal(t, "listpack", enc, "written again compact")
}
