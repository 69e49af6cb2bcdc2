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
)

// ReadKeyspaceInfo counts the keys of the client's own database and those of them with a TTL;
// another database's keys are not counted, and an empty database is 0 (not unreported).
func TestReadKeyspaceInfo(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t, redistest.Options{})
	ctx := context.Background()
	db3 := redistest.Client(t, "redis://"+srv.Addr()+"/3")
	for i := range 5 {
		ttl := time.Duration(0)
		if i < 3 {
			ttl = time.Hour
		}
		require.NoError(t, db3.Set(ctx, fmt.Sprintf("k%d", i), "v", ttl).Err())
	}
	require.NoError(t, redistest.Client(t, "redis://"+srv.Addr()+"/0").Set(ctx, "elsewhere", "v", time.Hour).Err())

	k, err := adapters.ReadKeyspaceInfo(ctx, db3)
	require.NoError(t, err)
	assert.Equal(t, adapters.KeyspaceInfo{Reported: true, Keys: 5, Expiring: 3}, k)
	k, err = adapters.ReadKeyspaceInfo(ctx, redistest.Client(t, "redis://"+srv.Addr()+"/5"))
	require.NoError(t, err)
	assert.Equal(t, adapters.KeyspaceInfo{Reported: true}, k, "an empty database")
}

// On a cluster the keys of every master are summed.
func TestReadKeyspaceInfoOnACluster(t *testing.T) {
	t.Parallel()
	cl := redistest.StartCluster(t, redistest.ClusterOptions{})
	c := redistest.ClusterClient(t, cl.URL())
	ctx := context.Background()
	for i := range 30 { // keys in many slots, so on every master
		ttl := time.Duration(0)
		if i%3 == 0 {
			ttl = time.Hour
		}
		require.NoError(t, c.Set(ctx, fmt.Sprintf("key-%d", i), "v", ttl).Err())
	}
	k, err := adapters.ReadKeyspaceInfo(ctx, c)
	require.NoError(t, err)
	assert.Equal(t, adapters.KeyspaceInfo{Reported: true, Keys: 30, Expiring: 10}, k)
}
