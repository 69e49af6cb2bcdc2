package main

// These tests are in package main because they drive run() itself, the whole `checkins bench`
// path (cmd/checkins/bench, wired by wire_bench.go) without building the binary; a main package
// cannot be imported by a _test package.

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"io"
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/checkins/checkins/adapters/redistest"
	"github.com/checkins/checkins/cmd/checkins/bench"
)

// envWith is the process environment with some variables replaced ("" hides one).
func envWith(over map[string]string) func(string) string {
	return func(k string) string {
		if v, ok := over[k]; ok {
			return v
		}
		if k == "STATE_DIR" {
			return testStateDir
		}
		return os.Getenv(k)
	}
}

func runBenchJSON(t *testing.T, getenv func(string) string, args ...string) bench.BenchResult {
	t.Helper()
	var stdout, stderr bytes.Buffer
	code := run(append([]string{"bench", "--json"}, args...), getenv, &stdout, &stderr)
	require.Equal(t, 0, code, "bench failed; stderr:\n%s", stderr.String())
	var res bench.BenchResult
	require.NoError(t, json.Unmarshal(stdout.Bytes(), &res), "stdout is not the JSON result:\n%s", stdout.String())
	return res
}

// A tiny run of every phase on a private redis-server (the default when REDIS_URL is unset)
// reports each phase with its figures and passes every exactness check.
func TestBenchEveryPhaseOnPrivateRedis(t *testing.T) {
	if !redistest.Available() {
		t.Fatal("redis-server not found in PATH; install Redis 7 (apt-get install redis-server)")
	}
	res := runBenchJSON(t, envWith(map[string]string{"REDIS_URL": "", "PROJECTIONS": ""}),
		"--duration", "1s", "--clients", "8", "--events", "2000", "--consumers", "1", "--rate", "200", "--memory-events", "300")

	assert.NotEmpty(t, res.Machine.RedisVersion)
	assert.Positive(t, res.Machine.NumCPU)
	assert.Contains(t, res.Machine.Redis, "private")
	assert.Equal(t, bench.ProjectionNames(allProjections(Config{})), res.Settings.Projections, "every shipped projection by default")
	byPhase := map[string]bench.PhaseResult{}
	var memory []bench.PhaseResult
	for _, p := range res.Phases {
		byPhase[p.Phase] = p
		if p.Phase == bench.PhaseMemory {
			memory = append(memory, p)
		}
		assert.Positive(t, p.Throughput, "%s throughput", p.Phase)
		assert.Positive(t, p.Count, "%s count", p.Phase)
		assert.Equal(t, bench.CheckOK, p.Check, "%s check: %s", p.Phase, p.CheckDetail)
		assert.Positive(t, p.PeakHeap, "%s peak heap", p.Phase)
		assert.Positive(t, p.CPUSeconds, "%s CPU", p.Phase)
		if _, err := os.Stat("/proc/self/status"); err == nil {
			assert.Positive(t, p.PeakRSS, "%s peak RSS", p.Phase)
		}
	}
	require.ElementsMatch(t, bench.PhaseOrder(), keysOf(byPhase))
	for _, p := range []string{bench.PhaseIngest, bench.PhaseIngestBaseline, bench.PhaseSustained, bench.PhaseE2E} {
		require.NotNil(t, byPhase[p].Latency, "%s latency", p)
		assert.Positive(t, byPhase[p].Latency.P99, "%s p99", p)
	}
	assert.EqualValues(t, 2000, byPhase[bench.PhaseDrain].Count)
	assert.Equal(t, 1, byPhase[bench.PhaseDrain].Consumers)
	assert.Equal(t, 1, byPhase[bench.PhaseDrainBaseline].Consumers)
	require.NotNil(t, byPhase[bench.PhaseIngest].VsBaseline)
	require.NotNil(t, byPhase[bench.PhaseDrain].VsBaseline)
	assert.Positive(t, *byPhase[bench.PhaseDrain].VsBaseline)
	require.NotNil(t, byPhase[bench.PhaseE2E].PostLatency)
	// What an answer cost in CPU: in-process, this process's and Redis's.
	if assert.Len(t, res.Costs, 3) {
		for i, p := range []string{bench.PhaseIngestBaseline, bench.PhaseIngest, bench.PhaseSustained} {
			c := res.Costs[i]
			assert.Equal(t, p, c.Phase)
			assert.Nil(t, c.Service, "%s: no process of its own", p)
			assert.InDelta(t, (byPhase[p].CPUSeconds+byPhase[p].RedisCPUSeconds)*1e6/float64(byPhase[p].Count), c.Micros, 1e-6, p)
			if i > 0 && assert.NotNil(t, c.Allows, p) {
				assert.InDelta(t, res.Costs[0].Micros/c.Micros, *c.Allows, 1e-9, p)
			}
		}
	}

	sustained := byPhase[bench.PhaseSustained]
	require.NotNil(t, sustained.VsBaseline, "sustained is held against ingest-baseline")
	assert.Positive(t, *sustained.VsBaseline)
	require.NotNil(t, sustained.Backlog)
	assert.Len(t, sustained.Backlog.Groups, 1, "one group, the live group, feeds every projection")
	assert.GreaterOrEqual(t, sustained.Backlog.EntriesBehind, int64(0))
	assert.Contains(t, sustained.Note, "entries behind")
	assert.Contains(t, sustained.Note, "caught up")

	require.Len(t, memory, 2, "one memory row for N and one for 2N")
	for i, p := range memory {
		m := p.Memory
		require.NotNil(t, m, "memory figures of run %d", i)
		assert.Equal(t, 300<<i, m.Events)
		assert.Less(t, m.Checkins, m.Events, "1%% of the entries republish a check-in")
		assert.LessOrEqual(t, m.Users, 200, "a fixed population")
		assert.LessOrEqual(t, m.Locations, 50)
		assert.Positive(t, m.Users)
		assert.Positive(t, m.StreamBytes)
		assert.Positive(t, m.ProjectionBytes)
		assert.Positive(t, m.PerKeyBytes)
		assert.Positive(t, m.BytesPerCheckin)
		assert.Equal(t, bench.FigureUsedMemory, m.Figure, "a private server measures used_memory")
		// After the other phases too (their keys are gone before it starts): 118 and 162 KiB
		// against the keys' 105 and 149 KiB (one run read -134 and -280 KiB while those keys
		// stayed, their table rehashing under the phase; not every run does).
		assert.InEpsilon(t, float64(m.PerKeyBytes), float64(m.ProjectionBytes), 0.25,
			"run %d: used_memory's difference %d B against the keys' %d B", i, m.ProjectionBytes, m.PerKeyBytes)
		assert.Zero(t, m.IdempotencyBytes)
		owners := map[string]bool{}
		for _, g := range m.Breakdown {
			owners[g.Owner] = true
			assert.Equal(t, g.Owner == "dedupe" || g.Kind == "seen", g.Bookkeeping, "%s %s", g.Owner, g.Kind)
		}
		for _, name := range res.Settings.Projections {
			assert.True(t, owners[name], "breakdown of run %d names projection %s", i, name)
		}
	}
	assert.Nil(t, memory[0].Memory.GrowthPct)
	require.NotNil(t, memory[1].Memory.GrowthPct, "the 2N run reports the growth from N")
	assert.Contains(t, memory[1].Note, "growth from N=300")
	assert.Regexp(t, `growth from N=300: [+-]\d+\.\d% \(by used_memory\), [+-]\d+\.\d% by the keys' MEMORY USAGE`, memory[1].Note,
		"on a private server the keys' own growth is printed beside used_memory's")
}

// The memory phase's used_memory figure is what the projections' keys hold, not Redis's own
// bookkeeping: run first on a fresh server, it still agrees with the sum of the keys' MEMORY
// USAGE (Redis 7 allocates a latency histogram of about 25 KiB per command the first time it
// runs: 922 KiB against the keys' 265 KiB here before the bench freed them; the clients'
// buffers come and go too). What stays between the two is the scripts and the keyspace's
// table, about 21 KiB (286 KiB).
func TestBenchMemoryFigureIsTheKeys(t *testing.T) {
	if !redistest.Available() {
		t.Fatal("redis-server not found in PATH; install Redis 7 (apt-get install redis-server)")
	}
	res := runBenchJSON(t, envWith(map[string]string{"REDIS_URL": "", "PROJECTIONS": ""}), "--phases", "memory", "--memory-events", "2000")
	require.Len(t, res.Phases, 2)
	m := res.Phases[0].Memory
	require.NotNil(t, m)
	require.Equal(t, bench.FigureUsedMemory, m.Figure)
	assert.InEpsilon(t, float64(m.PerKeyBytes), float64(m.ProjectionBytes), 0.15,
		"used_memory's difference %d B against the keys' %d B", m.ProjectionBytes, m.PerKeyBytes)
}

// On a shared Redis (REDIS_URL) the bench keeps to its own bench-<random> keys and deletes them
// all at the end, leaving everything else alone; the table names both consumer counts, and the
// memory phase measures by the per-key sum.
func TestBenchOnSharedRedisDeletesOnlyItsKeys(t *testing.T) {
	srv := redistest.Start(t, redistest.Options{})
	client := redistest.Client(t, srv.URL())
	ctx := context.Background()
	require.NoError(t, client.Set(ctx, "someone-else:key", "kept", 0).Err())

	var stdout, stderr bytes.Buffer
	code := run([]string{"bench", "--phases", "ingest,drain,memory", "--duration", "300ms", "--clients", "4",
		"--events", "500", "--consumers", "1,2", "--memory-events", "200"}, envWith(map[string]string{"REDIS_URL": srv.URL(), "PROJECTIONS": ""}), &stdout, &stderr)
	require.Equal(t, 0, code, "bench failed; stderr:\n%s", stderr.String())

	out := stdout.String()
	assert.Contains(t, out, "redis "+redistestVersion(t, srv.URL()))
	assert.Regexp(t, `(?m)^\s*ingest\s+-\s+\d+\s+req/s`, out)
	assert.Regexp(t, `(?m)^\s*drain\s+1\s+\d+\s+events/s`, out)
	assert.Regexp(t, `(?m)^\s*drain\s+2\s+\d+\s+events/s`, out)
	assert.Regexp(t, `(?m)^\s*memory N=200\s+-\s+\d+\s+B/checkin`, out)
	assert.Regexp(t, `(?m)^\s*memory N=400\s+-\s+\d+\s+B/checkin`, out)
	assert.Contains(t, out, "growth from N=200")
	assert.Contains(t, out, "(by per_key)")
	assert.Regexp(t, `(?m)^\s+users\s+[0-9.]+ [KM]?i?B: `, out, "the breakdown after the table")
	assert.NotContains(t, out, bench.CheckMismatch)

	keys, err := client.Keys(ctx, "*").Result()
	require.NoError(t, err)
	assert.Equal(t, []string{"someone-else:key"}, keys, "the bench must delete its keys and only its keys")
}

// --preload-records fills Redis, before the first phase, with idempotency records as the API
// stores them (compact, under the keys the service uses, expiring within IDEMPOTENCY_TTL),
// reports how many keys and how much memory they added, and deletes them with its other keys.
func TestBenchPreloadsIdempotencyRecords(t *testing.T) {
	srv := redistest.Start(t, redistest.Options{})
	client := redistest.Client(t, srv.URL())
	ctx := context.Background()

	type seen struct {
		key, value string
		ttl        time.Duration
	}
	found := make(chan seen, 1)
	stop := make(chan struct{})
	go func() { // a record, read while the ingest phase runs
		for {
			select {
			case <-stop:
				return
			case <-time.After(10 * time.Millisecond):
			}
			keys, _, err := client.Scan(ctx, 0, "bench-*-records:idem:*", 1000).Result()
			if err != nil || len(keys) == 0 {
				continue
			}
			v, err := client.Get(ctx, keys[0]).Result()
			ttl, terr := client.PTTL(ctx, keys[0]).Result()
			if err == nil && terr == nil {
				found <- seen{keys[0], v, ttl}
				return
			}
		}
	}()
	res := runBenchJSON(t, envWith(map[string]string{"REDIS_URL": srv.URL(), "PROJECTIONS": "", "IDEMPOTENCY_TTL": "24h"}),
		"--phases", "ingest", "--duration", "2s", "--clients", "4", "--preload-records", "5000")
	close(stop)

	assert.Equal(t, 5000, res.Settings.PreloadRecords)
	require.NotNil(t, res.Records)
	assert.Equal(t, 5000, res.Records.Records)
	assert.EqualValues(t, 5000, res.Records.Keys, "one key per record")
	assert.InDelta(t, 230, res.Records.BytesPerRecord, 130, "used_memory per record")
	assert.Equal(t, 86400.0, res.Records.TTLSeconds)
	require.Len(t, res.Phases, 1)
	assert.Equal(t, bench.CheckOK, res.Phases[0].Check, res.Phases[0].CheckDetail)
	select {
	case r := <-found:
		assert.Regexp(t, `^bench-[0-9a-f]+-records:idem:\{user:\d+\}:[0-9a-f-]{36}$`, r.key)
		require.GreaterOrEqual(t, len(r.value), 3)
		assert.Equal(t, "P\x01", r.value[:2], "published, compact: %q", r.value)
		assert.Positive(t, r.ttl)
		assert.LessOrEqual(t, r.ttl, 24*time.Hour)
	default:
		t.Fatal("no preloaded record was seen during the run")
	}
	keys, err := client.Keys(ctx, "*").Result()
	require.NoError(t, err)
	assert.Empty(t, keys, "the records are deleted with the run's other keys")
}

// With a subset of projections the services run only those, and the checks cover only those;
// e2e watches recent_checkins when users is not selected.
func TestBenchSubsetOfProjections(t *testing.T) {
	if !redistest.Available() {
		t.Fatal("redis-server not found in PATH; install Redis 7 (apt-get install redis-server)")
	}
	res := runBenchJSON(t, envWith(map[string]string{"REDIS_URL": ""}), "--projections", "recent_checkins,leaderboards",
		"--phases", "sustained,drain,e2e", "--duration", "300ms", "--clients", "4", "--events", "500", "--consumers", "1", "--rate", "100")

	assert.Equal(t, []string{"leaderboards", "recent_checkins"}, res.Settings.Projections, "in the order they ship")
	require.Len(t, res.Phases, 3)
	for _, p := range res.Phases {
		assert.Equal(t, bench.CheckOK, p.Check, "%s check: %s", p.Phase, p.CheckDetail)
		assert.Positive(t, p.Throughput, "%s throughput", p.Phase)
		if p.Phase == bench.PhaseSustained {
			require.NotNil(t, p.Backlog)
			assert.Len(t, p.Backlog.Groups, 1, "the selected projections share a live group of their own")
			assert.Nil(t, p.VsBaseline, "no ingest-baseline ran")
		}
		if p.Phase == bench.PhaseE2E {
			require.NotNil(t, p.Latency)
		}
	}
}

// The selection leaves the services without an explicit list when it is every shipped
// projection, as serve ships, whatever order or repetition it was given in.
// --target sends the ingest load to a running API and checks its stream (found through
// REDIS_URL and KEY_PREFIX); the target's data is not the bench's to delete.
func TestBenchIngestAgainstTarget(t *testing.T) {
	srv := redistest.Start(t, redistest.Options{})
	env := envWith(map[string]string{"REDIS_URL": srv.URL(), "KEY_PREFIX": "target", "LOG_LEVEL": "warn"})
	cfg, _, err := parseConfig(flag.NewFlagSet("test", flag.ContinueOnError), []string{"--http-addr", "127.0.0.1:0"}, env)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	svc, err := NewService(ctx, cfg, Mode{API: true}, newLogger(io.Discard, slog.LevelWarn))
	require.NoError(t, err)
	addr, err := svc.Listen()
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() { done <- svc.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })

	res := runBenchJSON(t, env, "--phases", "ingest", "--target", "http://"+addr.String()+"/", "--duration", "300ms", "--clients", "4")

	require.Len(t, res.Phases, 1)
	p := res.Phases[0]
	assert.Equal(t, bench.PhaseIngest, p.Phase)
	assert.Equal(t, bench.CheckOK, p.Check, p.CheckDetail)
	assert.Positive(t, p.Count)
	assert.Equal(t, "http://"+addr.String(), res.Settings.Target)
	n, err := redistest.Client(t, srv.URL()).XLen(context.Background(), "target:events").Result()
	require.NoError(t, err)
	assert.Positive(t, n, "the target's events stay")
}

func redistestVersion(t *testing.T, url string) string {
	t.Helper()
	info, err := redistest.Client(t, url).Info(context.Background(), "server").Result()
	require.NoError(t, err)
	return bench.InfoField(info, "redis_version")
}

// Bad flags fail before anything starts, with a message naming the flag and the problem.
func TestBenchRejectsBadFlags(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--phases", "ingest,warmup"}, `invalid --phases: unknown phase "warmup"`},
		{[]string{"--phases", ","}, "invalid --phases: no phase selected"},
		{[]string{"--consumers", "1,0"}, `invalid --consumers: each must be an integer from 1 to 64, got "0"`},
		{[]string{"--consumers", "two"}, `invalid --consumers: each must be an integer from 1 to 64, got "two"`},
		{[]string{"--rate", "0"}, "invalid --rate: must be above 0"},
		{[]string{"--duration", "1ms"}, "invalid --duration: must be at least 100ms"},
		{[]string{"--clients", "0"}, "invalid --clients: must be from 1 to 10000"},
		{[]string{"--events", "0"}, "invalid --events: must be from 1 to 10000000"},
		{[]string{"--memory-events", "10"}, "invalid --memory-events: must be from 100 to 10000000"},
		{[]string{"--preload-records", "-1"}, "invalid --preload-records: must be from 0 to 100000000, got -1"},
		{[]string{"--projections", "users,nearby"}, `invalid --projections (PROJECTIONS): unknown projection "nearby" (known: users, locations, leaderboards, recent_checkins, daily_checkins)`},
		{[]string{"--projections", "locations"}, "invalid --projections: e2e times a check-in until it is visible in users or recent_checkins"},
		{[]string{"--target", "localhost:8080"}, "invalid --target: must be a base URL like http://127.0.0.1:8080"},
		{[]string{"--subscriber", "fast"}, "invalid --subscriber (SUBSCRIBER): must be batched or watermill"},
		{[]string{"extra"}, "unexpected arguments: [extra]"},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			t.Parallel()
			var stdout, stderr bytes.Buffer
			code := run(append([]string{"bench"}, tc.args...), envWith(map[string]string{"REDIS_URL": "redis://127.0.0.1:1/0"}), &stdout, &stderr)
			assert.Equal(t, 1, code)
			assert.Contains(t, stderr.String(), tc.want)
			assert.Empty(t, stdout.String())
		})
	}
}

func keysOf[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}

// --help describes every phase and what --projections means in the bench.
func TestBenchHelp(t *testing.T) {
	t.Parallel()
	var stdout, stderr bytes.Buffer
	code := run([]string{"bench", "--help"}, envWith(nil), &stdout, &stderr)
	assert.Equal(t, 0, code)
	for _, p := range bench.PhaseOrder() {
		assert.Contains(t, stderr.String(), "\n  "+p+" ", "usage describes phase %s", p)
	}
	assert.Contains(t, stderr.String(), "default: every shipped projection: users,locations,leaderboards,recent_checkins,daily_checkins")
	assert.Contains(t, stderr.String(), "-memory-events")
}
