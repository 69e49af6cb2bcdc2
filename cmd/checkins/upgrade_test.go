package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/checkins/checkins/adapters"
	"github.com/checkins/checkins/adapters/redistest"
	"github.com/checkins/checkins/app/ops"
	"github.com/checkins/checkins/app/projection"
	"github.com/checkins/checkins/domain"
)

// xaddEvent adds ev to stream as the API's publisher writes it (Watermill's message, the flat
// marshaller's fields) and returns its entry ID.
func xaddEvent(t *testing.T, c redis.UniversalClient, stream string, ev domain.CheckinRecorded) string {
	t.Helper()
	msg, err := adapters.NewEventMessage(ev.Fields(), "corr")
	require.NoError(t, err)
	values, err := adapters.FlatMarshaller{}.Marshal(stream, msg)
	require.NoError(t, err)
	id, err := c.XAdd(context.Background(), &redis.XAddArgs{Stream: stream, Values: values}).Result()
	require.NoError(t, err)
	return id
}

// TestUpgradeFromTheEarlierLayoutKeepsEveryCount: a deployment of the earlier layout (one
// consumer group per projection version, checkinIds kept in per-slot seen sets) crashed with
// entries delivered and not acknowledged, some of them applied. The new binary starts on it:
// each projection version joins the live group, its old group goes on from where it stood
// (the dead consumer's pending entries taken over), entries the old layout applied are found in
// its seen sets, and every read model ends exact. Once the backfills are done, the old groups
// and the seen sets are removed.
func TestUpgradeFromTheEarlierLayoutKeepsEveryCount(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t, redistest.Options{})
	c := redistest.Client(t, srv.URL())
	ctx := context.Background()
	keys := adapters.KeySpace{Prefix: "checkins"}
	cfg, _, err := parseConfig(flag.NewFlagSet("test", flag.ContinueOnError), nil, envWith(map[string]string{"REDIS_URL": srv.URL()}))
	require.NoError(t, err)
	projs := allProjections(cfg)

	const total, delivered, acked, applied = 300, 200, 150, 180
	now := time.Now().UnixMilli()
	var evs []domain.CheckinRecorded
	var ids []string
	for i := range total {
		ev := domain.CheckinRecorded{Checkin: domain.Checkin{ID: "old-" + strconv.Itoa(i), UserID: 1 + int64(i%13), LocationID: 1 + int64(i%7),
			StarRating: i % 6, Timestamp: now - int64(total-i)*60_000}, RecordedAt: now - int64(total-i)*60_000}
		evs, ids = append(evs, ev), append(ids, xaddEvent(t, c, keys.Stream(), ev))
	}

	// The earlier layout's state: read models of the first `applied` events, their checkinIds
	// in each slot's seen set, the stored average of the locations; groups <name>.v1 that
	// delivered `delivered` entries to a consumer that acknowledged `acked` and died.
	emulate, err := adapters.NewProjectionApplier(c, keys, 0)
	require.NoError(t, err)
	for i := range applied {
		var works []projection.Work
		for _, p := range projs {
			p, err := projection.AtLayout(p, 1) // the earlier release's keys (projection.Layouts)
			require.NoError(t, err)
			us, err := projection.Updates(ctx, p, evs[i])
			require.NoError(t, err)
			works = append(works, projection.Work{Group: "emulation", Projection: p.Name(), Version: 1, Event: projection.RefOf(evs[i], ids[i]), Updates: us})
			for _, u := range us {
				require.NoError(t, c.SAdd(ctx, keys.ProjectionKey(p.Name(), 1, u.Slot, "seen"), evs[i].ID).Err())
			}
		}
		_, err := emulate.Apply(ctx, works, nil)
		require.NoError(t, err)
	}
	for loc := int64(1); loc <= 7; loc++ {
		k := keys.ProjectionKey("locations", 1, "location:"+strconv.FormatInt(loc, 10), "stats")
		h, err := c.HGetAll(ctx, k).Result()
		require.NoError(t, err)
		n, _ := strconv.ParseInt(h["numCheckins"], 10, 64)
		s, _ := strconv.ParseInt(h["numStars"], 10, 64)
		require.NoError(t, c.HSet(ctx, k, "averageStars", projection.AverageStars(s, n)).Err())
	}
	for _, pattern := range []string{keys.Prefix + ":dedupe:*", keys.Prefix + ":applied:*"} {
		ks, err := c.Keys(ctx, pattern).Result()
		require.NoError(t, err)
		if len(ks) > 0 {
			require.NoError(t, c.Del(ctx, ks...).Err())
		}
	}
	for _, p := range projs {
		group := p.Name() + ".v1"
		require.NoError(t, c.XGroupCreate(ctx, keys.Stream(), group, "0").Err())
		require.NoError(t, c.XReadGroup(ctx, &redis.XReadGroupArgs{Group: group, Consumer: "old-proc", Streams: []string{keys.Stream(), ">"}, Count: delivered}).Err())
		require.NoError(t, c.XAck(ctx, keys.Stream(), group, ids[:acked]...).Err())
		require.NoError(t, c.HSet(ctx, keys.Projections(), p.Name()+".version", 1).Err())
	}

	p := startSvc(t, "serve", map[string]string{"REDIS_URL": srv.URL(), "CLAIM_IDLE": "1s", "CLAIM_INTERVAL": "200ms",
		"PROJECTION_POLL_INTERVAL": "200ms", "PROJECTION_RETIRE_GRACE": "1s"})
	l := newLedger()
	client := authedClient(5 * time.Second)
	for i := range 50 {
		l.post(client, p.base, fmt.Sprintf("new-%d", i), sent{user: 1 + int64(i%13), location: 1 + int64(i%7), stars: int64(i % 6)})
	}
	l.resolve(t, p.base)
	t.Cleanup(func() {
		if t.Failed() {
			gs, _ := c.XInfoGroups(ctx, keys.Stream()).Result()
			reg, _ := c.HGetAll(ctx, keys.Projections()).Result()
			t.Logf("groups: %+v\nregistry: %v\nlogs:\n%s", gs, reg, p.logs)
		}
	})
	for i, ev := range evs {
		l.ok[ids[i]], l.accepted[ids[i]] = sent{}, ev.Checkin
	}
	l.verifyAll(t, srv.URL(), keys)

	// The backfills finished: only the live group is left, and no seen set.
	require.Eventually(t, func() bool {
		gs, err := c.XInfoGroups(ctx, keys.Stream()).Result()
		require.NoError(t, err)
		seen, err := c.Keys(ctx, keys.Prefix+":p:*:seen").Result()
		require.NoError(t, err)
		return len(gs) == 1 && gs[0].Name == "live" && len(seen) == 0
	}, 30*time.Second, 100*time.Millisecond, "the earlier layout's groups and seen sets are removed after the backfills")
	l.verifyAll(t, srv.URL(), keys)
	code, body := faultGet(t, p.base+"/readyz")
	assert.Equal(t, http.StatusOK, code, body)
	assert.Zero(t, poisonLen(t, c, keys))
}

// TestReusedCheckinIDIsDecidedAlikeEverywhere: a checkinId that comes back with another body
// after IDEMPOTENCY_TTL is another check-in, counted by all five projections; the first body
// sent again after the TTL (without a timestamp: the API stamps a new one) is the same check-in
// and counted by none; an exact copy XADDed by another producer is a duplicate too, and a body
// of its own XADDed by it under the same checkinId is a third check-in. Every read model is
// compared with an independent computation.
func TestReusedCheckinIDIsDecidedAlikeEverywhere(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t, redistest.Options{})
	c := redistest.Client(t, srv.URL())
	ctx := context.Background()
	keys := adapters.KeySpace{Prefix: "checkins"}
	p := startSvc(t, "serve", map[string]string{"REDIS_URL": srv.URL(), "IDEMPOTENCY_TTL": "1s", "REQUEST_TIMEOUT": "900ms"})
	// One user's: checkinIds are scoped by user, another user's "reused" is simply another one.
	bodyA, bodyB := `{"checkinId":"reused","userId":1,"locationId":1,"starRating":5}`, `{"checkinId":"reused","userId":1,"locationId":2,"starRating":1}`
	post := func(body string) (int, map[string]any) {
		code, m, err := testPostCheckin(p.base, body, nil)
		require.NoError(t, err)
		return code, m
	}
	checkinOf := func(m map[string]any) domain.Checkin {
		return domain.Checkin{ID: m["checkinId"].(string), UserID: int64(m["userId"].(float64)), LocationID: int64(m["locationId"].(float64)),
			StarRating: int(m["starRating"].(float64)), Timestamp: int64(m["timestamp"].(float64))}
	}
	code, first := post(bodyA)
	require.Equal(t, http.StatusAccepted, code)
	code, _ = post(bodyB)
	require.Equal(t, http.StatusConflict, code, "within IDEMPOTENCY_TTL another body is refused")
	var second map[string]any
	require.Eventually(t, func() bool { code, second = post(bodyB); return code == http.StatusAccepted }, 10*time.Second, 200*time.Millisecond,
		"after IDEMPOTENCY_TTL the checkinId is free again")
	var again map[string]any
	require.Eventually(t, func() bool {
		code, again = post(bodyA)
		return code == http.StatusAccepted && checkinOf(again).UserID == 1
	}, 10*time.Second, 200*time.Millisecond)
	require.NotEqual(t, checkinOf(first).Timestamp, checkinOf(again).Timestamp, "stamped anew by the API")

	// Another producer: an exact copy of the first event, and a third body under the same ID.
	xs, err := c.XRange(ctx, keys.Stream(), "-", "+").Result()
	require.NoError(t, err)
	require.Len(t, xs, 3)
	copied := map[string]any{}
	for k, v := range xs[0].Values {
		if !strings.HasPrefix(k, "_") && !strings.HasPrefix(k, "meta:") {
			copied[k] = v
		}
	}
	require.NoError(t, c.XAdd(ctx, &redis.XAddArgs{Stream: keys.Stream(), Values: copied}).Err())
	third := domain.CheckinRecorded{Checkin: domain.Checkin{ID: "reused", UserID: 3, LocationID: 1, StarRating: 2, Timestamp: time.Now().UnixMilli()},
		RecordedAt: time.Now().UnixMilli()}
	require.NoError(t, c.XAdd(ctx, &redis.XAddArgs{Stream: keys.Stream(), Values: third.Fields()}).Err())

	l := newLedger()
	l.ok["a"], l.accepted["a"] = sent{}, checkinOf(first)
	l.ok["b"], l.accepted["b"] = sent{}, checkinOf(second)
	l.ok["c"], l.accepted["c"] = sent{}, third.Checkin
	l.verifyAll(t, srv.URL(), keys)
	code, body := faultGet(t, p.base+"/users/1")
	require.Equal(t, http.StatusOK, code)
	assert.Contains(t, body, `"numCheckins":2`, "the first body sent again is the same check-in (the second body is the other one)")
	assert.Zero(t, poisonLen(t, c, keys))
}

// TestUpgradeRebuildsTheLeaderboardsInShards: a deployment of the release before sharded
// leaderboards (leaderboards v1 in the one slot {all}, no layout in the registry) gets this
// binary. It finds v1 of the earlier layout and rebuilds the leaderboards by itself: v1 keeps
// serving exact boards, written in its own layout, until v2, sharded, has caught up; then reads
// switch to v2 and v1's keys go. Every board stays equal to an independent count.
func TestUpgradeRebuildsTheLeaderboardsInShards(t *testing.T) {
	t.Parallel()
	cfg, _, err := parseConfig(flag.NewFlagSet("test", flag.ContinueOnError), nil, envWith(nil))
	require.NoError(t, err)
	d := newLayoutDeployment(t, "leaderboards", projection.LeaderboardsLayout, func(i int) sent {
		return sent{user: 1 + int64(i%17), location: 1 + int64(i%11), stars: int64(i % 6)}
	})
	c, ctx, keys, env, l, client := d.c, context.Background(), d.keys, d.env, d.l, d.client
	require.Empty(t, d.reg["leaderboards.building"], "and needs no rebuild")

	// What the earlier release left: the same boards in {all}, and no layout recorded.
	v1 := keys.Prefix + ":p:leaderboards:v1:"
	sharded, err := c.Keys(ctx, v1+"*").Result()
	require.NoError(t, err)
	require.Greater(t, len(sharded), 4)
	for _, k := range sharded {
		name := k[strings.LastIndexByte(k, ':')+1:]
		all := v1 + "{all}:" + name
		require.NotEqual(t, all, k)
		switch name {
		case "location_counts":
			h, err := c.HGetAll(ctx, k).Result()
			require.NoError(t, err)
			require.NoError(t, c.HSet(ctx, all, h).Err())
		case "locations_by_checkins", "locations_by_rating", "users_by_checkins":
			zs, err := c.ZRangeWithScores(ctx, k, 0, -1).Result()
			require.NoError(t, err)
			require.NoError(t, c.ZAdd(ctx, all, zs...).Err())
		default:
			continue // bookkeeping
		}
		require.NoError(t, c.Del(ctx, k).Err())
	}
	// That release kept each location's count beside its stars and its rating as a fraction.
	zs, err := c.ZRangeWithScores(ctx, v1+"{all}:locations_by_checkins", 0, -1).Result()
	require.NoError(t, err)
	for _, z := range zs {
		loc := z.Member.(string)
		require.NoError(t, c.HSet(ctx, v1+"{all}:location_counts", loc+":n", int64(z.Score)).Err())
		stars, err := c.HGet(ctx, v1+"{all}:location_counts", loc+":stars").Int64()
		require.NoError(t, err)
		if err := c.ZScore(ctx, v1+"{all}:locations_by_rating", loc).Err(); err == nil {
			require.NoError(t, c.ZAdd(ctx, v1+"{all}:locations_by_rating", redis.Z{Score: float64(stars) / z.Score, Member: loc}).Err())
		}
	}
	require.NoError(t, c.HDel(ctx, keys.Projections(), "leaderboards.layout").Err())
	l.verifyAll(t, d.url, keys) // the reads find the earlier layout

	// And the earlier release parked one check-in of the leaderboards (the other projections
	// counted it): taken out of the {all} boards and parked. Its replay, run before any projector
	// of this release, writes v1 in v1's layout.
	xs, err := c.XRange(ctx, keys.Stream(), "-", "+").Result()
	require.NoError(t, err)
	parked := xs[len(xs)/2]
	ev, err := domain.ParseEvent(parked.ID, entryFields(parked.Values))
	require.NoError(t, err)
	pe := ev.(domain.CheckinRecorded)
	loc, user := strconv.FormatInt(pe.LocationID, 10), strconv.FormatInt(pe.UserID, 10)
	require.NoError(t, c.ZIncrBy(ctx, v1+"{all}:locations_by_checkins", -1, loc).Err())
	require.NoError(t, c.ZIncrBy(ctx, v1+"{all}:users_by_checkins", -1, user).Err())
	n, err := c.HIncrBy(ctx, v1+"{all}:location_counts", loc+":n", -1).Result()
	require.NoError(t, err)
	stars, err := c.HIncrBy(ctx, v1+"{all}:location_counts", loc+":stars", -int64(pe.StarRating)).Result()
	require.NoError(t, err)
	require.GreaterOrEqual(t, n, cfg.LeaderboardMinCheckins, "the location stays on the rating board")
	require.NoError(t, c.ZAdd(ctx, v1+"{all}:locations_by_rating", redis.Z{Score: float64(stars) / float64(n), Member: loc}).Err())
	pid, err := adapters.NewPoisonQueue(c, keys).Park(ctx, ops.PoisonEntry{Stream: keys.Stream(), EntryID: parked.ID, Projection: "leaderboards",
		Group: "live", Version: 1, Error: "handler bug", Attempts: 5, FailedAt: time.Now(), Fields: entryFields(parked.Values), Decision: ops.DecisionCounted})
	require.NoError(t, err)
	code, out, stderr := runOps(t, map[string]string{"REDIS_URL": d.url}, "poison", "replay", pid)
	require.Equal(t, 0, code, "stdout %s stderr %s", out, stderr)
	assert.Contains(t, out, "applied: true")
	l.verifyAll(t, d.url, keys) // counted once more, in {all}

	p := restartForLayout(t, d.url, keys, env, l, client, "leaderboards", projection.LeaderboardsLayout,
		func(i int) sent { return sent{user: 1 + int64(i%23), location: 1 + int64(i%13), stars: int64(i % 5)} })
	v2, err := c.Keys(ctx, keys.Prefix+":p:leaderboards:v2:*_by_checkins").Result()
	require.NoError(t, err)
	slots := map[int]bool{}
	for _, k := range v2 {
		assert.NotContains(t, k, "{all}")
		slots[projection.KeySlot(k)] = true
	}
	assert.Greater(t, len(slots), 4, "the boards are spread over the shards' slots: %v", slots)
	l.verifyAll(t, d.url, keys)
	for i := range 50 {
		l.post(client, p.base, fmt.Sprintf("later-%d", i), sent{user: 1 + int64(i%7), location: 1 + int64(i%5), stars: 5})
	}
	l.resolve(t, p.base)
	l.verifyAll(t, d.url, keys)
	code, body := faultGet(t, p.base+"/readyz")
	assert.Equal(t, http.StatusOK, code, body)
	assert.Zero(t, poisonLen(t, c, keys))
}

// TestUpgradeRebuildsTheLeaderboardsWithCountsOnTheBoard: a deployment of the release before
// LeaderboardsBoardCounts (leaderboards v1 sharded, each location's count in location_counts
// beside its stars, ratings as fractions) gets this binary. v1 keeps serving exact boards in its
// own layout until v2, whose counts are the check-ins board's scores and whose ratings are
// integers, has caught up; then reads switch to v2 and v1's keys go.
func TestUpgradeRebuildsTheLeaderboardsWithCountsOnTheBoard(t *testing.T) {
	t.Parallel()
	d := newLayoutDeployment(t, "leaderboards", projection.LeaderboardsBoardCounts, func(i int) sent {
		return sent{user: 1 + int64(i%17), location: 1 + int64(i%11), stars: int64(i % 6)}
	})
	c, ctx, keys, env, l, client := d.c, context.Background(), d.keys, d.env, d.l, d.client

	// What the earlier release left, shard by shard: "<id>:n" beside "<id>:stars", and the
	// ratings as fractions; layout 2 in the registry.
	v1 := keys.Prefix + ":p:leaderboards:v1:"
	boards, err := c.Keys(ctx, v1+"*:locations_by_checkins").Result()
	require.NoError(t, err)
	require.Greater(t, len(boards), 4)
	rated := 0
	for _, board := range boards {
		shard := strings.TrimSuffix(board, "locations_by_checkins")
		zs, err := c.ZRangeWithScores(ctx, board, 0, -1).Result()
		require.NoError(t, err)
		for _, z := range zs {
			loc := z.Member.(string)
			require.NoError(t, c.HSet(ctx, shard+"location_counts", loc+":n", int64(z.Score)).Err())
			stars, err := c.HGet(ctx, shard+"location_counts", loc+":stars").Int64()
			require.NoError(t, err)
			scaled, err := c.ZScore(ctx, shard+"locations_by_rating", loc).Result()
			if errors.Is(err, redis.Nil) {
				continue
			}
			require.NoError(t, err)
			require.Equal(t, math.Floor(float64(stars)/z.Score*projection.RatioScale), scaled, "location %s: the rating, scaled", loc)
			require.NoError(t, c.ZAdd(ctx, shard+"locations_by_rating", redis.Z{Score: float64(stars) / z.Score, Member: loc}).Err())
			rated++
		}
	}
	require.Equal(t, 11, rated, "every location is on the rating board")
	require.NoError(t, c.HSet(ctx, keys.Projections(), "leaderboards.layout", projection.LeaderboardsSharded).Err())
	l.verifyAll(t, d.url, keys) // the reads find the earlier layout

	p := restartForLayout(t, d.url, keys, env, l, client, "leaderboards", projection.LeaderboardsLayout,
		func(i int) sent { return sent{user: 1 + int64(i%23), location: 1 + int64(i%13), stars: int64(i % 5)} })
	counts, err := c.Keys(ctx, keys.Prefix+":p:leaderboards:v2:*:location_counts").Result()
	require.NoError(t, err)
	require.NotEmpty(t, counts)
	for _, k := range counts {
		fields, err := c.HKeys(ctx, k).Result()
		require.NoError(t, err)
		for _, f := range fields {
			assert.True(t, strings.HasSuffix(f, ":stars"), "%s holds %s: v2 keeps the counts on the board", k, f)
		}
	}
	for i := range 50 {
		l.post(client, p.base, fmt.Sprintf("later-%d", i), sent{user: 1 + int64(i%7), location: 1 + int64(i%5), stars: 5})
	}
	l.resolve(t, p.base)
	l.verifyAll(t, d.url, keys)
	assert.Zero(t, poisonLen(t, c, keys))
}

// layoutDeployment is a deployment this binary started on a private Redis, fed 200 check-ins
// (the i-th as before(i) says, kept in l) and stopped, every read model exact: what a layout
// upgrade test turns back into the state an earlier release left.
type layoutDeployment struct {
	url    string
	c      *redis.Client
	keys   adapters.KeySpace
	env    map[string]string // serve's, with short registry polls and retire grace
	l      *ledger
	client *http.Client
	reg    map[string]string // the registry when it stopped
}

// newLayoutDeployment makes a layoutDeployment, and checks that the registry records projection
// name at layout (the current one: a new deployment needs no rebuild).
func newLayoutDeployment(t *testing.T, name string, layout int, before func(i int) sent) layoutDeployment {
	t.Helper()
	srv := redistest.Start(t, redistest.Options{})
	d := layoutDeployment{url: srv.URL(), c: redistest.Client(t, srv.URL()), keys: adapters.KeySpace{Prefix: "checkins"},
		env: map[string]string{"REDIS_URL": srv.URL(), "PROJECTION_POLL_INTERVAL": "200ms", "PROJECTION_RETIRE_GRACE": "1s"},
		l:   newLedger(), client: authedClient(5 * time.Second)}
	p := startSvc(t, "serve", d.env)
	for i := range 200 {
		d.l.post(d.client, p.base, fmt.Sprintf("before-%d", i), before(i))
	}
	d.l.resolve(t, p.base)
	d.l.verifyAll(t, d.url, d.keys)
	require.Zero(t, p.exit(t, syscall.SIGTERM))
	reg, err := d.c.HGetAll(context.Background(), d.keys.Projections()).Result()
	require.NoError(t, err)
	require.Equal(t, strconv.Itoa(layout), reg[name+".layout"], "a new deployment starts in the current layout")
	d.reg = reg
	return d
}

// restartForLayout starts serve on a deployment whose projection name serves v1 in an earlier
// layout, posts 100 check-ins (the i-th as next(i) says), and waits until v2, built in layout by
// itself, serves reads and v1's keys are gone; every read model stays exact on the way.
func restartForLayout(t *testing.T, url string, keys adapters.KeySpace, env map[string]string, l *ledger, client *http.Client,
	name string, layout int, next func(i int) sent) *svcProc {
	t.Helper()
	ctx := context.Background()
	c := redistest.Client(t, url)
	p := startSvc(t, "serve", env)
	t.Cleanup(func() {
		if t.Failed() {
			reg, _ := c.HGetAll(ctx, keys.Projections()).Result()
			t.Logf("registry: %v\nlogs:\n%s", reg, p.logs)
		}
	})
	for i := range 100 {
		l.post(client, p.base, fmt.Sprintf("after-%d", i), next(i))
	}
	l.resolve(t, p.base)
	l.verifyAll(t, url, keys)
	v1 := keys.ProjectionPrefix(name, 1)
	require.Eventually(t, func() bool {
		reg, err := c.HGetAll(ctx, keys.Projections()).Result()
		require.NoError(t, err)
		left, err := c.Keys(ctx, v1+"*").Result()
		require.NoError(t, err)
		return reg[name+".version"] == "2" && reg[name+".layout"] == strconv.Itoa(layout) && reg[name+".retiring"] == "" && len(left) == 0
	}, 30*time.Second, 100*time.Millisecond, "%s v2 is built in layout %d, serves reads, and v1 is removed", name, layout)
	assert.Contains(t, p.logs.String(), "rebuilding it in the current one")
	return p
}

// entryFields are a stream entry's values as strings.
func entryFields(values map[string]any) map[string]string {
	out := make(map[string]string, len(values))
	for k, v := range values {
		out[k], _ = v.(string)
	}
	return out
}

// TestUpgradeRebuildsRecentCheckinsCompact: a deployment of the release before compact recent
// check-ins (members of recent_checkins v1 are JSON, no layout in the registry) gets this
// binary. v1 keeps serving, written as JSON, until v2, whose members are compact (each user's
// set a listpack), has caught up; then reads switch to v2 and v1's keys go.
func TestUpgradeRebuildsRecentCheckinsCompact(t *testing.T) {
	t.Parallel()
	d := newLayoutDeployment(t, "recent_checkins", projection.RecentCheckinsLayout, func(i int) sent {
		return sent{user: 1 + int64(i%7), location: 1 + int64(i%11), stars: int64(i % 6)}
	})
	c, ctx, keys, env, l, client := d.c, context.Background(), d.keys, d.env, d.l, d.client

	// What the earlier release left: JSON members, and no layout recorded.
	v1 := keys.Prefix + ":p:recent_checkins:v1:"
	sets, err := c.Keys(ctx, v1+"*:recent").Result()
	require.NoError(t, err)
	require.Len(t, sets, 7)
	for _, k := range sets {
		zs, err := c.ZRangeWithScores(ctx, k, 0, -1).Result()
		require.NoError(t, err)
		require.NotEmpty(t, zs)
		old := make([]redis.Z, len(zs))
		for i, z := range zs {
			f := strings.SplitN(z.Member.(string), " ", 4)
			require.Len(t, f, 4, "a compact member: %q", z.Member)
			ts, _ := strconv.ParseInt(f[0], 10, 64)
			loc, _ := strconv.ParseInt(f[1], 10, 64)
			stars, _ := strconv.Atoi(f[2])
			m, err := projection.RecentCheckin{CheckinID: f[3], LocationID: loc, StarRating: stars, Timestamp: ts}.Member(projection.RecentCheckinsJSON)
			require.NoError(t, err)
			old[i] = redis.Z{Score: z.Score, Member: m}
		}
		require.NoError(t, c.Del(ctx, k).Err())
		require.NoError(t, c.ZAdd(ctx, k, old...).Err())
	}
	require.NoError(t, c.HDel(ctx, keys.Projections(), "recent_checkins.layout").Err())
	l.verifyAll(t, d.url, keys) // the reads decode the earlier members

	p := restartForLayout(t, d.url, keys, env, l, client, "recent_checkins", projection.RecentCheckinsLayout,
		func(i int) sent { return sent{user: 1 + int64(i%9), location: 1 + int64(i%13), stars: int64(i % 5)} })
	v2, err := c.Keys(ctx, keys.Prefix+":p:recent_checkins:v2:*:recent").Result()
	require.NoError(t, err)
	require.Len(t, v2, 9)
	for _, k := range v2 {
		enc, err := c.ObjectEncoding(ctx, k).Result()
		require.NoError(t, err)
		assert.Equal(t, "listpack", enc, k)
		m, err := c.ZRange(ctx, k, 0, 0).Result()
		require.NoError(t, err)
		assert.NotContains(t, m[0], "{", "a compact member")
	}
	l.verifyAll(t, d.url, keys)
	code, body := faultGet(t, p.base+"/readyz")
	assert.Equal(t, http.StatusOK, code, body)
	assert.Zero(t, poisonLen(t, c, keys))
}
