package adapters_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/checkins/checkins/adapters"
	"github.com/checkins/checkins/adapters/redistest"
)

// failScripts fails every script call of a client while on: the lease's extensions cannot reach
// Redis (a partition, a stalled connection), while other clients can.
type failScripts struct{ on atomic.Bool }

func (h *failScripts) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *failScripts) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (h *failScripts) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if h.on.Load() && strings.HasPrefix(strings.ToLower(fmt.Sprint(cmd.Args()[0])), "eval") {
			cmd.SetErr(errors.New("unreachable"))
			return cmd.Err()
		}
		return next(ctx, cmd)
	}
}

// TestLeaseIsLostBeforeAnotherHolderCanTakeIt: a holder whose extensions fail learns that its
// lease is lost while the key still holds its token, before it can expire and another run take
// it; a holder whose key was taken learns it at its next extension; release lets go only of its
// own token.
func TestLeaseIsLostBeforeAnotherHolderCanTakeIt(t *testing.T) {
	t.Parallel()
	rdb := redistest.Open(t)
	keys := adapters.KeySpace{Prefix: rdb.Prefix}
	ctx := context.Background()
	admin := redistest.Client(t, rdb.URL)
	hook := &failScripts{}
	holder := redistest.Client(t, rdb.URL)
	holder.AddHook(hook)
	const ttl = 3 * time.Second

	lost, release, ok, err := adapters.NewPartitionMigrator(holder, keys).Lock(ctx, ttl)
	require.NoError(t, err)
	require.True(t, ok)
	_, _, ok, err = adapters.NewPartitionMigrator(admin, keys).Lock(ctx, ttl)
	require.NoError(t, err)
	assert.False(t, ok, "held")
	hook.on.Store(true)
	select {
	case <-lost:
	case <-time.After(2 * ttl):
		t.Fatal("the lease was never said lost")
	}
	assert.Positive(t, admin.PTTL(ctx, keys.MigrateLock()).Val(), "said lost while the key still held its token: no other run had it yet")
	hook.on.Store(false)
	require.NoError(t, release(ctx))

	lost, release, ok, err = adapters.NewPartitionMigrator(holder, keys).Lock(ctx, 300*time.Millisecond)
	require.NoError(t, err)
	require.True(t, ok)
	require.NoError(t, admin.Set(ctx, keys.MigrateLock(), "another run", time.Minute).Err())
	select {
	case <-lost:
	case <-time.After(10 * time.Second):
		t.Fatal("a lease whose key was taken was never said lost")
	}
	require.NoError(t, release(ctx))
	assert.Equal(t, "another run", admin.Get(ctx, keys.MigrateLock()).Val(), "release deletes only its own token")
}
