package adapters_test

import (
	"context"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/checkins/checkins/adapters"
	"github.com/checkins/checkins/adapters/redistest"
	"github.com/checkins/checkins/app/projection"
	"github.com/checkins/checkins/domain"
)

// lagReplica pauses a replica and drops its link on the master (on loopback the paused replica's
// socket buffers would otherwise take in what the master sends); resume undoes the pause.
func lagReplica(t *testing.T, master *redis.Client, signal func(syscall.Signal) error) (resume func()) {
	t.Helper()
	require.NoError(t, signal(syscall.SIGSTOP))
	require.NoError(t, master.Do(context.Background(), "CLIENT", "KILL", "TYPE", "replica").Err())
	return func() { require.NoError(t, signal(syscall.SIGCONT)) }
}

// startReplicated starts a master and its replica, and returns once the replica is online;
// mc is a client of the master.
func startReplicated(t *testing.T) (master, replica *redistest.Server, mc *redis.Client) {
	t.Helper()
	master = redistest.Start(t, redistest.Options{})
	replica = redistest.Start(t, redistest.Options{Args: []string{"--replicaof", "127.0.0.1", strings.TrimPrefix(master.Addr(), "127.0.0.1:")}})
	mc = redistest.Client(t, master.URL())
	require.Eventually(t, func() bool {
		info, _ := mc.Info(context.Background(), "replication").Result()
		return strings.Contains(info, "connected_slaves:1") && strings.Contains(info, "state=online")
	}, 10*time.Second, 20*time.Millisecond)
	return master, replica, mc
}

// TestRequireReplicasOnOneServer: an XADD (alone or in a pipeline) succeeds while the replica
// keeps up, and fails with domain.ErrNotReplicated while it lags, leaving the pipeline's other
// commands alone; it succeeds again once the replica is back.
func TestRequireReplicasOnOneServer(t *testing.T) {
	t.Parallel()
	master, replica, mc := startReplicated(t)
	c, err := adapters.NewRedisClient(adapters.ClientOptions{URL: master.URL()})
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	require.NoError(t, adapters.RequireReplicas(c, 1, 200*time.Millisecond))
	ctx := context.Background()
	xadd := &redis.XAddArgs{Stream: "s", Values: []any{"k", "v"}}

	require.NoError(t, c.XAdd(ctx, xadd).Err())
	_, err = c.Pipelined(ctx, func(p redis.Pipeliner) error {
		p.XAdd(ctx, xadd)
		p.XAdd(ctx, xadd)
		return nil
	})
	require.NoError(t, err)

	resume := lagReplica(t, mc, replica.Signal)
	err = c.XAdd(ctx, xadd).Err()
	require.ErrorIs(t, err, domain.ErrNotReplicated)
	assert.ErrorContains(t, err, "0 of 1 replicas confirmed within 200ms")
	var add *redis.StringCmd
	var get *redis.StringCmd
	_, _ = c.Pipelined(ctx, func(p redis.Pipeliner) error {
		add = p.XAdd(ctx, xadd)
		get = p.Get(ctx, "nothing")
		return nil
	})
	assert.ErrorIs(t, add.Err(), domain.ErrNotReplicated)
	assert.ErrorIs(t, get.Err(), redis.Nil, "other commands keep their own answers")
	n, err := c.Get(ctx, "nothing").Result()
	assert.ErrorIs(t, err, redis.Nil, "a command without XADD sends no WAIT: %q", n)
	resume()
	require.Eventually(t, func() bool { return c.XAdd(ctx, xadd).Err() == nil }, 20*time.Second, 100*time.Millisecond,
		"the replica is back: XADDs are confirmed again")
	assert.Error(t, adapters.RequireReplicas(c, 0, time.Second))
}

// TestRequireReplicasOnACluster: WAIT goes to the node that took the XADD. With one master's
// replica lagging, a pipeline's XADD to that master fails and its XADD to another master is
// confirmed.
func TestRequireReplicasOnACluster(t *testing.T) {
	t.Parallel()
	cl := redistest.StartCluster(t, redistest.ClusterOptions{Replicas: 1})
	ctx := context.Background()
	client, err := adapters.NewUniversalRedisClient(ctx, adapters.ClientOptions{URL: cl.URL()})
	require.NoError(t, err)
	t.Cleanup(func() { _ = client.Close() })
	require.NoError(t, adapters.RequireReplicas(client, 1, time.Second))

	lagging, other := "{a}s", ""
	laggingMaster := cl.MasterOf(t, adapters.KeySlot(lagging))
	for _, k := range []string{"{b}s", "{c}s", "{d}s", "{e}s", "{f}s", "{g}s"} {
		if cl.MasterOf(t, adapters.KeySlot(k)) != laggingMaster {
			other = k
			break
		}
	}
	require.NotEmpty(t, other)
	replica := cl.ReplicaOf(t, laggingMaster)
	require.NotEqual(t, -1, replica)
	// Both replicas confirm writes before one is made to lag: right after the cluster starts a
	// replica may still be syncing (one CI run under -race had the other master's WAIT time out).
	for _, k := range []string{lagging, other} {
		require.Eventually(t, func() bool {
			return client.XAdd(ctx, &redis.XAddArgs{Stream: k, Values: []any{"k", "v"}}).Err() == nil
		}, 30*time.Second, 50*time.Millisecond, "%s: its master's replica confirms writes", k)
	}

	resume := lagReplica(t, cl.NodeClient(t, laggingMaster), func(s syscall.Signal) error { return cl.SignalNode(replica, s) })
	defer resume()
	var onLagging, onOther *redis.StringCmd
	_, _ = client.Pipelined(ctx, func(p redis.Pipeliner) error {
		onLagging = p.XAdd(ctx, &redis.XAddArgs{Stream: lagging, Values: []any{"k", "v"}})
		onOther = p.XAdd(ctx, &redis.XAddArgs{Stream: other, Values: []any{"k", "v"}})
		return nil
	})
	assert.ErrorIs(t, onLagging.Err(), domain.ErrNotReplicated, "the lagging master's XADD")
	assert.NoError(t, onOther.Err(), "another master's XADD, confirmed by its own replica")
	assert.ErrorIs(t, client.XAdd(ctx, &redis.XAddArgs{Stream: lagging, Values: []any{"k", "v"}}).Err(), domain.ErrNotReplicated)
	assert.NoError(t, client.XAdd(ctx, &redis.XAddArgs{Stream: other, Values: []any{"k", "v"}}).Err())
}

// TestApplierRequireReplicasOnOneServer: with RequireReplicas the applier's calls succeed while
// the replica keeps up and fail, as a transient failure, while it lags, and so does the same
// work delivered again to another consumer: finding its markers (or its decision) in place
// writes nothing, and its WAIT must still wait for what the first attempt wrote, not only for
// that consumer's own last write, replicated long ago. Once the replica is back the work is
// found applied.
func TestApplierRequireReplicasOnOneServer(t *testing.T) {
	t.Parallel()
	master, replica, _ := startReplicated(t)
	ctx := context.Background()
	keys := adapters.KeySpace{Prefix: "durable"}
	newApplier := func() *adapters.ProjectionApplier {
		// One connection: the WAIT of each call is on the connection of its consumer's last write.
		c, err := adapters.NewRedisClient(adapters.ClientOptions{URL: master.URL(), PoolSize: 1})
		require.NoError(t, err)
		t.Cleanup(func() { _ = c.Close() })
		a, err := adapters.NewProjectionApplier(c, keys, 0)
		require.NoError(t, err)
		require.NoError(t, a.RequireReplicas(1, 200*time.Millisecond))
		return a
	}
	first, second := newApplier(), newApplier()
	works := func(ev domain.CheckinRecorded, entryID string) []projection.Work {
		var ws []projection.Work
		for _, p := range []projection.Projection{projection.UserStats{}, projection.LocationStats{}} {
			us, err := projection.Updates(ctx, p, ev)
			require.NoError(t, err)
			ws = append(ws, projection.Work{Group: "g", Projection: p.Name(), Version: 1, Event: projection.RefOf(ev, entryID), Updates: us})
		}
		return ws
	}
	early, late := recorded("ck-early", 1, 1, 4, 1_700_000_000_000), recorded("ck-late", 2, 1, 2, 1_700_000_000_500)
	out, err := second.Apply(ctx, works(early, entry(1_700_000_000_001)), nil)
	require.NoError(t, err, "the replica keeps up")
	assert.Equal(t, []projection.Outcome{projection.Applied, projection.Applied}, out)
	_, err = second.Decide(ctx, []projection.EventRef{projection.RefOf(early, entry(1_700_000_000_001))})
	require.NoError(t, err)

	// Paused, with its link kept: it acknowledges nothing from now on, yet still counts as a
	// connected replica, one that has what each consumer wrote before.
	require.NoError(t, replica.Signal(syscall.SIGSTOP))
	resumed := false
	t.Cleanup(func() {
		if !resumed {
			_ = replica.Signal(syscall.SIGCONT)
		}
	})
	_, err = first.Apply(ctx, works(late, entry(1_700_000_000_501)), nil)
	require.ErrorIs(t, err, domain.ErrNotReplicated, "the updates are on the master only")
	assert.True(t, adapters.IsTransient(err), "a lagging replica is not the event's fault: never parked")
	_, err = second.Apply(ctx, works(late, entry(1_700_000_000_501)), nil)
	require.ErrorIs(t, err, domain.ErrNotReplicated, "delivered again to another consumer: the markers are in place, but not on the replica")
	_, err = first.Decide(ctx, []projection.EventRef{projection.RefOf(late, entry(1_700_000_000_501))})
	require.ErrorIs(t, err, domain.ErrNotReplicated)
	_, err = second.Decide(ctx, []projection.EventRef{projection.RefOf(late, entry(1_700_000_000_501))})
	require.ErrorIs(t, err, domain.ErrNotReplicated, "the counted copy decided again: its decision is not on the replica")

	require.NoError(t, replica.Signal(syscall.SIGCONT))
	resumed = true
	require.Eventually(t, func() bool {
		out, err = second.Apply(ctx, works(late, entry(1_700_000_000_501)), nil)
		return err == nil
	}, 20*time.Second, 100*time.Millisecond, "the replica is back: the work is confirmed")
	assert.Equal(t, []projection.Outcome{projection.AlreadyApplied, projection.AlreadyApplied}, out, "applied once, by the first attempt")
	assert.Error(t, first.RequireReplicas(0, time.Second))
}
