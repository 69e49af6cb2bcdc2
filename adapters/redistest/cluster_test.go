package redistest_test

import (
	"context"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/checkins/checkins/adapters/redistest"
)

func TestMain(m *testing.M) {
	code := m.Run()
	redistest.CloseClusters()
	os.Exit(code)
}

// TestOpenClusterSharesOneCluster: every test of a package gets the same 3-master cluster under
// its own prefix, and a cluster client that reaches every slot.
func TestOpenClusterSharesOneCluster(t *testing.T) {
	t.Parallel()
	a, b := redistest.OpenCluster(t), redistest.OpenCluster(t)
	require.Equal(t, a.URL, b.URL, "one cluster per package")
	require.NotEqual(t, a.Prefix, b.Prefix)
	require.NotContains(t, a.Prefix, "{")
	c := redistest.ClusterClient(t, a.URL)
	ctx := context.Background()
	masters := map[string]bool{}
	for i := range 30 {
		k := a.Prefix + ":k" + strconv.Itoa(i)
		require.NoError(t, c.Set(ctx, k, i, 0).Err())
		n, err := c.MasterForKey(ctx, k)
		require.NoError(t, err)
		masters[n.Options().Addr] = true
	}
	assert.Len(t, masters, 3, "30 keys land on all 3 masters")
	if a.Cluster != nil {
		assert.Equal(t, []int{0, 1, 2}, a.Cluster.Masters(t))
	}
}

// TestClusterKillAndRestartANode: on 3 masters + 3 replicas, a killed master's replica takes
// over within seconds (cluster-node-timeout 1000), the old master rejoins as a replica, and the
// data written before the crash (and replicated) is still there.
func TestClusterKillAndRestartANode(t *testing.T) {
	t.Parallel()
	cl := redistest.StartCluster(t, redistest.ClusterOptions{Replicas: 1})
	require.Equal(t, 6, cl.Len())
	require.Equal(t, []int{0, 1, 2}, cl.Masters(t), "redis-cli makes the first nodes masters")
	c := redistest.ClusterClient(t, cl.URL())
	ctx := context.Background()
	const key = "{kill}k" // on some master; find which
	require.NoError(t, c.Set(ctx, key, "before", 0).Err())
	slot := int(c.ClusterKeySlot(ctx, key).Val())
	victim := cl.MasterOf(t, slot)
	require.Less(t, victim, 3)
	// WAIT: the write has reached the replica, so the promotion keeps it.
	require.NoError(t, cl.NodeClient(t, victim).Do(ctx, "WAIT", 1, 5000).Err())

	cl.KillNode(victim)
	require.Eventually(t, func() bool {
		m := cl.Masters(t)
		return len(m) == 3 && !strings.Contains(strconv.Itoa(m[0])+strconv.Itoa(m[1])+strconv.Itoa(m[2]), strconv.Itoa(victim))
	}, 20*time.Second, 100*time.Millisecond, "a replica is promoted")
	cl.WaitHealthy(t, 20*time.Second)
	assert.Eventually(t, func() bool { return c.Get(ctx, key).Val() == "before" }, 10*time.Second, 50*time.Millisecond)

	cl.RestartNode(t, victim)
	require.Eventually(t, func() bool {
		role, err := cl.NodeClient(t, victim).Do(ctx, "ROLE").Slice()
		return err == nil && len(role) > 0 && role[0] == "slave"
	}, 20*time.Second, 100*time.Millisecond, "the old master rejoins as a replica")
	cl.WaitHealthy(t, 20*time.Second)
	require.NoError(t, c.Set(ctx, key, "after", 0).Err())
	assert.Equal(t, "after", c.Get(ctx, key).Val())
}

// TestClusterNodeClientReachesOneNode: a node client talks to that node alone, which redirects
// keys of another master's slots.
func TestClusterNodeClientReachesOneNode(t *testing.T) {
	t.Parallel()
	env := redistest.OpenCluster(t)
	if env.Cluster == nil {
		t.Skip("REDIS_CLUSTER_URL names an external cluster: no node handles")
	}
	ctx := context.Background()
	for i := range env.Cluster.Len() {
		info, err := env.Cluster.NodeClient(t, i).ClusterInfo(ctx).Result()
		require.NoError(t, err)
		assert.Contains(t, info, "cluster_state:ok")
		assert.Contains(t, info, "cluster_known_nodes:3")
	}
	n0 := env.Cluster.NodeClient(t, 0)
	for _, tag := range []string{"a", "b", "c", "d", "e", "f"} {
		key := env.Prefix + ":{" + tag + "}"
		slot := int(n0.ClusterKeySlot(ctx, key).Val())
		err := n0.Set(ctx, key, 1, 0).Err()
		if env.Cluster.MasterOf(t, slot) == 0 {
			assert.NoError(t, err, key)
		} else {
			assert.ErrorContains(t, err, "MOVED", key)
		}
	}
}
