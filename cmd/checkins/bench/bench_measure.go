package bench

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"slices"
	"strconv"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/redis/go-redis/v9"
)

// LatencySummary is in milliseconds.
type LatencySummary struct {
	P50 float64 `json:"p50"`
	P95 float64 `json:"p95"`
	P99 float64 `json:"p99"`
	Max float64 `json:"max"`
	N   int     `json:"n"`
}

func summarize(ds []time.Duration) *LatencySummary {
	if len(ds) == 0 {
		return nil
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	at := func(q float64) float64 {
		i := int(q*float64(len(s))+0.999999) - 1 // nearest rank
		i = min(max(i, 0), len(s)-1)
		return float64(s[i]) / float64(time.Millisecond)
	}
	return &LatencySummary{P50: at(0.50), P95: at(0.95), P99: at(0.99), Max: at(1), N: len(s)}
}

// meter measures one phase: peak RSS and Go heap of the process, sampled every 100 ms (the
// kernel's VmHWM cannot be reset between phases), and the CPU time this process and Redis used.
type meter struct {
	stop      chan struct{}
	done      chan struct{}
	mu        sync.Mutex
	rss, heap uint64
	cpu0      time.Duration
	redis0    float64
	redisCPU  func() float64
}

// phaseUsage is what a meter measured.
type phaseUsage struct {
	rss, heap           uint64
	cpu, redisCPU, wall float64 // seconds
	began               time.Time
}

// startMeter first returns freed memory to the OS, so a phase is not charged with the previous
// phase's garbage.
func (b *bencher) startMeter(ctx context.Context) *meter {
	runtime.GC()
	debug.FreeOSMemory()
	m := &meter{stop: make(chan struct{}), done: make(chan struct{}), redisCPU: func() float64 { return redisCPUSeconds(ctx, b.admin) }}
	m.redis0 = m.redisCPU()
	m.cpu0 = processCPU()
	m.sample()
	go func() {
		defer close(m.done)
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-t.C:
				m.sample()
			case <-m.stop:
				m.sample()
				return
			}
		}
	}()
	return m
}

func (m *meter) sample() {
	rss := readRSS()
	// Heap objects (live and not yet swept), as MemStats.HeapAlloc, without stopping the world.
	s := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
	metrics.Read(s)
	var heap uint64
	if s[0].Value.Kind() == metrics.KindUint64 {
		heap = s[0].Value.Uint64()
	}
	m.mu.Lock()
	m.rss, m.heap = max(m.rss, rss), max(m.heap, heap)
	m.mu.Unlock()
}

// Stop ends the measurement.
func (m *meter) Stop() phaseUsage {
	cpu := processCPU() - m.cpu0
	redisCPU := m.redisCPU() - m.redis0
	close(m.stop)
	<-m.done
	m.mu.Lock()
	defer m.mu.Unlock()
	return phaseUsage{rss: m.rss, heap: m.heap, cpu: cpu.Seconds(), redisCPU: max(redisCPU, 0)}
}

// fill copies the measurement into a phase's row.
func (u phaseUsage) fill(r *PhaseResult) {
	r.PeakRSS, r.PeakHeap = u.rss, u.heap
	r.CPUSeconds, r.RedisCPUSeconds = u.cpu, u.redisCPU
}

// redisCPUSeconds is Redis's user+system CPU time from INFO cpu (0 when unavailable); on a
// cluster, summed over the masters.
func redisCPUSeconds(ctx context.Context, uc redis.UniversalClient) float64 {
	var mu sync.Mutex
	var total float64
	err := eachNode(ctx, uc, func(ctx context.Context, c *redis.Client) error {
		info, err := c.Info(ctx, "cpu").Result()
		if err != nil {
			return err
		}
		mu.Lock()
		defer mu.Unlock()
		for _, f := range []string{"used_cpu_sys", "used_cpu_user"} {
			v, _ := strconv.ParseFloat(InfoField(info, f), 64)
			total += v
		}
		return nil
	})
	if err != nil {
		return 0
	}
	return total
}

// readRSS is VmRSS in bytes, 0 where /proc is missing.
func readRSS() uint64 {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			kb, err := strconv.ParseUint(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
			if err != nil {
				return 0
			}
			return kb << 10
		}
	}
	return 0
}

func machineLine(res BenchResult) string {
	m := res.Machine
	return fmt.Sprintf("machine: nproc=%d GOMAXPROCS=%d %s %s, redis %s (%s), subscriber=%s batch_size=%d max_in_flight=%d, host %s, %s",
		m.NumCPU, m.GOMAXPROCS, m.GoVersion, m.OS, m.RedisVersion, m.Redis, res.Settings.Subscriber,
		res.Settings.BatchSize, res.Settings.MaxInFlight, m.Hostname, m.StartedAt)
}

func progressLine(r PhaseResult) string {
	s := r.Phase
	if r.Consumers > 0 {
		s += fmt.Sprintf(" consumers=%d", r.Consumers)
	}
	s += fmt.Sprintf(": %.0f %s over %.1fs", r.Throughput, r.Unit, r.Seconds)
	if r.Latency != nil {
		s += fmt.Sprintf(", p50 %s p99 %s", fmtMs(r.Latency.P50), fmtMs(r.Latency.P99))
	}
	s += ", check " + r.Check
	if r.CheckDetail != "" {
		s += " (" + r.CheckDetail + ")"
	}
	if r.Note != "" {
		s += "; " + r.Note
	}
	return s
}

// printBenchTable writes the human-readable result.
func printBenchTable(w io.Writer, res BenchResult) {
	fmt.Fprintln(w, machineLine(res))
	s := res.Settings
	fmt.Fprintf(w, "settings: projections=%s duration=%s clients=%d events=%d consumers=%v rate=%g/s memory-events=%d",
		strings.Join(s.Projections, ","), time.Duration(s.DurationSec*float64(time.Second)), s.Clients, s.Events, s.Consumers, s.Rate, s.MemoryEvents)
	if s.Target != "" {
		fmt.Fprintf(w, " target=%s", s.Target)
	}
	if s.BaselineTarget != "" {
		fmt.Fprintf(w, " baseline-target=%s", s.BaselineTarget)
	}
	fmt.Fprintf(w, " auth=%s rate-limit-user=%s", s.AuthMode, s.RateLimitUse)
	fmt.Fprintf(w, ", total %.0fs\n", res.Seconds)
	if res.Records != nil {
		fmt.Fprintln(w, recordsLine(res.Records))
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "PHASE\tCONS\tTHROUGHPUT\tUNIT\tP50\tP95\tP99\tMAX\tERRORS\tCHECK\tCPU GO\tCPU REDIS\tPEAK RSS\tPEAK HEAP\tVS BASELINE\t")
	for _, r := range res.Phases {
		cons := "-"
		if r.Consumers > 0 {
			cons = strconv.Itoa(r.Consumers)
		}
		phase := r.Phase
		if r.Memory != nil {
			phase = fmt.Sprintf("%s N=%d", r.Phase, r.Memory.Events)
		}
		p50, p95, p99, pmax := "-", "-", "-", "-"
		if l := r.Latency; l != nil {
			p50, p95, p99, pmax = fmtMs(l.P50), fmtMs(l.P95), fmtMs(l.P99), fmtMs(l.Max)
		}
		ratio := "-"
		if r.VsBaseline != nil {
			ratio = fmt.Sprintf("%.2fx", *r.VsBaseline)
		}
		fmt.Fprintf(tw, "%s\t%s\t%.0f\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t\n", phase, cons, r.Throughput, r.Unit,
			p50, p95, p99, pmax, fmtErrors(r.Errors), r.Check, fmtCores(r.CPUSeconds, r.Seconds), fmtCores(r.RedisCPUSeconds, r.Seconds),
			fmtBytes(r.PeakRSS), fmtBytes(r.PeakHeap), ratio)
	}
	_ = tw.Flush()
	fmt.Fprintln(w)
	fmt.Fprintln(w, "ingest: 2xx answers/s with C clients, request latency; sustained: 2xx answers of serve (API and every")
	fmt.Fprintln(w, "selected projection) over the time until every consumer group caught up, i.e. fully projected check-ins/s,")
	fmt.Fprintln(w, "vs ingest-baseline; drain: stream entries/s fully processed by every selected projection, from start until")
	fmt.Fprintln(w, "every group delivered the last entry with nothing pending; e2e latency: 202 answer -> visible in the user")
	fmt.Fprintln(w, "projection; memory: Redis memory of the projections per distinct check-in (used_memory growth minus the")
	fmt.Fprintln(w, "stream on a private server, sum of MEMORY USAGE on a shared one). CPU: cores used on average during the")
	fmt.Fprintln(w, "phase by this process (service, load generator and baseline alike) and by redis-server. RSS/heap: peaks")
	fmt.Fprintln(w, "of this process.")
	if res.Settings.Target != "" || res.Settings.BaselineTarget != "" {
		fmt.Fprintln(w, "--target/--baseline-target: the service and the baseline run in processes of their own; the CPU GO and")
		fmt.Fprintln(w, "RSS/heap of their rows are this process's, the load generator's alone.")
	}
	if e := res.Serial; e != nil {
		fmt.Fprintf(w, "sustained: %.0f/s is %.2fx of %.0f/s = 1/(1/ingest + 1/drain) = 1/(1/%.0f + 1/%.0f (%d consumers)), what one\n",
			e.Sustained, e.Ratio, e.Estimate, e.Ingest, e.Drain, e.DrainConsumers)
		fmt.Fprintln(w, "  process recording then projecting each check-in would take on these cores")
	}
	if len(res.Costs) > 0 {
		fmt.Fprintln(w, "cpu: µs of CPU per 2xx answer = this process + redis-server [+ the process at --target/--baseline-target],")
		fmt.Fprintln(w, "  and the ratio to the baseline that those costs allow at the same use of the cores:")
		for _, c := range res.Costs {
			parts := fmt.Sprintf("%.0f + %.0f", c.Process, c.Redis)
			if c.Service != nil {
				parts += fmt.Sprintf(" + %.0f", *c.Service)
			}
			line := fmt.Sprintf("  %-15s %4.0f µs = %s at %.2f cores", c.Phase, c.Micros, parts, c.Cores)
			if c.Allows != nil {
				line += fmt.Sprintf(": %.2fx", *c.Allows)
			}
			fmt.Fprintln(w, line)
		}
	}
	for _, r := range res.Phases {
		if r.PostLatency != nil {
			fmt.Fprintf(w, "%s: POST latency p50 %s p99 %s max %s\n", r.Phase, fmtMs(r.PostLatency.P50), fmtMs(r.PostLatency.P99), fmtMs(r.PostLatency.Max))
		}
		if r.Note != "" {
			fmt.Fprintf(w, "%s: %s\n", r.Phase, r.Note)
		}
		if r.CheckDetail != "" {
			cons := ""
			if r.Consumers > 0 {
				cons = fmt.Sprintf(" (%d consumers)", r.Consumers)
			}
			fmt.Fprintf(w, "%s%s check %s: %s\n", r.Phase, cons, r.Check, r.CheckDetail)
		}
	}
	for _, r := range res.Phases {
		if r.Memory != nil {
			fmt.Fprintf(w, "memory N=%d by key (MEMORY USAGE, SAMPLES 0; * dedupe/bookkeeping, not a read model):\n", r.Memory.Events)
			for _, line := range fmtBreakdown(r.Memory.Breakdown) {
				fmt.Fprintf(w, "  %s\n", line)
			}
		}
	}
}

// fmtBreakdown shows one line per owner: its total and each kind of key, e.g.
// "users  1.2 MiB: seen* 1.1 MiB in 200 keys, stats 20.0 KiB in 200 keys".
func fmtBreakdown(groups []MemoryKeyGroup) []string {
	var owners []string
	total := map[string]int64{}
	kinds := map[string][]string{}
	width := 0
	for _, g := range groups {
		if _, ok := total[g.Owner]; !ok {
			owners = append(owners, g.Owner)
			width = max(width, len(g.Owner))
		}
		total[g.Owner] += g.Bytes
		mark := ""
		if g.Bookkeeping {
			mark = "*"
		}
		kinds[g.Owner] = append(kinds[g.Owner], fmt.Sprintf("%s%s %s in %d keys", g.Kind, mark, fmtSize(g.Bytes), g.Keys))
	}
	lines := make([]string, len(owners))
	for i, o := range owners {
		lines[i] = fmt.Sprintf("%-*s %10s: %s", width, o, fmtSize(total[o]), strings.Join(kinds[o], ", "))
	}
	return lines
}

func fmtMs(ms float64) string {
	switch {
	case ms < 10:
		return fmt.Sprintf("%.2fms", ms)
	case ms < 1000:
		return fmt.Sprintf("%.1fms", ms)
	default:
		return fmt.Sprintf("%.2fs", ms/1000)
	}
}

// fmtCores shows CPU time over wall time as a share of one core ("1.42 cores").
func fmtCores(cpu, wall float64) string {
	if wall <= 0 || cpu <= 0 {
		return "n/a"
	}
	return fmt.Sprintf("%.2f", cpu/wall)
}

func fmtBytes(b uint64) string {
	if b == 0 {
		return "n/a"
	}
	return fmt.Sprintf("%.0f MiB", float64(b)/(1<<20))
}

func fmtErrors(errs map[string]int64) string {
	if len(errs) == 0 {
		return "0"
	}
	keys := make([]string, 0, len(errs))
	for k := range errs {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s:%d", k, errs[k])
	}
	return strings.Join(parts, ",")
}
