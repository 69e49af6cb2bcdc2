package bench

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/url"
	"os"
	"runtime/pprof"
	"runtime/trace"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/checkins/checkins/app/projection"
)

// The phases of `checkins bench`, in the order they run.
const (
	PhaseIngest         = "ingest"
	PhaseIngestBaseline = "ingest-baseline"
	PhaseSustained      = "sustained"
	PhaseDrain          = "drain"
	PhaseDrainBaseline  = "drain-baseline"
	PhaseE2E            = "e2e"
	PhaseMemory         = "memory"
)

func PhaseOrder() []string {
	return []string{PhaseIngest, PhaseIngestBaseline, PhaseSustained, PhaseDrain, PhaseDrainBaseline, PhaseE2E, PhaseMemory}
}

const benchUsage = `Usage: checkins bench [flags]

Measures, in one run and one process, against raw go-redis baselines:
  ingest           C keep-alive HTTP clients post distinct check-ins to the real API for D
  ingest-baseline  the same clients and payloads against a bare net/http handler doing one XADD
  sustained        the same clients against an in-process serve (API and every selected
                   projection, default settings) for D; the figure is 2xx answers over the time
                   from the first timed request until every consumer group on the stream has
                   delivered its last entry with nothing pending, i.e. fully projected
                   check-ins/s, with the backlog left when the load stopped and how long it took
                   to drain; the ratio is over ingest-baseline, and after the table over
                   1/(1/ingest + 1/drain) of the same run (recording, then projecting)
  drain            N preloaded events consumed by K projector instances (every selected
                   projection), for each K of --consumers, until every group has delivered the
                   last entry and has nothing pending
  drain-baseline   the same data read by raw XREADGROUP COUNT 500 consumers running the same
                   Lua updates pipelined, with batched XACK
  e2e              check-ins posted at a fixed rate to an in-process serve; time from the 202
                   to the check-in being visible in the users projection (recent_checkins when
                   users is not selected)
  memory           M (--memory-events) events of a month of history (200 users, 50 locations,
                   explicit entry IDs over the last 30 days, 1% republished) drained by one
                   projector; Redis used_memory growth minus the stream, per distinct check-in,
                   with a breakdown by projection and key kind; then again with 2M events under a
                   fresh prefix, and the growth from M to 2M

Checks: every phase that runs projections compares each selected projection's read model, read
through the projection's own queries, with an independent computation from the events (the
accepted check-ins for sustained and e2e; with --target, every entry of the target's stream);
ingest, ingest-baseline and sustained check that the stream grew by exactly the 2xx answers.

CPU: each row shows the cores this process and redis-server kept busy. After the table, what a
2xx answer of ingest-baseline, ingest and sustained cost in µs of CPU (this process, Redis, and
the process at --target or --baseline-target when its CPU is read), and the ratio to the
baseline those costs allow at the same use of the cores, however full each phase kept them.

--target URL sends ingest and sustained to a service the operator runs (serve, or api beside
project) instead of the in-process ones, so that it is measured as deployed; the bench reaches
its stream and read models through REDIS_URL, KEY_PREFIX, STREAM_PARTITIONS, PROJECTIONS and
DEDUPE_WINDOW, which must be the target's, and signs its tokens with the target's key (the same
AUTH_* settings, or the same STATE_DIR in dev mode). Use a keyspace of its own, with no other
writers. Sustained first waits for the target's consumer groups that some consumer reads to
catch up, then measures until they have caught up again; its read models are compared with a
computation from the whole stream (not when RETENTION trimmed it or the poison queue holds
entries). The target keeps its data. --serve-baseline ADDR serves the ingest-baseline handler
(writing to KEY_PREFIX-baseline's stream, deleted when it stops) for --baseline-target.

Redis: REDIS_URL when set, one server or a cluster (keys under a private bench-<random> prefix,
deleted at the end); otherwise a private redis-server (--save "" --appendonly no) on a free
port, or with --cluster a private cluster of 3 masters, killed at the end. On a cluster the
services and the baselines use STREAM_PARTITIONS stream partitions (default 24), and Redis
figures (CPU, used_memory) are the masters' sums.
Service settings (SUBSCRIBER/--subscriber, BATCH_SIZE, MAX_IN_FLIGHT, ...) apply to the
in-process services; the bench sets KEY_PREFIX, HTTP_ADDR and CONSUMER_NAME itself (KEY_PREFIX
names the stream of --target for the stream check). --projections (env PROJECTIONS) selects the
projections; with all of them the services run as serve ships, without a PROJECTIONS list.
LOG_LEVEL defaults to warn.

--preload-records N first writes N idempotency records, the data set a deployment holds at its
steady state (about R x IDEMPOTENCY_TTL of them at R check-ins/s; the bench otherwise starts
from an empty Redis), and reports the keys and used_memory they added; with 10 million (2.1 GB)
Redis spent a fifth to a half more CPU per ingest request in runs on 2026-12-06.
The memory phase, which reads differences of used_memory, deletes them first with the earlier
phases' keys.

Time: ingest and ingest-baseline take --duration each, sustained and e2e --duration plus the
time the projections need to catch up; drain and drain-baseline each drain --events once per
--consumers entry; memory drains 3 x --memory-events. With every projection the drain runs at
about 20,000 events/s on 2 cores (one consumer; more add contention there), so the default run
(--events 100000, --consumers 1,4) takes about 100 s. Lower --memory-events or leave phases out
for a quicker run.

Flags:
`

// benchOptions are the bench's own flags.
type benchOptions struct {
	Phases    []string
	Duration  time.Duration
	Clients   int
	Events    int
	Consumers []int
	Rate      float64
	Target    string
	// BaselineTarget is an ingest-baseline handler another bench process serves.
	BaselineTarget string
	// TargetMetrics is Target's /metrics, for its process's CPU.
	TargetMetrics string
	JSON          bool
	MemoryEvents  int
	Cluster       bool // start a private cluster of 3 masters instead of a private server
	// Projections are the selected projection names, in the order the service ships them;
	// AllProjections says they are every shipped one (the services then get no explicit list).
	Projections    []string
	AllProjections bool
	// PreloadRecords idempotency records are written before the first phase (0: none).
	PreloadRecords int
}

// benchFlags are the raw values of the bench's flags.
type benchFlags struct {
	phases         string
	duration       time.Duration
	clients        int
	events         int
	consumers      string
	rate           float64
	target         string
	baselineTarget string
	targetMetrics  string
	memoryEvents   int
	preloadRecords int
}

// runFlags are the flags of a run of phases, which --serve-baseline does not make.
var runFlags = []string{"phases", "duration", "clients", "events", "consumers", "rate", "target", "baseline-target", "target-metrics",
	"memory-events", "preload-records", "cluster", "json", "cpuprofile", "trace", "memprofile"}

const projectionsFlagUsage = "comma-separated projections the bench runs and checks (env PROJECTIONS, default: every shipped projection: %s)"

// Run is `checkins bench`: h is the binary it is part of.
func Run(ctx context.Context, h Host, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	stderr = &lockedWriter{w: stderr} // the service logs and the progress lines share it
	fs := flag.NewFlagSet("checkins bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var f benchFlags
	fs.StringVar(&f.phases, "phases", strings.Join(PhaseOrder(), ","), "comma-separated phases to run: "+strings.Join(PhaseOrder(), ", ")+" (or all)")
	fs.DurationVar(&f.duration, "duration", 10*time.Second, "length of the load of each ingest, ingest-baseline, sustained and e2e phase")
	fs.IntVar(&f.clients, "clients", 50, "concurrent keep-alive HTTP clients (ingest, sustained) and senders (e2e)")
	fs.IntVar(&f.events, "events", 100000, "events preloaded for drain and drain-baseline")
	fs.StringVar(&f.consumers, "consumers", "1,4", "comma-separated numbers of consumers to sweep in drain and drain-baseline")
	fs.Float64Var(&f.rate, "rate", 2000, "check-ins per second posted in e2e")
	fs.StringVar(&f.target, "target", "", "base URL of a running service (e.g. http://127.0.0.1:8080) for ingest and sustained instead of the in-process ones; needs REDIS_URL and KEY_PREFIX as the target has them")
	fs.StringVar(&f.targetMetrics, "target-metrics", "", "the /metrics URL of --target's ops listener (e.g. http://127.0.0.1:8081/metrics): the service's CPU during ingest and sustained, from process_cpu_seconds_total")
	fs.StringVar(&f.baselineTarget, "baseline-target", "", "base URL of a bare XADD handler that `checkins bench --serve-baseline` runs, for ingest-baseline instead of the in-process one (its stream: KEY_PREFIX-baseline)")
	serveBaseline := fs.String("serve-baseline", "", "serve the ingest-baseline handler (POST /checkins: decode, one XADD to KEY_PREFIX-baseline's stream on REDIS_URL) on this address until interrupted, instead of running phases; for --baseline-target")
	fs.IntVar(&f.memoryEvents, "memory-events", 100000, "events of the first memory run; the second writes twice as many")
	fs.IntVar(&f.preloadRecords, "preload-records", 0, "before the first phase, fill Redis with this many idempotency records (compact, of 10,000 users, their ages spread over IDEMPOTENCY_TTL so that they expire as a deployment's do): the data set a deployment at its steady state holds, about R x IDEMPOTENCY_TTL at R check-ins/s")
	cluster := fs.Bool("cluster", false, "without REDIS_URL, start a private Redis Cluster of 3 masters (no persistence) instead of one private redis-server; the services use STREAM_PARTITIONS (default 24 on a cluster)")
	asJSON := fs.Bool("json", false, "print the result as JSON on stdout instead of the table")
	cpuProfile := fs.String("cpuprofile", "", "write a CPU profile of the whole run (service, load and baselines) to this file, for go tool pprof")
	traceFile := fs.String("trace", "", "write an execution trace of the whole run to this file, for go tool trace (e.g. -pprof=net, sync or sched: where requests wait)")
	memProfile := fs.String("memprofile", "", "write an allocation profile of the whole run to this file at the end, for go tool pprof -sample_index=alloc_space")
	fs.Usage = func() {
		// PROJECTIONS is a service setting; in the bench it selects what is measured and checked.
		if pf := fs.Lookup("projections"); pf != nil {
			pf.Usage = fmt.Sprintf(projectionsFlagUsage, strings.Join(ProjectionNames(h.Projections(Config{})), ","))
		}
		fmt.Fprint(fs.Output(), benchUsage)
		fs.PrintDefaults()
	}
	cfg, rest, err := h.ParseConfig(fs, args, benchGetenv(getenv))
	if err != nil {
		return err
	}
	if len(rest) > 0 {
		return fmt.Errorf("unexpected arguments: %v", rest)
	}
	if *serveBaseline != "" {
		var other []string
		fs.Visit(func(f *flag.Flag) {
			if slices.Contains(runFlags, f.Name) {
				other = append(other, "--"+f.Name)
			}
		})
		if len(other) > 0 {
			return fmt.Errorf("invalid --serve-baseline: it serves the baseline handler and runs no phase, so %s would not apply", strings.Join(other, ", "))
		}
		return serveBaselineHandler(ctx, cfg, *serveBaseline, stderr)
	}
	opts, err := parseBenchOptions(h, f, cfg)
	if err != nil {
		return err
	}
	opts.JSON = *asJSON
	opts.Cluster = *cluster
	log := h.NewLogger(stderr, cfg.LogLevel)

	b, err := newBencher(ctx, h, cfg, opts, log, stderr)
	if err != nil {
		return err
	}
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err != nil {
			return fmt.Errorf("invalid --cpuprofile: %w", err)
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return fmt.Errorf("cpu profile: %w", err)
		}
		defer pprof.StopCPUProfile()
	}
	if *traceFile != "" {
		f, err := os.Create(*traceFile)
		if err != nil {
			return fmt.Errorf("invalid --trace: %w", err)
		}
		defer f.Close()
		if err := trace.Start(f); err != nil {
			return fmt.Errorf("execution trace: %w", err)
		}
		defer trace.Stop()
	}
	res, runErr := b.run(ctx)
	b.close()
	if *memProfile != "" {
		if err := writeAllocProfile(*memProfile); err != nil {
			return err
		}
	}
	if len(res.Phases) > 0 || runErr == nil {
		if opts.JSON {
			enc := json.NewEncoder(stdout)
			enc.SetIndent("", "  ")
			if err := enc.Encode(res); err != nil {
				return err
			}
		} else {
			printBenchTable(stdout, res)
		}
	}
	return runErr
}

// benchGetenv keeps the in-process services quiet unless LOG_LEVEL asks otherwise: info logs of
// a dozen services would bury the progress lines.
func benchGetenv(getenv func(string) string) func(string) string {
	return func(k string) string {
		if v := getenv(k); v != "" || k != "LOG_LEVEL" {
			return v
		}
		return "warn"
	}
}

func ProjectionNames(ps []projection.Projection) []string {
	out := make([]string, len(ps))
	for i, p := range ps {
		out[i] = p.Name()
	}
	return out
}

func parseBenchOptions(h Host, f benchFlags, cfg Config) (benchOptions, error) {
	o := benchOptions{Duration: f.duration, Clients: f.clients, Events: f.events, Rate: f.rate, MemoryEvents: f.memoryEvents, PreloadRecords: f.preloadRecords}
	want := map[string]bool{}
	for _, p := range strings.Split(f.phases, ",") {
		p = strings.TrimSpace(p)
		switch {
		case p == "":
		case p == "all":
			for _, q := range PhaseOrder() {
				want[q] = true
			}
		case slices.Contains(PhaseOrder(), p):
			want[p] = true
		default:
			return o, fmt.Errorf("invalid --phases: unknown phase %q (known: %s)", p, strings.Join(PhaseOrder(), ", "))
		}
	}
	for _, p := range PhaseOrder() {
		if want[p] {
			o.Phases = append(o.Phases, p)
		}
	}
	if len(o.Phases) == 0 {
		return o, errors.New("invalid --phases: no phase selected")
	}
	if f.duration < 100*time.Millisecond {
		return o, fmt.Errorf("invalid --duration: must be at least 100ms, got %s", f.duration)
	}
	if f.clients < 1 || f.clients > 10000 {
		return o, fmt.Errorf("invalid --clients: must be from 1 to 10000, got %d", f.clients)
	}
	if f.events < 1 || f.events > 10_000_000 {
		return o, fmt.Errorf("invalid --events: must be from 1 to 10000000, got %d", f.events)
	}
	if f.memoryEvents < 100 || f.memoryEvents > 10_000_000 {
		return o, fmt.Errorf("invalid --memory-events: must be from 100 to 10000000, got %d", f.memoryEvents)
	}
	if f.preloadRecords < 0 || f.preloadRecords > maxPreloadRecords {
		return o, fmt.Errorf("invalid --preload-records: must be from 0 to %d, got %d", maxPreloadRecords, f.preloadRecords)
	}
	if f.rate <= 0 || f.rate > 1_000_000 {
		return o, fmt.Errorf("invalid --rate: must be above 0 and at most 1000000 per second, got %g", f.rate)
	}
	seen := map[int]bool{}
	for _, s := range strings.Split(f.consumers, ",") {
		if s = strings.TrimSpace(s); s == "" {
			continue
		}
		k, err := strconv.Atoi(s)
		if err != nil || k < 1 || k > 64 {
			return o, fmt.Errorf("invalid --consumers: each must be an integer from 1 to 64, got %q", s)
		}
		if !seen[k] {
			seen[k] = true
			o.Consumers = append(o.Consumers, k)
		}
	}
	if len(o.Consumers) == 0 {
		return o, errors.New("invalid --consumers: give at least one number, e.g. 1,2,4,8")
	}
	if f.target != "" {
		u, err := url.Parse(f.target)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return o, fmt.Errorf("invalid --target: must be a base URL like http://127.0.0.1:8080, got %q", f.target)
		}
		o.Target = strings.TrimRight(f.target, "/")
	}
	if f.baselineTarget != "" {
		u, err := url.Parse(f.baselineTarget)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return o, fmt.Errorf("invalid --baseline-target: must be a base URL like http://127.0.0.1:8081, got %q", f.baselineTarget)
		}
		o.BaselineTarget = strings.TrimRight(f.baselineTarget, "/")
	}
	if f.targetMetrics != "" {
		u, err := url.Parse(f.targetMetrics)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || o.Target == "" {
			return o, fmt.Errorf("invalid --target-metrics: must be the URL of --target's /metrics, like http://127.0.0.1:8081/metrics, with --target; got %q", f.targetMetrics)
		}
		o.TargetMetrics = f.targetMetrics
	}
	if o.Target != "" && want[PhaseSustained] && cfg.RedisURL == "" {
		return o, errors.New("invalid --target: sustained tells when the target's projections have caught up from its Redis; set REDIS_URL and KEY_PREFIX (and STREAM_PARTITIONS) as the target has them")
	}
	var err error
	if o.Projections, o.AllProjections, err = benchSelection(h, cfg); err != nil {
		return o, err
	}
	if want[PhaseE2E] && !slices.Contains(o.Projections, projection.UserStats{}.Name()) &&
		!slices.Contains(o.Projections, projection.RecentCheckins{}.Name()) {
		return o, fmt.Errorf("invalid --projections: e2e times a check-in until it is visible in %s or %s; select one of them, or leave e2e out of --phases",
			projection.UserStats{}.Name(), projection.RecentCheckins{}.Name())
	}
	return o, nil
}

// benchSelection resolves --projections (cfg.Projections) against the shipped projections: the
// names in shipped order, and whether they are all of them.
func benchSelection(h Host, cfg Config) ([]string, bool, error) {
	shipped := ProjectionNames(h.Projections(cfg))
	if len(cfg.Projections) == 0 {
		return shipped, true, nil
	}
	want := map[string]bool{}
	for _, p := range cfg.Projections {
		if !slices.Contains(shipped, p) {
			return nil, false, fmt.Errorf("invalid --projections (PROJECTIONS): unknown projection %q (known: %s)", p, strings.Join(shipped, ", "))
		}
		want[p] = true
	}
	var out []string
	for _, p := range shipped {
		if want[p] {
			out = append(out, p)
		}
	}
	return out, len(out) == len(shipped), nil
}

// lockedWriter serialises writes from the progress lines and the services' loggers.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// writeAllocProfile writes every allocation sampled since the process started.
func writeAllocProfile(path string) error {
	f, err := os.Create(path) // #nosec G304 -- a path the operator passed on the command line
	if err != nil {
		return fmt.Errorf("invalid --memprofile: %w", err)
	}
	defer f.Close()
	if err := pprof.Lookup("allocs").WriteTo(f, 0); err != nil {
		return fmt.Errorf("allocation profile: %w", err)
	}
	return f.Close()
}
