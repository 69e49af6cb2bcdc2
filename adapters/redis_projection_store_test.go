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

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/checkins/checkins/adapters"
	"github.com/checkins/checkins/adapters/redistest"
	"github.com/checkins/checkins/app/projection"
	"github.com/checkins/checkins/domain"
)

// projEnv is one test's view of Redis: a client and a key prefix nobody else uses.
type projEnv struct {
	url    string
	client *redis.Client
	keys   adapters.KeySpace
}

func newProjEnv(t testing.TB) projEnv {
	t.Helper()
	env := redistest.Open(t)
	return projEnv{url: env.URL, client: redistest.Client(t, env.URL), keys: adapters.KeySpace{Prefix: env.Prefix}}
}

// with returns the same server under another prefix, for runs that must not see each other.
func (e projEnv) with(suffix string) projEnv {
	e.keys = adapters.KeySpace{Prefix: e.keys.Prefix + "-" + suffix}
	return e
}

func (e projEnv) store(t testing.TB, client redis.UniversalClient, name string) *adapters.ProjectionStore {
	t.Helper()
	s, err := adapters.NewProjectionStore(client, e.keys, name, 1)
	require.NoError(t, err)
	return s
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

// resultStore remembers what the real store answered, since projections discard it.
type resultStore struct {
	inner   projection.Store
	results []bool
}

func (s *resultStore) Apply(ctx context.Context, u *projection.Update) (bool, error) {
	ok, err := s.inner.Apply(ctx, u)
	s.results = append(s.results, ok)
	return ok, err
}

// captureStore collects the updates a projection would apply.
type captureStore struct{ updates []*projection.Update }

func (s *captureStore) Apply(_ context.Context, u *projection.Update) (bool, error) {
	s.updates = append(s.updates, u)
	return true, nil
}

// applyBoth feeds ev to the users and locations projections through stores on client.
func applyBoth(t testing.TB, users, locations projection.Store, ev domain.CheckinRecorded) {
	t.Helper()
	ctx := context.Background()
	require.NoError(t, projection.UserStats{}.OnCheckinRecorded(ctx, ev, users))
	require.NoError(t, projection.LocationStats{}.OnCheckinRecorded(ctx, ev, locations))
}

// snapshot is every key under the prefix with its full content, the prefix cut off, so two
// prefixes that went through the same updates compare equal.
func snapshot(t testing.TB, c *redis.Client, prefix string) map[string]string {
	t.Helper()
	ctx := context.Background()
	keys, err := c.Keys(ctx, prefix+":*").Result()
	require.NoError(t, err)
	out := make(map[string]string, len(keys))
	for _, k := range keys {
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
		case "set":
			parts, err = c.SMembers(ctx, k).Result()
			require.NoError(t, err)
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
	seen := map[string]bool{}
	lastID := map[int64]string{}
	out := expectedStats{users: map[int64]projection.UserStatsView{}, locations: map[int64]projection.LocationStatsView{}}
	for _, e := range evs {
		if seen[e.ID] {
			continue
		}
		seen[e.ID] = true
		u := out.users[e.UserID]
		u.UserID = e.UserID
		u.NumCheckins++
		if e.Timestamp > u.LastCheckin || e.Timestamp == u.LastCheckin && e.ID > lastID[e.UserID] {
			u.LastCheckin, u.LastSeenAt, lastID[e.UserID] = e.Timestamp, e.LocationID, e.ID
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

func TestNewProjectionStoreValidates(t *testing.T) {
	t.Parallel()
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	defer c.Close()
	keys := adapters.KeySpace{Prefix: "x"}
	for name, mk := range map[string]func() (*adapters.ProjectionStore, error){
		"nil client": func() (*adapters.ProjectionStore, error) { return adapters.NewProjectionStore(nil, keys, "users", 1) },
		"no name":    func() (*adapters.ProjectionStore, error) { return adapters.NewProjectionStore(c, keys, "", 1) },
		"version 0":  func() (*adapters.ProjectionStore, error) { return adapters.NewProjectionStore(c, keys, "users", 0) },
	} {
		_, err := mk()
		assert.Error(t, err, name)
	}
}

func TestProjectionStoreDuplicateCountedOnce(t *testing.T) {
	t.Parallel()
	env := newProjEnv(t)
	users := &resultStore{inner: env.store(t, env.client, "users")}
	locations := &resultStore{inner: env.store(t, env.client, "locations")}
	ev := recorded("ck-1", 42, 7, 4, 1_700_000_000_000)

	applyBoth(t, users, locations, ev)
	assert.Equal(t, []bool{true}, users.results)
	assert.Equal(t, []bool{true}, locations.results)
	before := snapshot(t, env.client, env.keys.Prefix)
	require.NotEmpty(t, before)

	// Redelivered, republished, replayed: same checkinId, even with other stars and time.
	// (Dedupe is per entity, to stay in one hash slot: the same checkinId at another user or
	// location would count there. The API's idempotency store refuses such a reuse.)
	applyBoth(t, users, locations, ev)
	other := ev
	other.StarRating, other.Timestamp = 1, ev.Timestamp+1000
	applyBoth(t, users, locations, other)
	assert.Equal(t, []bool{true, false, false}, users.results)
	assert.Equal(t, []bool{true, false, false}, locations.results)
	assert.Equal(t, before, snapshot(t, env.client, env.keys.Prefix), "a duplicate must change nothing")

	assert.Equal(t, projection.UserStatsView{UserID: 42, NumCheckins: 1, LastCheckin: ev.Timestamp, LastSeenAt: 7}, env.userStats(t, 42))
	assert.Equal(t, projection.LocationStatsView{LocationID: 7, NumCheckins: 1, NumStars: 4, AverageStars: 4}, env.locationStats(t, 7))

	_, err := projection.LocationStats{}.Get(context.Background(), adapters.NewProjectionReader(env.client, env.keys, "locations"), 8)
	assert.ErrorIs(t, err, domain.ErrNotFound)
	_, err = projection.UserStats{}.Get(context.Background(), adapters.NewProjectionReader(env.client, env.keys, "users"), 43)
	assert.ErrorIs(t, err, domain.ErrNotFound)
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

func TestProjectionStoreOutOfOrderEveryPermutation(t *testing.T) {
	t.Parallel()
	env := newProjEnv(t)
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
		users, locations := e.store(t, e.client, "users"), e.store(t, e.client, "locations")
		for _, ev := range perm {
			applyBoth(t, users, locations, ev)
		}
		// A replay of everything in reverse changes nothing either.
		for _, ev := range slices.Backward(perm) {
			applyBoth(t, users, locations, ev)
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

func TestProjectionStoreAverageStars(t *testing.T) {
	t.Parallel()
	env := newProjEnv(t)
	users, locations := env.store(t, env.client, "users"), env.store(t, env.client, "locations")

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
	for _, f := range fixed {
		for _, s := range f.stars {
			ev := recorded("fx-"+strconv.Itoa(len(evs)), 1, f.loc, s, int64(len(evs)+1))
			evs = append(evs, ev)
			applyBoth(t, users, locations, ev)
		}
		assert.Equal(t, f.want, env.locationStats(t, f.loc).AverageStars, "location %d stars %v", f.loc, f.stars)
	}

	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 1))
	for i := range 400 {
		ev := recorded("rnd-"+strconv.Itoa(i), rng.Int64N(5)+1, rng.Int64N(6)+1, rng.IntN(6), 1_000+rng.Int64N(100))
		evs = append(evs, ev)
		applyBoth(t, users, locations, ev)
		if rng.IntN(4) == 0 { // duplicates must not move the average
			dup := evs[rng.IntN(len(evs))]
			evs = append(evs, dup)
			applyBoth(t, users, locations, dup)
		}
	}
	env.assertStats(t, expect(evs))
}

func TestProjectionStoreConcurrentWriters(t *testing.T) {
	t.Parallel()
	env := newProjEnv(t)
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 2))
	// Few users and locations and a narrow time range: writers collide on the same keys and on
	// equal timestamps.
	pool := make([]domain.CheckinRecorded, 200)
	for i := range pool {
		pool[i] = recorded(fmt.Sprintf("ck%04d", i), rng.Int64N(3)+1, rng.Int64N(3)+1, rng.IntN(6), 5_000+rng.Int64N(8))
	}
	const writers, perWriter = 50, 30
	picks := make([][]int, writers)
	var applied []domain.CheckinRecorded
	for w := range picks {
		for range perWriter {
			i := rng.IntN(len(pool))
			picks[w] = append(picks[w], i)
			applied = append(applied, pool[i])
		}
	}
	clients := make([]*redis.Client, writers)
	for w := range clients {
		clients[w] = redistest.Client(t, env.url)
	}

	var wg sync.WaitGroup
	errs := make(chan error, writers)
	for w := range writers {
		wg.Go(func() {
			ctx := context.Background()
			users, err := adapters.NewProjectionStore(clients[w], env.keys, "users", 1)
			if err != nil {
				errs <- err
				return
			}
			locations, err := adapters.NewProjectionStore(clients[w], env.keys, "locations", 1)
			if err != nil {
				errs <- err
				return
			}
			for _, i := range picks[w] {
				if err := (projection.UserStats{}).OnCheckinRecorded(ctx, pool[i], users); err != nil {
					errs <- err
					return
				}
				if err := (projection.LocationStats{}).OnCheckinRecorded(ctx, pool[i], locations); err != nil {
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
	want := expect(applied)
	env.assertStats(t, want)
	var total int64
	for _, u := range want.users {
		total += u.NumCheckins
	}
	t.Logf("%d writers applied %d check-ins, %d distinct", writers, len(applied), total)
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

func TestProjectionStoreOneHashSlotPerUpdate(t *testing.T) {
	t.Parallel()
	env := newProjEnv(t)
	slotter := keyslotServer(t)
	users, locations := env.store(t, env.client, "users"), env.store(t, env.client, "locations")
	for i := range 6 {
		applyBoth(t, users, locations, recorded("ck-"+strconv.Itoa(i), int64(i%3+1), int64(i%3+10), i%6, int64(1000+i)))
	}
	ctx := context.Background()
	keys, err := env.client.Keys(ctx, env.keys.Prefix+":*").Result()
	require.NoError(t, err)

	// Group the keys the store wrote by projection and entity, from the key names alone.
	entities := map[string][]string{}
	for _, k := range keys {
		rest, ok := strings.CutPrefix(k, env.keys.Prefix+":p:")
		require.True(t, ok, "unexpected key %q", k)
		proj, _, _ := strings.Cut(rest, ":")
		open, end := strings.Index(k, "{"), strings.Index(k, "}")
		require.True(t, open >= 0 && end > open+1, "key %q has no hash tag", k)
		entities[proj+" "+k[open+1:end]] = append(entities[proj+" "+k[open+1:end]], k)
	}
	require.Len(t, entities, 6, "3 users and 3 locations, got %v", keys)
	distinct := map[int64]bool{}
	for entity, ks := range entities {
		assert.Len(t, ks, 2, "%s: the stats hash and the dedupe set", entity)
		slots := map[int64]bool{}
		for _, k := range ks {
			slot, err := slotter.ClusterKeySlot(ctx, k).Result()
			require.NoError(t, err)
			slots[slot] = true
			distinct[slot] = true
		}
		assert.Len(t, slots, 1, "%s: keys %v must share one slot", entity, ks)
	}
	assert.Greater(t, len(distinct), 1, "entities must spread over slots, not share one tag")
}

func TestProjectionStoreRejectsBeforeAnyWrite(t *testing.T) {
	t.Parallel()
	env := newProjEnv(t)
	store := env.store(t, env.client, "users")
	ctx := context.Background()
	valid := func() *projection.Update { return projection.NewUpdate("user:1", "ck-1").HIncrBy("stats", "n", 1) }
	tests := map[string]*projection.Update{
		"empty slot":           projection.NewUpdate("", "ck-1").HIncrBy("stats", "n", 1),
		"empty event ID":       projection.NewUpdate("user:1", "").HIncrBy("stats", "n", 1),
		"reserved key seen":    valid().HSet("seen", "x", "1"),
		"empty key":            valid().HSet("", "x", "1"),
		"reserved second key":  valid().ZRatioAtMin("z", "m", "seen", "a", "b", 1),
		"reserved key in incr": valid().HIncrBy("seen", "n", 1),
		"seen after valid ops": valid().HSet("stats", "a", "b").HRound("seen", "d", "n", "m"),
	}
	// Kinds the store does not check are refused by the script, also before any write.
	unknown := valid()
	unknown.Ops = append(unknown.Ops, projection.Op{Kind: "del", Keys: []string{"stats"}})
	tests["unknown op after a valid one"] = unknown
	unknownFirst := valid()
	unknownFirst.Ops[0].Kind = "hdel"
	tests["unknown op"] = unknownFirst
	for name, u := range tests {
		ok, err := store.Apply(ctx, u)
		assert.Error(t, err, name)
		assert.False(t, ok, name)
		assert.Empty(t, snapshot(t, env.client, env.keys.Prefix), "%s: nothing may be written", name)

		err = store.ApplyBatch(ctx, []*projection.Update{valid(), u})
		assert.Error(t, err, "batch: %s", name)
		assert.Empty(t, snapshot(t, env.client, env.keys.Prefix), "batch %s: nothing may be written", name)
	}
	// The rejected update did not mark ck-1 as seen: the valid one still applies.
	ok, err := store.Apply(ctx, valid())
	require.NoError(t, err)
	assert.True(t, ok)
}

func TestProjectionStoreApplyBatchMatchesApply(t *testing.T) {
	t.Parallel()
	env := newProjEnv(t)
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 3))
	var evs []domain.CheckinRecorded
	for i := range 300 {
		evs = append(evs, recorded("ck-"+strconv.Itoa(i), rng.Int64N(4)+1, rng.Int64N(4)+1, rng.IntN(6), 100+rng.Int64N(20)))
		if rng.IntN(3) == 0 {
			evs = append(evs, evs[rng.IntN(len(evs))])
		}
	}
	ctx := context.Background()
	one, batch := env.with("one"), env.with("batch")
	for _, name := range []string{"users", "locations"} {
		capture := &captureStore{}
		for _, ev := range evs {
			var err error
			if name == "users" {
				err = projection.UserStats{}.OnCheckinRecorded(ctx, ev, capture)
			} else {
				err = projection.LocationStats{}.OnCheckinRecorded(ctx, ev, capture)
			}
			require.NoError(t, err)
		}
		s1 := one.store(t, one.client, name)
		for _, u := range capture.updates {
			_, err := s1.Apply(ctx, u)
			require.NoError(t, err)
		}
		// The batch path must reload the script itself after SCRIPT FLUSH (a restarted Redis).
		require.NoError(t, env.client.ScriptFlush(ctx).Err())
		s2 := batch.store(t, batch.client, name)
		for chunk := range slices.Chunk(capture.updates, 64) {
			require.NoError(t, s2.ApplyBatch(ctx, chunk))
		}
		require.NoError(t, s2.ApplyBatch(ctx, nil))
	}
	want := snapshot(t, env.client, one.keys.Prefix)
	require.NotEmpty(t, want)
	assert.Equal(t, want, snapshot(t, env.client, batch.keys.Prefix))
	batch.assertStats(t, expect(evs))
}

func TestProjectionReaderFollowsCurrentVersion(t *testing.T) {
	t.Parallel()
	env := newProjEnv(t)
	ctx := context.Background()
	v2, err := adapters.NewProjectionStore(env.client, env.keys, "users", 2)
	require.NoError(t, err)
	applyBoth(t, env.store(t, env.client, "users"), env.store(t, env.client, "locations"), recorded("a", 1, 1, 1, 10))
	require.NoError(t, projection.UserStats{}.OnCheckinRecorded(ctx, recorded("b", 1, 2, 1, 20), v2))
	require.NoError(t, projection.UserStats{}.OnCheckinRecorded(ctx, recorded("a", 1, 1, 1, 10), v2))

	assert.Equal(t, int64(1), env.userStats(t, 1).NumCheckins, "version 1 serves until switched")
	require.NoError(t, env.client.HSet(ctx, env.keys.Projections(), "users.version", "2").Err())
	assert.Equal(t, projection.UserStatsView{UserID: 1, NumCheckins: 2, LastCheckin: 20, LastSeenAt: 2}, env.userStats(t, 1))

	require.NoError(t, env.client.HSet(ctx, env.keys.Projections(), "users.version", "zero").Err())
	_, err = projection.UserStats{}.Get(ctx, adapters.NewProjectionReader(env.client, env.keys, "users"), 1)
	require.Error(t, err)
	assert.False(t, errors.Is(err, domain.ErrNotFound))
}
