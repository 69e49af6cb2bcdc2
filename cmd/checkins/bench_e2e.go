package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/checkins/checkins/adapters"
	"github.com/checkins/checkins/app/projection"
)

// phaseE2E posts check-ins at a fixed rate to an in-process serve and measures, for each, the
// time from its 202 to the user projection counting it. Every check-in goes to a new user, so
// "visible" is simply numCheckins = 1 on that user, and one poller checks all pending ones with
// one pipelined HGET round every millisecond: the polling stays cheap next to the service.
func (b *bencher) phaseE2E(ctx context.Context) (PhaseResult, error) {
	keys := adapters.KeySpace{Prefix: b.prefix("e2e")}
	rs, err := b.newService(ctx, keys.Prefix, Mode{API: true, Projections: true}, b.runID+"-e2e")
	if err != nil {
		return PhaseResult{}, err
	}
	rs.start(ctx)
	defer func() { _ = rs.stop() }()
	if err := rs.waitReady(ctx); err != nil {
		return PhaseResult{}, err
	}
	users := projection.UserStats{}
	version, err := adapters.NewProjectionVersions(b.admin, keys).Current(ctx, users.Name())
	if err != nil {
		return PhaseResult{}, err
	}
	poller := &visibilityPoller{client: b.admin, keyOf: func(userID int64) string {
		rec := &recordingReader{}
		_, _ = users.Get(ctx, rec, userID)
		return keys.ProjectionKey(users.Name(), version, rec.last.slot, rec.last.key)
	}}
	m := b.startMeter(ctx)
	pollStop := make(chan struct{})
	pollDone := make(chan struct{})
	go func() { defer close(pollDone); poller.run(ctx, pollStop) }()

	url := "http://" + rs.addr + "/checkins"
	hc := newLoadClient(b.opts.Clients)
	defer hc.CloseIdleConnections()
	total := max(int64(b.opts.Rate*b.opts.Duration.Seconds()), 1)
	jobs := make(chan int64, 4096)
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		postLat []time.Duration
		errs    = map[string]int64{}
		ok      atomic.Int64
	)
	for w := range b.opts.Clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 99))
			var lat []time.Duration
			local := map[string]int64{}
			buf := make([]byte, 0, 160)
			for id := range jobs {
				buf = append(buf[:0], `{"checkinId":"`...)
				buf = append(buf, b.runID...)
				buf = append(buf, "-v"...)
				buf = strconv.AppendInt(buf, id, 10)
				buf = append(buf, `","userId":`...)
				buf = strconv.AppendInt(buf, id, 10)
				buf = append(buf, `,"locationId":`...)
				buf = strconv.AppendInt(buf, 1+rng.Int64N(1000), 10)
				buf = append(buf, `,"starRating":`...)
				buf = strconv.AppendInt(buf, rng.Int64N(6), 10)
				buf = append(buf, '}')
				t := time.Now()
				status, err := postJSON(ctx, hc, url, buf)
				acked := time.Now()
				switch {
				case err != nil && ctx.Err() != nil:
				case err != nil:
					local["transport"]++
				case status >= 200 && status < 300:
					poller.add(id, acked)
					lat = append(lat, acked.Sub(t))
					ok.Add(1)
				default:
					local[strconv.Itoa(status)]++
				}
			}
			mu.Lock()
			postLat = append(postLat, lat...)
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
			jobs <- sent + 1
		}
	}
	tick.Stop()
	close(jobs)
	wg.Wait()
	sendElapsed := time.Since(t0)

	// Everything answered 202 must become visible; give the projections a generous while.
	deadline := time.Now().Add(30 * time.Second)
	for poller.pending.Load() > 0 && time.Now().Before(deadline) && ctx.Err() == nil {
		time.Sleep(5 * time.Millisecond)
	}
	close(pollStop)
	<-pollDone
	use := m.Stop()
	if err := ctx.Err(); err != nil {
		return PhaseResult{}, err
	}
	r := PhaseResult{Phase: phaseE2E, Count: ok.Load(), Seconds: sendElapsed.Seconds(), Unit: "req/s",
		Throughput: float64(ok.Load()) / sendElapsed.Seconds(), Latency: summarize(poller.latencies),
		PostLatency: summarize(postLat), Check: checkOK}
	use.fill(&r)
	if len(errs) > 0 {
		r.Errors = errs
	}
	var problems []string
	if n := poller.pending.Load(); n > 0 {
		problems = append(problems, fmt.Sprintf("%d accepted check-ins were not visible after 30s", n))
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
	if len(problems) > 0 {
		r.Check, r.CheckDetail = checkMismatch, strings.Join(problems, "; ")
	}
	if offered := float64(total) / b.opts.Duration.Seconds(); r.PostLatency != nil && r.Throughput < 0.95*offered {
		r.Note = fmt.Sprintf("offered %.0f/s but only %.0f/s were answered: %d senders could not keep up (POST p50 %s), so the latencies are not at the offered rate",
			offered, r.Throughput, b.opts.Clients, fmtMs(r.PostLatency.P50))
	}
	return r, nil
}

// visibilityPoller watches accepted check-ins until the user projection counts them.
type visibilityPoller struct {
	client *redis.Client
	keyOf  func(userID int64) string

	mu       sync.Mutex
	incoming []pendingCheckin
	pending  atomic.Int64

	// Written by run only; read after it returned.
	latencies []time.Duration
	wrong     int
	err       error
}

type pendingCheckin struct {
	key   string
	acked time.Time
}

func (p *visibilityPoller) add(userID int64, acked time.Time) {
	pc := pendingCheckin{key: p.keyOf(userID), acked: acked}
	p.pending.Add(1)
	p.mu.Lock()
	p.incoming = append(p.incoming, pc)
	p.mu.Unlock()
}

// run checks every pending check-in once per millisecond in one pipeline. A check-in counts as
// visible at the end of the round that saw it, so figures are late by at most a round.
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
		pipe := p.client.Pipeline()
		cmds := make([]*redis.StringCmd, len(pending))
		for i, pc := range pending {
			cmds[i] = pipe.HGet(ctx, pc.key, "numCheckins")
		}
		if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
			if ctx.Err() == nil {
				p.err = err
			}
			continue
		}
		now := time.Now()
		keep := pending[:0]
		for i, pc := range pending {
			v, err := cmds[i].Result()
			if err != nil {
				keep = append(keep, pc)
				continue
			}
			p.latencies = append(p.latencies, now.Sub(pc.acked))
			if v != "1" {
				p.wrong++
			}
			p.pending.Add(-1)
		}
		pending = keep
	}
}
