package bench

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/checkins/checkins/adapters"
	"github.com/checkins/checkins/adapters/redistest"
	"github.com/checkins/checkins/app/projection"
	"github.com/checkins/checkins/domain"
	"github.com/checkins/checkins/ports"
)

// testHost stands in for the binary where a test needs only its projections (the whole bench
// runs through the binary in cmd/checkins/bench_test.go): the shipped ones, with the default
// LEADERBOARD_MIN_CHECKINS.
func testHost() Host {
	shipped := func(Config) []projection.Projection {
		return []projection.Projection{projection.UserStats{}, projection.LocationStats{}, projection.Leaderboards{MinCheckins: 5},
			projection.RecentCheckins{}, projection.DailyCheckins{}}
	}
	return Host{Projections: shipped, NewLogger: func(w io.Writer, level slog.Level) *slog.Logger {
		return slog.New(slog.NewJSONHandler(w, &slog.HandlerOptions{Level: level}))
	}, Redact: func(s string) string { return s }, TokenIssuer: func(Config) (*ports.TokenIssuer, error) { return nil, nil }}
}

func TestBenchSelection(t *testing.T) {
	t.Parallel()
	all := ProjectionNames(testHost().Projections(Config{}))
	reversed := slices.Clone(all)
	slices.Reverse(reversed)
	for _, tc := range []struct {
		name    string
		given   []string
		want    []string
		wantAll bool
	}{
		{"default", nil, all, true},
		{"every one, reordered", reversed, all, true},
		{"subset", []string{"locations", "users", "users"}, []string{"users", "locations"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got, gotAll, err := benchSelection(testHost(), Config{Projections: tc.given})
			require.NoError(t, err)
			assert.Equal(t, tc.want, got)
			assert.Equal(t, tc.wantAll, gotAll)
		})
	}
}

// The read-model check finds a difference in any projection, refuses an entity no check-in
// mentions, and ignores dedupe keys wherever they are.
func TestBenchVerifyFindsDifferences(t *testing.T) {
	srv := redistest.Start(t, redistest.Options{})
	ctx := context.Background()
	h := testHost()
	cfg := Config{RedisURL: srv.URL(), LogLevel: slog.LevelWarn}
	opts := benchOptions{Projections: ProjectionNames(h.Projections(cfg)), AllProjections: true}
	b, err := newBencher(ctx, h, cfg, opts, h.NewLogger(io.Discard, slog.LevelWarn), io.Discard)
	require.NoError(t, err)
	t.Cleanup(b.close)
	client := redistest.Client(t, srv.URL())

	now := time.Now().UnixMilli()
	var checkins []domain.Checkin
	for i := range 300 {
		checkins = append(checkins, domain.Checkin{ID: fmt.Sprintf("c%d", i), UserID: 1 + int64(i%7), LocationID: 1 + int64(i%11),
			StarRating: i % 6, Timestamp: now - int64(i)*3_600_000})
	}
	apply := func(t *testing.T, keys adapters.KeySpace, cs ...domain.Checkin) {
		t.Helper()
		applier, err := adapters.NewProjectionApplier(client, keys, 0)
		require.NoError(t, err)
		for _, p := range h.Projections(cfg) {
			for _, c := range cs {
				_, err := applier.ApplyEvent(ctx, "test."+p.Name(), p, 1, domain.CheckinRecorded{Checkin: c, RecordedAt: now}, "")
				require.NoError(t, err)
			}
		}
	}
	model := func(cs ...domain.Checkin) *expectedModel {
		m := newExpectedModel()
		for _, c := range cs {
			m.add(c)
		}
		return m
	}

	keys := adapters.KeySpace{Prefix: "same"}
	apply(t, keys, checkins...)
	apply(t, keys, checkins[:10]...) // redelivered: counted once
	ok, detail, err := b.verifyReadModels(ctx, keys, model(append(checkins, checkins[:3]...)...))
	require.NoError(t, err)
	assert.True(t, ok, detail)
	// A dedupe key in a slot no check-in names is bookkeeping, not an entity.
	require.NoError(t, client.SAdd(ctx, keys.ProjectionKey("users", 1, "p:7", "seen"), "x").Err())
	ok, detail, err = b.verifyReadModels(ctx, keys, model(checkins...))
	require.NoError(t, err)
	assert.True(t, ok, detail)

	for name, tc := range map[string]struct {
		applied []domain.Checkin
		want    []string
	}{
		"a check-in the model lacks": {append(slices.Clone(checkins), domain.Checkin{ID: "late", UserID: 3, LocationID: 4, StarRating: 5, Timestamp: now}),
			[]string{"user 3: numCheckins/lastCheckin/lastSeenAt", "location 4:", "recent check-ins of user 3", "daily check-ins of location 4", "leaderboard of"}},
		"a user nobody checked in as": {append(slices.Clone(checkins), domain.Checkin{ID: "ghost", UserID: 99, LocationID: 1, Timestamp: now}),
			[]string{"unexpected users entity user:99", "unexpected recent_checkins entity user:99", "leaderboards "}},
	} {
		t.Run(name, func(t *testing.T) {
			keys := adapters.KeySpace{Prefix: strings.ReplaceAll(name, " ", "-")}
			apply(t, keys, tc.applied...)
			ok, detail, err := b.verifyReadModels(ctx, keys, model(checkins...))
			require.NoError(t, err)
			assert.False(t, ok)
			for _, w := range tc.want {
				assert.Contains(t, detail, w)
			}
		})
	}
}

// TestSerialEstimate: sustained is held against 1/(1/ingest + 1/drain) with the faster drain,
// and only when all three ran.
func TestSerialEstimate(t *testing.T) {
	t.Parallel()
	res := BenchResult{Phases: []PhaseResult{
		{Phase: PhaseIngest, Throughput: 18000},
		{Phase: PhaseIngestBaseline, Throughput: 29000},
		{Phase: PhaseSustained, Throughput: 9000},
		{Phase: PhaseDrain, Consumers: 1, Throughput: 18000},
		{Phase: PhaseDrainBaseline, Consumers: 1, Throughput: 90000},
		{Phase: PhaseDrain, Consumers: 4, Throughput: 36000},
	}}
	e := serialEstimate(res)
	require.NotNil(t, e)
	assert.InDelta(t, 12000, e.Estimate, 1e-6, "1/(1/18000 + 1/36000)")
	assert.Equal(t, 4, e.DrainConsumers)
	assert.InDelta(t, 0.75, e.Ratio, 1e-9)
	var out strings.Builder
	res.Serial = e
	printBenchTable(&out, res)
	assert.Contains(t, out.String(), "sustained: 9000/s is 0.75x of 12000/s = 1/(1/ingest + 1/drain) = 1/(1/18000 + 1/36000 (4 consumers))")

	assert.Nil(t, serialEstimate(BenchResult{Phases: res.Phases[:3]}), "no drain ran")
	assert.Nil(t, serialEstimate(BenchResult{Phases: res.Phases[1:]}), "no ingest ran")
}

// TestCPUCosts: each closed-loop phase's CPU per 2xx answer (this process, Redis, and the
// process at --target or --baseline-target when its CPU was read), and the ratio to the
// baseline's that those costs allow; nothing without the baseline's, and no row for a phase
// whose external process's CPU is unknown.
func TestCPUCosts(t *testing.T) {
	t.Parallel()
	svc := func(s float64) *float64 { return &s }
	res := BenchResult{Phases: []PhaseResult{
		{Phase: PhaseIngest, Count: 100000, Seconds: 10, CPUSeconds: 14, RedisCPUSeconds: 3},
		{Phase: PhaseIngestBaseline, Count: 200000, Seconds: 10, CPUSeconds: 14, RedisCPUSeconds: 2},
		{Phase: PhaseSustained, Count: 50000, Seconds: 10, CPUSeconds: 11, RedisCPUSeconds: 5},
		{Phase: PhaseDrain, Consumers: 1, Count: 100000, Seconds: 5, CPUSeconds: 3, RedisCPUSeconds: 4},
	}}
	costs := cpuCosts(res)
	require.Len(t, costs, 3)
	assert.Equal(t, []string{PhaseIngestBaseline, PhaseIngest, PhaseSustained},
		[]string{costs[0].Phase, costs[1].Phase, costs[2].Phase})
	assert.InDelta(t, 80, costs[0].Micros, 1e-9, "(14 + 2) s / 200,000")
	assert.InDelta(t, 70, costs[0].Process, 1e-9)
	assert.InDelta(t, 10, costs[0].Redis, 1e-9)
	assert.InDelta(t, 1.6, costs[0].Cores, 1e-9)
	assert.Nil(t, costs[0].Allows, "the baseline is not held against itself")
	assert.InDelta(t, 170, costs[1].Micros, 1e-9)
	assert.InDelta(t, 80.0/170, *costs[1].Allows, 1e-9)
	assert.InDelta(t, 320, costs[2].Micros, 1e-9)
	assert.InDelta(t, 1.6, costs[2].Cores, 1e-9)
	assert.InDelta(t, 0.25, *costs[2].Allows, 1e-9)
	var out strings.Builder
	res.Costs = costs
	printBenchTable(&out, res)
	assert.Contains(t, out.String(), "  ingest-baseline   80 µs = 70 + 10 at 1.60 cores\n")
	assert.Contains(t, out.String(), "  ingest           170 µs = 140 + 30 at 1.70 cores: 0.47x\n")
	assert.Contains(t, out.String(), "  sustained        320 µs = 220 + 100 at 1.60 cores: 0.25x\n")

	// Against a --target and a --baseline-target: their processes' CPU is part of the cost.
	ext := BenchResult{Settings: BenchSettings{Target: "http://s", BaselineTarget: "http://b"}, Phases: slices.Clone(res.Phases)}
	ext.Phases[1].ServiceCPUSeconds = svc(6)
	ext.Phases[2].ServiceCPUSeconds = svc(8)
	costs = cpuCosts(ext)
	require.Len(t, costs, 2, "ingest's service CPU is unknown: no row for it")
	assert.Equal(t, PhaseSustained, costs[1].Phase)
	assert.InDelta(t, 30, *costs[0].Service, 1e-9)
	assert.InDelta(t, 110, costs[0].Micros, 1e-9)
	assert.InDelta(t, 480, costs[1].Micros, 1e-9)
	assert.InDelta(t, 110.0/480, *costs[1].Allows, 1e-9)
	out.Reset()
	ext.Costs = costs
	printBenchTable(&out, ext)
	assert.Contains(t, out.String(), "  ingest-baseline  110 µs = 70 + 10 + 30 at 2.20 cores\n")

	ext.Phases[1].ServiceCPUSeconds = nil
	assert.Nil(t, cpuCosts(ext), "the baseline's process's CPU is unknown")
	assert.Nil(t, cpuCosts(BenchResult{Phases: []PhaseResult{res.Phases[0], res.Phases[2]}}), "no baseline ran")
	assert.Nil(t, cpuCosts(BenchResult{Phases: []PhaseResult{res.Phases[1], res.Phases[3]}}), "only the baseline ran")
}

// TestLoadTokensAreMintedBeforeAnyPhase: the closed-loop clients' users have their tokens
// before a phase starts (so no timed phase signs them, and no request takes a lock for one),
// each user's own and the same on every call; a user beyond them is minted on first use.
func TestLoadTokensAreMintedBeforeAnyPhase(t *testing.T) {
	t.Parallel()
	iss, err := ports.NewTokenIssuer([]byte(strings.Repeat("k", ports.MinHS256SecretBytes)), "checkins", "checkins")
	require.NoError(t, err)
	h := testHost()
	h.TokenIssuer = func(Config) (*ports.TokenIssuer, error) { return iss, nil }
	tokens, err := newBenchTokens(h, Config{})
	require.NoError(t, err)
	require.Len(t, tokens.load, loadUsers)
	require.Empty(t, tokens.cache)

	seen := map[string]bool{}
	for _, u := range []int64{1, 2, loadUsers / 2, loadUsers} {
		tok := tokens.forUser(u)
		require.NotEmpty(t, tok)
		assert.False(t, seen[tok], "user %d shares a token", u)
		seen[tok] = true
		assert.Equal(t, tok, tokens.forUser(u))
		claims := jwtClaims(t, tok)
		assert.Equal(t, strconv.FormatInt(u, 10), claims["sub"])
	}
	assert.Empty(t, tokens.cache, "the load's users never reach the minting path")

	beyond := tokens.forUser(loadUsers + 1)
	require.NotEmpty(t, beyond)
	assert.Equal(t, strconv.Itoa(loadUsers+1), jwtClaims(t, beyond)["sub"])
	assert.Len(t, tokens.cache, 1)
	assert.Equal(t, beyond, tokens.forUser(loadUsers+1))

	off, err := newBenchTokens(testHost(), Config{})
	require.NoError(t, err)
	assert.Empty(t, off.forUser(1), "authentication off: no token")
}

// jwtClaims decodes a token's claims without checking its signature.
func jwtClaims(t *testing.T, tok string) map[string]any {
	t.Helper()
	parts := strings.Split(tok, ".")
	require.Len(t, parts, 3)
	b, err := base64.RawURLEncoding.DecodeString(parts[1])
	require.NoError(t, err)
	var claims map[string]any
	require.NoError(t, json.Unmarshal(b, &claims))
	return claims
}

// A private server's used_memory reading leaves out the slow log, Redis's diagnostics: each
// entry keeps up to 32 arguments of a command that took over 10 ms (a few KiB for a projection
// script call), and a slow machine logs more of them during the longer drain of 2N. Here 128
// logged commands of 31 long arguments each add about 750 KiB to a reading that keeps them.
func TestUsedMemoryLeavesOutTheSlowLog(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t, redistest.Options{})
	c := redistest.Client(t, srv.URL())
	ctx := context.Background()
	b := &bencher{admin: c, redis: &benchRedis{private: true}}
	args := []any{"EXISTS"}
	for i := range 31 {
		args = append(args, fmt.Sprintf("%03d%s", i, strings.Repeat("k", 125)))
	}
	run := func() {
		for range 128 {
			require.NoError(t, c.Do(ctx, args...).Err())
		}
	}
	// The same commands unlogged first: what they leave besides the slow log (the connection's
	// buffers at their size) is in both readings.
	run()
	before, err := b.usedMemory(ctx)
	require.NoError(t, err)

	require.NoError(t, c.ConfigSet(ctx, "slowlog-log-slower-than", "0").Err()) // log every command
	run()
	require.NoError(t, c.ConfigSet(ctx, "slowlog-log-slower-than", "10000").Err())
	n, err := c.Do(ctx, "SLOWLOG", "LEN").Int64()
	require.NoError(t, err)
	require.EqualValues(t, 128, n, "the slow log is full")

	after, err := b.usedMemory(ctx)
	require.NoError(t, err)
	assert.InDelta(t, before, after, 64<<10, "used_memory %d B before the slow log filled, %d B after", before, after)
}

// A private server's used_memory reading does not move with the reading connection's reply
// buffer. Redis 7 shrinks an idle connection's buffer to 1 KiB; INFO memory's reply (about
// 1.5 KiB) then goes into a reply block of at least 16 KiB, which the CLIENT LIST after it
// counts and the INFO before it did not. Taking that block off the clients' memory read the
// same data about 20 KiB smaller, so the memory phase's N and 2N readings differed by whether
// the buffer had shrunk.
func TestUsedMemoryIgnoresItsOwnReply(t *testing.T) {
	t.Parallel()
	// The reply buffer's peak resets every 5 s by default; DEBUG makes it 50 ms.
	srv := redistest.Start(t, redistest.Options{Args: []string{"--enable-debug-command", "yes"}})
	opts, err := redis.ParseURL(srv.URL())
	require.NoError(t, err)
	opts.PoolSize, opts.MinIdleConns = 1, 1 // every reading on one connection
	c := redis.NewClient(opts)
	t.Cleanup(func() { _ = c.Close() })
	ctx := context.Background()
	b := &bencher{admin: c, redis: &benchRedis{private: true}}

	before, err := b.usedMemory(ctx) // a new connection: a 16 KiB reply buffer
	require.NoError(t, err)
	require.NoError(t, c.Do(ctx, "DEBUG", "REPLYBUFFER", "PEAK-RESET-TIME", "50").Err())
	shrunk := false
	for range 100 { // the server's cron shrinks the idle connection's buffer
		time.Sleep(50 * time.Millisecond)
		list, err := c.ClientList(ctx).Result()
		require.NoError(t, err)
		if strings.Contains(list, " rbs=1024 ") {
			shrunk = true
			break
		}
	}
	require.True(t, shrunk, "the reply buffer of the reading connection shrank to 1 KiB")
	after, err := b.usedMemory(ctx)
	require.NoError(t, err)
	assert.InDelta(t, before, after, 4<<10, "used_memory %d B with a 16 KiB reply buffer, %d B with 1 KiB", before, after)
}

// The e2e poller times a check-in by the read that saw it, not by the end of its round: one
// slow read in a round does not make the others late.
func TestVisibilityPollerTimesEachRead(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	p := &visibilityPoller{count: func(ctx context.Context, userID int64) (int64, error) {
		if userID == 0 {
			<-release // the round's slow read
		}
		return 1, nil
	}}
	now := time.Now()
	for u := range int64(8) {
		p.add(u, now)
	}
	stop, done := make(chan struct{}), make(chan struct{})
	go func() { defer close(done); p.run(context.Background(), stop) }()
	time.Sleep(time.Second)
	close(release)
	for p.pending.Load() > 0 {
		time.Sleep(time.Millisecond)
	}
	close(stop)
	<-done
	require.Len(t, p.latencies, 8)
	slices.Sort(p.latencies)
	assert.Less(t, p.latencies[6], 500*time.Millisecond, "the seven quick reads are not held to the slow one's end: %v", p.latencies)
	assert.GreaterOrEqual(t, p.latencies[7], time.Second, "the slow read: %v", p.latencies)
}

// The memory phase says how many markers the projector still held when it stopped waiting for
// them, instead of counting them in the projections' memory without a word.
func TestWaitMarkersSweptSaysWhatIsLeft(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t, redistest.Options{})
	c := redistest.Client(t, srv.URL())
	ctx := context.Background()
	b := &bencher{admin: c, redis: &benchRedis{private: true}}
	keys := adapters.KeySpace{Prefix: "tmarkers"}
	left, err := b.waitMarkersSwept(ctx, keys)
	require.NoError(t, err)
	assert.Zero(t, left)
	require.NoError(t, c.ZAdd(ctx, keys.Prefix+":applied:users", redis.Z{Score: 1, Member: "a"}, redis.Z{Score: 2, Member: "b"}).Err())
	left, err = b.waitMarkersSwept(ctx, keys)
	require.NoError(t, err)
	assert.EqualValues(t, 2, left, "two markers never swept")
}
