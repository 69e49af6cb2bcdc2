package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"slices"
	"sort"
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
	"github.com/checkins/checkins/app/command"
	"github.com/checkins/checkins/app/ops"
	"github.com/checkins/checkins/app/projection"
	"github.com/checkins/checkins/app/query"
)

// dumpVersion reads every key of one projection version, by its name within the version
// (prefix stripped), as comparable strings: hash fields, sorted-set members with scores, set
// members.
func dumpVersion(t *testing.T, client *redis.Client, keys adapters.KeySpace, name string, version int) map[string]map[string]string {
	t.Helper()
	ctx := context.Background()
	prefix := keys.ProjectionPrefix(name, version)
	out := map[string]map[string]string{}
	iter := client.Scan(ctx, 0, prefix+"*", 1000).Iterator()
	for iter.Next(ctx) {
		key := iter.Val()
		content := map[string]string{}
		typ, err := client.Type(ctx, key).Result()
		require.NoError(t, err)
		switch typ {
		case "hash":
			content, err = client.HGetAll(ctx, key).Result()
			require.NoError(t, err)
		case "zset":
			zs, err := client.ZRangeWithScores(ctx, key, 0, -1).Result()
			require.NoError(t, err)
			for _, z := range zs {
				content[fmt.Sprint(z.Member)] = fmt.Sprint(z.Score)
			}
		case "set":
			ms, err := client.SMembers(ctx, key).Result()
			require.NoError(t, err)
			for _, m := range ms {
				content[m] = ""
			}
		default:
			t.Fatalf("unexpected key type %s of %s", typ, key)
		}
		out[typ+" "+strings.TrimPrefix(key, prefix)] = content
	}
	require.NoError(t, iter.Err())
	return out
}

// allSettled: every consumer group on the stream has nothing undelivered and nothing pending.
func allSettled(t *testing.T, client *redis.Client, keys adapters.KeySpace) bool {
	t.Helper()
	info, err := adapters.ReadStreamInfo(context.Background(), client, keys.Stream())
	require.NoError(t, err)
	for _, g := range info.Groups {
		if g.Lag != 0 || g.Pending != 0 {
			return false
		}
	}
	return len(info.Groups) > 0
}

// TestRebuildMatchesIncrementalProcessing runs every shipped projection incrementally (v1) while
// check-ins, with duplicates and out-of-order timestamps, are being published, starts a rebuild
// (v2) of each in the middle of it, and compares all keys of v1 and v2 field by field once both
// have processed the same history. Then it lets the rebuild finish: reads switch to v2, and v1's
// keys and group are removed.
func TestRebuildMatchesIncrementalProcessing(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t, redistest.Options{})
	keys := adapters.KeySpace{Prefix: "rb"}
	client := redistest.Client(t, srv.URL())
	ctx := context.Background()
	projs := allProjections(Config{LeaderboardMinCheckins: 3})
	a := testOps(t, client, keys, projs, Config{RetireGrace: time.Millisecond})
	versions, rebuild := a.Queries.ProjectionVersions, a.Commands.RebuildProjection
	pub := testPublisher(t, srv.URL(), keys)
	rng := rand.New(rand.NewPCG(9, 9))

	history := genCheckins(rng, "h", 1500)
	publishWithDuplicates(t, pub, rng, history[:700], 4)
	// As a projector starts: a version without a recorded layout is decided first (here, a
	// deployment nothing fed yet: the current layout), then fed in it.
	require.NoError(t, rebuild.UpgradeLayouts(ctx, projs))
	targets, err := versions.Targets(ctx, projs)
	require.NoError(t, err)
	router := testProjector(t, srv.URL(), keys, targets)
	// v1 has projected the first part before the rebuild joins: a version joining a live group
	// that has delivered nothing yet is fed by it from the start, with no backfill (on a loaded
	// machine the projector had not read anything yet, and the v2 groups the rebuild created were
	// left for a registry watcher, which this test does not run, to remove).
	require.Eventually(t, func() bool { return allSettled(t, client, keys) }, 60*time.Second, 50*time.Millisecond)

	// The rest is published concurrently with the rebuild starting and running.
	published := make(chan struct{})
	go func() {
		defer close(published)
		publishWithDuplicates(t, pub, rand.New(rand.NewPCG(9, 10)), history[700:], 2)
	}()
	for _, p := range projs {
		rp, err := rebuild.Start(ctx, p.Name())
		require.NoError(t, err)
		require.Equal(t, ops.RebuildProgress{Projection: p.Name(), State: ops.RebuildBuilding, From: 1, To: 2,
			StartedAt: rp.StartedAt, Lag: -1}, rp)
	}
	// What a projector's registry watcher does on its next poll: run v2 next to v1.
	targets, err = versions.Targets(ctx, projs)
	require.NoError(t, err)
	require.Len(t, targets, 2*len(projs))
	added, removed, err := router.SetTargets(ctx, targets)
	require.NoError(t, err)
	assert.Len(t, added, len(projs))
	assert.Empty(t, removed)

	<-published
	require.Eventually(t, func() bool { return allSettled(t, client, keys) }, 60*time.Second, 50*time.Millisecond)

	for _, p := range projs {
		v1 := dumpVersion(t, client, keys, p.Name(), 1)
		v2 := dumpVersion(t, client, keys, p.Name(), 2)
		require.NotEmpty(t, v1, p.Name())
		assert.Equal(t, v1, v2, "%s: the rebuilt read model differs from the incremental one", p.Name())
	}
	// And both are right, not just equal: the user board adds up to the distinct check-ins.
	users, err := projection.Leaderboards{}.TopUsers(ctx, adapters.NewProjectionReader(client, keys, "leaderboards"), 100)
	require.NoError(t, err)
	var total int64
	for _, u := range users {
		total += u.NumCheckins
	}
	assert.Equal(t, int64(len(history)), total)

	// Finish: switch reads, retire v1 in the projector, then remove it.
	for _, p := range projs {
		rp, err := rebuild.Step(ctx, p.Name())
		require.NoError(t, err)
		require.Equal(t, ops.RebuildRetiring, rp.State, p.Name())
		cur, err := adapters.NewProjectionVersions(client, keys).Current(ctx, p.Name())
		require.NoError(t, err)
		assert.Equal(t, 2, cur, "%s reads v2 after the switch", p.Name())
	}
	targets, err = versions.Targets(ctx, projs)
	require.NoError(t, err)
	_, removed, err = router.SetTargets(ctx, targets)
	require.NoError(t, err)
	assert.Len(t, removed, len(projs), "the v1 handlers stop")
	for _, p := range projs {
		rp, err := rebuild.Step(ctx, p.Name())
		require.NoError(t, err)
		assert.Equal(t, ops.RebuildDone, rp.State)
		assert.Empty(t, dumpVersion(t, client, keys, p.Name(), 1), "%s v1 keys removed", p.Name())
		assert.NotEmpty(t, dumpVersion(t, client, keys, p.Name(), 2))
	}
	info, err := adapters.ReadStreamInfo(ctx, client, keys.Stream())
	require.NoError(t, err)
	var groups []string
	for _, g := range info.Groups {
		groups = append(groups, g.Name)
	}
	slices.Sort(groups)
	// The live group feeds v2 of each; their own groups finished their backfill (a projector's
	// registry watcher removes them after the grace period).
	assert.Equal(t, []string{"daily_checkins.v2", "leaderboards.v2", "live", "locations.v2", "recent_checkins.v2", "users.v2"}, groups)
	ms, err := adapters.NewLiveGroups(client, keys).Read(ctx, "live")
	require.NoError(t, err)
	for _, p := range projs {
		assert.Equal(t, ops.BackfillDone, ms.Members[ops.MemberName(p.Name(), 2)].Own, p.Name())
		assert.NotContains(t, ms.Members, ops.MemberName(p.Name(), 1), "v1 left the live group")
	}
}

// rebuildSent is a check-in the API accepted.
type rebuildSent struct {
	id                    string
	user, location, stars int64
	ts                    int64
}

// TestRebuildWhileCheckinsFlow runs the service (API and projectors) in process, keeps posting
// check-ins (with retried duplicates and out-of-order timestamps) over HTTP, and meanwhile
// rebuilds projections with the real CLI binary and over HTTP. Afterwards every read model
// served over HTTP equals an independent computation over the accepted check-ins, and the old
// versions are gone.
func TestRebuildWhileCheckinsFlow(t *testing.T) {
	t.Parallel()
	rdb := redistest.Open(t)
	env := map[string]string{"REDIS_URL": rdb.URL, "KEY_PREFIX": rdb.Prefix, "PROJECTION_POLL_INTERVAL": "100ms",
		"PROJECTION_RETIRE_GRACE": "500ms", "LEADERBOARD_MIN_CHECKINS": "2"}
	svcEnv := map[string]string{}
	for k, v := range env {
		svcEnv[k] = v
	}
	svc := startInProcess(t, svcEnv, Mode{API: true, Projections: true})
	client := redistest.Client(t, rdb.URL)
	keys := adapters.KeySpace{Prefix: rdb.Prefix}
	now := time.Now()

	var (
		mu       sync.Mutex
		accepted []rebuildSent
		stop     atomic.Bool
		posted   = make(chan struct{})
		postErr  error
	)
	go func() {
		defer close(posted)
		rng := rand.New(rand.NewPCG(5, 5))
		for i := 0; !stop.Load() || i < 200; i++ {
			s := rebuildSent{id: fmt.Sprintf("flow-%d", i), user: 1 + rng.Int64N(10), location: 1 + rng.Int64N(6),
				stars: rng.Int64N(6), ts: now.Add(-time.Duration(rng.Int64N(15*24*3600)) * time.Second).UnixMilli()}
			body := fmt.Sprintf(`{"checkinId":%q,"userId":%d,"locationId":%d,"starRating":%d,"timestamp":%d}`, s.id, s.user, s.location, s.stars, s.ts)
			for try := 0; try < 1+rng.IntN(2); try++ { // some are retried: the same request twice
				status, _, err := testPostCheckin(svc.base, body, nil)
				if err != nil || status != http.StatusAccepted {
					postErr = fmt.Errorf("POST %s: status %d, %v", body, status, err)
					return
				}
			}
			mu.Lock()
			accepted = append(accepted, s)
			mu.Unlock()
		}
	}()

	// Some history first, then rebuild while posting goes on.
	require.Eventually(t, func() bool { mu.Lock(); defer mu.Unlock(); return len(accepted) >= 100 }, 30*time.Second, 10*time.Millisecond)
	resp, err := testHTTPClient.Post(svc.base+"/ops/projections/recent_checkins/rebuild", "application/json", nil)
	require.NoError(t, err)
	_ = resp.Body.Close()
	require.Equal(t, http.StatusAccepted, resp.StatusCode)
	resp, err = testHTTPClient.Post(svc.base+"/ops/projections/no_such_thing/rebuild", "application/json", nil)
	require.NoError(t, err)
	_ = resp.Body.Close()
	require.Equal(t, http.StatusNotFound, resp.StatusCode)

	code, out, stderr := runCLI(t, env, "projections", "rebuild", "daily_checkins", "--no-wait")
	require.Equal(t, 0, code, "stdout %s\nstderr %s", out, stderr)
	code, out, stderr = runCLI(t, env, "projections", "rebuild", "leaderboards")
	require.Equal(t, 0, code, "stdout %s\nstderr %s", out, stderr)
	assert.Contains(t, out, "leaderboards: building")
	assert.Contains(t, out, "leaderboards: done, v2 serves reads, v1 removed")

	stop.Store(true)
	<-posted
	require.NoError(t, postErr)
	t.Logf("%d check-ins accepted; the CLI rebuild said:\n%s", len(accepted), out)

	// Every rebuild finishes (projectors drive the ones nobody waits for) and everything settles.
	type opsReport struct {
		Rebuilds []ops.RebuildProgress `json:"rebuilds"`
	}
	require.Eventually(t, func() bool {
		var rep opsReport
		if !getJSON(t, svc.base+"/ops/projections", &rep) {
			return false
		}
		done := 0
		for _, r := range rep.Rebuilds {
			if r.State == ops.RebuildDone && r.To == 2 {
				done++
			}
		}
		return done == 3 && allSettled(t, client, keys)
	}, 60*time.Second, 50*time.Millisecond)

	code, out, stderr = runCLI(t, env, "projections", "list")
	require.Equal(t, 0, code, stderr)
	for _, name := range []string{"leaderboards", "recent_checkins", "daily_checkins"} {
		assert.Regexp(t, name+`\s+v2\s+-\s+v2 \(serving\)\s+live\s+0\s+0\s+caught up`, out)
		assert.Empty(t, dumpVersion(t, client, keys, name, 1), "%s v1 removed", name)
	}

	// The independent computation.
	type locAgg struct{ n, stars int64 }
	locs, users := map[int64]*locAgg{}, map[int64]int64{}
	recent := map[int64][]int64{}
	daily := map[int64]map[string]int64{}
	for _, s := range accepted {
		if locs[s.location] == nil {
			locs[s.location] = &locAgg{}
			daily[s.location] = map[string]int64{}
		}
		locs[s.location].n++
		locs[s.location].stars += s.stars
		users[s.user]++
		recent[s.user] = append(recent[s.user], s.ts)
		daily[s.location][time.UnixMilli(s.ts).UTC().Format(projection.DayLayout)]++
	}

	var ub struct{ Users []projection.LeaderboardUser }
	require.True(t, getJSON(t, svc.base+"/leaderboards/users?limit=100", &ub))
	gotUsers := map[int64]int64{}
	for _, u := range ub.Users {
		gotUsers[u.UserID] = u.NumCheckins
	}
	assert.Equal(t, users, gotUsers)

	var lb struct {
		Locations []projection.LeaderboardLocation
	}
	require.True(t, getJSON(t, svc.base+"/leaderboards/locations?by=rating&limit=100", &lb))
	require.Len(t, lb.Locations, len(locs)) // every location has >= 2 check-ins by now
	for _, l := range lb.Locations {
		a := locs[l.LocationID]
		assert.Equal(t, a.n, l.NumCheckins, "location %d", l.LocationID)
		assert.InDelta(t, float64(a.stars)/float64(a.n), l.AverageRating, 1e-9, "location %d", l.LocationID)
	}
	assert.True(t, sort.SliceIsSorted(lb.Locations, func(i, j int) bool { return lb.Locations[i].AverageRating > lb.Locations[j].AverageRating }))

	for user, tss := range recent {
		sort.Slice(tss, func(i, j int) bool { return tss[i] > tss[j] })
		var rc projection.RecentCheckinsView
		require.True(t, getJSON(t, fmt.Sprintf("%s/users/%d/checkins", svc.base, user), &rc))
		got := make([]int64, len(rc.Checkins))
		for i, c := range rc.Checkins {
			got[i] = c.Timestamp
		}
		assert.Equal(t, tss[:min(len(tss), projection.RecentCheckinsKept)], got, "user %d", user)
	}

	from, to := now.AddDate(0, 0, -16).UTC().Format(projection.DayLayout), now.UTC().Format(projection.DayLayout)
	for loc, days := range daily {
		var dv projection.DailyCheckinsView
		require.True(t, getJSON(t, fmt.Sprintf("%s/locations/%d/daily?from=%s&to=%s", svc.base, loc, from, to), &dv))
		got := map[string]int64{}
		for _, d := range dv.Days {
			if d.Checkins > 0 {
				got[d.Date] = d.Checkins
			}
		}
		assert.Equal(t, days, got, "location %d", loc)
	}

	status, metrics := getBody(t, svc.base+"/metrics")
	require.Equal(t, http.StatusOK, status)
	assert.Contains(t, metrics, `checkins_projection_lag{group="live",projection="leaderboards",version="2"} 0`)
	assert.Contains(t, metrics, `checkins_http_requests_total{method="POST",route="/checkins",status="202"}`)
}

func getBody(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := testHTTPClient.Get(url)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(b)
}

// getJSON decodes a 200 answer into out; false for any other status.
func getJSON(t *testing.T, url string, out any) bool {
	t.Helper()
	status, body := getBody(t, url)
	if status != http.StatusOK {
		t.Logf("GET %s: %d %s", url, status, body)
		return false
	}
	require.NoError(t, json.Unmarshal([]byte(body), out), body)
	return true
}

func TestCLIProjectionsRejectsBadUse(t *testing.T) {
	t.Parallel()
	rdb := redistest.Open(t)
	env := map[string]string{"REDIS_URL": rdb.URL, "KEY_PREFIX": rdb.Prefix}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"projections"}, "missing verb"},
		{[]string{"projections", "delete", "users"}, `unknown verb "delete"`},
		{[]string{"projections", "drop"}, "drop takes one projection version (<name>.v<N>)"},
		{[]string{"projections", "rebuild"}, "rebuild takes one projection name"},
		{[]string{"projections", "rebuild", "nope"}, `projection "nope" (known: users, locations, leaderboards, recent_checkins, daily_checkins)`},
		{[]string{"projections", "list", "extra"}, "unexpected arguments"},
	} {
		code, _, stderr := runCLI(t, env, tc.args...)
		assert.NotEqual(t, 0, code, "%v", tc.args)
		assert.Contains(t, stderr, tc.want, "%v", tc.args)
	}
	code, out, stderr := runCLI(t, env, "projections", "list", "--json")
	require.Equal(t, 0, code, stderr)
	var rep query.ProjectionsReport
	require.NoError(t, json.Unmarshal([]byte(out), &rep), out)
	require.Len(t, rep.Projections, 5)
	assert.Equal(t, query.ProjectionRow{Projection: "users", Serving: 1}, rep.Projections[0])
	assert.Equal(t, "not started: no projector has run it yet", rep.Versions[0].State)
}

// infoHook is a stream whose Info calls before first.
type infoHook struct {
	ops.Stream
	before func()
}

func (s infoHook) Info(ctx context.Context) (ops.StreamInfo, error) {
	if s.before != nil {
		s.before()
	}
	return s.Stream.Info(ctx)
}

// TestConcurrentRebuildStartsKeepTheBuild: two starts of one rebuild at once (projectors that
// start together after a deploy that changed a layout each start it), next to the leftover of a
// build abandoned by hand. Start B reads the registry (nothing building) and, before it looks
// for a leftover group, start A runs through: it removes the leftover, begins the build and
// creates its group. B used to find that new group, take it for the leftover, and remove it: the
// build went on without its group and its keys. Starts now take turns.
func TestConcurrentRebuildStartsKeepTheBuild(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t, redistest.Options{})
	keys := adapters.KeySpace{Prefix: "cs"}
	client := redistest.Client(t, srv.URL())
	ctx := context.Background()
	projs := allProjections(Config{})
	newRebuild := func(b ops.Backend) *command.RebuildProjection {
		r, err := command.NewRebuildProjection(command.RebuildProjectionConfig{Backend: b, Projections: projs, Logger: slog.New(slog.DiscardHandler)})
		require.NoError(t, err)
		return r
	}
	require.NoError(t, client.XAdd(ctx, &redis.XAddArgs{Stream: keys.Stream(), Values: map[string]any{"f": "v"}}).Err())
	// The leftover of a build of users v2 abandoned by hand: its group and a key.
	require.NoError(t, client.XGroupCreate(ctx, keys.Stream(), "users.v2", "$").Err())
	leftover := keys.ProjectionPrefix("users", 2) + "left:over"
	require.NoError(t, client.Set(ctx, leftover, "1", 0).Err())

	a := newRebuild(adapters.NewOpsBackend(client, keys))
	aDone := make(chan struct{})
	var aErr error
	bBackend := adapters.NewOpsBackend(client, keys)
	first := true
	bBackend.Stream = infoHook{Stream: bBackend.Stream, before: func() {
		if !first {
			return
		}
		first = false
		go func() {
			defer close(aDone)
			_, aErr = a.Start(ctx, "users")
		}()
		select { // A runs through here, unless it has to wait for B
		case <-aDone:
		case <-time.After(500 * time.Millisecond):
		}
	}}
	rp, err := newRebuild(bBackend).Start(ctx, "users")
	require.NoError(t, err)
	<-aDone
	require.NoError(t, aErr)
	assert.Equal(t, 2, rp.To)

	st, err := adapters.NewProjectionVersions(client, keys).State(ctx, "users")
	require.NoError(t, err)
	assert.Equal(t, 2, st.Building, "one build of v2")
	info, err := adapters.ReadStreamInfo(ctx, client, keys.Stream())
	require.NoError(t, err)
	g := info.Group("users.v2")
	require.NotNil(t, g, "the build keeps its group")
	assert.Equal(t, "0-0", g.LastDeliveredID, "a new group, at the start of the stream")
	n, err := client.Exists(ctx, leftover, keys.RebuildStartLock("users")).Result()
	require.NoError(t, err)
	assert.Zero(t, n, "the leftover's keys went, and no start holds the lock")
	oldest, err := client.XRangeN(ctx, keys.Stream(), "-", "+", 1).Result()
	require.NoError(t, err)
	b, recorded, err := adapters.NewProjectionVersions(client, keys).BuildStart(ctx, "users", 2)
	require.NoError(t, err)
	require.True(t, recorded, "where the build began is recorded")
	assert.Equal(t, map[string]string{keys.Stream(): oldest[0].ID}, b.Streams)
}
