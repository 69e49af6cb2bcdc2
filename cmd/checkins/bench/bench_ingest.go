package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/checkins/checkins/adapters"
	"github.com/checkins/checkins/domain"
)

// payloadSource gives each client the same sequence of valid, varied check-ins in every phase,
// so ours and the baseline decode exactly the same bodies.
type payloadSource struct {
	runID string
	now   int64
}

func newPayloadSource(runID string) *payloadSource {
	return &payloadSource{runID: runID, now: time.Now().UnixMilli()}
}

// payloadGen is one client's generator; not safe for concurrent use.
type payloadGen struct {
	idPrefix []byte
	seq      int64
	rng      *rand.Rand
	now      int64
	last     domain.Checkin // the check-in of the last body, filled only when keep is set
	keep     bool
	user     int64 // the user of the last body
}

// client is client i's generator in a round: every round sends the same bodies but for their
// checkinIds, which stay distinct so no request is an idempotent replay.
func (s *payloadSource) client(round, i int) *payloadGen {
	return &payloadGen{idPrefix: []byte(s.runID + "-r" + strconv.Itoa(round) + "c" + strconv.Itoa(i) + "-"),
		rng: rand.New(rand.NewPCG(uint64(i), 42)), now: s.now} // #nosec G115 G404 -- a reproducible load generator's seed, not a secret
}

// loadUsers is how many users the closed-loop clients post for (users 1 to loadUsers).
const loadUsers = 10000

// next appends the next body to buf: a distinct checkinId, loadUsers users, 1,000 locations,
// every rating, timestamps spread over the last week (so they arrive out of order).
func (g *payloadGen) next(buf []byte) []byte {
	g.seq++
	user, loc, stars := 1+g.rng.Int64N(loadUsers), 1+g.rng.Int64N(1000), g.rng.Int64N(6)
	g.user = user
	ts := g.now - g.rng.Int64N(7*24*3600*1000)
	buf = append(buf, `{"checkinId":"`...)
	idAt := len(buf)
	buf = append(buf, g.idPrefix...)
	buf = strconv.AppendInt(buf, g.seq, 10)
	if g.keep {
		g.last = domain.Checkin{ID: string(buf[idAt:]), UserID: user, LocationID: loc, StarRating: int(stars), Timestamp: ts}
	}
	buf = append(buf, `","userId":`...)
	buf = strconv.AppendInt(buf, user, 10)
	buf = append(buf, `,"locationId":`...)
	buf = strconv.AppendInt(buf, loc, 10)
	buf = append(buf, `,"starRating":`...)
	buf = strconv.AppendInt(buf, stars, 10)
	buf = append(buf, `,"timestamp":`...)
	buf = strconv.AppendInt(buf, ts, 10)
	return append(buf, '}')
}

// newLoadClient is a keep-alive client with an idle connection kept for every sender.
func newLoadClient(clients int) *http.Client {
	return &http.Client{
		Transport: &http.Transport{Proxy: nil, MaxIdleConns: clients, MaxIdleConnsPerHost: clients,
			IdleConnTimeout: 90 * time.Second, DisableCompression: true},
		Timeout: 30 * time.Second,
	}
}

func postJSON(ctx context.Context, hc *http.Client, url string, body []byte, token string) (int, error) {
	// #nosec G704 -- the bench's own target, given by its operator
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return 0, err
	}
	req.Header.Set("Content-Type", "application/json")
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := hc.Do(req) // #nosec G704 -- the same
	if err != nil {
		return 0, err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	_ = resp.Body.Close()
	return resp.StatusCode, nil
}

// loadResult is what a closed-loop run measured.
type loadResult struct {
	ok      int64 // 2xx answers in the timed part
	warm    int64 // 2xx answers during warm-up (their events are on the stream too)
	lat     []time.Duration
	errs    map[string]int64
	start   time.Time // when the timed part began
	elapsed time.Duration
	// accepted are the check-ins answered 2xx, warm-ups included, when asked to keep them.
	accepted []domain.Checkin
}

// closedLoop runs `clients` senders, each posting its next check-in as soon as the previous one
// is answered, for d. Each sender first posts once untimed, so connections are open and scripts
// loaded before the clock starts. With keep, it remembers every check-in answered 2xx.
func closedLoop(ctx context.Context, url string, clients int, d time.Duration, src *payloadSource, round int, keep bool, tokens *benchTokens) loadResult {
	hc := newLoadClient(clients)
	defer hc.CloseIdleConnections()
	type senderResult struct {
		ok, warm int64
		lat      []time.Duration
		errs     map[string]int64
		accepted []domain.Checkin
	}
	results := make([]senderResult, clients)
	var warmed, finished sync.WaitGroup
	startc := make(chan time.Time)
	for i := range clients {
		warmed.Add(1)
		finished.Add(1)
		go func() {
			defer finished.Done()
			res := &results[i]
			res.errs = map[string]int64{}
			gen := src.client(round, i)
			gen.keep = keep
			buf := make([]byte, 0, 256)
			count := func(status int, err error) bool {
				switch {
				case err != nil && ctx.Err() != nil:
				case err != nil:
					res.errs["transport"]++
					time.Sleep(10 * time.Millisecond) // a refused connection must not turn into a spin
				case status >= 200 && status < 300:
					if keep {
						res.accepted = append(res.accepted, gen.last)
					}
					return true
				default:
					res.errs[strconv.Itoa(status)]++
				}
				return false
			}
			buf = gen.next(buf[:0])
			if count(postJSON(ctx, hc, url, buf, tokens.forUser(gen.user))) {
				res.warm++
			}
			warmed.Done()
			deadline := (<-startc).Add(d)
			for ctx.Err() == nil {
				buf = gen.next(buf[:0])
				t := time.Now()
				if !t.Before(deadline) {
					return
				}
				status, err := postJSON(ctx, hc, url, buf, tokens.forUser(gen.user))
				if count(status, err) {
					res.lat = append(res.lat, time.Since(t))
					res.ok++
				}
			}
		}()
	}
	warmed.Wait()
	t0 := time.Now()
	for range clients {
		startc <- t0
	}
	finished.Wait()
	out := loadResult{errs: map[string]int64{}, start: t0, elapsed: time.Since(t0)}
	for _, r := range results {
		out.ok += r.ok
		out.warm += r.warm
		out.lat = append(out.lat, r.lat...)
		out.accepted = append(out.accepted, r.accepted...)
		for k, v := range r.errs {
			out.errs[k] += v
		}
	}
	return out
}

// ingestTarget is one side of the ingest comparison: where to post and which stream to check.
type ingestTarget struct {
	phase  string
	url    string
	stream *adapters.KeySpace // whose stream partitions to check; nil when they cannot be (skip says why)
	skip   string
	close  func()
	acc    ingestTotals
	// cpu reads the CPU time of the process serving url (nil: the bench's own, or unknown).
	cpu func(context.Context) (float64, error)
}

// ingestTotals adds up a target's rounds.
type ingestTotals struct {
	load          loadResult
	grew          int64
	rss, heap     uint64
	cpu, redisCPU float64
	serviceCPU    float64
}

// phaseIngestPair runs ours and the baseline (or just one of them) in rounds of D/2 ordered
// ours, baseline, baseline, ours: a machine getting slower or faster during the run (it is shared)
// then weighs on both sides alike instead of skewing the ratio.
func (b *bencher) phaseIngestPair(ctx context.Context, ours, baseline bool) ([]PhaseResult, error) {
	var targets []*ingestTarget
	defer func() {
		for _, t := range targets {
			t.close()
		}
	}()
	if ours {
		t, err := b.ingestOurs(ctx)
		if err != nil {
			return nil, err
		}
		targets = append(targets, t)
	}
	if baseline {
		t, err := b.ingestBaseline(ctx)
		if err != nil {
			return nil, err
		}
		targets = append(targets, t)
	}
	order := []*ingestTarget{targets[0]}
	round := b.opts.Duration
	if len(targets) == 2 {
		order = []*ingestTarget{targets[0], targets[1], targets[1], targets[0]}
		round = b.opts.Duration / 2
	}
	src := newPayloadSource(b.runID)
	for i, t := range order {
		if err := b.ingestRound(ctx, t, src, i, round); err != nil {
			return nil, fmt.Errorf("%s: %w", t.phase, err)
		}
	}
	out := make([]PhaseResult, len(targets))
	for i, t := range targets {
		out[i] = t.result()
	}
	return out, nil
}

func (b *bencher) ingestOurs(ctx context.Context) (*ingestTarget, error) {
	t := &ingestTarget{phase: PhaseIngest, url: b.opts.Target + "/checkins", close: func() {}}
	switch {
	case b.opts.Target == "":
		prefix := b.prefix("ingest")
		rs, err := b.newService(ctx, prefix, Mode{API: true}, b.runID+"-api")
		if err != nil {
			return nil, err
		}
		rs.start(ctx)
		t.close = func() { _ = rs.stop() }
		if err := rs.waitHTTP(ctx, "/healthz"); err != nil {
			t.close()
			return nil, err
		}
		t.url = "http://" + rs.addr + "/checkins"
		k := b.keys(prefix)
		t.stream = &k
	case b.redis.private:
		t.skip = "--target without REDIS_URL: the target's stream is not reachable"
	default:
		// The target is assumed to use REDIS_URL and KEY_PREFIX as given to the bench.
		k := b.keys(b.cfg.KeyPrefix)
		if err := adapters.CheckPartitions(ctx, b.admin, k, b.partitions()); err != nil {
			return nil, fmt.Errorf("--target: set STREAM_PARTITIONS as the target has it: %w", err)
		}
		t.stream = &k
	}
	if b.opts.Target != "" && b.opts.TargetMetrics != "" {
		t.cpu = b.targetCPU
	}
	return t, nil
}

// ingestBaseline serves the same clients with the least a Redis-backed ingest can do.
func (b *bencher) ingestBaseline(ctx context.Context) (*ingestTarget, error) {
	if b.opts.BaselineTarget != "" {
		t := &ingestTarget{phase: PhaseIngestBaseline, url: b.opts.BaselineTarget + "/checkins", close: func() {},
			cpu: func(ctx context.Context) (float64, error) {
				return readCPU(ctx, b.opts.BaselineTarget+baselineCPUPath, false)
			}}
		if b.redis.private {
			t.skip = "--baseline-target without REDIS_URL: the target's stream is not reachable"
		} else {
			// The stream `checkins bench --serve-baseline` writes to with the same KEY_PREFIX.
			k := b.keys(b.cfg.KeyPrefix + "-baseline")
			t.stream = &k
		}
		return t, nil
	}
	keys := b.keys(b.prefix("ingest-baseline"))
	// The same client options as the service's publisher.
	client, err := adapters.NewUniversalRedisClient(ctx, adapters.ClientOptions{URL: b.redis.url, TLS: b.redis.tls, DialTimeout: 2 * time.Second,
		ReadTimeout: 3 * time.Second, WriteTimeout: 3 * time.Second, Mode: b.redisMode()})
	if err != nil {
		return nil, err
	}
	l, err := freeLoopbackListener()
	if err != nil {
		_ = client.Close()
		return nil, err
	}
	srv := &http.Server{Handler: baselineIngestHandler(client, keys.Partitions()), ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(l) }()
	return &ingestTarget{phase: PhaseIngestBaseline, url: "http://" + l.Addr().String() + "/checkins", stream: &keys,
		close: func() {
			sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			defer cancel()
			_ = srv.Shutdown(sctx)
			_ = client.Close()
		}}, nil
}

type baselineCheckin struct {
	CheckinID  *string `json:"checkinId"`
	UserID     *int64  `json:"userId"`
	LocationID *int64  `json:"locationId"`
	StarRating *int64  `json:"starRating"`
	Timestamp  *int64  `json:"timestamp"`
}

// baselineIngestHandler decodes the check-in JSON and does one XADD of flat fields to the
// user's stream partition, picked as ingest picks it: no validation, no idempotency, no router,
// no middleware.
func baselineIngestHandler(client redis.UniversalClient, parts adapters.Partitions) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost || r.URL.Path != "/checkins" {
			http.NotFound(w, r)
			return
		}
		var in baselineCheckin
		if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 16<<10)).Decode(&in); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		if in.CheckinID == nil || in.UserID == nil || in.LocationID == nil || in.StarRating == nil || in.Timestamp == nil {
			http.Error(w, "every field is required", http.StatusBadRequest)
			return
		}
		id, err := client.XAdd(r.Context(), &redis.XAddArgs{Stream: parts.StreamOf(*in.UserID), Values: []any{
			domain.FieldType, domain.EventCheckinRecorded, domain.FieldCheckinID, *in.CheckinID,
			domain.FieldUserID, *in.UserID, domain.FieldLocationID, *in.LocationID,
			domain.FieldStarRating, *in.StarRating, domain.FieldTimestamp, *in.Timestamp,
			domain.FieldRecordedAt, time.Now().UnixMilli(),
		}}).Result()
		if err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusAccepted)
		_, _ = fmt.Fprintf(w, `{"entryId":%q}`, id)
	})
}

// ingestRound runs the closed loop against t for d and adds what it measured to t's totals,
// including how much its stream grew.
func (b *bencher) ingestRound(ctx context.Context, t *ingestTarget, src *payloadSource, round int, d time.Duration) error {
	var before int64
	if t.stream != nil {
		var err error
		if before, err = b.added(ctx, *t.stream); err != nil {
			return err
		}
	}
	var cpu0 float64
	if t.cpu != nil {
		var err error
		if cpu0, err = t.cpu(ctx); err != nil {
			return err
		}
	}
	m := b.startMeter(ctx)
	lr := closedLoop(ctx, t.url, b.opts.Clients, d, src, round, false, b.tokens)
	use := m.Stop()
	if err := ctx.Err(); err != nil {
		return err
	}
	if t.stream != nil {
		after, err := b.added(ctx, *t.stream)
		if err != nil {
			return err
		}
		t.acc.grew += after - before
	}
	if t.cpu != nil {
		cpu1, err := t.cpu(ctx)
		if err != nil {
			return err
		}
		t.acc.serviceCPU += cpu1 - cpu0
	}
	a := &t.acc
	a.load.ok += lr.ok
	a.load.warm += lr.warm
	a.load.elapsed += lr.elapsed
	a.load.lat = append(a.load.lat, lr.lat...)
	if a.load.errs == nil {
		a.load.errs = map[string]int64{}
	}
	for k, v := range lr.errs {
		a.load.errs[k] += v
	}
	a.rss, a.heap = max(a.rss, use.rss), max(a.heap, use.heap)
	a.cpu += use.cpu
	a.redisCPU += use.redisCPU
	return nil
}

// result is the target's row; its stream must have grown by exactly its 2xx answers.
func (t *ingestTarget) result() PhaseResult {
	a := t.acc
	r := PhaseResult{Phase: t.phase, Count: a.load.ok, Seconds: a.load.elapsed.Seconds(), Unit: "req/s",
		Throughput: float64(a.load.ok) / a.load.elapsed.Seconds(), Latency: summarize(a.load.lat),
		PeakRSS: a.rss, PeakHeap: a.heap, CPUSeconds: a.cpu, RedisCPUSeconds: a.redisCPU, Check: CheckSkipped, CheckDetail: t.skip}
	if len(a.load.errs) > 0 {
		r.Errors = a.load.errs
	}
	if t.cpu != nil {
		r.setServiceCPU(a.serviceCPU)
	}
	answered := a.load.ok + a.load.warm
	switch {
	case r.Count == 0:
		r.Check = CheckMismatch
		r.CheckDetail = fmt.Sprintf("no request was answered 2xx (errors: %s)", fmtErrors(a.load.errs))
	case t.stream == nil:
	case a.grew == answered:
		r.Check = CheckOK
	default:
		r.Check = CheckMismatch
		r.CheckDetail = fmt.Sprintf("stream grew by %d entries but %d requests were answered 2xx (%d of them warm-ups)", a.grew, answered, a.load.warm)
	}
	return r
}

// serveBaselineHandler is `checkins bench --serve-baseline ADDR`: the ingest-baseline handler in
// a process of its own, as the service runs in one, for another bench's --baseline-target. It
// writes to KEY_PREFIX-baseline's stream (partitions as STREAM_PARTITIONS) on REDIS_URL.
func serveBaselineHandler(ctx context.Context, cfg Config, addr string, log io.Writer) error {
	if cfg.RedisURL == "" {
		return errors.New("invalid --serve-baseline: set REDIS_URL, the Redis the handler writes to")
	}
	client, err := adapters.NewUniversalRedisClient(ctx, adapters.ClientOptions{URL: cfg.RedisURL, TLS: cfg.RedisTLS, DialTimeout: 2 * time.Second,
		ReadTimeout: 3 * time.Second, WriteTimeout: 3 * time.Second, Mode: cfg.RedisMode})
	if err != nil {
		return err
	}
	defer client.Close()
	_, cluster := client.(*redis.ClusterClient)
	keys := adapters.KeySpace{Prefix: cfg.KeyPrefix + "-baseline", Cluster: cluster}
	if p := partitionsFor(cfg, cluster); p > 1 {
		if keys, err = keys.WithPartitions(p); err != nil {
			return fmt.Errorf("invalid --serve-baseline: %w", err)
		}
	}
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("invalid --serve-baseline: %w", err)
	}
	mux := http.NewServeMux()
	mux.Handle("/", baselineIngestHandler(client, keys.Partitions()))
	// For --baseline-target's CPU figures: this process's CPU seconds, as text.
	mux.HandleFunc("GET "+baselineCPUPath, func(w http.ResponseWriter, _ *http.Request) {
		_, _ = fmt.Fprintf(w, "%.6f\n", processCPU().Seconds())
	})
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	fmt.Fprintf(log, "bench: the ingest baseline serves http://%s/checkins, one XADD each to %s; interrupt to stop\n", l.Addr(), strings.Join(keys.Partitions().Streams(), ", "))
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(l) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	err = srv.Shutdown(sctx)
	// What it wrote is load, not data: it goes with the handler.
	for _, s := range keys.Partitions().Streams() {
		if derr := client.Del(sctx, s).Err(); derr != nil && err == nil {
			err = fmt.Errorf("delete %s: %w", s, derr)
		}
	}
	fmt.Fprintf(log, "bench: the ingest baseline stopped and deleted %s\n", strings.Join(keys.Partitions().Streams(), ", "))
	return err
}

// baselineCPUPath is where --serve-baseline answers its process's CPU seconds.
const baselineCPUPath = "/cpu"

// targetCPU is the CPU seconds of the process at --target, from its --target-metrics.
func (b *bencher) targetCPU(ctx context.Context) (float64, error) {
	return readCPU(ctx, b.opts.TargetMetrics, true)
}

// readCPU GETs a process's CPU seconds: from Prometheus's process_cpu_seconds_total (prom), or
// a body that is only the number (--serve-baseline's).
func readCPU(ctx context.Context, url string, prom bool) (float64, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, fmt.Errorf("read the CPU time at %s: %w", url, err)
	}
	resp, err := http.DefaultClient.Do(req) // #nosec G704 -- a URL the bench's operator gave
	if err != nil {
		return 0, fmt.Errorf("read the CPU time at %s: %w", url, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("read the CPU time at %s: it answered %s (give the ops listener's /metrics, which needs no token)", url, resp.Status)
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
	if err != nil {
		return 0, fmt.Errorf("read the CPU time at %s: %w", url, err)
	}
	text := strings.TrimSpace(string(body))
	if prom {
		const name = "process_cpu_seconds_total "
		i := strings.Index("\n"+text, "\n"+name)
		if i < 0 {
			return 0, fmt.Errorf("read the CPU time at %s: no process_cpu_seconds_total in the metrics", url)
		}
		text, _, _ = strings.Cut(text[i+len(name):], "\n")
	}
	v, err := strconv.ParseFloat(strings.TrimSpace(text), 64)
	if err != nil {
		return 0, fmt.Errorf("read the CPU time at %s: %w", url, err)
	}
	return v, nil
}
