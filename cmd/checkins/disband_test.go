package main

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/checkins/checkins/adapters"
	"github.com/checkins/checkins/adapters/redistest"
	"github.com/checkins/checkins/app/ops"
)

// TestDisbandMovesProjectionsToOtherSets: projections first run together (the default set, live
// group `live`) are then run by two projectors of their own sets, while the API takes check-ins
// all along. Before the disband a projector of another set cannot take a projection over, and
// says to disband; `checkins projections disband live` refuses while the group's projector runs,
// checks with --dry-run, then gives each version an own group at live's position (run again, it
// says so; once every version joined elsewhere, that there is no such group); the two new
// projectors join their groups and catch up from there. Every read model comes out exact, and
// only the two new live groups are left. With one stream and with four partitions.
func TestDisbandMovesProjectionsToOtherSets(t *testing.T) {
	t.Parallel()
	for _, p := range []int{1, 4} {
		t.Run(fmt.Sprintf("P=%d", p), func(t *testing.T) {
			t.Parallel()
			disbandMovesProjections(t, p)
		})
	}
}

func disbandMovesProjections(t *testing.T, partitions int) {
	rdb := redistest.Open(t)
	client := redistest.Client(t, rdb.URL)
	base := adapters.KeySpace{Prefix: rdb.Prefix}
	keys, err := base.WithPartitions(partitions)
	require.NoError(t, err)
	env := func(projections string) map[string]string {
		return map[string]string{"REDIS_URL": rdb.URL, "KEY_PREFIX": rdb.Prefix, "STREAM_PARTITIONS": strconv.Itoa(partitions),
			"CLAIM_IDLE": "1s", "CLAIM_INTERVAL": "100ms", "PROJECTION_POLL_INTERVAL": "200ms", "PROJECTION_RETIRE_GRACE": "1s",
			"RATE_LIMIT_USER": "off", "PROJECTIONS": projections}
	}
	api := startSvc(t, "api", env(""))
	all := startSvc(t, "project", env(""))

	l := newLedger()
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	wait := l.load(ctx, 4, "d", func() string { return api.base }, 10*time.Second)
	l.waitFor(t, 200)

	// Another set cannot take users over from live: it stops at start, and says what to do.
	users := env("users")
	users["HTTP_ADDR"], users["OPS_ADDR"] = "127.0.0.1:0", "127.0.0.1:0"
	code, _, stderr := runCLI(t, users, "project")
	assert.Equal(t, 1, code)
	assert.Contains(t, stderr, `users.v1 is fed by live group "live"`)
	assert.Contains(t, stderr, "run: checkins projections disband live")

	code, _, stderr = runCLI(t, env(""), "projections", "disband", "live")
	assert.Equal(t, 1, code)
	assert.Contains(t, stderr, "stop every projector that runs it", "refused while a projector of it runs")

	all.exit(t, syscall.SIGTERM)
	time.Sleep(2100 * time.Millisecond) // app.MinStoppedIdle (2s), which CLAIM_IDLE (1s) is below
	code, stdout, stderr := runCLI(t, env(""), "projections", "disband", "live", "--dry-run")
	require.Equal(t, 0, code, stderr)
	assert.Contains(t, stdout, "live group live can be disbanded: daily_checkins.v1, leaderboards.v1, locations.v1, recent_checkins.v1, users.v1")
	code, stdout, stderr = runCLI(t, env(""), "projections", "disband", "live")
	require.Equal(t, 0, code, stderr)
	assert.Contains(t, stdout, "live group live disbanded")
	for _, stream := range keys.Partitions().Streams() {
		assert.NotContains(t, groupNames(t, client, stream), "live")
	}
	code, stdout, stderr = runCLI(t, env(""), "projections", "disband", "live")
	require.Equal(t, 0, code, "run again, it reports what it did; stderr:\n%s", stderr)
	assert.Contains(t, stdout, "live group live disbanded")

	// The API went on meanwhile; the new sets take over and catch up.
	from, _, _, _ := l.stats()
	l.waitFor(t, from+200)
	startSvc(t, "project", env("users,locations"))
	startSvc(t, "project", env("recent_checkins,daily_checkins,leaderboards"))
	from, _, _, _ = l.stats()
	l.waitFor(t, from+300)
	stop()
	wait()
	l.resolve(t, api.base)
	l.verifyAll(t, rdb.URL, keys)
	requireNothingPending(t, client, keys)
	for _, stream := range keys.Partitions().Streams() {
		require.Eventually(t, func() bool {
			return slices.Equal([]string{"live:daily_checkins,leaderboards,recent_checkins", "live:locations,users"}, groupNames(t, client, stream))
		}, 20*time.Second, 100*time.Millisecond, "only the new live groups are left on %s: %v", stream, groupNames(t, client, stream))
	}
	code, _, stderr = runCLI(t, env(""), "projections", "disband", "live")
	assert.Equal(t, 1, code)
	assert.Contains(t, stderr, `no live group "live" (the live groups are: live:daily_checkins,leaderboards,recent_checkins, live:locations,users)`)
	for i := range keys.Partitions().Count() {
		reg, err := client.HGetAll(context.Background(), keys.Partitions().Registry(i)).Result()
		require.NoError(t, err)
		for f := range reg {
			assert.NotRegexp(t, `^(moved:|live:live$|acked:live$)`, f, "left in the registry")
		}
	}
}

// groupNames are the consumer groups on stream, sorted.
func groupNames(t *testing.T, c redis.UniversalClient, stream string) []string {
	t.Helper()
	gs, err := c.XInfoGroups(context.Background(), stream).Result()
	require.NoError(t, err)
	var names []string
	for _, g := range gs {
		names = append(names, g.Name)
	}
	slices.Sort(names)
	return names
}

// TestDisbandRefusesWhileAProjectorRunsOnAQuietStream: a projector that runs the group on a
// stream where nothing new comes reads nothing, and before Redis 7.2 its consumer's idle time
// then grows as a stopped one's would. Its checkpoints (every 250 ms) still tell that it runs:
// the disband refuses until it is stopped.
func TestDisbandRefusesWhileAProjectorRunsOnAQuietStream(t *testing.T) {
	t.Parallel()
	rdb := redistest.Open(t)
	env := map[string]string{"REDIS_URL": rdb.URL, "KEY_PREFIX": rdb.Prefix, "CLAIM_IDLE": "1s", "RATE_LIMIT_USER": "off"}
	api := startSvc(t, "api", env)
	proj := startSvc(t, "project", env)
	l := newLedger()
	client := authedClient(5 * time.Second)
	for i := range 5 {
		l.post(client, api.base, fmt.Sprintf("quiet-%d", i), sent{user: 1 + int64(i), location: 3, stars: 4})
	}
	l.resolve(t, api.base)
	l.verifyAll(t, rdb.URL, adapters.KeySpace{Prefix: rdb.Prefix})
	time.Sleep(2500 * time.Millisecond) // quiet for longer than app.MinStoppedIdle (2s)

	code, _, stderr := runCLI(t, env, "projections", "disband", "live")
	assert.Equal(t, 1, code)
	assert.Contains(t, stderr, "a projector of it recorded its progress")
	proj.exit(t, syscall.SIGTERM)
	time.Sleep(2100 * time.Millisecond) // app.MinStoppedIdle
	code, stdout, stderr := runCLI(t, env, "projections", "disband", "live")
	require.Equal(t, 0, code, stderr)
	assert.Contains(t, stdout, "live group live disbanded")
}

// disbandedAfterCheckins: `checkins api` and `checkins project` (every projection: live group
// live) run on a private Redis, n check-ins of users 1..users at location 3 are posted and
// projected (every read model checked), project stops (SIGTERM), and once app.MinStoppedIdle (2s, above CLAIM_IDLE) has
// passed `checkins projections disband live` runs. It returns the Redis URL, the environment,
// the keys and the ledger of the check-ins.
func disbandedAfterCheckins(t *testing.T, prefix string, n, users int) (string, map[string]string, adapters.KeySpace, *ledger) {
	t.Helper()
	rdb := redistest.Open(t)
	env := map[string]string{"REDIS_URL": rdb.URL, "KEY_PREFIX": rdb.Prefix, "CLAIM_IDLE": "1s", "RATE_LIMIT_USER": "off"}
	keys := adapters.KeySpace{Prefix: rdb.Prefix}
	api := startSvc(t, "api", env)
	proj := startSvc(t, "project", env)
	l := newLedger()
	client := authedClient(5 * time.Second)
	for i := range n {
		l.post(client, api.base, fmt.Sprintf("%s-%d", prefix, i), sent{user: 1 + int64(i%users), location: 3, stars: 4})
	}
	l.resolve(t, api.base)
	l.verifyAll(t, rdb.URL, keys)
	proj.exit(t, syscall.SIGTERM)
	time.Sleep(2100 * time.Millisecond) // app.MinStoppedIdle
	code, _, stderr := runCLI(t, env, "projections", "disband", "live")
	require.Equal(t, 0, code, stderr)
	return rdb.URL, env, keys, l
}

// TestDropMovedVersionFromTheCLI: after a disband, a version no set runs any more is dropped with
// `checkins projections drop`: a check first, then the drop, which removes its read model, and
// which answers for a name that is not a version, or not moved, with what is wrong. A projector
// that runs it again later counts the whole stream onto an empty read model: every read model
// equals the independent computation.
func TestDropMovedVersionFromTheCLI(t *testing.T) {
	t.Parallel()
	url, env, keys, l := disbandedAfterCheckins(t, "drop", 8, 3)

	code, _, stderr := runCLI(t, env, "projections", "drop", "users")
	assert.Equal(t, 1, code)
	assert.Contains(t, stderr, `"users" is not a projection version`)
	code, stdout, stderr := runCLI(t, env, "projections", "drop", "users.v1", "--dry-run")
	require.Equal(t, 0, code, stderr)
	assert.Contains(t, stdout, "users.v1 can be dropped")
	c := redistest.Client(t, url)
	userKeys := func() int {
		ks, err := c.Keys(context.Background(), keys.ProjectionPrefix("users", 1)+"*").Result()
		require.NoError(t, err)
		return len(ks)
	}
	require.NotZero(t, userKeys())
	code, stdout, stderr = runCLI(t, env, "projections", "drop", "users.v1", "--json")
	require.Equal(t, 0, code, stderr)
	var rep ops.DropReport
	require.NoError(t, json.Unmarshal([]byte(stdout), &rep), stdout)
	assert.True(t, rep.Done)
	assert.Positive(t, rep.KeysRemoved)
	assert.Zero(t, userKeys(), "its read model is gone")
	code, _, stderr = runCLI(t, env, "projections", "drop", "users.v1")
	assert.Equal(t, 1, code)
	assert.Contains(t, stderr, "users.v1 is not a version a disband took out of its live group")
	assert.Contains(t, stderr, "they are: daily_checkins.v1, leaderboards.v1, locations.v1, recent_checkins.v1")

	// Run again, alone in a set of its own: from the start of the stream, each check-in once.
	withUsers := map[string]string{"PROJECTIONS": "users"}
	for k, v := range env {
		withUsers[k] = v
	}
	startSvc(t, "project", withUsers)
	l.verifyAll(t, url, keys)
}
