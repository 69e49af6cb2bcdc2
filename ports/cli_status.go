package ports

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/checkins/checkins/adapters"
	"github.com/checkins/checkins/app/projection"
)

// StatusOps reports the consumers' state, shared by `checkins status` and GET /ops/status.
type StatusOps struct {
	client   redis.UniversalClient
	keys     adapters.KeySpace
	names    []string
	queue    *adapters.PoisonQueue
	versions *adapters.ProjectionVersions
	now      func() time.Time
	// stallAfter > 0 flags groups behind the stream that made no progress for that long.
	stallAfter time.Duration
}

// WithStallAfter makes Status flag stalled groups, judged as /readyz judges them.
func (s *StatusOps) WithStallAfter(d time.Duration) *StatusOps {
	s.stallAfter = d
	return s
}

// NewStatusOps reports on the given projections (and on any other group found on the stream).
func NewStatusOps(client redis.UniversalClient, keys adapters.KeySpace, projections []projection.Projection) (*StatusOps, error) {
	if client == nil {
		return nil, errors.New("ports: StatusOps needs a Redis client")
	}
	s := &StatusOps{client: client, keys: keys, queue: adapters.NewPoisonQueue(client, keys),
		versions: adapters.NewProjectionVersions(client, keys), now: time.Now}
	for _, p := range projections {
		s.names = append(s.names, p.Name())
	}
	return s, nil
}

// Status is the whole picture.
type Status struct {
	Stream       string             `json:"stream"`
	StreamLength int64              `json:"streamLength"`
	LastEntryID  string             `json:"lastEntryId,omitempty"`
	PoisonStream string             `json:"poisonStream"`
	Poisoned     int64              `json:"poisoned"`
	Projections  []ProjectionStatus `json:"projections"`
}

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
	// IdleMs is the time since it was last delivered; AgeMs the time since it was recorded.
	IdleMs     int64 `json:"idleMs"`
	AgeMs      int64 `json:"ageMs"`
	Deliveries int64 `json:"deliveries"`
}

// Status reads XINFO and XPENDING for every group on the stream and counts the poison queue.
func (s *StatusOps) Status(ctx context.Context) (Status, error) {
	st := Status{Stream: s.keys.Stream(), PoisonStream: s.queue.Stream(), Projections: []ProjectionStatus{}}
	info, err := adapters.ReadStreamInfo(ctx, s.client, s.keys.Stream())
	if err != nil {
		return st, unavailable(err)
	}
	st.StreamLength, st.LastEntryID = info.Length, info.LastEntryID
	poisoned, err := s.queue.CountByProjection(ctx)
	if err != nil {
		return st, unavailable(err)
	}
	for _, n := range poisoned {
		st.Poisoned += n
	}
	live, _, err := adapters.NewLiveGroups(s.client, s.keys).ReadAll(ctx)
	if err != nil {
		return st, unavailable(err)
	}
	seen := map[string]bool{}
	for _, g := range info.Groups {
		name, version := splitGroup(g.Name)
		ps := ProjectionStatus{Projection: name, Version: version, Group: g.Name, Kind: "group", GroupExists: true,
			Consumers: []ConsumerStatus{}, Pending: g.Pending, LastDeliveredID: g.LastDeliveredID, Poisoned: poisoned[name]}
		if ms, ok := live[g.Name]; ok {
			// Entries that are not events at all are parked once per group, under no projection.
			ps.Projection, ps.Version, ps.Kind, ps.Poisoned = "", 0, "live", poisoned[""]
			counted := map[string]bool{}
			for m := range ms.Members {
				ps.Members = append(ps.Members, m)
				if n, _, ok := adapters.ParseMemberName(m); ok && !counted[n] {
					counted[n] = true
					ps.Poisoned += poisoned[n]
					seen[n] = true
				}
			}
			slices.Sort(ps.Members)
		} else if _, m, ok := memberOf(live, g.Name); ok {
			ps.Kind, ps.BackfillTo = "backfill", m.Join
		}
		if g.Lag >= 0 {
			lag := g.Lag
			ps.Lag = &lag
		}
		for _, c := range g.Consumers {
			ps.Consumers = append(ps.Consumers, ConsumerStatus{Name: c.Name, Pending: c.Pending, IdleMs: c.Idle.Milliseconds()})
		}
		if g.OldestPendingID != "" {
			op := &OldestPending{ID: g.OldestPendingID, Consumer: g.OldestPendingConsumer,
				IdleMs: g.OldestPendingIdle.Milliseconds(), Deliveries: g.OldestPendingDeliveries}
			if t, ok := adapters.EntryTime(g.OldestPendingID); ok {
				op.AgeMs = max(s.now().Sub(t).Milliseconds(), 0)
			}
			ps.OldestPending = op
		}
		st.Projections = append(st.Projections, ps)
		seen[name] = true
	}
	// Projections this build runs that no group feeds yet (never started).
	for _, n := range s.names {
		if !seen[n] {
			st.Projections = append(st.Projections, ProjectionStatus{Projection: n, Version: 1, Group: s.keys.Group(n, 1),
				Kind: "group", Consumers: []ConsumerStatus{}, Poisoned: poisoned[n]})
		}
	}
	for i := range st.Projections {
		p := &st.Projections[i]
		if p.Kind == "live" {
			continue
		}
		if vs, err := s.versions.State(ctx, p.Projection); err == nil {
			p.Serving = vs.Serving == p.Version
			p.Building = vs.Building == p.Version
			if (p.Building || p.Serving) && json.Valid([]byte(vs.Rebuild)) {
				p.Rebuild = json.RawMessage(vs.Rebuild)
			}
		}
	}
	if s.stallAfter > 0 {
		groups := make([]string, len(st.Projections))
		for i, p := range st.Projections {
			groups[i] = p.Group
		}
		mon := NewProgressMonitor(s.client, s.keys, s.stallAfter, func(context.Context) ([]string, error) { return groups, nil })
		progress, _, err := mon.Check(ctx)
		if err != nil {
			return st, unavailable(err)
		}
		for i, gp := range progress {
			st.Projections[i].Stalled, st.Projections[i].StallCause = gp.Stalled, gp.StallCause
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

// splitGroup reads "users.v2" as ("users", 2); other names come back whole with version 0.
func splitGroup(g string) (string, int) {
	i := strings.LastIndex(g, ".v")
	if i < 0 {
		return g, 0
	}
	v, err := strconv.Atoi(g[i+2:])
	if err != nil {
		return g, 0
	}
	return g[:i], v
}

// WriteStatusText prints st as tables for people.
func WriteStatusText(w io.Writer, st Status) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "stream %s: %d entries, last %s; poison queue %s: %d entries\n\n", st.Stream, st.StreamLength,
		orDash(st.LastEntryID), st.PoisonStream, st.Poisoned)
	fmt.Fprintln(tw, "GROUP\tFEEDS\tSERVING\tCONSUMERS\tPENDING\tLAG\tOLDEST PENDING\tPOISONED\tSTATE")
	for _, p := range st.Projections {
		lag := "?"
		if p.Lag != nil {
			lag = strconv.FormatInt(*p.Lag, 10)
		}
		oldest := "-"
		if p.OldestPending != nil {
			oldest = fmt.Sprintf("%s (idle %s, %d deliveries, %s)", p.OldestPending.ID,
				time.Duration(p.OldestPending.IdleMs)*time.Millisecond, p.OldestPending.Deliveries, p.OldestPending.Consumer)
		}
		group := p.Group
		if !p.GroupExists {
			group += " (not created yet)"
		}
		feeds, serving := adapters.MemberName(p.Projection, max(p.Version, 1)), strconv.FormatBool(p.Serving)
		switch p.Kind {
		case "live":
			feeds, serving = strings.Join(p.Members, " "), "-"
		case "backfill":
			feeds += " up to " + p.BackfillTo
		}
		state := "ok"
		switch {
		case p.Stalled:
			state = "STALLED"
		case p.Building:
			state = "rebuilding"
		case p.Kind == "backfill":
			state = "backfilling"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%s\t%s\t%d\t%s\n", group, feeds, serving, len(p.Consumers), p.Pending, lag, oldest, p.Poisoned, state)
	}
	for _, p := range st.Projections {
		if p.Stalled {
			fmt.Fprintf(tw, "\n%s", p.StallCause)
		}
	}
	fmt.Fprintln(tw)
	fmt.Fprintln(tw)
	fmt.Fprintln(tw, "GROUP\tCONSUMER\tPENDING\tIDLE")
	for _, p := range st.Projections {
		for _, c := range p.Consumers {
			fmt.Fprintf(tw, "%s\t%s\t%d\t%s\n", p.Group, c.Name, c.Pending, time.Duration(c.IdleMs)*time.Millisecond)
		}
	}
	return tw.Flush()
}

// WritePoisonText prints a page of parked entries as a table for people.
func WritePoisonText(w io.Writer, page PoisonPage) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tFAILED AT\tPROJECTION\tATTEMPTS\tENTRY\tERROR")
	for _, e := range page.Entries {
		msg := strings.ReplaceAll(e.Error, "\n", " ")
		if len(msg) > 100 {
			msg = msg[:97] + "..."
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%s\n", e.ID, e.FailedAt.UTC().Format(time.RFC3339), e.Projection, e.Attempts, orDash(e.EntryID), msg)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if page.Next != "" {
		_, err := fmt.Fprintf(w, "more: --cursor %s\n", page.Next)
		return err
	}
	return nil
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
