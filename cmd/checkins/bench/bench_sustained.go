package bench

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

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
	keys, fail := side.keys, side.fail
	// A target may still be projecting what came before (the ingest phase's load, say): the
	// figure starts from projections with nothing left to do.
	lastIDs, err := b.lastEntryIDs(ctx, keys)
	if err != nil {
		return PhaseResult{}, err
	}
	if anyEntry(lastIDs) {
		if _, err := b.waitDrained(ctx, lastIDs, side.groups, time.Now(), fail); err != nil {
			return PhaseResult{}, fmt.Errorf("waiting for the projections to catch up before the load: %w", err)
		}
	}
	before, err := b.xlen(ctx, keys)
	if err != nil {
		return PhaseResult{}, err
	}

	m := b.startMeter(ctx)
	lr := closedLoop(ctx, side.url, b.opts.Clients, b.opts.Duration, newPayloadSource(b.runID), sustainedRound, true, b.tokens)
	loadStopped := time.Now()
	if err := ctx.Err(); err != nil {
		m.Stop()
		return PhaseResult{}, err
	}
	// Every 2xx answer came after its XADD, so each partition's last entry now is its last
	// accepted one.
	lastIDs, err = b.lastEntryIDs(ctx, keys)
	if err != nil {
		m.Stop()
		return PhaseResult{}, err
	}
	backlog, err := b.backlog(ctx, keys)
	if err != nil {
		m.Stop()
		return PhaseResult{}, err
	}
	elapsed := loadStopped.Sub(lr.start)
	if anyEntry(lastIDs) {
		if elapsed, err = b.waitDrained(ctx, lastIDs, side.groups, lr.start, fail); err != nil {
			m.Stop()
			return PhaseResult{}, err
		}
	}
	use := m.Stop()
	backlog.DrainSeconds = max(elapsed-loadStopped.Sub(lr.start), 0).Seconds()
	after, err := b.xlen(ctx, keys)
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

	var problems []string
	answered := lr.ok + lr.warm
	switch {
	case lr.ok == 0:
		problems = append(problems, fmt.Sprintf("no request was answered 2xx (errors: %s)", fmtErrors(lr.errs)))
	case after-before != answered:
		problems = append(problems, fmt.Sprintf("stream grew by %d entries but %d requests were answered 2xx (%d of them warm-ups)", after-before, answered, lr.warm))
	}
	want, skip, err := side.expect(ctx, lr.accepted)
	if err != nil {
		return PhaseResult{}, err
	}
	ok := true
	if skip != "" {
		problems = append(problems, skip)
	} else {
		var detail string
		if ok, detail, err = b.verifyReadModels(ctx, keys, want); err != nil {
			return PhaseResult{}, fmt.Errorf("verify read models: %w", err)
		}
		if detail != "" {
			problems = append(problems, detail)
		}
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

// backlog is what every consumer group on the stream still owes, summed over the partitions:
// entries not delivered yet (XINFO GROUPS lag, counted when Redis cannot tell) and pending ones.
func (b *bencher) backlog(ctx context.Context, keys adapters.KeySpace) (BacklogResult, error) {
	out := BacklogResult{Groups: map[string]GroupBacklog{}}
	for _, stream := range keys.Partitions().Streams() {
		infos, err := b.admin.XInfoGroups(ctx, stream).Result()
		if err != nil {
			return BacklogResult{}, fmt.Errorf("XINFO GROUPS %s: %w", stream, err)
		}
		for _, g := range infos {
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
	groups []string // consumer groups that must catch up (besides every other group on the stream)
	fail   chan error
	stop   func() error
	// expect is the independent computation the read models are compared with, or why they
	// are not compared.
	expect func(ctx context.Context, accepted []domain.Checkin) (want *expectedModel, skip string, err error)
}

// sustainedSide starts the in-process serve, or finds --target's stream and consumer groups.
func (b *bencher) sustainedSide(ctx context.Context) (*sustainedSide, error) {
	fromAccepted := func(_ context.Context, accepted []domain.Checkin) (*expectedModel, string, error) {
		want := newExpectedModel()
		for _, c := range accepted {
			want.add(c)
		}
		return want, "", nil
	}
	if b.opts.Target != "" {
		if b.redis.private {
			return nil, errors.New("--target needs the target's Redis to tell when its projections have caught up: set REDIS_URL (and KEY_PREFIX, STREAM_PARTITIONS) as the target has them")
		}
		keys := b.keys(b.cfg.KeyPrefix)
		groups, err := b.streamGroups(ctx, keys)
		if err != nil {
			return nil, err
		}
		if len(groups) == 0 {
			return nil, fmt.Errorf("no consumer group reads %s: the target must run the projections (serve, or api beside project) on REDIS_URL with KEY_PREFIX=%s", strings.Join(keys.Partitions().Streams(), ", "), keys.Prefix)
		}
		// The target's read models hold every check-in of its stream, not only this run's.
		return &sustainedSide{url: b.opts.Target + "/checkins", keys: keys, groups: groups, stop: func() error { return nil },
			expect: func(ctx context.Context, _ []domain.Checkin) (*expectedModel, string, error) {
				return b.streamModel(ctx, keys)
			}}, nil
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
	return &sustainedSide{url: "http://" + rs.addr + "/checkins", keys: keys, groups: rs.groups(), fail: fail, stop: rs.stop, expect: fromAccepted}, nil
}

// streamGroups are the names of the consumer groups on any of keys' stream partitions.
func (b *bencher) streamGroups(ctx context.Context, keys adapters.KeySpace) ([]string, error) {
	seen := map[string]bool{}
	for _, stream := range keys.Partitions().Streams() {
		infos, err := b.admin.XInfoGroups(ctx, stream).Result()
		if err != nil {
			if strings.Contains(err.Error(), "no such key") {
				continue
			}
			return nil, fmt.Errorf("XINFO GROUPS %s: %w", stream, err)
		}
		for _, g := range infos {
			seen[g.Name] = true
		}
	}
	return slices.Sorted(maps.Keys(seen)), nil
}

// streamModel is the independent computation from every entry of keys' stream partitions:
// what the read models of a target hold, whoever wrote its entries. A stream that lost entries
// (trimmed by RETENTION, or XDEL) cannot be compared with; neither can one with entries that are
// not check-ins (the target parked them in its poison queue).
func (b *bencher) streamModel(ctx context.Context, keys adapters.KeySpace) (*expectedModel, string, error) {
	const chunk = 10000
	want := newExpectedModel()
	fields := map[string]string{}
	for _, stream := range keys.Partitions().Streams() {
		xs, err := b.admin.XInfoStream(ctx, stream).Result()
		if err != nil {
			if strings.Contains(err.Error(), "no such key") {
				continue
			}
			return nil, "", fmt.Errorf("XINFO STREAM %s: %w", stream, err)
		}
		if xs.EntriesAdded != xs.Length {
			return nil, fmt.Sprintf("read models not compared: %s holds %d of the %d entries ever added to it (trimmed or deleted), so they cannot be computed from it", stream, xs.Length, xs.EntriesAdded), nil
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
				ev, err := domain.ParseEvent(fields)
				if err != nil {
					return nil, fmt.Sprintf("read models not compared: entry %s of %s is not an event (%v)", m.ID, stream, err), nil
				}
				if c, ok := ev.(domain.CheckinRecorded); ok {
					want.addEvent(c)
				}
			}
			if len(ms) < chunk {
				break
			}
			start = "(" + ms[len(ms)-1].ID
		}
	}
	return want, "", nil
}
