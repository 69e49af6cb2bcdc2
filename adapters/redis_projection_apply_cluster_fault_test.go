package adapters_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
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

// TestApplySurvivesAMasterCrash: two appliers apply batches (with republished copies) on a 3+3
// cluster through the service's cluster client; a master is killed with SIGKILL half-way, its
// replica takes over, and every batch that failed is applied again until it succeeds, as the
// projector retries what it did not acknowledge. The counts are exact afterwards: an update and
// its marker are one script in one slot, so a batch lands in each slot whole or not at all.
// (It relies on the replica having received what the master acknowledged: the test WAITs for it
// right before the kill. Without that, a replica lagging behind lost acknowledged writes with
// its master, here up to three quarters of some users' counts with every test of the package
// running beside it; across a network too, only WAIT prevents it: ProjectionApplier.RequireReplicas,
// see TestApplierRequireReplicasOnOneServer and the service's TestClusterProjectionMinReplicas.)
func TestApplySurvivesAMasterCrash(t *testing.T) {
	t.Parallel()
	cl := redistest.StartCluster(t, redistest.ClusterOptions{Replicas: 1})
	ctx := context.Background()
	keys := adapters.KeySpace{Prefix: "crash"}
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 5))
	var evs []domain.CheckinRecorded
	var entries []string
	for i := range 3000 {
		ev := recorded(fmt.Sprintf("ck%05d", i), rng.Int64N(200)+1, rng.Int64N(100)+1, rng.IntN(6), 1_000+rng.Int64N(1_000_000))
		if i > 0 && rng.IntN(8) == 0 {
			ev = evs[rng.IntN(len(evs))]
		}
		evs = append(evs, ev)
		entries = append(entries, entry(1_700_000_000_000+int64(i)))
	}
	projections := []projection.Projection{projection.UserStats{}, projection.LocationStats{}}
	const appliers, batch = 2, 20
	var failed, applied atomic.Int64
	half := make(chan struct{})
	var halfOnce sync.Once
	// The last quarter waits for the kill, so some batches always meet the crash: without it, on
	// busy cores the rest could be done while the test waits for the victim's replica.
	killedCh := make(chan struct{})
	var wg sync.WaitGroup
	for w := range appliers {
		client, err := adapters.NewUniversalRedisClient(ctx, adapters.ClientOptions{URL: cl.URL(), DialTimeout: 200 * time.Millisecond,
			ReadTimeout: 500 * time.Millisecond, WriteTimeout: 500 * time.Millisecond})
		require.NoError(t, err)
		t.Cleanup(func() { _ = client.Close() })
		a, err := adapters.NewProjectionApplier(client, keys, 0)
		require.NoError(t, err)
		wg.Go(func() {
			// Each applier takes every other batch: both write to every master all along.
			for start := w * batch; start < len(evs); start += appliers * batch {
				if start >= len(evs)*3/4 {
					<-killedCh
				}
				var works []projection.Work
				for i := start; i < min(start+batch, len(evs)); i++ {
					for _, p := range projections {
						us, err := projection.Updates(ctx, p, evs[i])
						if err != nil {
							panic(err)
						}
						works = append(works, projection.Work{Group: "live", Projection: p.Name(), Version: 1, Event: projection.RefOf(evs[i], entries[i]), Updates: us})
					}
				}
				for deadline := time.Now().Add(30 * time.Second); ; {
					actx, cancel := context.WithTimeout(ctx, 2*time.Second)
					_, err := a.Apply(actx, works, nil)
					cancel()
					if err == nil {
						break
					}
					failed.Add(1)
					if time.Now().After(deadline) {
						t.Errorf("batch at %d still fails after 30 s: %v", start, err)
						return
					}
					time.Sleep(50 * time.Millisecond)
				}
				if applied.Add(1) == int64(len(evs)/batch/2) {
					halfOnce.Do(func() { close(half) })
				}
			}
		})
	}
	<-half
	victim := cl.Masters(t)[rng.IntN(3)]
	// Replication is asynchronous: what the victim acknowledged and its replica had not received
	// is lost with it (the counts fall short by it; only WAIT prevents that). On two busy cores
	// the replica fell seconds behind, so the test makes the replica catch up first; the appliers
	// keep writing up to the kill.
	vc := redis.NewClient(&redis.Options{Addr: cl.Addrs()[victim]})
	require.NoError(t, vc.Do(ctx, "WAIT", 1, 5000).Err())
	_ = vc.Close()
	cl.KillNode(victim)
	killed := time.Now()
	close(killedCh)
	wg.Wait()
	t.Logf("killed node %d half-way; %d failed attempts, done %s after the kill", victim, failed.Load(), time.Since(killed).Round(100*time.Millisecond))
	require.Positive(t, failed.Load(), "the crash must have cost some attempts, or it tested nothing")
	require.False(t, t.Failed())

	reader := redistest.ClusterClient(t, cl.URL())
	env := projEnv{url: cl.URL(), cluster: true, client: reader, keys: keys}
	env.assertStats(t, expect(evs))
}

// TestClusterApplyDecidesInTheUserSlotCalls: on a cluster the dedupe decision of an event is made
// in the script call that applies its updates in the user's slot (the registry's), as one server
// makes it in its one call, so a batch takes no call of its own per user to decide: with users
// and locations, a batch of 40 users' check-ins at 5 locations is at most 40 + 5 script calls
// (a call per user slot, then per location slot), where deciding apart added about 40. The
// counts are exact, a redelivery and a republished copy included; and a selection with no update
// in the user's slot (locations alone) still decides, by a call of its own.
func TestClusterApplyDecidesInTheUserSlotCalls(t *testing.T) {
	t.Parallel()
	cl := redistest.StartCluster(t, redistest.ClusterOptions{})
	ctx := context.Background()
	client := redistest.ClusterClient(t, cl.URL())
	keys := adapters.KeySpace{Prefix: "decide", Cluster: true}
	a, err := adapters.NewProjectionApplier(client, keys, 0)
	require.NoError(t, err)
	evalshas := func() int {
		n := 0
		for _, m := range cl.Masters(t) {
			n += redistest.CommandCalls(t, cl.NodeClient(t, m), "evalsha")
		}
		return n
	}
	batch := func(projections []projection.Projection, evs []domain.CheckinRecorded, entries []string) []projection.Work {
		var works []projection.Work
		for i, ev := range evs {
			for _, p := range projections {
				us, err := projection.Updates(ctx, p, ev)
				require.NoError(t, err)
				works = append(works, projection.Work{Group: "live", Projection: p.Name(), Version: 1, Event: projection.RefOf(ev, entries[i]), Updates: us})
			}
		}
		return works
	}
	var evs []domain.CheckinRecorded
	var entries []string
	for i := range 40 {
		evs = append(evs, recorded(fmt.Sprintf("ck%02d", i), int64(i+1), int64(i%5+1), i%6, 1_700_000_000_000+int64(i)))
		entries = append(entries, entry(1_700_000_000_000+int64(i)))
	}
	both := []projection.Projection{projection.UserStats{}, projection.LocationStats{}}
	_, err = a.Apply(ctx, batch(both, evs, entries), nil) // loads the scripts
	require.NoError(t, err)
	evs2, entries2 := slices.Clone(evs), make([]string, len(evs))
	for i := range evs2 {
		evs2[i].ID += "-b"
		entries2[i] = entry(1_700_000_001_000 + int64(i))
	}
	before := evalshas()
	out, err := a.Apply(ctx, batch(both, evs2, entries2), nil)
	require.NoError(t, err)
	calls := evalshas() - before
	t.Logf("a batch of 40 users' check-ins at 5 locations: %d script calls", calls)
	assert.LessOrEqual(t, calls, 45, "one call per user slot and per location slot, none apart to decide")
	for _, o := range out {
		assert.Equal(t, projection.Applied, o)
	}
	// Delivered again, and republished at later entries: nothing counts twice.
	out, err = a.Apply(ctx, batch(both, evs2, entries2), nil)
	require.NoError(t, err)
	for _, o := range out {
		assert.Equal(t, projection.AlreadyApplied, o)
	}
	later := make([]string, len(evs2))
	for i := range later {
		later[i] = entry(1_700_000_002_000 + int64(i))
	}
	out, err = a.Apply(ctx, batch(both, evs2, later), nil)
	require.NoError(t, err)
	for _, o := range out {
		assert.Equal(t, projection.Duplicate, o)
	}
	env := projEnv{url: cl.URL(), cluster: true, client: client, keys: keys}
	env.assertStats(t, expect(append(slices.Clone(evs), evs2...)))

	// Locations alone: no update in a user's slot, so the registry is asked by a call of its own.
	locKeys := adapters.KeySpace{Prefix: "decide-loc", Cluster: true}
	la, err := adapters.NewProjectionApplier(client, locKeys, 0)
	require.NoError(t, err)
	only := []projection.Projection{projection.LocationStats{}}
	_, err = la.Apply(ctx, batch(only, evs, entries), nil)
	require.NoError(t, err)
	out, err = la.Apply(ctx, batch(only, evs, later), nil) // republished copies
	require.NoError(t, err)
	for _, o := range out {
		assert.Equal(t, projection.Duplicate, o)
	}
	want := expect(evs)
	locEnv := projEnv{url: cl.URL(), cluster: true, client: client, keys: locKeys}
	for id, l := range want.locations {
		assert.Equal(t, l, locEnv.locationStats(t, id), "location %d", id)
	}
}
