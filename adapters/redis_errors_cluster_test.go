package adapters_test

import (
	"context"
	"strconv"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/checkins/checkins/adapters"
	"github.com/checkins/checkins/adapters/redistest"
)

// TestTryAgainDuringSlotMigrationIsTransient: while a slot moves between masters, a script on
// two of its keys of which one has moved already gets TRYAGAIN from a real cluster (go-redis
// retries it a few times, then returns it). It is classified transient ("redis cluster moving
// keys": retried, never parked), and the same script succeeds once the slot has moved.
func TestTryAgainDuringSlotMigrationIsTransient(t *testing.T) {
	t.Parallel()
	cl := redistest.StartCluster(t, redistest.ClusterOptions{})
	cc := redistest.ClusterClient(t, cl.URL())
	ctx := context.Background()
	a, b := "tryagain:{t}:a", "tryagain:{t}:b"
	require.NoError(t, cc.Set(ctx, a, "1", 0).Err())
	require.NoError(t, cc.Set(ctx, b, "1", 0).Err())
	slot := adapters.KeySlot(a)
	mig := cl.StartSlotMigration(t, slot)
	srcC := mig.SrcNode
	host, port, _ := strings.Cut(cl.Addrs()[mig.Dst], ":")
	p, _ := strconv.Atoi(port)
	require.NoError(t, srcC.Migrate(ctx, host, strconv.Itoa(p), a, 0, 5e9).Err())

	script := redis.NewScript(`return redis.call('INCR', KEYS[1]) + redis.call('INCR', KEYS[2])`)
	err := script.Run(ctx, cc, []string{a, b}).Err()
	require.Error(t, err, "one key moved, the other not: the slot is being migrated")
	assert.True(t, redis.HasErrorPrefix(err, "TRYAGAIN"), "a real TRYAGAIN: %v", err)
	reason, ok := adapters.TransientReason(err)
	assert.True(t, ok, "TRYAGAIN is transient: %v", err)
	assert.Equal(t, "redis cluster moving keys", reason)

	// The move completes: the same call succeeds (each key incremented once).
	require.NoError(t, srcC.Migrate(ctx, host, strconv.Itoa(p), b, 0, 5e9).Err())
	for _, m := range cl.Masters(t) {
		require.NoError(t, cl.NodeClient(t, m).Do(ctx, "CLUSTER", "SETSLOT", slot, "NODE", mig.DstID).Err())
	}
	n, err := script.Run(ctx, cc, []string{a, b}).Int()
	require.NoError(t, err)
	assert.Equal(t, 4, n)
}

// TestRedirectionIsTransient: a MOVED or ASK that reaches the caller (go-redis follows a few,
// then returns the last one; a client without redirections returns the first) is the cluster
// moving slots, not the event's fault: transient, retried, never parked. Without this, a
// reshard under load with redirections exhausted parked events and the read models lost them.
func TestRedirectionIsTransient(t *testing.T) {
	t.Parallel()
	cl := redistest.StartCluster(t, redistest.ClusterOptions{})
	ctx := context.Background()
	key := "redirect:{r}:a"
	slot := adapters.KeySlot(key)
	owner := cl.MasterOf(t, slot)
	other := -1
	for _, m := range cl.Masters(t) {
		if m != owner {
			other = m
			break
		}
	}
	err := cl.NodeClient(t, other).Get(ctx, key).Err()
	require.Error(t, err)
	assert.True(t, redis.HasErrorPrefix(err, "MOVED"), "a real MOVED: %v", err)
	reason, ok := adapters.TransientReason(err)
	assert.True(t, ok, "MOVED is transient: %v", err)
	assert.Equal(t, "redis cluster moving keys", reason)

	// ASK: the slot is migrating and the key is not on its old master any more.
	src := cl.StartSlotMigration(t, slot).SrcNode
	err = src.Get(ctx, key).Err()
	require.Error(t, err)
	assert.True(t, redis.HasErrorPrefix(err, "ASK"), "a real ASK: %v", err)
	_, ok = adapters.TransientReason(err)
	assert.True(t, ok, "ASK is transient: %v", err)
}
