package query

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/checkins/checkins/app/ops"
)

// ProgressMonitor tells a projection that makes progress from one that is stuck (the stall
// rule, Stalled): a group with entries to deliver or pending whose last-delivered ID and pending
// entries have not changed for StallAfter is stalled, whether its projector is dead, wedged or
// cut off. What each group looked like and since when is kept in the backend's Observations, so
// every process and the CLI judge from the same observations.
type ProgressMonitor struct {
	stream     ops.Stream
	seen       ops.Observations
	stallAfter time.Duration
	groups     func(ctx context.Context) ([]string, error)
	now        func() time.Time
	// local holds the observations the backend would not take (out of memory, a read-only
	// replica): status, metrics and readiness only read, and keep working then.
	mu    sync.Mutex
	local map[string]observation
}

type observation struct {
	sig   string
	since int64
}

// NewProgressMonitor watches the groups that groups returns (those that should be consuming).
func NewProgressMonitor(b ops.Backend, stallAfter time.Duration, groups func(ctx context.Context) ([]string, error)) *ProgressMonitor {
	return &ProgressMonitor{stream: b.Stream, seen: b.Observations, stallAfter: stallAfter, groups: groups, now: time.Now, local: map[string]observation{}}
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

// Stalled is the stall rule: behind (entries to deliver, or pending) and unchanged for at least
// stallAfter.
func Stalled(lag, pending int64, unchanged, stallAfter time.Duration) bool {
	return (lag != 0 || pending > 0) && unchanged >= stallAfter
}

// progressSignature is what must change for a group to count as making progress.
func progressSignature(g *ops.GroupInfo) string {
	if g == nil {
		return "none"
	}
	return g.LastDeliveredID + "/" + strconv.FormatInt(g.Pending, 10) + "/" + g.OldestPendingID
}

// Check looks at every watched group once and returns them; info is the stream as read.
func (m *ProgressMonitor) Check(ctx context.Context) ([]GroupProgress, ops.StreamInfo, error) {
	groups, err := m.groups(ctx)
	if err != nil {
		return nil, ops.StreamInfo{}, err
	}
	return m.CheckGroups(ctx, groups)
}

// CheckGroups is Check of the given groups. A caller that asks about other groups each time
// (status, the versions' list) keeps one monitor all the same: what the process observed itself
// while Redis refused the observations is the monitor's.
func (m *ProgressMonitor) CheckGroups(ctx context.Context, groups []string) ([]GroupProgress, ops.StreamInfo, error) {
	info, err := m.stream.Info(ctx)
	if err != nil {
		return nil, info, err
	}
	if len(groups) == 0 {
		return nil, info, nil
	}
	seen, err := m.seen.Observed(ctx, groups)
	if err != nil {
		return nil, info, err
	}
	now := m.now()
	out := make([]GroupProgress, 0, len(groups))
	for i, name := range groups {
		gp := GroupProgress{Group: name, Lag: -1}
		g := info.Group(name)
		if g != nil {
			gp.Exists, gp.Pending, gp.Consumers = true, g.Pending, len(g.Consumers)
			if gp.Lag, err = ops.GroupLag(ctx, m.stream, info, g); err != nil {
				return nil, info, err
			}
			if t, ok := ops.EntryTime(g.OldestPendingID); ok && g.Pending > 0 {
				gp.OldestAge = max(now.Sub(t), 0)
			}
		} else {
			// A group nobody created: the projection never started, and everything is lag.
			gp.Lag = info.Length
		}
		if g != nil && g.Parts != nil {
			m.checkParts(ctx, &gp, g, seen[i], now)
			out = append(out, gp)
			continue
		}
		sig := progressSignature(g)
		prevSig, sinceStr, _ := strings.Cut(seen[i], "|")
		since, perr := strconv.ParseInt(sinceStr, 10, 64)
		if prevSig != sig || perr != nil {
			since = m.observe(ctx, name, sig, now)
		}
		gp.Unchanged = max(now.Sub(time.UnixMilli(since)), 0)
		if Stalled(gp.Lag, gp.Pending, gp.Unchanged, m.stallAfter) {
			gp.Stalled = true
			gp.StallCause = fmt.Sprintf("projection group %s stalled: lag %s, %d pending, no progress for %s", name,
				lagText(gp.Lag), gp.Pending, gp.Unchanged.Truncate(time.Second))
			if !gp.Exists {
				gp.StallCause += " (the group does not exist: no projector has created it yet, or Redis lost it; a projector creates it when it starts)"
			} else if gp.Consumers == 0 {
				gp.StallCause += " (no consumers)"
			}
		}
		out = append(out, gp)
	}
	return out, info, nil
}

// checkParts applies the stall rule to each partition of a partitioned stream: the group is
// stalled when any partition is (behind there and unchanged there for StallAfter), however the
// others progress. The observation of the group holds one "<stream>=<signature>@<since>" per
// partition, tab-separated. Unchanged is the longest any partition that is behind has been
// unchanged (the shortest of all when none is behind).
func (m *ProgressMonitor) checkParts(ctx context.Context, gp *GroupProgress, g *ops.GroupInfo, seen string, now time.Time) {
	// Cut at the last "|" and each item at its last "=": a stream's name holds KEY_PREFIX, which
	// may hold either (the signature and the times hold neither). Cut at the first, no
	// observation parsed back, every check restarted the clock, and a partitioned group never
	// read as stalled (found by a review).
	prevAll := seen
	if i := strings.LastIndex(seen, "|"); i >= 0 {
		prevAll = seen[:i]
	}
	m.mu.Lock()
	if o, ok := m.local[gp.Group]; ok {
		prevAll = o.sig // Redis refused the last observation (out of memory): this one is newer
	}
	m.mu.Unlock()
	prev := map[string]string{} // stream -> signature@since
	for _, item := range strings.Split(prevAll, "\t") {
		if i := strings.LastIndex(item, "="); i >= 0 {
			prev[item[:i]] = item[i+1:]
		}
	}
	streams := make([]string, 0, len(g.Parts))
	for s := range g.Parts {
		streams = append(streams, s)
	}
	sort.Strings(streams)
	items := make([]string, len(streams))
	changed := len(prev) != len(streams)
	var stalled []string
	gp.Unchanged = -1
	var behind time.Duration = -1
	for i, stream := range streams {
		pg := g.Parts[stream]
		sig := progressSignature(&pg)
		since := now.UnixMilli()
		if ps, ss, ok := strings.Cut(prev[stream], "@"); ok && ps == sig {
			if n, err := strconv.ParseInt(ss, 10, 64); err == nil {
				since = n
			}
		} else {
			changed = true
		}
		items[i] = stream + "=" + sig + "@" + strconv.FormatInt(since, 10)
		unchanged := max(now.Sub(time.UnixMilli(since)), 0)
		if gp.Unchanged < 0 || unchanged < gp.Unchanged {
			gp.Unchanged = unchanged
		}
		if pg.Lag != 0 || pg.Pending > 0 {
			behind = max(behind, unchanged)
		}
		if Stalled(pg.Lag, pg.Pending, unchanged, m.stallAfter) {
			what := fmt.Sprintf("%s (lag %s, %d pending)", stream, lagText(pg.Lag), pg.Pending)
			if pg.Missing {
				what = fmt.Sprintf("%s (lag %s: the group does not exist there; a projector makes it again when it reads that partition)", stream, lagText(pg.Lag))
			}
			stalled = append(stalled, what)
		}
	}
	if behind >= 0 {
		gp.Unchanged = behind
	}
	gp.Unchanged = max(gp.Unchanged, 0)
	if changed {
		m.observe(ctx, gp.Group, strings.Join(items, "\t"), now)
	}
	if len(stalled) > 0 {
		gp.Stalled = true
		gp.StallCause = fmt.Sprintf("projection group %s stalled on %d of %d partitions: no progress for %s on %s", gp.Group,
			len(stalled), len(streams), gp.Unchanged.Truncate(time.Second), strings.Join(stalled, ", "))
		if gp.Consumers == 0 {
			gp.StallCause += " (no consumers)"
		}
	}
}

// observe records that group looks like sig since now, and returns since when it does. When
// the backend refuses the write, the process keeps the observation itself.
func (m *ProgressMonitor) observe(ctx context.Context, group, sig string, now time.Time) int64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.seen.Observe(ctx, group, sig+"|"+strconv.FormatInt(now.UnixMilli(), 10)); err == nil {
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
		return errors.New(strings.Join(causes, "; "))
	}
	return nil
}

// FixedGroups watches groups, as they are.
func FixedGroups(groups []string) func(context.Context) ([]string, error) {
	return func(context.Context) ([]string, error) { return groups, nil }
}
