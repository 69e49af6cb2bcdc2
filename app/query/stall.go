package query

import (
	"context"
	"errors"
	"fmt"
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
