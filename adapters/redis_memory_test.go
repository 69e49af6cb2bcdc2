package adapters_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
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

// TestMemoryRatioSeesAFullMaster: on a cluster whose one master is at its maxmemory (it refuses
// the writes of its slots: 503 for those users) while the others have room, the sums of used and
// max memory say almost nothing is used; checkins_redis_memory_used_ratio is the fullest
// master's, so the alert on it fires.
func TestMemoryRatioSeesAFullMaster(t *testing.T) {
	t.Parallel()
	cl := redistest.StartCluster(t, redistest.ClusterOptions{})
	c := redistest.ClusterClient(t, cl.URL())
	ctx := t.Context()
	masters := cl.Masters(t)
	require.GreaterOrEqual(t, len(masters), 2)
	for i, m := range masters {
		limit := "1gb"
		if i == 0 {
			limit = "1" // at its limit at once
		}
		require.NoError(t, cl.NodeClient(t, m).ConfigSet(ctx, "maxmemory", limit).Err())
	}
	refused := false
	for i := 0; i < 200 && !refused; i++ {
		if err := c.Set(ctx, fmt.Sprintf("k%d", i), "v", 0).Err(); err != nil {
			require.ErrorContains(t, err, "OOM")
			refused = true
		}
	}
	require.True(t, refused, "writes to the full master's slots are refused")

	gauges := func(c *adapters.RedisMemoryCollector) map[string]float64 {
		reg := prometheus.NewRegistry()
		reg.MustRegister(c)
		mfs, err := reg.Gather()
		require.NoError(t, err)
		vals := map[string]float64{}
		for _, mf := range mfs {
			for _, m := range mf.GetMetric() {
				vals[mf.GetName()] = m.GetGauge().GetValue()
			}
		}
		return vals
	}
	vals := gauges(adapters.NewRedisMemoryCollector(c, 2*time.Second))
	assert.Less(t, vals["checkins_redis_used_memory_bytes"]/vals["checkins_redis_maxmemory_bytes"], 0.1, "the sums hide it")
	assert.Greater(t, vals["checkins_redis_memory_used_ratio"], 1.0, "the fullest master is past its limit: %v", vals)

	// One server: its own ratio; none without a limit.
	srv := redistest.Start(t, redistest.Options{})
	one := redistest.Client(t, srv.URL())
	vals = gauges(adapters.NewRedisMemoryCollector(one, 2*time.Second))
	assert.NotContains(t, vals, "checkins_redis_memory_used_ratio", "no limit, no ratio")
	require.NoError(t, one.ConfigSet(ctx, "maxmemory", "1gb").Err())
	vals = gauges(adapters.NewRedisMemoryCollector(one, 2*time.Second))
	assert.InDelta(t, vals["checkins_redis_used_memory_bytes"]/(1<<30), vals["checkins_redis_memory_used_ratio"], 1e-4)
}
