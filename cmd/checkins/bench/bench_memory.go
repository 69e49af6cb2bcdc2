package bench

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/checkins/checkins/adapters"
	"github.com/checkins/checkins/domain"
)

// The population of the memory phase: fixed, so that read models stay the same size and only
// what grows with every check-in shows as growth from N to 2N.
const (
	memoryUsers     = 200
	memoryLocations = 50
	memoryHistory   = 30 * 24 * time.Hour
	// memoryRetryWithin: a republished copy repeats a check-in of at most this long before (or
	// DEDUPE_WINDOW, when that is shorter).
	memoryRetryWithin = 24 * time.Hour
)

// Which figure a memory row's throughput and growth use.
const (
	FigureUsedMemory = "used_memory" // INFO memory delta: what Redis really holds, on a private server
	FigurePerKey     = "per_key"     // sum of MEMORY USAGE: immune to other clients of a shared Redis
)

// MemoryResult is what one memory run measured, in bytes.
type MemoryResult struct {
	Events    int `json:"events"`   // stream entries written, republished ones included
	Checkins  int `json:"checkins"` // distinct check-ins among them
	Users     int `json:"users"`
	Locations int `json:"locations"`

	UsedMemoryBefore int64 `json:"used_memory_before"` // INFO memory, before the preload
	UsedMemoryAfter  int64 `json:"used_memory_after"`  // after the drain, the projector stopped
	// StreamUsedMemory is what preloading the stream added to used_memory.
	StreamUsedMemory int64 `json:"stream_used_memory"`
	StreamBytes      int64 `json:"stream_bytes"`      // MEMORY USAGE <stream> SAMPLES 0, groups included
	IdempotencyBytes int64 `json:"idempotency_bytes"` // <prefix>:idem:* (none expected: nothing went through the API)
	PoisonBytes      int64 `json:"poison_bytes"`
	// ProjectionBytes is used_memory after - before - stream - idempotency - poison.
	ProjectionBytes int64 `json:"projection_bytes"`
	// PerKeyBytes is the sum of MEMORY USAGE over every other key of the run: read models,
	// dedupe state, the projections registry.
	PerKeyBytes int64 `json:"per_key_bytes"`
	// Per distinct check-in.
	BytesPerCheckin       float64 `json:"bytes_per_checkin"`
	PerKeyBytesPerCheckin float64 `json:"per_key_bytes_per_checkin"`
	// Figure is what the row's throughput and GrowthPct use: used_memory on a private
	// redis-server, per_key on a shared REDIS_URL (other clients move used_memory).
	Figure string `json:"figure"`
	// GrowthPct (the 2N run): projection memory at 2N over that at N, minus 1, in percent. Read
	// models of a fixed population do not grow; whatever does grows with every check-in.
	GrowthPct    *float64         `json:"growth_pct,omitempty"`
	DrainSeconds float64          `json:"drain_seconds"`
	DrainRate    float64          `json:"drain_events_per_second"`
	Breakdown    []MemoryKeyGroup `json:"breakdown"`
	// MarkersLeft are markers of the projector's last batches it still held when the phase
	// stopped waiting for it to let go of them (5 s): counted in ProjectionBytes, and said so.
	MarkersLeft int64 `json:"markers_left,omitempty"`
}

// MemoryKeyGroup is the keys of one owner and kind.
type MemoryKeyGroup struct {
	Owner       string `json:"owner"`                 // projection name, or stream, poison, idempotency, registry, other
	Kind        string `json:"kind"`                  // the key's last segment: stats, recent, daily, seen, ...
	Bookkeeping bool   `json:"bookkeeping,omitempty"` // dedupe state, not a read model (bookkeepingKeyNames)
	Keys        int    `json:"keys"`
	Bytes       int64  `json:"bytes"`
}

// PhaseMemory preloads n events of a month of history, drains them with one projector running
// every selected projection, and measures what Redis holds for them besides the stream. prior
// are the rows so far: the run with n/2 events gives the growth.
func (b *bencher) PhaseMemory(ctx context.Context, n int, prior []PhaseResult) (PhaseResult, error) {
	keys := b.keys(b.prefix(fmt.Sprintf("memory-%d", n)))
	defer func() {
		cctx := context.WithoutCancel(ctx)
		if _, err := deleteKeys(cctx, b.admin, keys.Prefix+":*"); err != nil {
			b.log.Warn("bench: could not delete memory keys", "prefix", keys.Prefix, "error", err)
		}
		_ = b.waitLazyFree(cctx)
	}()
	if err := b.waitLazyFree(ctx); err != nil {
		return PhaseResult{}, err
	}
	clients0, err := b.connectedClients(ctx)
	if err != nil {
		return PhaseResult{}, err
	}
	before, err := b.settledMemory(ctx)
	if err != nil {
		return PhaseResult{}, err
	}
	data, err := b.preloadHistory(ctx, keys, n)
	if err != nil {
		return PhaseResult{}, fmt.Errorf("preload: %w", err)
	}
	// The stream itself is measured as what it added to used_memory: MEMORY USAGE of a stream
	// is an estimate, off by more than the projections' whole memory at these sizes.
	withStream, err := b.usedMemory(ctx)
	if err != nil {
		return PhaseResult{}, err
	}

	rs, err := b.newService(ctx, keys.Prefix, Mode{Projections: true}, fmt.Sprintf("%s-memory-%d", b.runID, n))
	if err != nil {
		return PhaseResult{}, err
	}
	fail := make(chan error, 1)
	m, t0 := b.startMeter(ctx), time.Now()
	rs.start(ctx)
	rs.watch("projector", fail)
	lastIDs := map[string]string{}
	for i, s := range keys.Partitions().Streams() {
		lastIDs[s] = data.lastIDs[i]
	}
	elapsed, waitErr := b.waitDrained(ctx, lastIDs, rs.groups(), t0, fail)
	use := m.Stop()
	var markersLeft int64
	if waitErr == nil {
		// What a caught-up service holds: once its group is quiet the projector lets go of the
		// markers of its last batches (within a few checkpoint intervals).
		markersLeft, waitErr = b.waitMarkersSwept(ctx, keys)
	}
	stopErr := rs.stop()
	if waitErr != nil {
		return PhaseResult{}, waitErr
	}
	// The projector's connections are gone before used_memory is read again: their buffers are
	// not what is measured.
	if err := b.waitClients(ctx, clients0); err != nil {
		return PhaseResult{}, err
	}
	if err := b.waitLazyFree(ctx); err != nil {
		return PhaseResult{}, err
	}
	after, err := b.usedMemory(ctx)
	if err != nil {
		return PhaseResult{}, err
	}
	mr := MemoryResult{Events: n, Checkins: data.want.distinct(), Users: len(data.want.users), Locations: len(data.want.locs),
		UsedMemoryBefore: before, UsedMemoryAfter: after, DrainSeconds: elapsed.Seconds(), DrainRate: float64(n) / elapsed.Seconds(),
		MarkersLeft: markersLeft}
	if err := b.memoryBreakdown(ctx, keys, &mr); err != nil {
		return PhaseResult{}, err
	}
	mr.StreamUsedMemory = withStream - before
	mr.ProjectionBytes = after - withStream - mr.IdempotencyBytes - mr.PoisonBytes
	mr.BytesPerCheckin = float64(mr.ProjectionBytes) / float64(mr.Checkins)
	mr.PerKeyBytesPerCheckin = float64(mr.PerKeyBytes) / float64(mr.Checkins)
	mr.Figure = FigureUsedMemory
	if !b.redis.private {
		mr.Figure = FigurePerKey
	}

	r := PhaseResult{Phase: PhaseMemory, Count: int64(n), Seconds: elapsed.Seconds(), Unit: "B/checkin",
		Throughput: mr.figure(), Memory: &mr}
	use.fill(&r)
	r.Note = fmt.Sprintf("N=%d events (%d distinct check-ins, %d users, %d locations): projection memory %s = used_memory after the drain - used_memory with the stream loaded (the stream added %s; MEMORY USAGE says %s) - idempotency %s - poison %s; per-key sum %s (%.0f B/check-in); drained in %.1fs (%.0f events/s)",
		n, mr.Checkins, mr.Users, mr.Locations, fmtSize(mr.ProjectionBytes), fmtSize(mr.StreamUsedMemory), fmtSize(mr.StreamBytes),
		fmtSize(mr.IdempotencyBytes), fmtSize(mr.PoisonBytes), fmtSize(mr.PerKeyBytes), mr.PerKeyBytesPerCheckin,
		mr.DrainSeconds, mr.DrainRate)
	if mr.MarkersLeft > 0 {
		r.Note += fmt.Sprintf("; NOTE: %d markers of the projector's last batches were still held after 5 s and are counted in the projection memory", mr.MarkersLeft)
	}
	for _, p := range prior {
		if p.Phase == PhaseMemory && p.Memory != nil && 2*p.Memory.Events == n && p.Memory.figureBytes() > 0 {
			g := (float64(mr.figureBytes())/float64(p.Memory.figureBytes()) - 1) * 100
			mr.GrowthPct = &g
			r.Note += fmt.Sprintf("; growth from N=%d: %+.1f%% (by %s)", p.Memory.Events, g, mr.Figure)
			if mr.Figure != FigurePerKey && p.Memory.PerKeyBytes > 0 {
				// The keys' own sum beside it: used_memory also moves with the server's tables.
				r.Note += fmt.Sprintf(", %+.1f%% by the keys' MEMORY USAGE", (float64(mr.PerKeyBytes)/float64(p.Memory.PerKeyBytes)-1)*100)
			}
		}
	}

	if err := b.checkReadModels(ctx, &r, keys, data.want, "the projector", stopErr); err != nil {
		return PhaseResult{}, err
	}
	return r, nil
}

func (m *MemoryResult) figureBytes() int64 {
	if m.Figure == FigurePerKey {
		return m.PerKeyBytes
	}
	return m.ProjectionBytes
}

func (m *MemoryResult) figure() float64 { return float64(m.figureBytes()) / float64(m.Checkins) }

// preloadHistory writes n entries as the publisher does (FlatMarshaller over the event's Fields)
// with explicit IDs spread evenly over the 30 days ending now, recordedAt being the entry's
// time and the check-in's timestamp up to 10 minutes before it. One entry in a hundred
// republishes a recent check-in unchanged, as a retried publish would.
func (b *bencher) preloadHistory(ctx context.Context, keys adapters.KeySpace, n int) (*drainData, error) {
	start := time.Now()
	parts := keys.Partitions()
	d := &drainData{source: keys, entries: n, want: newExpectedModel(), lastIDs: make([]string, parts.Count())}
	rng := rand.New(rand.NewPCG(uint64(n), 13)) // #nosec G115 G404 -- a reproducible load generator's seed, not a secret
	end := time.Now().UnixMilli()
	span := memoryHistory.Milliseconds()
	from := end - span
	recent := make([]domain.CheckinRecorded, 0, 1000)
	var lastMs, seq int64
	fresh := 0 // check-ins written so far, republished copies not counted
	retryWithin := memoryRetryWithin
	if w := b.cfg.DedupeWindow; w > 0 && w < retryWithin {
		retryWithin = w
	}
	const batch = 1000
	for lo := 0; lo < n; lo += batch {
		pipe := b.admin.Pipeline()
		for i := lo; i < min(lo+batch, n); i++ {
			ms := from + (int64(i)+1)*span/int64(n)
			if ms == lastMs {
				seq++
			} else {
				lastMs, seq = ms, 0
			}
			var ev domain.CheckinRecorded
			if i%100 == 99 && len(recent) > 0 {
				ev = recent[rng.IntN(len(recent))]
				if ev.RecordedAt < ms-retryWithin.Milliseconds() {
					// A retry comes within a day: with few events over the month the ring reaches
					// further back (beyond DEDUPE_WINDOW such a copy is a new check-in, not what
					// this models), so the latest check-in is taken instead.
					ev = recent[(fresh-1)%cap(recent)]
				}
			} else {
				// IDs of a fixed width, as the API's UUIDs: N and 2N differ only in how many.
				ev = domain.CheckinRecorded{Checkin: domain.Checkin{
					ID: fmt.Sprintf("%s-e%08d", keys.Prefix, i), UserID: 1 + rng.Int64N(memoryUsers), LocationID: 1 + rng.Int64N(memoryLocations),
					StarRating: rng.IntN(domain.MaxStarRating + 1), Timestamp: ms - rng.Int64N(10*60*1000+1),
				}, RecordedAt: ms}
				if len(recent) < cap(recent) {
					recent = append(recent, ev)
				} else {
					recent[fresh%cap(recent)] = ev // a ring: the last thousand check-ins
				}
				fresh++
			}
			d.want.addEvent(ev)
			msg, err := adapters.NewEventMessage(ev.Fields(), b.runID+"-memory")
			if err != nil {
				return nil, err
			}
			pi := adapters.PartitionOf(ev.UserID, parts.Count())
			values, err := adapters.FlatMarshaller{}.Marshal(parts.Stream(pi), msg)
			if err != nil {
				return nil, err
			}
			// IDs grow over the whole run, so over each partition too.
			d.lastIDs[pi] = strconv.FormatInt(ms, 10) + "-" + strconv.FormatInt(seq, 10)
			pipe.XAdd(ctx, &redis.XAddArgs{Stream: parts.Stream(pi), ID: d.lastIDs[pi], Values: adapters.SortedXAddValues(values)})
		}
		if _, err := pipe.Exec(ctx); err != nil {
			return nil, fmt.Errorf("XADD to %s: %w", keys.Stream(), err)
		}
	}
	b.progress("memory: preloaded %d events over the last 30 days (%d users, %d locations, 1%% republished) in %.1fs",
		n, len(d.want.users), len(d.want.locs), time.Since(start).Seconds())
	return d, nil
}

// memoryBreakdown sizes every key of the run with MEMORY USAGE (SAMPLES 0: exact), grouped by
// owner and kind, and fills the stream, idempotency and poison figures and the per-key sum.
func (b *bencher) memoryBreakdown(ctx context.Context, keys adapters.KeySpace, mr *MemoryResult) error {
	prefixes := map[string]string{} // projection key prefix -> name
	versions := adapters.NewProjectionVersions(b.admin, keys)
	for _, p := range b.host.Projections(b.cfg) {
		v, err := versions.Current(ctx, p.Name())
		if err != nil {
			return err
		}
		prefixes[keys.ProjectionPrefix(p.Name(), v)] = p.Name()
	}
	groups := map[[2]string]*MemoryKeyGroup{}
	err := scanKeys(ctx, b, keys.Prefix+":*", func(ks []string) error {
		pipe := b.admin.Pipeline()
		cmds := make([]*redis.IntCmd, len(ks))
		for i, k := range ks {
			cmds[i] = pipe.MemoryUsage(ctx, k, 0)
		}
		if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
			return fmt.Errorf("MEMORY USAGE: %w", err)
		}
		for i, k := range ks {
			size, err := cmds[i].Result()
			if errors.Is(err, redis.Nil) {
				continue // deleted meanwhile
			}
			if err != nil {
				return fmt.Errorf("MEMORY USAGE %s: %w", k, err)
			}
			owner, kind := keyOwner(keys, prefixes, k)
			switch owner {
			case "stream":
				mr.StreamBytes += size
			case "idempotency":
				mr.IdempotencyBytes += size
			case "poison":
				mr.PoisonBytes += size
			default:
				mr.PerKeyBytes += size
			}
			g := groups[[2]string{owner, kind}]
			if g == nil {
				g = &MemoryKeyGroup{Owner: owner, Kind: kind, Bookkeeping: owner == "dedupe" || slices.Contains(bookkeepingKeyNames(), kind)}
				groups[[2]string{owner, kind}] = g
			}
			g.Keys++
			g.Bytes += size
		}
		return nil
	})
	if err != nil {
		return err
	}
	for _, g := range groups {
		mr.Breakdown = append(mr.Breakdown, *g)
	}
	slices.SortFunc(mr.Breakdown, func(a, b MemoryKeyGroup) int {
		return cmp.Or(cmp.Compare(a.Owner, b.Owner), cmp.Compare(b.Bytes, a.Bytes), cmp.Compare(a.Kind, b.Kind))
	})
	return nil
}

// keyOwner names what a key of the run belongs to and its kind (its last segment).
func keyOwner(keys adapters.KeySpace, projections map[string]string, k string) (owner, kind string) {
	parts := keys.Partitions()
	switch {
	case parts.Index(k) >= 0:
		return "stream", "events"
	case k == keys.PoisonStream():
		return "poison", "poison"
	case strings.HasPrefix(k, keys.IdempotencyPrefix()), k == keys.IdempotencyScopedSince():
		return "idempotency", "idem"
	case k == keys.Projections(), slices.Contains(partitionRegistries(parts), k), k == keys.Meta():
		return "registry", "projections"
	case strings.HasPrefix(k, keys.Prefix+":dedupe:"):
		return "dedupe", "window" // the check-ins counted in the last DEDUPE_WINDOW, per user
	case strings.HasPrefix(k, keys.Prefix+":applied:"):
		return "dedupe", "markers" // what each group applied and may deliver again
	}
	kind = k[strings.LastIndexByte(k, ':')+1:]
	for prefix, name := range projections {
		if strings.HasPrefix(k, prefix) {
			return name, kind
		}
	}
	return "other", kind
}

// usedMemory is INFO memory used_memory; on a cluster the masters' sum, so that a difference
// of two readings is the sum of each master's difference.
//
// On a private server a reading leaves out what is not the data:
//   - the per-command latency histograms: Redis 7 allocates one of about 25 KiB the first time
//     each command runs, so the first phase to use 30 commands read about 900 KiB more than the
//     same data held (the 100,000 events' projections at 1.7 MiB, their keys at 0.96 MiB), and
//     its growth to the next phase went negative. CONFIG RESETSTAT first frees them;
//   - what the connected clients hold (the sum of CLIENT LIST's tot-mem): a connection's query
//     and reply buffers come and go with the traffic, and moved one run's figure by 130 KiB
//     (INFO's mem_clients_normal is only brought up to date by the server's cron, too late for
//     a reading right after a pipeline);
//   - the slow log: each entry keeps up to 32 arguments of a command that took over 10 ms, a
//     few KiB for a projection script call, and a slow machine logs more of them in the longer
//     drain of 2N (5 entries during N's drain and 13 during 2N's, once: +22 KiB, which read
//     +10.8% from N to 2N where the keys grew +7.8%). SLOWLOG RESET first frees them.
//
// A shared server's statistics are not the bench's to reset, its user may lack CONFIG and
// CLIENT rights, and other clients move used_memory anyway: there the figure is the per-key
// sum, and this is the plain used_memory.
func (b *bencher) usedMemory(ctx context.Context) (int64, error) {
	return sumNodes(ctx, b.admin, func(ctx context.Context, c *redis.Client) (int64, error) {
		var info, clients *redis.StringCmd
		_, err := c.Pipelined(ctx, func(p redis.Pipeliner) error {
			if b.redis.private {
				p.ConfigResetStat(ctx)
				p.SlowLogReset(ctx)
			}
			info = p.Info(ctx, "memory")
			if b.redis.private {
				clients = p.ClientList(ctx)
			}
			return nil
		})
		if err != nil {
			return 0, fmt.Errorf("INFO memory: %w", err)
		}
		n, err := strconv.ParseInt(InfoField(info.Val(), "used_memory"), 10, 64)
		if err != nil {
			return 0, fmt.Errorf("INFO memory used_memory: %w", err)
		}
		if clients != nil {
			n -= clientsMemory(clients.Val())
			// The script cache stays once a phase has loaded the projector's scripts: counted,
			// the first reading of a run would or would not include it by the phases before.
			if sc, err := strconv.ParseInt(InfoField(info.Val(), "used_memory_scripts"), 10, 64); err == nil {
				n -= sc
			}
		}
		return n, nil
	})
}

// settledMemory is usedMemory once two readings 200 ms apart agree, on a private server (after
// keys are deleted Redis shrinks the keyspace's table in its cron, a few steps later); after 5 s
// it takes the last reading and says so. On a shared server other clients keep used_memory
// moving, and its figure is the per-key sum: one reading.
func (b *bencher) settledMemory(ctx context.Context) (int64, error) {
	if !b.redis.private {
		return b.usedMemory(ctx)
	}
	var last int64
	read := false
	settled, err := poll(ctx, 5*time.Second, 200*time.Millisecond, func() (bool, error) {
		now, err := b.usedMemory(ctx)
		if err != nil {
			return false, err
		}
		same := read && now == last
		last, read = now, true
		return same, nil
	})
	if err == nil && !settled {
		b.log.Warn("bench: used_memory did not settle within 5s; the memory phase starts from the last reading", "used_memory", last)
	}
	return last, err
}

// poll calls done until it says true (ok), fails, ctx ends, or timeout has passed (ok false,
// no error), waiting every between calls.
func poll(ctx context.Context, timeout, every time.Duration, done func() (bool, error)) (ok bool, err error) {
	deadline := time.Now().Add(timeout)
	for {
		if ok, err := done(); ok || err != nil {
			return ok, err
		}
		if time.Now().After(deadline) {
			return false, nil
		}
		select {
		case <-ctx.Done():
			return false, ctx.Err()
		case <-time.After(every):
		}
	}
}

// clientsMemory is what the connected clients held when the INFO memory just before the CLIENT
// LIST that replied list ran: the sum of the tot-mem fields (0 for a server without them),
// less the reading connection's own omem. That connection (the one whose command is CLIENT
// LIST) holds INFO's reply by then, which used_memory did not: when the reply does not fit the
// connection's reply buffer, which Redis 7 shrinks on an idle connection to as little as 1 KiB,
// it goes into a reply block of at least 16 KiB. Counted, that block moved the projections'
// figure by about 20 KiB from one reading to the next, and the memory growth from N to 2N by
// about 2 points (+10.3% before, +7.9% since, for the same data). What that connection held before,
// the small replies of the commands in front of INFO, fits its buffer.
func clientsMemory(list string) int64 {
	var sum int64
	for line := range strings.Lines(list) {
		var tot, omem int64
		reading := false
		for f := range strings.FieldsSeq(line) {
			k, v, _ := strings.Cut(f, "=")
			switch k {
			case "tot-mem":
				tot, _ = strconv.ParseInt(v, 10, 64)
			case "omem":
				omem, _ = strconv.ParseInt(v, 10, 64)
			case "cmd":
				reading = v == "client|list" || v == "client" // Redis 7, and 6 and earlier
			}
		}
		if reading {
			tot -= omem
		}
		sum += tot
	}
	return sum
}

// waitLazyFree waits until Redis has freed what UNLINK handed to its background thread, so that
// used_memory is not still shrinking from an earlier phase.
func (b *bencher) waitLazyFree(ctx context.Context) error {
	_, err := poll(ctx, 30*time.Second, 10*time.Millisecond, func() (bool, error) {
		pending, err := sumNodes(ctx, b.admin, func(ctx context.Context, c *redis.Client) (int64, error) {
			info, err := c.Info(ctx, "memory").Result()
			if err != nil {
				return 0, fmt.Errorf("INFO memory: %w", err)
			}
			n, _ := strconv.ParseInt(InfoField(info, "lazyfree_pending_objects"), 10, 64) // "unknown": 0
			return n, nil
		})
		return pending == 0, err
	})
	return err
}

func (b *bencher) connectedClients(ctx context.Context) (int64, error) {
	return sumNodes(ctx, b.admin, func(ctx context.Context, c *redis.Client) (int64, error) {
		info, err := c.Info(ctx, "clients").Result()
		if err != nil {
			return 0, fmt.Errorf("INFO clients: %w", err)
		}
		n, _ := strconv.ParseInt(InfoField(info, "connected_clients"), 10, 64)
		return n, nil
	})
}

// waitClients waits (up to 2s: on a shared Redis others come and go) until no more clients are
// connected than want.
func (b *bencher) waitClients(ctx context.Context, want int64) error {
	_, err := poll(ctx, 2*time.Second, 10*time.Millisecond, func() (bool, error) {
		n, err := b.connectedClients(ctx)
		return n <= want, err
	})
	return err
}

// fmtSize is a byte count for people: B, KiB or MiB.
func fmtSize(n int64) string {
	a := n
	if a < 0 {
		a = -a
	}
	switch {
	case a < 10<<10:
		return fmt.Sprintf("%d B", n)
	case a < 10<<20:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	default:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	}
}

// waitMarkersSwept waits until no marker set of the run holds anything (at most 5s), and says
// how many markers were left when it stopped waiting.
func (b *bencher) waitMarkersSwept(ctx context.Context, keys adapters.KeySpace) (int64, error) {
	var total int64
	_, err := poll(ctx, 5*time.Second, 100*time.Millisecond, func() (bool, error) {
		total = 0
		err := scanKeys(ctx, b, keys.Prefix+":applied:*", func(ks []string) error {
			for _, k := range ks {
				n, err := b.admin.ZCard(ctx, k).Result()
				if err != nil {
					return err
				}
				total += n
			}
			return nil
		})
		return total == 0, err
	})
	return total, err
}

// partitionRegistries are the registry hashes of every partition.
func partitionRegistries(p adapters.Partitions) []string {
	out := make([]string, p.Count())
	for i := range out {
		out[i] = p.Registry(i)
	}
	return out
}
