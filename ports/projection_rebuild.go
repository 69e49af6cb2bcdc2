package ports

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/labstack/echo/v4"
	"github.com/redis/go-redis/v9"

	"github.com/checkins/checkins/adapters"
	"github.com/checkins/checkins/app/projection"
	"github.com/checkins/checkins/domain"
)

// Rebuild states, as RebuildProgress.State.
const (
	RebuildBuilding = "building" // version N+1 consumes the stream from the start; N serves reads
	RebuildRetiring = "retiring" // reads switched to N+1; N's keys and group go after the grace
	RebuildDone     = "done"
)

// DefaultRetireGrace is how long a switch waits before removing the old version: longer than
// every projector's registry poll, so none still writes to the old keys when they go.
const DefaultRetireGrace = 10 * time.Second

// ProjectionOpsConfig wires rebuilds and the projections listing.
type ProjectionOpsConfig struct {
	Redis       redis.UniversalClient
	Keys        adapters.KeySpace
	Projections []projection.Projection // every projection this build knows
	RetireGrace time.Duration
	// StallAfter, when set, makes List flag versions that are behind and made no progress for
	// that long (see ProgressMonitor).
	StallAfter time.Duration
	Logger     *slog.Logger
}

// ProjectionOps lists projection versions and rebuilds projections without downtime.
//
// A rebuild of projection p serving version N:
//  1. marks N+1 as building in the registry and creates its own group p.v<N+1> at "0";
//  2. every projector polls the registry; the first to see N+1 joins it to its live group at
//     the stream's last entry J: from then on the live group feeds N+1 next to N (writing under
//     the key prefix of N+1), and the own group backfills N+1 with everything up to J, while
//     reads still go to N;
//  3. once the backfill has delivered and acknowledged everything up to J, N+1 is exactly as
//     current as N (the live group feeds both from the same batches), and whoever drives the
//     rebuild switches reads to N+1 in one registry write (compare-and-set, so concurrent
//     drivers switch once) and takes N out of the live group;
//  4. after RetireGrace (batches in flight finish) the driver unlinks N's keys.
//
// Every step is idempotent and its state lives in Redis, so the driver may be the CLI, the HTTP
// request's process or any projector, and a driver that dies is simply replaced: projectors
// drive every rebuild in progress.
type ProjectionOps struct {
	client   redis.UniversalClient
	keys     adapters.KeySpace
	versions *adapters.ProjectionVersions
	live     *adapters.LiveGroups
	projs    []projection.Projection
	grace    time.Duration
	stall    time.Duration
	log      *slog.Logger
	now      func() time.Time
}

// NewProjectionOps checks the configuration.
func NewProjectionOps(cfg ProjectionOpsConfig) (*ProjectionOps, error) {
	if cfg.Redis == nil || cfg.Logger == nil {
		return nil, errors.New("ports: ProjectionOps needs Redis and a Logger")
	}
	if cfg.RetireGrace <= 0 {
		cfg.RetireGrace = DefaultRetireGrace
	}
	return &ProjectionOps{client: cfg.Redis, keys: cfg.Keys, versions: adapters.NewProjectionVersions(cfg.Redis, cfg.Keys),
		live:  adapters.NewLiveGroups(cfg.Redis, cfg.Keys),
		projs: cfg.Projections, grace: cfg.RetireGrace, stall: cfg.StallAfter, log: cfg.Logger, now: time.Now}, nil
}

// RebuildProgress is the state of a projection's last rebuild.
type RebuildProgress struct {
	Projection string     `json:"projection"`
	State      string     `json:"state"`
	From       int        `json:"from"`
	To         int        `json:"to"`
	StartedAt  time.Time  `json:"startedAt"`
	SwitchedAt *time.Time `json:"switchedAt,omitempty"`
	FinishedAt *time.Time `json:"finishedAt,omitempty"`
	// Lag and Pending of the building group the last time a driver looked (-1: unknown).
	Lag     int64 `json:"lag"`
	Pending int64 `json:"pending"`
	// StreamLength is the stream's length then, for a sense of how far the build got.
	StreamLength int64 `json:"streamLength"`
}

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
	Lag         *int64 `json:"lag"` // null when unknown
	Pending     int64  `json:"pending"`
	State       string `json:"state"`
	Stalled     bool   `json:"stalled"`
}

// ProjectionsReport is `checkins projections list` and GET /ops/projections.
type ProjectionsReport struct {
	Projections []ProjectionRow           `json:"projections"`
	Versions    []ProjectionVersionStatus `json:"versions"`
	Rebuilds    []RebuildProgress         `json:"rebuilds"`
}

// ProjectionRow is one projection: which version serves and which is being built.
type ProjectionRow struct {
	Projection string `json:"projection"`
	Serving    int    `json:"serving"`
	Building   int    `json:"building,omitempty"`
	Retiring   int    `json:"retiring,omitempty"`
}

func (o *ProjectionOps) known(name string) error {
	for _, p := range o.projs {
		if p.Name() == name {
			return nil
		}
	}
	names := make([]string, len(o.projs))
	for i, p := range o.projs {
		names[i] = p.Name()
	}
	return fmt.Errorf("projection %q (known: %s): %w", name, strings.Join(names, ", "), domain.ErrNotFound)
}

// Targets are the versions projectors must feed for projs: the serving one and, during a
// rebuild, the building one.
func (o *ProjectionOps) Targets(ctx context.Context, projs []projection.Projection) ([]ProjectionTarget, error) {
	var out []ProjectionTarget
	for _, p := range projs {
		st, err := o.versions.State(ctx, p.Name())
		if err != nil {
			return nil, err
		}
		out = append(out, ProjectionTarget{Projection: p, Version: st.Serving})
		if st.Building > 0 {
			out = append(out, ProjectionTarget{Projection: p, Version: st.Building})
		}
	}
	return out, nil
}

// List reports every known projection's versions with their groups' lag and pending.
func (o *ProjectionOps) List(ctx context.Context) (ProjectionsReport, error) {
	rep := ProjectionsReport{Projections: []ProjectionRow{}, Versions: []ProjectionVersionStatus{}, Rebuilds: []RebuildProgress{}}
	info, err := adapters.ReadStreamInfo(ctx, o.client, o.keys.Stream())
	if err != nil {
		return rep, unavailable(err)
	}
	groups, _, err := o.live.ReadAll(ctx)
	if err != nil {
		return rep, unavailable(err)
	}
	for _, p := range o.projs {
		name := p.Name()
		st, err := o.versions.State(ctx, name)
		if err != nil {
			return rep, unavailable(err)
		}
		rep.Projections = append(rep.Projections, ProjectionRow{Projection: name, Serving: st.Serving, Building: st.Building, Retiring: st.Retiring})
		for _, v := range []struct {
			version int
			role    string
		}{{st.Serving, "serving"}, {st.Building, "building"}, {st.Retiring, "retiring"}} {
			if v.version == 0 {
				continue
			}
			vs := ProjectionVersionStatus{Projection: name, Version: v.version, Role: v.role, Group: o.keys.Group(name, v.version)}
			if lg, m, ok := memberOf(groups, adapters.MemberName(name, v.version)); ok {
				vs.LiveGroup, vs.Join, vs.Backfill = lg, m.Join, m.Own
				if m.Own == adapters.BackfillDone {
					vs.Group = lg
				}
			}
			if g := findGroup(info, vs.Group); g != nil {
				lag, err := o.groupLag(ctx, info, g)
				if err != nil {
					return rep, unavailable(err)
				}
				vs.GroupExists, vs.Consumers, vs.Pending = true, len(g.Consumers), g.Pending
				if lag >= 0 {
					vs.Lag = &lag
				}
			}
			vs.State = versionState(vs)
			rep.Versions = append(rep.Versions, vs)
		}
		if rp, ok := parseProgress(st.Rebuild); ok {
			rep.Rebuilds = append(rep.Rebuilds, rp)
		}
	}
	if o.stall > 0 {
		if err := o.flagStalls(ctx, rep.Versions); err != nil {
			return rep, unavailable(err)
		}
	}
	return rep, nil
}

// flagStalls marks serving and building versions that are stalled.
func (o *ProjectionOps) flagStalls(ctx context.Context, vs []ProjectionVersionStatus) error {
	var groups []string
	for _, v := range vs {
		if v.Role != "retiring" {
			groups = append(groups, v.Group)
		}
	}
	m := NewProgressMonitor(o.client, o.keys, o.stall, func(context.Context) ([]string, error) { return groups, nil })
	gs, _, err := m.Check(ctx)
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

// memberOf finds the live group a projection version is a member of.
func memberOf(groups map[string]adapters.Membership, member string) (string, adapters.LiveMember, bool) {
	for g, ms := range groups {
		if m, ok := ms.Members[member]; ok {
			return g, m, true
		}
	}
	return "", adapters.LiveMember{}, false
}

func versionState(v ProjectionVersionStatus) string {
	switch {
	case v.Role == "retiring":
		return "retired: keys are removed after the grace period"
	case !v.GroupExists:
		return "not started: no projector has run it yet"
	case v.Backfill == adapters.BackfillRunning && v.Lag != nil:
		return fmt.Sprintf("backfilling up to %s: %d to go, %d pending (the live group feeds what came after)", v.Join, *v.Lag, v.Pending)
	case v.Lag != nil && *v.Lag == 0 && v.Pending == 0:
		if v.Role == "building" {
			return "caught up: switching reads"
		}
		return "caught up"
	case v.Lag == nil:
		return fmt.Sprintf("behind: lag unknown, %d pending", v.Pending)
	case v.Role == "building":
		return fmt.Sprintf("building: %d to go, %d pending", *v.Lag, v.Pending)
	default:
		return fmt.Sprintf("behind: %d to go, %d pending", *v.Lag, v.Pending)
	}
}

func findGroup(info adapters.StreamInfo, name string) *adapters.GroupInfo {
	for i := range info.Groups {
		if info.Groups[i].Name == name {
			return &info.Groups[i]
		}
	}
	return nil
}

// lagCountCap bounds the XRANGE that counts a lag Redis cannot tell; beyond it, the cap is
// reported (a lower bound).
const lagCountCap = 10000

// groupLag is the number of entries not yet delivered to g. Redis 7 reports it unless entries
// were deleted from the middle of the stream; then they are counted, up to lagCountCap.
func (o *ProjectionOps) groupLag(ctx context.Context, info adapters.StreamInfo, g *adapters.GroupInfo) (int64, error) {
	return GroupLag(ctx, o.client, info, g)
}

// GroupLag is g's lag as groupLag computes it (shared with metrics and the stall check).
func GroupLag(ctx context.Context, client redis.UniversalClient, info adapters.StreamInfo, g *adapters.GroupInfo) (int64, error) {
	// Delivered up to the newest entry means nothing is undelivered, whatever the counter says
	// (the embedded miniredis does not keep it).
	if g.LastDeliveredID == info.LastEntryID || info.Length == 0 {
		return 0, nil
	}
	if g.Lag >= 0 {
		return g.Lag, nil
	}
	xs, err := client.XRangeN(ctx, info.Stream, "("+g.LastDeliveredID, "+", lagCountCap).Result()
	if err != nil {
		return 0, fmt.Errorf("count lag of %s: %w", g.Name, err)
	}
	return int64(len(xs)), nil
}

// Rebuild starts a rebuild of name, or returns the one in progress (so it can be resumed).
func (o *ProjectionOps) Rebuild(ctx context.Context, name string) (RebuildProgress, error) {
	if err := o.known(name); err != nil {
		return RebuildProgress{}, err
	}
	st, err := o.versions.State(ctx, name)
	if err != nil {
		return RebuildProgress{}, unavailable(err)
	}
	if st.Building == 0 && st.Retiring == 0 {
		// No build of N+1 ever switched, so a group N+1 is a leftover of a build abandoned by hand
		// (its handler only wrote keys once the group existed); start from nothing. Checking the
		// group first spares a SCAN of the whole keyspace in the usual case.
		info, err := adapters.ReadStreamInfo(ctx, o.client, o.keys.Stream())
		if err != nil {
			return RebuildProgress{}, unavailable(err)
		}
		if findGroup(info, o.keys.Group(name, st.Serving+1)) != nil {
			if _, err := o.removeVersion(ctx, name, st.Serving+1); err != nil {
				return RebuildProgress{}, unavailable(err)
			}
		}
	}
	from, to, started, err := o.versions.BeginBuild(ctx, name)
	if errors.Is(err, adapters.ErrRetiring) {
		return RebuildProgress{}, fmt.Errorf("%w: %w", errRebuildBusy, err)
	}
	if err != nil {
		return RebuildProgress{}, unavailable(err)
	}
	if !started {
		rp, _ := parseProgress(st.Rebuild)
		o.log.Info("rebuild already in progress, resuming", "projection", name, "from", from, "to", to)
		return rp, nil
	}
	// Creating the group here, at "0", makes the build's lag visible at once and pins its start
	// to the beginning of the stream whichever projector subscribes first.
	err = o.client.XGroupCreateMkStream(ctx, o.keys.Stream(), o.keys.Group(name, to), "0").Err()
	if err != nil && !strings.Contains(err.Error(), "BUSYGROUP") {
		return RebuildProgress{}, unavailable(fmt.Errorf("create group %s: %w", o.keys.Group(name, to), err))
	}
	rp := RebuildProgress{Projection: name, State: RebuildBuilding, From: from, To: to, StartedAt: o.now().UTC(), Lag: -1}
	if err := o.saveProgress(ctx, rp); err != nil {
		return rp, err
	}
	o.log.Info("rebuild started", "projection", name, "from", from, "to", to)
	return rp, nil
}

var errRebuildBusy = errors.New("cannot start a rebuild now")

// Step advances name's rebuild by what can be done now: switch reads once the new version has
// caught up, remove the old version once the grace has passed. It is idempotent and safe to run
// from several processes at once.
func (o *ProjectionOps) Step(ctx context.Context, name string) (RebuildProgress, error) {
	st, err := o.versions.State(ctx, name)
	if err != nil {
		return RebuildProgress{}, err
	}
	rp, ok := parseProgress(st.Rebuild)
	if !ok {
		rp = RebuildProgress{Projection: name, From: st.Serving, To: st.Building, StartedAt: o.now().UTC()}
	}
	switch {
	case st.Building > 0:
		info, err := adapters.ReadStreamInfo(ctx, o.client, o.keys.Stream())
		if err != nil {
			return rp, err
		}
		rp.State, rp.From, rp.To, rp.StreamLength = RebuildBuilding, st.Serving, st.Building, info.Length
		b := findGroup(info, o.keys.Group(name, st.Building))
		rp.Lag, rp.Pending = -1, 0
		if b != nil {
			if rp.Lag, err = o.groupLag(ctx, info, b); err != nil {
				return rp, err
			}
			rp.Pending = b.Pending
		}
		groups, _, err := o.live.ReadAll(ctx)
		if err != nil {
			return rp, err
		}
		// Caught up: the version is in a live group (fed with v<serving> from the same batches)
		// and its backfill of what came before delivered and acknowledged everything.
		building := adapters.MemberName(name, st.Building)
		lg, m, member := memberOf(groups, building)
		if member && m.Own == adapters.BackfillRunning && b != nil && b.Pending == 0 &&
			adapters.CompareEntryIDs(b.LastDeliveredID, m.Join) >= 0 {
			// What the projectors' checkpoints find too: the backfill delivered and acknowledged
			// everything up to the join position.
			if _, err := o.live.FinishBackfill(ctx, lg, building, o.now()); err != nil {
				return rp, err
			}
			m.Own = adapters.BackfillDone
		}
		caught := member && m.Own == adapters.BackfillDone
		if caught {
			now := o.now().UTC()
			switched, err := o.versions.Promote(ctx, name, st.Serving, st.Building, now)
			if err != nil {
				return rp, err
			}
			if !switched {
				// Another driver switched first; its progress record stands.
				return o.storedProgress(ctx, name, rp)
			}
			rp.State, rp.SwitchedAt = RebuildRetiring, &now
			o.log.Info("rebuild caught up: reads switched", "projection", name, "from", st.Serving, "to", st.Building,
				"live_group", lg)
			if err := o.leave(ctx, groups, adapters.MemberName(name, st.Serving)); err != nil {
				return rp, err
			}
		}
		return rp, o.saveProgress(ctx, rp)
	case st.Retiring > 0:
		rp.State = RebuildRetiring
		switchedAt := time.UnixMilli(st.SwitchedAt).UTC()
		rp.SwitchedAt = &switchedAt
		if o.now().Sub(switchedAt) < o.grace {
			return rp, o.saveProgress(ctx, rp)
		}
		groups, _, err := o.live.ReadAll(ctx)
		if err != nil {
			return rp, err
		}
		if err := o.leave(ctx, groups, adapters.MemberName(name, st.Retiring)); err != nil {
			return rp, err
		}
		removed, err := o.removeVersion(ctx, name, st.Retiring)
		if err != nil {
			return rp, err
		}
		if err := o.versions.Retired(ctx, name, st.Retiring); err != nil {
			return rp, err
		}
		now := o.now().UTC()
		rp.State, rp.FinishedAt = RebuildDone, &now
		o.log.Info("rebuild done: old version removed", "projection", name, "version", st.Retiring, "keys_removed", removed)
		return rp, o.saveProgress(ctx, rp)
	default:
		if !ok {
			rp.State = RebuildDone
		}
		return rp, nil
	}
}

// leave takes member out of whichever live group feeds it (a retired version): batches read
// after that do not feed it.
func (o *ProjectionOps) leave(ctx context.Context, groups map[string]adapters.Membership, member string) error {
	for g, ms := range groups {
		if _, ok := ms.Members[member]; ok {
			if err := o.live.Leave(ctx, g, member); err != nil {
				return fmt.Errorf("take %s out of live group %s: %w", member, g, err)
			}
		}
	}
	return nil
}

// Drive runs Step every interval until the rebuild is done or ctx ends, reporting each step.
func (o *ProjectionOps) Drive(ctx context.Context, name string, interval time.Duration, report func(RebuildProgress)) (RebuildProgress, error) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		rp, err := o.Step(ctx, name)
		if err != nil && ctx.Err() == nil {
			o.log.Warn("rebuild step failed, will retry", "projection", name, "error", err)
		}
		if err == nil && report != nil {
			report(rp)
		}
		if err == nil && rp.State == RebuildDone {
			return rp, nil
		}
		select {
		case <-ctx.Done():
			return rp, ctx.Err()
		case <-t.C:
		}
	}
}

// storedProgress rereads name's stored progress (fallback when it cannot be read).
func (o *ProjectionOps) storedProgress(ctx context.Context, name string, fallback RebuildProgress) (RebuildProgress, error) {
	st, err := o.versions.State(ctx, name)
	if err != nil {
		return fallback, err
	}
	if rp, ok := parseProgress(st.Rebuild); ok {
		return rp, nil
	}
	return fallback, nil
}

// Rebuilds is the progress of every projection's last rebuild (for GET /ops/status).
func (o *ProjectionOps) Rebuilds(ctx context.Context) ([]RebuildProgress, error) {
	out := []RebuildProgress{}
	for _, p := range o.projs {
		st, err := o.versions.State(ctx, p.Name())
		if err != nil {
			return nil, unavailable(err)
		}
		if rp, ok := parseProgress(st.Rebuild); ok {
			out = append(out, rp)
		}
	}
	return out, nil
}

// Watch keeps router feeding the versions the registry asks for (a new building version, not
// a retired one) and drives rebuilds in progress, every interval, until ctx ends.
func (o *ProjectionOps) Watch(ctx context.Context, router *ProjectionRouter, projs []projection.Projection, interval time.Duration) error {
	t := time.NewTicker(interval)
	defer t.Stop()
	failing := &throttledLog{interval: time.Minute}
	for {
		err := o.reconcile(ctx, router, projs)
		if err != nil && ctx.Err() == nil && !errors.Is(err, ErrRouterNotRunning) {
			if ok, n := failing.allow(); ok {
				o.log.Warn("cannot set up the projections from the registry, will retry", "error", err, "suppressed", n)
			}
		}
		if ctx.Err() == nil && !errors.Is(err, ErrRouterNotRunning) {
			router.ReportSetup(err)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

func (o *ProjectionOps) reconcile(ctx context.Context, router *ProjectionRouter, projs []projection.Projection) error {
	targets, err := o.Targets(ctx, projs)
	if err != nil {
		return err
	}
	if _, _, err := router.SetTargets(ctx, targets); err != nil {
		return err
	}
	if err := o.removeFinishedBackfills(ctx); err != nil {
		return err
	}
	for _, p := range projs {
		st, err := o.versions.State(ctx, p.Name())
		if err != nil {
			return err
		}
		if st.Building > 0 || st.Retiring > 0 {
			if _, err := o.Step(ctx, p.Name()); err != nil {
				return err
			}
		}
	}
	return nil
}

// removeVersion destroys version's group and unlinks its keys in batches; it returns how many
// keys went.
func (o *ProjectionOps) removeVersion(ctx context.Context, name string, version int) (int64, error) {
	err := o.client.XGroupDestroy(ctx, o.keys.Stream(), o.keys.Group(name, version)).Err()
	if err != nil && !strings.Contains(err.Error(), "no such key") {
		return 0, fmt.Errorf("destroy group %s: %w", o.keys.Group(name, version), err)
	}
	pattern := escapeGlob(o.keys.ProjectionPrefix(name, version)) + "*"
	removed, err := o.unlinkMatching(ctx, pattern)
	if err != nil {
		return removed, err
	}
	// Once more: a subscription of a projector that had not yet retired the version may have
	// recreated the group while the keys went.
	if err := o.client.XGroupDestroy(ctx, o.keys.Stream(), o.keys.Group(name, version)).Err(); err != nil && !strings.Contains(err.Error(), "no such key") {
		return removed, fmt.Errorf("destroy group %s: %w", o.keys.Group(name, version), err)
	}
	// The progress monitor's observation of the group goes with it, and the group's markers.
	if err := o.client.HDel(ctx, progressKey(o.keys), o.keys.Group(name, version)).Err(); err != nil {
		return removed, err
	}
	n, err := o.removeOwnGroup(ctx, o.keys.Group(name, version))
	return removed + n, err
}

// unlinkMatching unlinks, in batches, every key matching pattern (on every master of a
// cluster); it returns how many went.
func (o *ProjectionOps) unlinkMatching(ctx context.Context, pattern string) (int64, error) {
	var removed int64
	scan := func(ctx context.Context, c redis.UniversalClient) error {
		iter := c.Scan(ctx, 0, pattern, 1000).Iterator()
		batch := make([]string, 0, 500)
		flush := func() error {
			if len(batch) == 0 {
				return nil
			}
			n, err := c.Unlink(ctx, batch...).Result()
			removed += n
			batch = batch[:0]
			return err
		}
		for iter.Next(ctx) {
			batch = append(batch, iter.Val())
			if len(batch) == cap(batch) {
				if err := flush(); err != nil {
					return err
				}
			}
		}
		if err := iter.Err(); err != nil {
			return err
		}
		return flush()
	}
	var err error
	if cc, ok := o.client.(*redis.ClusterClient); ok {
		err = cc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error { return scan(ctx, c) })
	} else {
		err = scan(ctx, o.client)
	}
	if err != nil {
		return removed, fmt.Errorf("remove keys %s: %w", pattern, err)
	}
	return removed, nil
}

// removeOwnGroup destroys a version's own group once its backfill is over, with its markers and
// its recorded position; it returns how many keys went.
func (o *ProjectionOps) removeOwnGroup(ctx context.Context, group string) (int64, error) {
	err := o.client.XGroupDestroy(ctx, o.keys.Stream(), group).Err()
	if err != nil && !strings.Contains(err.Error(), "no such key") {
		return 0, fmt.Errorf("destroy group %s: %w", group, err)
	}
	n, err := o.unlinkMatching(ctx, escapeGlob(o.keys.MarkerPrefix(group))+"*")
	if err != nil {
		return n, err
	}
	if err := o.live.ForgetAcked(ctx, group); err != nil {
		return n, err
	}
	return n, o.client.HDel(ctx, progressKey(o.keys), group).Err()
}

// removeFinishedBackfills removes the own groups of versions whose backfill finished more than
// RetireGrace ago (every projector has stopped its handler by then), and, after an upgrade, the
// earlier layout's dedupe sets of those versions.
func (o *ProjectionOps) removeFinishedBackfills(ctx context.Context) error {
	groups, _, err := o.live.ReadAll(ctx)
	if err != nil {
		return err
	}
	info, err := adapters.ReadStreamInfo(ctx, o.client, o.keys.Stream())
	if err != nil {
		return err
	}
	for _, ms := range groups {
		for member, m := range ms.Members {
			if m.Own != adapters.BackfillDone || findGroup(info, member) == nil {
				continue
			}
			doneAt, err := strconv.ParseInt(m.DoneAt, 10, 64)
			if err != nil || o.now().Sub(time.UnixMilli(doneAt)) < o.grace {
				continue
			}
			n, err := o.removeOwnGroup(ctx, member)
			if err != nil {
				return err
			}
			if m.Legacy != "" {
				name, version, _ := adapters.ParseMemberName(member)
				k, err := o.unlinkMatching(ctx, escapeGlob(o.keys.ProjectionPrefix(name, version))+"{*}:seen")
				if err != nil {
					return err
				}
				n += k
			}
			o.log.Info("backfill group removed", "group", member, "keys_removed", n)
		}
	}
	return nil
}

func escapeGlob(s string) string {
	var b strings.Builder
	for _, r := range s {
		if strings.ContainsRune(`*?[]\`, r) {
			b.WriteByte('\\')
		}
		b.WriteRune(r)
	}
	return b.String()
}

func parseProgress(s string) (RebuildProgress, bool) {
	var rp RebuildProgress
	if s == "" || json.Unmarshal([]byte(s), &rp) != nil {
		return RebuildProgress{}, false
	}
	return rp, true
}

func (o *ProjectionOps) saveProgress(ctx context.Context, rp RebuildProgress) error {
	b, err := json.Marshal(rp)
	if err != nil {
		return err
	}
	if err := o.versions.SetRebuildStatus(ctx, rp.Projection, string(b)); err != nil {
		return unavailable(err)
	}
	return nil
}

// WriteProjectionsText prints the report as a table for people.
func WriteProjectionsText(w io.Writer, rep ProjectionsReport) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "PROJECTION\tSERVING\tBUILDING\tVERSION\tGROUP\tLAG\tPENDING\tSTATE")
	for _, v := range rep.Versions {
		var row ProjectionRow
		for _, r := range rep.Projections {
			if r.Projection == v.Projection {
				row = r
			}
		}
		lag := "?"
		if v.Lag != nil {
			lag = strconv.FormatInt(*v.Lag, 10)
		}
		building := "-"
		if row.Building > 0 {
			building = "v" + strconv.Itoa(row.Building)
		}
		fmt.Fprintf(tw, "%s\tv%d\t%s\tv%d (%s)\t%s\t%s\t%d\t%s\n", v.Projection, row.Serving, building, v.Version, v.Role, v.Group, lag, v.Pending, v.State)
	}
	if len(rep.Rebuilds) > 0 {
		fmt.Fprintln(tw)
		fmt.Fprintln(tw, "LAST REBUILD\tFROM\tTO\tSTATE\tSTARTED\tSWITCHED\tFINISHED")
		for _, r := range rep.Rebuilds {
			fmt.Fprintf(tw, "%s\tv%d\tv%d\t%s\t%s\t%s\t%s\n", r.Projection, r.From, r.To, r.State,
				r.StartedAt.Format(time.RFC3339), fmtTime(r.SwitchedAt), fmtTime(r.FinishedAt))
		}
	}
	return tw.Flush()
}

func fmtTime(t *time.Time) string {
	if t == nil {
		return "-"
	}
	return t.Format(time.RFC3339)
}

// RegisterProjectionOpsRoutes adds:
//
//	GET  /ops/projections                versions, groups, lag, pending and rebuild progress
//	POST /ops/projections/{name}/rebuild start a rebuild (202); projectors carry it out
func RegisterProjectionOpsRoutes(e *echo.Echo, o *ProjectionOps) {
	registerAPI(e, &apiServer{proj: &projectionOpsHandlers{o: o}}, partProjectionOps)
}

type projectionOpsHandlers struct{ o *ProjectionOps }

func (h *projectionOpsHandlers) list(c echo.Context) error {
	rep, err := h.o.List(c.Request().Context())
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, rep)
}

func (h *projectionOpsHandlers) rebuild(c echo.Context) error {
	rp, err := h.o.Rebuild(c.Request().Context(), c.Param("name"))
	switch {
	case errors.Is(err, domain.ErrNotFound):
		return apiError(http.StatusNotFound, domain.CodeNotFound, "name", err.Error())
	case errors.Is(err, errRebuildBusy):
		return apiError(http.StatusConflict, domain.CodeConflict, "name", err.Error())
	case err != nil:
		return err
	}
	c.Response().Header().Set(echo.HeaderLocation, "/ops/projections")
	return c.JSON(http.StatusAccepted, rp)
}
