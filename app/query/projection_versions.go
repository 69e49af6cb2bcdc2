package query

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/checkins/checkins/app/ops"
	"github.com/checkins/checkins/app/projection"
)

// ProjectionVersions reports every projection's versions, their consumer groups, lag and
// rebuild progress, and tells projectors which versions to feed.
type ProjectionVersions struct {
	b        ops.Backend
	projs    []projection.Projection
	stall    time.Duration
	progress *ProgressMonitor
}

// NewProjectionVersions reports on projs (every projection this build knows). stallAfter > 0
// makes List flag versions that are behind and made no progress for that long.
func NewProjectionVersions(b ops.Backend, projs []projection.Projection, stallAfter time.Duration) (*ProjectionVersions, error) {
	if b.Stream == nil || b.Live == nil || b.Registry == nil || b.Observations == nil {
		return nil, errors.New("query: ProjectionVersions needs the backend's Stream, Live, Registry and Observations")
	}
	return &ProjectionVersions{b: b, projs: projs, stall: stallAfter, progress: NewProgressMonitor(b, stallAfter, nil)}, nil
}

// Version roles.
const (
	RoleServing  = "serving"
	RoleBuilding = "building"
	RoleRetiring = "retiring"
)

// ProjectionVersionStatus is one version of a projection: a key prefix and a consumer group.
type ProjectionVersionStatus struct {
	Projection string `json:"projection"`
	Version    int    `json:"version"`
	Role       string `json:"role"` // serving, building or retiring
	// Group is the consumer group the version is being fed through right now: its own group
	// while it backfills (LiveGroup then feeds it everything after Join), else LiveGroup.
	Group       string `json:"group"`
	LiveGroup   string `json:"liveGroup,omitempty"`
	Join        string `json:"join,omitempty"`
	Backfill    string `json:"backfill,omitempty"` // running or done
	GroupExists bool   `json:"groupExists"`
	Consumers   int    `json:"consumers"`
	// Lag is how many entries the group has still to deliver; for a backfilling version, how
	// many up to its join (ops.BackfillLag) where Redis tells. null when unknown.
	Lag     *int64 `json:"lag"`
	Pending int64  `json:"pending"`
	State   string `json:"state"`
	Stalled bool   `json:"stalled"`
}

// ProjectionsReport is `checkins projections list` and GET /ops/projections.
type ProjectionsReport struct {
	Projections []ProjectionRow           `json:"projections"`
	Versions    []ProjectionVersionStatus `json:"versions"`
	Rebuilds    []ops.RebuildProgress     `json:"rebuilds"`
}

// ProjectionRow is one projection: which version serves and which is being built.
type ProjectionRow struct {
	Projection string `json:"projection"`
	Serving    int    `json:"serving"`
	Building   int    `json:"building,omitempty"`
	Retiring   int    `json:"retiring,omitempty"`
}

// Targets are the versions projectors must feed for projs: the serving one and, during a
// rebuild, the building one, each as it writes the version's layout.
func (q *ProjectionVersions) Targets(ctx context.Context, projs []projection.Projection) ([]ops.ProjectionTarget, error) {
	var out []ops.ProjectionTarget
	for _, p := range projs {
		st, err := q.b.Registry.State(ctx, p.Name())
		if err != nil {
			return nil, err
		}
		for _, v := range []int{st.Serving, st.Building} {
			if v == 0 {
				continue
			}
			at, err := projection.AtLayout(p, st.LayoutOf(v))
			if err != nil {
				return nil, fmt.Errorf("projection %s v%d: %w", p.Name(), v, err)
			}
			out = append(out, ops.ProjectionTarget{Projection: at, Version: v})
		}
	}
	return out, nil
}

// List reports every known projection's versions with their groups' lag and pending.
func (q *ProjectionVersions) List(ctx context.Context) (ProjectionsReport, error) {
	rep := ProjectionsReport{Projections: []ProjectionRow{}, Versions: []ProjectionVersionStatus{}, Rebuilds: []ops.RebuildProgress{}}
	info, err := q.b.Stream.Info(ctx)
	if err != nil {
		return rep, ops.Unavailable(err)
	}
	groups, _, err := q.b.Live.ReadAll(ctx)
	if err != nil {
		return rep, ops.Unavailable(err)
	}
	for _, p := range q.projs {
		name := p.Name()
		st, err := q.b.Registry.State(ctx, name)
		if err != nil {
			return rep, ops.Unavailable(err)
		}
		rep.Projections = append(rep.Projections, ProjectionRow{Projection: name, Serving: st.Serving, Building: st.Building, Retiring: st.Retiring})
		for _, v := range []struct {
			version int
			role    string
		}{{st.Serving, RoleServing}, {st.Building, RoleBuilding}, {st.Retiring, RoleRetiring}} {
			if v.version == 0 {
				continue
			}
			vs := ProjectionVersionStatus{Projection: name, Version: v.version, Role: v.role, Group: ops.MemberName(name, v.version)}
			lg, m, member := ops.MemberOf(groups, ops.MemberName(name, v.version))
			if member {
				vs.LiveGroup, vs.Join, vs.Backfill = lg, m.Join, m.Own
				if m.Own == ops.BackfillDone {
					vs.Group = lg
				}
			}
			if g := info.Group(vs.Group); g != nil {
				lag, err := ops.GroupLag(ctx, q.b.Stream, info, g)
				if err != nil {
					return rep, ops.Unavailable(err)
				}
				if n, ok := ops.BackfillLag(m, g); ok && member && m.Own == ops.BackfillRunning {
					lag = n // what its backfill has to read, not what the live group feeds after it
				}
				vs.GroupExists, vs.Consumers, vs.Pending = true, len(g.Consumers), g.Pending
				if lag >= 0 {
					vs.Lag = &lag
				}
			}
			vs.State = VersionState(vs)
			rep.Versions = append(rep.Versions, vs)
		}
		if rp, ok := st.Progress(); ok {
			rep.Rebuilds = append(rep.Rebuilds, rp)
		}
	}
	if q.stall > 0 {
		if err := q.flagStalls(ctx, rep.Versions); err != nil {
			return rep, ops.Unavailable(err)
		}
	}
	return rep, nil
}

// flagStalls marks serving and building versions that are stalled.
func (q *ProjectionVersions) flagStalls(ctx context.Context, vs []ProjectionVersionStatus) error {
	var groups []string
	for _, v := range vs {
		if v.Role != RoleRetiring {
			groups = append(groups, v.Group)
		}
	}
	gs, _, err := q.progress.CheckGroups(ctx, groups)
	if err != nil {
		return err
	}
	for _, g := range gs {
		for i := range vs {
			if vs[i].Group == g.Group && g.Stalled {
				vs[i].Stalled = true
				vs[i].State = "STALLED: " + g.StallCause
			}
		}
	}
	return nil
}

// VersionState says in words where a version stands (the caught-up rule: nothing undelivered
// and nothing pending).
func VersionState(v ProjectionVersionStatus) string {
	switch {
	case v.Role == RoleRetiring:
		return "retired: keys are removed after the grace period"
	case !v.GroupExists:
		return "not started: no projector has run it yet"
	case v.Backfill == ops.BackfillRunning && v.Lag != nil:
		return fmt.Sprintf("backfilling up to %s: %d to go, %d pending (the live group feeds what came after)", v.Join, *v.Lag, v.Pending)
	case v.Lag != nil && *v.Lag == 0 && v.Pending == 0:
		if v.Role == RoleBuilding {
			return "caught up: switching reads"
		}
		return "caught up"
	case v.Lag == nil:
		return fmt.Sprintf("behind: lag unknown, %d pending", v.Pending)
	case v.Role == RoleBuilding:
		return fmt.Sprintf("building: %d to go, %d pending", *v.Lag, v.Pending)
	default:
		return fmt.Sprintf("behind: %d to go, %d pending", *v.Lag, v.Pending)
	}
}

// VersionStateCode is VersionState in one word, for what has to tell states apart (the
// dashboard's colours): stalled, retired, idle (not started), building (a backfill or a
// rebuild on its way), ok (caught up) or behind.
func VersionStateCode(v ProjectionVersionStatus) string {
	switch {
	case v.Stalled:
		return "stalled"
	case v.Role == RoleRetiring:
		return "retired"
	case !v.GroupExists:
		return "idle"
	case v.Backfill == ops.BackfillRunning && v.Lag != nil:
		return "building"
	case v.Lag != nil && *v.Lag == 0 && v.Pending == 0:
		return "ok"
	case v.Lag != nil && v.Role == RoleBuilding:
		return "building"
	default:
		return "behind"
	}
}

// Rebuilds is the progress of every projection's last rebuild.
func (q *ProjectionVersions) Rebuilds(ctx context.Context) ([]ops.RebuildProgress, error) {
	out := []ops.RebuildProgress{}
	for _, p := range q.projs {
		st, err := q.b.Registry.State(ctx, p.Name())
		if err != nil {
			return nil, ops.Unavailable(err)
		}
		if rp, ok := st.Progress(); ok {
			out = append(out, rp)
		}
	}
	return out, nil
}

// ActiveGroups are the groups that should be consuming for the named projections (for
// ProgressMonitor): the live group feeding each one's serving version (and, during a rebuild,
// its building version), and the own group of a version still backfilling (or not started).
func (q *ProjectionVersions) ActiveGroups(names []string) func(ctx context.Context) ([]string, error) {
	return func(ctx context.Context) ([]string, error) {
		groups, _, err := q.b.Live.ReadAll(ctx)
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
			st, err := q.b.Registry.State(ctx, n)
			if err != nil {
				return nil, err
			}
			for _, v := range []int{st.Serving, st.Building} {
				if v == 0 {
					continue
				}
				member := ops.MemberName(n, v)
				lg, m, ok := ops.MemberOf(groups, member)
				if ok {
					add(lg)
				}
				if !ok || m.Own == ops.BackfillRunning {
					add(member)
				}
			}
		}
		return out, nil
	}
}
