package main

// Stream partitions on a Redis Cluster: how the work spreads over the masters, and what an idle
// projector costs with 24 partitions.

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/checkins/checkins/adapters"
	"github.com/checkins/checkins/adapters/redistest"
)

// TestClusterPartitionsSpread: `serve` on a private cluster of 3 masters with the default 24
// partitions. After many check-ins (random users), each master took its share of the XADDs
// within 1/M ± 1/P of the total (INFO commandstats), and every master ran projection scripts
// (EVALSHA). Then the idle cost: the CPU time `serve` uses in 20 s with nothing to do, with 24
// blocking reads per consumer group, is logged (the README quotes it) and bounded.
func TestClusterPartitionsSpread(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("a private cluster and 50,000 check-ins")
	}
	cl := redistest.StartCluster(t, redistest.ClusterOptions{Masters: 3})
	masters := cl.Masters(t)
	require.Len(t, masters, 3)
	ctx := context.Background()
	for _, m := range masters {
		require.NoError(t, cl.NodeClient(t, m).ConfigResetStat(ctx).Err())
	}
	const (
		n = 50000
		m = 3.0
		p = float64(adapters.DefaultClusterPartitions)
	)
	svc := startSvc(t, "serve", map[string]string{"REDIS_URL": cl.URL(), "KEY_PREFIX": "spread"})
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 3))
	inputs := make([]clusterInput, n)
	now := time.Now().UnixMilli()
	for i := range inputs {
		inputs[i] = clusterInput{id: fmt.Sprintf("sp-%d", i), user: 1 + rng.Int64N(1_000_000), location: 1 + rng.Int64N(500),
			stars: rng.Int64N(6), timestamp: now - rng.Int64N(1000*3600), want: http.StatusAccepted}
	}
	accepted := postAll(t, svc.base, inputs, 16)
	require.Len(t, accepted, n)
	keys, err := adapters.NewKeySpace("spread", true)
	require.NoError(t, err)
	keys, err = keys.WithPartitions(adapters.DefaultClusterPartitions)
	require.NoError(t, err)
	cc := redistest.ClusterClient(t, cl.URL())
	require.Eventually(t, func() bool {
		for _, stream := range keys.Partitions().Streams() {
			gs, err := cc.XInfoGroups(ctx, stream).Result()
			if err != nil || len(gs) == 0 {
				return false
			}
			for _, g := range gs {
				if g.Pending != 0 || g.Lag != 0 {
					return false
				}
			}
		}
		return true
	}, 2*time.Minute, 200*time.Millisecond, "the projections drain")

	var xadds, scripts [3]int
	total, totalScripts := 0, 0
	for i, node := range masters {
		c := cl.NodeClient(t, node)
		xadds[i] = redistest.CommandCalls(t, c, "xadd")
		scripts[i] = redistest.CommandCalls(t, c, "evalsha") + redistest.CommandCalls(t, c, "eval")
		total += xadds[i]
		totalScripts += scripts[i]
	}
	require.GreaterOrEqual(t, total, n)
	var shares []string
	for i := range masters {
		share := float64(xadds[i]) / float64(total)
		shares = append(shares, fmt.Sprintf("master %d: %d XADDs (%.3f), %d script calls (%.3f)", i, xadds[i], share, scripts[i], float64(scripts[i])/float64(totalScripts)))
		assert.InDelta(t, 1/m, share, 1/p, "master %d's share of the XADDs", i)
		// No global hot slot: the leaderboards are sharded like the partitions, so the scripts
		// spread as evenly as the XADDs (with one {all} slot the first master ran about half).
		assert.InDelta(t, 1/m, float64(scripts[i])/float64(totalScripts), 1/p, "master %d's share of the projection scripts", i)
	}
	t.Logf("spread over 3 masters, P = 24, %d check-ins: %s", n, strings.Join(shares, "; "))

	// The idle cost: nothing to consume, 24 partitions x the live group blocking.
	time.Sleep(3 * time.Second) // let the last checkpoints and sweeps pass
	before := cpuTicks(t, svc.cmd.Process.Pid)
	redisBefore := mastersCPU(t, cl, masters)
	time.Sleep(20 * time.Second)
	used := time.Duration(cpuTicks(t, svc.cmd.Process.Pid)-before) * time.Second / 100
	redisUsed := mastersCPU(t, cl, masters) - redisBefore
	t.Logf("idle serve with 24 partitions on 3 masters: %v CPU in 20 s (%.1f%% of a core); the 3 masters together %.2fs (%.1f%% of a core)",
		used, 100*used.Seconds()/20, redisUsed, 100*redisUsed/20)
	assert.Less(t, used, 4*time.Second, "an idle projector must stay cheap: under 20%% of a core")
	assert.Less(t, redisUsed, 4.0, "its blocking reads must keep Redis cheap too: under 20%% of a core for the 3 masters")
}

// mastersCPU is the CPU seconds (user and system, INFO cpu) the given nodes have used so far.
func mastersCPU(t *testing.T, cl *redistest.Cluster, nodes []int) float64 {
	t.Helper()
	var sum float64
	for _, node := range nodes {
		info, err := cl.NodeClient(t, node).Info(context.Background(), "cpu").Result()
		require.NoError(t, err)
		sum += redisCPU(t, info)
	}
	return sum
}

// cpuTicks is the user plus system CPU time of process pid, in clock ticks (1/100 s on Linux).
func cpuTicks(t *testing.T, pid int) int64 {
	t.Helper()
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	require.NoError(t, err)
	s := string(raw)
	fields := strings.Fields(s[strings.LastIndexByte(s, ')')+2:]) // after "pid (comm) "
	utime, err := strconv.ParseInt(fields[11], 10, 64)
	require.NoError(t, err)
	stime, err := strconv.ParseInt(fields[12], 10, 64)
	require.NoError(t, err)
	return utime + stime
}
