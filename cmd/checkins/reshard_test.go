package main

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/checkins/checkins/adapters"
	"github.com/checkins/checkins/adapters/redistest"
)

// TestClusterReshardUnderLoad: `api` and two `project` processes run on a local cluster of 3
// masters (24 stream partitions) while 16 clients post check-ins (distinct IDs, and a retry of
// every 4th with the same ID); a 4th master joins and a quarter of the slots move to it
// (redis-cli --cluster rebalance --cluster-use-empty-masters: MIGRATE of every key of every
// moved slot while the cluster serves), stream partitions and projection keys among them.
// Then: every check-in that got a 2xx is in its partition stream, every read model equals an
// independent computation over the 2xx answers (nothing lost, nothing counted twice), /readyz of
// every process comes back by itself, both projectors handled a share of the events (their
// metrics), nothing was parked in the poison queue (TRYAGAIN of a
// script during a slot's migration is transient: retried, not parked), and the errors during
// the move are few, 503s only, and counted.
const reshardUsers, reshardLocations = 500, 40

func TestClusterReshardUnderLoad(t *testing.T) {
	t.Parallel()
	cl := redistest.StartCluster(t, redistest.ClusterOptions{})
	keys, err := adapters.NewKeySpace("reshard", true)
	require.NoError(t, err)
	keys, err = keys.WithPartitions(adapters.DefaultClusterPartitions)
	require.NoError(t, err)
	env := func(more map[string]string) map[string]string {
		e := map[string]string{"REDIS_URL": cl.URL(), "KEY_PREFIX": keys.Prefix, "RATE_LIMIT_USER": "off",
			"CLAIM_IDLE": "2s", "CLAIM_INTERVAL": "500ms"}
		for k, v := range more {
			e[k] = v
		}
		return e
	}
	api := startSvc(t, "api", env(nil))
	proj := []*svcProc{
		startSvc(t, "project", env(map[string]string{"CONSUMER_NAME": "proj-a"})),
		startSvc(t, "project", env(map[string]string{"CONSUMER_NAME": "proj-b"})),
	}
	cc := redistest.ClusterClient(t, cl.URL())
	ctx := context.Background()

	// The load: distinct check-ins of many users (every partition), each 4th posted twice, the
	// second time as a client's retry with the same checkinId and body.
	l := newLedger()
	lctx, stop := context.WithCancel(ctx)
	defer stop()
	var posted atomic.Int64
	var wg sync.WaitGroup
	client := authedClient(10 * time.Second)
	for w := range 16 {
		wg.Go(func() {
			for i := 0; lctx.Err() == nil; i++ {
				s := sent{user: 1 + rand.Int64N(reshardUsers), location: 1 + rand.Int64N(reshardLocations), stars: rand.Int64N(6)}
				id := fmt.Sprintf("rs-%d-%d", w, i)
				l.post(client, api.base, id, s)
				posted.Add(1)
				if i%4 == 0 {
					l.post(client, api.base, id, s)
					posted.Add(1)
				}
				select {
				case <-lctx.Done():
				case <-time.After(3 * time.Millisecond):
				}
			}
		})
	}
	l.waitFor(t, 2000)

	// Readiness of every process, polled through the move.
	procs := append([]*svcProc{api}, proj...)
	notReady := make([]atomic.Int64, len(procs))
	var whyMu sync.Mutex
	why := map[string]int{} // what /readyz said when it was not 200
	rctx, stopReady := context.WithCancel(ctx)
	var rwg sync.WaitGroup
	for i, p := range procs {
		rwg.Go(func() {
			for rctx.Err() == nil {
				if code, body := faultGet(t, p.base+"/readyz"); code != http.StatusOK {
					notReady[i].Add(1)
					whyMu.Lock()
					why[fmt.Sprintf("%d %s", code, strings.TrimSpace(body))]++
					whyMu.Unlock()
				}
				time.Sleep(100 * time.Millisecond)
			}
		})
	}

	owners := func() []int {
		out := make([]int, keys.Partitions().Count())
		for i, s := range keys.Partitions().Streams() {
			out[i] = cl.MasterOf(t, adapters.KeySlot(s))
		}
		return out
	}
	before := owners()
	okBefore, _, _, _ := l.stats()
	added := cl.AddMaster(t)
	out, took := cl.Rebalance(t)
	cl.WaitHealthy(t, 30*time.Second)
	after := owners()
	okMoved, codesMoved, errsMoved, _ := l.stats()
	moved := 0
	for i := range before {
		if before[i] != after[i] {
			moved++
			assert.Equal(t, added, after[i], "partition %d moved to the new master", i)
		}
	}
	t.Logf("rebalance to node %d took %.1fs (%d lines of redis-cli output); %d of %d partitions moved to it; "+
		"%d check-ins got a 2xx during the move; answers so far %v, %d without an answer",
		added, took.Seconds(), strings.Count(out, "\n"), moved, len(before), okMoved-okBefore, codesMoved, errsMoved)
	assert.Positive(t, moved, "stream partitions moved")

	// Keep the load on for a while on the new layout, then stop it.
	l.waitFor(t, okMoved+2000)
	stop()
	wg.Wait()
	stopReady()
	rwg.Wait()

	for i, p := range procs {
		require.Eventually(t, func() bool {
			code, _ := faultGet(t, p.base+"/readyz")
			return code == http.StatusOK
		}, 30*time.Second, 100*time.Millisecond, "/readyz of process %d comes back by itself", i)
	}

	ok, codes, errs, timeouts := l.stats()
	bad := errs
	for code, n := range codes {
		if code < 200 || code >= 300 {
			bad += n
			assert.Equal(t, http.StatusServiceUnavailable, code, "the only error answer is 503")
		}
	}
	l.mu.Lock()
	by503 := fmt.Sprint(l.codes503)
	l.mu.Unlock()
	tryAgain := 0
	for _, p := range procs {
		tryAgain += p.logs.count("TRYAGAIN") + p.logs.count("redis cluster moving keys")
	}
	t.Logf("%d requests, %d distinct check-ins got a 2xx; %d answers were not 2xx or none (%v, 503 codes %s, %d without an answer); "+
		"log lines naming TRYAGAIN: %d; /readyz polls (every 100 ms) not 200 during the move: api %d, projectors %d and %d (%v)",
		posted.Load(), ok, bad, codes, by503, errs, tryAgain, notReady[0].Load(), notReady[1].Load(), notReady[2].Load(), why)
	assert.Zero(t, timeouts, "no request hangs")
	assert.LessOrEqual(t, bad, int(posted.Load()/100), "errors during the move stay under 1% of the requests")

	l.resolve(t, api.base)
	l.mu.Lock()
	accepted := map[string]clusterAnswer{}
	for id := range l.ok {
		c, ok := l.accepted[id]
		require.True(t, ok, "the 2xx of %s carried its check-in", id)
		accepted[id] = clusterAnswer{CheckinID: c.ID, UserID: c.UserID, LocationID: c.LocationID, StarRating: int64(c.StarRating), Timestamp: c.Timestamp}
	}
	l.mu.Unlock()
	day := time.Now().UTC().Format(time.DateOnly)
	if !assert.EventuallyWithT(t, func(c *assert.CollectT) {
		answers, err := readAnswers(t, api.base, reshardUsers, reshardLocations, day, day)
		require.NoError(c, err)
		checkAgainstComputation(c, answers, accepted)
	}, 60*time.Second, time.Second, "every read model equals the %d check-ins that got a 2xx, each counted once", len(accepted)) {
		// A count short is most often an event parked in the poison queue: say why it was.
		parked, _ := cc.XRange(ctx, keys.PoisonStream(), "-", "+").Result()
		for _, m := range parked {
			t.Logf("parked %s: %v", m.ID, m.Values)
		}
		t.FailNow()
	}
	missing, total := l.missingFromStream(t, cc, keys)
	assert.Zero(t, missing, "check-ins that got a 2xx but are in no partition stream (of %d)", total)
	requireNothingPending(t, cc, keys)
	n, err := cc.XLen(ctx, keys.PoisonStream()).Result()
	if err != nil && err != redis.Nil {
		require.NoError(t, err)
	}
	assert.Zero(t, n, "nothing parked in the poison queue")

	// The two projectors shared the work: each handled a share of the events (the groups hand an
	// entry to one consumer only).
	handled := make([]float64, len(proj))
	var all float64
	for i, p := range proj {
		handled[i] = projectionEventsHandled(t, client, p.base)
		all += handled[i]
	}
	t.Logf("the projectors handled %v events (every projection)", handled)
	for i, n := range handled {
		assert.Greater(t, n, all/10, "projector %d took a share of the work", i)
	}

	// Projection keys live on the new master too.
	var onNew int
	var cursor uint64
	newNode := cl.NodeClient(t, added)
	for {
		ks, next, err := newNode.Scan(ctx, cursor, keys.Prefix+":p:*", 1000).Result()
		require.NoError(t, err)
		onNew += len(ks)
		if cursor = next; cursor == 0 {
			break
		}
	}
	t.Logf("%d projection keys are on the new master", onNew)
	assert.Positive(t, onNew, "projection keys moved to the new master")
}

// projectionEventsHandled is the sum of a process's checkins_projection_events_total applied and
// duplicate outcomes, from its /metrics.
func projectionEventsHandled(t *testing.T, client *http.Client, base string) float64 {
	t.Helper()
	resp, err := client.Get(base + "/metrics")
	require.NoError(t, err)
	defer func() { _ = resp.Body.Close() }()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	raw, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	var sum float64
	for _, line := range strings.Split(string(raw), "\n") {
		if !strings.HasPrefix(line, "checkins_projection_events_total{") ||
			!(strings.Contains(line, `outcome="applied"`) || strings.Contains(line, `outcome="duplicate"`)) {
			continue
		}
		f := strings.Fields(line)
		v, err := strconv.ParseFloat(f[len(f)-1], 64)
		require.NoError(t, err, line)
		sum += v
	}
	return sum
}
