package adapters_test

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/checkins/checkins/adapters"
	"github.com/checkins/checkins/adapters/redistest"
)

// TestBusyGroupAndBusyKeyAreNotTransient: BUSYGROUP (XGROUP CREATE of a group that exists) and
// BUSYKEY (RESTORE onto a key that exists) are answers about what was asked, to be parked or
// failed, not retried for good; they were taken for BUSY (a script running), whose code they
// begin with. BUSY itself, a real one, still is transient.
func TestBusyGroupAndBusyKeyAreNotTransient(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t, redistest.Options{})
	c := redistest.Client(t, srv.URL())
	ctx := t.Context()
	require.NoError(t, c.XGroupCreateMkStream(ctx, "s", "g", "0").Err())
	err := c.XGroupCreateMkStream(ctx, "s", "g", "0").Err()
	require.True(t, redis.HasErrorPrefix(err, "BUSYGROUP"), "a real BUSYGROUP: %v", err)
	reason, ok := adapters.TransientReason(err)
	assert.False(t, ok, "BUSYGROUP is permanent, got transient %q: %v", reason, err)
	// The same from inside a script.
	err = c.Eval(ctx, `return redis.call('XGROUP', 'CREATE', KEYS[1], 'g', '0')`, []string{"s"}).Err()
	require.ErrorContains(t, err, "BUSYGROUP")
	reason, ok = adapters.TransientReason(err)
	assert.False(t, ok, "BUSYGROUP in a script is permanent, got transient %q: %v", reason, err)

	require.NoError(t, c.Set(ctx, "k", "v", 0).Err())
	dump, err := c.Dump(ctx, "k").Result()
	require.NoError(t, err)
	err = c.Restore(ctx, "k", 0, dump).Err()
	require.True(t, redis.HasErrorPrefix(err, "BUSYKEY"), "a real BUSYKEY: %v", err)
	reason, ok = adapters.TransientReason(err)
	assert.False(t, ok, "BUSYKEY is permanent, got transient %q: %v", reason, err)

	// A script running past busy-reply-threshold: the server answers others BUSY.
	require.NoError(t, c.ConfigSet(ctx, "busy-reply-threshold", "20").Err())
	long := redistest.Client(t, srv.URL())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = long.Eval(context.Background(), `local t = redis.call('TIME') local s = tonumber(t[1])
			while tonumber(redis.call('TIME')[1]) < s + 3 do end return 1`, nil).Err()
	}()
	var busy error
	require.Eventually(t, func() bool {
		busy = c.Ping(ctx).Err()
		return busy != nil
	}, 2*time.Second, 10*time.Millisecond)
	_ = c.ScriptKill(ctx).Err()
	<-done
	require.True(t, redis.HasErrorPrefix(busy, "BUSY "), "a real BUSY: %v", busy)
	reason, ok = adapters.TransientReason(busy)
	assert.True(t, ok, "BUSY is transient: %v", busy)
	assert.Equal(t, "redis busy running a script", reason)
}
