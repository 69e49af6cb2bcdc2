package projection_test

import (
	"context"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/checkins/checkins/adapters"
	"github.com/checkins/checkins/adapters/redistest"
	"github.com/checkins/checkins/app/projection"
	"github.com/checkins/checkins/domain"
)

// tiedHistory is n check-ins of many users and locations whose IDs have one to five decimal
// digits (so the byte order Redis breaks ties by differs from the numeric one), each member
// with few check-ins: a handful of distinct counts, many members on each.
func tiedHistory(n int, seed uint64) []domain.CheckinRecorded {
	rng := rand.New(rand.NewPCG(seed, 3))
	ids := func(k int) []int64 {
		seen := map[int64]bool{}
		var out []int64
		for len(out) < k {
			digits := 1 + rng.IntN(5)
			lo := int64(1)
			for range digits - 1 {
				lo *= 10
			}
			id := lo + rng.Int64N(9*lo)
			if !seen[id] {
				seen[id] = true
				out = append(out, id)
			}
		}
		return out
	}
	users, locs := ids(400), ids(300)
	base := int64(1_700_000_000_000)
	out := make([]domain.CheckinRecorded, n)
	for i := range out {
		out[i] = domain.CheckinRecorded{Checkin: domain.Checkin{ID: fmt.Sprintf("t-%d-%d", seed, i), UserID: users[rng.IntN(len(users))],
			LocationID: locs[rng.IntN(len(locs))], StarRating: rng.IntN(6), Timestamp: base + int64(i)}, RecordedAt: base}
	}
	return out
}

// unsharded builds the boards as one plain sorted set each, in one slot of the same Redis, from
// the same events: ZINCRBY for the counts, ZADD of stars/check-ins for the qualified ratings.
func unsharded(t *testing.T, c redis.UniversalClient, prefix string, events []domain.CheckinRecorded, minCheckins int64) (byCheckins, byRating, users string) {
	t.Helper()
	ctx := context.Background()
	byCheckins, byRating, users = prefix+":ref:{ref}:locations", prefix+":ref:{ref}:ratings", prefix+":ref:{ref}:users"
	type agg struct{ n, stars int64 }
	locs := map[int64]*agg{}
	pipe := c.Pipeline()
	for _, e := range events {
		pipe.ZIncrBy(ctx, byCheckins, 1, strconv.FormatInt(e.LocationID, 10))
		pipe.ZIncrBy(ctx, users, 1, strconv.FormatInt(e.UserID, 10))
		if locs[e.LocationID] == nil {
			locs[e.LocationID] = &agg{}
		}
		locs[e.LocationID].n++
		locs[e.LocationID].stars += int64(e.StarRating)
	}
	for id, a := range locs {
		if a.n >= minCheckins {
			pipe.ZAdd(ctx, byRating, redis.Z{Score: float64(a.stars) / float64(a.n), Member: strconv.FormatInt(id, 10)})
		}
	}
	_, err := pipe.Exec(ctx)
	require.NoError(t, err)
	return byCheckins, byRating, users
}

// TestShardedLeaderboardsEqualUnsharded: the boards, sharded over LeaderboardShards slots and
// merged at read time, answer exactly what ZREVRANGE of one unsharded sorted set of the same
// events answers (members, order among ties, scores, ranks), for every limit, on a single
// server and on a 3-master cluster, in both sharded layouts (LeaderboardsBoardCounts keeps
// the counts on the board and the ratings as scaled integers: the same answers).
func TestShardedLeaderboardsEqualUnsharded(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		kind   string
		layout int
	}{{"standalone", projection.LeaderboardsSharded}, {"standalone", projection.LeaderboardsBoardCounts},
		{"cluster", projection.LeaderboardsSharded}, {"cluster", projection.LeaderboardsBoardCounts}} {
		kind := tc.kind
		t.Run(fmt.Sprintf("%s/layout=%d", kind, tc.layout), func(t *testing.T) {
			t.Parallel()
			p := newProjTest(t)
			if kind == "cluster" {
				p = newClusterProjTest(t)
			}
			const minCheckins = 3
			lb := projection.Leaderboards{MinCheckins: minCheckins, Layout: tc.layout}
			events := tiedHistory(1500, 21)
			p.applyAll(t, lb, events, 5)
			byCheckins, byRating, users := unsharded(t, p.client, p.keys.Prefix, events, minCheckins)

			ctx := context.Background()
			r := p.reader(lb.Name())
			want := func(key string, limit int) []redis.Z {
				zs, err := p.client.ZRevRangeWithScores(ctx, key, 0, int64(limit-1)).Result()
				require.NoError(t, err)
				return zs
			}
			for _, key := range []string{byCheckins, byRating, users} {
				top, ties := want(key, 100), 0
				for i := 1; i < len(top); i++ {
					if top[i].Score == top[i-1].Score {
						ties++
					}
				}
				require.Greater(t, ties, 50, "%s: the data must tie throughout the top 100", key)
			}
			for limit := 1; limit <= projection.MaxLeaderboardLimit; limit++ {
				for _, tc := range []struct {
					by  string
					key string
				}{{projection.ByCheckins, byCheckins}, {projection.ByRating, byRating}} {
					rows, err := lb.TopLocations(ctx, r, tc.by, limit)
					require.NoError(t, err)
					exp := want(tc.key, limit)
					require.Len(t, rows, len(exp), "by %s, limit %d", tc.by, limit)
					for i, z := range exp {
						id, _ := strconv.ParseInt(z.Member.(string), 10, 64)
						require.Equal(t, i+1, rows[i].Rank)
						require.Equal(t, id, rows[i].LocationID, "by %s, limit %d, rank %d", tc.by, limit, i+1)
						if tc.by == projection.ByCheckins {
							require.Equal(t, int64(z.Score), rows[i].NumCheckins)
						} else {
							require.Equal(t, z.Score, rows[i].AverageRating, "the exact average")
						}
					}
				}
				rows, err := lb.TopUsers(ctx, r, limit)
				require.NoError(t, err)
				exp := want(users, limit)
				require.Len(t, rows, len(exp), "users, limit %d", limit)
				for i, z := range exp {
					id, _ := strconv.ParseInt(z.Member.(string), 10, 64)
					require.Equal(t, projection.LeaderboardUser{Rank: i + 1, UserID: id, NumCheckins: int64(z.Score)}, rows[i], "users, limit %d", limit)
				}
			}
		})
	}
}

// TestLeaderboardsSpreadOverTheMasters: on a 3-master cluster the boards' keys fall on every
// master within 1/M ± 1/S of them, and so do the writes that landed (the sum of the counts the
// shards hold, one per update); no slot holds more than a few shards' share.
func TestLeaderboardsSpreadOverTheMasters(t *testing.T) {
	t.Parallel()
	p := newClusterProjTest(t)
	lb := projection.Leaderboards{MinCheckins: 3}
	events := tiedHistory(3000, 22)
	p.applyAll(t, lb, events, 6)

	ctx := context.Background()
	cc := p.client.(*redis.ClusterClient)
	var mu sync.Mutex
	keysOn, writesOn := map[string]int{}, map[string]float64{}
	writesIn := map[int64]float64{}
	require.NoError(t, cc.ForEachMaster(ctx, func(ctx context.Context, n *redis.Client) error {
		ks, err := n.Keys(ctx, p.keys.Prefix+":p:leaderboards:*").Result()
		if err != nil {
			return err
		}
		addr := n.Options().Addr
		for _, k := range ks {
			if !strings.HasSuffix(k, ":locations_by_checkins") && !strings.HasSuffix(k, ":users_by_checkins") {
				mu.Lock()
				keysOn[addr]++
				mu.Unlock()
				continue
			}
			zs, err := n.ZRangeWithScores(ctx, k, 0, -1).Result()
			if err != nil {
				return err
			}
			slot, err := n.ClusterKeySlot(ctx, k).Result()
			if err != nil {
				return err
			}
			mu.Lock()
			keysOn[addr]++
			for _, z := range zs {
				writesOn[addr] += z.Score
				writesIn[slot] += z.Score
			}
			mu.Unlock()
		}
		return nil
	}))
	const m, s = 3, float64(projection.LeaderboardShards)
	require.Len(t, keysOn, m, "leaderboard keys on every master: %v", keysOn)
	total, totalKeys := 0.0, 0
	for _, n := range keysOn {
		totalKeys += n
	}
	for _, w := range writesOn {
		total += w
	}
	require.Equal(t, float64(2*len(events)), total, "one location and one user count per check-in")
	for addr := range keysOn {
		t.Logf("master %s: %d of %d keys, %.1f%% of the writes", addr, keysOn[addr], totalKeys, 100*writesOn[addr]/total)
		assert.InDelta(t, 1.0/m, float64(keysOn[addr])/float64(totalKeys), 1/s, "keys on %s", addr)
		assert.InDelta(t, 1.0/m, writesOn[addr]/total, 1/s, "writes on %s", addr)
	}
	assert.Len(t, writesIn, projection.LeaderboardShards, "every shard has its own slot")
	for slot, w := range writesIn {
		assert.Less(t, w/total, 3/s, "slot %d takes %.1f%% of the writes", slot, 100*w/total)
	}
}

// BenchmarkLeaderboardRead is one board read on a single server, in the single-slot layout of
// earlier releases and in the sharded one (S ZREVRANGEs of `limit` in one round trip, merged;
// then the counts), with 5,000 locations and 10,000 users.
func BenchmarkLeaderboardRead(b *testing.B) {
	env := redistest.Open(b)
	client := redistest.Client(b, env.URL)
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(9, 9))
	events := make([]domain.CheckinRecorded, 40_000)
	for i := range events {
		events[i] = domain.CheckinRecorded{Checkin: domain.Checkin{ID: "b-" + strconv.Itoa(i), UserID: 1 + rng.Int64N(10_000),
			LocationID: 1 + rng.Int64N(5_000), StarRating: rng.IntN(6), Timestamp: 1_700_000_000_000 + int64(i)}, RecordedAt: 1_700_000_000_000}
	}
	for _, layout := range []int{projection.LeaderboardsSingleSlot, projection.LeaderboardsSharded, projection.LeaderboardsBoardCounts} {
		keys := adapters.KeySpace{Prefix: env.Prefix + "-" + strconv.Itoa(layout)}
		at, err := projection.Leaderboards{MinCheckins: 5}.AtLayout(layout)
		require.NoError(b, err)
		lb := at.(projection.Leaderboards)
		applier, err := adapters.NewProjectionApplier(client, keys, 0)
		require.NoError(b, err)
		for start := 0; start < len(events); start += 500 {
			var works []projection.Work
			for i, e := range events[start:min(start+500, len(events))] {
				us, err := projection.Updates(ctx, lb, e)
				require.NoError(b, err)
				works = append(works, projection.Work{Group: "bench", Projection: lb.Name(), Version: 1,
					Event: projection.RefOf(e, fmt.Sprintf("%d-0", 1_700_000_000_000+start+i)), Updates: us})
			}
			_, err := applier.Apply(ctx, works, nil)
			require.NoError(b, err)
		}
		r := adapters.NewProjectionReader(client, keys, lb.Name())
		name := map[int]string{projection.LeaderboardsSingleSlot: "single-slot", projection.LeaderboardsSharded: "sharded",
			projection.LeaderboardsBoardCounts: "board-counts"}[layout]
		// What the boards hold: MEMORY USAGE of the read-model keys (not the bookkeeping).
		var bytes int64
		ks, err := client.Keys(ctx, keys.ProjectionPrefix(lb.Name(), 1)+"*").Result()
		require.NoError(b, err)
		for _, k := range ks {
			if adapters.IsBookkeeping(k[strings.LastIndexByte(k, ':')+1:]) {
				continue
			}
			n, err := client.MemoryUsage(ctx, k, 0).Result()
			require.NoError(b, err)
			bytes += n
		}
		b.Logf("%s: %d keys, %.2f MiB after %d check-ins of 5,000 locations and 10,000 users", name, len(ks), float64(bytes)/(1<<20), len(events))
		for _, limit := range []int{10, 100} {
			b.Run(fmt.Sprintf("%s/locations/limit=%d", name, limit), func(b *testing.B) {
				for b.Loop() {
					rows, err := lb.TopLocations(ctx, r, projection.ByCheckins, limit)
					if err != nil || len(rows) != limit {
						b.Fatal(err, len(rows))
					}
				}
			})
			b.Run(fmt.Sprintf("%s/rating/limit=%d", name, limit), func(b *testing.B) {
				for b.Loop() {
					rows, err := lb.TopLocations(ctx, r, projection.ByRating, limit)
					if err != nil || len(rows) != limit {
						b.Fatal(err, len(rows))
					}
				}
			})
			b.Run(fmt.Sprintf("%s/users/limit=%d", name, limit), func(b *testing.B) {
				for b.Loop() {
					rows, err := lb.TopUsers(ctx, r, limit)
					if err != nil || len(rows) != limit {
						b.Fatal(err, len(rows))
					}
				}
			})
		}
	}
}

// TestLeaderboardShardsAreFixed: where a member's entries live is part of the sharded layout's
// definition. A process that put a member in another shard than the one before it would split
// its count in two, so the hash (FNV-1a 64 of the decimal ID, checked against hash/fnv) and the
// shards' tags must never change within the layout: changing them is a new layout (a rebuild).
func TestLeaderboardShardsAreFixed(t *testing.T) {
	t.Parallel()
	for id := int64(1); id <= 5000; id += 7 {
		h := fnv.New64a()
		_, _ = h.Write([]byte(strconv.FormatInt(id, 10)))
		require.Equal(t, int(h.Sum64()%projection.LeaderboardShards), projection.ShardOf(id, projection.LeaderboardShards), "id %d", id)
	}
	assert.Equal(t, []string{"3o7", "dlj", "9q5", "bij", "5j7", "hwh", "f0m", "130", "ljg", "760", "qsu", "hfj",
		"1mq", "ng4", "3zk", "hb4", "7hq", "72n", "91c", "31v", "3ki", "54v", "7ys", "7gd"},
		projection.LeaderboardShardSlots(projection.LeaderboardsSharded))
	for i, tag := range projection.LeaderboardShardSlots(projection.LeaderboardsSharded) {
		target := projection.SpreadTarget(i, projection.LeaderboardShards)
		assert.InDelta(t, target, projection.KeySlot("x:{"+tag+"}:y"), 8, "shard %d on an evenly spaced slot", i)
	}
	assert.Equal(t, []string{"all"}, projection.LeaderboardShardSlots(projection.LeaderboardsSingleSlot))
}
