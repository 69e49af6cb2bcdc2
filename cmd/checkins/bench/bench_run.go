package bench

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/checkins/checkins/adapters"
	"github.com/checkins/checkins/app/command"
)

// BenchResult is the machine-readable outcome of `checkins bench --json`.
type BenchResult struct {
	Machine  BenchMachine  `json:"machine"`
	Settings BenchSettings `json:"settings"`
	Phases   []PhaseResult `json:"phases"`
	// Serial is sustained held against ingest and drain of the same run (nil unless all three ran).
	Serial *SerialEstimate `json:"serial,omitempty"`
	// Costs are what a 2xx answer of ingest-baseline, ingest and sustained cost in CPU (empty
	// without ingest-baseline or a second of those phases).
	Costs []CPUCost `json:"cpu_costs,omitempty"`
	// Records are the idempotency records --preload-records wrote before the first phase.
	Records *RecordsPreload `json:"preloaded_records,omitempty"`
	Seconds float64         `json:"seconds"`
}

// SerialEstimate is what sustained would be if serve recorded every check-in at the ingest rate
// and projected it at the drain rate, one after the other: 1/(1/ingest + 1/drain), with the
// drain of the faster consumer count. On cores the load generator, the service and Redis share,
// the two halves compete for the same CPU and the same Redis thread, so sustained lands close to
// it; what raises it is cheaper ingest or cheaper projection, not more overlap.
type SerialEstimate struct {
	Ingest         float64 `json:"ingest_per_sec"`
	Drain          float64 `json:"drain_per_sec"`
	DrainConsumers int     `json:"drain_consumers"`
	Estimate       float64 `json:"estimate_per_sec"`
	Sustained      float64 `json:"sustained_per_sec"`
	Ratio          float64 `json:"sustained_over_estimate"`
}

// serialEstimate is res's SerialEstimate, nil without ingest, drain and sustained figures.
func serialEstimate(res BenchResult) *SerialEstimate {
	var e SerialEstimate
	for _, r := range res.Phases {
		switch r.Phase {
		case PhaseIngest:
			e.Ingest = r.Throughput
		case PhaseSustained:
			e.Sustained = r.Throughput
		case PhaseDrain:
			if r.Throughput > e.Drain {
				e.Drain, e.DrainConsumers = r.Throughput, r.Consumers
			}
		}
	}
	if e.Ingest <= 0 || e.Drain <= 0 || e.Sustained <= 0 {
		return nil
	}
	e.Estimate = 1 / (1/e.Ingest + 1/e.Drain)
	e.Ratio = e.Sustained / e.Estimate
	return &e
}

// CPUCost is what one 2xx answer of a closed-loop phase cost the machine in CPU, in µs: this
// process's (the load generator's, and the service's and the baselines' when they run in it),
// Redis's, and that of the process at --target or --baseline-target (from --target-metrics or
// --serve-baseline's /cpu). A ratio to the baseline is the throughput one side gets for the
// cores it keeps busy: the baseline's cost over ours is the ratio the costs alone allow, at the
// same use of the cores, whether or not the cores were full (they rarely are on both sides alike).
type CPUCost struct {
	Phase   string   `json:"phase"`
	Micros  float64  `json:"us_per_answer"`
	Process float64  `json:"process_us"`
	Redis   float64  `json:"redis_us"`
	Service *float64 `json:"service_us,omitempty"` // the process at --target or --baseline-target
	Cores   float64  `json:"cores"`                // Micros x answers / seconds
	// Allows is ingest-baseline's Micros over this phase's (not on the baseline's own row).
	Allows *float64 `json:"allows_vs_baseline,omitempty"`
}

// cpuCosts are res's CPUCosts: ingest-baseline first, then ingest and sustained. A phase whose
// service ran in a process of its own whose CPU the bench could not read is left out (its cost
// would be part of it); so is everything when the baseline's is unknown.
func cpuCosts(res BenchResult) []CPUCost {
	cost := func(r PhaseResult, external bool) (CPUCost, bool) {
		if r.Count <= 0 || r.Seconds <= 0 || (external && r.ServiceCPUSeconds == nil) {
			return CPUCost{}, false
		}
		per := 1e6 / float64(r.Count)
		c := CPUCost{Phase: r.Phase, Process: r.CPUSeconds * per, Redis: r.RedisCPUSeconds * per}
		cpu := r.CPUSeconds + r.RedisCPUSeconds
		if r.ServiceCPUSeconds != nil {
			s := *r.ServiceCPUSeconds * per
			c.Service, cpu = &s, cpu+*r.ServiceCPUSeconds
		}
		c.Micros, c.Cores = cpu*per, cpu/r.Seconds
		return c, c.Micros > 0
	}
	var out []CPUCost
	for _, r := range res.Phases {
		if r.Phase == PhaseIngestBaseline {
			if c, ok := cost(r, res.Settings.BaselineTarget != ""); ok {
				out = append(out, c)
			}
		}
	}
	if len(out) == 0 {
		return nil
	}
	for _, r := range res.Phases { // in the table's order: ingest, then sustained
		if r.Phase != PhaseIngest && r.Phase != PhaseSustained {
			continue
		}
		if c, ok := cost(r, res.Settings.Target != ""); ok {
			allows := out[0].Micros / c.Micros
			c.Allows = &allows
			out = append(out, c)
		}
	}
	if len(out) == 1 {
		return nil
	}
	return out
}

// BenchMachine says where the figures come from.
type BenchMachine struct {
	NumCPU       int    `json:"nproc"`
	GOMAXPROCS   int    `json:"gomaxprocs"`
	GoVersion    string `json:"go_version"`
	OS           string `json:"os"`
	RedisVersion string `json:"redis_version"`
	Redis        string `json:"redis"`
	Hostname     string `json:"hostname"`
	StartedAt    string `json:"started_at"`
}

// BenchSettings echo what was run.
type BenchSettings struct {
	Phases         []string `json:"phases"`
	Projections    []string `json:"projections"`
	DurationSec    float64  `json:"duration_seconds"`
	Clients        int      `json:"clients"`
	Events         int      `json:"events"`
	Consumers      []int    `json:"consumers"`
	Rate           float64  `json:"rate"`
	MemoryEvents   int      `json:"memory_events"`
	Target         string   `json:"target,omitempty"`
	BaselineTarget string   `json:"baseline_target,omitempty"`
	Subscriber     string   `json:"subscriber"`
	BatchSize      int      `json:"batch_size"`
	MaxInFlight    int      `json:"max_in_flight"`
	AuthMode       string   `json:"auth_mode"`       // the in-process services' AUTH_MODE; off: no tokens sent
	RateLimitUse   string   `json:"rate_limit_user"` // RATE_LIMIT_USER of the in-process services
	PreloadRecords int      `json:"preload_records,omitempty"`
}

// PhaseResult is one row of the table.
type PhaseResult struct {
	Phase     string `json:"phase"`
	Consumers int    `json:"consumers,omitempty"` // per projection, drain phases only
	// Count is what the throughput counts: 2xx answers (ingest, sustained, e2e), stream entries
	// fully processed by every projection (drain) or the events written (memory, whose
	// throughput is bytes per distinct check-in).
	Count       int64            `json:"count"`
	Seconds     float64          `json:"seconds"`
	Throughput  float64          `json:"throughput"`
	Unit        string           `json:"unit"`
	Latency     *LatencySummary  `json:"latency_ms,omitempty"`      // request latency; e2e: 202 -> visible
	PostLatency *LatencySummary  `json:"post_latency_ms,omitempty"` // e2e: the POSTs themselves
	Errors      map[string]int64 `json:"errors,omitempty"`          // by HTTP status, or "transport"
	Check       string           `json:"check"`                     // OK, MISMATCH or SKIPPED
	CheckDetail string           `json:"check_detail,omitempty"`
	PeakRSS     uint64           `json:"peak_rss_bytes"`
	PeakHeap    uint64           `json:"peak_heap_bytes"`
	// CPU time used during the phase by this process (service, load and baselines alike) and
	// by Redis (INFO cpu); over Seconds, the cores each kept busy.
	CPUSeconds      float64 `json:"cpu_seconds"`
	RedisCPUSeconds float64 `json:"redis_cpu_seconds"`
	// ServiceCPUSeconds is the CPU time of the process at --target (from --target-metrics) or
	// --baseline-target during the phase, when the bench could read it.
	ServiceCPUSeconds *float64 `json:"service_cpu_seconds,omitempty"`
	// VsBaseline is this phase's throughput over its baseline's in the same run (ingest, drain;
	// sustained: over ingest-baseline).
	VsBaseline *float64       `json:"vs_baseline,omitempty"`
	Backlog    *BacklogResult `json:"backlog,omitempty"` // sustained
	Memory     *MemoryResult  `json:"memory,omitempty"`  // memory
	Note       string         `json:"note,omitempty"`
}

// BacklogResult is what the projections still owed when the sustained load stopped.
type BacklogResult struct {
	// EntriesBehind is the most any one group owed: entries not yet delivered plus pending.
	EntriesBehind int64                   `json:"entries_behind"`
	Groups        map[string]GroupBacklog `json:"groups"`
	// DrainSeconds is how long after the load stopped the last group caught up.
	DrainSeconds float64 `json:"drain_seconds"`
}

// GroupBacklog is one consumer group's share of the backlog.
type GroupBacklog struct {
	Undelivered int64 `json:"undelivered"`
	Pending     int64 `json:"pending"`
}

// Check outcomes.
const (
	CheckOK       = "OK"
	CheckMismatch = "MISMATCH"
	CheckSkipped  = "SKIPPED"
)

// bencher holds what every phase shares: Redis, the config for in-process services, the run ID.
type bencher struct {
	host  Host
	cfg   Config
	opts  benchOptions
	log   *slog.Logger
	out   io.Writer // progress lines
	redis *benchRedis
	runID string
	admin redis.UniversalClient // setup, checks and polling; never measured
	// reads serves the projections' own read paths (adapters.ProjectionReader) for the checks:
	// its commands go through readPipe, so many concurrent reads share round trips.
	reads     redis.UniversalClient
	readPipe  *adapters.AutoPipeline
	readPipeC redis.UniversalClient
	closed    bool
	tokens    *benchTokens // one per user, for the load generator
}

func newBencher(ctx context.Context, h Host, cfg Config, opts benchOptions, log *slog.Logger, progress io.Writer) (*bencher, error) {
	id := make([]byte, 4)
	if _, err := rand.Read(id); err != nil {
		return nil, err
	}
	b := &bencher{host: h, cfg: cfg, opts: opts, log: log, out: progress, runID: "bench-" + hex.EncodeToString(id)}
	var err error
	if b.tokens, err = newBenchTokens(h, cfg); err != nil {
		return nil, err
	}
	r, err := openBenchRedis(ctx, cfg.RedisURL, cfg.RedisTLS, cfg.RedisMode, opts.Cluster, b.runID, log, h.Redact)
	if err != nil {
		return nil, err
	}
	b.redis = r
	r.partitions = b.partitions()
	mode := adapters.RedisModeStandalone
	if r.cluster {
		mode = adapters.RedisModeCluster
	}
	opts30s := adapters.ClientOptions{URL: r.url, TLS: r.tls, ReadTimeout: 30 * time.Second, WriteTimeout: 30 * time.Second, PoolSize: 8, Mode: mode}
	if b.admin, err = adapters.NewUniversalRedisClient(ctx, opts30s); err != nil {
		r.close(log)
		return nil, err
	}
	if b.readPipeC, err = adapters.NewUniversalRedisClient(ctx, opts30s); err != nil {
		_ = b.admin.Close()
		r.close(log)
		return nil, err
	}
	b.readPipe = adapters.NewAutoPipeline(b.readPipeC, 256, 2)
	if b.reads, err = adapters.NewUniversalRedisClient(ctx, opts30s); err != nil {
		_ = b.readPipe.Close()
		_ = b.readPipeC.Close()
		_ = b.admin.Close()
		r.close(log)
		return nil, err
	}
	b.reads.AddHook(b.readPipe.Hook())
	return b, nil
}

// close removes what the run left: its keys on a shared Redis, or the private server.
func (b *bencher) close() {
	if b.closed {
		return
	}
	b.closed = true
	if !b.redis.private {
		// About 100,000 keys a second; preloaded records can be millions.
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute+time.Duration(b.opts.PreloadRecords/20_000)*time.Second)
		defer cancel()
		if n, err := deleteKeys(ctx, b.admin, b.runID+"-*"); err != nil {
			b.log.Error("bench: could not delete its keys", "pattern", b.runID+"-*", "error", err)
		} else {
			b.progress("deleted %d keys under %s-*", n, b.runID)
		}
	}
	_ = b.reads.Close()
	_ = b.readPipe.Close()
	_ = b.readPipeC.Close()
	_ = b.admin.Close()
	b.redis.close(b.log)
}

func (b *bencher) progress(format string, args ...any) {
	fmt.Fprintf(b.out, "bench: "+format+"\n", args...)
}

// prefix is a KEY_PREFIX of this run; every key the service writes starts with it and ":".
func (b *bencher) prefix(part string) string { return b.runID + "-" + part }

func (b *bencher) run(ctx context.Context) (BenchResult, error) {
	start := time.Now()
	host, _ := os.Hostname()
	res := BenchResult{
		Machine: BenchMachine{NumCPU: runtime.NumCPU(), GOMAXPROCS: runtime.GOMAXPROCS(0), GoVersion: runtime.Version(),
			OS: runtime.GOOS + "/" + runtime.GOARCH, RedisVersion: b.redis.version, Redis: b.redis.describe(),
			Hostname: host, StartedAt: start.UTC().Format(time.RFC3339)},
		Settings: BenchSettings{Phases: b.opts.Phases, Projections: b.opts.Projections, DurationSec: b.opts.Duration.Seconds(),
			Clients: b.opts.Clients, Events: b.opts.Events, Consumers: b.opts.Consumers, Rate: b.opts.Rate,
			MemoryEvents: b.opts.MemoryEvents, Target: b.opts.Target, BaselineTarget: b.opts.BaselineTarget,
			Subscriber: b.cfg.Subscriber, BatchSize: b.cfg.BatchSize, MaxInFlight: b.cfg.MaxInFlight,
			AuthMode: b.cfg.AuthMode, RateLimitUse: b.cfg.RateLimitUser.String(), PreloadRecords: b.opts.PreloadRecords},
	}
	b.progress("%s", machineLine(res))
	want := map[string]bool{}
	for _, p := range b.opts.Phases {
		want[p] = true
	}
	add := func(r PhaseResult) {
		res.Phases = append(res.Phases, r)
		b.progress("%s", progressLine(r))
	}
	finish := func(res BenchResult) BenchResult {
		// The table reads ours then baseline per consumer count, whatever order they ran in.
		slices.SortStableFunc(res.Phases, func(a, b PhaseResult) int {
			return cmp.Or(cmp.Compare(phaseRank(a.Phase), phaseRank(b.Phase)), cmp.Compare(a.Consumers, b.Consumers),
				cmp.Compare(slices.Index(PhaseOrder(), a.Phase), slices.Index(PhaseOrder(), b.Phase)))
		})
		res = withRatios(res)
		res.Serial = serialEstimate(res)
		res.Costs = cpuCosts(res)
		res.Seconds = time.Since(start).Seconds()
		return res
	}

	if n := b.opts.PreloadRecords; n > 0 {
		r, err := b.preloadRecords(ctx, n)
		if err != nil {
			return finish(res), fmt.Errorf("preload-records: %w", err)
		}
		res.Records = r
		b.progress("%s", recordsLine(r))
	}
	if want[PhaseIngest] || want[PhaseIngestBaseline] {
		rs, err := b.phaseIngestPair(ctx, want[PhaseIngest], want[PhaseIngestBaseline])
		if err != nil {
			return finish(res), fmt.Errorf("ingest: %w", err)
		}
		for _, r := range rs {
			add(r)
		}
	}
	if want[PhaseSustained] {
		r, err := b.PhaseSustained(ctx)
		if err != nil {
			return finish(res), fmt.Errorf("%s: %w", PhaseSustained, err)
		}
		add(r)
	}
	if want[PhaseDrain] || want[PhaseDrainBaseline] {
		data, err := b.preload(ctx)
		if err != nil {
			return finish(res), fmt.Errorf("drain preload: %w", err)
		}
		// Ours and the baseline run back to back for each consumer count, first one then the
		// other going first, so drift in the machine's load (it is shared) does not always favour
		// the same side of the ratios.
		for i, k := range b.opts.Consumers {
			order := []string{PhaseDrain, PhaseDrainBaseline}
			if i%2 == 1 {
				order = []string{PhaseDrainBaseline, PhaseDrain}
			}
			for _, p := range order {
				if !want[p] {
					continue
				}
				r, err := b.PhaseDrain(ctx, data, k, p == PhaseDrainBaseline)
				if err != nil {
					return finish(res), fmt.Errorf("%s with %d consumers: %w", p, k, err)
				}
				add(r)
			}
		}
	}
	if want[PhaseE2E] {
		r, err := b.PhaseE2E(ctx)
		if err != nil {
			return finish(res), fmt.Errorf("%s: %w", PhaseE2E, err)
		}
		add(r)
	}
	if want[PhaseMemory] {
		// The memory phase reads differences of used_memory: the earlier phases' keys (tens of
		// thousands, checked already) would leave the keyspace's table to grow or shrink under
		// it, a step of 256 KiB or more at each rehash (a 300-event phase read -761 KiB).
		if _, err := deleteKeys(ctx, b.admin, b.runID+"-*"); err != nil {
			return finish(res), fmt.Errorf("%s: deleting the earlier phases' keys: %w", PhaseMemory, err)
		}
		if res.Records != nil {
			// They expire all the time, too, which a difference of used_memory would count.
			b.progress("memory: deleted the %d preloaded idempotency records with the earlier phases' keys first", res.Records.Records)
		}
		for _, n := range []int{b.opts.MemoryEvents, 2 * b.opts.MemoryEvents} {
			r, err := b.PhaseMemory(ctx, n, res.Phases)
			if err != nil {
				return finish(res), fmt.Errorf("%s with %d events: %w", PhaseMemory, n, err)
			}
			add(r)
		}
	}
	res = finish(res)
	for _, r := range res.Phases {
		if r.Check == CheckMismatch {
			return res, fmt.Errorf("%s check failed: %s", r.Phase, r.CheckDetail)
		}
	}
	return res, nil
}

// phaseRank groups a phase with its baseline.
func phaseRank(phase string) int {
	return slices.Index(PhaseOrder(), strings.TrimSuffix(phase, "-baseline"))
}

// withRatios fills the ours/baseline ratios. Sustained has no baseline of its own: what it is
// held against is the bare XADD handler, ingest-baseline.
func withRatios(res BenchResult) BenchResult {
	base := map[string]float64{}
	for _, r := range res.Phases {
		if strings.HasSuffix(r.Phase, "-baseline") {
			base[fmt.Sprintf("%s/%d", strings.TrimSuffix(r.Phase, "-baseline"), r.Consumers)] = r.Throughput
		}
	}
	if b, ok := base[PhaseIngest+"/0"]; ok {
		base[PhaseSustained+"/0"] = b
	}
	for i, r := range res.Phases {
		if b, ok := base[fmt.Sprintf("%s/%d", r.Phase, r.Consumers)]; ok && b > 0 {
			ratio := r.Throughput / b
			res.Phases[i].VsBaseline = &ratio
		}
	}
	return res
}

// runningService is an in-process Service serving on a loopback port.
type runningService struct {
	svc    Service
	addr   string
	cancel context.CancelFunc
	exited chan struct{} // closed when Run returned; err is then set
	err    error
	// stopping is set once the bench asked it to stop; an exit before that is a failure.
	stopping atomic.Bool
}

// newService builds (but does not run) a Service of the configured kind under prefix.
func (b *bencher) newService(ctx context.Context, prefix string, mode Mode, consumer string) (*runningService, error) {
	cfg := b.cfg
	cfg.RedisURL = b.redis.url
	cfg.KeyPrefix = prefix
	cfg.HTTPAddr = "127.0.0.1:0"
	cfg.OpsAddr = cfg.HTTPAddr // one port: ops routes must not need a fixed port of their own
	// The load generator is one address: a per-address limit would measure the limiter.
	cfg.RateLimitIP = command.RateLimit{}
	cfg.ConsumerName = consumer
	// With every projection selected the service gets no list, as serve ships: it may name
	// things differently for an explicit list.
	cfg.Projections = nil
	if !b.opts.AllProjections {
		cfg.Projections = b.opts.Projections
	}
	// Trimming would break the stream-length and drain checks, and is not what is measured.
	cfg.Retention = command.RetentionPolicy{}
	svc, err := b.host.NewService(ctx, cfg, mode, b.log)
	if err != nil {
		return nil, err
	}
	addr, err := svc.Listen()
	if err != nil {
		svc.Close()
		return nil, err
	}
	return &runningService{svc: svc, addr: addr.String()}, nil
}

func (s *runningService) start(ctx context.Context) {
	rctx, cancel := context.WithCancel(ctx)
	s.cancel, s.exited = cancel, make(chan struct{})
	go func() {
		s.err = s.svc.Run(rctx)
		close(s.exited)
	}()
}

// stop shuts the service down gracefully and returns what Run returned.
func (s *runningService) stop() error {
	s.stopping.Store(true)
	if s.cancel == nil {
		s.svc.Close()
		return nil
	}
	s.cancel()
	<-s.exited
	return s.err
}

// groups are the consumer groups the service's projection router feeds.
func (s *runningService) groups() []string {
	return s.svc.Groups()
}

// watch sends to fail when the service stops before the bench asked it to.
func (s *runningService) watch(what string, fail chan<- error) {
	go func() {
		<-s.exited
		if !s.stopping.Load() {
			select {
			case fail <- fmt.Errorf("%s %s stopped on its own: %v", what, s.addr, s.err):
			default:
			}
		}
	}()
}

// waitReady waits until the service reports ready (Redis answers, the projection router
// consumes), asking it directly so that the wait leaves no 503s in its logs.
func (s *runningService) waitReady(ctx context.Context) error {
	deadline := time.Now().Add(15 * time.Second)
	for {
		err := s.svc.Ready(ctx)
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("service not ready within 15s: %w", err)
		}
		select {
		case <-s.exited:
			return fmt.Errorf("service stopped while starting: %v", s.err)
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// waitHTTP waits until GET path answers 200.
func (s *runningService) waitHTTP(ctx context.Context, path string) error {
	deadline := time.Now().Add(15 * time.Second)
	c := &http.Client{Timeout: time.Second}
	defer c.CloseIdleConnections()
	var last string
	for time.Now().Before(deadline) {
		// #nosec G704 -- the service this bench started on loopback
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+s.addr+path, nil)
		resp, err := c.Do(req) // #nosec G704 -- the same
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			last = resp.Status
		} else {
			last = err.Error()
		}
		select {
		case <-s.exited:
			return fmt.Errorf("service stopped while starting: %v", s.err)
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
	return fmt.Errorf("http://%s%s did not answer 200 within 15s (last: %s)", s.addr, path, last)
}

// deleteKeys UNLINKs every key matching pattern; it returns how many.
func deleteKeys(ctx context.Context, uc redis.UniversalClient, pattern string) (int, error) {
	total, err := sumNodes(ctx, uc, func(ctx context.Context, c *redis.Client) (int64, error) {
		n, err := deleteNodeKeys(ctx, c, pattern)
		return int64(n), err
	})
	return int(total), err
}

// deleteNodeKeys UNLINKs every key matching pattern on one server (one key at a time on a
// cluster master: the keys of a batch are in many slots).
func deleteNodeKeys(ctx context.Context, c *redis.Client, pattern string) (int, error) {
	var cursor uint64
	n := 0
	for {
		keys, next, err := c.Scan(ctx, cursor, pattern, 2000).Result()
		if err != nil {
			return n, fmt.Errorf("scan %s: %w", pattern, err)
		}
		if len(keys) > 0 {
			pipe := c.Pipeline()
			for _, k := range keys {
				pipe.Unlink(ctx, k)
			}
			if _, err := pipe.Exec(ctx); err != nil {
				return n, fmt.Errorf("unlink: %w", err)
			}
			n += len(keys)
		}
		if cursor = next; cursor == 0 {
			return n, nil
		}
	}
}

// freeLoopbackListener binds 127.0.0.1:0 for a baseline server.
func freeLoopbackListener() (net.Listener, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("listen on loopback: %w", err)
	}
	return l, nil
}

// errStalled is returned when a drain stops making progress.
var errStalled = errors.New("no progress")

// setServiceCPU records the CPU time of the service's own process and says what it is per
// request.
func (r *PhaseResult) setServiceCPU(seconds float64) {
	r.ServiceCPUSeconds = &seconds
	note := fmt.Sprintf("the service's process used %.2f cores", seconds/r.Seconds)
	if r.Count > 0 {
		note += fmt.Sprintf(", %.0f µs per 2xx answer", seconds/float64(r.Count)*1e6)
	}
	r.Note = strings.TrimPrefix(r.Note+"; "+note, "; ")
}
