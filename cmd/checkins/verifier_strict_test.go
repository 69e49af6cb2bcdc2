package main

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/checkins/checkins/adapters"
	"github.com/checkins/checkins/adapters/redistest"
	"github.com/checkins/checkins/app/projection"
)

// verifiedModel runs serve, records check-ins, waits until the verifier says the read models are
// exact, and stops the service; it returns the keyspace, a client and the ledger.
func verifiedModel(t *testing.T, posts func(post func(user, loc, stars int64))) (adapters.KeySpace, *ledger, string, func() (bool, string)) {
	t.Helper()
	rdb := redistest.Open(t)
	env := map[string]string{"REDIS_URL": rdb.URL, "KEY_PREFIX": rdb.Prefix}
	p := startSvc(t, "serve", env)
	l := newLedger()
	client := authedClient(10 * time.Second)
	var wg sync.WaitGroup
	sem := make(chan struct{}, 16)
	n := 0
	posts(func(user, loc, stars int64) {
		n++
		id := fmt.Sprintf("vs-%d", n)
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			l.post(client, p.base, id, sent{user: user, location: loc, stars: stars})
		}()
	})
	wg.Wait()
	ok, _, _, _ := l.stats()
	require.Equal(t, n, ok, "every check-in accepted")
	keys := adapters.KeySpace{Prefix: rdb.Prefix}
	l.verifyAll(t, rdb.URL, keys)
	require.Equal(t, 0, p.exit(t, syscall.SIGTERM))
	return keys, l, rdb.URL, func() (bool, string) { return l.verifyOnce(t, rdb.URL, keys) }
}

// TestVerifierSeesDailyCountsOutsideTheCheckinsDays: a location's daily hash holding a
// count on a day no check-in fell on (before the first check-in's day) is a wrong read model
// (GET /locations/{id}/daily for that day answers 7): the verifier read only the days from the
// first check-in's to the last's, and said exact.
func TestVerifierSeesDailyCountsOutsideTheCheckinsDays(t *testing.T) {
	t.Parallel()
	keys, _, url, verify := verifiedModel(t, func(post func(user, loc, stars int64)) {
		for i := range 10 {
			post(int64(1+i%3), int64(1+i%4), int64(i%6))
		}
	})
	ok, detail := verify()
	require.True(t, ok, detail)
	c := redistest.Client(t, url)
	key := keys.ProjectionKey("daily_checkins", 1, "location:1", "daily")
	require.NoError(t, c.HIncrBy(context.Background(), key, "2001-02-03", 7).Err())
	ok, detail = verify()
	assert.False(t, ok, "location 1 has 7 check-ins on 2001-02-03 that no check-in implies; verifier said exact (%s)", detail)
}

// TestVerifierSeesRecentCheckinsBeyondTheKept: recent_checkins keeps at most 50 per
// user (README: "A user's set holds at most 50 members"); a set holding more (a trim that did
// not happen) passed the verifier, which read only the top 50.
func TestVerifierSeesRecentCheckinsBeyondTheKept(t *testing.T) {
	t.Parallel()
	keys, _, url, verify := verifiedModel(t, func(post func(user, loc, stars int64)) {
		for i := range projection.RecentCheckinsKept {
			post(1, int64(1+i%4), int64(i%6))
		}
	})
	ok, detail := verify()
	require.True(t, ok, detail)
	c := redistest.Client(t, url)
	key := keys.ProjectionKey("recent_checkins", 1, "user:1", "recent")
	member, err := projection.RecentCheckin{CheckinID: "never-recorded", LocationID: 9, StarRating: 1, Timestamp: 1000}.Member(projection.RecentCheckinsCompact)
	require.NoError(t, err)
	require.NoError(t, c.ZAdd(context.Background(), key, redis.Z{Score: 1000, Member: member}).Err())
	require.EqualValues(t, projection.RecentCheckinsKept+1, c.ZCard(context.Background(), key).Val())
	ok, detail = verify()
	assert.False(t, ok, "user 1's recent set holds 51 members, one of a check-in never recorded; verifier said exact (%s)", detail)
}

// TestVerifierSeesKeysInAKnownSlot: a key under a projection's prefix in the slot of an
// entity the check-ins mention, but one no projection writes, passed: only entities nothing read
// were refused. (A field no projection writes, in a key the checks read, still passes.)
func TestVerifierSeesKeysInAKnownSlot(t *testing.T) {
	t.Parallel()
	keys, _, url, verify := verifiedModel(t, func(post func(user, loc, stars int64)) {
		for i := range 6 {
			post(int64(1+i%2), int64(1+i%3), int64(i%6))
		}
	})
	c := redistest.Client(t, url)
	require.NoError(t, c.HSet(context.Background(), keys.ProjectionKey("users", 1, "user:1", "stats2"), "numCheckins", "99").Err())
	ok, detail := verify()
	assert.False(t, ok, "users' read model has a key no check-in implies; verifier said exact (%s)", detail)
}

// TestVerifierSeesLeaderboardStarsBelowTheTop: a location below the top 100 of the
// check-ins board and not on the rating board: its stars on the leaderboards (which its rating
// is computed from) were never compared.
func TestVerifierSeesLeaderboardStarsBelowTheTop(t *testing.T) {
	t.Parallel()
	const last = 200
	keys, _, url, verify := verifiedModel(t, func(post func(user, loc, stars int64)) {
		for loc := int64(1); loc <= 100; loc++ {
			post(loc, loc, 3)
			post(loc+1000, loc, 4)
		}
		post(7, last, 2) // one check-in: last on the check-ins board, not on the rating board
	})
	ok, detail := verify()
	require.True(t, ok, detail)
	c := redistest.Client(t, url)
	slot := projection.LeaderboardShardSlots(projection.LeaderboardsLayout)[projection.ShardOf(last, projection.LeaderboardShards)]
	key := keys.ProjectionKey("leaderboards", 1, slot, "location_counts")
	require.Equal(t, "2", c.HGet(context.Background(), key, strconv.Itoa(last)+":stars").Val())
	require.NoError(t, c.HSet(context.Background(), key, strconv.Itoa(last)+":stars", "5000").Err())
	ok, detail = verify()
	assert.False(t, ok, "location %d has 5000 stars on the leaderboards for 1 check-in of 2 stars; verifier said exact (%s)", last, detail)
}
