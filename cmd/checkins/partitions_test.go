package main

// The event stream in partitions (STREAM_PARTITIONS) on a single server: the operations sum the
// partitions up, a rebuild and a poison replay work with P > 1, and a start with another P than
// the stream was created with is refused, naming the migration.

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
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
	"github.com/checkins/checkins/domain"
)

// TestPartitionedOperations: with 4 partitions, malformed entries written to two partitions are
// parked with their partition's stream; `status` sums the lag of entries waiting on three
// partitions; `projections rebuild` builds a version from every partition; a parked check-in is
// replayed; the read models stay exact throughout.
func TestPartitionedOperations(t *testing.T) {
	t.Parallel()
	rdb := redistest.Open(t)
	client := redistest.Client(t, rdb.URL)
	env := map[string]string{"REDIS_URL": rdb.URL, "KEY_PREFIX": rdb.Prefix, "STREAM_PARTITIONS": "4", "NACK_DELAY": "100ms",
		"RETENTION": "100000", "RETENTION_INTERVAL": "100ms"}
	keys, err := adapters.KeySpace{Prefix: rdb.Prefix}.WithPartitions(4)
	require.NoError(t, err)
	parts := keys.Partitions()
	ctx := context.Background()
	svc := startSvc(t, "serve", env)

	l := newLedger()
	httpc := authedClient(10 * time.Second)
	for i := range 200 {
		l.post(httpc, svc.base, fmt.Sprintf("pop-%d", i), sent{user: 1 + int64(i)%faultUsers, location: 1 + int64(i)%faultLocations, stars: int64(i % 6)})
	}
	l.verify(t, svc.base)
	groups := groupsOn(t, client, parts.Stream(0))
	require.NotEmpty(t, groups)
	for _, s := range parts.Streams() {
		assert.Equal(t, groups, groupsOn(t, client, s), "every partition has the same consumer groups")
	}

	// Garbage in partitions 1 and 3: each projection parks each, recording where it was.
	bad := map[string]int{} // partition and entry ID (two partitions may number an entry alike)
	for _, i := range []int{1, 3} {
		id, err := client.XAdd(ctx, &redis.XAddArgs{Stream: parts.Stream(i), Values: map[string]any{"hello": "world"}}).Result()
		require.NoError(t, err)
		bad[parts.Stream(i)+" "+id] = 0
	}
	var page poisonListJSON
	require.Eventually(t, func() bool {
		code, out, _ := runOps(t, env, "poison", "list", "--json", "--limit", "1000")
		return code == 0 && json.Unmarshal([]byte(out), &page) == nil && len(page.Entries) == 2*len(groups)
	}, 20*time.Second, 100*time.Millisecond, "each projection parks both malformed entries")
	for _, e := range page.Entries {
		n, ok := bad[e.Stream+" "+e.EntryID]
		assert.True(t, ok, "poison entry %s records the partition of entry %s: %s", e.ID, e.EntryID, e.Stream)
		bad[e.Stream+" "+e.EntryID] = n + 1
	}
	for at, n := range bad {
		assert.Equal(t, len(groups), n, "%s is parked once by each projection", at)
	}
	code, out, stderr := runOps(t, env, "poison", "purge", "--all")
	require.Equal(t, 0, code, stderr)
	assert.Contains(t, out, fmt.Sprintf("purged %d entries", 2*len(groups)))

	// With the projector stopped, check-ins of user 99 wait on their partition and others on two
	// more: status reports the lag of every projection as their total.
	require.Equal(t, 0, svc.exit(t, syscall.SIGTERM))
	waiting := 0
	used := map[string]bool{}
	for u := int64(90); len(used) < 3 || waiting < 6; u++ {
		stream := parts.StreamOf(u)
		if len(used) == 3 && !used[stream] {
			continue
		}
		used[stream] = true
		ev := domain.CheckinRecorded{Checkin: domain.Checkin{ID: fmt.Sprintf("wait-%d", u), UserID: u, LocationID: 1, StarRating: 4,
			Timestamp: time.Now().UnixMilli()}, RecordedAt: time.Now().UnixMilli()}
		values := map[string]any{}
		for k, v := range ev.Fields() {
			values[k] = v
		}
		require.NoError(t, client.XAdd(ctx, &redis.XAddArgs{Stream: stream, Values: values}).Err())
		l.mu.Lock()
		l.ok[ev.ID] = sent{user: u, location: 1, stars: 4}
		l.mu.Unlock()
		waiting++
	}
	code, out, stderr = runOps(t, env, "status", "--json")
	require.Equal(t, 0, code, stderr)
	var st struct {
		Stream       string `json:"stream"`
		StreamLength int64  `json:"streamLength"`
		Projections  []struct {
			Group   string `json:"group"`
			Kind    string `json:"kind"`
			Lag     *int64 `json:"lag"`
			Pending int64  `json:"pending"`
		} `json:"projections"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &st), out)
	var length int64
	for _, s := range parts.Streams() {
		n, err := client.XLen(ctx, s).Result()
		require.NoError(t, err)
		length += n
	}
	assert.Equal(t, length, st.StreamLength, "the stream length is the partitions' sum")
	assert.Contains(t, st.Stream, "4 partitions")
	lagged := 0
	for _, p := range st.Projections {
		if p.Kind != "live" {
			continue
		}
		lagged++
		if assert.NotNil(t, p.Lag, p.Group) {
			assert.Equal(t, int64(waiting), *p.Lag, "%s: the lag is the total over the partitions", p.Group)
		}
	}
	assert.Positive(t, lagged, out)

	svc = startSvc(t, "serve", env)
	l.verify(t, svc.base)
	code, out, stderr = runOps(t, env, "projections", "rebuild", "users")
	require.Equal(t, 0, code, "stdout %s\nstderr %s", out, stderr)
	assert.Contains(t, out, "users: done, v2 serves reads, v1 removed")
	for i := 200; i < 300; i++ {
		l.post(httpc, svc.base, fmt.Sprintf("pop-%d", i), sent{user: 1 + int64(i)%faultUsers, location: 1 + int64(i)%faultLocations, stars: int64(i % 6)})
	}
	l.verify(t, svc.base)
	for _, s := range parts.Streams() {
		assert.NotContains(t, groupsOn(t, client, s), "users.v1", "users v1's group is gone from %s", s)
	}
	require.Eventually(t, func() bool {
		for _, s := range parts.Streams() {
			if groupsOn(t, client, s)["users.v2"] {
				return false
			}
		}
		return true
	}, 30*time.Second, 100*time.Millisecond, "users v2's backfill group goes from every partition once done")

	// A check-in of partition 2 that users gave up on, replayed.
	user := int64(500)
	for parts.StreamOf(user) != parts.Stream(2) {
		user++
	}
	ev := domain.CheckinRecorded{Checkin: domain.Checkin{ID: "pop-replay", UserID: user, LocationID: 1, StarRating: 4, Timestamp: 1_700_000_000_000}, RecordedAt: 1_700_000_000_000}
	pid, err := adapters.NewPoisonQueue(client, keys).Park(ctx, ops.PoisonEntry{Stream: parts.Stream(2), EntryID: "1-1", Projection: "users", Group: "users.v2",
		Error: "handler bug", Attempts: 5, FailedAt: time.Now(), Fields: ev.Fields()})
	require.NoError(t, err)
	code, out, stderr = runOps(t, env, "poison", "replay", pid)
	require.Equal(t, 0, code, "stdout %s stderr %s", out, stderr)
	assert.Contains(t, out, "applied: true")
	c, body := faultGet(t, fmt.Sprintf("%s/users/%d", svc.base, user))
	require.Equal(t, http.StatusOK, c, body)
	assert.Contains(t, body, `"numCheckins":1`)
	// The rebuild's backfill parked the two malformed entries again, and nothing else.
	assert.Equal(t, 2, strings.Count(svc.logs.String(), `"msg":"event parked in poison queue"`), svc.logs)
}

// TestPartitionGuard: a start with another P than the stream was created with fails, naming
// the migration command, both for a stream created with partitions and for one created before
// them (one stream, nothing recorded); the ops verbs refuse alike.
func TestPartitionGuard(t *testing.T) {
	t.Parallel()
	rdb := redistest.Open(t)
	env := map[string]string{"REDIS_URL": rdb.URL, "KEY_PREFIX": rdb.Prefix, "STREAM_PARTITIONS": "4"}
	svc := startSvc(t, "serve", env)
	l := newLedger()
	l.post(authedClient(10*time.Second), svc.base, "guard-1", sent{user: 1, location: 1, stars: 3})
	l.verify(t, svc.base)
	require.Equal(t, 0, svc.exit(t, syscall.SIGTERM))

	for _, p := range []string{"8", "1"} {
		env["STREAM_PARTITIONS"] = p
		code, _, stderr := runOps(t, env, "serve")
		assert.Equal(t, 1, code, "serve with STREAM_PARTITIONS=%s on a stream of 4 must refuse to start:\n%s", p, stderr)
		assert.Contains(t, stderr, "has 4 partitions")
		assert.Contains(t, stderr, "checkins partitions migrate --to "+p)
		code, _, stderr = runOps(t, env, "status")
		assert.NotEqual(t, 0, code, stderr)
		assert.Contains(t, stderr, "checkins partitions migrate --to "+p)
	}

	// A stream of a service without partitions: P = 1, though nothing was recorded.
	old := redistest.Open(t)
	oldEnv := map[string]string{"REDIS_URL": old.URL, "KEY_PREFIX": old.Prefix}
	svc = startSvc(t, "serve", oldEnv)
	l = newLedger()
	l.post(authedClient(10*time.Second), svc.base, "guard-old", sent{user: 1, location: 1, stars: 3})
	l.verify(t, svc.base)
	require.Equal(t, 0, svc.exit(t, syscall.SIGTERM))
	meta, err := redistest.Client(t, old.URL).HGetAll(context.Background(), adapters.KeySpace{Prefix: old.Prefix}.Meta()).Result()
	require.NoError(t, err)
	assert.Equal(t, map[string]string{"idem-format": "compact", "max_request_timeout_ms": "5000"}, meta,
		"one stream on a single server records no partition count: the keys are those of before (a new one records its records' format, and the API its REQUEST_TIMEOUT for a migration's settle)")
	oldEnv["STREAM_PARTITIONS"] = "4"
	code, _, stderr := runOps(t, oldEnv, "serve")
	assert.Equal(t, 1, code, stderr)
	assert.Contains(t, stderr, "has 1 partitions")
	assert.Contains(t, stderr, "checkins partitions migrate --to 4")
}

// groupsOn is the consumer groups of stream.
func groupsOn(t *testing.T, rdb redis.UniversalClient, stream string) map[string]bool {
	t.Helper()
	gs, err := rdb.XInfoGroups(context.Background(), stream).Result()
	require.NoError(t, err)
	out := map[string]bool{}
	for _, g := range gs {
		out[g.Name] = true
	}
	return out
}

// TestPartitionedRebuildUnderIngest: a rebuild of users with 4 partitions while check-ins keep
// coming: the new version joins each partition at that partition's own position, backfills each
// up to it, and counts every check-in once.
func TestPartitionedRebuildUnderIngest(t *testing.T) {
	t.Parallel()
	rdb := redistest.Open(t)
	env := map[string]string{"REDIS_URL": rdb.URL, "KEY_PREFIX": rdb.Prefix, "STREAM_PARTITIONS": "4", "PROJECTION_RETIRE_GRACE": "3s"}
	svc := startSvc(t, "serve", env)
	second := map[string]string{"CONSUMER_NAME": "second-projector"}
	for k, v := range env {
		second[k] = v
	}
	startSvc(t, "project", second)
	l := newLedger()
	httpc := authedClient(10 * time.Second)
	for i := range 300 {
		l.post(httpc, svc.base, fmt.Sprintf("rb-%d", i), sent{user: 1 + int64(i)%faultUsers, location: 1 + int64(i)%faultLocations, stars: int64(i % 6)})
	}
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 300; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			l.post(httpc, svc.base, fmt.Sprintf("rb-%d", i), sent{user: 1 + int64(i)%faultUsers, location: 1 + int64(i)%faultLocations, stars: int64(i % 6)})
			time.Sleep(2 * time.Millisecond)
		}
	}()
	// Check-ins keep coming through the whole rebuild, however long it takes: some before it
	// starts, more after it ends, with the loader posting without a pause in between.
	accepted := func() int { ok, _, _, _ := l.stats(); return ok }
	require.Eventually(t, func() bool { return accepted() >= 320 }, 30*time.Second, 5*time.Millisecond, "the loader posts")
	code, out, stderr := runOps(t, env, "projections", "rebuild", "users")
	atEnd := accepted()
	require.Eventually(t, func() bool { return accepted() >= atEnd+20 }, 30*time.Second, 5*time.Millisecond, "the loader posts")
	close(stop)
	<-done
	require.Equal(t, 0, code, "stdout %s\nstderr %s", out, stderr)
	assert.Contains(t, out, "users: done, v2 serves reads, v1 removed")
	l.verify(t, svc.base)
}
