package query

import (
	"context"
	"encoding/json"
	"errors"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/checkins/checkins/app/ops"
	"github.com/checkins/checkins/app/projection"
)

// Status reports the consumers' state: `checkins status` and GET /ops/status.
type Status struct {
	b     ops.Backend
	names []string
	now   func() time.Time
	// stallAfter > 0 flags groups behind the stream that made no progress for that long.
	stallAfter time.Duration
	progress   *ProgressMonitor
}

// NewStatus reports on the given projections (and on any other group found on the stream);
// stallAfter > 0 flags stalled groups, judged as /readyz judges them.
func NewStatus(b ops.Backend, projections []projection.Projection, stallAfter time.Duration) (*Status, error) {
	if b.Stream == nil || b.Poison == nil || b.Live == nil || b.Registry == nil || b.Observations == nil {
		return nil, errors.New("query: Status needs the backend's Stream, Poison, Live, Registry and Observations")
	}
	s := &Status{b: b, now: time.Now, stallAfter: stallAfter, progress: NewProgressMonitor(b, stallAfter, nil)}
	for _, p := range projections {
		s.names = append(s.names, p.Name())
	}
	return s, nil
}

// StatusReport is the whole picture.
type StatusReport struct {
	Stream       string `json:"stream"`
	StreamLength int64  `json:"streamLength"`
	// EntriesAdded is every entry ever added to the stream (its partitions summed): what a rate
	// of check-ins is computed from, since trimming shortens the stream. Absent when Redis does
	// not tell.
	EntriesAdded int64              `json:"entriesAdded,omitempty"`
	LastEntryID  string             `json:"lastEntryId,omitempty"`
	PoisonStream string             `json:"poisonStream"`
	Poisoned     int64              `json:"poisoned"`
	Projections  []ProjectionStatus `json:"projections"`
}

// Kinds of consumer group, as ProjectionStatus.Kind.
const (
	KindLive     = "live"
	KindBackfill = "backfill"
	KindGroup    = "group" // any other consumer group
)

// ProjectionStatus is one consumer group: a live group, which feeds Members (projection
// versions) together, or the own group of one projection version (Projection, Version), which
// backfills it up to its join position (BackfillTo) or, from the service's earlier layout, fed
// it alone.
type ProjectionStatus struct {
	Projection string   `json:"projection,omitempty"`
	Version    int      `json:"version,omitempty"`
	Group      string   `json:"group"`
	Kind       string   `json:"kind"` // live, backfill or group (any other consumer group)
	Members    []string `json:"members,omitempty"`
	BackfillTo string   `json:"backfillTo,omitempty"`
	// BackfillDone: the backfill reached BackfillTo and its version is fed by its live group;
	// the group waits out PROJECTION_RETIRE_GRACE to be removed. Nothing is left for it to
	// deliver (Lag 0), and it is never stalled.
	BackfillDone bool `json:"backfillDone,omitempty"`
	// Serving is true for the version that answers reads.
	Serving bool `json:"serving"`
	// GroupExists is false until a projector has subscribed once.
	GroupExists bool             `json:"groupExists"`
	Consumers   []ConsumerStatus `json:"consumers"`
	Pending     int64            `json:"pending"`
	// Lag is the number of entries not yet delivered to the group (XINFO GROUPS, Redis 7);
	// null when Redis cannot tell.
	Lag             *int64         `json:"lag"`
	LastDeliveredID string         `json:"lastDeliveredId,omitempty"`
	OldestPending   *OldestPending `json:"oldestPending,omitempty"`
	// Poisoned counts the parked entries of this projection (all versions).
	Poisoned int64 `json:"poisoned"`
	// Stalled: behind the stream with no progress for STALL_AFTER (see StallCause).
	Stalled    bool   `json:"stalled"`
	StallCause string `json:"stallCause,omitempty"`
	// Building is true for a version being rebuilt; Rebuild is the rebuild's last progress.
	Building bool            `json:"building,omitempty"`
	Rebuild  json.RawMessage `json:"rebuild,omitempty"`
}

// ConsumerStatus is one consumer of a group.
type ConsumerStatus struct {
	Name    string `json:"name"`
	Pending int64  `json:"pending"`
	IdleMs  int64  `json:"idleMs"`
}

// OldestPending is the oldest entry delivered to the group and not yet acknowledged.
type OldestPending struct {
	ID       string `json:"id"`
	Consumer string `json:"consumer"`
	// IdleMs is the time since it was last delivered, or kept by the consumer that holds it (a
	// live consumer keeps it below CLAIM_IDLE for up to 10 minutes); AgeMs the time since it
	// was recorded.
	IdleMs     int64 `json:"idleMs"`
	AgeMs      int64 `json:"ageMs"`
	Deliveries int64 `json:"deliveries"`
}

// Status reads every group on the stream and counts the poison queue.
func (s *Status) Status(ctx context.Context) (StatusReport, error) {
	st := StatusReport{Stream: s.b.Stream.Name(), PoisonStream: s.b.Poison.Stream(), Projections: []ProjectionStatus{}}
	info, err := s.b.Stream.Info(ctx)
	if err != nil {
		return st, ops.Unavailable(err)
	}
	st.StreamLength, st.LastEntryID, st.EntriesAdded = info.Length, info.LastEntryID, info.EntriesAdded
	poisoned, err := s.b.Poison.CountByProjection(ctx)
	if err != nil {
		return st, ops.Unavailable(err)
	}
	for _, n := range poisoned {
		st.Poisoned += n
	}
	live, _, err := s.b.Live.ReadAll(ctx)
	if err != nil {
		return st, ops.Unavailable(err)
	}
	seen := map[string]bool{}
	onStream := map[string]bool{}
	for _, g := range info.Groups {
		onStream[g.Name] = true
	}
	for _, g := range info.Groups {
		name, version := ops.SplitGroup(g.Name)
		ps := ProjectionStatus{Projection: name, Version: version, Group: g.Name, Kind: KindGroup, GroupExists: true,
			Consumers: []ConsumerStatus{}, Pending: g.Pending, LastDeliveredID: g.LastDeliveredID, Poisoned: poisoned[name]}
		if ms, ok := live[g.Name]; ok {
			ps.Projection, ps.Version, ps.Kind = "", 0, KindLive
			addLiveMembers(&ps, ms, poisoned, seen)
		} else if _, m, ok := ops.MemberOf(live, g.Name); ok {
			ps.Kind, ps.BackfillTo, ps.BackfillDone = KindBackfill, m.Join, m.Own == ops.BackfillDone
		}
		// As /metrics and /ops/projections count it: Redis tells no lag for a group created in
		// the middle of the stream until it reaches the end, and the status said "unknown" (the
		// dashboard "?" and "ok") while the metrics counted it (found by a review). A finished
		// backfill has nothing left: what came after its join is the live group's.
		if ps.BackfillDone {
			var none int64
			ps.Lag = &none
		} else if lag, err := ops.GroupLag(ctx, s.b.Stream, info, &g); err == nil {
			ps.Lag = &lag
		}
		for _, c := range g.Consumers {
			ps.Consumers = append(ps.Consumers, ConsumerStatus{Name: c.Name, Pending: c.Pending, IdleMs: c.Idle.Milliseconds()})
		}
		if g.OldestPendingID != "" {
			op := &OldestPending{ID: g.OldestPendingID, Consumer: g.OldestPendingConsumer,
				IdleMs: g.OldestPendingIdle.Milliseconds(), Deliveries: g.OldestPendingDeliveries}
			if t, ok := ops.EntryTime(g.OldestPendingID); ok {
				op.AgeMs = max(s.now().Sub(t).Milliseconds(), 0)
			}
			ps.OldestPending = op
		}
		st.Projections = append(st.Projections, ps)
		seen[name] = true
	}
	// Live groups the registry has members of, missing on the stream (deleted, or a Redis that
	// came back without them): listed as the group not created yet, with its members, which a
	// projector creates again at its next join. (Their projections were listed as their own
	// groups of version 1, which no projector would create.)
	for _, name := range slices.Sorted(maps.Keys(live)) {
		ms := live[name]
		if onStream[name] || len(ms.Members) == 0 {
			continue
		}
		lag := info.Length // nothing delivered yet
		ps := ProjectionStatus{Group: name, Kind: KindLive, Consumers: []ConsumerStatus{}, Lag: &lag}
		addLiveMembers(&ps, ms, poisoned, seen)
		st.Projections = append(st.Projections, ps)
	}
	// Projections this build runs that no group feeds yet (never started), at the version the
	// registry serves.
	for _, n := range s.names {
		if !seen[n] {
			lag := info.Length // nothing delivered yet
			v := 1
			if vs, err := s.b.Registry.State(ctx, n); err == nil && vs.Serving > 0 {
				v = vs.Serving
			}
			st.Projections = append(st.Projections, ProjectionStatus{Projection: n, Version: v, Group: ops.MemberName(n, v),
				Kind: KindGroup, Consumers: []ConsumerStatus{}, Poisoned: poisoned[n], Lag: &lag})
		}
	}
	for i := range st.Projections {
		p := &st.Projections[i]
		if p.Kind == KindLive {
			continue
		}
		if vs, err := s.b.Registry.State(ctx, p.Projection); err == nil {
			p.Serving = vs.Serving == p.Version
			p.Building = vs.Building == p.Version
			if (p.Building || p.Serving) && json.Valid([]byte(vs.Rebuild)) {
				p.Rebuild = json.RawMessage(vs.Rebuild)
			}
		}
	}
	if s.stallAfter > 0 {
		var groups []string
		var at []int // the rows judged: a finished backfill has nothing to make progress on
		for i, p := range st.Projections {
			if !p.BackfillDone {
				groups, at = append(groups, p.Group), append(at, i)
			}
		}
		progress, _, err := s.progress.CheckGroups(ctx, groups)
		if err != nil {
			return st, ops.Unavailable(err)
		}
		for j, gp := range progress {
			st.Projections[at[j]].Stalled, st.Projections[at[j]].StallCause = gp.Stalled, gp.StallCause
		}
	}
	slices.SortFunc(st.Projections, func(a, b ProjectionStatus) int {
		if c := strings.Compare(a.Projection, b.Projection); c != 0 {
			return c
		}
		return a.Version - b.Version
	})
	return st, nil
}

// addLiveMembers fills a live group's row with its members and the parked entries of their
// projections (and those that are no events at all, parked once per group, under no projection),
// and marks the projections seen.
func addLiveMembers(ps *ProjectionStatus, ms ops.Membership, poisoned map[string]int64, seen map[string]bool) {
	ps.Poisoned = poisoned[""]
	counted := map[string]bool{}
	for m := range ms.Members {
		ps.Members = append(ps.Members, m)
		if n, _, ok := ops.ParseMemberName(m); ok && !counted[n] {
			counted[n] = true
			ps.Poisoned += poisoned[n]
			seen[n] = true
		}
	}
	slices.Sort(ps.Members)
}
