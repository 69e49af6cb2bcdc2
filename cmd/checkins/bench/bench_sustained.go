package bench

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/checkins/checkins/adapters"
)

// sustainedRound gives the sustained load checkinIds of its own (ingest uses rounds 0-3).
const sustainedRound = 100

// PhaseSustained runs the ingest load against an in-process serve with every selected projection
// and default settings, and measures until the projections have caught up: fully projected
// check-ins/s, the figure that matters, with what the projections still owed when the load
// stopped.
func (b *bencher) PhaseSustained(ctx context.Context) (PhaseResult, error) {
	keys := b.keys(b.prefix("sustained"))
	rs, err := b.newService(ctx, keys.Prefix, Mode{API: true, Projections: true}, b.runID+"-sustained")
	if err != nil {
		return PhaseResult{}, err
	}
	rs.start(ctx)
	stopped := false
	defer func() {
		if !stopped {
			_ = rs.stop()
		}
	}()
	if err := rs.waitReady(ctx); err != nil {
		return PhaseResult{}, err
	}
	if err := rs.waitHTTP(ctx, "/healthz"); err != nil {
		return PhaseResult{}, err
	}
	fail := make(chan error, 1)
	rs.watch("service", fail)
	before, err := b.xlen(ctx, keys)
	if err != nil {
		return PhaseResult{}, err
	}

	m := b.startMeter(ctx)
	lr := closedLoop(ctx, "http://"+rs.addr+"/checkins", b.opts.Clients, b.opts.Duration, newPayloadSource(b.runID), sustainedRound, true, b.tokens)
	loadStopped := time.Now()
	if err := ctx.Err(); err != nil {
		m.Stop()
		return PhaseResult{}, err
	}
	// Every 2xx answer came after its XADD, so each partition's last entry now is its last
	// accepted one.
	lastIDs, err := b.lastEntryIDs(ctx, keys)
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
		if elapsed, err = b.waitDrained(ctx, lastIDs, rs.groups(), lr.start, fail); err != nil {
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
	stopErr := rs.stop()

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
	want := newExpectedModel()
	for _, c := range lr.accepted {
		want.add(c)
	}
	ok, detail, err := b.verifyReadModels(ctx, keys, want)
	if err != nil {
		return PhaseResult{}, fmt.Errorf("verify read models: %w", err)
	}
	if detail != "" {
		problems = append(problems, detail)
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
