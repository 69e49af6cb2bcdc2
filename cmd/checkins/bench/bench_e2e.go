package bench

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/checkins/checkins/adapters"
	"github.com/checkins/checkins/app/projection"
	"github.com/checkins/checkins/domain"
)

// PhaseE2E posts check-ins at a fixed rate to an in-process serve and measures, for each, the
// time from its 202 to the users projection counting it (recent_checkins listing it when users
// is not selected). Every check-in goes to a new user, so "visible" is simply one check-in on
// that user, and one poller reads all pending ones through the projection's own query every
// millisecond, pipelined: the polling stays cheap next to the service. Once the load is over and
// every group caught up, every selected read model is checked against the accepted check-ins.
func (b *bencher) PhaseE2E(ctx context.Context) (PhaseResult, error) {
	keys := b.keys(b.prefix("e2e"))
	rs, err := b.newService(ctx, keys.Prefix, Mode{API: true, Projections: true}, b.runID+"-e2e")
	if err != nil {
		return PhaseResult{}, err
	}
	rs.start(ctx)
	defer func() { _ = rs.stop() }()
	if err := rs.waitReady(ctx); err != nil {
		return PhaseResult{}, err
	}
	fail := make(chan error, 1)
	rs.watch("service", fail)
	poller := &visibilityPoller{count: b.visibleCount(keys)}
	m := b.startMeter(ctx)
	pollStop := make(chan struct{})
	pollDone := make(chan struct{})
	go func() { defer close(pollDone); poller.run(ctx, pollStop) }()

	url := "http://" + rs.addr + "/checkins"
	hc := newLoadClient(b.opts.Clients)
	defer hc.CloseIdleConnections()
	total := max(int64(b.opts.Rate*b.opts.Duration.Seconds()), 1)
	// Each request with the time it is due: its latency is counted from then, not from when a
	// sender got to it (a stall of the service held the queue, and the requests that waited it
	// out were timed from after it: p99 7-35 ms where they waited up to a second).
	type job struct {
		id  int64
		due time.Time
	}
	jobs := make(chan job, 4096)
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		postLat  []time.Duration
		errs     = map[string]int64{}
		ok       atomic.Int64
		accepted []domain.Checkin
	)
	for w := range b.opts.Clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 99)) // #nosec G115 G404 -- a reproducible load generator's seed, not a secret
			var lat []time.Duration
			var mine []domain.Checkin
			local := map[string]int64{}
			buf := make([]byte, 0, 192)
			for j := range jobs {
				id := j.id
				// The timestamp is sent (as "now") so the accepted check-in is known exactly.
				c := domain.Checkin{ID: b.runID + "-v" + strconv.FormatInt(id, 10), UserID: id,
					LocationID: 1 + rng.Int64N(1000), StarRating: rng.IntN(6), Timestamp: time.Now().UnixMilli()}
				buf = append(buf[:0], `{"checkinId":"`...)
				buf = append(buf, c.ID...)
				buf = append(buf, `","userId":`...)
				buf = strconv.AppendInt(buf, c.UserID, 10)
				buf = append(buf, `,"locationId":`...)
				buf = strconv.AppendInt(buf, c.LocationID, 10)
				buf = append(buf, `,"starRating":`...)
				buf = strconv.AppendInt(buf, int64(c.StarRating), 10)
				buf = append(buf, `,"timestamp":`...)
				buf = strconv.AppendInt(buf, c.Timestamp, 10)
				buf = append(buf, '}')
				token := b.tokens.forUser(c.UserID)
				status, err := postJSON(ctx, hc, url, buf, token)
				acked := time.Now()
				switch {
				case err != nil && ctx.Err() != nil:
				case err != nil:
					local["transport"]++
				case status >= 200 && status < 300:
					poller.add(id, acked)
					lat = append(lat, acked.Sub(j.due))
					mine = append(mine, c)
					ok.Add(1)
				default:
					local[strconv.Itoa(status)]++
				}
			}
			mu.Lock()
			postLat = append(postLat, lat...)
			accepted = append(accepted, mine...)
			for k, v := range local {
				errs[k] += v
			}
			mu.Unlock()
		}()
	}

	// Open loop: request i is due at t0 + i/rate whatever the answers do; if the service falls
	// behind, the achieved rate shows it.
	t0 := time.Now()
	tick := time.NewTicker(time.Millisecond)
	var sent int64
dispatch:
	for sent < total {
		select {
		case <-ctx.Done():
			break dispatch
		case <-tick.C:
		}
		due := min(int64(time.Since(t0).Seconds()*b.opts.Rate)+1, total)
		for ; sent < due; sent++ {
			jobs <- job{id: sent + 1, due: t0.Add(time.Duration(float64(sent) / b.opts.Rate * float64(time.Second)))}
		}
	}
	tick.Stop()
	close(jobs)
	wg.Wait()
	sendElapsed := time.Since(t0)

	// Everything answered 202 must become visible: wait until every group caught up (or stalls),
	// then give the poller a last few rounds.
	var drainErr error
	if lastIDs, err := b.lastEntryIDs(ctx, keys); err != nil {
		drainErr = err
	} else if anyEntry(lastIDs) {
		_, drainErr = b.waitDrained(ctx, lastIDs, rs.groups(), t0, fail)
	}
	deadline := time.Now().Add(5 * time.Second)
	for drainErr == nil && poller.pending.Load() > 0 && time.Now().Before(deadline) && ctx.Err() == nil {
		time.Sleep(5 * time.Millisecond)
	}
	close(pollStop)
	<-pollDone
	use := m.Stop()
	if err := ctx.Err(); err != nil {
		return PhaseResult{}, err
	}
	r := PhaseResult{Phase: PhaseE2E, Count: ok.Load(), Seconds: sendElapsed.Seconds(), Unit: "req/s",
		Throughput: float64(ok.Load()) / sendElapsed.Seconds(), Latency: summarize(poller.latencies),
		PostLatency: summarize(postLat), Check: CheckOK}
	use.fill(&r)
	if len(errs) > 0 {
		r.Errors = errs
	}
	var problems []string
	if drainErr != nil {
		problems = append(problems, "the projections did not catch up: "+drainErr.Error())
	}
	if n := poller.pending.Load(); n > 0 {
		problems = append(problems, fmt.Sprintf("%d accepted check-ins were not visible once the projections caught up", n))
	}
	if poller.wrong > 0 {
		problems = append(problems, fmt.Sprintf("%d users counted more than one check-in", poller.wrong))
	}
	if poller.err != nil {
		problems = append(problems, "polling failed: "+poller.err.Error())
	}
	if r.Count == 0 {
		problems = append(problems, "no check-in was accepted")
	}
	failed := len(problems) > 0
	if drainErr == nil {
		want := newExpectedModel()
		for _, c := range accepted {
			want.add(c)
		}
		same, detail, err := b.verifyReadModels(ctx, keys, want)
		if err != nil {
			return PhaseResult{}, fmt.Errorf("verify read models: %w", err)
		}
		failed = failed || !same
		if detail != "" {
			problems = append(problems, detail)
		}
	}
	r.CheckDetail = strings.Join(problems, "; ")
	if failed {
		r.Check = CheckMismatch
	}
	if offered := float64(total) / b.opts.Duration.Seconds(); r.PostLatency != nil && r.Throughput < 0.95*offered {
		r.Note = fmt.Sprintf("offered %.0f/s but only %.0f/s were answered: %d senders could not keep up (POST p50 %s), so the latencies are not at the offered rate",
			offered, r.Throughput, b.opts.Clients, fmtMs(r.PostLatency.P50))
	}
	return r, nil
}

// visibleCount counts a user's check-ins through the projection e2e watches: users (its
// numCheckins) or else recent_checkins (how many it lists); 0 until the user appears.
func (b *bencher) visibleCount(keys adapters.KeySpace) func(ctx context.Context, userID int64) (int64, error) {
	if slices.Contains(b.opts.Projections, projection.UserStats{}.Name()) {
		users := projection.UserStats{}
		r := adapters.NewProjectionReader(b.reads, keys, users.Name())
		return func(ctx context.Context, id int64) (int64, error) {
			v, err := users.Get(ctx, r, id)
			if errors.Is(err, domain.ErrNotFound) {
				return 0, nil
			}
			return v.NumCheckins, err
		}
	}
	recent := projection.RecentCheckins{}
	r := adapters.NewProjectionReader(b.reads, keys, recent.Name())
	return func(ctx context.Context, id int64) (int64, error) {
		v, err := recent.Get(ctx, r, id)
		if errors.Is(err, domain.ErrNotFound) {
			return 0, nil
		}
		return int64(len(v.Checkins)), err
	}
}

// visibilityPoller watches accepted check-ins until the projection counts them.
type visibilityPoller struct {
	count func(ctx context.Context, userID int64) (int64, error)

	mu       sync.Mutex
	incoming []pendingCheckin
	pending  atomic.Int64

	// Written by run only; read after it returned.
	latencies []time.Duration
	wrong     int
	err       error
}

type pendingCheckin struct {
	userID int64
	acked  time.Time
}

func (p *visibilityPoller) add(userID int64, acked time.Time) {
	p.pending.Add(1)
	p.mu.Lock()
	p.incoming = append(p.incoming, pendingCheckin{userID: userID, acked: acked})
	p.mu.Unlock()
}

// run checks every pending check-in once per millisecond, the reads of a round in flight
// together (b.reads pipelines them). A check-in counts as visible when the read that saw it
// returned, not when its whole round did: a round shares the two cores and the Redis thread
// with the service, and took up to 24 ms for seven reads under the default load. Six runs
// read p99 12.6-25.3 ms this way and 13.3-30.1 ms by the rounds' ends.
func (p *visibilityPoller) run(ctx context.Context, stop <-chan struct{}) {
	t := time.NewTicker(time.Millisecond)
	defer t.Stop()
	var pending []pendingCheckin
	for {
		select {
		case <-stop:
			return
		case <-ctx.Done():
			return
		case <-t.C:
		}
		p.mu.Lock()
		pending = append(pending, p.incoming...)
		p.incoming = p.incoming[:0]
		p.mu.Unlock()
		if len(pending) == 0 {
			continue
		}
		counts, errs, seen := make([]int64, len(pending)), make([]error, len(pending)), make([]time.Time, len(pending))
		parallel(len(pending), verifyWorkers, func(i int) {
			counts[i], errs[i] = p.count(ctx, pending[i].userID)
			seen[i] = time.Now()
		})
		keep := pending[:0]
		for i, pc := range pending {
			switch {
			case errs[i] != nil:
				if ctx.Err() == nil {
					p.err = errs[i]
				}
				keep = append(keep, pc)
			case counts[i] == 0:
				keep = append(keep, pc)
			default:
				p.latencies = append(p.latencies, seen[i].Sub(pc.acked))
				if counts[i] != 1 {
					p.wrong++
				}
				p.pending.Add(-1)
			}
		}
		pending = keep
	}
}
