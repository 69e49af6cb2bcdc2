package ports_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/checkins/checkins/adapters"
	"github.com/checkins/checkins/adapters/redistest"
	"github.com/checkins/checkins/app"
	"github.com/checkins/checkins/app/command"
	"github.com/checkins/checkins/app/ops"
	"github.com/checkins/checkins/app/projection"
	"github.com/checkins/checkins/domain"
	"github.com/checkins/checkins/ports"
)

// lostJoinEnv is a projector of users on 4 stream partitions, whose rebuild to v2 loses its join
// on one partition.
type lostJoinEnv struct {
	t      *testing.T
	ctx    context.Context
	client *redis.Client
	keys   adapters.KeySpace
	parts  adapters.Partitions
	log    *slog.Logger
	projs  []projection.Projection
	a      app.Application
	router *ports.ProjectionRouter
	n      int
	// paused stops the router's subscribers reading new entries.
	paused atomic.Bool
}

func newLostJoinEnv(t *testing.T, tune ...func(*adapters.Subscribers)) *lostJoinEnv {
	return newPartitionedEnv(t, 4, tune...)
}

// newPartitionedEnv is the projector of newLostJoinEnv on p stream partitions.
func newPartitionedEnv(t *testing.T, p int, tune ...func(*adapters.Subscribers)) *lostJoinEnv {
	env := redistest.Open(t)
	client := redistest.Client(t, env.URL)
	keys, err := adapters.KeySpace{Prefix: env.Prefix}.WithPartitions(p)
	require.NoError(t, err)
	e := &lostJoinEnv{t: t, ctx: context.Background(), client: client, keys: keys, parts: keys.Partitions(),
		log: slog.New(slog.NewTextHandler(io.Discard, nil)), projs: []projection.Projection{projection.UserStats{}}}
	e.a = opsApp(t, client, keys, e.projs, app.OpsConfig{RetireGrace: 300 * time.Millisecond, Logger: e.log})
	subs := adapters.Subscribers{Kind: "batched", NewClient: func() (redis.UniversalClient, error) { return redistest.Client(t, env.URL), nil },
		Parts: e.parts, Consumer: "c1", BlockTime: 50 * time.Millisecond, DrainTimeout: 5 * time.Second, Paused: e.paused.Load,
		Logger: watermill.NopLogger{}}
	for _, f := range tune {
		f(&subs)
	}
	e.router, err = ports.NewProjectionRouter(ports.ProjectionRouterConfig{
		Targets: []ops.ProjectionTarget{{Projection: projection.UserStats{}, Version: 1}},
		Backend: adapters.NewProjectorBackend(client, keys), Applier: testApplier(t, client, keys),
		Logger: e.log, CloseTimeout: 10 * time.Second, Retry: ports.DefaultRetryPolicy(), NewSubscriber: subs.New,
	})
	require.NoError(t, err)
	redistest.Background(t, "router", 20*time.Second, e.router.Run)
	require.Eventually(t, e.router.Running, 10*time.Second, 10*time.Millisecond)
	return e
}

// add records per check-ins of each of 40 users on their partitions.
func (e *lostJoinEnv) add(per int) {
	for u := int64(1); u <= 40; u++ {
		for range per {
			e.n++
			c := domain.CheckinRecorded{Checkin: domain.Checkin{ID: "pl" + strconv.Itoa(e.n), UserID: u, LocationID: 1, StarRating: 2, Timestamp: int64(e.n)}}
			values := map[string]any{}
			for k, v := range c.Fields() {
				values[k] = v
			}
			require.NoError(e.t, e.client.XAdd(e.ctx, &redis.XAddArgs{Stream: e.parts.Stream(adapters.PartitionOf(u, e.parts.Count())), Values: values}).Err())
		}
	}
}

// total is the served check-in count, in all and by partition.
func (e *lostJoinEnv) total() (int64, map[int]int64) {
	var s int64
	byPart := map[int]int64{}
	for u := int64(1); u <= 40; u++ {
		v, err := projection.UserStats{}.Get(e.ctx, adapters.NewProjectionReader(e.client, e.keys, "users"), u)
		if errors.Is(err, domain.ErrNotFound) {
			continue
		}
		require.NoError(e.t, err)
		s += v.NumCheckins
		byPart[adapters.PartitionOf(u, e.parts.Count())] += v.NumCheckins
	}
	return s, byPart
}

// rebuildLosingJoin starts the rebuild, lets v2 join every partition, then loses its join on
// partition 3 as a failover of that partition's master right after the join script would
// (asynchronous replication): its membership there is what it was before (v1 alone), and with
// group also the own group the join created.
func (e *lostJoinEnv) rebuildLosingJoin(group bool) { e.rebuildLosingJoinOn(group, 3) }

// rebuildLosingJoinOn is rebuildLosingJoin on each of parts.
func (e *lostJoinEnv) rebuildLosingJoinOn(group bool, parts ...int) {
	_, err := e.a.Commands.RebuildProjection.Start(e.ctx, "users")
	require.NoError(e.t, err)
	targets, err := e.a.Queries.ProjectionVersions.Targets(e.ctx, e.projs)
	require.NoError(e.t, err)
	_, _, err = e.router.SetTargets(e.ctx, targets) // v2 joins every partition
	require.NoError(e.t, err)
	for _, p := range parts {
		reg := e.parts.Registry(p)
		raw, err := e.client.HGet(e.ctx, reg, "live:live").Result()
		require.NoError(e.t, err)
		var m map[string]any
		require.NoError(e.t, json.Unmarshal([]byte(raw), &m))
		delete(m, "users.v2")
		b, _ := json.Marshal(m)
		require.NoError(e.t, e.client.HSet(e.ctx, reg, "live:live", string(b)).Err())
		if group {
			_ = e.client.XGroupDestroy(e.ctx, e.parts.Stream(p), "users.v2").Err()
		}
	}
}

// registryWatch is the registry watch of e's router (it joins lost partitions again and steps
// the rebuild), polling every 50 ms.
func (e *lostJoinEnv) registryWatch() ports.RegistryWatch {
	return ports.RegistryWatch{Router: e.router, Versions: e.a.Queries.ProjectionVersions, Rebuild: e.a.Commands.RebuildProjection,
		Projections: e.projs, Interval: 50 * time.Millisecond, Logger: e.log}
}

// watchUntilSwitched runs the registry watch (until the test ends) and waits until the rebuild
// of users has switched reads to v2 and removed v1.
func (e *lostJoinEnv) watchUntilSwitched(t *testing.T) {
	t.Helper()
	redistest.Background(t, "registry watcher", 20*time.Second, e.registryWatch().Run)
	versions := adapters.NewProjectionVersions(e.client, e.keys)
	require.Eventually(t, func() bool {
		st, err := versions.State(e.ctx, "users")
		require.NoError(t, err)
		return st.Serving == 2 && st.Building == 0 && st.Retiring == 0
	}, 20*time.Second, 20*time.Millisecond, "the rebuild never finished")
}

// TestRebuildWithAJoinLostOnAPartition: with 4 partitions, v2's join record on one partition is
// lost. Reads switched to v2 all the same, without that partition's check-ins, and the
// partition's live group, left without members when v1 left, acknowledged its new check-ins
// unapplied for good. Now the version counts as not caught up while it misses a partition, the
// router joins it there again, and the switch comes with every partition's check-ins.
func TestRebuildWithAJoinLostOnAPartition(t *testing.T) {
	t.Parallel()
	e := newLostJoinEnv(t)
	e.add(10)
	require.Eventually(t, func() bool { s, _ := e.total(); return s == 400 }, 10*time.Second, 20*time.Millisecond)
	e.rebuildLosingJoin(false)

	e.watchUntilSwitched(t)
	s, byPart := e.total()
	require.Equal(t, int64(400), s, "after the switch, by partition %v", byPart)
	e.add(5)
	require.Eventually(t, func() bool { s, _ := e.total(); return s == 600 }, 10*time.Second, 20*time.Millisecond,
		"every partition's new check-ins reach v2")
	for i := range 4 {
		raw, err := e.client.HGet(e.ctx, e.parts.Registry(i), "live:live").Result()
		require.NoError(t, err)
		assert.Contains(t, raw, "users.v2", "partition %d", i)
	}
}

// TestRebuildStepWaitsForAPartitionItsJoinLost: a rebuild step (as `checkins projections
// rebuild` drives it, with no router to join the partition again) does not switch reads to a
// version missing a partition, however caught up it is on the others; and the projector's
// checkpoints go on for the other partitions meanwhile (they stopped at the missing group).
func TestRebuildStepWaitsForAPartitionItsJoinLost(t *testing.T) {
	t.Parallel()
	e := newLostJoinEnv(t)
	e.add(10)
	e.rebuildLosingJoin(true)

	live := adapters.NewLiveGroups(e.client, e.keys)
	require.Eventually(t, func() bool { // the checkpoints finish the other partitions' backfills
		ms, err := live.Read(e.ctx, "live")
		require.NoError(t, err)
		v2 := ms.Members["users.v2"]
		if v2.Missing != 1 || len(v2.Parts) != 3 {
			return false
		}
		for _, p := range v2.Parts {
			if p.Own != ops.BackfillDone {
				return false
			}
		}
		return true
	}, 15*time.Second, 50*time.Millisecond, "the backfills of the partitions v2 has joined finish")
	_, err := e.a.Commands.RebuildProjection.Step(e.ctx, "users")
	require.NoError(t, err)
	st, err := adapters.NewProjectionVersions(e.client, e.keys).State(e.ctx, "users")
	require.NoError(t, err)
	require.Equal(t, 1, st.Serving, "reads stay on v1 while v2 misses partition 3")
	require.Equal(t, 2, st.Building)
}

// TestBackfillGoesOnAroundAPartitionWhoseJoinIsLost: v2's join on partition 3 is lost while
// its own group there stays, and the backfill reads every partition at once, so the batches join
// partition 3's entries with the others'. Each such batch failed as a whole ("not a member ...
// on partition 3"), was delivered again with the same mix, and failed again: the backfill stalled
// on every partition until the router joined partition 3 again. Now the other partitions'
// entries are applied and acknowledged, their backfills finish, and partition 3's are left
// unacknowledged until the join is back, then applied.
func TestBackfillGoesOnAroundAPartitionWhoseJoinIsLost(t *testing.T) {
	t.Parallel()
	// Each partition reads at most 50 entries at a time (MAX_IN_FLIGHT 200 over 4), and a run of
	// fewer than 100 (BATCH_SIZE/4) waits up to READ_LINGER for the other partitions' runs: every
	// batch of the backfill joins entries of several partitions, partition 3's among them.
	e := newLostJoinEnv(t, func(s *adapters.Subscribers) {
		s.MaxInFlight, s.BatchSize, s.ReadLinger = 200, 400, 100*time.Millisecond
	})
	e.add(25)
	require.Eventually(t, func() bool { s, _ := e.total(); return s == 1000 }, 10*time.Second, 20*time.Millisecond)
	e.paused.Store(true)
	e.rebuildLosingJoin(false) // v2's own groups wait, paused, at the start of every partition
	e.paused.Store(false)

	live := adapters.NewLiveGroups(e.client, e.keys)
	require.Eventually(t, func() bool {
		ms, err := live.Read(e.ctx, "live")
		require.NoError(t, err)
		v2 := ms.Members["users.v2"]
		if v2.Missing != 1 || len(v2.Parts) != 3 {
			return false
		}
		for _, p := range v2.Parts {
			if p.Own != ops.BackfillDone {
				return false
			}
		}
		return true
	}, 15*time.Second, 20*time.Millisecond, "the backfills of the partitions v2 has joined finish")
	groups, err := e.client.XInfoGroups(e.ctx, e.parts.Stream(3)).Result()
	require.NoError(t, err)
	for _, g := range groups {
		if g.Name == "users.v2" {
			assert.Positive(t, g.EntriesRead, "partition 3's entries were delivered")
			assert.Equal(t, g.EntriesRead, g.Pending, "none of partition 3's entries is acknowledged while v2's join there is lost")
		}
	}

	// The registry watch has the router join partition 3 again: its entries are applied, and
	// the rebuild switches reads to v2 with every check-in.
	e.watchUntilSwitched(t)
	s, byPart := e.total()
	require.Equal(t, int64(1000), s, "after the switch, by partition %v", byPart)
}

// TestRebuildWithItsJoinLostOnEveryPartition: v2's join is lost on every partition at once (or
// on its one stream), with or without its own groups, and check-ins come before the router
// notices. The router took a member missing from every partition for one that had left, and
// never joined it again: the rebuild never finished. And v2's own groups, whose handler ran on
// until then, acknowledged their entries unapplied (the member was nowhere, so nothing was for
// it): once joined again, v2 went live without them (290 or 400 of 480). Now both are as when
// the join is lost on some partitions only.
func TestRebuildWithItsJoinLostOnEveryPartition(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		parts int
		lost  []int
	}{{4, []int{3}}, {4, []int{0, 1, 2, 3}}, {1, []int{0}}} {
		for _, group := range []bool{false, true} {
			t.Run(fmt.Sprintf("%d partitions lost on %v own groups lost %v", tc.parts, tc.lost, group), func(t *testing.T) {
				t.Parallel()
				e := newPartitionedEnv(t, tc.parts)
				e.add(10)
				require.Eventually(t, func() bool { s, _ := e.total(); return s == 400 }, 10*time.Second, 20*time.Millisecond)
				e.rebuildLosingJoinOn(group, tc.lost...)
				e.add(2)
				e.watchUntilSwitched(t)
				s, byPart := e.total()
				require.Equal(t, int64(480), s, "after the switch, by partition %v", byPart)
				e.add(5)
				require.Eventually(t, func() bool { s, _ := e.total(); return s == 680 }, 10*time.Second, 20*time.Millisecond,
					"every partition's new check-ins reach v2")
			})
		}
	}
}

// TestStoppedHandlerLeavesNoProblem: a backfill handler that stops while it cannot apply (here
// its version's join is lost on a partition, and the version is no longer a target) took its
// problem with it out of the router, but not out of readiness: /readyz answered 503 for a
// handler that no longer ran.
func TestStoppedHandlerLeavesNoProblem(t *testing.T) {
	t.Parallel()
	e := newLostJoinEnv(t)
	e.add(10)
	e.rebuildLosingJoin(false)
	require.Eventually(t, func() bool { return strings.Contains(e.router.Problem(), "users.v2") }, 10*time.Second, 20*time.Millisecond,
		"v2's backfill cannot apply partition 3's entries")
	_, _, err := e.router.SetTargets(e.ctx, []ops.ProjectionTarget{{Projection: projection.UserStats{}, Version: 1}})
	require.NoError(t, err)
	assert.Empty(t, e.router.Problem(), "the handler of users.v2 stopped")
}

// TestMigrationWaitsForALostJoinToBeMadeAgain: v2's join (and own group) on partition 3 of 4 is
// lost, its backfill finishes on the other three, and reads rightly stay on v1. A partition
// migration (4 -> 2) then wrote v2 into every new partition with its backfill done, although old
// partition 3's check-ins never reached it: the next rebuild step switched reads to v2, and its
// users read 300 of 400 check-ins. Now the migration is refused, with nothing changed, until the
// router has joined v2 there again; then it goes, and v2 goes live with every check-in.
func TestMigrationWaitsForALostJoinToBeMadeAgain(t *testing.T) {
	t.Parallel()
	e := newLostJoinEnv(t)
	e.add(10)
	require.Eventually(t, func() bool { s, _ := e.total(); return s == 400 }, 10*time.Second, 20*time.Millisecond)
	e.rebuildLosingJoin(true)
	live := adapters.NewLiveGroups(e.client, e.keys)
	v2 := func() ops.LiveMember {
		ms, err := live.Read(e.ctx, "live")
		require.NoError(t, err)
		return ms.Members["users.v2"]
	}
	require.Eventually(t, func() bool {
		m := v2()
		if m.Missing != 1 || len(m.Parts) != 3 {
			return false
		}
		for _, p := range m.Parts {
			if p.Own != ops.BackfillDone {
				return false
			}
		}
		return true
	}, 15*time.Second, 50*time.Millisecond, "the backfills of the partitions v2 has joined finish")

	base := adapters.KeySpace{Prefix: e.keys.Prefix}
	require.NoError(t, adapters.EnsurePartitions(e.ctx, e.client, base, 4))
	mp, err := command.NewMigratePartitions(adapters.NewPartitionMigrator(e.client, base))
	require.NoError(t, err)
	_, err = mp.Handle(e.ctx, command.MigrateRequest{To: 2, Wait: 10 * time.Second})
	require.ErrorContains(t, err, "users.v2 is not a member of live group live on partition 3")
	require.ErrorContains(t, err, "nothing was changed")

	// The registry watch has the router join partition 3 again, and v2's backfill there ends.
	// It drives the rebuild too: stopped while it takes v1 out of the live group (a leave walks
	// the partitions), it leaves v1 a member of some partitions only, which the migration
	// refuses as it should; it runs again until v1 is a member of all or none.
	for {
		watch := e.registryWatch()
		wctx, stopWatch := context.WithCancel(e.ctx)
		watched := make(chan error, 1)
		go func() { watched <- watch.Run(wctx) }()
		require.Eventually(t, func() bool {
			ms, err := live.Read(e.ctx, "live")
			require.NoError(t, err)
			m, ok := ms.Members["users.v2"]
			if ok && m.Missing == 0 && len(m.Parts) == 4 && m.Own == ops.BackfillDone {
				return true
			}
			_, stillV1 := ms.Members["users.v1"]
			return !ok || !stillV1 // switched already: the watch drives the rebuild too
		}, 15*time.Second, 20*time.Millisecond, "v2 joined partition 3 again and its backfill there ended")
		stopWatch()
		<-watched
		ms, err := live.Read(e.ctx, "live")
		require.NoError(t, err)
		if v1, ok := ms.Members["users.v1"]; !ok || v1.Missing == 0 {
			break
		}
	}

	e.paused.Store(true) // the projectors stand still for the migration
	_, err = mp.Handle(e.ctx, command.MigrateRequest{To: 2, Wait: 10 * time.Second})
	require.NoError(t, err)
	k2, err := base.WithPartitions(2)
	require.NoError(t, err)
	a2 := opsApp(t, e.client, k2, e.projs, app.OpsConfig{RetireGrace: 300 * time.Millisecond, Logger: e.log})
	// Processes restart with STREAM_PARTITIONS=2: a step there switches reads (if the watch had
	// not yet), to v2 with every check-in.
	_, err = a2.Commands.RebuildProjection.Step(e.ctx, "users")
	require.NoError(t, err)
	st, err := adapters.NewProjectionVersions(e.client, k2).State(e.ctx, "users")
	require.NoError(t, err)
	require.Equal(t, 2, st.Serving)
	var served int64
	for u := int64(1); u <= 40; u++ {
		v, err := projection.UserStats{}.Get(e.ctx, adapters.NewProjectionReader(e.client, k2, "users"), u)
		if errors.Is(err, domain.ErrNotFound) {
			continue
		}
		require.NoError(t, err)
		served += v.NumCheckins
	}
	assert.Equal(t, int64(400), served, "reads switched to v2 with every check-in")
}
