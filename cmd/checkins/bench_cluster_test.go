package main

import (
	"bytes"
	"context"
	"strings"
	"sync"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/checkins/checkins/adapters/redistest"
	"github.com/checkins/checkins/cmd/checkins/bench"
)

// `bench --cluster` starts a private cluster of 3 masters, runs every phase on it with the
// cluster's 24 stream partitions (the baselines too), and every exactness check passes: the
// stream checks sum the partitions, the drains wait for every partition, the memory phase sums
// the masters' used_memory.
func TestBenchEveryPhaseOnPrivateCluster(t *testing.T) {
	t.Parallel()
	res := runBenchJSON(t, envWith(map[string]string{"REDIS_URL": "", "PROJECTIONS": ""}), "--cluster",
		"--duration", "1s", "--clients", "8", "--events", "2000", "--consumers", "1,2", "--rate", "200", "--memory-events", "300")
	assert.Contains(t, res.Machine.Redis, "private cluster of 3 masters")
	assert.Contains(t, res.Machine.Redis, "24 stream partitions")
	seen := map[string]bool{}
	for _, p := range res.Phases {
		seen[p.Phase] = true
		if p.Phase != bench.PhaseMemory { // a difference of used_memory: noise at this size
			assert.Positive(t, p.Throughput, "%s throughput", p.Phase)
		}
		assert.Equal(t, bench.CheckOK, p.Check, "%s check: %s", p.Phase, p.CheckDetail)
		if p.Phase == bench.PhaseMemory {
			require.NotNil(t, p.Memory)
			assert.Equal(t, bench.FigureUsedMemory, p.Memory.Figure, "a private cluster: the masters' used_memory, summed")
			assert.Positive(t, p.Memory.PerKeyBytes)
		}
	}
	assert.ElementsMatch(t, bench.PhaseOrder(), keysOf(seen))
}

// With REDIS_URL naming a cluster the bench writes on every master (the ingest baseline's XADDs
// go to the partitions ingest would pick) and deletes its keys, and only its keys, on every master.
func TestBenchOnClusterURLDeletesOnlyItsKeys(t *testing.T) {
	t.Parallel()
	cl := redistest.StartCluster(t, redistest.ClusterOptions{})
	cc := redistest.ClusterClient(t, cl.URL())
	ctx := context.Background()
	require.NoError(t, cc.Set(ctx, "someone-else:key", "kept", 0).Err())
	var mu sync.Mutex
	xadds := map[string]bool{}
	var stdout, stderr bytes.Buffer
	code := run([]string{"bench", "--phases", "ingest-baseline,drain,memory", "--duration", "500ms", "--clients", "4",
		"--events", "500", "--consumers", "1", "--memory-events", "200"}, envWith(map[string]string{"REDIS_URL": cl.URL(), "PROJECTIONS": ""}), &stdout, &stderr)
	require.Equal(t, 0, code, "bench failed; stderr:\n%s", stderr.String())
	out := stdout.String()
	assert.Contains(t, out, "REDIS_URL cluster")
	assert.NotContains(t, out, bench.CheckMismatch)
	assert.Contains(t, out, "(by per_key)", "a shared cluster: MEMORY USAGE sums")

	// Every master took XADDs (the baseline's and the preloads', spread over the partitions).
	for _, i := range cl.Masters(t) {
		info, err := cl.NodeClient(t, i).Info(ctx, "commandstats").Result()
		require.NoError(t, err)
		mu.Lock()
		xadds[cl.Addrs()[i]] = strings.Contains(info, "cmdstat_xadd:")
		mu.Unlock()
	}
	for addr, ok := range xadds {
		assert.True(t, ok, "master %s took XADDs", addr)
	}
	var left []string
	require.NoError(t, cc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error {
		ks, err := c.Keys(ctx, "*").Result()
		mu.Lock()
		left = append(left, ks...)
		mu.Unlock()
		return err
	}))
	assert.Equal(t, []string{"someone-else:key"}, left, "the bench must delete its keys and only its keys, on every master")
}

// --cluster starts a private cluster: with REDIS_URL set too, the bench says which to drop.
func TestBenchClusterFlagWithRedisURLFails(t *testing.T) {
	t.Parallel()
	var stdout, stderr bytes.Buffer
	code := run([]string{"bench", "--cluster", "--phases", "ingest"}, envWith(map[string]string{"REDIS_URL": "redis://127.0.0.1:1", "PROJECTIONS": ""}), &stdout, &stderr)
	assert.NotEqual(t, 0, code)
	assert.Contains(t, stderr.String(), "--cluster starts a private cluster: unset REDIS_URL")
}
