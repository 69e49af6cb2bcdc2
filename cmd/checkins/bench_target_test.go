package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"os/exec"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/checkins/checkins/adapters/redistest"
	"github.com/checkins/checkins/cmd/checkins/bench"
)

// startBinary runs the real binary until the test ends; it returns its stderr as it comes.
func startBinary(t *testing.T, env map[string]string, args ...string) *cliLogLines {
	t.Helper()
	logs, _ := startBinaryCmd(t, env, args...)
	return logs
}

// startBinaryCmd is startBinary that also returns the process, for a test that kills it.
func startBinaryCmd(t *testing.T, env map[string]string, args ...string) (*cliLogLines, *exec.Cmd) {
	t.Helper()
	cmd := exec.Command(checkinsBinary(t), args...)
	cmd.Env = cliEnv(env)
	stderr, err := cmd.StderrPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	exited := make(chan struct{})
	var logs cliLogLines
	go func() {
		logs.scan(bufio.NewScanner(stderr))
		_ = cmd.Wait()
		close(exited)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
	})
	return &logs, cmd
}

// startTargetServe runs `checkins serve` as an operator would (its own process, default
// settings but the per-address limit, which one load generator's address would hit) on url's
// Redis under prefix; it returns the API's base URL and the ops listener's.
func startTargetServe(t *testing.T, url, prefix string) (base, ops string) {
	t.Helper()
	logs := startBinary(t, map[string]string{"REDIS_URL": url, "KEY_PREFIX": prefix, "RATE_LIMIT_IP": "off",
		"HTTP_ADDR": "127.0.0.1:0", "OPS_ADDR": "localhost:0", "LOG_LEVEL": "info"}, "serve") // another address: a listener of its own
	base = apiBase(t, logs)
	m, _ := logs.find("http listening")
	addr, _ := m["ops_addr"].(string)
	require.NotEmpty(t, addr, "ops_addr of %v", m)
	return base, "http://" + addr
}

// TestBenchSustainedAgainstTarget: with --target and --baseline-target the bench measures a
// serve and a bare XADD handler that run in processes of their own, as an operator measures the
// service as deployed. Sustained waits until the target's projections have caught up and
// compares its read models with a computation from its whole stream, here including what
// another producer added before the run: a check-in, and a copy of it recorded more than
// DEDUPE_WINDOW later, which the projections count again. A consumer group nobody reads is
// named, not waited for.
func TestBenchSustainedAgainstTarget(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t, redistest.Options{})
	rc := redistest.Client(t, srv.URL())
	ctx := context.Background()
	at := time.Now().Add(-48 * time.Hour).UnixMilli()
	for _, id := range []string{strconv.FormatInt(at, 10) + "-0", strconv.FormatInt(at+25*3600*1000, 10) + "-0"} {
		require.NoError(t, rc.XAdd(ctx, &redis.XAddArgs{Stream: "target:events", ID: id, Values: []any{
			"type", "checkin.recorded.v1", "checkinId", "from-elsewhere", "userId", "3", "locationId", "4",
			"starRating", "5", "timestamp", strconv.FormatInt(at, 10), "recordedAt", strconv.FormatInt(at, 10)}}).Err())
	}
	require.NoError(t, rc.XGroupCreate(ctx, "target:events", "live:users", "$").Err(), "a group left by an older PROJECTIONS list")
	base, ops := startTargetServe(t, srv.URL(), "target")
	stats := "target:p:users:v1:{user:3}:stats"
	require.Eventually(t, func() bool { return rc.HGet(ctx, stats, "numCheckins").Val() == "2" }, 30*time.Second, 20*time.Millisecond,
		"the target counts the copy beyond the window again")

	baseline := startBinary(t, map[string]string{"REDIS_URL": srv.URL(), "KEY_PREFIX": "target"}, "bench", "--serve-baseline", "127.0.0.1:0")
	served := regexp.MustCompile(`serves (http://127\.0\.0\.1:\d+)/checkins, one XADD each to target-baseline:events`)
	var baseURL string
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		m := served.FindStringSubmatch(baseline.String())
		if assert.NotNil(c, m, "no address printed yet") {
			baseURL = m[1]
		}
	}, 30*time.Second, 20*time.Millisecond, "stderr so far:\n%s", baseline)

	code, stdout, stderr := runCLI(t, map[string]string{"REDIS_URL": srv.URL(), "KEY_PREFIX": "target", "LOG_LEVEL": "warn"},
		"bench", "--json", "--phases", "ingest,ingest-baseline,sustained", "--target", base, "--baseline-target", baseURL,
		"--target-metrics", ops+"/metrics", "--duration", "400ms", "--clients", "4")
	require.Equal(t, 0, code, "stderr:\n%s", stderr)
	var res bench.BenchResult
	require.NoError(t, json.Unmarshal([]byte(stdout), &res), stdout)
	byPhase := map[string]bench.PhaseResult{}
	for _, p := range res.Phases {
		byPhase[p.Phase] = p
		assert.Equal(t, bench.CheckOK, p.Check, "%s: %s", p.Phase, p.CheckDetail)
		assert.Empty(t, p.CheckDetail, p.Phase)
		assert.Positive(t, p.Count, p.Phase)
		// The CPU of the process at --target (its /metrics) and --baseline-target (--serve-baseline's).
		if assert.NotNil(t, p.ServiceCPUSeconds, p.Phase) {
			assert.Positive(t, *p.ServiceCPUSeconds, p.Phase)
			assert.Contains(t, p.Note, "the service's process used", p.Phase)
		}
	}
	require.ElementsMatch(t, []string{bench.PhaseIngest, bench.PhaseIngestBaseline, bench.PhaseSustained}, keysOf(byPhase))
	require.NotNil(t, byPhase[bench.PhaseSustained].VsBaseline, "sustained is held against the external baseline")
	assert.Contains(t, byPhase[bench.PhaseSustained].Note, "not waited for: consumer groups no consumer reads (live:users;")
	assert.Equal(t, base, res.Settings.Target)
	assert.Equal(t, baseURL, res.Settings.BaselineTarget)
	// What an answer cost in CPU counts both external processes' CPU.
	if assert.Len(t, res.Costs, 3) {
		for i, p := range []string{bench.PhaseIngestBaseline, bench.PhaseIngest, bench.PhaseSustained} {
			c := res.Costs[i]
			assert.Equal(t, p, c.Phase)
			if assert.NotNil(t, c.Service, p) {
				assert.InDelta(t, c.Process+c.Redis+*c.Service, c.Micros, 1e-6, p)
				assert.InDelta(t, *byPhase[p].ServiceCPUSeconds*1e6/float64(byPhase[p].Count), *c.Service, 1e-6, p)
			}
			assert.Equal(t, i > 0, c.Allows != nil, p)
		}
	}
	// The read models were checked against everything on the stream: the other producer's
	// check-in and its copy (one identity), ingest's and sustained's (warm-up requests
	// included, which the counts leave out).
	n, err := rc.XLen(ctx, "target:events").Result()
	require.NoError(t, err)
	assert.GreaterOrEqual(t, n, 2+byPhase[bench.PhaseIngest].Count+byPhase[bench.PhaseSustained].Count, "the target keeps its events")
	assert.Contains(t, stderr, "checked the read models of target against "+strconv.FormatInt(n-1, 10)+" check-ins")

	n, err = rc.XLen(ctx, "target-baseline:events").Result()
	require.NoError(t, err)
	assert.GreaterOrEqual(t, n, byPhase[bench.PhaseIngestBaseline].Count, "the external baseline wrote to its stream")
}

// A target whose read models differ from what its stream says fails the sustained check, naming
// the projection and the entity.
func TestBenchSustainedAgainstTargetFindsWrongReadModels(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t, redistest.Options{})
	rc := redistest.Client(t, srv.URL())
	ctx := context.Background()
	require.NoError(t, rc.XAdd(ctx, &redis.XAddArgs{Stream: "target:events", Values: []any{
		"type", "checkin.recorded.v1", "checkinId", "from-elsewhere", "userId", "3", "locationId", "4",
		"starRating", "5", "timestamp", "1700000000000", "recordedAt", "1700000000000"}}).Err())
	base, _ := startTargetServe(t, srv.URL(), "target")
	stats := "target:p:users:v1:{user:3}:stats"
	require.Eventually(t, func() bool { return rc.HGet(ctx, stats, "numCheckins").Val() == "1" }, 30*time.Second, 20*time.Millisecond,
		"the target projects the entry into %s", stats)
	// Not what the stream says: user 3 has one check-in there.
	require.NoError(t, rc.HIncrBy(ctx, stats, "numCheckins", 1).Err())

	code, _, stderr := runCLI(t, map[string]string{"REDIS_URL": srv.URL(), "KEY_PREFIX": "target", "LOG_LEVEL": "warn"},
		"bench", "--phases", "sustained", "--target", base, "--duration", "300ms", "--clients", "2")
	assert.Equal(t, 1, code, stderr)
	assert.Contains(t, stderr, "sustained check failed")
	assert.Contains(t, stderr, "users 1 (user 3: numCheckins")
}

// The read models of a target cannot be computed from its stream when RETENTION trimmed it or
// when events were parked in its poison queue: sustained still measures and checks the stream's
// growth, and says why it did not compare them.
func TestBenchSustainedAgainstTargetSaysWhyItDidNotCompare(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, want string
		setup      func(ctx context.Context, rc *redis.Client) error
	}{
		{"trimmed", "read models not compared: target:events holds 2 fewer entries than were ever added to it (trimmed or deleted)",
			func(ctx context.Context, rc *redis.Client) error {
				return rc.XTrimMaxLen(ctx, "target:events", 1).Err()
			}},
		{"poisoned", "read models not compared: the target's poison queue target:events:poison holds 1 entries",
			func(ctx context.Context, rc *redis.Client) error {
				return rc.XAdd(ctx, &redis.XAddArgs{Stream: "target:events:poison", Values: []any{"type", "nonsense"}}).Err()
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			srv := redistest.Start(t, redistest.Options{})
			rc := redistest.Client(t, srv.URL())
			ctx := context.Background()
			for i := range 3 {
				require.NoError(t, rc.XAdd(ctx, &redis.XAddArgs{Stream: "target:events", Values: []any{
					"type", "checkin.recorded.v1", "checkinId", "c" + strconv.Itoa(i), "userId", "3", "locationId", "4",
					"starRating", "5", "timestamp", "1700000000000", "recordedAt", "1700000000000"}}).Err())
			}
			base, _ := startTargetServe(t, srv.URL(), "target")
			stats := "target:p:users:v1:{user:3}:stats"
			require.Eventually(t, func() bool { return rc.HGet(ctx, stats, "numCheckins").Val() == "3" }, 30*time.Second, 20*time.Millisecond)
			require.NoError(t, tc.setup(ctx, rc))

			code, stdout, stderr := runCLI(t, map[string]string{"REDIS_URL": srv.URL(), "KEY_PREFIX": "target", "LOG_LEVEL": "warn"},
				"bench", "--json", "--phases", "sustained", "--target", base, "--duration", "300ms", "--clients", "2")
			require.Equal(t, 0, code, stderr)
			var res bench.BenchResult
			require.NoError(t, json.Unmarshal([]byte(stdout), &res), stdout)
			require.Len(t, res.Phases, 1)
			p := res.Phases[0]
			assert.Equal(t, bench.CheckOK, p.Check, p.CheckDetail)
			assert.Contains(t, p.CheckDetail, tc.want)
			assert.Positive(t, p.Count)
		})
	}
}

// Sustained against a target needs the target's Redis: without REDIS_URL the bench says so
// before it sends anything. --serve-baseline needs REDIS_URL too and runs no phase.
func TestBenchSustainedTargetNeedsRedisURL(t *testing.T) {
	t.Parallel()
	code, stdout, stderr := runCLI(t, map[string]string{"REDIS_URL": ""}, "bench", "--phases", "sustained", "--target", "http://127.0.0.1:1")
	assert.Equal(t, 1, code)
	assert.Contains(t, stderr, "invalid --target: sustained tells when the target's projections have caught up from its Redis; set REDIS_URL and KEY_PREFIX")
	assert.Empty(t, stdout)
	code, _, stderr = runCLI(t, map[string]string{"REDIS_URL": ""}, "bench", "--serve-baseline", "127.0.0.1:0")
	assert.Equal(t, 1, code)
	assert.Contains(t, stderr, "invalid --serve-baseline: set REDIS_URL")
	code, _, stderr = runCLI(t, map[string]string{"REDIS_URL": "redis://127.0.0.1:1/0"}, "bench", "--serve-baseline", "127.0.0.1:0", "--phases", "ingest", "--json")
	assert.Equal(t, 1, code)
	assert.Contains(t, stderr, "invalid --serve-baseline: it serves the baseline handler and runs no phase, so --json, --phases would not apply")
	code, _, stderr = runCLI(t, map[string]string{"REDIS_URL": "redis://127.0.0.1:1/0"}, "bench", "--target-metrics", "http://127.0.0.1:8081/metrics")
	assert.Equal(t, 1, code)
	assert.Contains(t, stderr, `invalid --target-metrics: must be the URL of --target's /metrics, like http://127.0.0.1:8081/metrics, with --target; got "http://127.0.0.1:8081/metrics"`)
	code, _, stderr = runCLI(t, map[string]string{"REDIS_URL": "redis://127.0.0.1:1/0"}, "bench", "--baseline-target", "127.0.0.1:8081")
	assert.Equal(t, 1, code)
	assert.Contains(t, stderr, `invalid --baseline-target: must be a base URL like http://127.0.0.1:8081, got "127.0.0.1:8081"`)
}

// A target that stops during sustained (here killed with SIGKILL while the load runs) ends the
// load and fails the phase with the reason at once: without the watch the bench posted to the
// dead address until --duration was over, then waited out its 30s stall.
func TestBenchSustainedTargetThatStops(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t, redistest.Options{})
	rc := redistest.Client(t, srv.URL())
	logs, serve := startBinaryCmd(t, map[string]string{"REDIS_URL": srv.URL(), "KEY_PREFIX": "target", "RATE_LIMIT_IP": "off",
		"HTTP_ADDR": "127.0.0.1:0", "LOG_LEVEL": "info"}, "serve")
	base := apiBase(t, logs)

	cmd := exec.Command(checkinsBinary(t), "bench", "--phases", "sustained", "--target", base, "--duration", "2m", "--clients", "2")
	cmd.Env = cliEnv(map[string]string{"REDIS_URL": srv.URL(), "KEY_PREFIX": "target", "LOG_LEVEL": "warn"})
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	require.NoError(t, cmd.Start())
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() { _ = cmd.Process.Kill() })

	ctx := context.Background()
	require.Eventually(t, func() bool { return rc.XLen(ctx, "target:events").Val() > 0 }, 30*time.Second, 20*time.Millisecond,
		"the load reaches the target")
	require.NoError(t, serve.Process.Kill())
	select {
	case err := <-exited:
		var exit *exec.ExitError
		require.ErrorAs(t, err, &exit, "stderr:\n%s", &stderr)
		assert.Equal(t, 1, exit.ExitCode())
		assert.Contains(t, stderr.String(), "the target "+base+" stopped answering (3 requests for /healthz in a row got no answer")
	case <-time.After(90 * time.Second): // far below the 2m load
		t.Fatalf("the bench still runs 90s after its target was killed; stderr:\n%s", &stderr)
	}
}

// TestBenchSustainedTargetThatParksIsAMismatch: with --target, when the target's projections
// fail on this run's own check-ins and park them in the poison queue, sustained reported them as
// fully projected (parked entries are acknowledged, so the groups look caught up) and its check
// was OK: a poison queue that is not empty only made it skip the read-model comparison.
func TestBenchSustainedTargetThatParksIsAMismatch(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t, redistest.Options{})
	rc := redistest.Client(t, srv.URL())
	ctx := context.Background()
	base, _ := startTargetServe(t, srv.URL(), "target")
	// Every user the load posts for (1..10,000) has a key of another type where the users
	// projection keeps its statistics: each of this run's check-ins fails there and is parked.
	pipe := rc.Pipeline()
	for u := 1; u <= 10000; u++ {
		pipe.Set(ctx, "target:p:users:v1:{user:"+strconv.Itoa(u)+"}:stats", "not a hash", 0)
	}
	_, err := pipe.Exec(ctx)
	require.NoError(t, err)
	before, err := rc.XLen(ctx, "target:events:poison").Result()
	require.NoError(t, err)
	require.Zero(t, before, "the poison queue is empty before the run")

	code, stdout, stderr := runCLI(t, map[string]string{"REDIS_URL": srv.URL(), "KEY_PREFIX": "target", "LOG_LEVEL": "warn"},
		"bench", "--json", "--phases", "sustained", "--target", base, "--duration", "1s", "--clients", "4")
	var res bench.BenchResult
	require.NoError(t, json.Unmarshal([]byte(stdout), &res), stdout+stderr)
	require.Len(t, res.Phases, 1)
	p := res.Phases[0]
	parked, err := rc.XLen(ctx, "target:events:poison").Result()
	require.NoError(t, err)
	t.Logf("exit %d; sustained %.0f %s over %.2fs, %d answers; poison queue %d entries; check %s: %s",
		code, p.Throughput, p.Unit, p.Seconds, p.Count, parked, p.Check, p.CheckDetail)
	require.Positive(t, parked, "this run's check-ins were parked")
	assert.Equal(t, bench.CheckMismatch, p.Check, "%d of this run's check-ins were parked, not projected, yet: %s", parked, p.CheckDetail)
}
