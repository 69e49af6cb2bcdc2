package ports

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/labstack/echo/v4"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/redis/go-redis/v9"

	"github.com/checkins/checkins/adapters"
)

// Metrics are the process's Prometheus instruments: HTTP requests, and projection events as a
// ProjectionObserver.
type Metrics struct {
	httpRequests  *prometheus.CounterVec
	httpDuration  *prometheus.HistogramVec
	events        *prometheus.CounterVec
	batchDuration *prometheus.HistogramVec
	transient     *prometheus.CounterVec
}

var _ ProjectionObserver = (*Metrics)(nil)

// NewMetrics registers the instruments on reg.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		httpRequests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "checkins_http_requests_total", Help: "HTTP requests by route, method and status.",
		}, []string{"route", "method", "status"}),
		httpDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "checkins_http_request_duration_seconds", Help: "HTTP request latency by route, method and status.",
			Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5},
		}, []string{"route", "method", "status"}),
		events: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "checkins_projection_events_total",
			Help: "Events handled per projection by outcome: applied, duplicate (another copy of the check-in was counted), failed (one attempt; it may be retried) or poisoned (parked).",
		}, []string{"projection", "outcome"}),
		batchDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "checkins_projection_batch_duration_seconds", Help: "Time one batch of events took to handle and apply, per projection fed by it.",
			Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10},
		}, []string{"projection"}),
		transient: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "checkins_projection_transient_failures_total",
			Help: "Batches that could not be applied because of a passing failure (retried, never parked), by consumer group and reason.",
		}, []string{"group", "reason"}),
	}
	for _, c := range []prometheus.Collector{m.httpRequests, m.httpDuration, m.events, m.batchDuration, m.transient} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("register metrics: %w", err)
		}
	}
	return m, nil
}

// Handled implements ProjectionObserver.
func (m *Metrics) Handled(projection, outcome string, n int, d time.Duration) {
	m.events.WithLabelValues(projection, outcome).Add(float64(n))
	if outcome == OutcomeApplied {
		m.batchDuration.WithLabelValues(projection).Observe(d.Seconds())
	}
}

// Transient implements ProjectionObserver.
func (m *Metrics) Transient(group, reason string) {
	m.transient.WithLabelValues(group, reason).Inc()
}

// Middleware counts and times requests by route pattern (not the raw path, which would give a
// series per user ID). It runs innermost, so it hands errors to Echo's error handler itself to
// see the status the client gets.
func (m *Metrics) Middleware() echo.MiddlewareFunc {
	return func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			start := time.Now()
			if err := next(c); err != nil {
				c.Error(err)
			}
			route := c.Path() // a registered pattern, or "" when no route matched at all
			if route == "" {
				route = "unmatched"
			}
			status := strconv.Itoa(c.Response().Status)
			m.httpRequests.WithLabelValues(route, c.Request().Method, status).Inc()
			m.httpDuration.WithLabelValues(route, c.Request().Method, status).Observe(time.Since(start).Seconds())
			return nil
		}
	}
}

// MetricsHandler serves g in the Prometheus text format.
func MetricsHandler(g prometheus.Gatherer) http.Handler {
	return promhttp.HandlerFor(g, promhttp.HandlerOpts{})
}

// ProgressMonitor tells a projection that makes progress from one that is stuck: a group with
// entries to deliver or pending whose last-delivered ID and pending entries have not changed for
// StallAfter is stalled, whether its projector is dead, wedged or cut off. What each group looked
// like and since when is kept in Redis (hash <prefix>:projections:progress), so every process
// and the CLI judge from the same observations.
type ProgressMonitor struct {
	client     redis.UniversalClient
	keys       adapters.KeySpace
	stallAfter time.Duration
	groups     func(ctx context.Context) ([]string, error)
	now        func() time.Time
	// local holds the observations Redis would not take (out of memory, a read-only replica):
	// status, metrics and readiness only read, and keep working then.
	mu    sync.Mutex
	local map[string]observation
}

type observation struct {
	sig   string
	since int64
}

// NewProgressMonitor watches the groups that groups returns (those that should be consuming).
func NewProgressMonitor(client redis.UniversalClient, keys adapters.KeySpace, stallAfter time.Duration, groups func(ctx context.Context) ([]string, error)) *ProgressMonitor {
	return &ProgressMonitor{client: client, keys: keys, stallAfter: stallAfter, groups: groups, now: time.Now, local: map[string]observation{}}
}

// GroupProgress is one group as the monitor last saw it.
type GroupProgress struct {
	Group      string        `json:"group"`
	Exists     bool          `json:"exists"`
	Lag        int64         `json:"lag"` // -1: unknown
	Pending    int64         `json:"pending"`
	OldestAge  time.Duration `json:"oldestPendingAge"`
	Consumers  int           `json:"consumers"`
	Unchanged  time.Duration `json:"unchangedFor"` // since last-delivered ID or pending last changed
	Stalled    bool          `json:"stalled"`
	StallCause string        `json:"stallCause,omitempty"`
}

func (m *ProgressMonitor) progressKey() string { return progressKey(m.keys) }

func progressKey(keys adapters.KeySpace) string { return keys.Projections() + ":progress" }

// Check looks at every watched group once and returns them; info is the stream as read.
func (m *ProgressMonitor) Check(ctx context.Context) ([]GroupProgress, adapters.StreamInfo, error) {
	groups, err := m.groups(ctx)
	if err != nil {
		return nil, adapters.StreamInfo{}, err
	}
	info, err := adapters.ReadStreamInfo(ctx, m.client, m.keys.Stream())
	if err != nil {
		return nil, info, err
	}
	if len(groups) == 0 {
		return nil, info, nil
	}
	seen, err := m.client.HMGet(ctx, m.progressKey(), groups...).Result()
	if err != nil {
		return nil, info, err
	}
	now := m.now()
	out := make([]GroupProgress, 0, len(groups))
	for i, name := range groups {
		gp := GroupProgress{Group: name, Lag: -1}
		g := findGroup(info, name)
		var sig string
		if g != nil {
			gp.Exists, gp.Pending, gp.Consumers = true, g.Pending, len(g.Consumers)
			if gp.Lag, err = GroupLag(ctx, m.client, info, g); err != nil {
				return nil, info, err
			}
			if t, ok := adapters.EntryTime(g.OldestPendingID); ok && g.Pending > 0 {
				gp.OldestAge = max(now.Sub(t), 0)
			}
			sig = g.LastDeliveredID + "/" + strconv.FormatInt(g.Pending, 10) + "/" + g.OldestPendingID
		} else {
			// A group nobody created: the projection never started, and everything is lag.
			gp.Lag = info.Length
			sig = "none"
		}
		prev, _ := seen[i].(string)
		prevSig, sinceStr, _ := strings.Cut(prev, "|")
		since, perr := strconv.ParseInt(sinceStr, 10, 64)
		if prevSig != sig || perr != nil {
			since = m.observe(ctx, name, sig, now)
		}
		gp.Unchanged = max(now.Sub(time.UnixMilli(since)), 0)
		behind := gp.Lag != 0 || gp.Pending > 0
		if behind && gp.Unchanged >= m.stallAfter {
			gp.Stalled = true
			gp.StallCause = fmt.Sprintf("projection group %s stalled: lag %s, %d pending, no progress for %s", name,
				lagText(gp.Lag), gp.Pending, gp.Unchanged.Truncate(time.Second))
			if !gp.Exists {
				gp.StallCause += " (the group does not exist: no projector ever ran it)"
			} else if gp.Consumers == 0 {
				gp.StallCause += " (no consumers)"
			}
		}
		out = append(out, gp)
	}
	return out, info, nil
}

// observe records that group looks like sig since now, and returns since when it does. When
// Redis refuses the write, the process keeps the observation itself.
func (m *ProgressMonitor) observe(ctx context.Context, group, sig string, now time.Time) int64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.client.HSet(ctx, m.progressKey(), group, sig+"|"+strconv.FormatInt(now.UnixMilli(), 10)).Err(); err == nil {
		delete(m.local, group)
		return now.UnixMilli()
	}
	if o, ok := m.local[group]; ok && o.sig == sig {
		return o.since
	}
	m.local[group] = observation{sig: sig, since: now.UnixMilli()}
	return now.UnixMilli()
}

func lagText(l int64) string {
	if l < 0 {
		return "unknown"
	}
	return strconv.FormatInt(l, 10)
}

// Stalled returns an error naming every stalled group (nil when all progress): /readyz's test.
func (m *ProgressMonitor) Stalled(ctx context.Context) error {
	gs, _, err := m.Check(ctx)
	if err != nil {
		return fmt.Errorf("cannot check projection progress: %w", err)
	}
	var causes []string
	for _, g := range gs {
		if g.Stalled {
			causes = append(causes, g.StallCause)
		}
	}
	if len(causes) > 0 {
		return fmt.Errorf("%s", strings.Join(causes, "; "))
	}
	return nil
}

// StreamCollector reads the projections' state from Redis at scrape time: lag, pending, oldest
// pending age, consumers and stall per group, serving version per projection, poison depth.
type StreamCollector struct {
	monitor *ProgressMonitor
	queue   *adapters.PoisonQueue
	timeout time.Duration

	up, streamLen, poison, lag, pending, oldest, consumers, stalled *prometheus.Desc
}

// NewStreamCollector collects through monitor (which names the watched groups).
func NewStreamCollector(monitor *ProgressMonitor, timeout time.Duration) *StreamCollector {
	gl := []string{"projection", "version", "group"}
	return &StreamCollector{
		monitor: monitor, queue: adapters.NewPoisonQueue(monitor.client, monitor.keys), timeout: timeout,
		up:        prometheus.NewDesc("checkins_redis_up", "1 when the scrape could read the stream state from Redis.", nil, nil),
		streamLen: prometheus.NewDesc("checkins_stream_length", "Entries in the event stream.", nil, nil),
		poison:    prometheus.NewDesc("checkins_poison_queue_depth", "Events parked in the poison queue.", nil, nil),
		lag:       prometheus.NewDesc("checkins_projection_lag", "Stream entries not yet delivered to the projection's group (-1 unknown).", gl, nil),
		pending:   prometheus.NewDesc("checkins_projection_pending", "Entries delivered to the group and not yet acknowledged.", gl, nil),
		oldest:    prometheus.NewDesc("checkins_projection_oldest_pending_age_seconds", "Age of the oldest pending entry (since it was recorded).", gl, nil),
		consumers: prometheus.NewDesc("checkins_projection_consumers", "Consumers in the group.", gl, nil),
		stalled:   prometheus.NewDesc("checkins_projection_stalled", "1 when the group is behind and has made no progress for STALL_AFTER.", gl, nil),
	}
}

// Describe implements prometheus.Collector.
func (c *StreamCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.up, c.streamLen, c.poison, c.lag, c.pending, c.oldest, c.consumers, c.stalled} {
		ch <- d
	}
}

// Collect implements prometheus.Collector. A Redis outage yields checkins_redis_up 0, not a
// failed scrape, so the HTTP metrics still arrive.
func (c *StreamCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), c.timeout)
	defer cancel()
	gs, info, err := c.monitor.Check(ctx)
	var depth int64
	if err == nil {
		depth, err = c.queue.Len(ctx)
	}
	if err != nil {
		ch <- prometheus.MustNewConstMetric(c.up, prometheus.GaugeValue, 0)
		return
	}
	ch <- prometheus.MustNewConstMetric(c.up, prometheus.GaugeValue, 1)
	ch <- prometheus.MustNewConstMetric(c.streamLen, prometheus.GaugeValue, float64(info.Length))
	ch <- prometheus.MustNewConstMetric(c.poison, prometheus.GaugeValue, float64(depth))
	live, _, err := adapters.NewLiveGroups(c.monitor.client, c.monitor.keys).ReadAll(ctx)
	if err != nil {
		live = nil // the series of live groups come without their members' labels this time
	}
	for _, g := range gs {
		// A live group's figures are those of every projection version it feeds: one series
		// per member, so that a dashboard per projection finds them.
		type pv struct {
			name    string
			version int
		}
		var labels []pv
		if ms, ok := live[g.Group]; ok {
			for m := range ms.Members {
				if n, v, ok := adapters.ParseMemberName(m); ok {
					labels = append(labels, pv{n, v})
				}
			}
		}
		if len(labels) == 0 {
			n, v := splitGroup(g.Group)
			labels = append(labels, pv{n, v})
		}
		stalled := 0.0
		if g.Stalled {
			stalled = 1
		}
		for _, l := range labels {
			lv := []string{l.name, strconv.Itoa(l.version), g.Group}
			ch <- prometheus.MustNewConstMetric(c.lag, prometheus.GaugeValue, float64(g.Lag), lv...)
			ch <- prometheus.MustNewConstMetric(c.pending, prometheus.GaugeValue, float64(g.Pending), lv...)
			ch <- prometheus.MustNewConstMetric(c.oldest, prometheus.GaugeValue, g.OldestAge.Seconds(), lv...)
			ch <- prometheus.MustNewConstMetric(c.consumers, prometheus.GaugeValue, float64(g.Consumers), lv...)
			ch <- prometheus.MustNewConstMetric(c.stalled, prometheus.GaugeValue, stalled, lv...)
		}
	}
}

// ActiveGroups are the groups that should be consuming for the named projections (for
// ProgressMonitor): the live group feeding each one's serving version (and, during a rebuild,
// its building version), and the own group of a version still backfilling (or not started).
func (o *ProjectionOps) ActiveGroups(names []string) func(ctx context.Context) ([]string, error) {
	return func(ctx context.Context) ([]string, error) {
		groups, _, err := o.live.ReadAll(ctx)
		if err != nil {
			return nil, err
		}
		var out []string
		add := func(g string) {
			if !slices.Contains(out, g) {
				out = append(out, g)
			}
		}
		for _, n := range names {
			st, err := o.versions.State(ctx, n)
			if err != nil {
				return nil, err
			}
			for _, v := range []int{st.Serving, st.Building} {
				if v == 0 {
					continue
				}
				member := adapters.MemberName(n, v)
				lg, m, ok := memberOf(groups, member)
				if ok {
					add(lg)
				}
				if !ok || m.Own == adapters.BackfillRunning {
					add(member)
				}
			}
		}
		return out, nil
	}
}

// RedisMemoryCollector reports Redis's memory at scrape time: used_memory, maxmemory (0: no
// limit) and the eviction policy, what to watch to scale before Redis refuses writes.
type RedisMemoryCollector struct {
	client  redis.UniversalClient
	timeout time.Duration

	used, max, policy *prometheus.Desc
}

// NewRedisMemoryCollector reads client's INFO memory within timeout per scrape.
func NewRedisMemoryCollector(client redis.UniversalClient, timeout time.Duration) *RedisMemoryCollector {
	return &RedisMemoryCollector{client: client, timeout: timeout,
		used:   prometheus.NewDesc("checkins_redis_used_memory_bytes", "Redis used_memory (INFO memory; summed over the masters of a cluster).", nil, nil),
		max:    prometheus.NewDesc("checkins_redis_maxmemory_bytes", "Redis maxmemory; 0: no limit (writes fail with OOM at the limit under noeviction).", nil, nil),
		policy: prometheus.NewDesc("checkins_redis_maxmemory_policy", "1 for Redis's maxmemory-policy (anything but noeviction may delete data).", []string{"policy"}, nil),
	}
}

// Describe implements prometheus.Collector.
func (c *RedisMemoryCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.used
	ch <- c.max
	ch <- c.policy
}

// Collect implements prometheus.Collector; nothing when Redis does not answer or tell.
func (c *RedisMemoryCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), c.timeout)
	defer cancel()
	m, err := adapters.ReadMemoryInfo(ctx, c.client)
	if err != nil {
		return
	}
	if m.Reported {
		ch <- prometheus.MustNewConstMetric(c.used, prometheus.GaugeValue, float64(m.Used))
		ch <- prometheus.MustNewConstMetric(c.max, prometheus.GaugeValue, float64(m.Max))
	}
	if m.Policy != "" {
		ch <- prometheus.MustNewConstMetric(c.policy, prometheus.GaugeValue, 1, m.Policy)
	}
}
