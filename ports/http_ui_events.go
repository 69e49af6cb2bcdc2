package ports

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/checkins/checkins/app/query"
)

// Dashboard sampling and its Server-Sent Events stream.
const (
	// UISamplePeriod is how often the dashboard samples the status query (one chart point).
	UISamplePeriod = time.Second
	// UIHistory is how many samples the charts keep: the last five minutes.
	UIHistory = 300
	// DefaultUIMaxClients caps the open /ui/events streams of one process: each holds a
	// connection of the ops listener (64 in all) and gets a render every second.
	DefaultUIMaxClients = 32
	// DefaultUIHeartbeat is how often an idle stream gets a comment line, so proxies and the
	// browser see it alive.
	DefaultUIHeartbeat = 15 * time.Second
)

// uiPathEvents is the SSE route; the request timeout does not apply to it.
const uiPathEvents = "/ui/events"

// uiSample is one point of the dashboard's history.
type uiSample struct {
	At           time.Time
	StreamLength int64
	Rate         float64 // check-ins per second since the previous sample
	Rated        bool    // there was a previous good sample: Rate is measured, not 0 for nothing
	Status       query.StatusReport
	Groups       []uiGroup
	Err          string
}

// uiGroup is one consumer group of a sample, with what the dashboard derives from two samples.
type uiGroup struct {
	Group    string
	Feeds    string
	Kind     string
	Lag      int64 // -1: unknown
	Pending  int64
	Rate     float64 // entries per second the group got through
	Rated    bool    // the previous good sample had this group: Rate is measured
	State    string  // ok, behind, stalled, rebuilding
	Poisoned int64
	Cause    string
}

// uiHub samples the status every UISamplePeriod, keeps UIHistory samples and fans each one out
// to the open SSE streams.
type uiHub struct {
	status     func(context.Context) (query.StatusReport, error)
	log        *slog.Logger
	maxClients int
	heartbeat  time.Duration

	mu      sync.Mutex
	history []uiSample // oldest first, at most UIHistory
	clients map[chan struct{}]struct{}
	closed  bool
	done    chan struct{}
}

func newUIHub(status func(context.Context) (query.StatusReport, error), maxClients int, heartbeat time.Duration, log *slog.Logger) *uiHub {
	if maxClients <= 0 {
		maxClients = DefaultUIMaxClients
	}
	if heartbeat <= 0 {
		heartbeat = DefaultUIHeartbeat
	}
	return &uiHub{status: status, log: log, maxClients: maxClients, heartbeat: heartbeat,
		clients: map[chan struct{}]struct{}{}, done: make(chan struct{})}
}

// run samples until ctx ends, then ends every stream (so a graceful shutdown is not held up
// by dashboards left open).
func (h *uiHub) run(ctx context.Context) error {
	defer h.close()
	t := time.NewTicker(UISamplePeriod)
	defer t.Stop()
	for {
		h.sample(ctx)
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

func (h *uiHub) close() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.closed {
		h.closed = true
		close(h.done)
	}
}

func (h *uiHub) sample(ctx context.Context) {
	sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	st, err := h.status(sctx)
	cancel()
	if ctx.Err() != nil {
		return
	}
	now := time.Now()
	h.mu.Lock()
	var prev *uiSample
	if n := len(h.history); n > 0 && h.history[n-1].Err == "" {
		prev = &h.history[n-1]
	}
	s := uiSample{At: now}
	if err != nil {
		s.Err = err.Error()
		if prev != nil {
			s.StreamLength = prev.StreamLength
		}
	} else {
		s = deriveSample(now, st, prev)
	}
	h.history = append(h.history, s)
	if len(h.history) > UIHistory {
		h.history = append(h.history[:0], h.history[len(h.history)-UIHistory:]...)
	}
	for c := range h.clients {
		select {
		case c <- struct{}{}:
		default: // the stream is still writing the previous sample: it will send the newest
		}
	}
	h.mu.Unlock()
	if err != nil {
		h.log.Debug("dashboard status sample failed", "error", err)
	}
}

// deriveSample computes rates and states from st and the previous good sample.
func deriveSample(now time.Time, st query.StatusReport, prev *uiSample) uiSample {
	s := uiSample{At: now, StreamLength: st.StreamLength, Status: st}
	var dt, added float64
	prevLag := map[string]int64{}
	if prev != nil {
		dt = now.Sub(prev.At).Seconds()
		// What was added, however much a trim (RETENTION) removed meanwhile; without the
		// counter, the growth of the stream, never negative.
		if st.EntriesAdded > 0 && st.EntriesAdded >= prev.Status.EntriesAdded && prev.Status.EntriesAdded > 0 {
			added = float64(st.EntriesAdded - prev.Status.EntriesAdded)
		} else {
			added = float64(max(st.StreamLength-prev.StreamLength, 0))
		}
		if dt > 0 {
			s.Rate, s.Rated = added/dt, true
		}
		for _, g := range prev.Groups {
			prevLag[g.Group] = g.Lag
		}
	}
	for _, p := range st.Projections {
		g := uiGroup{Group: p.Group, Kind: p.Kind, Lag: -1, Pending: p.Pending, Poisoned: p.Poisoned, Cause: p.StallCause}
		switch p.Kind {
		case "live":
			g.Feeds = strings.Join(p.Members, " ")
		case "backfill":
			g.Feeds = fmt.Sprintf("%s.v%d up to %s", p.Projection, p.Version, p.BackfillTo)
		default:
			g.Feeds = fmt.Sprintf("%s.v%d", p.Projection, max(p.Version, 1))
		}
		if p.Lag != nil {
			g.Lag = *p.Lag
		}
		if pl, ok := prevLag[p.Group]; ok && dt > 0 && g.Lag >= 0 && pl >= 0 {
			// What arrived, plus what the backlog shrank by, went through the group.
			g.Rate, g.Rated = max((added+float64(pl-g.Lag))/dt, 0), true
		}
		switch {
		case p.Stalled:
			g.State = "stalled"
		case p.Building || (p.Kind == "backfill" && (g.Lag != 0 || p.Pending > 0)):
			g.State = "rebuilding"
		case g.Lag > max(10, int64(2*s.Rate)): // more than about two seconds of work queued
			g.State = "behind"
		default:
			g.State = "ok"
		}
		s.Groups = append(s.Groups, g)
	}
	return s
}

func (h *uiHub) latest() (uiSample, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.history) == 0 {
		return uiSample{}, false
	}
	return h.history[len(h.history)-1], true
}

// chartData is the uPlot data of the history: times, the ingest rate, and each group's lag.
type chartData struct {
	T      []int64             `json:"t"`
	Rate   []*float64          `json:"rate"` // null for a sample whose status could not be read
	Lag    map[string][]*int64 `json:"lag"`
	Groups []string            `json:"groups"`
}

func (h *uiHub) chart() chartData {
	h.mu.Lock()
	defer h.mu.Unlock()
	cd := chartData{T: make([]int64, 0, len(h.history)), Rate: make([]*float64, 0, len(h.history)), Lag: map[string][]*int64{}}
	for _, s := range h.history {
		for _, g := range s.Groups {
			if _, ok := cd.Lag[g.Group]; !ok {
				cd.Lag[g.Group] = nil
				cd.Groups = append(cd.Groups, g.Group)
			}
		}
	}
	for _, s := range h.history {
		cd.T = append(cd.T, s.At.Unix())
		var rate *float64 // a gap, as in the lag chart: an outage, or the first sample after one (or
		// after the start), has no measured rate, and is no 0 check-ins/s
		if s.Err == "" && s.Rated {
			rate = &s.Rate
		}
		cd.Rate = append(cd.Rate, rate)
		for _, name := range cd.Groups {
			var v *int64
			for _, g := range s.Groups {
				if g.Group == name && g.Lag >= 0 {
					lag := g.Lag
					v = &lag
				}
			}
			cd.Lag[name] = append(cd.Lag[name], v)
		}
	}
	return cd
}

var errTooManyStreams = errors.New("too many dashboard streams open")

func (h *uiHub) subscribe() (chan struct{}, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return nil, errors.New("shutting down")
	}
	if len(h.clients) >= h.maxClients {
		return nil, errTooManyStreams
	}
	c := make(chan struct{}, 1)
	h.clients[c] = struct{}{}
	return c, nil
}

func (h *uiHub) unsubscribe(c chan struct{}) {
	h.mu.Lock()
	delete(h.clients, c)
	h.mu.Unlock()
}

// serveEvents is GET /ui/events: every sample, an "overview" event (the overview's live
// fragment), a "chart" event (the charts' data, JSON) and a "tick" (other pages refresh their
// live parts on it); a comment line every heartbeat. The token it was opened with is verified
// again at every heartbeat (a cache hit but once a minute): the stream ends, with a "bye" that
// says why, once the token has expired or its key is gone from the key set, as any other
// request with it would be refused.
func (u *UI) serveEvents(c echo.Context) error {
	ch, err := u.hub.subscribe()
	if errors.Is(err, errTooManyStreams) {
		c.Response().Header().Set("Retry-After", "5")
		return apiError(http.StatusServiceUnavailable, "too_many_streams", "",
			fmt.Sprintf("at most %d dashboard streams may be open at once", u.hub.maxClients))
	}
	if err != nil {
		return apiError(http.StatusServiceUnavailable, "unavailable", "", err.Error())
	}
	defer u.hub.unsubscribe(ch)
	w := c.Response()
	// The listener's WriteTimeout bounds an answer; a stream is one long answer.
	// Likewise the read deadline: when it passes, the server cancels the request's context.
	rc := http.NewResponseController(w)
	if err := errors.Join(rc.SetWriteDeadline(time.Time{}), rc.SetReadDeadline(time.Time{})); err != nil {
		u.log.Debug("dashboard stream: cannot lift the connection deadlines", "error", err)
	}
	// Each write gets a deadline of its own instead: a client that stops reading fills the
	// socket's buffers, and a write without one blocked for good, holding the stream's slot and
	// a graceful stop until TCP gave up (found by a review).
	writeWithin := 2*u.hub.heartbeat + 5*time.Second
	deadline := func() { _ = rc.SetWriteDeadline(time.Now().Add(writeWithin)) }
	deadline()
	w.Header().Set(echo.HeaderContentType, "text/event-stream")
	w.Header().Set(echo.HeaderCacheControl, "no-store")
	w.Header().Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	// The client reconnects after this long when the stream ends (a restart).
	if _, err := fmt.Fprintf(w, "retry: 2000\n: connected\n\n"); err != nil {
		return nil
	}
	w.Flush()
	ctx := c.Request().Context()
	canAct := u.canAct(c)
	send := func() error {
		s, ok := u.hub.latest()
		if !ok {
			return nil
		}
		deadline()
		var buf bytes.Buffer
		if err := u.tmpl.ExecuteTemplate(&buf, "overview_live", overviewView{Sample: s, CanAct: canAct}); err != nil {
			return err
		}
		chart, err := json.Marshal(u.hub.chart())
		if err != nil {
			return err
		}
		if err := writeSSE(w, "overview", buf.Bytes()); err != nil {
			return err
		}
		if err := writeSSE(w, "chart", chart); err != nil {
			return err
		}
		if err := writeSSE(w, "tick", []byte(s.At.UTC().Format(time.RFC3339))); err != nil {
			return err
		}
		return rc.Flush() // its error too: a flush past the deadline fails, the stream ends
	}
	if err := send(); err != nil {
		return nil
	}
	hb := time.NewTicker(u.hub.heartbeat)
	defer hb.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-u.hub.done:
			// Shutdown: tell the page, then end the answer so the listener can close.
			deadline()
			_ = writeSSE(w, "bye", []byte("shutting down"))
			w.Flush()
			return nil
		case <-hb.C:
			deadline()
			if why := u.streamRefused(c); why != "" {
				_ = writeSSE(w, "bye", []byte(why))
				w.Flush()
				return nil
			}
			if _, err := fmt.Fprint(w, ": heartbeat\n\n"); err != nil {
				return nil
			}
			if rc.Flush() != nil {
				return nil
			}
		case <-ch:
			if err := send(); err != nil {
				return nil
			}
		}
	}
}

// streamRefused verifies again the token an event stream was opened with ("": still good).
func (u *UI) streamRefused(c echo.Context) string {
	if u.srv.cfg.Auth == nil {
		return ""
	}
	raw, _ := c.Get(tokenKey).(string)
	p, err := u.srv.cfg.Auth.Verifier.Verify(c.Request().Context(), raw)
	switch {
	case err != nil:
		return "session ended: " + err.Error() + "; log in again"
	case !p.HasScope(ScopeOps) && !p.HasScope(ScopeOpsRead):
		return "session ended: the token no longer has scope " + ScopeOpsRead
	}
	return ""
}

// writeSSE writes one event; every line of data becomes a data: line. A line of the event
// stream ends at "\r\n", "\n" or a bare "\r", so data is split at each of them: a name read
// from Redis (a consumer group's, say) that holds "\r" can neither end the event early nor
// start one of its own ("\r\revent: bye").
func writeSSE(w *echo.Response, event string, data []byte) error {
	var b bytes.Buffer
	b.WriteString("event: ")
	b.WriteString(event)
	b.WriteByte('\n')
	data = bytes.ReplaceAll(bytes.ReplaceAll(data, []byte("\r\n"), []byte("\n")), []byte("\r"), []byte("\n"))
	for _, line := range bytes.Split(data, []byte("\n")) {
		b.WriteString("data: ")
		b.Write(line)
		b.WriteByte('\n')
	}
	b.WriteByte('\n')
	_, err := w.Write(b.Bytes())
	return err
}
