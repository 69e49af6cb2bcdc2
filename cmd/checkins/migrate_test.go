package main

// `checkins partitions migrate --to N` on a real Redis with the real binary: a stream of 20,000
// events whose projections stopped half-way is moved from 1 to 8 partitions while an API process
// answers 503 migrating; afterwards serve with 8 partitions finishes the projections exactly, an
// old /checkins cursor pages as before, a rerun is a no-op and a start with the old count is
// refused. A migration killed mid-copy and run again copies every entry exactly once.

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os/exec"
	"regexp"
	"sort"
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
	"github.com/checkins/checkins/app/query"
	"github.com/checkins/checkins/domain"
)

// xaddCheckins writes n check-ins straight to stream (as the API would), recording them in l.
func xaddCheckins(t *testing.T, client redis.UniversalClient, stream string, l *ledger, prefix string, n int) {
	t.Helper()
	xaddCheckinsTo(t, client, func(int64) string { return stream }, l, prefix, n)
}

// xaddCheckinsTo is xaddCheckins to each user's stream (a partition of the stream).
func xaddCheckinsTo(t *testing.T, client redis.UniversalClient, streamOf func(user int64) string, l *ledger, prefix string, n int) {
	t.Helper()
	ctx := context.Background()
	base := time.Now().UnixMilli() - int64(n)
	for start := 0; start < n; start += 1000 {
		pipe := client.Pipeline()
		for i := start; i < min(n, start+1000); i++ {
			c := domain.Checkin{ID: fmt.Sprintf("%s-%d", prefix, i), UserID: 1 + int64(i)%faultUsers, LocationID: 1 + int64(i*7)%faultLocations,
				StarRating: i % 6, Timestamp: base + int64(i)}
			ev := domain.CheckinRecorded{Checkin: c, RecordedAt: base + int64(i)}
			values := map[string]any{}
			for k, v := range ev.Fields() {
				values[k] = v
			}
			pipe.XAdd(ctx, &redis.XAddArgs{Stream: streamOf(c.UserID), Values: values})
			l.mu.Lock()
			l.ok[c.ID] = sent{user: c.UserID, location: c.LocationID, stars: int64(c.StarRating)}
			l.accepted[c.ID] = c
			l.mu.Unlock()
		}
		_, err := pipe.Exec(ctx)
		require.NoError(t, err)
	}
}

// streamIDs is every entry ID of streams, with how often each occurs.
func streamIDs(t *testing.T, client redis.UniversalClient, streams []string) map[string]int {
	t.Helper()
	out := map[string]int{}
	for _, s := range streams {
		msgs, err := client.XRange(context.Background(), s, "-", "+").Result()
		require.NoError(t, err)
		for _, m := range msgs {
			out[m.ID]++
		}
	}
	return out
}

type checkinPageJSON struct {
	Checkins []struct {
		ID string `json:"checkinId"`
	} `json:"checkins"`
	NextCursor string `json:"nextCursor"`
}

func getPage(t *testing.T, base, query string) checkinPageJSON {
	t.Helper()
	code, body := faultGet(t, base+"/checkins?"+query)
	require.Equal(t, http.StatusOK, code, body)
	var p checkinPageJSON
	require.NoError(t, json.Unmarshal([]byte(body), &p), body)
	return p
}

func pageIDs(p checkinPageJSON) []string {
	var ids []string
	for _, c := range p.Checkins {
		ids = append(ids, c.ID)
	}
	return ids
}

// TestPartitionMigrateOneToEight: 20,000 events on one stream; a projector consumed the first
// 10,000 and stopped. An API process keeps taking check-ins until the migration's flag makes it
// answer 503 migrating. `partitions migrate --to 8` moves the stream; serve with 8 partitions
// then projects the remaining entries: every read model equals the independent computation over
// the accepted check-ins (nothing lost, nothing counted twice), a cursor issued before pages as
// before, a rerun is a no-op, and a start with the old count is refused, naming the command.
// The same on the shared local cluster of 3 masters, from one stream (STREAM_PARTITIONS=1) to 8
// partitions on evenly spread slots, with the groups mid-way.
func TestPartitionMigrateOneToEight(t *testing.T) {
	t.Parallel()
	t.Run("one server", func(t *testing.T) {
		t.Parallel()
		rdb := redistest.Open(t)
		testPartitionMigrateOneToEight(t, rdb.URL, adapters.KeySpace{Prefix: rdb.Prefix}, redistest.Client(t, rdb.URL), nil)
	})
	t.Run("cluster", func(t *testing.T) {
		t.Parallel()
		cl := redistest.OpenCluster(t)
		keys, err := adapters.NewKeySpace(cl.Prefix, true)
		require.NoError(t, err)
		testPartitionMigrateOneToEight(t, cl.URL, keys, redistest.ClusterClient(t, cl.URL), map[string]string{"STREAM_PARTITIONS": "1"})
	})
}

func testPartitionMigrateOneToEight(t *testing.T, url string, keys adapters.KeySpace, client redis.UniversalClient, more map[string]string) {
	ctx := context.Background()
	env := map[string]string{"REDIS_URL": url, "KEY_PREFIX": keys.Prefix, "REQUEST_TIMEOUT": "1s"}
	maps.Copy(env, more)
	l := newLedger()

	xaddCheckins(t, client, keys.Stream(), l, "first", 10_000)
	svc := startSvc(t, "serve", env)
	l.verify(t, svc.base)
	require.Equal(t, 0, svc.exit(t, syscall.SIGTERM))
	xaddCheckins(t, client, keys.Stream(), l, "second", 10_000)
	require.EqualValues(t, 20_000, client.XLen(ctx, keys.Stream()).Val())
	groups := groupsOn(t, client, keys.Stream())
	require.NotEmpty(t, groups)

	// An API process (no projections: the groups stay half-way) issues a cursor, and takes
	// check-ins until the migration stops it.
	api := startSvc(t, "api", env)
	page1 := getPage(t, api.base, "limit=1000")
	require.NotEmpty(t, page1.NextCursor)
	page2 := getPage(t, api.base, "limit=1000&cursor="+page1.NextCursor)
	require.Len(t, page2.Checkins, 1000)
	lctx, stopLoad := context.WithCancel(ctx)
	var retryAfter string
	loadDone := make(chan struct{})
	go func() {
		defer close(loadDone)
		httpc := authedClient(5 * time.Second)
		for i := 0; lctx.Err() == nil; i++ {
			s := sent{user: 1 + int64(i)%faultUsers, location: 1 + int64(i)%faultLocations, stars: int64(i % 6)}
			l.post(httpc, api.base, fmt.Sprintf("during-%d", i), s)
			time.Sleep(5 * time.Millisecond)
		}
	}()
	// Retry-After on a 503 migrating, checked by hand while the migration runs, with a body the
	// API refuses (400) otherwise: the probe records nothing.
	raDone := make(chan struct{})
	go func() {
		defer close(raDone)
		httpc := authedClient(5 * time.Second)
		for lctx.Err() == nil {
			req, _ := http.NewRequest(http.MethodPost, api.base+"/checkins", strings.NewReader(`{"checkinId":"probe","userId":1,"locationId":1,"starRating":99}`))
			req.Header.Set("Content-Type", "application/json")
			resp, err := httpc.Do(req)
			if err == nil {
				_ = resp.Body.Close()
				if resp.StatusCode == http.StatusServiceUnavailable {
					retryAfter = resp.Header.Get("Retry-After")
					return
				}
			}
			time.Sleep(50 * time.Millisecond)
		}
	}()

	started := time.Now()
	code, out, stderr := runOps(t, env, "partitions", "migrate", "--to", "8")
	took := time.Since(started)
	require.Equal(t, 0, code, "stdout %s\nstderr %s", out, stderr)
	t.Logf("migrate 1 -> 8 took %s:\n%s", took, out)
	<-raDone
	stopLoad()
	<-loadDone
	assert.Contains(t, out, "migrated from 1 to 8 partitions")
	l.mu.Lock()
	migrating := l.codes503[ports503Migrating]
	l.mu.Unlock()
	assert.Positive(t, migrating, "the API answered 503 migrating while the migration ran")
	assert.Equal(t, "5", retryAfter, "a 503 migrating carries Retry-After")

	// The stream moved: the old key is gone, the 8 partitions hold every entry once, with its ID.
	parts8, err := keys.WithPartitions(8)
	require.NoError(t, err)
	assert.Zero(t, client.Exists(ctx, keys.Stream()).Val(), "the old stream is deleted")
	ids := streamIDs(t, client, parts8.Partitions().Streams())
	ok, _, _, _ := l.stats()
	assert.Len(t, ids, ok, "every accepted check-in is in the new partitions")
	for id, n := range ids {
		if n != 1 {
			t.Errorf("entry %s is in %d partitions", id, n)
		}
	}
	for i, s := range parts8.Partitions().Streams() {
		assert.Positive(t, client.XLen(ctx, s).Val(), "partition %d holds entries", i)
		assert.Equal(t, groups, groupsOn(t, client, s), "partition %d has every group", i)
	}
	assert.Equal(t, "8", client.HGet(ctx, keys.Meta(), "partitions").Val())

	// The old API process stands still until restarted with the new count.
	assert.Eventually(t, func() bool {
		c503, body := faultGet(t, api.base+"/checkins?limit=1")
		return c503 == http.StatusServiceUnavailable && strings.Contains(body, "restart it with STREAM_PARTITIONS=8")
	}, 5*time.Second, 100*time.Millisecond, "an API process of 1 partition refuses the stream of 8")

	env8 := map[string]string{"REDIS_URL": url, "KEY_PREFIX": keys.Prefix, "STREAM_PARTITIONS": "8"}
	l.mu.Lock()
	var acceptedBefore []string // through the API before the migration: their idempotency records still answer after it
	for id := range l.ok {
		if strings.HasPrefix(id, "during-") {
			acceptedBefore = append(acceptedBefore, id)
		}
	}
	sentBefore := maps.Clone(l.ok)
	acceptedAt := map[string]float64{}
	for id, c := range l.accepted {
		acceptedAt[id] = float64(c.Timestamp)
	}
	l.mu.Unlock()
	sort.Strings(acceptedBefore)
	require.NotEmpty(t, acceptedBefore)
	svc = startSvc(t, "serve", env8)
	l.resolve(t, svc.base) // the check-ins refused with 503 migrating, sent again
	for _, id := range acceptedBefore[:min(20, len(acceptedBefore))] {
		s := sentBefore[id]
		// Another body first: were the record not found, this one would be recorded (202).
		other := fmt.Sprintf(`{"checkinId":%q,"userId":%d,"locationId":%d,"starRating":%d}`, id, s.user, s.location, (s.stars+1)%6)
		code, body, err := testPostCheckin(svc.base, other, nil)
		require.NoError(t, err)
		assert.Equal(t, http.StatusConflict, code, "%s reused with another body after the migration: 409 (%v)", id, body)
		same := fmt.Sprintf(`{"checkinId":%q,"userId":%d,"locationId":%d,"starRating":%d}`, id, s.user, s.location, s.stars)
		code, body, err = testPostCheckin(svc.base, same, nil)
		require.NoError(t, err)
		assert.Equal(t, http.StatusAccepted, code, "%s sent again after the migration: answered as a retry (%v)", id, body)
		assert.EqualValues(t, acceptedAt[id], body["timestamp"], "%s: the retry answers with the check-in accepted before (the API stamped its time then)", id)
	}
	l.verify(t, svc.base) // and the retries above were not counted again
	l.verifyAll(t, url, parts8)
	requireNothingPending(t, client, parts8)
	assert.Zero(t, svc.logs.count("event parked in poison queue"))
	again := getPage(t, svc.base, "limit=1000&cursor="+page1.NextCursor)
	assert.Equal(t, pageIDs(page2), pageIDs(again), "a cursor issued before the migration pages as before")

	code, out, stderr = runOps(t, env, "partitions", "migrate", "--to", "8")
	require.Equal(t, 0, code, stderr)
	assert.Contains(t, out, "has 8 partitions already: nothing to do")
	env1 := map[string]string{"REDIS_URL": url, "KEY_PREFIX": keys.Prefix, "STREAM_PARTITIONS": "1"}
	code, _, stderr = runOps(t, env1, "serve")
	assert.Equal(t, 1, code, stderr)
	assert.Contains(t, stderr, "has 8 partitions")
	assert.Contains(t, stderr, "checkins partitions migrate --to 1")
}

const ports503Migrating = "migrating"

// TestPartitionMigrateResumesAfterKill: a migration killed (SIGKILL) in the middle of its copy
// leaves part of the entries in the new partitions; run again, it carries on: every entry is in
// exactly one new partition, once, and the projections finish exactly on 4 partitions. The same
// stream is then migrated back to one.
func TestPartitionMigrateResumesAfterKill(t *testing.T) {
	t.Parallel()
	rdb := redistest.Open(t)
	client := redistest.Client(t, rdb.URL)
	ctx := context.Background()
	keys := adapters.KeySpace{Prefix: rdb.Prefix}
	env := map[string]string{"REDIS_URL": rdb.URL, "KEY_PREFIX": rdb.Prefix, "REQUEST_TIMEOUT": "1s"}
	l := newLedger()
	xaddCheckins(t, client, keys.Stream(), l, "a", 2000)
	svc := startSvc(t, "serve", env)
	l.verify(t, svc.base)
	require.Equal(t, 0, svc.exit(t, syscall.SIGTERM))
	xaddCheckins(t, client, keys.Stream(), l, "b", 3000)
	before := streamIDs(t, client, []string{keys.Stream()})

	cmd := exec.Command(checkinsBinary(t), "partitions", "migrate", "--to", "4", "--batch", "100", "--batch-pause", "50ms")
	cmd.Env = cliEnv(env)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	require.NoError(t, cmd.Start())
	var progress struct {
		Phase      string `json:"phase"`
		LastCopied string `json:"lastCopied"`
	}
	require.Eventually(t, func() bool {
		raw, err := client.HGet(ctx, keys.Meta(), "migrate").Result()
		return err == nil && json.Unmarshal([]byte(raw), &progress) == nil && progress.Phase == "copy" && progress.LastCopied != ""
	}, 30*time.Second, 5*time.Millisecond, "the copy starts: %s", &out)
	time.Sleep(300 * time.Millisecond)
	require.NoError(t, cmd.Process.Kill())
	_ = cmd.Wait()
	parts4, err := keys.WithPartitions(4)
	require.NoError(t, err)
	partial := streamIDs(t, client, parts4.Partitions().Streams())
	t.Logf("killed after copying %d of %d entries", len(partial), len(before))
	require.Positive(t, len(partial))
	require.Less(t, len(partial), len(before), "killed mid-copy")

	// Processes see the flag: an API process refuses check-ins.
	api := startSvc(t, "api", env)
	c503, body := faultGet(t, api.base+"/checkins?limit=1")
	assert.Equal(t, http.StatusServiceUnavailable, c503, body)
	assert.Contains(t, body, `"code":"migrating"`)

	code, stdout, stderr := runOps(t, env, "partitions", "migrate", "--to", "4")
	require.Equal(t, 0, code, "stdout %s\nstderr %s", stdout, stderr)
	assert.Contains(t, stdout, "carrying on the migration from 1 to 4 partitions (phase copy)")
	assert.Contains(t, stdout, "were there from an earlier run")
	after := streamIDs(t, client, parts4.Partitions().Streams())
	assert.Equal(t, before, after, "every entry copied exactly once, with its ID")

	env4 := map[string]string{"REDIS_URL": rdb.URL, "KEY_PREFIX": rdb.Prefix, "STREAM_PARTITIONS": "4"}
	svc = startSvc(t, "serve", env4)
	l.verify(t, svc.base)
	l.verifyAll(t, rdb.URL, parts4)
	requireNothingPending(t, client, parts4)

	// And back to one stream (4 -> 1: the partitions merged in ID order), while a projector is
	// busy with 10,000 new entries: it stops reading when it sees the flag, finishes what it
	// holds, and the migration positions the groups where it stopped.
	require.Equal(t, 0, svc.exit(t, syscall.SIGTERM))
	for i := range 10 {
		xaddTo := parts4.Partitions().Stream(i % 4)
		xaddCheckins(t, client, xaddTo, l, fmt.Sprintf("d%d", i), 1000)
	}
	before = streamIDs(t, client, parts4.Partitions().Streams())
	svc = startSvc(t, "serve", env4)
	code, stdout, stderr = runOps(t, env, "partitions", "migrate", "--to", "1")
	require.Equal(t, 0, code, "stdout %s\nstderr %s", stdout, stderr)
	t.Logf("4 -> 1 under a busy projector:\n%s", stdout)
	assert.Equal(t, before, streamIDs(t, client, []string{keys.Stream()}), "back on one stream, with the same IDs")
	assert.Eventually(t, func() bool {
		c, body := faultGet(t, svc.base+"/readyz")
		return c == http.StatusServiceUnavailable && strings.Contains(body, "STREAM_PARTITIONS=1")
	}, 5*time.Second, 100*time.Millisecond, "the projector of 4 partitions is not ready on a stream of 1")
	require.Equal(t, 0, svc.exit(t, syscall.SIGTERM))
	svc = startSvc(t, "serve", env)
	xaddCheckins(t, client, keys.Stream(), l, "c", 500)
	l.verify(t, svc.base)
	l.verifyAll(t, rdb.URL, keys)
}

// TestPartitionMigrateStandaloneToCluster is the README's move from a single Redis to a cluster:
// the stream of a standalone server (5,000 check-ins, projected there) is copied to a cluster
// with DUMP and RESTORE, its consumer groups dropped, split into 24 partitions by `partitions
// migrate --to 24`, and serve on the cluster rebuilds the read models from the log, exactly.
func TestPartitionMigrateStandaloneToCluster(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("a cluster")
	}
	rdb := redistest.Open(t)
	client := redistest.Client(t, rdb.URL)
	ctx := context.Background()
	old := adapters.KeySpace{Prefix: rdb.Prefix}
	l := newLedger()
	xaddCheckins(t, client, old.Stream(), l, "move", 5000)
	svc := startSvc(t, "serve", map[string]string{"REDIS_URL": rdb.URL, "KEY_PREFIX": rdb.Prefix})
	l.verify(t, svc.base)
	require.Equal(t, 0, svc.exit(t, syscall.SIGTERM))

	cl := redistest.OpenCluster(t)
	cc := redistest.ClusterClient(t, cl.URL)
	keys, err := adapters.NewKeySpace(cl.Prefix, true)
	require.NoError(t, err)
	dump, err := client.Dump(ctx, old.Stream()).Result()
	require.NoError(t, err)
	require.NoError(t, cc.Restore(ctx, keys.Stream(), 0, dump).Err())
	gs, err := cc.XInfoGroups(ctx, keys.Stream()).Result()
	require.NoError(t, err)
	require.NotEmpty(t, gs, "DUMP carries the consumer groups")
	for _, g := range gs {
		require.NoError(t, cc.XGroupDestroy(ctx, keys.Stream(), g.Name).Err())
	}

	env := map[string]string{"REDIS_URL": cl.URL, "KEY_PREFIX": cl.Prefix, "REQUEST_TIMEOUT": "1s"}
	code, out, stderr := runOps(t, env, "partitions", "migrate", "--to", "24")
	require.Equal(t, 0, code, "stdout %s\nstderr %s", out, stderr)
	t.Logf("on the cluster:\n%s", out)
	keys24, err := keys.WithPartitions(24)
	require.NoError(t, err)
	ids := streamIDs(t, cc, keys24.Partitions().Streams())
	assert.Len(t, ids, 5000)
	svc = startSvc(t, "serve", env)
	l.verify(t, svc.base)
	requireNothingPending(t, cc, keys24)
}

// TestQuiesceFlagStopsProjectorsAndIngest: with the migration's flag set in <prefix>:meta, a
// running serve answers 503 migrating on /checkins within a poll and its projectors read
// nothing new (entries XADDed meanwhile stay unread); cleared, both resume by themselves. With
// the batched subscriber and the stock one alike.
func TestQuiesceFlagStopsProjectorsAndIngest(t *testing.T) {
	t.Parallel()
	for _, sub := range []string{adapters.SubscriberBatched, adapters.SubscriberWatermill} {
		t.Run(sub, func(t *testing.T) {
			t.Parallel()
			testQuiesceFlagStopsProjectorsAndIngest(t, sub)
		})
	}
}

// testQuiesceFlagStopsProjectorsAndIngest: with the subscriber sub (SUBSCRIBER), the quiesce
// flag stops ingest and the reading of new entries, and both resume when it is cleared.
func testQuiesceFlagStopsProjectorsAndIngest(t *testing.T, sub string) {
	rdb := redistest.Open(t)
	client := redistest.Client(t, rdb.URL)
	ctx := context.Background()
	keys := adapters.KeySpace{Prefix: rdb.Prefix}
	svc := startSvc(t, "serve", map[string]string{"REDIS_URL": rdb.URL, "KEY_PREFIX": rdb.Prefix, "SUBSCRIBER": sub})
	l := newLedger()
	xaddCheckins(t, client, keys.Stream(), l, "before", 100)
	l.verify(t, svc.base)

	require.NoError(t, client.HSet(ctx, keys.Meta(), "quiesce", "test").Err())
	require.Eventually(t, func() bool {
		c, body := faultGet(t, svc.base+"/checkins/latest")
		return c == http.StatusServiceUnavailable && strings.Contains(body, `"code":"migrating"`)
	}, 3*time.Second, 50*time.Millisecond, "503 migrating within a poll")
	time.Sleep(500 * time.Millisecond) // a read in flight when the flag was seen ends
	xaddCheckins(t, client, keys.Stream(), l, "during", 100)
	time.Sleep(2 * time.Second)
	gs, err := client.XInfoGroups(ctx, keys.Stream()).Result()
	require.NoError(t, err)
	for _, g := range gs {
		assert.EqualValues(t, 100, g.Lag, "group %s reads nothing new while the flag is set", g.Name)
	}
	c, _ := faultGet(t, svc.base+"/users/1")
	assert.Equal(t, http.StatusOK, c, "the read models stay readable")
	code, _, stderr := runOps(t, map[string]string{"REDIS_URL": rdb.URL, "KEY_PREFIX": rdb.Prefix}, "projections", "rebuild", "users")
	assert.NotZero(t, code, "a rebuild waits for the migration")
	assert.Contains(t, stderr, "being migrated", "and says why")
	resp, err := testHTTPClient.Post(svc.base+"/ops/projections/users/rebuild", "application/json", nil)
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	assert.Equal(t, http.StatusServiceUnavailable, resp.StatusCode, "%s", body)
	assert.Contains(t, string(body), `"code":"migrating"`)
	assert.NotEmpty(t, resp.Header.Get("Retry-After"))

	require.NoError(t, client.HDel(ctx, keys.Meta(), "quiesce").Err())
	l.verify(t, svc.base)
	code, _ = faultGet(t, svc.base+"/checkins/latest")
	assert.Equal(t, http.StatusOK, code)
}

// TestPartitionMigrateDuringRebuild: rebuilds of users and leaderboards are half-way through
// their backfill (their own consumer groups part-way down the stream, serving version still v1)
// and their projector was killed with entries in flight when `partitions migrate --to 4` moves
// the stream. serve on 4 partitions then carries both
// rebuilds to the end: they switch reads to v2 and remove v1, and every read model (the rebuilt
// ones included) equals the independent computation over the accepted check-ins, with nothing
// pending on any partition.
func TestPartitionMigrateDuringRebuild(t *testing.T) {
	t.Parallel()
	testMigrateDuringRebuild(t, 1, 4)
}

// TestPartitionMigrateMergingDuringRebuild is TestPartitionMigrateDuringRebuild from 2 to 3
// partitions: each new partition takes entries of both old ones, which numbered their entries
// independently, so entries whose ID the other partition holds too are renumbered, some of them
// counted by the live group and not yet by the rebuilds.
func TestPartitionMigrateMergingDuringRebuild(t *testing.T) {
	t.Parallel()
	testMigrateDuringRebuild(t, 2, 3)
}

func testMigrateDuringRebuild(t *testing.T, from, to int) {
	rdb := redistest.Open(t)
	client := redistest.Client(t, rdb.URL)
	ctx := context.Background()
	keys := adapters.KeySpace{Prefix: rdb.Prefix}
	env := map[string]string{"REDIS_URL": rdb.URL, "KEY_PREFIX": rdb.Prefix}
	if from > 1 {
		env["STREAM_PARTITIONS"] = strconv.Itoa(from)
		require.NoError(t, adapters.EnsurePartitions(ctx, client, keys, from))
	}
	with := func(more map[string]string) map[string]string {
		out := maps.Clone(env)
		maps.Copy(out, more)
		return out
	}
	partsFrom, err := keys.WithPartitions(from)
	require.NoError(t, err)
	streamOf := partsFrom.Partitions().StreamOf
	// groupTotals sums each group's entries read, lag and pending over the old partitions.
	groupTotals := func() (map[string]ops.GroupInfo, int64) {
		out := map[string]ops.GroupInfo{}
		var length int64
		for _, st := range partsFrom.Partitions().Streams() {
			info, err := adapters.ReadStreamInfo(ctx, client, st)
			require.NoError(t, err)
			length += info.Length
			for _, g := range info.Groups {
				sum := out[g.Name]
				sum.Name = g.Name
				sum.EntriesRead += g.EntriesRead
				sum.Lag += g.Lag
				sum.Pending += g.Pending
				out[g.Name] = sum
			}
		}
		return out, length
	}
	l := newLedger()

	xaddCheckinsTo(t, client, streamOf, l, "first", 10_000)
	svc := startSvc(t, "serve", env)
	l.verify(t, svc.base)
	require.Equal(t, 0, svc.exit(t, syscall.SIGTERM))
	for _, name := range []string{"users", "leaderboards"} {
		code, out, stderr := runOps(t, env, "projections", "rebuild", name, "--no-wait")
		require.Equal(t, 0, code, "stdout %s\nstderr %s", out, stderr)
	}
	// Small batches and a quick registry poll: the backfill takes seconds, long enough to stop
	// it in the middle.
	svc = startSvc(t, "serve", with(map[string]string{"BATCH_SIZE": "10", "MAX_IN_FLIGHT": "20", "PROJECTION_POLL_INTERVAL": "100ms"}))
	// Stop serve once both rebuilds' groups are part-way: some entries read, some to go.
	require.Eventually(t, func() bool {
		gs, _ := groupTotals()
		for _, g := range []string{"users.v2", "leaderboards.v2"} {
			if gs[g].EntriesRead < 1000 {
				return false
			}
		}
		return true
	}, 60*time.Second, 5*time.Millisecond, "both rebuilds start their backfill")
	// Killed, not stopped: the groups keep what was in flight as pending entries of a consumer
	// that is gone, which the migration hands over to the partitions.
	svc.exit(t, syscall.SIGKILL)
	gs, length := groupTotals()
	var pending int64
	for _, g := range []string{"users.v2", "leaderboards.v2", "live"} {
		gi, ok := gs[g]
		require.True(t, ok, g)
		pending += gi.Pending
		t.Logf("%s stopped after %d of %d entries, %d pending", g, gi.EntriesRead, length, gi.Pending)
		if g != "live" {
			require.Positive(t, gi.Lag, "%s is stopped in the middle of its backfill (read %d)", g, gi.EntriesRead)
		}
	}
	require.Positive(t, pending, "the killed projector left entries pending")
	for _, name := range []string{"users", "leaderboards"} {
		cur, err := adapters.NewProjectionVersions(client, keys).Current(ctx, name)
		require.NoError(t, err)
		require.Equal(t, 1, cur, "%s: v1 still serves reads while v2 is built", name)
	}
	xaddCheckinsTo(t, client, streamOf, l, "second", 2_000) // the live group is behind too

	// Nobody will acknowledge the dead consumer's entries: without --force the migration waits
	// for them and says so; with it, they are delivered again on the new partitions.
	target := strconv.Itoa(to)
	code, out, stderr := runOps(t, env, "partitions", "migrate", "--to", target, "--wait", "1s")
	require.NotEqual(t, 0, code, "stdout %s\nstderr %s", out, stderr)
	assert.Contains(t, stderr, "entries still pending after 1s")
	assert.Contains(t, stderr, "or rerun with --force")
	code, out, stderr = runOps(t, env, "partitions", "migrate", "--to", target, "--wait", "1s", "--force")
	require.Equal(t, 0, code, "stdout %s\nstderr %s", out, stderr)
	assert.Contains(t, out, "going on with entries pending (--force)")
	if from > 1 {
		m := regexp.MustCompile(`, (\d+) renumbered\)`).FindStringSubmatch(out)
		require.NotNil(t, m, out)
		n, _ := strconv.Atoi(m[1])
		t.Logf("%d entries renumbered", n)
		require.Positive(t, n, "the old partitions shared entry IDs: %s", out)
	}
	partsTo, err := keys.WithPartitions(to)
	require.NoError(t, err)
	for i, s := range partsTo.Partitions().Streams() {
		gs := groupsOn(t, client, s)
		assert.True(t, gs["users.v2"] && gs["leaderboards.v2"], "partition %d has the rebuilds' groups: %v", i, gs)
	}

	envTo := map[string]string{"REDIS_URL": rdb.URL, "KEY_PREFIX": rdb.Prefix, "STREAM_PARTITIONS": target,
		"PROJECTION_POLL_INTERVAL": "100ms", "PROJECTION_RETIRE_GRACE": "1s", "CLAIM_IDLE": "1s", "CLAIM_INTERVAL": "200ms"}
	svc = startSvc(t, "serve", envTo)
	require.Eventually(t, func() bool {
		code, out, _ := runOps(t, envTo, "projections", "list", "--json")
		if code != 0 {
			return false
		}
		var rep query.ProjectionsReport
		require.NoError(t, json.Unmarshal([]byte(out), &rep), out)
		done := 0
		for _, r := range rep.Rebuilds {
			if r.State == ops.RebuildDone && r.To == 2 {
				done++
			}
		}
		return done == 2
	}, 90*time.Second, 200*time.Millisecond, "both rebuilds finish on the %d partitions", to)
	for _, name := range []string{"users", "leaderboards"} {
		cur, err := adapters.NewProjectionVersions(client, keys).Current(ctx, name)
		require.NoError(t, err)
		assert.Equal(t, 2, cur, "%s reads v2", name)
		v1, err := client.Keys(ctx, keys.ProjectionPrefix(name, 1)+"*").Result()
		require.NoError(t, err)
		assert.Empty(t, v1, "%s v1 keys removed", name)
	}
	l.verify(t, svc.base)
	l.verifyAll(t, rdb.URL, partsTo)
	requireNothingPending(t, client, partsTo)
	assert.Zero(t, svc.logs.count("event parked in poison queue"))
}
