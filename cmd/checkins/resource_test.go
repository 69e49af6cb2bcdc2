package main

import (
	"context"
	"flag"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/checkins/checkins/adapters"
	"github.com/checkins/checkins/adapters/redistest"
	"github.com/checkins/checkins/cmd/checkins/bench"
	"github.com/checkins/checkins/domain"
)

// Resource faults: Redis out of memory, a Redis that may evict keys, one that will not say.

// fillToLimit fills srv with data and sets maxmemory just below what it uses: every write that
// needs memory is refused (OOM), reads still work.
func fillToLimit(t *testing.T, c *redis.Client) {
	t.Helper()
	ctx := context.Background()
	require.NoError(t, c.Do(ctx, "DEBUG", "POPULATE", 20000, "filler", 100).Err())
	m, err := adapters.ReadMemoryInfo(ctx, c)
	require.NoError(t, err)
	require.NoError(t, c.ConfigSet(ctx, "maxmemory", strconv.FormatInt(m.Used-100_000, 10)).Err())
	require.Error(t, c.Set(ctx, "probe", strings.Repeat("x", 1000), 0).Err(), "redis must refuse writes now")
}

// TestResourceEvictingRedisIsRefused: serve, api and project refuse a Redis whose
// maxmemory-policy evicts, naming the setting; ALLOW_EVICTING_REDIS runs anyway, with a warning.
func TestResourceEvictingRedisIsRefused(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t, redistest.Options{Args: []string{"--maxmemory-policy", "allkeys-lru"}})
	env := map[string]string{"REDIS_URL": srv.URL(), "HTTP_ADDR": "127.0.0.1:0"}
	for _, mode := range []string{"serve", "api", "project"} {
		code, _, stderr := runCLI(t, env, mode)
		assert.NotZero(t, code, "%s must refuse to start", mode)
		assert.Contains(t, stderr, `redis maxmemory-policy is "allkeys-lru"`, mode)
		assert.Contains(t, stderr, "ALLOW_EVICTING_REDIS=true", mode)
	}
	env["ALLOW_EVICTING_REDIS"] = "true"
	p := startSvc(t, "serve", env)
	require.Eventually(t, func() bool { return p.logs.count("ALLOW_EVICTING_REDIS is set and Redis may evict keys") == 1 }, 10*time.Second, 20*time.Millisecond)
	// Ready once its router runs (it starts right after the listener).
	require.Eventually(t, func() bool { code, _ := faultGet(t, p.base+"/readyz"); return code == http.StatusOK },
		10*time.Second, 20*time.Millisecond, "an allowed evicting Redis still serves")
}

// TestResourcePolicyChangedAtRuntimeMakesNotReady: a policy set to evict while the service runs
// makes it not ready, saying why, until it is noeviction again.
func TestResourcePolicyChangedAtRuntimeMakesNotReady(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t, redistest.Options{})
	c := redistest.Client(t, srv.URL())
	p := startSvc(t, "api", map[string]string{"REDIS_URL": srv.URL(), "REDIS_CHECK_INTERVAL": "100ms"})
	ready := func() (int, string) { return faultGet(t, p.base+"/readyz") }
	require.Eventually(t, func() bool { code, _ := ready(); return code == http.StatusOK }, 10*time.Second, 20*time.Millisecond)
	require.NoError(t, c.ConfigSet(context.Background(), "maxmemory-policy", "volatile-lru").Err())
	require.Eventually(t, func() bool {
		code, body := ready()
		return code == http.StatusServiceUnavailable && strings.Contains(body, `maxmemory-policy is \"volatile-lru\"`)
	}, 10*time.Second, 20*time.Millisecond)
	// The log is read from the process's stderr as it comes: the line may arrive after /readyz
	// answers. Once it has, a few more checks (100 ms apart) must not log it again.
	require.Eventually(t, func() bool { return p.logs.count("Redis may now evict keys") >= 1 }, 10*time.Second, 20*time.Millisecond)
	time.Sleep(300 * time.Millisecond)
	assert.Equal(t, 1, p.logs.count("Redis may now evict keys"), "logged once, not every check")
	require.NoError(t, c.ConfigSet(context.Background(), "maxmemory-policy", "noeviction").Err())
	require.Eventually(t, func() bool { code, _ := ready(); return code == http.StatusOK }, 10*time.Second, 20*time.Millisecond)
}

// TestResourceEvictingRedisThatComesUpLate: a service started while Redis does not answer, which
// then comes up evicting, is not ready, naming the policy, within seconds (not an interval later:
// the default REDIS_CHECK_INTERVAL is a minute).
func TestResourceEvictingRedisThatComesUpLate(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t, redistest.Options{Args: []string{"--maxmemory-policy", "allkeys-lru"}})
	srv.Stop()
	p := startSvc(t, "api", map[string]string{"REDIS_URL": srv.URL()})
	code, body := faultGet(t, p.base+"/readyz")
	require.Equal(t, http.StatusServiceUnavailable, code, body)
	srv.Restart()
	require.Eventually(t, func() bool {
		code, body := faultGet(t, p.base+"/readyz")
		return code == http.StatusServiceUnavailable && strings.Contains(body, `maxmemory-policy is \"allkeys-lru\"`)
	}, 15*time.Second, 50*time.Millisecond, "not ready on an evicting Redis")
	require.Never(t, func() bool { code, _ := faultGet(t, p.base+"/readyz"); return code == http.StatusOK },
		time.Second, 50*time.Millisecond)
}

// TestResourceRedisThatHidesItsPolicy: a user that may run neither INFO nor CONFIG (as on some
// managed services) gets one warning, and the service runs.
func TestResourceRedisThatHidesItsPolicy(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t, redistest.Options{})
	c := redistest.Client(t, srv.URL())
	require.NoError(t, c.Do(context.Background(), "ACL", "SETUSER", "app", "on", ">secret", "~*", "&*", "+@all", "-info", "-config").Err())
	url := "redis://app:secret@" + srv.Addr() + "/0"
	p := startSvc(t, "api", map[string]string{"REDIS_URL": url, "REDIS_CHECK_INTERVAL": "100ms"})
	require.Eventually(t, func() bool { code, _ := faultGet(t, p.base+"/readyz"); return code == http.StatusOK }, 10*time.Second, 20*time.Millisecond)
	time.Sleep(300 * time.Millisecond) // a few checks
	assert.Equal(t, 1, p.logs.count("cannot read Redis's maxmemory-policy"), "said once")
	code, body := faultGet(t, p.base+"/metrics")
	require.Equal(t, http.StatusOK, code)
	assert.NotContains(t, body, "checkins_redis_used_memory_bytes", "nothing to report, nothing made up")
	assert.NotContains(t, body, "checkins_redis_keys", "nor keys")
}

// TestResourceMetricsShowRedisMemory: /metrics has used_memory, maxmemory and the policy, and
// the keys of the service's database with how many of them expire (counted here by SCAN and
// PTTL), whose growth with the idempotency records makes every lookup dearer.
func TestResourceMetricsShowRedisMemory(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t, redistest.Options{Args: []string{"--maxmemory", "64mb"}})
	c := redistest.Client(t, srv.URL())
	ctx := context.Background()
	p := startSvc(t, "api", map[string]string{"REDIS_URL": srv.URL()})
	for i := range 7 {
		ttl := time.Duration(0)
		if i < 4 {
			ttl = time.Hour
		}
		require.NoError(t, c.Set(ctx, fmt.Sprintf("other:%d", i), "v", ttl).Err())
	}
	count := func() (keys, expiring int) {
		iter := c.Scan(ctx, 0, "*", 100).Iterator()
		for iter.Next(ctx) {
			keys++
			if ttl, err := c.PTTL(ctx, iter.Val()).Result(); err == nil && ttl > 0 {
				expiring++
			}
		}
		require.NoError(t, iter.Err())
		return keys, expiring
	}
	var body string
	if !assert.Eventually(t, func() bool {
		var code int
		code, body = faultGet(t, p.base+"/metrics")
		keys, expiring := count()
		return code == http.StatusOK && keys >= 7 && expiring >= 4 &&
			strings.Contains(body, fmt.Sprintf("\ncheckins_redis_keys %d\n", keys)) &&
			strings.Contains(body, fmt.Sprintf("\ncheckins_redis_expiring_keys %d\n", expiring))
	}, 10*time.Second, 50*time.Millisecond) {
		t.Fatalf("the key gauges never matched SCAN and PTTL; the last metrics:\n%s", body)
	}
	assert.Regexp(t, `(?m)^checkins_redis_used_memory_bytes [1-9][0-9.e+]*$`, body)
	assert.Contains(t, body, "checkins_redis_maxmemory_bytes 6.7108864e+07")
	assert.Contains(t, body, `checkins_redis_maxmemory_policy{policy="noeviction"} 1`)
}

// TestResourceStartDuringOOMBecomesReadyByItself: serve started while Redis refuses writes runs,
// is not ready saying why, answers 503 to check-ins, keeps status, poison list and metrics
// working, and once memory is freed becomes ready by itself and counts every check-in.
func TestResourceStartDuringOOMBecomesReadyByItself(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t, redistest.Options{Args: []string{"--enable-debug-command", "yes"}})
	c := redistest.Client(t, srv.URL())
	keys := adapters.KeySpace{Prefix: "checkins"}
	fillToLimit(t, c)
	env := map[string]string{"REDIS_URL": srv.URL(), "PROJECTION_POLL_INTERVAL": "200ms"}
	p := startSvc(t, "serve", env)
	require.Eventually(t, func() bool {
		code, body := faultGet(t, p.base+"/readyz")
		return code == http.StatusServiceUnavailable && strings.Contains(body, "redis out of memory")
	}, 10*time.Second, 20*time.Millisecond, "not ready, and why")

	l := newLedger()
	client := authedClient(5 * time.Second)
	l.post(client, p.base, "oom-1", sent{user: 1, location: 1, stars: 4})
	_, codes, _, _ := l.stats()
	assert.Equal(t, 1, codes[http.StatusServiceUnavailable], "a check-in Redis cannot store is a 503")
	for _, args := range [][]string{{"status"}, {"status", "--json"}, {"poison", "list"}, {"projections", "list"}} {
		code, stdout, stderr := runOps(t, env, args...)
		assert.Zero(t, code, "checkins %v under OOM: %s%s", args, stdout, stderr)
	}
	code, body := faultGet(t, p.base+"/metrics")
	assert.Equal(t, http.StatusOK, code)
	assert.Contains(t, body, "checkins_redis_up 1")

	// Memory is freed: everything resumes with no manual step.
	require.NoError(t, c.ConfigSet(context.Background(), "maxmemory", "0").Err())
	require.Eventually(t, func() bool { code, _ := faultGet(t, p.base+"/readyz"); return code == http.StatusOK }, 20*time.Second, 50*time.Millisecond)
	for i := range 20 {
		l.post(client, p.base, "after-"+strconv.Itoa(i), sent{user: 1 + int64(i%3), location: 1 + int64(i%2), stars: int64(i % 6)})
	}
	l.resolve(t, p.base)
	l.verify(t, p.base)
	l.verifyAll(t, srv.URL(), keys)
	assert.Zero(t, poisonLen(t, c, keys), "nothing parked")
}

// TestResourceMemoryHoveringAtTheLimitCostsNoCount: Redis at maxmemory with noeviction while
// idempotency keys expire, so that memory hovers at the limit and writes fail now and then,
// under load. Nothing valid is parked, and once the limit is raised every read model is exact
// with no manual replay.
func TestResourceMemoryHoveringAtTheLimitCostsNoCount(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t, redistest.Options{})
	c := redistest.Client(t, srv.URL())
	ctx := context.Background()
	keys := adapters.KeySpace{Prefix: "checkins"}
	p := startSvc(t, "serve", map[string]string{"REDIS_URL": srv.URL(), "IDEMPOTENCY_TTL": "1s", "REQUEST_TIMEOUT": "900ms", "RETRY_MAX_ATTEMPTS": "2",
		"RETRY_INITIAL_INTERVAL": "10ms", "NACK_DELAY": "50ms"})
	l := newLedger()
	lctx, stop := context.WithCancel(ctx)
	defer stop()
	wait := l.load(lctx, 4, "hover", func() string { return p.base }, 5*time.Second)
	l.waitFor(t, 200)
	m, err := adapters.ReadMemoryInfo(ctx, c)
	require.NoError(t, err)
	require.NoError(t, c.ConfigSet(ctx, "maxmemory", strconv.FormatInt(m.Used+512<<10, 10)).Err())
	oomSeen := func() bool {
		info, err := c.Info(ctx, "stats").Result()
		require.NoError(t, err)
		return !strings.Contains(info, "total_error_replies:0\r")
	}
	// Hover: the stream grows, idempotency keys expire (1s) and free room, writes fail now and then.
	// At least 8 s; on a loaded machine the 512 KiB fill slowly, so go on (up to 60 s) until a
	// check-in has met the limit.
	limitMet := func() bool { _, codes, _, _ := l.stats(); return codes[http.StatusServiceUnavailable] > 0 }
	start := time.Now()
	for time.Since(start) < 8*time.Second || (!limitMet() && time.Since(start) < 60*time.Second) {
		time.Sleep(200 * time.Millisecond)
	}
	_, codes, _, _ := l.stats()
	t.Logf("answers while hovering: %v", codes)
	assert.True(t, oomSeen(), "redis must have refused writes while hovering")
	assert.Positive(t, codes[http.StatusServiceUnavailable], "some check-ins must have met the limit")
	assert.Zero(t, poisonLen(t, c, keys), "a full Redis is not the events' fault: nothing parked")
	stop()
	wait()
	require.NoError(t, c.ConfigSet(ctx, "maxmemory", "0").Err())
	l.resolve(t, p.base)
	l.verify(t, p.base)
	l.verifyAll(t, srv.URL(), keys)
	l.inStream(t, c, keys)
	assert.Zero(t, poisonLen(t, c, keys), "nothing parked")
	assert.Zero(t, p.logs.count("event parked in poison queue"))
}

// verifyAll compares all five read models with the check-ins the API accepted, through the
// bench's independent computation.
func (l *ledger) verifyAll(t *testing.T, url string, keys adapters.KeySpace) {
	t.Helper()
	ctx := context.Background()
	v := newVerifier(t, url)
	defer v.Close()
	want := l.acceptedCheckins(t)
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		ok, detail, err := v.Verify(ctx, keys, want)
		require.NoError(c, err)
		assert.True(c, ok, detail)
	}, 30*time.Second, 500*time.Millisecond)
}

// verifyOnce compares every read model with the check-ins that got a 2xx once, as they are now.
func (l *ledger) verifyOnce(t *testing.T, url string, keys adapters.KeySpace) (exact bool, detail string) {
	t.Helper()
	ctx := context.Background()
	v := newVerifier(t, url)
	defer v.Close()
	exact, detail, err := v.Verify(ctx, keys, l.acceptedCheckins(t))
	require.NoError(t, err)
	return exact, detail
}

// newVerifier is the bench's verifier of the read models on url; the caller closes it.
func newVerifier(t *testing.T, url string) *bench.Verifier {
	t.Helper()
	cfg, _, err := parseConfig(flag.NewFlagSet("test", flag.ContinueOnError), nil, envWith(map[string]string{"REDIS_URL": url, "PROJECTIONS": ""}))
	require.NoError(t, err)
	v, err := bench.NewVerifier(context.Background(), benchHost(), benchConfig(cfg))
	require.NoError(t, err)
	return v
}

// acceptedCheckins are the check-ins that got a 2xx.
func (l *ledger) acceptedCheckins(t *testing.T) []domain.Checkin {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	var want []domain.Checkin
	for id := range l.ok {
		c, ok := l.accepted[id]
		require.True(t, ok, "the 2xx of %s carried its check-in", id)
		want = append(want, c)
	}
	return want
}

// TestResourceBusyScriptsCostNoCount: another client's long script makes Redis answer BUSY to
// everyone for a while, again and again, under load. BUSY is Redis being busy, not the event's
// fault: nothing is parked, and every read model comes out exact.
func TestResourceBusyScriptsCostNoCount(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t, redistest.Options{Args: []string{"--busy-reply-threshold", "50"}})
	c := redistest.Client(t, srv.URL())
	ctx := context.Background()
	keys := adapters.KeySpace{Prefix: "checkins"}
	p := startSvc(t, "serve", map[string]string{"REDIS_URL": srv.URL(), "RETRY_MAX_ATTEMPTS": "2",
		"RETRY_INITIAL_INTERVAL": "10ms", "NACK_DELAY": "50ms"})
	l := newLedger()
	lctx, stop := context.WithCancel(ctx)
	defer stop()
	wait := l.load(lctx, 4, "busy", func() string { return p.base }, 5*time.Second)
	l.waitFor(t, 100)
	// A read-only script spinning for 700 ms: past busy-reply-threshold every other client gets
	// BUSY until it ends.
	const spin = `local t0 = redis.call('TIME') local s = t0[1] * 1000000 + t0[2]
while true do local t = redis.call('TIME') if t[1] * 1000000 + t[2] - s > 700000 then return 1 end end`
	other := redistest.Client(t, srv.URL())
	for range 4 {
		require.NoError(t, other.Eval(ctx, spin, nil).Err())
		time.Sleep(300 * time.Millisecond)
	}
	stop()
	wait()
	info, err := c.Info(ctx, "errorstats").Result()
	require.NoError(t, err)
	assert.Contains(t, info, "errorstat_BUSY", "redis must have answered BUSY")
	l.resolve(t, p.base)
	l.verify(t, p.base)
	l.verifyAll(t, srv.URL(), keys)
	assert.Zero(t, poisonLen(t, c, keys), "nothing parked")
	assert.Zero(t, p.logs.count("event parked in poison queue"))
}
