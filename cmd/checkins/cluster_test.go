package main

// The service on a Redis Cluster: the real binary against a local cluster of redis-server
// processes (adapters/redistest), compared with an independent computation and with a run on a
// single server fed the same input.

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"net/http"
	"net/url"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
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

// clusterInput is one POST /checkins of the cluster tests.
type clusterInput struct {
	id                    string
	user, location, stars int64
	timestamp             int64
	want                  int // 202, or 409 for a conflicting reuse of an ID
}

func (c clusterInput) body() string {
	return fmt.Sprintf(`{"checkinId":%q,"userId":%d,"locationId":%d,"starRating":%d,"timestamp":%d}`,
		c.id, c.user, c.location, c.stars, c.timestamp)
}

// clusterAnswer is a 2xx answer of POST /checkins.
type clusterAnswer struct {
	CheckinID  string `json:"checkinId"`
	UserID     int64  `json:"userId"`
	LocationID int64  `json:"locationId"`
	StarRating int64  `json:"starRating"`
	Timestamp  int64  `json:"timestamp"`
	RecordedAt int64  `json:"recordedAt"`
	EntryID    string `json:"entryId"`
}

// entryMs is the time part of the stream entry ID: what /checkins?from&to filter on.
func (a clusterAnswer) entryMs() int64 {
	ms, _, _ := strings.Cut(a.EntryID, "-")
	n, _ := strconv.ParseInt(ms, 10, 64)
	return n
}

// clusterWorkload is n distinct check-ins with explicit timestamps (so two runs agree on every
// read model), a client retry of every 7th (same ID and content, shuffled in, so some run at
// the same time as their original) and, after them, a conflicting reuse of every 50th ID (409).
func clusterWorkload(seed uint64, n int, users, locations int64) (first, conflicts []clusterInput) {
	rng := rand.New(rand.NewPCG(seed, 9))
	now := time.Now().UnixMilli()
	order := rng.Perm(n)
	var distinct []clusterInput
	for i := range n {
		c := clusterInput{id: fmt.Sprintf("cl-%d", i), user: 1 + rng.Int64N(users), location: 1 + rng.Int64N(locations),
			stars: rng.Int64N(6), timestamp: now - 20*24*3600*1000 + int64(order[i])*1000 + rng.Int64N(999), want: http.StatusAccepted}
		distinct = append(distinct, c)
		first = append(first, c)
		if i%7 == 0 {
			first = append(first, c)
		}
		if i%50 == 0 {
			other := c
			other.stars = (c.stars + 1) % 6
			other.want = http.StatusConflict
			conflicts = append(conflicts, other)
		}
	}
	rng.Shuffle(len(first), func(i, j int) { first[i], first[j] = first[j], first[i] })
	return first, conflicts
}

// postAll sends inputs from workers and returns the 2xx answers by checkinId. A request without
// an HTTP answer or with a 503 is sent again with the same checkinId (what a careful client does).
func postAll(t *testing.T, base string, inputs []clusterInput, workers int) map[string]clusterAnswer {
	t.Helper()
	client := authedClient(10 * time.Second)
	var (
		mu  sync.Mutex
		out = map[string]clusterAnswer{}
		wg  sync.WaitGroup
	)
	jobs := make(chan clusterInput)
	for range workers {
		wg.Go(func() {
			for in := range jobs {
				for attempt := 0; ; attempt++ {
					status, raw, err := postRaw(client, base, in.body())
					if (err != nil || status == http.StatusServiceUnavailable) && attempt < 100 {
						time.Sleep(50 * time.Millisecond)
						continue
					}
					if !assert.NoError(t, err) || !assert.Equal(t, in.want, status, "POST %s: %s", in.body(), raw) {
						break
					}
					if status == http.StatusAccepted {
						var a clusterAnswer
						assert.NoError(t, json.Unmarshal(raw, &a))
						mu.Lock()
						if prev, ok := out[a.CheckinID]; ok {
							assert.Equal(t, prev, a, "a retry answers with the check-in first accepted")
						}
						out[a.CheckinID] = a
						mu.Unlock()
					}
					break
				}
			}
		})
	}
	for _, in := range inputs {
		jobs <- in
	}
	close(jobs)
	wg.Wait()
	return out
}

func postRaw(client *http.Client, base, body string) (int, []byte, error) {
	req, err := http.NewRequest(http.MethodPost, base+"/checkins", bytes.NewBufferString(body))
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	return resp.StatusCode, raw, err
}

// readAnswers are the service's answers to every query of the read models and the stream, by
// path, as decoded JSON (recordedAt and entryId dropped: they are the run's own).
func readAnswers(t testing.TB, base string, users, locations int64, fromDay, toDay string) (map[string]any, error) {
	client := authedClient(10 * time.Second)
	out := map[string]any{}
	get := func(path string) (any, error) {
		resp, err := client.Get(base + path)
		if err != nil {
			return nil, err
		}
		defer resp.Body.Close()
		raw, err := io.ReadAll(resp.Body)
		if err != nil {
			return nil, err
		}
		if resp.StatusCode != http.StatusOK && resp.StatusCode != http.StatusNotFound {
			return nil, fmt.Errorf("GET %s: %d %s", path, resp.StatusCode, raw)
		}
		var v any
		if err := json.Unmarshal(raw, &v); err != nil {
			return nil, fmt.Errorf("GET %s: %w", path, err)
		}
		return map[string]any{"status": resp.StatusCode, "body": dropRunFields(v)}, nil
	}
	var paths []string
	for u := int64(1); u <= users+1; u++ {
		paths = append(paths, fmt.Sprintf("/users/%d", u), fmt.Sprintf("/users/%d/checkins", u))
	}
	for l := int64(1); l <= locations+1; l++ {
		paths = append(paths, fmt.Sprintf("/locations/%d", l), fmt.Sprintf("/locations/%d/daily?from=%s&to=%s", l, fromDay, toDay))
	}
	paths = append(paths, "/leaderboards/locations?by=checkins&limit=100", "/leaderboards/locations?by=rating&limit=100",
		"/leaderboards/users?limit=100", "/checkins/latest")
	for _, p := range paths {
		v, err := get(p)
		if err != nil {
			return nil, err
		}
		out[p] = v
	}
	return out, nil
}

// dropRunFields removes what differs between two runs fed the same input: when the service
// recorded a check-in, and its stream entry ID.
func dropRunFields(v any) any {
	switch x := v.(type) {
	case map[string]any:
		delete(x, "recordedAt")
		delete(x, "entryId")
		for k, e := range x {
			x[k] = dropRunFields(e)
		}
	case []any:
		for i, e := range x {
			x[i] = dropRunFields(e)
		}
	}
	return v
}

// listCheckins pages through GET /checkins?from&to and returns the check-ins in stream order.
func listCheckins(t testing.TB, base string, from, to int64) []clusterAnswer {
	t.Helper()
	client := authedClient(10 * time.Second)
	var out []clusterAnswer
	cursor := ""
	for {
		q := url.Values{"from": {strconv.FormatInt(from, 10)}, "to": {strconv.FormatInt(to, 10)}, "limit": {"500"}}
		if cursor != "" {
			q.Set("cursor", cursor)
		}
		resp, err := client.Get(base + "/checkins?" + q.Encode())
		require.NoError(t, err)
		var page struct {
			Checkins   []clusterAnswer `json:"checkins"`
			NextCursor string          `json:"nextCursor"`
		}
		require.Equal(t, http.StatusOK, resp.StatusCode)
		require.NoError(t, json.NewDecoder(resp.Body).Decode(&page))
		_ = resp.Body.Close()
		out = append(out, page.Checkins...)
		if page.NextCursor == "" {
			return out
		}
		cursor = page.NextCursor
	}
}

// wantReadModels is the independent computation of the users and locations read models and of
// the leaderboards' scores over the accepted check-ins.
func wantReadModels(accepted map[string]clusterAnswer) (map[string]map[string]int64, map[int64]int64, map[int64]int64) {
	want := map[string]map[string]int64{}
	userCount, locCount := map[int64]int64{}, map[int64]int64{}
	type latest struct {
		ts  int64
		id  string // the tie
		loc int64
	}
	last := map[int64]latest{}
	stars := map[int64]int64{}
	for _, c := range accepted {
		userCount[c.UserID]++
		locCount[c.LocationID]++
		stars[c.LocationID] += c.StarRating
		// The latest wins; equal timestamps are settled by the greater tie (RecentCheckin.Tie).
		tie := projection.RecentCheckin{CheckinID: c.CheckinID, LocationID: c.LocationID, StarRating: int(c.StarRating), Timestamp: c.Timestamp}.Tie()
		if l := last[c.UserID]; c.Timestamp > l.ts || (c.Timestamp == l.ts && tie > l.id) {
			last[c.UserID] = latest{c.Timestamp, tie, c.LocationID}
		}
	}
	for u, n := range userCount {
		want[fmt.Sprintf("/users/%d", u)] = map[string]int64{"userId": u, "numCheckins": n, "lastCheckin": last[u].ts, "lastSeenAt": last[u].loc}
	}
	for l, n := range locCount {
		want[fmt.Sprintf("/locations/%d", l)] = map[string]int64{"locationId": l, "numCheckins": n, "numStars": stars[l],
			"averageStars": int64(float64(stars[l])/float64(n) + 0.5)}
	}
	return want, userCount, locCount
}

// checkAgainstComputation asserts the answers' users, locations and leaderboard scores.
func checkAgainstComputation(c assert.TestingT, answers map[string]any, accepted map[string]clusterAnswer) {
	want, userCount, locCount := wantReadModels(accepted)
	for path, w := range want {
		got, _ := answers[path].(map[string]any)
		body, _ := got["body"].(map[string]any)
		g := map[string]int64{}
		for k, v := range body {
			if f, ok := v.(float64); ok {
				g[k] = int64(f)
			}
		}
		assert.Equal(c, w, g, "%s", path)
	}
	scores := func(path, member string) map[int64]int64 {
		got, _ := answers[path].(map[string]any)
		body, _ := got["body"].(map[string]any)
		out := map[int64]int64{}
		for _, k := range []string{"users", "locations"} {
			es, _ := body[k].([]any)
			for _, e := range es {
				m, _ := e.(map[string]any)
				id, _ := m[member].(float64)
				n, _ := m["numCheckins"].(float64)
				out[int64(id)] = int64(n)
			}
		}
		return out
	}
	topN := func(counts map[int64]int64, n int) map[int64]int64 {
		type kv struct{ k, v int64 }
		var all []kv
		for k, v := range counts {
			all = append(all, kv{k, v})
		}
		// Equal scores by member, the greater byte string first, as the service ranks them.
		sort.Slice(all, func(i, j int) bool {
			return all[i].v > all[j].v || (all[i].v == all[j].v && strconv.FormatInt(all[i].k, 10) > strconv.FormatInt(all[j].k, 10))
		})
		out := map[int64]int64{}
		for i := 0; i < len(all) && i < n; i++ {
			out[all[i].k] = all[i].v
		}
		return out
	}
	assert.Equal(c, topN(userCount, 100), scores("/leaderboards/users?limit=100", "userId"), "users leaderboard")
	assert.Equal(c, topN(locCount, 100), scores("/leaderboards/locations?by=checkins&limit=100", "locationId"), "locations leaderboard")
	// By rating: every location with at least LEADERBOARD_MIN_CHECKINS (3), at its exact average.
	wantAvg, stars := map[int64]float64{}, map[int64]int64{}
	for _, a := range accepted {
		stars[a.LocationID] += a.StarRating
	}
	for l, n := range locCount {
		if n >= 3 {
			wantAvg[l] = float64(stars[l]) / float64(n)
		}
	}
	gotAvg := map[int64]float64{}
	got, _ := answers["/leaderboards/locations?by=rating&limit=100"].(map[string]any)
	body, _ := got["body"].(map[string]any)
	es, _ := body["locations"].([]any)
	for _, e := range es {
		m, _ := e.(map[string]any)
		id, _ := m["locationId"].(float64)
		avg, _ := m["averageRating"].(float64)
		gotAvg[int64(id)] = avg
	}
	assert.InDeltaMapValues(c, wantAvg, gotAvg, 1e-9, "rating leaderboard")
	assert.Len(c, gotAvg, len(wantAvg), "rating leaderboard")
}

// TestClusterServeEqualsStandalone runs `serve` and a second projector (`project`) on a local
// cluster of 3 masters, with the cluster's default of 24 stream partitions, and `serve` on a
// single server with one stream, posts the same few thousand check-ins (with client retries,
// some concurrent with their originals, and conflicting reuses of IDs) to both, and requires
// every read model and query answer of the cluster run to equal an independent computation over
// the check-ins the API accepted and the single server's answers.
func TestClusterServeEqualsStandalone(t *testing.T) {
	t.Parallel()
	cl := redistest.OpenCluster(t)
	onCluster := serveEqualsStandalone(t, map[string]string{"REDIS_URL": cl.URL, "KEY_PREFIX": cl.Prefix})

	// Where the keys live: 24 partitions, evenly spread, each with its live groups' registry in
	// its slot; the projections registry in the slot of <prefix>:events, which stays unused.
	keys, err := adapters.NewKeySpace(cl.Prefix, true)
	require.NoError(t, err)
	parts, err := adapters.NewPartitions(keys, adapters.DefaultClusterPartitions)
	require.NoError(t, err)
	cc := redistest.ClusterClient(t, cl.URL)
	ctx := context.Background()
	assert.Equal(t, adapters.KeySlot(keys.Stream()), adapters.KeySlot(keys.Projections()))
	for i, stream := range parts.Streams() {
		for _, k := range []string{stream, parts.Registry(i)} {
			slot, err := cc.ClusterKeySlot(ctx, k).Result()
			require.NoError(t, err)
			assert.Equal(t, int64(adapters.KeySlot(stream)), slot, "CLUSTER KEYSLOT %s", k)
			n, err := cc.Exists(ctx, k).Result()
			require.NoError(t, err)
			assert.Equal(t, int64(1), n, "%s exists", k)
		}
	}
	n, err := cc.Exists(ctx, keys.Stream()).Result()
	require.NoError(t, err)
	assert.Zero(t, n, "nothing is written to the unpartitioned stream key")
	p, err := cc.HGet(ctx, keys.Meta(), "partitions").Result()
	require.NoError(t, err)
	assert.Equal(t, "24", p, "P = 24 is recorded")
	require.Zero(t, strings.Count(onCluster.logs.String(), "CROSSSLOT"), "no CROSSSLOT in the logs:\n%s", onCluster.logs)
}

// TestPartitionedServeEqualsStandalone: `serve` and a second projector on a single server with
// STREAM_PARTITIONS=4 answer exactly as `serve` with one stream, on the same input, with either
// subscriber; the check-ins are in the 4 partition streams, by user.
func TestPartitionedServeEqualsStandalone(t *testing.T) {
	t.Parallel()
	for _, sub := range []string{adapters.SubscriberBatched, adapters.SubscriberWatermill} {
		t.Run(sub, func(t *testing.T) {
			t.Parallel()
			partitionedServeEqualsStandalone(t, sub)
		})
	}
}

func partitionedServeEqualsStandalone(t *testing.T, sub string) {
	env := redistest.Open(t)
	serveEqualsStandalone(t, map[string]string{"REDIS_URL": env.URL, "KEY_PREFIX": env.Prefix, "STREAM_PARTITIONS": "4", "SUBSCRIBER": sub})
	keys := adapters.KeySpace{Prefix: env.Prefix}
	parts, err := adapters.NewPartitions(keys, 4)
	require.NoError(t, err)
	c := redistest.Client(t, env.URL)
	ctx := context.Background()
	var total int64
	for _, stream := range parts.Streams() {
		n, err := c.XLen(ctx, stream).Result()
		require.NoError(t, err)
		assert.Positive(t, n, "partition %s has check-ins", stream)
		total += n
		xs, err := c.XRange(ctx, stream, "-", "+").Result()
		require.NoError(t, err)
		for _, x := range xs {
			u, _ := strconv.ParseInt(fmt.Sprint(x.Values["userId"]), 10, 64)
			require.Equal(t, stream, parts.StreamOf(u), "user %d's check-in %s is in its partition", u, x.ID)
		}
	}
	assert.GreaterOrEqual(t, total, int64(3001))
	n, err := c.Exists(ctx, keys.Stream()).Result()
	require.NoError(t, err)
	assert.Zero(t, n, "nothing is written to the unpartitioned stream key")
	p, err := c.HGet(ctx, keys.Meta(), "partitions").Result()
	require.NoError(t, err)
	assert.Equal(t, "4", p)
}

// serveEqualsStandalone runs `serve` and a second projector (`project`) with env, and `serve` on
// a single server with one stream, posts the same few thousand check-ins (with client retries,
// some concurrent with their originals, and conflicting reuses of IDs) to both, and requires
// every read model and query answer of the first to equal an independent computation over the
// check-ins the API accepted and the single server's answers. It returns the first `serve`.
func serveEqualsStandalone(t *testing.T, env map[string]string) *svcProc {
	t.Helper()
	std := redistest.Open(t)
	const (
		n         = 3000
		users     = 60
		locations = 40
	)
	clusterEnv := map[string]string{"LEADERBOARD_MIN_CHECKINS": "3"}
	for k, v := range env {
		clusterEnv[k] = v
	}
	onCluster := startSvc(t, "serve", clusterEnv)
	// The second projector with the stock Watermill subscriber: both subscribers on the cluster.
	second := map[string]string{"CONSUMER_NAME": "second-projector", "SUBSCRIBER": "watermill"}
	for k, v := range clusterEnv {
		second[k] = v
	}
	startSvc(t, "project", second)
	onOne := startSvc(t, "serve", map[string]string{"REDIS_URL": std.URL, "KEY_PREFIX": std.Prefix, "LEADERBOARD_MIN_CHECKINS": "3"})

	first, conflicts := clusterWorkload(uint64(time.Now().UnixNano()), n, users, locations)
	var accepted, acceptedOne map[string]clusterAnswer
	var wg sync.WaitGroup
	wg.Go(func() { accepted = postAll(t, onCluster.base, first, 8) })
	wg.Go(func() { acceptedOne = postAll(t, onOne.base, first, 8) })
	wg.Wait()
	wg.Go(func() { postAll(t, onCluster.base, conflicts, 4) })
	wg.Go(func() { postAll(t, onOne.base, conflicts, 4) })
	wg.Wait()
	// The last check-in, sent alone, so /checkins/latest has one answer in both runs.
	lastOne := clusterInput{id: "cl-last", user: 1, location: 1, stars: 5, timestamp: time.Now().UnixMilli(), want: http.StatusAccepted}
	maps := []map[string]clusterAnswer{postAll(t, onCluster.base, []clusterInput{lastOne}, 1), postAll(t, onOne.base, []clusterInput{lastOne}, 1)}
	accepted["cl-last"], acceptedOne["cl-last"] = maps[0]["cl-last"], maps[1]["cl-last"]
	require.False(t, t.Failed(), "requests did not get the expected answers")
	require.Len(t, accepted, n+1)

	fromDay := time.Now().Add(-21 * 24 * time.Hour).UTC().Format("2006-01-02")
	toDay := time.Now().Add(24 * time.Hour).UTC().Format("2006-01-02")
	var clusterAnswers, oneAnswers map[string]any
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		var err error
		clusterAnswers, err = readAnswers(t, onCluster.base, users, locations, fromDay, toDay)
		if !assert.NoError(c, err) {
			return
		}
		checkAgainstComputation(c, clusterAnswers, accepted)
	}, 2*time.Minute, 500*time.Millisecond, "the cluster's read models must equal the accepted check-ins, each counted once")
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		var err error
		oneAnswers, err = readAnswers(t, onOne.base, users, locations, fromDay, toDay)
		if !assert.NoError(c, err) {
			return
		}
		checkAgainstComputation(c, oneAnswers, acceptedOne)
		// The two runs agree once both have projected everything: recent check-ins, daily
		// counts, leaderboards with their order and ties, the latest check-in.
		clusterAnswers, err = readAnswers(t, onCluster.base, users, locations, fromDay, toDay)
		if assert.NoError(c, err) {
			for path, v := range oneAnswers {
				assert.Equal(c, v, clusterAnswers[path], "%s: the cluster and the single server answer alike", path)
			}
		}
	}, 2*time.Minute, 500*time.Millisecond, "the single server's answers must equal the cluster's")
	latest, _ := clusterAnswers["/checkins/latest"].(map[string]any)
	assert.Equal(t, "cl-last", latest["body"].(map[string]any)["checkinId"], "/checkins/latest")

	// The event stream as /checkins pages through it: every accepted check-in once, and a
	// window holds exactly the check-ins recorded in it (by the entry ID's time, which the
	// bounds are applied to; recordedAt is the API's clock just before the XADD).
	all := listCheckins(t, onCluster.base, 0, time.Now().Add(time.Minute).UnixMilli())
	listed := map[string]clusterAnswer{}
	for _, c := range all {
		_, dup := listed[c.CheckinID]
		assert.False(t, dup, "check-in %s is listed twice", c.CheckinID)
		listed[c.CheckinID] = c
	}
	wrong := 0
	for id, a := range accepted {
		l := listed[id]
		l.RecordedAt, l.EntryID, a.EntryID = 0, "", "" // the 202 does not say them
		if l != a {
			wrong++
		}
	}
	assert.Len(t, listed, len(accepted), "GET /checkins lists every accepted check-in, nothing else")
	assert.Zero(t, wrong, "check-ins listed differently from their 202 (or missing)")
	recorded := make([]int64, 0, len(all))
	for _, c := range all {
		recorded = append(recorded, c.entryMs())
	}
	slices.Sort(recorded)
	from, to := recorded[len(recorded)/4], recorded[len(recorded)/2]
	var wantWindow []string
	for _, c := range all {
		if c.entryMs() >= from && c.entryMs() <= to {
			wantWindow = append(wantWindow, c.CheckinID)
		}
	}
	var gotWindow []string
	for _, c := range listCheckins(t, onCluster.base, from, to) {
		gotWindow = append(gotWindow, c.CheckinID)
	}
	assert.Equal(t, wantWindow, gotWindow, "GET /checkins?from=%d&to=%d: the window, in stream order", from, to)

	return onCluster
}

// TestClusterOperations: `serve` given one seed of the cluster (auto mode asks it; 24 partitions) with
// retention on, and the operational verbs given the full seed list: malformed entries are parked
// and `poison list`, `status` and `poison purge` see and clear them; `projections rebuild`
// builds a version on the cluster and removes the old one's keys from every master; the read
// models stay exact throughout.
func TestClusterOperations(t *testing.T) {
	t.Parallel()
	cl := redistest.OpenCluster(t)
	seed, _, _ := strings.Cut(strings.TrimPrefix(cl.URL, "redis://"), "?")
	env := map[string]string{"REDIS_URL": "redis://" + seed, "KEY_PREFIX": cl.Prefix, "NACK_DELAY": "100ms",
		"RETENTION": "100000", "RETENTION_INTERVAL": "100ms"}
	ops := map[string]string{"REDIS_URL": cl.URL, "KEY_PREFIX": cl.Prefix}
	svc := startSvc(t, "serve", env)
	cc := redistest.ClusterClient(t, cl.URL)
	keys, err := adapters.NewKeySpace(cl.Prefix, true)
	require.NoError(t, err)
	keys, err = keys.WithPartitions(adapters.DefaultClusterPartitions)
	require.NoError(t, err)
	ctx := context.Background()

	l := newLedger()
	httpc := authedClient(10 * time.Second)
	for i := range 200 {
		l.post(httpc, svc.base, fmt.Sprintf("op-%d", i), sent{user: 1 + int64(i)%faultUsers, location: 1 + int64(i)%faultLocations, stars: int64(i % 6)})
	}
	_, err = cc.XAdd(ctx, &redis.XAddArgs{Stream: keys.Partitions().Stream(5), Values: map[string]any{"hello": "world"}}).Result()
	require.NoError(t, err)
	l.verify(t, svc.base)
	requireNothingPending(t, cc, keys)
	groups := len(groupsPending(t, cc, keys))
	require.Positive(t, groups)

	var page poisonListJSON
	require.Eventually(t, func() bool {
		code, out, _ := runOps(t, ops, "poison", "list", "--json", "--limit", "1000")
		return code == 0 && json.Unmarshal([]byte(out), &page) == nil && len(page.Entries) == groups
	}, 20*time.Second, 100*time.Millisecond, "each projection parks the malformed entry")
	code, out, stderr := runOps(t, ops, "status", "--json")
	require.Equal(t, 0, code, stderr)
	var st struct {
		Poisoned int64 `json:"poisoned"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &st), out)
	assert.Equal(t, int64(groups), st.Poisoned)
	code, out, stderr = runOps(t, ops, "poison", "purge", "--all")
	require.Equal(t, 0, code, stderr)
	assert.Contains(t, out, fmt.Sprintf("purged %d entries", groups))

	code, out, stderr = runOps(t, map[string]string{"REDIS_URL": "redis://" + seed, "REDIS_MODE": "cluster", "KEY_PREFIX": cl.Prefix},
		"projections", "rebuild", "users")
	require.Equal(t, 0, code, "stdout %s\nstderr %s", out, stderr)
	assert.Contains(t, out, "users: done, v2 serves reads, v1 removed")
	for i := 200; i < 300; i++ {
		l.post(httpc, svc.base, fmt.Sprintf("op-%d", i), sent{user: 1 + int64(i)%faultUsers, location: 1 + int64(i)%faultLocations, stars: int64(i % 6)})
	}
	l.verify(t, svc.base)
	var left atomic.Int64 // ForEachMaster runs the masters at once
	require.NoError(t, cc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error {
		ks, err := c.Keys(ctx, keys.ProjectionPrefix("users", 1)+"*").Result()
		left.Add(int64(len(ks)))
		return err
	}))
	assert.Zero(t, left.Load(), "users v1's keys are gone from every master")
	code, out, stderr = runOps(t, ops, "projections", "list")
	require.Equal(t, 0, code, stderr)
	assert.Contains(t, out, "users")
	require.Zero(t, strings.Count(svc.logs.String(), "CROSSSLOT"), "no CROSSSLOT in the logs:\n%s", svc.logs)
}

// TestClusterMasterCrash: `serve` on 3 masters + 3 replicas (cluster-node-timeout 1000 ms) takes
// a steady load; a master is killed with SIGKILL: the one of the event stream's slot (every XADD,
// the consumer groups and the registry), or another (a third of the users' idempotency keys,
// dedupe registries and read models). Its replica is promoted within seconds, the API answers 503
// (never a hang, nor another error) only for a few seconds and only to users whose slot or
// partition is on the victim, /readyz comes back by itself, and
// once clients retried what got no 2xx, every read model equals the check-ins that got a 2xx,
// each counted once, and each of them is in the stream.
func TestClusterMasterCrash(t *testing.T) {
	t.Parallel()
	for _, streamMaster := range []bool{true, false} {
		name := map[bool]string{true: "the stream's master", false: "another master"}[streamMaster]
		t.Run(name, func(t *testing.T) { testClusterMasterCrash(t, streamMaster) }) // one cluster at a time
	}
}

func testClusterMasterCrash(t *testing.T, streamMaster bool) {
	cl := redistest.StartCluster(t, redistest.ClusterOptions{Replicas: 1})
	keys, err := adapters.NewKeySpace("crash", true)
	require.NoError(t, err)
	keys, err = keys.WithPartitions(adapters.DefaultClusterPartitions) // the cluster's default P
	require.NoError(t, err)
	stream := keys.Partitions().Stream(0) // "the stream's master": partition 0's
	svc := startSvc(t, "serve", map[string]string{"REDIS_URL": cl.URL(), "KEY_PREFIX": keys.Prefix, "CLAIM_IDLE": "2s", "CLAIM_INTERVAL": "500ms"})
	cc := redistest.ClusterClient(t, cl.URL())

	l := newLedger()
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	wait := l.load(ctx, 4, "crash", func() string { return svc.base }, 10*time.Second)
	l.waitFor(t, 500)
	victim := cl.MasterOf(t, adapters.KeySlot(stream))
	if !streamMaster {
		for _, m := range cl.Masters(t) {
			if m != victim {
				victim = m
				break
			}
		}
	}
	// A slot the victim serves, to see the promotion.
	slot := adapters.KeySlot(stream)
	for i := 0; cl.MasterOf(t, slot) != victim; i++ {
		slot = adapters.KeySlot(keys.Registry(int64(i)))
	}
	// Replication is asynchronous: what the victim acknowledged and its replica had not received
	// yet is lost with it (INGEST_MIN_REPLICAS covers the check-ins, see TestClusterIngestMinReplicas,
	// and PROJECTION_MIN_REPLICAS the projections' writes, see TestClusterProjectionMinReplicas;
	// this test runs with the defaults). The replica catches up first, the load goes on up to the
	// kill.
	require.NoError(t, redistest.Client(t, "redis://"+cl.Addrs()[victim]).Do(context.Background(), "WAIT", 1, 5000).Err())
	// The users whose check-ins touch the victim: a check-in writes its user's slot (the limit
	// and the idempotency record) and its user's partition. The others' must not see a 503.
	victimSlots, err := cl.NodeClient(t, victim).ClusterSlots(context.Background()).Result()
	require.NoError(t, err)
	onVictim := func(slot int) bool {
		for _, r := range victimSlots {
			if slot >= r.Start && slot <= r.End && len(r.Nodes) > 0 && r.Nodes[0].Addr == cl.Addrs()[victim] {
				return true
			}
		}
		return false
	}
	touchesVictim := map[int64]bool{}
	for u := int64(1); u <= faultUsers; u++ {
		touchesVictim[u] = onVictim(adapters.KeySlot(keys.Idempotency(u, "x"))) || onVictim(adapters.KeySlot(keys.Partitions().StreamOf(u)))
	}
	before, _, _, _ := l.stats()
	killed := time.Now()
	cl.KillNode(victim)
	t.Logf("killed node %d (%s) after %d check-ins", victim, map[bool]string{true: "the stream's master", false: "another master"}[streamMaster], before)
	require.Eventually(t, func() bool { return cl.MasterOf(t, slot) != victim },
		30*time.Second, 50*time.Millisecond, "the replica is promoted")
	promoted := time.Since(killed)
	// Ingest goes on by itself: another 500 check-ins get a 2xx.
	l.waitFor(t, before+500)
	stop()
	wait()
	require.Eventually(t, func() bool {
		code, _ := faultGet(t, svc.base+"/readyz")
		return code == http.StatusOK
	}, 30*time.Second, 100*time.Millisecond, "/readyz comes back by itself")

	ok, codes, errs, timeouts := l.stats()
	l.mu.Lock()
	window := l.lastBad.Sub(l.firstBad)
	firstBadAfterKill := l.firstBad.Sub(killed)
	last503 := string(l.last503)
	slowest := l.slowest
	l.mu.Unlock()
	errWindow := "no errors"
	if codes[http.StatusServiceUnavailable] > 0 {
		errWindow = fmt.Sprintf("errors from %.1fs after the kill for %.1fs", firstBadAfterKill.Seconds(), window.Seconds())
	}
	t.Logf("replica promoted %.1fs after the kill; %d check-ins got a 2xx; answers %v, %d without an answer; %s; "+
		"the slowest answer took %.1fs", promoted.Seconds(), ok, codes, errs, errWindow, slowest.Seconds())
	assert.Zero(t, timeouts, "no request hangs")
	assert.Zero(t, errs, "every request gets an HTTP answer")
	for code := range codes {
		if code < 200 || code >= 300 {
			assert.Equal(t, http.StatusServiceUnavailable, code, "the only error is 503")
		}
	}
	if codes[http.StatusServiceUnavailable] > 0 {
		assert.Contains(t, last503, `"code":"unavailable"`, "a 503 names the problem")
		assert.GreaterOrEqual(t, firstBadAfterKill, time.Duration(0), "no error before the kill")
		assert.Less(t, window, 20*time.Second, "errors for a few seconds, not until the next minute's slot-map reload")
	}
	l.mu.Lock()
	users503 := maps.Clone(l.users503)
	l.mu.Unlock()
	spared := 0
	for u := int64(1); u <= faultUsers; u++ {
		if !touchesVictim[u] {
			spared++
			assert.Zero(t, users503[u], "user %d's slot and partition are on the other masters: its check-ins never got a 503", u)
		}
	}
	t.Logf("503s by user %v; %d of %d users touch no slot of the victim", users503, spared, faultUsers)
	require.Positive(t, spared, "some users are on the other masters only, or the check above says nothing")

	l.resolve(t, svc.base)
	l.verify(t, svc.base)
	l.inStream(t, cc, keys)
	requireNothingPending(t, cc, keys)
}

// TestClusterIngestMinReplicas: the master of the stream's slot is killed while its replica lags
// (SIGSTOP and its replication link dropped, then SIGCONT once the master is dead, so the replica
// is promoted without what it missed). With INGEST_MIN_REPLICAS=1 no check-in that got a 2xx is missing from the promoted
// replica's stream, and the lagging replica shows as 503 not_replicated; without the setting,
// check-ins that got a 2xx are lost.
func TestClusterIngestMinReplicas(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		replicas string
		wantLoss bool
	}{{"INGEST_MIN_REPLICAS=1", "1", false}, {"INGEST_MIN_REPLICAS=0", "0", true}} {
		t.Run(tc.name, func(t *testing.T) { // one cluster at a time: six nodes each
			// The paused replica is cut off from its master for as long as the lag takes to build
			// up, which on loaded cores can pass the data age past which a replica declines to
			// fail over (cluster-replica-validity-factor x node timeout, 10 s): this test wants the
			// promotion whatever the replica's age, so that the loss (or none) is what it measures.
			cl := redistest.StartCluster(t, redistest.ClusterOptions{Replicas: 1,
				Args: []string{"--cluster-replica-validity-factor", "0"}})
			keys, err := adapters.NewKeySpace("durable", true)
			require.NoError(t, err)
			keys, err = keys.WithPartitions(adapters.DefaultClusterPartitions) // the cluster's default P
			require.NoError(t, err)
			svc := startSvc(t, "api", map[string]string{"REDIS_URL": cl.URL(), "KEY_PREFIX": keys.Prefix,
				"INGEST_MIN_REPLICAS": tc.replicas, "INGEST_REPLICA_TIMEOUT": "200ms", "RATE_LIMIT_USER": "off"})
			cc := redistest.ClusterClient(t, cl.URL())
			slot := adapters.KeySlot(keys.Partitions().Stream(0)) // a third of the partitions are on its master
			master := cl.MasterOf(t, slot)
			replica := cl.ReplicaOf(t, master)
			require.NotEqual(t, -1, replica, "partition 0's master has a replica")

			l := newLedger()
			ctx, stop := context.WithCancel(context.Background())
			defer stop()
			wait := l.load(ctx, 4, "dur", func() string { return svc.base }, 10*time.Second)
			l.waitFor(t, 200)
			require.NoError(t, cl.SignalNode(replica, syscall.SIGSTOP))
			// On loopback the paused replica's socket buffers would still take in everything the
			// master sends, and hand it over after SIGCONT: drop the link too, so that what the
			// master takes from now on reaches no replica, as with a replica that fell behind.
			require.NoError(t, cl.NodeClient(t, master).Do(context.Background(), "CLIENT", "KILL", "TYPE", "replica").Err())
			answered := func() int {
				ok, codes, errs, _ := l.stats()
				n := errs
				for c, k := range codes {
					if c < 200 || c >= 300 {
						n += k
					}
				}
				return ok + n
			}
			lagFrom := answered()
			require.Eventually(t, func() bool { return answered() > lagFrom+40 }, 30*time.Second, 10*time.Millisecond)
			okBeforeKill, _, _, _ := l.stats()
			cl.KillNode(master)
			require.NoError(t, cl.SignalNode(replica, syscall.SIGCONT))
			require.Eventually(t, func() bool { return cl.MasterOf(t, slot) == replica }, 30*time.Second, 50*time.Millisecond,
				"the replica is promoted")
			stop()
			wait()
			missing, total := l.missingFromStream(t, cc, keys)
			_, codes, _, _ := l.stats()
			l.mu.Lock()
			by503 := maps.Clone(l.codes503)
			l.mu.Unlock()
			t.Logf("%d check-ins got a 2xx (%d before the kill), %d of them missing after the promotion; answers %v, 503s by code %v",
				total, okBeforeKill, missing, codes, by503)
			if tc.wantLoss {
				assert.Positive(t, missing, "without WAIT, check-ins acknowledged while the replica lagged are lost with the master")
				return
			}
			assert.Zero(t, missing, "with WAIT, no acknowledged check-in is lost")
			assert.Positive(t, by503[domain.CodeNotReplicated], "the lagging replica shows as 503 not_replicated")
			assert.GreaterOrEqual(t, total, 200)
		})
	}
}

// TestClusterProjectionMinReplicas: `serve` on 3 masters + 3 replicas takes a steady load with
// INGEST_MIN_REPLICAS=1; a master is killed while its replica lags (SIGSTOP and its replication
// link dropped, SIGCONT once the master is dead: the replica is promoted without what it
// missed), and the dead master comes back as the new master's replica. With
// PROJECTION_MIN_REPLICAS=1 every read model equals an independent computation from the
// check-ins that got a 2xx once the projectors caught up: a batch whose updates reached no
// replica was not acknowledged, and was applied again on the promoted replica. Without it the
// updates the dead master took while its replica lagged are lost with it, for entries already
// acknowledged on the other masters: the read models fall short.
func TestClusterProjectionMinReplicas(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		replicas string
		wantLoss bool
	}{{"1", false}, {"0", true}} {
		t.Run("PROJECTION_MIN_REPLICAS="+tc.replicas, func(t *testing.T) { // one cluster at a time
			cl := redistest.StartCluster(t, redistest.ClusterOptions{Replicas: 1,
				Args: []string{"--cluster-replica-validity-factor", "0"}}) // promoted however far behind (see TestClusterIngestMinReplicas)
			keys, err := adapters.NewKeySpace("durable", true)
			require.NoError(t, err)
			keys, err = keys.WithPartitions(adapters.DefaultClusterPartitions)
			require.NoError(t, err)
			svc := startSvc(t, "serve", map[string]string{"REDIS_URL": cl.URL(), "KEY_PREFIX": keys.Prefix,
				"INGEST_MIN_REPLICAS": "1", "INGEST_REPLICA_TIMEOUT": "200ms", "RATE_LIMIT_USER": "off",
				"PROJECTION_MIN_REPLICAS": tc.replicas, "PROJECTION_REPLICA_TIMEOUT": "200ms",
				"CLAIM_IDLE": "2s", "CLAIM_INTERVAL": "500ms"})
			cc := redistest.ClusterClient(t, cl.URL())
			l := newLedger()
			ctx, stop := context.WithCancel(context.Background())
			defer stop()
			wait := l.load(ctx, 4, "dur", func() string { return svc.base }, 10*time.Second)
			l.waitFor(t, 300)

			victim := cl.Masters(t)[0]
			replica := cl.ReplicaOf(t, victim)
			require.NotEqual(t, -1, replica, "the victim has a replica")
			slot := -1 // a slot the victim serves, to see the promotion
			for i := int64(0); slot < 0 || cl.MasterOf(t, slot) != victim; i++ {
				slot = adapters.KeySlot(keys.Registry(i))
			}
			require.NoError(t, cl.SignalNode(replica, syscall.SIGSTOP))
			require.NoError(t, cl.NodeClient(t, victim).Do(context.Background(), "CLIENT", "KILL", "TYPE", "replica").Err())
			lagFrom, _, _, _ := l.stats()
			l.waitFor(t, lagFrom+300) // the other masters' users and partitions go on
			cl.KillNode(victim)
			require.NoError(t, cl.SignalNode(replica, syscall.SIGCONT))
			require.Eventually(t, func() bool { return cl.MasterOf(t, slot) == replica }, 30*time.Second, 50*time.Millisecond,
				"the replica is promoted")
			cl.RestartNode(t, victim) // back as the new master's replica: WAITs there can succeed again
			cl.WaitHealthy(t, 30*time.Second)
			stop()
			wait()
			l.resolve(t, svc.base)
			ok, codes, _, _ := l.stats()
			t.Logf("%d check-ins got a 2xx; answers %v", ok, codes)
			l.inStream(t, cc, keys)
			if !tc.wantLoss {
				l.verifyAll(t, cl.URL(), keys)
				return
			}
			require.Eventually(t, func() bool { return groupsCaughtUp(cc, keys) }, 60*time.Second, 100*time.Millisecond,
				"the projectors catch up")
			exact, detail := l.verifyOnce(t, cl.URL(), keys)
			assert.False(t, exact, "without WAIT, updates the master took while its replica lagged are lost with it")
			t.Logf("read models after the failover: %s", detail)
		})
	}
}

// groupsCaughtUp: every consumer group on every partition has delivered every entry and has nothing
// pending.
func groupsCaughtUp(rdb redis.UniversalClient, keys adapters.KeySpace) bool {
	for _, stream := range keys.Partitions().Streams() {
		gs, err := rdb.XInfoGroups(context.Background(), stream).Result()
		if err != nil {
			return false
		}
		for _, g := range gs {
			if g.Lag != 0 || g.Pending != 0 {
				return false
			}
		}
	}
	return true
}

// TestClusterNodeSilentAtStart: in auto mode a single address that does not answer at start is
// taken for one server (the service starts, as before clusters were supported, and warns); when
// it then answers as a cluster node, /readyz says so instead of the service quietly
// misrouting commands.
func TestClusterNodeSilentAtStart(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t, redistest.Options{Args: []string{"--cluster-enabled", "yes"}})
	srv.Kill()
	svc := startSvc(t, "api", map[string]string{"REDIS_URL": srv.URL(), "KEY_PREFIX": "silent"})
	assert.Contains(t, svc.logs.String(), "set REDIS_MODE=cluster")
	srv.Restart()
	require.Eventually(t, func() bool {
		code, body := faultGet(t, svc.base+"/readyz")
		return code == http.StatusServiceUnavailable && strings.Contains(body, "names a Redis Cluster node")
	}, 30*time.Second, 100*time.Millisecond, "readyz names the mistake")
}
