package adapters_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/checkins/checkins/adapters"
	"github.com/checkins/checkins/adapters/redistest"
	"github.com/checkins/checkins/app/projection"
	"github.com/checkins/checkins/domain"
)

// projEnv is one test's view of Redis: a client and a key prefix nobody else uses, on a single
// server or on a cluster.
type projEnv struct {
	url     string
	cluster bool
	client  redis.UniversalClient
	keys    adapters.KeySpace
}

func newProjEnv(t testing.TB) projEnv {
	t.Helper()
	env := redistest.Open(t)
	return projEnv{url: env.URL, client: redistest.Client(t, env.URL), keys: adapters.KeySpace{Prefix: env.Prefix}}
}

// newClusterProjEnv is a projEnv on the package's shared 3-master cluster.
func newClusterProjEnv(t testing.TB) projEnv {
	t.Helper()
	env := redistest.OpenCluster(t)
	return projEnv{url: env.URL, cluster: true, client: redistest.ClusterClient(t, env.URL), keys: adapters.KeySpace{Prefix: env.Prefix}}
}

// eachEnv runs f on a single server and on a 3-master cluster: the applier takes another path on
// a cluster (step 1 first, then one script per slot), and both must give the same answers.
func eachEnv(t *testing.T, f func(t *testing.T, env projEnv)) {
	t.Helper()
	for _, kind := range []string{"standalone", "cluster"} {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			if kind == "cluster" {
				f(t, newClusterProjEnv(t))
			} else {
				f(t, newProjEnv(t))
			}
		})
	}
}

// newClient is another client of the env's Redis, of the same kind.
func (e projEnv) newClient(t testing.TB) redis.UniversalClient {
	t.Helper()
	if e.cluster {
		return redistest.ClusterClient(t, e.url)
	}
	return redistest.Client(t, e.url)
}

// forEachNode runs f on the single server, or on every master of the cluster.
func forEachNode(ctx context.Context, c redis.UniversalClient, f func(ctx context.Context, c *redis.Client) error) error {
	if cc, ok := c.(*redis.ClusterClient); ok {
		return cc.ForEachMaster(ctx, f)
	}
	return f(ctx, c.(*redis.Client))
}

// keysOf is every key matching pattern, on every master.
func keysOf(t testing.TB, c redis.UniversalClient, pattern string) []string {
	t.Helper()
	var mu sync.Mutex
	var out []string
	require.NoError(t, forEachNode(context.Background(), c, func(ctx context.Context, n *redis.Client) error {
		ks, err := n.Keys(ctx, pattern).Result()
		mu.Lock()
		out = append(out, ks...)
		mu.Unlock()
		return err
	}))
	sort.Strings(out)
	return out
}

// with returns the same server under another prefix, for runs that must not see each other.
func (e projEnv) with(suffix string) projEnv {
	e.keys = adapters.KeySpace{Prefix: e.keys.Prefix + "-" + suffix}
	return e
}

func (e projEnv) applier(t testing.TB, client redis.UniversalClient) *adapters.ProjectionApplier {
	t.Helper()
	a, err := adapters.NewProjectionApplier(client, e.keys, 0)
	require.NoError(t, err)
	return a
}

func (e projEnv) userStats(t testing.TB, id int64) projection.UserStatsView {
	t.Helper()
	v, err := projection.UserStats{}.Get(context.Background(), adapters.NewProjectionReader(e.client, e.keys, "users"), id)
	require.NoError(t, err)
	return v
}

func (e projEnv) locationStats(t testing.TB, id int64) projection.LocationStatsView {
	t.Helper()
	v, err := projection.LocationStats{}.Get(context.Background(), adapters.NewProjectionReader(e.client, e.keys, "locations"), id)
	require.NoError(t, err)
	return v
}

func recorded(id string, user, loc int64, stars int, ts int64) domain.CheckinRecorded {
	return domain.CheckinRecorded{
		Checkin:    domain.Checkin{ID: id, UserID: user, LocationID: loc, StarRating: stars, Timestamp: ts},
		RecordedAt: ts,
	}
}

// entry is a stream entry ID at ms (sequence 0).
func entry(ms int64) string { return strconv.FormatInt(ms, 10) + "-0" }

// applyBoth feeds ev, read at entryID, to users and locations through one group, in one call
// (as the projector applies a batch: a group's updates for an event go together); it returns
// their outcomes.
func applyBoth(t testing.TB, a *adapters.ProjectionApplier, ev domain.CheckinRecorded, entryID string) [2]projection.Outcome {
	t.Helper()
	ctx := context.Background()
	var works []projection.Work
	for _, p := range []projection.Projection{projection.UserStats{}, projection.LocationStats{}} {
		us, err := projection.Updates(ctx, p, ev)
		require.NoError(t, err)
		works = append(works, projection.Work{Group: "g", Projection: p.Name(), Version: 1, Event: projection.RefOf(ev, entryID), Updates: us})
	}
	out, err := a.Apply(ctx, works, nil)
	require.NoError(t, err)
	return [2]projection.Outcome{out[0], out[1]}
}

// snapshot is every read-model key under the prefix with its full content, the prefix cut off,
// so two prefixes that went through the same updates compare equal. The machinery's own keys
// (markers, the dedupe registry) are left out: they are bookkeeping, pruned on their own clock.
func snapshot(t testing.TB, c redis.UniversalClient, prefix string) map[string]string {
	t.Helper()
	ctx := context.Background()
	keys := keysOf(t, c, prefix+":p:*")
	out := make(map[string]string, len(keys))
	for _, k := range keys {
		if adapters.IsBookkeeping(k[strings.LastIndex(k, ":")+1:]) {
			continue
		}
		typ, err := c.Type(ctx, k).Result()
		require.NoError(t, err)
		var parts []string
		switch typ {
		case "hash":
			h, err := c.HGetAll(ctx, k).Result()
			require.NoError(t, err)
			for f, v := range h {
				parts = append(parts, f+"="+v)
			}
			sort.Strings(parts)
		case "zset":
			zs, err := c.ZRangeWithScores(ctx, k, 0, -1).Result()
			require.NoError(t, err)
			for _, z := range zs {
				parts = append(parts, fmt.Sprintf("%v=%v", z.Member, z.Score))
			}
		default:
			parts = []string{"unexpected type " + typ}
		}
		out[strings.TrimPrefix(k, prefix)] = typ + ":" + strings.Join(parts, ",")
	}
	return out
}

// expectedStats computes the read models from distinct check-ins, independently of the store.
type expectedStats struct {
	users     map[int64]projection.UserStatsView
	locations map[int64]projection.LocationStatsView
}

func expect(evs []domain.CheckinRecorded) expectedStats {
	seen := map[domain.Checkin]bool{}
	lastID := map[int64]string{}
	out := expectedStats{users: map[int64]projection.UserStatsView{}, locations: map[int64]projection.LocationStatsView{}}
	for _, e := range evs {
		if seen[e.Checkin] {
			continue
		}
		seen[e.Checkin] = true
		u := out.users[e.UserID]
		u.UserID = e.UserID
		u.NumCheckins++
		tie := projection.RecentCheckin{CheckinID: e.ID, LocationID: e.LocationID, StarRating: e.StarRating, Timestamp: e.Timestamp}.Tie()
		if e.Timestamp > u.LastCheckin || e.Timestamp == u.LastCheckin && tie > lastID[e.UserID] {
			u.LastCheckin, u.LastSeenAt, lastID[e.UserID] = e.Timestamp, e.LocationID, tie
		}
		out.users[e.UserID] = u
		l := out.locations[e.LocationID]
		l.LocationID = e.LocationID
		l.NumCheckins++
		l.NumStars += int64(e.StarRating)
		// floor(num/den + 0.5) in integers: floor((2*num + den) / (2*den)).
		l.AverageStars = (2*l.NumStars + l.NumCheckins) / (2 * l.NumCheckins)
		out.locations[e.LocationID] = l
	}
	return out
}

func (e projEnv) assertStats(t testing.TB, want expectedStats) {
	t.Helper()
	for id, u := range want.users {
		assert.Equal(t, u, e.userStats(t, id), "user %d", id)
	}
	for id, l := range want.locations {
		assert.Equal(t, l, e.locationStats(t, id), "location %d", id)
	}
}

// TestValidateAllocatesNothing: Validate runs on every update of every event before it is
// applied; a valid update costs it no allocation (it parsed every op's first argument as a
// count, making an error, with its message, for each op that was not zkeeptop).
func TestValidateAllocatesNothing(t *testing.T) {
	u := projection.NewUpdate("user:1").
		HIncrBy("stats", "numCheckins", 1).
		HMaxBy("stats", "lastCheckin", 1_700_000_000_000, "lastCheckinId", "ck-1", "lastSeenAt", "7").
		ZAdd("recent", 1_700_000_000_000, "m").
		ZKeepTop("recent", 50)
	require.NoError(t, adapters.Validate("users", u))
	if n := testing.AllocsPerRun(100, func() { _ = adapters.Validate("users", u) }); n != 0 {
		t.Fatalf("Validate of a valid update allocated %.0f times, want 0", n)
	}
}

func TestNewProjectionApplierValidates(t *testing.T) {
	t.Parallel()
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	defer c.Close()
	_, err := adapters.NewProjectionApplier(nil, adapters.KeySpace{Prefix: "x"}, 0)
	assert.Error(t, err)
	_, err = adapters.NewProjectionApplier(c, adapters.KeySpace{}, 0)
	assert.Error(t, err)
	_, err = adapters.NewProjectionApplier(c, adapters.KeySpace{Prefix: "x"}, time.Microsecond)
	assert.Error(t, err)
}

// TestPackedNumbersDecodeInRedis: applyScript's numbers, as the applier packs them, are what
// Redis's cmsgpack.unpack gives back, and what the script's own decoder (for a server without
// cmsgpack) gives back on Redis and on miniredis (the embedded quick start's server), at every
// width of a number (fixint, uint8, 16 and 32) and of the array's header (fixarray, array 16 and
// 32).
func TestPackedNumbersDecodeInRedis(t *testing.T) {
	t.Parallel()
	env := redistest.Open(t)
	mini := miniredis.RunT(t)
	servers := map[string]redis.UniversalClient{"redis": redistest.Client(t, env.URL),
		"miniredis": redis.NewClient(&redis.Options{Addr: mini.Addr()})}
	ctx := context.Background()
	edges := []int{0, 1, 127, 128, 255, 256, 65535, 65536, 1 << 22, 1<<32 - 1}
	check := `
local sum = 0
for i = 1, #t do sum = sum + t[i] * (i % 7 + 1) end
if #t <= 16 then return {#t, sum, unpack(t)} end
return {#t, sum}`
	decoders := map[string]string{
		"cmsgpack":      "local t = cmsgpack.unpack(ARGV[1])" + check,
		"unpackNumbers": adapters.UnpackNumbersLua + "local t = unpackNumbers(ARGV[1])" + check,
	}
	for _, n := range []int{0, 1, 10, 15, 16, 65535, 65536, 70000} {
		vs := make([]int, n)
		want := int64(0)
		for i := range vs {
			vs[i] = edges[i%len(edges)]
			if i%3 == 2 {
				vs[i] = i
			}
			want += int64(vs[i]) * int64((i+1)%7+1)
		}
		for server, c := range servers {
			for name, script := range decoders {
				if server == "miniredis" && name == "cmsgpack" {
					continue // miniredis's Lua has no cmsgpack: why the script has its own decoder
				}
				got, err := c.Eval(ctx, script, nil, adapters.PackNumbers(vs)).Int64Slice()
				require.NoError(t, err, "%s on %s, n=%d", name, server, n)
				require.Equal(t, []int64{int64(n), want}, got[:2], "%s on %s, n=%d: count and weighted sum", name, server, n)
				if n <= 16 {
					for i, v := range vs {
						assert.Equal(t, int64(v), got[2+i], "%s on %s, n=%d, number %d", name, server, n, i)
					}
				}
			}
		}
	}
}

func TestApplyCountsEachCheckinOnce(t *testing.T) {
	t.Parallel()
	eachEnv(t, testApplyCountsEachCheckinOnce)
}

func testApplyCountsEachCheckinOnce(t *testing.T, env projEnv) {
	a := env.applier(t, env.client)
	ev := recorded("ck-1", 42, 7, 4, 1_700_000_000_000)

	assert.Equal(t, [2]projection.Outcome{projection.Applied, projection.Applied}, applyBoth(t, a, ev, entry(1_700_000_000_001)))
	before := snapshot(t, env.client, env.keys.Prefix)
	require.NotEmpty(t, before)

	// Redelivered (same entry): the markers say it landed.
	assert.Equal(t, [2]projection.Outcome{projection.AlreadyApplied, projection.AlreadyApplied}, applyBoth(t, a, ev, entry(1_700_000_000_001)))
	// Published again (another entry, same check-in), a minute and a day later: the registry
	// says another copy was counted, for both projections alike.
	assert.Equal(t, [2]projection.Outcome{projection.Duplicate, projection.Duplicate}, applyBoth(t, a, ev, entry(1_700_000_060_000)))
	assert.Equal(t, [2]projection.Outcome{projection.Duplicate, projection.Duplicate}, applyBoth(t, a, ev, entry(1_700_086_400_000)))
	assert.Equal(t, before, snapshot(t, env.client, env.keys.Prefix), "a duplicate must change nothing")
	assert.Equal(t, projection.UserStatsView{UserID: 42, NumCheckins: 1, LastCheckin: ev.Timestamp, LastSeenAt: 7}, env.userStats(t, 42))
	assert.Equal(t, projection.LocationStatsView{LocationID: 7, NumCheckins: 1, NumStars: 4, AverageStars: 4}, env.locationStats(t, 7))

	// The same checkinId with another body is another check-in: counted by both.
	other := ev
	other.StarRating = 1
	assert.Equal(t, [2]projection.Outcome{projection.Applied, projection.Applied}, applyBoth(t, a, other, entry(1_700_000_120_000)))
	assert.Equal(t, int64(2), env.userStats(t, 42).NumCheckins)
	assert.Equal(t, projection.LocationStatsView{LocationID: 7, NumCheckins: 2, NumStars: 5, AverageStars: 3}, env.locationStats(t, 7))

	_, err := projection.LocationStats{}.Get(context.Background(), adapters.NewProjectionReader(env.client, env.keys, "locations"), 8)
	assert.ErrorIs(t, err, domain.ErrNotFound)
}

func TestApplyDedupeWindow(t *testing.T) {
	t.Parallel()
	eachEnv(t, testApplyDedupeWindow)
}

func testApplyDedupeWindow(t *testing.T, env projEnv) {
	a, err := adapters.NewProjectionApplier(env.client, env.keys, time.Hour)
	require.NoError(t, err)
	a.PruneEvery(1)
	ctx := context.Background()
	// As the projector does: every entry before the one at hand was acknowledged by every group,
	// so the markers below it may go.
	apply := func(ev domain.CheckinRecorded, at int64) projection.Outcome {
		us, err := projection.Updates(ctx, projection.UserStats{}, ev)
		require.NoError(t, err)
		out, err := a.Apply(ctx, []projection.Work{{Group: "g", Projection: "users", Version: 1, Event: projection.RefOf(ev, entry(at)), Updates: us}},
			func(string) (string, bool) { return entry(at), true })
		require.NoError(t, err)
		return out[0]
	}
	ev := recorded("ck-w", 1, 1, 3, 1_000)
	const t0 = 1_700_000_000_000
	defer a.PruneEvery(1)
	a.PruneEvery(0) // correctness must not depend on pruning: stale markers count as absent
	assert.Equal(t, projection.Applied, apply(ev, t0))
	assert.Equal(t, projection.Duplicate, apply(ev, t0+3_600_000), "exactly the window apart: a duplicate")
	// Beyond the window the copy is counted again (the documented limit), and it becomes the
	// copy later ones are judged against.
	assert.Equal(t, projection.Applied, apply(ev, t0+3_600_001))
	assert.Equal(t, projection.Duplicate, apply(ev, t0+7_000_000))
	assert.Equal(t, int64(2), env.userStats(t, 1).NumCheckins)
	a.PruneEvery(1)

	// The registry keeps only the window before what every group has passed (the floor the
	// projector sets): entries of other check-ins prune the old ones. Without a floor, nothing.
	for i := range 10 {
		apply(recorded("fill-"+strconv.Itoa(i), 1, 1, 1, 2_000), t0+10*3_600_000+int64(i))
	}
	n, err := env.client.ZCard(ctx, env.keys.Registry(1)).Result()
	require.NoError(t, err)
	assert.Equal(t, int64(11), n, "no floor yet: the registry is not pruned")
	require.NoError(t, a.SetRegistryFloor(entry(t0+10*3_600_000)))
	for i := range 10 {
		apply(recorded("fill-"+strconv.Itoa(10+i), 1, 1, 1, 2_000), t0+10*3_600_000+int64(10+i))
	}
	n, err = env.client.ZCard(ctx, env.keys.Registry(1)).Result()
	require.NoError(t, err)
	assert.Equal(t, int64(20), n, "identities older than the window are pruned from the registry")
	n, err = env.client.ZCard(ctx, env.keys.MarkerKey("g", "user:1")).Result()
	require.NoError(t, err)
	assert.Equal(t, int64(1), n, "markers below what every group acknowledged are pruned")
}

// TestRegistryKeepsWhatABackfillStillDecides: a rebuild's backfill decides its way through old
// entries while the live group is far ahead. The registry is pruned only below the floor every
// group has passed, so the live group cannot drop a copy the backfill re-registered and still
// needs: the backfill counts the two copies of a check-in as the live group did, once.
func TestRegistryKeepsWhatABackfillStillDecides(t *testing.T) {
	t.Parallel()
	eachEnv(t, testRegistryKeepsWhatABackfillStillDecides)
}

func testRegistryKeepsWhatABackfillStillDecides(t *testing.T, env projEnv) {
	a, err := adapters.NewProjectionApplier(env.client, env.keys, time.Minute)
	require.NoError(t, err)
	a.PruneEvery(1)
	ctx := context.Background()
	apply := func(group string, version int, ev domain.CheckinRecorded, at int64) projection.Outcome {
		us, err := projection.Updates(ctx, projection.UserStats{}, ev)
		require.NoError(t, err)
		out, err := a.Apply(ctx, []projection.Work{{Group: group, Projection: "users", Version: version, Event: projection.RefOf(ev, entry(at)), Updates: us}},
			func(string) (string, bool) { return "", false })
		require.NoError(t, err)
		return out[0]
	}
	const t0 = 1_700_000_000_000
	dup := recorded("ck-dup", 1, 1, 3, 1_000) // recorded twice, 10 s apart: one check-in
	assert.Equal(t, projection.Applied, apply("live", 1, dup, t0))
	assert.Equal(t, projection.Duplicate, apply("live", 1, dup, t0+10_000))
	// Live moves an hour on; everything before is acknowledged, and only live exists yet.
	require.NoError(t, a.SetRegistryFloor(entry(t0+3_600_000)))
	assert.Equal(t, projection.Applied, apply("live", 1, recorded("later-1", 1, 1, 1, 2_000), t0+3_600_000))
	// A rebuild of users starts: its own group reads from the start, so the floor is its
	// position (the projector takes the least of every group's).
	require.NoError(t, a.SetRegistryFloor(entry(t0-1)))
	assert.Equal(t, projection.Applied, apply("users.v2", 2, dup, t0))
	// Live goes on meanwhile, with check-ins of the same user (their calls prune her registry).
	assert.Equal(t, projection.Applied, apply("live", 1, recorded("later-2", 1, 1, 1, 3_000), t0+3_600_001))
	assert.Equal(t, projection.Duplicate, apply("users.v2", 2, dup, t0+10_000), "the backfill must decide as live did")
	for i, id := range []string{"later-1", "later-2"} {
		assert.Equal(t, projection.Applied, apply("users.v2", 2, recorded(id, 1, 1, 1, int64(2_000+1_000*i)), t0+3_600_000+int64(i)))
	}
	require.NoError(t, env.client.HSet(ctx, env.keys.Projections(), "users.version", "2").Err())
	assert.Equal(t, int64(3), env.userStats(t, 1).NumCheckins)
}

// TestParkedEventKeepsItsDecision: a copy parked as a duplicate replays as a duplicate, and a
// counted one as counted, after the registry has let go of the copies (days later).
func TestParkedEventKeepsItsDecision(t *testing.T) {
	t.Parallel()
	eachEnv(t, testParkedEventKeepsItsDecision)
}

func testParkedEventKeepsItsDecision(t *testing.T, env projEnv) {
	a, err := adapters.NewProjectionApplier(env.client, env.keys, time.Minute)
	require.NoError(t, err)
	a.PruneEvery(1)
	ctx := context.Background()
	const t0 = 1_700_000_000_000
	ev := recorded("ck-p", 7, 1, 4, 1_000)
	// Both copies fail in users and are parked; step 1 decides them as they are parked.
	decided, err := a.Decide(ctx, []projection.EventRef{projection.RefOf(ev, entry(t0)), projection.RefOf(ev, entry(t0+5_000))})
	require.NoError(t, err)
	assert.Equal(t, []bool{true, false}, decided)
	again, err := a.Decide(ctx, []projection.EventRef{projection.RefOf(ev, entry(t0))})
	require.NoError(t, err)
	assert.Equal(t, []bool{true}, again, "deciding is idempotent")
	// Days later, with the registry pruned past both copies.
	require.NoError(t, a.SetRegistryFloor(entry(t0+3*86_400_000)))
	_, err = a.ApplyEvent(ctx, "live", projection.LocationStats{}, 1, recorded("other", 7, 2, 1, 2_000), entry(t0+3*86_400_000))
	require.NoError(t, err)
	n, err := env.client.ZScore(ctx, env.keys.Registry(7), strconv.FormatInt(ev.Identity(), 10)).Result()
	require.ErrorIs(t, err, redis.Nil, "the registry forgot the copies (score %v)", n)

	// The duplicate first: asked now, the registry would count it (it remembers neither copy).
	out, err := a.ApplyDecided(ctx, "replay:users.v1", projection.UserStats{}, 1, ev, entry(t0+5_000), projection.DecidedDuplicate)
	require.NoError(t, err)
	assert.Equal(t, projection.Duplicate, out)
	out, err = a.ApplyDecided(ctx, "replay:users.v1", projection.UserStats{}, 1, ev, entry(t0), projection.DecidedCounted)
	require.NoError(t, err)
	assert.Equal(t, projection.Applied, out)
	out, err = a.ApplyDecided(ctx, "replay:users.v1", projection.UserStats{}, 1, ev, entry(t0), projection.DecidedCounted)
	require.NoError(t, err)
	assert.Equal(t, projection.AlreadyApplied, out, "a replay run twice applies once")
	assert.Equal(t, int64(1), env.userStats(t, 7).NumCheckins)
}

func TestApplyMarkersArePruned(t *testing.T) {
	t.Parallel()
	eachEnv(t, testApplyMarkersArePruned)
}

func testApplyMarkersArePruned(t *testing.T, env projEnv) {
	a := env.applier(t, env.client).PruneEvery(1)
	ctx := context.Background()
	const t0 = 1_700_000_000_000
	works := map[string][]projection.Work{}
	for i := range 50 {
		ev := recorded("ck-"+strconv.Itoa(i), 1, 1, 2, 5_000+int64(i))
		for _, p := range []projection.Projection{projection.UserStats{}, projection.RecentCheckins{}} {
			us, err := projection.Updates(ctx, p, ev)
			require.NoError(t, err)
			for _, g := range []string{"live", "users.v2"} {
				if g == "users.v2" && p.Name() != "users" {
					continue
				}
				works[g] = append(works[g], projection.Work{Group: g, Projection: p.Name(), Version: 1 + strings.Count(g, "v2"),
					Event: projection.RefOf(ev, entry(t0+int64(i))), Updates: us})
			}
		}
	}
	live, own := works["live"], works["users.v2"] // two works (users, recent) per event in live
	for _, ws := range [][]projection.Work{live[:80], own[:40]} {
		_, err := a.Apply(ctx, ws, nil)
		require.NoError(t, err)
	}
	card := func(group string) int64 {
		n, err := env.client.ZCard(ctx, env.keys.MarkerKey(group, "user:1")).Result()
		require.NoError(t, err)
		return n
	}
	require.Equal(t, int64(40), card("live"), "one marker per event and slot for the whole group")
	require.Equal(t, int64(40), card("users.v2"))
	// The live group acknowledged everything before entry 30; users.v2 nothing yet.
	prune := func(group string) (string, bool) {
		if group == "live" {
			return entry(t0 + 30), true
		}
		return "", false
	}
	out, err := a.Apply(ctx, append(slices.Clone(live[70:]), own[35:]...), prune)
	require.NoError(t, err)
	want := slices.Repeat([]projection.Outcome{projection.AlreadyApplied}, 10)
	want = append(want, slices.Repeat([]projection.Outcome{projection.Applied}, 20)...)
	want = append(want, slices.Repeat([]projection.Outcome{projection.AlreadyApplied}, 5)...)
	want = append(want, slices.Repeat([]projection.Outcome{projection.Applied}, 10)...)
	assert.Equal(t, want, out)
	assert.Equal(t, int64(20), card("live"), "markers of entries 30..49 remain")
	assert.Equal(t, int64(50), card("users.v2"), "another group's markers are its own")
	assert.Equal(t, int64(50), env.userStats(t, 1).NumCheckins)
}

func TestApplyLegacySeenSet(t *testing.T) {
	t.Parallel()
	eachEnv(t, testApplyLegacySeenSet)
}

func testApplyLegacySeenSet(t *testing.T, env projEnv) {
	a := env.applier(t, env.client)
	ctx := context.Background()
	// The service's earlier layout deduped on a per-slot set of checkinIds.
	require.NoError(t, env.client.SAdd(ctx, env.keys.ProjectionKey("users", 1, "user:5", "seen"), "old-1").Err())
	for _, id := range []string{"old-1", "new-1"} {
		ev := recorded(id, 5, 1, 1, 1_000)
		us, err := projection.Updates(ctx, projection.UserStats{}, ev)
		require.NoError(t, err)
		ref := projection.RefOf(ev, entry(1_700_000_000_000))
		ref.LegacyID = id
		_, err = a.Apply(ctx, []projection.Work{{Group: "g", Projection: "users", Version: 1, Event: ref, Updates: us}}, nil)
		require.NoError(t, err)
	}
	assert.Equal(t, int64(1), env.userStats(t, 5).NumCheckins, "old-1 was applied before the upgrade")
}

func permutations[T any](xs []T) [][]T {
	if len(xs) <= 1 {
		return [][]T{slices.Clone(xs)}
	}
	var out [][]T
	for i := range xs {
		rest := append(slices.Clone(xs[:i]), xs[i+1:]...)
		for _, p := range permutations(rest) {
			out = append(out, append([]T{xs[i]}, p...))
		}
	}
	return out
}

func TestApplyOutOfOrderEveryPermutation(t *testing.T) {
	t.Parallel()
	eachEnv(t, testApplyOutOfOrderEveryPermutation)
}

func testApplyOutOfOrderEveryPermutation(t *testing.T, env projEnv) {
	// Two check-ins share the greatest timestamp: the greater checkinId (ck-c, at location 3)
	// must win whatever the order; ck-z has the greatest ID but an older timestamp.
	evs := []domain.CheckinRecorded{
		recorded("ck-d", 1, 4, 1, 100),
		recorded("ck-a", 1, 1, 5, 300),
		recorded("ck-c", 1, 3, 2, 300),
		recorded("ck-z", 1, 5, 4, 200),
	}
	perms := permutations(evs)
	require.Len(t, perms, 24)
	want := expect(evs)
	require.Equal(t, projection.UserStatsView{UserID: 1, NumCheckins: 4, LastCheckin: 300, LastSeenAt: 3}, want.users[1])

	var first map[string]string
	for i, perm := range perms {
		e := env.with("perm" + strconv.Itoa(i))
		a := e.applier(t, e.client)
		for n, ev := range perm {
			applyBoth(t, a, ev, entry(1_700_000_000_000+int64(n)))
		}
		// Every copy again, in reverse and from later entries: nothing changes.
		for n, ev := range slices.Backward(perm) {
			applyBoth(t, a, ev, entry(1_700_000_001_000+int64(n)))
		}
		e.assertStats(t, want)
		snap := snapshot(t, e.client, e.keys.Prefix)
		if first == nil {
			first = snap
			continue
		}
		require.Equal(t, first, snap, "permutation %d gives another state", i)
	}
}

// TestApplyTieBreakIsByteOrder pins the tie-break to bytes: "a..." sorts after "B..." (0x61 >
// 0x42), where an en_US collation would put "a" first. A Redis running in another locale must
// give the same read model as one in C, or a rebuild elsewhere would disagree.
func TestApplyTieBreakIsByteOrder(t *testing.T) {
	t.Parallel()
	eachEnv(t, testApplyTieBreakIsByteOrder)
}

func testApplyTieBreakIsByteOrder(t *testing.T, env projEnv) {
	pairs := [][2]string{{"B-1", "a-1"}, {"Z", "a"}, {"aB", "ab"}, {"a", "a-"}, {"A.b", "A_b"}}
	for i, pair := range pairs {
		lo, hi := pair[0], pair[1]
		require.Less(t, lo, hi, "Go compares bytes")
		for order, ids := range [][2]string{{lo, hi}, {hi, lo}} {
			e := env.with(fmt.Sprintf("tie%d-%d", i, order))
			a := e.applier(t, e.client)
			for n, id := range ids {
				loc := int64(1)
				if id == hi {
					loc = 2
				}
				applyBoth(t, a, recorded(id, 1, loc, 1, 500), entry(1_700_000_000_000+int64(n)))
			}
			assert.Equal(t, int64(2), e.userStats(t, 1).LastSeenAt, "%q vs %q, %q first: the greater in byte order wins", lo, hi, ids[0])
		}
	}
}

// TestApplyTieBreakIgnoresTheServersLocale runs a redis-server in en_US.UTF-8 (generated with
// localedef into a private directory): there Lua's < on strings puts "a-1" before "B-1", where
// C puts it after. Ties still go by bytes, as on a server in C.
func TestApplyTieBreakIgnoresTheServersLocale(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	if out, err := exec.Command("localedef", "-i", "en_US", "-f", "UTF-8", filepath.Join(dir, "en_US.UTF-8")).CombinedOutput(); err != nil {
		t.Fatalf("generate the en_US.UTF-8 locale (Debian: apt-get install locales): %v\n%s", err, out)
	}
	srv := redistest.Start(t, redistest.Options{Env: []string{"LOCPATH=" + dir, "LC_ALL=en_US.UTF-8"}})
	c := redistest.Client(t, srv.URL())
	ctx := context.Background()
	luaLess, err := c.Eval(ctx, "if ARGV[1] < ARGV[2] then return 1 else return 0 end", nil, "a-1", "B-1").Int()
	require.NoError(t, err)
	require.Equal(t, 1, luaLess, "the server collates in en_US: Lua's < puts a-1 first")
	for order, ids := range [][2]string{{"B-1", "a-1"}, {"a-1", "B-1"}} {
		e := projEnv{url: srv.URL(), client: c, keys: adapters.KeySpace{Prefix: fmt.Sprintf("loc%d", order)}}
		a := e.applier(t, c)
		for n, id := range ids {
			loc := int64(1)
			if id == "a-1" {
				loc = 2
			}
			applyBoth(t, a, recorded(id, 1, loc, 1, 500), entry(1_700_000_000_000+int64(n)))
		}
		assert.Equal(t, int64(2), e.userStats(t, 1).LastSeenAt, "%q first: a-1 is greater in byte order and wins", ids[0])
	}
}

func TestApplyAverageStars(t *testing.T) {
	t.Parallel()
	eachEnv(t, testApplyAverageStars)
}

func testApplyAverageStars(t *testing.T, env projEnv) {
	a := env.applier(t, env.client)
	// Fixed cases around the rounding edge: x.5 rounds up, below rounds down.
	fixed := []struct {
		loc   int64
		stars []int
		want  int64
	}{
		{100, []int{2, 3}, 3},       // 2.5
		{101, []int{1, 2}, 2},       // 1.5
		{102, []int{1, 1, 2}, 1},    // 1.33
		{103, []int{0, 1, 1}, 1},    // 0.67
		{104, []int{0, 0, 0, 1}, 0}, // 0.25
		{105, []int{0}, 0},
		{106, []int{5, 5, 4, 5}, 5}, // 4.75
		{107, []int{4, 5}, 5},       // 4.5
	}
	var evs []domain.CheckinRecorded
	at := int64(1_700_000_000_000)
	next := func() string { at++; return entry(at) }
	for _, f := range fixed {
		for _, s := range f.stars {
			ev := recorded("fx-"+strconv.Itoa(len(evs)), 1, f.loc, s, int64(len(evs)+1))
			evs = append(evs, ev)
			applyBoth(t, a, ev, next())
		}
		assert.Equal(t, f.want, env.locationStats(t, f.loc).AverageStars, "location %d stars %v", f.loc, f.stars)
	}
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 1))
	for i := range 400 {
		ev := recorded("rnd-"+strconv.Itoa(i), rng.Int64N(5)+1, rng.Int64N(6)+1, rng.IntN(6), 1_000+rng.Int64N(100))
		evs = append(evs, ev)
		applyBoth(t, a, ev, next())
		if rng.IntN(4) == 0 { // duplicates must not move the average
			dup := evs[rng.IntN(len(evs))]
			evs = append(evs, dup)
			applyBoth(t, a, dup, next())
		}
	}
	env.assertStats(t, expect(evs))
}

// TestApplyConcurrentBatches: 30 writers apply overlapping batches (redeliveries and republished
// copies of few users and locations) at once, on their own connections, through Apply as the
// projector does; the read models equal an independent count.
func TestApplyConcurrentBatches(t *testing.T) {
	t.Parallel()
	eachEnv(t, testApplyConcurrentBatches)
}

func testApplyConcurrentBatches(t *testing.T, env projEnv) {
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 2))
	type copyOf struct {
		ev    domain.CheckinRecorded
		entry string
	}
	pool := make([]copyOf, 300)
	for i := range pool {
		pool[i] = copyOf{recorded(fmt.Sprintf("ck%04d", i), rng.Int64N(3)+1, rng.Int64N(3)+1, rng.IntN(6), 5_000+rng.Int64N(8)),
			entry(1_700_000_000_000 + int64(i))}
		if i > 0 && rng.IntN(5) == 0 { // a republished copy: same check-in, later entry
			pool[i].ev = pool[rng.IntN(i)].ev
		}
	}
	const writers, perWriter = 30, 40
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	var mu sync.Mutex
	var all []domain.CheckinRecorded
	for range writers {
		picks := make([]copyOf, perWriter)
		for j := range picks {
			picks[j] = pool[rng.IntN(len(pool))]
		}
		mu.Lock()
		for _, p := range picks {
			all = append(all, p.ev)
		}
		mu.Unlock()
		client := env.newClient(t)
		wg.Go(func() {
			ctx := context.Background()
			a, err := adapters.NewProjectionApplier(client, env.keys, 0)
			if err != nil {
				errs <- err
				return
			}
			var works []projection.Work
			for _, p := range picks {
				for _, proj := range []projection.Projection{projection.UserStats{}, projection.LocationStats{}} {
					us, err := projection.Updates(ctx, proj, p.ev)
					if err != nil {
						errs <- err
						return
					}
					works = append(works, projection.Work{Group: "g", Projection: proj.Name(), Version: 1, Event: projection.RefOf(p.ev, p.entry), Updates: us})
				}
			}
			for chunk := range slices.Chunk(works, 16) {
				if _, err := a.Apply(ctx, chunk, nil); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	env.assertStats(t, expect(all))
}

func TestApplyRejectsBeforeAnyWrite(t *testing.T) {
	t.Parallel()
	eachEnv(t, testApplyRejectsBeforeAnyWrite)
}

func testApplyRejectsBeforeAnyWrite(t *testing.T, env projEnv) {
	a := env.applier(t, env.client)
	ctx := context.Background()
	valid := func() *projection.Update { return projection.NewUpdate("user:1").HIncrBy("stats", "n", 1) }
	tests := map[string]*projection.Update{
		"empty slot":             projection.NewUpdate("").HIncrBy("stats", "n", 1),
		"slot with a brace":      projection.NewUpdate("user:{1}").HIncrBy("stats", "n", 1),
		"no ops":                 projection.NewUpdate("user:1"),
		"reserved key applied":   valid().HSet("applied", "x", "1"),
		"reserved key seen":      valid().HSet("seen", "x", "1"),
		"empty key":              valid().HSet("", "x", "1"),
		"reserved second key":    valid().ZRatioAtMin("z", "m", "applied", "a", "b", 1),
		"reserved after valid":   valid().HSet("stats", "a", "b").HRound("seen", "d", "n", "m"),
		"missing args of an op":  {Slot: "user:1", Ops: []projection.Op{{Kind: projection.OpHIncrBy, Keys: []string{"stats"}, Args: []string{"n"}}}},
		"unknown op after valid": {Slot: "user:1", Ops: []projection.Op{valid().Ops[0], {Kind: "del", Keys: []string{"stats"}}}},
		"keep the top 0":         valid().ZKeepTop("recent", 0),
		"keep the top -1":        valid().ZKeepTop("recent", -1),
		"keep the top x":         {Slot: "user:1", Ops: []projection.Op{{Kind: projection.OpZKeepTop, Keys: []string{"recent"}, Args: []string{"x"}}}},
	}
	ev := recorded("ck-1", 1, 1, 1, 1)
	for name, u := range tests {
		works := []projection.Work{
			{Group: "g", Projection: "users", Version: 1, Event: projection.RefOf(ev, entry(1_700_000_000_000)), Updates: []*projection.Update{valid()}},
			{Group: "g", Projection: "users", Version: 1, Event: projection.RefOf(ev, entry(1_700_000_000_000)), Updates: []*projection.Update{u}},
		}
		_, err := a.Apply(ctx, works, nil)
		assert.Error(t, err, name)
		keys, err := env.client.Keys(ctx, env.keys.Prefix+":*").Result()
		require.NoError(t, err)
		assert.Empty(t, keys, "%s: nothing may be written, not even the registry", name)
	}
	_, err := a.Apply(ctx, []projection.Work{{Group: "g", Projection: "users", Version: 1, Event: projection.EventRef{UserID: 1, Identity: 1}, Updates: []*projection.Update{valid()}}}, nil)
	assert.ErrorContains(t, err, "neither a stream entry ID nor a usable recordedAt")
}

func TestApplySurvivesScriptFlush(t *testing.T) {
	t.Parallel()
	eachEnv(t, testApplySurvivesScriptFlush)
}

func testApplySurvivesScriptFlush(t *testing.T, env projEnv) {
	a := env.applier(t, env.client)
	ctx := context.Background()
	for i := range 5 {
		require.NoError(t, env.client.ScriptFlush(ctx).Err())
		applyBoth(t, a, recorded("ck-"+strconv.Itoa(i), 1, 1, 5, 100), entry(1_700_000_000_000+int64(i)))
	}
	assert.Equal(t, int64(5), env.userStats(t, 1).NumCheckins)
}

// TestApplyScriptLostOnOneNode: a promoted replica has no scripts (Redis replicates a script's
// effects, not the script), so on a cluster one node answers NOSCRIPT while the others apply
// their part of the batch. Only the calls that failed are sent again: each work is reported
// Applied, not AlreadyApplied because its own first attempt landed, and counted once.
func TestApplyScriptLostOnOneNode(t *testing.T) {
	t.Parallel()
	eachEnv(t, func(t *testing.T, env projEnv) {
		a := env.applier(t, env.client)
		ctx := context.Background()
		applyBoth(t, a, recorded("warm", 1, 1, 5, 100), entry(1_700_000_000_000)) // scripts loaded
		var once sync.Once
		require.NoError(t, forEachNode(ctx, env.client, func(ctx context.Context, n *redis.Client) error {
			var err error
			once.Do(func() { err = n.ScriptFlush(ctx).Err() }) // one node, whichever comes first
			return err
		}))
		var works []projection.Work
		var evs []domain.CheckinRecorded
		for i := range 40 { // 40 users and locations: every master has some
			ev := recorded("ck-"+strconv.Itoa(i), int64(i+2), int64(i+2), i%6, 100)
			evs = append(evs, ev)
			for _, p := range []projection.Projection{projection.UserStats{}, projection.LocationStats{}} {
				us, err := projection.Updates(ctx, p, ev)
				require.NoError(t, err)
				works = append(works, projection.Work{Group: "g", Projection: p.Name(), Version: 1, Event: projection.RefOf(ev, entry(1_700_000_000_001+int64(i))), Updates: us})
			}
		}
		out, err := a.Apply(ctx, works, nil)
		require.NoError(t, err)
		assert.Equal(t, slices.Repeat([]projection.Outcome{projection.Applied}, len(works)), out)
		env.assertStats(t, expect(evs))
	})
}

// keyslotServer is a cluster-enabled redis-server used only to answer CLUSTER KEYSLOT, which a
// standalone server refuses.
func keyslotServer(t *testing.T) *redis.Client {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	port := l.Addr().(*net.TCPAddr).Port
	require.NoError(t, l.Close())
	dir := t.TempDir()
	cmd := exec.Command("redis-server", "--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--dir", dir,
		"--save", "", "--appendonly", "no", "--cluster-enabled", "yes",
		"--cluster-config-file", filepath.Join(dir, "nodes.conf"), "--logfile", filepath.Join(dir, "redis.log"))
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:" + strconv.Itoa(port)})
	t.Cleanup(func() { _ = c.Close() })
	require.EventuallyWithT(t, func(ct *assert.CollectT) {
		assert.NoError(ct, c.Ping(context.Background()).Err())
	}, 10*time.Second, 20*time.Millisecond)
	return c
}

// TestApplyKeysShareOneSlotPerEntity: every key one update (and its marker) touches shares a
// hash slot, and the registry of a user shares the user's slot; KeySlot agrees with Redis.
func TestApplyKeysShareOneSlotPerEntity(t *testing.T) {
	t.Parallel()
	eachEnv(t, func(t *testing.T, env projEnv) {
		slotter := env.client
		if !env.cluster {
			slotter = keyslotServer(t)
		}
		a := env.applier(t, env.client)
		for i := range 6 {
			applyBoth(t, a, recorded("ck-"+strconv.Itoa(i), int64(i%3+1), int64(i%3+10), i%6, int64(1000+i)), entry(1_700_000_000_000+int64(i)))
		}
		ctx := context.Background()
		keys := keysOf(t, env.client, env.keys.Prefix+":*")
		entities := map[string][]string{}
		distinct := map[int]bool{}
		for _, k := range keys {
			open, end := strings.Index(k, "{"), strings.Index(k, "}")
			require.True(t, open >= 0 && end > open+1, "key %q has no hash tag", k)
			tag := k[open+1 : end]
			entities[tag] = append(entities[tag], k)
			want, err := slotter.ClusterKeySlot(ctx, k).Result()
			require.NoError(t, err)
			assert.EqualValues(t, want, adapters.KeySlot(k), "KeySlot(%q)", k)
			distinct[adapters.KeySlot(k)] = true
		}
		require.Len(t, entities, 6, "3 users and 3 locations, got %v", keys)
		for tag, ks := range entities {
			switch {
			case strings.HasPrefix(tag, "user:"):
				assert.Len(t, ks, 3, "%s: the stats hash, the group's markers and the dedupe registry: %v", tag, ks)
			case env.cluster:
				// On a cluster a script touches one slot: every slot keeps its own markers.
				assert.Len(t, ks, 2, "%s: the stats hash and the group's markers: %v", tag, ks)
			default:
				// On a single server one marker in the user's slot covers an event's updates in
				// every slot, since one script applies them all.
				assert.Len(t, ks, 1, "%s: the stats hash: %v", tag, ks)
			}
		}
		assert.Greater(t, len(distinct), 1, "entities must spread over slots, not share one tag")
		for k, want := range map[string]int{"foo": 12182, "{user1000}.following": 3443, "foo{}{bar}": 8363, "": 0} {
			assert.Equal(t, want, adapters.KeySlot(k), "KeySlot(%q)", k)
		}
	})
}

func TestProjectionReaderFollowsCurrentVersion(t *testing.T) {
	t.Parallel()
	eachEnv(t, testProjectionReaderFollowsCurrentVersion)
}

func testProjectionReaderFollowsCurrentVersion(t *testing.T, env projEnv) {
	ctx := context.Background()
	a := env.applier(t, env.client)
	applyBoth(t, a, recorded("a", 1, 1, 1, 10), entry(1_700_000_000_000))
	// Version 2 reads the same stream: b is new, a is the same entry again.
	for id, ev := range map[string]domain.CheckinRecorded{entry(1_700_000_000_001): recorded("b", 1, 2, 1, 20), entry(1_700_000_000_000): recorded("a", 1, 1, 1, 10)} {
		out, err := a.ApplyEvent(ctx, "users.v2", projection.UserStats{}, 2, ev, id)
		require.NoError(t, err)
		assert.Equal(t, projection.Applied, out)
	}
	assert.Equal(t, int64(1), env.userStats(t, 1).NumCheckins, "version 1 serves until switched")
	require.NoError(t, env.client.HSet(ctx, env.keys.Projections(), "users.version", "2").Err())
	assert.Equal(t, projection.UserStatsView{UserID: 1, NumCheckins: 2, LastCheckin: 20, LastSeenAt: 2}, env.userStats(t, 1))

	require.NoError(t, env.client.HSet(ctx, env.keys.Projections(), "users.version", "zero").Err())
	_, err := projection.UserStats{}.Get(ctx, adapters.NewProjectionReader(env.client, env.keys, "users"), 1)
	require.Error(t, err)
	assert.False(t, errors.Is(err, domain.ErrNotFound))
}

// TestApplySweepLetsGoOfAQuietGroupsMarkers: markers of the last batches stay until Sweep, which
// prunes only what this applier wrote for that group, below the given position.
func TestApplySweepLetsGoOfAQuietGroupsMarkers(t *testing.T) {
	t.Parallel()
	eachEnv(t, testApplySweepLetsGoOfAQuietGroupsMarkers)
}

func testApplySweepLetsGoOfAQuietGroupsMarkers(t *testing.T, env projEnv) {
	a := env.applier(t, env.client).PruneEvery(0)
	ctx := context.Background()
	const t0 = 1_700_000_000_000
	for i := range 10 {
		for _, g := range []string{"live", "other"} {
			ev := recorded("ck-"+strconv.Itoa(i), int64(i%2+1), 1, 2, 1_000)
			us, err := projection.Updates(ctx, projection.UserStats{}, ev)
			require.NoError(t, err)
			_, err = a.Apply(ctx, []projection.Work{{Group: g, Projection: "users", Version: 1 + len(g)%2, Event: projection.RefOf(ev, entry(t0+int64(i))), Updates: us}}, nil)
			require.NoError(t, err)
		}
	}
	markers := func(group string) int64 {
		var n int64
		for _, u := range []string{"user:1", "user:2"} {
			c, err := env.client.ZCard(ctx, env.keys.MarkerKey(group, u)).Result()
			require.NoError(t, err)
			n += c
		}
		return n
	}
	require.Equal(t, int64(10), markers("live"))
	n, err := a.Sweep(ctx, "live", entry(t0+6))
	require.NoError(t, err)
	assert.Equal(t, 2, n, "two marker sets were touched")
	assert.Equal(t, int64(4), markers("live"), "entries 6..9 remain")
	assert.Equal(t, int64(10), markers("other"), "another group's markers are its own")
	n, err = a.Sweep(ctx, "live", entry(t0+100))
	require.NoError(t, err)
	assert.Zero(t, n, "nothing touched since the last sweep")
	_, err = a.Sweep(ctx, "live", "yesterday")
	assert.Error(t, err)
}

// TestApplySweepCompactsWhatItLeaves: a marker set that grew past Redis's compact encoding during
// a drain keeps its large encoding after pruning (Redis never converts a zset back); Sweep writes
// what is left again, compact, with every marker it keeps unchanged.
func TestApplySweepCompactsWhatItLeaves(t *testing.T) {
	t.Parallel()
	eachEnv(t, testApplySweepCompactsWhatItLeaves)
}

func testApplySweepCompactsWhatItLeaves(t *testing.T, env projEnv) {
	a := env.applier(t, env.client).PruneEvery(0)
	ctx := context.Background()
	const t0, n = 1_700_000_000_000, 200
	for i := range n {
		_, err := a.Apply(ctx, []projection.Work{userWork(t, "live", recorded("ck-"+strconv.Itoa(i), 1, 1, 2, 1_000), entry(t0+int64(i)))}, nil)
		require.NoError(t, err)
	}
	mk := env.keys.MarkerKey("live", "user:1")
	enc, err := env.client.ObjectEncoding(ctx, mk).Result()
	require.NoError(t, err)
	require.Equal(t, "skiplist", enc, "more markers than zset-max-listpack-entries")
	_, err = a.Sweep(ctx, "live", entry(t0+n-3))
	require.NoError(t, err)
	left, err := env.client.ZRangeWithScores(ctx, mk, 0, -1).Result()
	require.NoError(t, err)
	require.Len(t, left, 3, "entries n-3..n-1 remain")
	for j, z := range left {
		s, ok := adapters.ScoreOfEntry(entry(t0 + n - 3 + int64(j)))
		require.True(t, ok)
		assert.Equal(t, float64(s), z.Score)
	}
	enc, err = env.client.ObjectEncoding(ctx, mk).Result()
	require.NoError(t, err)
	assert.Equal(t, "listpack", enc, "what is left is compact again")

	// The markers it kept still tell a redelivery from a new copy: nothing is applied again.
	out, err := a.Apply(ctx, []projection.Work{userWork(t, "live", recorded("ck-"+strconv.Itoa(n-1), 1, 1, 2, 1_000), entry(t0+n-1))}, nil)
	require.NoError(t, err)
	assert.Equal(t, projection.AlreadyApplied, out[0])
}

// TestRegistryIsPrunedByEveryCallThatTouchesIt: with the default settings, a script call that
// decides a user's check-in also lets go of her registry's copies older than the window before
// the floor (here the floor moves past the pruning step between any two calls). Left to chance, a busy drain could grow a registry past Redis's compact
// encoding (zset-max-listpack-entries, 128 by default), which it never returns to: the memory of
// the dedupe state would then depend on the drain's luck, not on the window alone.
func TestRegistryIsPrunedByEveryCallThatTouchesIt(t *testing.T) {
	t.Parallel()
	eachEnv(t, testRegistryIsPrunedByEveryCallThatTouchesIt)
}

func testRegistryIsPrunedByEveryCallThatTouchesIt(t *testing.T, env projEnv) {
	a, err := adapters.NewProjectionApplier(env.client, env.keys, time.Minute)
	require.NoError(t, err)
	ctx := context.Background()
	const t0 = 1_700_000_000_000
	for i := range 40 {
		at := t0 + int64(i)*120_000 // two minutes apart: each copy leaves the window of the next
		require.NoError(t, a.SetRegistryFloor(entry(at)))
		_, err := a.Apply(ctx, []projection.Work{userWork(t, "g", recorded("spread-"+strconv.Itoa(i), 1, 1, 1, at), entry(at))}, noPrune)
		require.NoError(t, err)
		n, err := env.client.ZCard(ctx, env.keys.Registry(1)).Result()
		require.NoError(t, err)
		require.LessOrEqual(t, n, int64(2), "call %d: the registry holds only the window before the floor", i)
	}
	assert.Equal(t, int64(40), env.userStats(t, 1).NumCheckins)
}

// TestSameMillisecondCopiesAreDuplicatesForEveryGroup: two copies of one check-in in one
// millisecond (ms-0 and ms-1) are two copies: a group that did not apply the first (a version
// fed by its own group up to its join, by the live group after it) takes the second for a
// duplicate, not for the counted copy delivered again.
func TestSameMillisecondCopiesAreDuplicatesForEveryGroup(t *testing.T) {
	t.Parallel()
	eachEnv(t, func(t *testing.T, env projEnv) {
		a := env.applier(t, env.client)
		ctx := context.Background()
		ev := recorded("same-ms", 1, 1, 1, 1_700_000_000_000)
		out, err := a.Apply(ctx, []projection.Work{userWork(t, "users.v2", ev, "1700000000000-0")}, noPrune)
		require.NoError(t, err)
		require.Equal(t, []projection.Outcome{projection.Applied}, out)
		out, err = a.Apply(ctx, []projection.Work{userWork(t, "live", ev, "1700000000000-1")}, noPrune)
		require.NoError(t, err)
		assert.Equal(t, []projection.Outcome{projection.Duplicate}, out)
		assert.Equal(t, int64(1), env.userStats(t, 1).NumCheckins)
	})
}

// TestRebuildAppliesCopiesCountedApartBeyondTheWindow: two copies of one check-in more than the
// window apart are both counted; a group that meets both before its markers are pruned (a
// rebuild working through history within one checkpoint) counts both too.
func TestRebuildAppliesCopiesCountedApartBeyondTheWindow(t *testing.T) {
	t.Parallel()
	eachEnv(t, func(t *testing.T, env projEnv) {
		a, err := adapters.NewProjectionApplier(env.client, env.keys, time.Minute)
		require.NoError(t, err)
		ctx := context.Background()
		ev := recorded("again", 1, 1, 1, 1_700_000_000_000)
		for _, at := range []int64{1_700_000_000_000, 1_700_000_120_000} {
			out, err := a.Apply(ctx, []projection.Work{userWork(t, "rebuild", ev, entry(at))}, noPrune)
			require.NoError(t, err)
			assert.Equal(t, []projection.Outcome{projection.Applied}, out, "the copy at %d", at)
		}
		assert.Equal(t, int64(2), env.userStats(t, 1).NumCheckins)
	})
}

// TestCopiesCountedApartApplyInEitherOrder: two copies of one check-in more than the window
// apart are both counted, and a group that meets the later one first (the two parked and
// replayed later first, concurrent consumers) applies the earlier one too. The later copy's
// marker used to read as the earlier's: a marker was stale only when it was older than the
// window, not newer, so the earlier copy came back "already applied" and was never counted.
func TestCopiesCountedApartApplyInEitherOrder(t *testing.T) {
	t.Parallel()
	eachEnv(t, func(t *testing.T, env projEnv) {
		a, err := adapters.NewProjectionApplier(env.client, env.keys, time.Minute)
		require.NoError(t, err)
		ctx := context.Background()
		const t0 = 1_700_000_000_000
		later, earlier := entry(t0+120_000), entry(t0)
		ev := recorded("apart", 1, 1, 1, t0)
		apply := func(ev domain.CheckinRecorded, at string) projection.Outcome {
			out, err := a.Apply(ctx, []projection.Work{userWork(t, "rebuild", ev, at)}, noPrune)
			require.NoError(t, err)
			return out[0]
		}
		assert.Equal(t, projection.Applied, apply(ev, later), "the later copy first")
		assert.Equal(t, projection.Applied, apply(ev, earlier), "then the earlier")
		assert.Equal(t, projection.AlreadyApplied, apply(ev, later), "each delivered again: applied once")
		assert.Equal(t, projection.AlreadyApplied, apply(ev, earlier))
		assert.Equal(t, int64(2), env.userStats(t, 1).NumCheckins)

		// In stream order, and the earlier delivered again after the later landed (a retry).
		inOrder := recorded("apart-in-order", 3, 1, 1, t0)
		assert.Equal(t, projection.Applied, apply(inOrder, earlier))
		assert.Equal(t, projection.Applied, apply(inOrder, later))
		assert.Equal(t, projection.AlreadyApplied, apply(inOrder, earlier), "the earlier again, after the later")
		assert.Equal(t, projection.AlreadyApplied, apply(inOrder, later))
		assert.Equal(t, int64(2), env.userStats(t, 3).NumCheckins)

		parked := recorded("apart-parked", 2, 1, 1, t0)
		for _, at := range []string{later, earlier} {
			out, err := a.ApplyDecided(ctx, "replay:users.v1", projection.UserStats{}, 1, parked, at, projection.DecidedCounted)
			require.NoError(t, err)
			assert.Equal(t, projection.Applied, out, "the parked copy at %s, replayed", at)
		}
		out, err := a.ApplyDecided(ctx, "replay:users.v1", projection.UserStats{}, 1, parked, earlier, projection.DecidedCounted)
		require.NoError(t, err)
		assert.Equal(t, projection.AlreadyApplied, out, "replayed again: applied once")
		assert.Equal(t, int64(2), env.userStats(t, 2).NumCheckins)
	})
}

// TestRegistryFloorsComputedBeforeAHoldAreDropped: a checkpoint that read the membership before
// a backfill joined computes floors above what the backfill registers; set after the hold, they
// would prune its identities at once. SetRegistryFloorsAt drops them.
func TestRegistryFloorsComputedBeforeAHoldAreDropped(t *testing.T) {
	t.Parallel()
	eachEnv(t, func(t *testing.T, env projEnv) {
		a, err := adapters.NewProjectionApplier(env.client, env.keys, time.Minute)
		require.NoError(t, err)
		a.PruneEvery(1)
		ctx := context.Background()
		const t0 = 1_700_000_000_000
		now := entry(t0 + 3_600_000)
		registered := func() int64 {
			n, err := env.client.ZCard(ctx, env.keys.Registry(1)).Result()
			require.NoError(t, err)
			return n
		}
		gen := a.FloorsGeneration()
		a.HoldRegistryFloors()
		require.NoError(t, a.SetRegistryFloorsAt(gen, []string{now}), "floors from before the hold")
		_, err = a.Apply(ctx, []projection.Work{userWork(t, "backfill", recorded("old-1", 1, 1, 1, t0), entry(t0))}, noPrune)
		require.NoError(t, err)
		assert.Equal(t, int64(1), registered(), "the stale floors were dropped: nothing pruned")

		require.NoError(t, a.SetRegistryFloorsAt(a.FloorsGeneration(), []string{now}), "floors from after the hold")
		_, err = a.Apply(ctx, []projection.Work{userWork(t, "backfill", recorded("old-2", 1, 1, 1, t0+1), entry(t0+1))}, noPrune)
		require.NoError(t, err)
		assert.Zero(t, registered(), "floors set after the hold prune")
	})
}

// TestApplyClusterEqualsStandalone: the same random input (out-of-order timestamps, republished
// copies, redeliveries of one entry, batches of every size) through every shipped projection
// gives the same outcomes and, key by key, the same read models on a 3-master cluster (step 1
// first, then a script per slot) as on a single server (one script for both steps).
func TestApplyClusterEqualsStandalone(t *testing.T) {
	t.Parallel()
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 3))
	projections := []projection.Projection{projection.UserStats{}, projection.LocationStats{}, projection.Leaderboards{MinCheckins: 2},
		projection.RecentCheckins{}, projection.DailyCheckins{}}
	type copyOf struct {
		ev    domain.CheckinRecorded
		entry string
	}
	var input []copyOf
	at := int64(1_700_000_000_000)
	for i := range 600 {
		at += rng.Int64N(3)
		c := copyOf{recorded(fmt.Sprintf("ck%04d", i), rng.Int64N(30)+1, rng.Int64N(20)+1, rng.IntN(6),
			1_690_000_000_000+rng.Int64N(30*86_400_000)), fmt.Sprintf("%d-%d", at, i)}
		switch r := rng.IntN(10); {
		case r == 0 && i > 0: // republished: the same check-in at a later entry
			c.ev = input[rng.IntN(len(input))].ev
		case r == 1 && i > 0: // redelivered: the same entry again
			c = input[rng.IntN(len(input))]
		}
		input = append(input, c)
	}
	var batches [][]copyOf
	var floors []string // per batch: the least entry still to come, below which markers may go
	for rest := input; len(rest) > 0; {
		n := min(len(rest), 1+rng.IntN(60))
		batches = append(batches, rest[:n])
		least, _ := adapters.ScoreOfEntry(rest[0].entry)
		floor := rest[0].entry
		for _, c := range rest {
			if sc, _ := adapters.ScoreOfEntry(c.entry); sc < least {
				least, floor = sc, c.entry
			}
		}
		floors = append(floors, floor)
		rest = rest[n:]
	}
	ctx := context.Background()
	run := func(env projEnv) ([]projection.Outcome, map[string]string) {
		a := env.applier(t, env.client)
		var outs []projection.Outcome
		for k, b := range batches {
			var works []projection.Work
			for _, c := range b {
				for _, p := range projections {
					us, err := projection.Updates(ctx, p, c.ev)
					require.NoError(t, err)
					works = append(works, projection.Work{Group: "live", Projection: p.Name(), Version: 1, Event: projection.RefOf(c.ev, c.entry), Updates: us})
				}
			}
			out, err := a.Apply(ctx, works, func(string) (string, bool) { return floors[k], true })
			require.NoError(t, err)
			outs = append(outs, out...)
		}
		return outs, snapshot(t, env.client, env.keys.Prefix)
	}
	standalone, cluster := newProjEnv(t), newClusterProjEnv(t)
	wantOut, want := run(standalone)
	gotOut, got := run(cluster)
	require.Greater(t, len(want), 100, "every projection wrote its keys")
	require.Len(t, gotOut, len(wantOut))
	var differ []string
	for i := range wantOut {
		if wantOut[i] != gotOut[i] && len(differ) < 10 {
			differ = append(differ, fmt.Sprintf("work %d (event %d, %s): %d on a single server, %d on the cluster", i, i/len(projections),
				projections[i%len(projections)].Name(), wantOut[i], gotOut[i]))
		}
	}
	assert.Empty(t, differ, "the same outcome for every work")
	assert.Equal(t, want, got, "the same read models, key by key")
	var evs []domain.CheckinRecorded
	for _, c := range input {
		evs = append(evs, c.ev)
	}
	cluster.assertStats(t, expect(evs))
}

// TestApplyCopyGivenTwiceInOneBatch: a batch holding a check-in, a republished copy of it, and
// that copy delivered again answers the same on a single server and a cluster: the copy given
// again is a duplicate like its first delivery, not "applied before".
func TestApplyCopyGivenTwiceInOneBatch(t *testing.T) {
	t.Parallel()
	eachEnv(t, func(t *testing.T, env projEnv) {
		a := env.applier(t, env.client)
		ctx := context.Background()
		ev := recorded("ck-twice", 3, 4, 5, 1_000)
		us, err := projection.Updates(ctx, projection.UserStats{}, ev)
		require.NoError(t, err)
		var works []projection.Work
		for _, at := range []int64{1, 2, 2, 1} {
			works = append(works, projection.Work{Group: "g", Projection: "users", Version: 1, Event: projection.RefOf(ev, entry(1_700_000_000_000+at)), Updates: us})
		}
		out, err := a.Apply(ctx, works, nil)
		require.NoError(t, err)
		assert.Equal(t, []projection.Outcome{projection.Applied, projection.Duplicate, projection.Duplicate, projection.AlreadyApplied}, out)
		assert.Equal(t, int64(1), env.userStats(t, 3).NumCheckins)
	})
}

// TestRegistryFloorIsPerPartition: with partitions, a user's registry is pruned by the floor of
// the user's own partition, not held back by a slower partition.
func TestRegistryFloorIsPerPartition(t *testing.T) {
	t.Parallel()
	eachEnv(t, func(t *testing.T, env projEnv) {
		keys, err := env.keys.WithPartitions(2)
		require.NoError(t, err)
		a, err := adapters.NewProjectionApplier(env.client, keys, time.Minute)
		require.NoError(t, err)
		a.PruneEvery(1)
		ctx := context.Background()
		const t0 = 1_700_000_000_000
		// One user of each partition.
		var users [2]int64
		for u := int64(1); users[0] == 0 || users[1] == 0; u++ {
			if p := adapters.PartitionOf(u, 2); users[p] == 0 {
				users[p] = u
			}
		}
		old := map[int64]domain.CheckinRecorded{}
		for _, u := range users {
			old[u] = recorded(fmt.Sprintf("old-%d", u), u, 1, 3, 1_000)
			_, err := a.ApplyEvent(ctx, "live", projection.UserStats{}, 1, old[u], entry(t0))
			require.NoError(t, err)
		}
		// Partition 1 has moved a day on; partition 0 is still where it was.
		require.NoError(t, a.SetRegistryFloors([]string{entry(t0), entry(t0 + 86_400_000)}))
		for _, u := range users {
			_, err := a.ApplyEvent(ctx, "live", projection.UserStats{}, 1, recorded(fmt.Sprintf("new-%d", u), u, 1, 3, 2_000), entry(t0+86_400_000))
			require.NoError(t, err)
		}
		has := func(u int64) bool {
			_, err := env.client.ZScore(ctx, keys.Registry(u), strconv.FormatInt(old[u].Identity(), 10)).Result()
			if errors.Is(err, redis.Nil) {
				return false
			}
			require.NoError(t, err)
			return true
		}
		assert.True(t, has(users[0]), "partition 0's user keeps the copy its floor still needs")
		assert.False(t, has(users[1]), "partition 1's user lets go of it, whatever partition 0's floor")
	})
}

// TestSweepRegistriesLeavesTheWindowCompact: a drain's decides prune a user's registry with the
// floor of their moment, which trails the drain, so a registry keeps what the drain added
// beyond the window and, grown past zset-max-listpack-entries, stays a skiplist. Once every
// group is quiet, SweepRegistries prunes what was written since its last call below the window
// before the current floor and writes what is left compact; a copy within the window is still
// a duplicate, and a second call has nothing to do.
func TestSweepRegistriesLeavesTheWindowCompact(t *testing.T) {
	t.Parallel()
	eachEnv(t, testSweepRegistriesLeavesTheWindowCompact)
}

func testSweepRegistriesLeavesTheWindowCompact(t *testing.T, env projEnv) {
	a, err := adapters.NewProjectionApplier(env.client, env.keys, time.Minute)
	require.NoError(t, err)
	ctx := context.Background()
	const t0, n = 1_700_000_000_000, 300
	at := func(i int) int64 { return t0 + int64(i)*1_000 } // a second apart: 60 in the window
	evs := make([]domain.CheckinRecorded, n)
	for i := range n {
		evs[i] = recorded("reg-"+strconv.Itoa(i), 1, 1, 1, at(i))
		_, err := a.Apply(ctx, []projection.Work{userWork(t, "g", evs[i], entry(at(i)))}, noPrune)
		require.NoError(t, err)
	}
	reg := env.keys.Registry(1)
	card, err := env.client.ZCard(ctx, reg).Result()
	require.NoError(t, err)
	require.Equal(t, int64(n), card, "no floor known during the drain: nothing pruned")
	enc, err := env.client.ObjectEncoding(ctx, reg).Result()
	require.NoError(t, err)
	require.Equal(t, "skiplist", enc)

	require.NoError(t, a.SetRegistryFloor(entry(at(n-1)+1)))
	swept, err := a.SweepRegistries(ctx)
	require.NoError(t, err)
	assert.Equal(t, 1, swept, "one registry was written since the last sweep")
	card, err = env.client.ZCard(ctx, reg).Result()
	require.NoError(t, err)
	assert.InDelta(t, 61, card, 1, "what is left is the minute before the floor")
	enc, err = env.client.ObjectEncoding(ctx, reg).Result()
	require.NoError(t, err)
	assert.Equal(t, "listpack", enc, "and compact")
	swept, err = a.SweepRegistries(ctx)
	require.NoError(t, err)
	assert.Zero(t, swept, "nothing written since")

	// The last check-in published again, within the window: still a duplicate everywhere.
	out, err := a.Apply(ctx, []projection.Work{userWork(t, "g", evs[n-1], entry(at(n-1)+5))}, noPrune)
	require.NoError(t, err)
	assert.Equal(t, projection.Duplicate, out[0])
	assert.Equal(t, int64(n), env.userStats(t, 1).NumCheckins)
}

// TestSweepRegistriesInChunks: more users than one pipeline of the sweep carries (500) are all
// swept, in chunks, the last one partial.
func TestSweepRegistriesInChunks(t *testing.T) {
	t.Parallel()
	env := newProjEnv(t)
	a, err := adapters.NewProjectionApplier(env.client, env.keys, time.Minute)
	require.NoError(t, err)
	ctx := context.Background()
	const t0, users = 1_700_000_000_000, 1_203
	var works []projection.Work
	for u := range users {
		at := t0 + int64(u)
		works = append(works, userWork(t, "g", recorded("chunk-"+strconv.Itoa(u), int64(u+1), 1, 1, at), entry(at)))
	}
	_, err = a.Apply(ctx, works, noPrune)
	require.NoError(t, err)
	require.NoError(t, a.SetRegistryFloor(entry(t0+users+2*60_000))) // every copy is out of the window
	swept, err := a.SweepRegistries(ctx)
	require.NoError(t, err)
	assert.Equal(t, users, swept)
	for _, u := range []int64{1, 500, 501, users} {
		n, err := env.client.Exists(ctx, env.keys.Registry(u)).Result()
		require.NoError(t, err)
		assert.Zero(t, n, "user %d's registry is empty, so gone", u)
	}
}

// userWork is ev's users-projection update (version 1) for group, as delivered at entry id.
func userWork(t testing.TB, group string, ev domain.CheckinRecorded, id string) projection.Work {
	t.Helper()
	us, err := projection.Updates(context.Background(), projection.UserStats{}, ev)
	require.NoError(t, err)
	return projection.Work{Group: group, Projection: "users", Version: 1, Event: projection.RefOf(ev, id), Updates: us}
}

// noPrune is a Prune that knows no position yet: no marker may go.
func noPrune(string) (string, bool) { return "", false }

// TestRegistryPrunedOnceItsBoundMovedAStep: with the default pruning a call prunes a user's
// registry only when the bound (the window before the floor) moved by a sixteenth of the window
// since this applier last pruned it; PruneEvery(1) prunes on every call.
func TestRegistryPrunedOnceItsBoundMovedAStep(t *testing.T) {
	t.Parallel()
	eachEnv(t, testRegistryPrunedOnceItsBoundMovedAStep)
}

func testRegistryPrunedOnceItsBoundMovedAStep(t *testing.T, env projEnv) {
	a, err := adapters.NewProjectionApplier(env.client, env.keys, time.Hour)
	require.NoError(t, err)
	ctx := context.Background()
	const t0 = 1_700_000_000_000
	n := 0
	apply := func(at int64) {
		n++
		out, err := a.Apply(ctx, []projection.Work{userWork(t, "g", recorded("ck-"+strconv.Itoa(n), 1, 1, 3, 1_000), entry(at))}, noPrune)
		require.NoError(t, err)
		require.Equal(t, projection.Applied, out[0])
	}
	// old puts an identity below the bound of floor straight into the registry, as an earlier
	// copy would have left it, and reports whether it is still there after a call.
	registry := env.keys.Registry(1)
	oldKept := func(floor int64) bool {
		require.NoError(t, a.SetRegistryFloor(entry(floor)))
		s, _ := adapters.ScoreOfEntry(entry(floor - 3_600_000 - 1))
		require.NoError(t, env.client.ZAdd(ctx, registry, redis.Z{Score: float64(s), Member: "old"}).Err())
		apply(floor + 1)
		_, err := env.client.ZScore(ctx, registry, "old").Result()
		if errors.Is(err, redis.Nil) {
			return false
		}
		require.NoError(t, err)
		return true
	}
	floor := int64(t0 + 10*3_600_000)
	assert.False(t, oldKept(floor), "the first call with a floor prunes")
	assert.True(t, oldKept(floor+60_000), "a minute later (under a sixteenth of the hour) the call leaves the registry")
	assert.False(t, oldKept(floor+225_000), "once the bound moved 3.75 minutes it prunes again")
	a.PruneEvery(1)
	assert.False(t, oldKept(floor+226_000), "PruneEvery(1) prunes every call")
}

// TestApplyOneHugeCall: the updates of one user are never split over script calls, so a batch
// of one busy user's check-ins is one call with thousands of keys and strings: its numbers take
// one-, two- and three-byte encodings under an array header of 32 bits. Every
// check-in counts once, republished copies not at all, and the same batch again changes nothing.
func TestApplyOneHugeCall(t *testing.T) {
	t.Parallel()
	eachEnv(t, testApplyOneHugeCall)
}

func testApplyOneHugeCall(t *testing.T, env projEnv) {
	ctx := context.Background()
	a := env.applier(t, env.client)
	projs := []projection.Projection{projection.UserStats{}, projection.LocationStats{}, projection.RecentCheckins{},
		projection.DailyCheckins{}, projection.Leaderboards{MinCheckins: 2}}
	var works []projection.Work
	var all []domain.CheckinRecorded
	const n = 4000 // about 10 strings a check-in: string indexes past 255 take uint16
	for i := range n {
		ev := recorded(fmt.Sprintf("huge-%05d", i), 7, int64(i%900+1), i%6, 1_600_000_000_000+int64(i)*86_400_000/7)
		entryID := entry(1_700_000_000_000 + int64(i))
		if i%10 == 9 { // a copy of an earlier check-in, republished
			ev = all[i-5]
		}
		all = append(all, ev)
		for _, p := range projs {
			us, err := projection.Updates(ctx, p, ev)
			require.NoError(t, err)
			works = append(works, projection.Work{Group: "live", Projection: p.Name(), Version: 1, Event: projection.RefOf(ev, entryID), Updates: us})
		}
	}
	out, err := a.Apply(ctx, works, nil)
	require.NoError(t, err)
	counts := map[projection.Outcome]int{}
	for _, o := range out {
		counts[o]++
	}
	assert.Equal(t, map[projection.Outcome]int{projection.Applied: len(projs) * n * 9 / 10, projection.Duplicate: len(projs) * n / 10}, counts)
	want := expect(all)
	env.assertStats(t, want)

	again, err := a.Apply(ctx, works, nil)
	require.NoError(t, err)
	for i, o := range again {
		require.NotEqual(t, projection.Applied, o, "work %d applied twice", i)
	}
	env.assertStats(t, want)
	recent, err := projection.RecentCheckins{}.Get(ctx, adapters.NewProjectionReader(env.client, env.keys, "recent_checkins"), 7)
	require.NoError(t, err)
	require.Len(t, recent.Checkins, projection.RecentCheckinsKept)
	assert.Equal(t, "huge-03998", recent.Checkins[0].CheckinID, "the latest check-in first")
}
