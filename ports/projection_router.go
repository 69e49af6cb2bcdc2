package ports

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"

	"github.com/checkins/checkins/app/ops"
	"github.com/checkins/checkins/app/projection"
	"github.com/checkins/checkins/domain"
)

// How the projections are fed, one story over a few files:
//
//   - projection_router.go (here): the Watermill router. One handler for the live group, which
//     feeds every projection version that joined it, and one per version still backfilling
//     through its own group; SetTargets starts and stops them as the registry asks
//     (projection_registry_watch.go polls it); checkpoints record how far each group got.
//   - projection_subscription.go: the subscriber cmd hands in per group (NewSubscriber), wrapped
//     to notice a subscription that ends; projection_batch.go turns its messages into batches.
//   - projection_middleware.go: around every batch, outermost first: poison queue, retry with
//     backoff, a timeout per attempt, panic recovery.
//   - projection_feed.go: the batch handler: decode once (ProjectorBackend.DecodeEntries), run
//     each member's handlers, apply every update in a few script calls (ProjectionApplier).
//   - projection_backend.go: what the router needs from outside, as interfaces; cmd hands in
//     adapters.ProjectorBackend and adapters.ProjectionApplier.

// Outcomes of handling events, as reported to a ProjectionObserver.
const (
	OutcomeApplied   = "applied"
	OutcomeDuplicate = "duplicate" // another copy of the check-in was counted
	OutcomeFailed    = "failed"    // an attempt failed (it may be retried)
	OutcomePoisoned  = "poisoned"  // parked in the poison queue
)

// ReasonLeaseExpired is the reason a batch is counted under in ProjectionObserver.Transient when
// its writes were refused because its lease ran out (projection.ErrLeaseExpired).
const ReasonLeaseExpired = "lease ran out"

// ProjectionObserver sees what the router does (metrics hook up here): n events of projection
// had outcome in a batch that took d; and batches that could not be applied because of a
// transient failure, with its short reason ("redis out of memory").
type ProjectionObserver interface {
	Handled(projection, outcome string, n int, d time.Duration)
	Transient(group, reason string)
}

type noObserver struct{}

func (noObserver) Handled(string, string, int, time.Duration) {}
func (noObserver) Transient(string, string)                   {}

// LiveGroupName is the processing group of a process running projections names; all is every
// projection of the build (the default). Processes running the same projections share it.
func LiveGroupName(names []string, all bool) string {
	if all || len(names) == 0 {
		return "live"
	}
	s := append([]string(nil), names...)
	sort.Strings(s)
	return "live:" + strings.Join(s, ",")
}

// DefaultCheckpointInterval is how often a projector records how far its groups acknowledged:
// the markers above that position are what Redis holds beyond the read models while busy.
const DefaultCheckpointInterval = 250 * time.Millisecond

// ProjectionRouterConfig wires the shared machinery every projection gets.
type ProjectionRouterConfig struct {
	// Projections are the projections this process runs (any version of them); default: those
	// of Targets.
	Projections []projection.Projection
	// Targets, when set, are the versions Run starts feeding (SetTargets changes them later).
	Targets []ops.ProjectionTarget
	// LiveGroup is the processing group they share (LiveGroupName).
	LiveGroup string
	// Backend holds the registry, the poison queue and the groups' progress (not the
	// subscribers'), and decodes the subscribers' messages.
	Backend ProjectorBackend
	// Applier applies the projections' updates.
	Applier ProjectionApplier
	// NewSubscriber returns a fresh subscriber for a consumer group (on every partition of the
	// stream); start says where the group stands on a partition's stream when it has to be
	// created there (or recreated after Redis lost it).
	NewSubscriber func(group string, start func(ctx context.Context, stream string) (string, error)) (message.Subscriber, error)
	// BatchSize bounds the entries of one batch handed to the projections.
	BatchSize      int
	Retry          RetryPolicy
	HandlerTimeout time.Duration
	CloseTimeout   time.Duration
	// CheckpointInterval is how often each group's acknowledged position is recorded (the
	// markers below it are pruned from then on); default DefaultCheckpointInterval.
	CheckpointInterval time.Duration
	Observer           ProjectionObserver
	Logger             *slog.Logger
	// Paused, when set and true, says the subscribers are paused for a partition migration.
	Paused func() bool
}

// ProjectionRouter is the Watermill router that feeds the projections from the event stream:
// one handler for the live group, which feeds every projection version that has joined it,
// and one per version still backfilling through its own group.
type ProjectionRouter struct {
	cfg     ProjectionRouterConfig
	router  *message.Router
	backend ProjectorBackend
	projs   map[string]projection.Projection
	running atomic.Bool
	// atVersion is each member (<name>.v<N>) SetTargets was given, as its version writes: the
	// projection at the layout the registry records for that version. During a rebuild into a
	// new layout the serving version is still written in its own (projection.Layouts).
	atMu      sync.RWMutex
	atVersion map[string]projection.Projection
	// targeted: the members of SetTargets' last call (under atMu). An own group's member missing
	// from every partition is lost there while it is one; otherwise it left (it retired).
	targeted map[string]bool
	log      *slog.Logger

	// Handlers by consumer group; mu guards them, once the router runs. runCtx is Run's context,
	// which handlers added later run under.
	mu       sync.Mutex
	runCtx   context.Context
	handlers map[string]*runningHandler
	retired  map[string]bool
	adds     map[string]int // handlers added for each group so far: Watermill's handler names
	stopped  chan string
	joined   map[string]bool // members this process joined (or found joined)
	partial  map[string]bool // joined members found missing from a partition at the last look

	ackMu sync.RWMutex
	acked map[string]string // group -> acknowledged through (the registry's checkpoints)
	// lastDelivered is each group's last delivered entry at the previous checkpoint (only the
	// checkpoint loop uses it).
	lastDelivered map[string]string

	probMu  sync.Mutex
	problem map[string]string // group -> why its batches cannot be applied now

	// parked are the units this process parked whose entries it has not acknowledged since (a
	// batch nacked after the park: a transient failure applying the entry's other units, or a
	// shutdown). Delivered again, such a unit is not applied: the poison queue holds it, and
	// its replay counts it. An entry that failed intermittently, applied on its redelivery and
	// then replayed, was counted twice. parkedN is its size, read without the lock.
	parkMu  sync.Mutex
	parked  map[ops.UnitRef]time.Time
	parkedN atomic.Int64
	// unsure are the entries (UnitRef without a member) of parks that failed here: the script
	// may have run and its reply been lost. Delivered again (the batched subscriber hands a
	// nacked batch back as a first delivery), they are asked about in the poison queue's
	// records; applied instead, a park that did land was counted again by its replay.
	unsure map[ops.UnitRef]time.Time
	// parkedCursor is where the next checkpoint's sweep of the parked records goes on.
	parkedCursor uint64

	// joinsSeen is the registries' count of joins the last batch read (noteJoins).
	joinsMu   sync.Mutex
	joinsSeen string
}

type runningHandler struct {
	h   *message.Handler
	sub message.Subscriber
}

// NewProjectionRouter builds the router; SetTargets tells it what to feed, Run starts it.
func NewProjectionRouter(cfg ProjectionRouterConfig) (*ProjectionRouter, error) {
	if cfg.Backend == nil || cfg.Applier == nil || cfg.NewSubscriber == nil || cfg.Logger == nil {
		return nil, errors.New("ports: ProjectionRouter needs a Backend, an Applier, NewSubscriber and Logger")
	}
	if len(cfg.Projections) == 0 {
		for _, t := range cfg.Targets {
			if !slices.ContainsFunc(cfg.Projections, func(p projection.Projection) bool { return p.Name() == t.Projection.Name() }) {
				cfg.Projections = append(cfg.Projections, t.Projection)
			}
		}
	}
	if cfg.LiveGroup == "" {
		cfg.LiveGroup = LiveGroupName(nil, true)
	}
	if err := cfg.Retry.Validate(); err != nil {
		return nil, err
	}
	if cfg.Observer == nil {
		cfg.Observer = noObserver{}
	}
	if cfg.CloseTimeout <= 0 {
		cfg.CloseTimeout = 30 * time.Second
	}
	if cfg.CheckpointInterval <= 0 {
		cfg.CheckpointInterval = DefaultCheckpointInterval
	}
	if cfg.BatchSize <= 0 {
		cfg.BatchSize = 500
	}
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: cfg.CloseTimeout}, newRouterLogger(cfg.Logger))
	if err != nil {
		return nil, err
	}
	r := &ProjectionRouter{cfg: cfg, router: router, backend: cfg.Backend, projs: map[string]projection.Projection{},
		atVersion: map[string]projection.Projection{}, log: cfg.Logger,
		handlers: map[string]*runningHandler{}, retired: map[string]bool{}, adds: map[string]int{}, stopped: make(chan string, 64),
		joined: map[string]bool{}, partial: map[string]bool{}, acked: map[string]string{}, lastDelivered: map[string]string{},
		problem: map[string]string{}}
	for _, p := range cfg.Projections {
		if !validProjectionName(p.Name()) {
			return nil, fmt.Errorf("projection name %q: use lower-case letters, digits and _ only", p.Name())
		}
		if _, dup := r.projs[p.Name()]; dup {
			return nil, fmt.Errorf("projection %s listed twice", p.Name())
		}
		r.projs[p.Name()] = p
	}
	return r, nil
}

func validProjectionName(s string) bool {
	if s == "" || len(s) > 64 {
		return false
	}
	for _, c := range s {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_') {
			return false
		}
	}
	return true
}

// LiveGroup is the processing group this router feeds.
func (r *ProjectionRouter) LiveGroup() string { return r.cfg.LiveGroup }

// addHandler adds (not starts) the handler of one consumer group; callers hold r.mu.
func (r *ProjectionRouter) addHandler(group, member string) error {
	sub, err := r.cfg.NewSubscriber(group, func(ctx context.Context, stream string) (string, error) {
		return r.groupStart(ctx, stream, group, member)
	})
	if err != nil {
		return fmt.Errorf("subscriber for %s: %w", group, err)
	}
	sub = watchSubscription(batching(sub, r.cfg.BatchSize))
	f := &feed{r: r, group: group, member: member}
	// Watermill holds a retired handler until it has started and ended, and panics on a second
	// one of the same name: a group wanted again meanwhile gets a handler of another name.
	name := group
	if n := r.adds[group]; n > 0 {
		name = group + "#" + strconv.Itoa(n+1)
	}
	r.adds[group]++
	h := r.router.AddConsumerHandler(name, r.backend.Stream(), sub, func(msg *message.Message) error {
		_, err := f.handle(msg)
		return err
	})
	// The first added is the outermost: poison queue, then retry, then a per-attempt timeout,
	// then panic recovery innermost, so a panic is retried and parked like any failure.
	h.AddMiddleware(
		r.poisonMiddleware(group),
		retryMiddleware(r.cfg.Retry),
		timeoutMiddleware(r.cfg.HandlerTimeout),
		middleware.Recoverer,
	)
	r.handlers[group] = &runningHandler{h: h, sub: sub}
	delete(r.retired, group)
	return nil
}

// groupStart is where a group must be (re)created: where it had acknowledged through, so
// nothing is skipped and what is delivered again is caught by the markers; without a record,
// the live group at its first member's join position and an own group at the start. All of it
// on partition stream: positions of one partition say nothing about another's.
func (r *ProjectionRouter) groupStart(ctx context.Context, stream, group, member string) (string, error) {
	acked, err := r.backend.Acked(ctx, stream, group)
	if err != nil || acked != "" {
		return acked, err
	}
	if member != "" {
		ms, err := r.backend.Read(ctx, r.cfg.LiveGroup)
		if err != nil {
			return "", err
		}
		if _, ok := ms.Members[member]; !ok {
			// Redis lost the membership (rejoinIfLost joins it again, and the join creates the
			// group): a group made now would deliver entries that nothing applies to member, and
			// its join would then take them as backfilled.
			return "", fmt.Errorf("%s is not in live group %s: nothing to create its own group for", member, r.cfg.LiveGroup)
		}
		m, ok := ms.Members[member].On(stream)
		if !ok {
			// Not joined on this partition (a join under way, or one Redis lost): its own group
			// there is made by the join, at the right place; one made now would deliver entries
			// that are not for it yet, acknowledged unapplied.
			return "", fmt.Errorf("%w: %s in live group %s on %s (its own group there comes with the join)", errNotJoinedThere, member, r.cfg.LiveGroup, stream)
		}
		if m.Own == ops.BackfillDone {
			// Its backfill is done there (or there was none: a partition it joined at the start):
			// the own group has nothing to deliver, so it starts at the stream's end. Never at
			// "0": a finished backfill's group is removed with its dedupe markers, and one
			// recreated at the start by a process still running its handler delivered the whole
			// history again to a version that serves reads.
			return "$", nil
		}
		return "0", nil
	}
	ms, err := r.backend.Read(ctx, group)
	if err != nil {
		return "", err
	}
	start := ""
	for _, lm := range ms.Members {
		m, ok := lm.On(stream)
		if !ok {
			continue
		}
		if start == "" || ops.CompareEntryIDs(m.Join, start) < 0 {
			start = m.Join
		}
	}
	if start == "" {
		return "", fmt.Errorf("live group %s has no members: nothing to create it for", group)
	}
	return start, nil
}

// Run blocks until ctx ends (then closes gracefully) or the router stops on its own, which is
// always an error: a projector that silently stopped consuming must not keep running.
func (r *ProjectionRouter) Run(ctx context.Context) error {
	if len(r.cfg.Targets) > 0 {
		if _, _, err := r.SetTargets(ctx, r.cfg.Targets); err != nil {
			return fmt.Errorf("projection router: %w", err)
		}
	}
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	r.mu.Lock()
	r.runCtx = runCtx
	for group, h := range r.handlers {
		go r.watchHandler(runCtx, group, h)
	}
	r.mu.Unlock()
	go r.keepCheckpoints(runCtx)
	errc := make(chan error, 1)
	go func() { errc <- r.router.Run(runCtx) }()
	select {
	case <-ctx.Done():
		r.running.Store(false)
		// Watermill's Run returns once every handler stopped (their subscriptions end with
		// ctx), or once Close ran: with none running (Redis was down at the start, so nothing
		// was ever added), only Close ends it, and SIGTERM was waited out until SIGKILL.
		// A handler whose subscription failed never started, and Watermill's Close would wait
		// the whole close timeout for it: retired, it ends as the router starts it.
		r.mu.Lock()
		retired := false
		for group, h := range r.handlers {
			select {
			case <-h.h.Started():
			default:
				if w, ok := h.sub.(*watchedSubscriber); ok {
					w.retire()
					r.retired[group] = true
					retired = true
				}
			}
		}
		r.mu.Unlock()
		if retired && r.router.IsRunning() {
			_ = r.router.RunHandlers(runCtx)
		}
		cerr := r.router.Close()
		err := <-errc
		if err == nil {
			err = cerr
		}
		if err != nil {
			return fmt.Errorf("projection router: %w", err)
		}
		return nil
	case name := <-r.stopped:
		r.running.Store(false)
		_ = r.router.Close()
		<-errc
		return fmt.Errorf("projection router: handler %s stopped unexpectedly", name)
	case err := <-errc:
		r.running.Store(false)
		if err == nil {
			err = errors.New("stopped unexpectedly")
		}
		return fmt.Errorf("projection router: %w", err)
	}
}

// watchHandler marks the router running once a handler consumes and reports a handler that
// stops on its own; a handler retired by SetTargets stops on purpose.
func (r *ProjectionRouter) watchHandler(ctx context.Context, group string, h *runningHandler) {
	select {
	case <-h.h.Started():
	case <-ctx.Done():
		return
	}
	r.running.Store(true)
	select {
	case <-subscriptionEnded(h.sub):
		r.mu.Lock()
		retired := r.retired[group]
		r.mu.Unlock()
		if !retired {
			select {
			case r.stopped <- group:
			default:
			}
		}
	case <-ctx.Done():
	}
}

// errNotJoinedThere: a version's own group is asked for on a partition the version has not
// joined (a join Redis lost).
var errNotJoinedThere = errors.New("not joined on this partition")

// ErrRouterNotRunning is returned by SetTargets after the router stopped.
var ErrRouterNotRunning = errors.New("projection router is not running")

// ErrLiveGroupConflict means a projection version is already fed by another live group: the
// processes that run it have different PROJECTIONS lists.
var ErrLiveGroupConflict = errors.New("projection version is fed by another live group")

// SetTargets makes the router feed exactly targets (the serving and building versions of the
// projections this process runs): each joins the live group (once; the first time, at the
// stream's last entry, with its own group to backfill what came before), a handler runs for the
// live group and for every own group still backfilling, and the handlers no longer needed
// stop. It may be called before Run and then periodically; it returns once stopped handlers
// have finished their in-flight batches. A target whose join must wait (JoinWaits) is left out
// of this call and named in its error; the others are set up all the same.
func (r *ProjectionRouter) SetTargets(ctx context.Context, targets []ops.ProjectionTarget) (added, removed []string, err error) {
	if err := r.rejoinIfLost(ctx, targets); err != nil {
		return nil, nil, err
	}
	var waiting []error
	targeted := make(map[string]bool, len(targets))
	for _, t := range targets {
		targeted[ops.MemberName(t.Projection.Name(), t.Version)] = true
	}
	r.atMu.Lock()
	r.targeted = targeted
	r.atMu.Unlock()
	for _, t := range targets {
		if _, ok := r.projs[t.Projection.Name()]; !ok {
			return nil, nil, fmt.Errorf("projection %s is not run by this router", t.Projection.Name())
		}
		// Its layout first: a handler feeding the live group sees the member once it joined.
		r.atMu.Lock()
		r.atVersion[ops.MemberName(t.Projection.Name(), t.Version)] = t.Projection
		r.atMu.Unlock()
		if err := r.join(ctx, ops.MemberName(t.Projection.Name(), t.Version)); err != nil {
			if !JoinWaits(err) {
				return nil, nil, err
			}
			// Held off for a while (a disband, drop or migration under way): the other targets
			// are joined and fed meanwhile, and the next call tries it again.
			waiting = append(waiting, err)
		}
	}
	ms, err := r.backend.Read(ctx, r.cfg.LiveGroup)
	if err != nil {
		return nil, nil, err
	}
	want := map[string]string{} // group -> member ("" for the live group)
	for _, t := range targets {
		name := ops.MemberName(t.Projection.Name(), t.Version)
		m, ok := ms.Members[name]
		if !ok {
			continue
		}
		want[r.cfg.LiveGroup] = ""
		if m.Own == ops.BackfillRunning {
			want[name] = name
		}
	}
	stopping, added, removed, err := r.swapHandlers(want)
	// Wait (without the lock: watchHandler takes it) until stopped handlers have finished their
	// in-flight batches and their subscriptions are closed.
	for _, rt := range stopping {
		<-rt.h.h.Stopped()
		if cerr := rt.h.sub.Close(); cerr != nil {
			r.log.Warn("closing subscriber of a stopped projection handler", "group", rt.group, "error", cerr)
		}
		// What it could not apply is no longer anyone's to apply here: readiness says nothing more of it.
		r.transientCleared(rt.group)
		r.log.Info("projection handler stopped", "group", rt.group)
	}
	return added, removed, errors.Join(append(waiting, err)...)
}

// JoinWaits tells whether err, from SetTargets, only says that joins must wait for a disband, a
// drop or a partition migration under way (ops.ErrDisbandUnfinished, ops.ErrDropUnfinished,
// domain.ErrMigrating): the targets it does not name were joined and are fed, and a later call
// joins the rest once that work is done.
func JoinWaits(err error) bool {
	if err == nil {
		return false
	}
	if many, ok := err.(interface{ Unwrap() []error }); ok {
		for _, e := range many.Unwrap() {
			if !JoinWaits(e) {
				return false
			}
		}
		return true
	}
	return errors.Is(err, ops.ErrDisbandUnfinished) || errors.Is(err, ops.ErrDropUnfinished) || errors.Is(err, domain.ErrMigrating)
}

// rejoinPartial forgets having joined a member that is missing from some partition at two looks
// in a row (a join or a leave under way is done well within one poll): Redis lost its join
// there (a failover before the join script reached the replica). SetTargets then joins it there
// again, if it is still a target, with an own group to backfill that partition; until then its
// backfill does not count as done, so reads never switch to a version without a partition.
// A target missing from every partition while other members are there is the same loss on
// each of them (a version that left is no target: it retired).
func (r *ProjectionRouter) rejoinPartial(had []string, ms ops.Membership, targets []ops.ProjectionTarget) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, name := range had {
		m, ok := ms.Members[name]
		if !ok && slices.ContainsFunc(targets, func(t ops.ProjectionTarget) bool {
			return ops.MemberName(t.Projection.Name(), t.Version) == name
		}) {
			m, ok = ops.LiveMember{Missing: -1}, true // every partition, shown as -1
		}
		if !ok || m.Missing == 0 {
			delete(r.partial, name)
			continue
		}
		if !r.partial[name] {
			r.partial[name] = true
			continue
		}
		r.log.Warn("a projection version is missing from partitions of the live group (Redis lost its join there?): joining them again",
			"group", r.cfg.LiveGroup, "member", name, "missing", m.Missing)
		delete(r.joined, name)
		delete(r.partial, name)
	}
}

// rejoinIfLost forgets which members this process joined, so that SetTargets joins every target
// again as at a start (at the stream as it is now, with an own group to backfill what it already
// holds), when Redis lost the group's
// membership record: it holds no member at all while this process had joined some. Nothing else
// empties it: a retired version leaves only after its successor joined. The subscribers cannot
// recreate their groups without it. It runs before the targets join, since after a loss the
// registry names other versions (a projection rebuilt to v2 is v1 again) and one joining alone
// would hide the loss of the others. Not while the subscribers are paused (Paused): a partition
// migration deletes the old partitions' records on purpose.
func (r *ProjectionRouter) rejoinIfLost(ctx context.Context, targets []ops.ProjectionTarget) error {
	if r.cfg.Paused != nil && r.cfg.Paused() {
		return nil
	}
	r.mu.Lock()
	had := make([]string, 0, len(r.joined))
	for m := range r.joined {
		had = append(had, m)
	}
	r.mu.Unlock()
	if len(had) == 0 {
		return nil
	}
	ms, err := r.backend.Read(ctx, r.cfg.LiveGroup)
	if err != nil {
		return err
	}
	if len(ms.Members) > 0 {
		r.rejoinPartial(had, ms, targets)
		return nil
	}
	sort.Strings(had)
	r.log.Warn("the live group's membership is gone from Redis (it lost its data?): joining again as at a start",
		"group", r.cfg.LiveGroup, "members", had)
	r.mu.Lock()
	clear(r.joined)
	r.mu.Unlock()
	// The checkpoints of before name positions of the lost stream: prune no marker by them.
	r.ackMu.Lock()
	clear(r.acked)
	r.ackMu.Unlock()
	return nil
}

// isTarget says whether member was among SetTargets' last targets.
func (r *ProjectionRouter) isTarget(member string) bool {
	r.atMu.RLock()
	defer r.atMu.RUnlock()
	return r.targeted[member]
}

// projectionOf is member (pname at some version) as it writes: as SetTargets was given it, else
// pname as this process runs it (a version of the live group it was not asked to feed: one
// retiring, or one a process of a newer build started, which is why a layout change needs every
// projector upgraded; see the README's "Changing a projection: rebuild").
func (r *ProjectionRouter) projectionOf(member, pname string) (projection.Projection, bool) {
	r.atMu.RLock()
	p, ok := r.atVersion[member]
	r.atMu.RUnlock()
	if ok {
		return p, true
	}
	p, ok = r.projs[pname]
	return p, ok
}

// join makes member part of the live group unless it already is; a member of another live
// group is a configuration error.
func (r *ProjectionRouter) join(ctx context.Context, member string) error {
	r.mu.Lock()
	done := r.joined[member]
	r.mu.Unlock()
	if done {
		return nil
	}
	all, _, err := r.backend.ReadAll(ctx)
	if err != nil {
		return err
	}
	for g, ms := range all {
		if _, ok := ms.Members[member]; ok && g != r.cfg.LiveGroup {
			return r.conflict(member, g)
		}
	}
	ms, err := r.backend.Join(ctx, r.cfg.LiveGroup, member)
	if errors.Is(err, ops.ErrVersionRetired) {
		// Targets read before a rebuild switched reads and retired this version: it is no
		// target any more, and the next poll's targets leave it out.
		r.log.Info("not joining a projection version a rebuild retired", "member", member, "error", err)
		return nil
	}
	if other := (*ops.InAnotherLiveGroupError)(nil); errors.As(err, &other) {
		// Another process joined it to its group since the look above (the join checks again).
		return r.conflict(member, other.Group)
	}
	if err != nil {
		return err
	}
	m := ms.Members[member]
	r.log.Info("projection version is in the live group", "member", member, "group", r.cfg.LiveGroup, "join", m.Join,
		"backfill", m.Own, "legacy_up_to", m.Legacy)
	r.mu.Lock()
	r.joined[member] = true
	r.mu.Unlock()
	return nil
}

// conflict is ErrLiveGroupConflict for member, which live group other feeds.
func (r *ProjectionRouter) conflict(member, other string) error {
	return fmt.Errorf("%w: %s is fed by live group %q, this process would feed it through %q: run every projector with the same PROJECTIONS "+
		"(or with sets that share no projection); to run it in another set, stop the projectors of %q and run: checkins projections disband %s",
		ErrLiveGroupConflict, member, other, r.cfg.LiveGroup, other, other)
}

type stoppingHandler struct {
	group string
	h     *runningHandler
}

func (r *ProjectionRouter) swapHandlers(want map[string]string) (stopping []stoppingHandler, added, removed []string, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	running := r.runCtx != nil
	if running && (r.runCtx.Err() != nil || r.router.IsClosed()) {
		return nil, nil, nil, ErrRouterNotRunning
	}
	// A handler no longer wanted that has not started goes first: the router is starting it (a
	// backfill that finishes at once, on a first start), its subscription failed, or Run has not
	// started Watermill yet (the registry watch and Run start together), which starts every
	// handler it was given. Watermill panics on stopping a handler before its start, and waiting
	// for one that will never start would hold r.mu for good: its subscription is retired
	// instead, so that it ends as it starts. It is never the last handler running either.
	retiredUnstarted := false
	for group, h := range r.handlers {
		if _, ok := want[group]; ok || len(r.handlers) == 1 {
			continue
		}
		w, ok := h.sub.(*watchedSubscriber)
		if !ok {
			continue
		}
		select {
		case <-h.h.Started():
			continue
		default:
		}
		w.retire()
		r.retired[group] = true
		delete(r.handlers, group)
		removed = append(removed, group)
		retiredUnstarted = true
	}
	groups := make([]string, 0, len(want))
	for g := range want {
		groups = append(groups, g)
	}
	sort.Strings(groups)
	for _, group := range groups {
		if _, ok := r.handlers[group]; ok {
			continue
		}
		if want[group] != "" {
			// A backfill starts: the floors every group had passed are above everything it will
			// register, until the next checkpoint takes its position into account.
			r.cfg.Applier.HoldRegistryFloors()
		}
		if err := r.addHandler(group, want[group]); err != nil {
			return nil, added, removed, err
		}
		added = append(added, group)
	}
	// A handler whose subscription fails (Redis loading, out of memory) stays added and not
	// started; Watermill's RunHandlers starts what has not started, so the next call (the next
	// SetTargets) tries it again, and until then the error reaches readiness. It also starts,
	// and so ends, the retired ones: Watermill's Close waits for every handler it holds. (A
	// router still starting does both itself.)
	if running && (len(added) > 0 || r.router.IsRunning() && (retiredUnstarted || r.unstartedLocked())) {
		for _, g := range added {
			go r.watchHandler(r.runCtx, g, r.handlers[g]) // it waits for the handler's start
		}
		if err := r.router.RunHandlers(r.runCtx); err != nil {
			return nil, added, removed, fmt.Errorf("start handlers %v: %w", added, err)
		}
		for _, g := range added {
			r.log.Info("projection handler started", "group", g)
		}
	}
	// Stopping after starting keeps the router from ever having zero handlers, which would close it.
	for group, h := range r.handlers {
		if _, ok := want[group]; ok {
			continue
		}
		if len(r.handlers) == 1 {
			break // the last one stays: a router without handlers closes
		}
		r.retired[group] = true
		if running {
			select { // only started ones are left (above)
			case <-h.h.Started():
				h.h.Stop()
				stopping = append(stopping, stoppingHandler{group, h})
			case <-r.runCtx.Done(): // the router is closing: it stops every handler itself
			}
		}
		delete(r.handlers, group)
		removed = append(removed, group)
	}
	return stopping, added, removed, nil
}

// unstartedLocked says whether a handler was added and has not started (its subscription
// failed, when the router runs); callers hold r.mu.
func (r *ProjectionRouter) unstartedLocked() bool {
	for _, h := range r.handlers {
		select {
		case <-h.h.Started():
		default:
			return true
		}
	}
	return false
}

// Running reports whether the router consumes.
func (r *ProjectionRouter) Running() bool { return r.running.Load() && r.router.IsRunning() }

// Close stops consuming, lets in-flight handlers finish and acks what finished.
func (r *ProjectionRouter) Close() error { return r.router.Close() }

// Groups lists the consumer groups the router feeds.
func (r *ProjectionRouter) Groups() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]string, 0, len(r.handlers))
	for g := range r.handlers {
		out = append(out, g)
	}
	sort.Strings(out)
	return out
}

// membership is the live group's membership as the registry says now: read once per batch, so
// that a version joining is seen by every batch delivered after its join position.
func (r *ProjectionRouter) membership(ctx context.Context) (ops.Membership, error) {
	return r.backend.CurrentMembership(ctx, r.cfg.LiveGroup)
}

// noteJoins holds the registry floors when a version joined some live group since the last
// batch looked (joins, Membership.Joins, changed): its backfill registers identities of old
// check-ins, which floors computed before it would prune, in this process's calls, until the
// next checkpoint accounts for it. Only the process that starts a backfill held them; a
// projector of another live group pruned what the backfill had just registered, and a copy
// within the window was counted again in the rebuilt version.
func (r *ProjectionRouter) noteJoins(joins string) {
	r.joinsMu.Lock()
	changed := joins != r.joinsSeen
	r.joinsSeen = joins
	r.joinsMu.Unlock()
	if changed {
		r.cfg.Applier.HoldRegistryFloors()
	}
}

// prune is the applier's Prune: markers of a group below its recorded checkpoint may go.
func (r *ProjectionRouter) prune(group string) (string, bool) {
	r.ackMu.RLock()
	defer r.ackMu.RUnlock()
	a, ok := r.acked[group]
	return a, ok
}

// keepCheckpoints records, every CheckpointInterval, how far each group this process feeds has
// acknowledged, recreates a group Redis lost (at that position), and finishes backfills.
func (r *ProjectionRouter) keepCheckpoints(ctx context.Context) {
	t := time.NewTicker(r.cfg.CheckpointInterval)
	defer t.Stop()
	failing := &throttledLog{interval: time.Minute}
	for {
		if err := r.checkpoint(ctx); err != nil && ctx.Err() == nil {
			if ok, n := failing.allow(); ok {
				r.log.Warn("cannot record the projections' progress, will retry", "error", err, "suppressed", n)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (r *ProjectionRouter) checkpoint(ctx context.Context) error {
	groups := r.Groups()
	info, err := r.backend.Positions(ctx)
	if err != nil {
		return err
	}
	ms, err := r.backend.Read(ctx, r.cfg.LiveGroup)
	if err != nil {
		return err
	}
	allQuiet := true
	for _, g := range groups {
		sum, known := info[g]
		quiet := true
		acked := map[string]string{}
		for _, stream := range r.backend.Streams() {
			p, ok := sum.On(stream)
			if !known || !ok {
				member := ""
				if g != r.cfg.LiveGroup {
					member = g
				}
				start, err := r.groupStart(ctx, stream, g, member)
				if errors.Is(err, errNotJoinedThere) {
					quiet = false // its join there (the router makes it again) creates the group
					continue
				}
				if err != nil {
					return err
				}
				if err := r.backend.CreateGroup(ctx, stream, g, start); err != nil {
					return fmt.Errorf("recreate consumer group %s: %w", g, err)
				}
				r.log.Warn("consumer group was missing; recreated it where it had acknowledged through", "group", g, "stream", stream, "start", start)
				quiet = false
				continue
			}
			acked[stream] = p.AckedThrough
		}
		// Every partition's position in one round trip: one per partition made a checkpoint of
		// 24 partitions take seconds during a drain, and the dedupe floors with it.
		if err := r.backend.Checkpoints(ctx, g, acked); err != nil {
			return err
		}
		for _, stream := range r.backend.Streams() {
			if _, ok := acked[stream]; !ok {
				continue
			}
			p, _ := sum.On(stream)
			at := g + " " + stream
			if p.Pending != 0 || p.LastDeliveredID != r.lastDelivered[at] {
				quiet = false
			}
			r.lastDelivered[at] = p.LastDeliveredID
			if lm, own := ms.Members[g]; own {
				if m, ok := lm.On(stream); ok && m.Own == ops.BackfillRunning &&
					p.Pending == 0 && ops.CompareEntryIDs(p.LastDeliveredID, m.Join) >= 0 {
					if changed, err := r.backend.FinishBackfillOn(ctx, stream, r.cfg.LiveGroup, g, time.Now()); err != nil {
						return err
					} else if changed {
						r.log.Info("backfill finished: the version is fed by the live group alone", "member", g, "stream", stream, "join", m.Join)
					}
				}
			}
		}
		// Quiet (nothing pending, nothing delivered since the last look, on any partition): let
		// go of the markers of the last batches, which no script call will prune now. Not while
		// paused: a partition migration may deliver entries again on the new partitions (its
		// --force, or a run resumed), and their markers are what catches what was applied
		// (found by a review).
		if known && quiet && !r.paused() {
			if _, err := r.cfg.Applier.Sweep(ctx, g, sum.AckedThrough); err != nil {
				return err
			}
		}
		allQuiet = allQuiet && known && quiet
	}
	// Floors computed from what is read now must not undo a hold that comes meanwhile (a
	// backfill starting: SetTargets may join it after this reads the membership).
	gen := r.cfg.Applier.FloorsGeneration()
	_, acked, err := r.backend.ReadAll(ctx)
	if err != nil {
		return err
	}
	floors, ok, err := r.backend.DedupeFloors(ctx, info, r.cfg.Applier.Window(), time.Now())
	if err != nil {
		return err
	}
	if !ok {
		// Some group's position is not known yet (one just created, a backfill among them):
		// prune no registry until it is, rather than by floors that may be above it.
		r.cfg.Applier.HoldRegistryFloors()
	} else {
		if err := r.cfg.Applier.SetRegistryFloorsAt(gen, floors); err != nil {
			return err
		}
		// Quiet: the registries' last prunes used the floors of their last decides, which trail
		// what every group has now passed; no call will prune them until their users check in.
		if allQuiet && !r.paused() {
			if _, err := r.cfg.Applier.SweepRegistries(ctx); err != nil {
				return err
			}
		}
	}
	r.ackMu.Lock()
	r.acked = acked
	r.ackMu.Unlock()
	// The records of parked units whose entries are acknowledged, by the positions read first.
	return r.sweepParked(ctx, info)
}

// transientFailure records why group's batches cannot be applied now (for readiness).
func (r *ProjectionRouter) transientFailure(group string, err error) {
	reason := r.transientReasonText(err)
	r.probMu.Lock()
	r.problem[group] = reason
	r.probMu.Unlock()
	// A metric label takes only the known reasons: any other error's text (which may name
	// keys, entries or members) would make a series of its own each time.
	label := reason
	if _, known := r.backend.TransientReason(err); !known && !errors.Is(err, ErrHandlerTimeout) && !errors.Is(err, ErrForeignMember) && !errors.Is(err, errNotJoinedThere) {
		label = "other"
	}
	r.cfg.Observer.Transient(group, label)
}

func (r *ProjectionRouter) transientCleared(group string) {
	r.probMu.Lock()
	delete(r.problem, group)
	r.probMu.Unlock()
}

// ReportSetup records whether the projections this process runs could be set up (joining the
// live group, creating consumer groups, reading the registry): a failure, until the next
// success, is part of Problem, so readiness says why nothing consumes yet.
func (r *ProjectionRouter) ReportSetup(err error) {
	r.probMu.Lock()
	defer r.probMu.Unlock()
	if err == nil {
		delete(r.problem, setupProblem)
		return
	}
	reason, ok := r.backend.TransientReason(err)
	if !ok {
		reason = err.Error()
	}
	r.problem[setupProblem] = reason
}

// setupProblem keys ReportSetup's failure in Problem.
const setupProblem = "setting up"

func (r *ProjectionRouter) foreign(err error) {
	r.transientFailure(r.cfg.LiveGroup, err)
}

// Problem says why projections cannot be applied right now ("" when they can): readiness
// reports it.
func (r *ProjectionRouter) Problem() string {
	r.probMu.Lock()
	defer r.probMu.Unlock()
	var parts []string
	for g, reason := range r.problem {
		parts = append(parts, g+": "+reason)
	}
	sort.Strings(parts)
	return strings.Join(parts, "; ")
}

// parkedKeep bounds how long a parked unit is remembered when its entry is never acknowledged
// here (another process took it over, or it was purged): long past any redelivery of it here.
const parkedKeep = 24 * time.Hour

// markParked records that u was parked by this process.
func (r *ProjectionRouter) markParked(u ops.UnitRef) {
	r.parkMu.Lock()
	defer r.parkMu.Unlock()
	if r.parked == nil {
		r.parked = map[ops.UnitRef]time.Time{}
	}
	r.parked[u] = time.Now() // forgetParked lets it go, at its entry's ack or after parkedKeep
	r.parkedN.Store(int64(len(r.parked)) + int64(len(r.unsure)))
}

// markUnsure records that a park of a unit of u's entry failed here, perhaps after it landed.
func (r *ProjectionRouter) markUnsure(u ops.UnitRef) {
	r.parkMu.Lock()
	defer r.parkMu.Unlock()
	if r.unsure == nil {
		r.unsure = map[ops.UnitRef]time.Time{}
	}
	u.Member = ""
	r.unsure[u] = time.Now() // as markParked's
	r.parkedN.Store(int64(len(r.parked)) + int64(len(r.unsure)))
}

// wasParked says whether u was parked by this process and its entry not acknowledged since.
func (r *ProjectionRouter) wasParked(u ops.UnitRef) bool {
	if r.parkedN.Load() == 0 {
		return false
	}
	r.parkMu.Lock()
	defer r.parkMu.Unlock()
	_, ok := r.parked[u]
	return ok
}

// isUnsure says whether a park of a unit of entry (a UnitRef without a member) failed here, and
// the entry was not acknowledged since.
func (r *ProjectionRouter) isUnsure(entry ops.UnitRef) bool {
	if r.parkedN.Load() == 0 {
		return false
	}
	r.parkMu.Lock()
	defer r.parkMu.Unlock()
	_, ok := r.unsure[entry]
	return ok
}

// forgetParked drops what this process remembers of the parked units of b's entries once the
// entries are acknowledged: delivered here no more, they need not be told apart. The poison
// queue's records go later (sweepParked), once the XACK is seen to have landed.
func (r *ProjectionRouter) forgetParked(group string, b *batch) {
	if r.parkedN.Load() == 0 {
		return
	}
	entries := make(map[ops.UnitRef]bool, len(b.events))
	for _, d := range b.events {
		entries[ops.UnitRef{Group: group, Stream: r.streamOf(d), Entry: d.ID}] = true
	}
	now := time.Now()
	r.parkMu.Lock()
	defer r.parkMu.Unlock()
	for e, at := range r.unsure {
		if entries[e] || now.Sub(at) > parkedKeep {
			delete(r.unsure, e)
		}
	}
	for u, at := range r.parked {
		if entries[ops.UnitRef{Group: u.Group, Stream: u.Stream, Entry: u.Entry}] || now.Sub(at) > parkedKeep {
			delete(r.parked, u)
		}
	}
	r.parkedN.Store(int64(len(r.parked)) + int64(len(r.unsure)))
}

// sweepParked drops the poison queue's records of units whose entries the groups this process
// runs are seen (in info, read before) to have acknowledged: a page of the records per call.
func (r *ProjectionRouter) sweepParked(ctx context.Context, info map[string]ops.GroupPosition) error {
	next, err := r.backend.SweepParked(ctx, r.parkedCursor, func(u ops.UnitRef) bool {
		p, ok := info[u.Group].On(u.Stream)
		return ok && p.AckedThrough != "" && ops.CompareEntryIDs(u.Entry, p.AckedThrough) <= 0
	})
	if err != nil {
		return err
	}
	r.parkedCursor = next
	return nil
}

// streamOf is the stream d came from, as a poison entry names it (the event log's stream when
// the subscriber did not say: one partition).
func (r *ProjectionRouter) streamOf(d projection.Entry) string {
	if d.Stream == "" {
		return r.backend.Stream()
	}
	return d.Stream
}

// paused says whether the process stands still for a partition migration (ProjectionRouterConfig.Paused).
func (r *ProjectionRouter) paused() bool { return r.cfg.Paused != nil && r.cfg.Paused() }
