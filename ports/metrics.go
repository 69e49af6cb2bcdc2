package ports

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/labstack/echo/v4"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/checkins/checkins/app/ops"
	"github.com/checkins/checkins/app/query"
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
			Help: "Batches that could not be applied because of a passing failure (retried, never parked), by consumer group and reason (other: not a known Redis failure; the log and /readyz give its text; lease ran out: the projector stood still, or could not reach Redis, longer than CLAIM_IDLE holding the batch, and wrote nothing of it).",
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
			method := metricMethod(c.Request().Method)
			m.httpRequests.WithLabelValues(route, method, status).Inc()
			m.httpDuration.WithLabelValues(route, method, status).Observe(time.Since(start).Seconds())
			return nil
		}
	}
}

// metricMethod is a request's method as a label value: one of HTTP's own, or OTHER. Go's server
// takes any token as a method, and a label value per made-up method would be a series (and a
// histogram) per request that nobody can remove: memory anyone could fill without a token.
func metricMethod(m string) string {
	switch m {
	case http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodPatch,
		http.MethodDelete, http.MethodConnect, http.MethodOptions, http.MethodTrace:
		return m
	}
	return "OTHER"
}

// MetricsHandler serves g in the Prometheus text format.
func MetricsHandler(g prometheus.Gatherer) http.Handler {
	return promhttp.HandlerFor(g, promhttp.HandlerOpts{})
}

// StreamCollector reads the projections' state from Redis at scrape time: lag, pending, oldest
// pending age, consumers and stall per group, serving version per projection, poison depth.
type StreamCollector struct {
	monitor *query.ProgressMonitor
	queue   ops.PoisonQueue
	live    ops.LiveGroups
	timeout time.Duration

	up, streamLen, poison, lag, pending, oldest, consumers, stalled *prometheus.Desc
}

// NewStreamCollector collects through monitor (which names the watched groups), with the poison
// queue's depth and the live groups' members from b.
func NewStreamCollector(monitor *query.ProgressMonitor, b ops.Backend, timeout time.Duration) *StreamCollector {
	gl := []string{"projection", "version", "group"}
	return &StreamCollector{
		monitor: monitor, queue: b.Poison, live: b.Live, timeout: timeout,
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
	live, _, err := c.live.ReadAll(ctx)
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
				if n, v, ok := ops.ParseMemberName(m); ok {
					labels = append(labels, pv{n, v})
				}
			}
		}
		if len(labels) == 0 {
			n, v := ops.SplitGroup(g.Group)
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
