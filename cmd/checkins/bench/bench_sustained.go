package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/checkins/checkins/adapters"
	"github.com/checkins/checkins/domain"
)

// sustainedRound gives the sustained load checkinIds of its own (ingest uses rounds 0-3).
const sustainedRound = 100

// PhaseSustained runs the ingest load against an in-process serve with every selected projection
// and default settings, or against --target (a serve the operator runs, found in Redis through
// REDIS_URL and KEY_PREFIX), and measures until the projections have caught up: fully projected
// check-ins/s, the figure that matters, with what the projections still owed when the load
// stopped.
func (b *bencher) PhaseSustained(ctx context.Context) (PhaseResult, error) {
	side, err := b.sustainedSide(ctx)
	if err != nil {
		return PhaseResult{}, err
	}
	stopped := false
	defer func() {
		if !stopped {
			_ = side.stop()
		}
	}()
	keys := side.keys
	// A side that stops (the in-process service exits, or --target stops answering) ends the
	// load at once and fails the phase with the reason, rather than as a stall of the wait.
	loadCtx, stopLoad := context.WithCancelCause(ctx)
	defer stopLoad(nil)
	fail := make(chan error, 1)
	go func() {
		select {
		case err := <-side.fail:
			stopLoad(err)
			fail <- err
		case <-loadCtx.Done():
		}
	}()
	// A target may still be projecting what came before (the ingest phase's load, say): the
	// figure starts from projections with nothing left to do.
	lastIDs, err := b.lastGeneratedIDs(ctx, keys)
	if err != nil {
		return PhaseResult{}, err
	}
	if anyEntry(lastIDs) {
		if _, err := b.waitGroups(ctx, lastIDs, side.groups, side.onlyGroups, time.Now(), fail); err != nil {
			return PhaseResult{}, fmt.Errorf("waiting for the projections to catch up before the load: %w", err)
		}
	}
	// Entries ever added, not XLEN: a target's RETENTION may trim the stream meanwhile.
	parkedBefore, err := b.parked(ctx, keys)
	if err != nil {
		return PhaseResult{}, err
	}
	before, err := b.added(ctx, keys)
	if err != nil {
		return PhaseResult{}, err
	}
	var cpu0 float64
	if side.cpu != nil {
		if cpu0, err = side.cpu(ctx); err != nil {
			return PhaseResult{}, err
		}
	}

	m := b.startMeter(ctx)
	lr := closedLoop(loadCtx, side.url, b.opts.Clients, b.opts.Duration, newPayloadSource(b.runID), sustainedRound, true, b.tokens)
	loadStopped := time.Now()
	if err := context.Cause(loadCtx); err != nil {
		m.Stop()
		return PhaseResult{}, err
	}
	// Every 2xx answer came after its XADD, so each partition's last entry now is its last
	// accepted one.
	lastIDs, err = b.lastGeneratedIDs(ctx, keys)
	if err != nil {
		m.Stop()
		return PhaseResult{}, err
	}
	backlog, err := b.backlog(ctx, keys, side.groups, side.onlyGroups)
	if err != nil {
		m.Stop()
		return PhaseResult{}, err
	}
	elapsed := loadStopped.Sub(lr.start)
	if anyEntry(lastIDs) {
		if elapsed, err = b.waitGroups(ctx, lastIDs, side.groups, side.onlyGroups, lr.start, fail); err != nil {
			m.Stop()
			return PhaseResult{}, err
		}
	}
	use := m.Stop()
	var serviceCPU float64
	if side.cpu != nil {
		cpu1, err := side.cpu(ctx)
		if err != nil {
			return PhaseResult{}, err
		}
		serviceCPU = cpu1 - cpu0
	}
	backlog.DrainSeconds = max(elapsed-loadStopped.Sub(lr.start), 0).Seconds()
	after, err := b.added(ctx, keys)
	if err != nil {
		return PhaseResult{}, err
	}
	stopped = true
	stopErr := side.stop()

	r := PhaseResult{Phase: PhaseSustained, Count: lr.ok, Seconds: elapsed.Seconds(), Unit: "checkins/s",
		Throughput: float64(lr.ok) / elapsed.Seconds(), Latency: summarize(lr.lat), Backlog: &backlog}
	use.fill(&r)
	if len(lr.errs) > 0 {
		r.Errors = lr.errs
	}
	r.Note = fmt.Sprintf("when the load stopped after %.1fs (%.0f req/s answered) the projections were %d entries behind (the most any of %d groups had undelivered + pending) and caught up %.1fs later",
		lr.elapsed.Seconds(), float64(lr.ok)/lr.elapsed.Seconds(), backlog.EntriesBehind, len(backlog.Groups), backlog.DrainSeconds)
	if side.note != "" {
		r.Note += "; " + side.note
	}
	if side.cpu != nil {
		r.setServiceCPU(serviceCPU)
	}

	var problems []string
	answered := lr.ok + lr.warm
	switch {
	case lr.ok == 0:
		problems = append(problems, fmt.Sprintf("no request was answered 2xx (errors: %s)", fmtErrors(lr.errs)))
	case after-before != answered:
		problems = append(problems, fmt.Sprintf("%d entries were added to the stream but %d requests were answered 2xx (%d of them warm-ups)", after-before, answered, lr.warm))
	}
	// A parked entry is acknowledged: its groups look caught up, though no read model holds it.
	parkedAfter, err := b.parked(ctx, keys)
	if err != nil {
		return PhaseResult{}, err
	}
	parked := parkedAfter - parkedBefore
	if parked > 0 {
		problems = append(problems, fmt.Sprintf("%d entries were parked in the poison queue %s during the run: not projected (checkins poison list)", parked, keys.PoisonStream()))
	}
	want, skip, err := side.expect(ctx, lr.accepted)
	if err != nil {
		return PhaseResult{}, err
	}
	ok := parked == 0
	if skip != "" {
		problems = append(problems, skip)
	} else {
		var detail string
		var same bool
		if same, detail, err = b.verifyReadModels(ctx, keys, want); err != nil {
			return PhaseResult{}, fmt.Errorf("verify read models: %w", err)
		}
		if detail != "" {
			problems = append(problems, detail)
		}
		ok = ok && same
	}
	if stopErr != nil {
		ok = false
		problems = append(problems, "stopping the service failed: "+stopErr.Error())
	}
	r.Check, r.CheckDetail = CheckOK, strings.Join(problems, "; ")
	if !ok || lr.ok == 0 || after-before != answered {
		r.Check = CheckMismatch
	}
	return r, nil
}

// backlog is what the consumer groups the phase waits for still owe, summed over the
// partitions: entries not delivered yet (XINFO GROUPS lag, counted when Redis cannot tell) and
// pending ones. With onlyWant, only the groups in want (as waitGroups): a group on a target's
// stream that nobody reads owed every entry of the load, and was the backlog printed.
func (b *bencher) backlog(ctx context.Context, keys adapters.KeySpace, want []string, onlyWant bool) (BacklogResult, error) {
	out := BacklogResult{Groups: map[string]GroupBacklog{}}
	for _, stream := range keys.Partitions().Streams() {
		infos, err := b.admin.XInfoGroups(ctx, stream).Result()
		if adapters.IsNoSuchKey(err) {
			continue // a partition nothing was written to yet
		}
		if err != nil {
			return BacklogResult{}, fmt.Errorf("XINFO GROUPS %s: %w", stream, err)
		}
		for _, g := range infos {
			if onlyWant && !slices.Contains(want, g.Name) {
				continue
			}
			lag := g.Lag
			if lag < 0 {
				if lag, err = b.countAfter(ctx, stream, g.LastDeliveredID); err != nil {
					return BacklogResult{}, err
				}
			}
			gb := out.Groups[g.Name]
			gb.Undelivered += lag
			gb.Pending += g.Pending
			out.Groups[g.Name] = gb
		}
	}
	for _, gb := range out.Groups {
		out.EntriesBehind = max(out.EntriesBehind, gb.Undelivered+gb.Pending)
	}
	return out, nil
}

// countAfter counts the stream's entries after id.
func (b *bencher) countAfter(ctx context.Context, stream, id string) (int64, error) {
	var n int64
	for {
		ms, err := b.admin.XRangeN(ctx, stream, "("+id, "+", 10000).Result()
		if err != nil {
			return 0, fmt.Errorf("XRANGE %s: %w", stream, err)
		}
		n += int64(len(ms))
		if len(ms) < 10000 {
			return n, nil
		}
		id = ms[len(ms)-1].ID
	}
}

// sustainedSide is what the sustained load goes to: an in-process serve, or --target.
type sustainedSide struct {
	url    string
	keys   adapters.KeySpace
	groups []string // consumer groups that must catch up
	// onlyGroups: wait for groups alone (a target's), not for every group on the stream.
	onlyGroups bool
	note       string // what the result should say about the side
	// cpu reads the CPU seconds of the target's process (nil: in-process, or unknown).
	cpu  func(context.Context) (float64, error)
	fail chan error
	stop func() error
	// expect is the independent computation the read models are compared with, or why they
	// are not compared.
	expect func(ctx context.Context, accepted []domain.Checkin) (want *expectedModel, skip string, err error)
}

// sustainedSide starts the in-process serve, or finds --target's stream and consumer groups.
func (b *bencher) sustainedSide(ctx context.Context) (*sustainedSide, error) {
	if b.opts.Target != "" {
		return b.targetSide(ctx)
	}
	keys := b.keys(b.prefix("sustained"))
	rs, err := b.newService(ctx, keys.Prefix, Mode{API: true, Projections: true}, b.runID+"-sustained")
	if err != nil {
		return nil, err
	}
	rs.start(ctx)
	if err := rs.waitReady(ctx); err != nil {
		_ = rs.stop()
		return nil, err
	}
	if err := rs.waitHTTP(ctx, "/healthz"); err != nil {
		_ = rs.stop()
		return nil, err
	}
	fail := make(chan error, 1)
	rs.watch("service", fail)
	return &sustainedSide{url: "http://" + rs.addr + "/checkins", keys: keys, groups: rs.groups(), fail: fail, stop: rs.stop,
		expect: func(_ context.Context, accepted []domain.Checkin) (*expectedModel, string, error) {
			want := newExpectedModel()
			for _, c := range accepted {
				want.add(c)
			}
			return want, "", nil
		}}, nil
}

// targetSide is --target: a service the operator runs on REDIS_URL under KEY_PREFIX. What it
// waits for are the consumer groups some consumer reads; a group without one (left by a
// process that ran another PROJECTIONS list, say) would never catch up, and is named instead.
func (b *bencher) targetSide(ctx context.Context) (*sustainedSide, error) {
	if b.redis.private {
		return nil, errors.New("--target needs the target's Redis to tell when its projections have caught up: set REDIS_URL (and KEY_PREFIX, STREAM_PARTITIONS) as the target has them")
	}
	keys := b.keys(b.cfg.KeyPrefix)
	if err := adapters.CheckPartitions(ctx, b.admin, keys, b.partitions()); err != nil {
		return nil, fmt.Errorf("--target: set STREAM_PARTITIONS as the target has it: %w", err)
	}
	read, unread, err := b.targetGroups(ctx, keys)
	if err != nil {
		return nil, err
	}
	if len(read) == 0 {
		return nil, fmt.Errorf("no consumer reads %s: the target must run the projections (serve, or api beside project) on REDIS_URL with KEY_PREFIX=%s", strings.Join(keys.Partitions().Streams(), ", "), keys.Prefix)
	}
	watchCtx, stopWatch := context.WithCancel(ctx)
	side := &sustainedSide{url: b.opts.Target + "/checkins", keys: keys, groups: read, onlyGroups: true, fail: make(chan error, 1),
		stop: func() error { stopWatch(); return nil },
		// The target's read models hold every check-in of its stream, not only this run's.
		expect: func(ctx context.Context, _ []domain.Checkin) (*expectedModel, string, error) {
			return b.streamModel(ctx, keys)
		}}
	if b.opts.TargetMetrics != "" {
		side.cpu = b.targetCPU
	}
	go watchTarget(watchCtx, b.opts.Target, targetProbe, side.fail)
	if len(unread) > 0 {
		side.note = fmt.Sprintf("not waited for: consumer groups no consumer reads (%s; XGROUP DESTROY one that no version uses)", strings.Join(unread, ", "))
	}
	return side, nil
}

// targetProbe is how often watchTarget asks a target whether it still answers.
const targetProbe = 500 * time.Millisecond

// watchTarget asks base's /healthz every interval until ctx ends, and sends to fail once three
// asks in a row got no HTTP answer at all: a target that stopped (killed, crashed, its listener
// gone) would otherwise show only as the wait's stall, 30s after its consumer groups stopped
// moving. Any answer, whatever its status, is a target that still runs.
func watchTarget(ctx context.Context, base string, interval time.Duration, fail chan<- error) {
	hc := &http.Client{Timeout: 5 * time.Second}
	failed := 0
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/healthz", nil)
		if err != nil {
			fail <- fmt.Errorf("--target %s: %w", base, err)
			return
		}
		resp, err := hc.Do(req)
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			_ = resp.Body.Close()
			failed = 0
			continue
		}
		if ctx.Err() != nil {
			return
		}
		if failed++; failed == 3 {
			fail <- fmt.Errorf("the target %s stopped answering (3 requests for /healthz in a row got no answer, the last: %w): its projections cannot be waited for", base, err)
			return
		}
	}
}

// targetGroups are the names of the consumer groups on keys' stream partitions that some
// consumer reads, and of those none does.
func (b *bencher) targetGroups(ctx context.Context, keys adapters.KeySpace) (read, unread []string, err error) {
	consumers := map[string]int64{}
	for _, stream := range keys.Partitions().Streams() {
		infos, err := b.admin.XInfoGroups(ctx, stream).Result()
		if adapters.IsNoSuchKey(err) {
			continue
		}
		if err != nil {
			return nil, nil, fmt.Errorf("XINFO GROUPS %s: %w", stream, err)
		}
		for _, g := range infos {
			consumers[g.Name] += g.Consumers
		}
	}
	for _, name := range slices.Sorted(maps.Keys(consumers)) {
		if consumers[name] > 0 {
			read = append(read, name)
		} else {
			unread = append(unread, name)
		}
	}
	return read, unread, nil
}

// streamModel is the independent computation from every entry of keys' stream partitions:
// what a target's read models hold, whoever wrote its entries. A copy of a check-in counts
// again when its entry is more than DEDUPE_WINDOW (the bench's, which must be the target's)
// after the counted copy's, as the projections decide. The read models cannot be computed
// from a stream that lost entries (RETENTION, XDEL), nor when entries were parked in the
// poison queue (their updates were never applied), nor from entries that are not events.
func (b *bencher) streamModel(ctx context.Context, keys adapters.KeySpace) (*expectedModel, string, error) {
	const chunk = 10000
	if n, err := b.admin.XLen(ctx, keys.PoisonStream()).Result(); err != nil {
		return nil, "", fmt.Errorf("XLEN %s: %w", keys.PoisonStream(), err)
	} else if n > 0 {
		return nil, fmt.Sprintf("read models not compared: the target's poison queue %s holds %d entries, whose updates are not in them (checkins poison list)", keys.PoisonStream(), n), nil
	}
	window := b.cfg.DedupeWindow
	if window == 0 {
		window = adapters.DefaultDedupeWindow
	}
	w := adapters.ScoreOfTime(time.UnixMilli(window.Milliseconds())) // in entry scores
	want := newExpectedModel()
	counted := map[int64]int64{} // identity -> the entry score it was last counted at
	fields := map[string]string{}
	infos, err := b.streamInfos(ctx, keys)
	if err != nil {
		return nil, "", err
	}
	for _, stream := range keys.Partitions().Streams() {
		xs := infos[stream]
		if xs == nil {
			continue
		}
		if xs.EntriesAdded != xs.Length {
			return nil, fmt.Sprintf("read models not compared: %s holds %d fewer entries than were ever added to it (trimmed or deleted), so they cannot be computed from it", stream, xs.EntriesAdded-xs.Length), nil
		}
		for start := "-"; ; {
			ms, err := b.admin.XRangeN(ctx, stream, start, "+", chunk).Result()
			if err != nil {
				return nil, "", fmt.Errorf("XRANGE %s: %w", stream, err)
			}
			for _, m := range ms {
				clear(fields)
				for k, v := range m.Values {
					s, _ := v.(string)
					fields[k] = s
				}
				ev, err := domain.ParseEvent(m.ID, fields)
				if err != nil {
					return nil, fmt.Sprintf("read models not compared: entry %s of %s is not an event (%v)", m.ID, stream, err), nil
				}
				c, ok := ev.(domain.CheckinRecorded)
				if !ok {
					continue
				}
				score, ok := adapters.ScoreOfEntry(m.ID)
				if !ok {
					return nil, "", fmt.Errorf("entry ID %q of %s is not ms-seq", m.ID, stream)
				}
				// A user's entries are all in one partition, in order: each copy is judged
				// against the copy counted last, as the user's dedupe registry judges it.
				id := c.Identity()
				if last, seen := counted[id]; seen && score-last <= w {
					continue
				}
				counted[id] = score
				want.addCopy(c)
			}
			if len(ms) < chunk {
				break
			}
			start = "(" + ms[len(ms)-1].ID
		}
	}
	return want, "", nil
}

// streamInfos is XINFO STREAM of each of keys' stream partitions that exists.
func (b *bencher) streamInfos(ctx context.Context, keys adapters.KeySpace) (map[string]*redis.XInfoStream, error) {
	out := map[string]*redis.XInfoStream{}
	for _, s := range keys.Partitions().Streams() {
		xs, err := b.admin.XInfoStream(ctx, s).Result()
		if adapters.IsNoSuchKey(err) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("XINFO STREAM %s: %w", s, err)
		}
		out[s] = xs
	}
	return out, nil
}

// added is how many entries were ever added to keys' stream partitions (XINFO STREAM
// entries-added), which trimming does not change.
// parked is how many entries were ever added to the poison queue (0 when it does not exist).
func (b *bencher) parked(ctx context.Context, keys adapters.KeySpace) (int64, error) {
	xs, err := b.admin.XInfoStream(ctx, keys.PoisonStream()).Result()
	if adapters.IsNoSuchKey(err) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("XINFO STREAM %s: %w", keys.PoisonStream(), err)
	}
	return xs.EntriesAdded, nil
}

func (b *bencher) added(ctx context.Context, keys adapters.KeySpace) (int64, error) {
	infos, err := b.streamInfos(ctx, keys)
	var total int64
	for _, xs := range infos {
		total += xs.EntriesAdded
	}
	return total, err
}

// lastGeneratedIDs is the ID of the last entry ever added to each partition ("" for one that
// never had any): what its consumer groups must have delivered, even when RETENTION has
// trimmed the entry away since.
func (b *bencher) lastGeneratedIDs(ctx context.Context, keys adapters.KeySpace) (map[string]string, error) {
	infos, err := b.streamInfos(ctx, keys)
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, s := range keys.Partitions().Streams() {
		if xs := infos[s]; xs != nil && xs.LastGeneratedID != "0-0" {
			out[s] = xs.LastGeneratedID
		} else {
			out[s] = ""
		}
	}
	return out, nil
}
