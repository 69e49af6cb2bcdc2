package command

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/checkins/checkins/app/ops"
	"github.com/checkins/checkins/app/projection"
	"github.com/checkins/checkins/domain"
)

// ErrReplayFailed is returned when the projection failed again on a replayed event; the entry
// stays in the queue with the new error.
var ErrReplayFailed = errors.New("replay failed")

// ErrNotReplayable is returned for an entry no replay can fix (it does not decode to a valid
// event, or names a projection this build does not have); the entry is kept unchanged.
var ErrNotReplayable = errors.New("entry cannot be replayed")

// Replay statuses.
const (
	ReplayReplayed      = "replayed"
	ReplayFailed        = "failed"
	ReplayNotReplayable = "not_replayable"
	// ReplayGone: another run replayed or purged the entry first; this one changed nothing.
	ReplayGone = "gone"
)

// ReplayResult is the outcome of replaying one entry.
type ReplayResult struct {
	ID         string `json:"id"`
	Projection string `json:"projection"`
	Status     string `json:"status"` // replayed | failed | not_replayable
	// Applied is false when the projection had already counted the event (nothing changed).
	Applied bool   `json:"applied"`
	Error   string `json:"error,omitempty"`
	// NewID is the ID the entry was kept under after a failed replay (entries cannot change in place).
	NewID string `json:"newId,omitempty"`
}

// EventApplier applies one event's updates of one projection version under a consumer group's
// markers, with its dedupe decision known (adapters.ProjectionApplier).
type EventApplier interface {
	ApplyDecided(ctx context.Context, group string, p projection.Projection, version int, e domain.CheckinRecorded, entryID string, d projection.Decision) (projection.Outcome, error)
}

// ReplayPoisonedConfig wires ReplayPoisoned.
type ReplayPoisonedConfig struct {
	Backend     ops.Backend
	Projections []projection.Projection // every projection this build knows
	// Applier applies a replayed event (with markers of its own per projection version, so a
	// replay that is interrupted, or run twice at once, still counts the event once).
	Applier EventApplier
	Logger  *slog.Logger
	Now     func() time.Time // default time.Now
}

// ReplayPoisoned runs parked events through the projection that failed on them.
type ReplayPoisoned struct {
	cfg    ReplayPoisonedConfig
	byName map[string]projection.Projection
}

// NewReplayPoisoned fails fast on missing dependencies.
func NewReplayPoisoned(cfg ReplayPoisonedConfig) (*ReplayPoisoned, error) {
	b := cfg.Backend
	if b.Poison == nil || b.Registry == nil || b.Failures == nil || cfg.Logger == nil || cfg.Applier == nil {
		return nil, errors.New("command: ReplayPoisoned needs the backend's Poison, Registry and Failures, an Applier and a Logger")
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	h := &ReplayPoisoned{cfg: cfg, byName: map[string]projection.Projection{}}
	for _, p := range cfg.Projections {
		h.byName[p.Name()] = p
	}
	return h, nil
}

// ReplayGroup names the markers a replay of projection version writes under: a group of its
// own, whose markers are never pruned (replays are few), so that a replay run twice, at once or
// after an interruption, counts the event once.
func ReplayGroup(name string, version int) string {
	return "replay." + ops.MemberName(name, version)
}

// Replay runs one parked event through the projection that failed, directly against its store
// (whose dedupe makes a replay of an event already counted a no-op), and deletes the entry on
// success. A failure keeps the entry, with the new error, and returns ErrReplayFailed or
// ErrNotReplayable along with the result. An outage returns the error and changes nothing.
func (h *ReplayPoisoned) Replay(ctx context.Context, id string) (ReplayResult, error) {
	e, err := h.cfg.Backend.Poison.Get(ctx, id)
	if err != nil {
		if ops.IsClientError(err) {
			return ReplayResult{ID: id}, err
		}
		return ReplayResult{ID: id}, ops.Unavailable(err)
	}
	return h.replay(ctx, e)
}

func (h *ReplayPoisoned) replay(ctx context.Context, e ops.PoisonEntry) (ReplayResult, error) {
	res := ReplayResult{ID: e.ID, Projection: e.Projection}
	parsed, err := domain.ParseEvent(e.EntryID, e.Fields)
	if err != nil {
		res.Status, res.Error = ReplayNotReplayable, fmt.Sprintf("the parked entry is not a valid event: %v", err)
		return res, fmt.Errorf("%w: poison entry %s: %s", ErrNotReplayable, e.ID, res.Error)
	}
	p, ok := h.byName[e.Projection]
	if !ok {
		res.Status, res.Error = ReplayNotReplayable, fmt.Sprintf("projection %q is not known to this build (known: %s)", e.Projection, strings.Join(h.names(), ", "))
		return res, fmt.Errorf("%w: poison entry %s: %s", ErrNotReplayable, e.ID, res.Error)
	}
	ev, ok := parsed.(domain.CheckinRecorded)
	if !ok {
		res.Status, res.Error = ReplayNotReplayable, fmt.Sprintf("events of type %s cannot be replayed", parsed.EventName())
		return res, fmt.Errorf("%w: poison entry %s: %s", ErrNotReplayable, e.ID, res.Error)
	}
	version, err := h.replayVersion(ctx, e)
	if err != nil {
		return res, ops.Unavailable(err)
	}
	q := h.cfg.Backend.Poison
	// Written in the version's own layout (a parked event of a version an upgrade still serves
	// in its earlier layout goes there).
	st, err := h.cfg.Backend.Registry.State(ctx, e.Projection)
	if err != nil {
		return res, ops.Unavailable(err)
	}
	layout := st.LayoutOf(version)
	if layout == 0 {
		layout = projection.CurrentLayout(p)
	}
	if p, err = projection.AtLayout(p, layout); err != nil {
		res.Status, res.Error = ReplayNotReplayable, err.Error()
		return res, fmt.Errorf("%w: poison entry %s: %s", ErrNotReplayable, e.ID, res.Error)
	}
	superseded, err := h.superseded(ctx, e, version)
	if err != nil {
		return res, ops.Unavailable(err)
	}
	outcome := projection.AlreadyApplied
	if !superseded {
		outcome, err = h.cfg.Applier.ApplyDecided(ctx, ReplayGroup(p.Name(), version), p, version, ev, e.EntryID, e.DecisionRef())
	}
	switch {
	case err == nil:
		res.Status, res.Applied = ReplayReplayed, outcome == projection.Applied
		n, derr := q.DeleteIDs(ctx, e.ID)
		if derr != nil {
			// Replaying again later is harmless (markers); say so rather than pretend.
			return res, ops.Unavailable(fmt.Errorf("replayed poison entry %s but could not delete it (a later replay is a no-op): %w", e.ID, derr))
		}
		if n == 0 {
			// Another run got there first: it replayed (or purged) the entry, and reports it, so
			// that the totals of concurrent runs add up. Applied stays what this run did: it may
			// be the one that counted the event (the other found it counted, or purged it).
			res.Status = ReplayGone
			if res.Applied {
				return res, fmt.Errorf("poison entry %s was removed by another run meanwhile; this replay applied it (counted once): %w", e.ID, domain.ErrNotFound)
			}
			return res, fmt.Errorf("poison entry %s was replayed or purged by another run meanwhile: %w", e.ID, domain.ErrNotFound)
		}
		h.cfg.Logger.Info("poison entry replayed", "poison_id", e.ID, "projection", e.Projection, "version", version,
			"entry_id", e.EntryID, "applied", res.Applied, "superseded", superseded)
		return res, nil
	case ctx.Err() != nil || h.transient(err) || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled):
		// Not the event's fault: keep the entry as it is.
		return res, ops.Unavailable(err)
	}
	res.Status, res.Error = ReplayFailed, err.Error()
	e.Error, e.Attempts, e.FailedAt = "replay: "+err.Error(), e.Attempts+1, h.cfg.Now()
	newID, rerr := q.Repark(ctx, e)
	if rerr != nil {
		if errors.Is(rerr, domain.ErrNotFound) {
			// Someone else replayed or purged it meanwhile: nothing stays in the queue, and this
			// run changed nothing (its apply failed). Gone, as for a bulk run's totals.
			res.Status, res.Error = ReplayGone, ""
			return res, fmt.Errorf("poison entry %s was replayed or purged by another run meanwhile (this replay's apply failed: %v): %w", e.ID, err, domain.ErrNotFound)
		}
		return res, ops.Unavailable(fmt.Errorf("replay of poison entry %s failed (%w) and recording the new error failed: %w", e.ID, err, rerr))
	}
	res.NewID = newID
	h.cfg.Logger.Warn("poison entry replay failed, kept with the new error", "poison_id", e.ID, "new_poison_id", newID,
		"projection", e.Projection, "error", err)
	return res, fmt.Errorf("%w: poison entry %s (kept as %s): %w", ErrReplayFailed, e.ID, newID, err)
}

func (h *ReplayPoisoned) transient(err error) bool {
	_, ok := h.cfg.Backend.Failures.TransientReason(err)
	return ok
}

// superseded tells whether e was parked by a version, or by a build of version, that version's
// build has since gone through: replaying it into version would count it twice. A rebuild's
// backfill reads the stream from where it stood when the build began (recorded by Start), and
// the live group feeds it everything after, so version applied every entry from there on, or
// parked its own copy of it. An entry below that point (trimmed by RETENTION before the build
// began) is replayed into version. For a version built before Start recorded where it began, the
// stream as it is now stands in: an entry it still holds was there when the build began.
func (h *ReplayPoisoned) superseded(ctx context.Context, e ops.PoisonEntry, version int) (bool, error) {
	failed := failedVersion(e)
	if failed == 0 || failed > version {
		return false, nil
	}
	b, ok, err := h.cfg.Backend.Registry.BuildStart(ctx, e.Projection, version)
	if err != nil {
		return false, err
	}
	if !ok {
		if failed == version {
			return false, nil
		}
		b.Streams, err = h.cfg.Backend.Stream.Starts(ctx)
		if err != nil {
			return false, err
		}
	} else if failed == version && e.ParkedAt >= b.At {
		return false, nil // parked by this build itself (both times of the Redis server's clock)
	}
	from, ok := b.Streams[e.Stream]
	if !ok {
		// A stream the build did not know (partitions migrated since): the earliest it began at.
		for _, id := range b.Streams {
			if !ok || ops.CompareEntryIDs(id, from) < 0 {
				from, ok = id, true
			}
		}
	}
	return ok && ops.CompareEntryIDs(from, e.EntryID) <= 0, nil
}

// failedVersion is the projection version that parked e: its Version, or for entries parked
// before it was recorded, the version in its group's name (users.v2); 0 when neither says.
func failedVersion(e ops.PoisonEntry) int {
	if e.Version != 0 {
		return e.Version
	}
	_, v, _ := ops.ParseMemberName(e.Group)
	return v
}

// replayVersion is the projection version a replay writes to: the version that failed if it is
// still being built (a rebuild newer than the one serving), else the version serving reads (an
// older version that failed has been replaced by it).
func (h *ReplayPoisoned) replayVersion(ctx context.Context, e ops.PoisonEntry) (int, error) {
	current, err := h.cfg.Backend.Registry.Current(ctx, e.Projection)
	if err != nil {
		return 0, err
	}
	if failed := failedVersion(e); failed > current {
		return failed, nil
	}
	return current, nil
}

// ReplayAll replays parked entries in chunks of PoisonChunk, oldest first. Failures are kept
// (see Replay) and counted; an outage stops the run with an error and the progress so far.
func (h *ReplayPoisoned) ReplayAll(ctx context.Context, r BulkRequest) (BulkResult, error) {
	ctx = withReserve(ctx)
	var res BulkResult
	err := walkPoison(ctx, h.cfg.Backend.Poison, r, projectionNames(h.cfg.Projections), &res, func(chunk []ops.PoisonEntry) (string, error) {
		for _, e := range chunk {
			if stopSoon(ctx) {
				return e.ID, errStopEarly
			}
			rr, err := h.replay(ctx, e)
			switch {
			case err == nil:
				res.Replayed++
				continue
			case rr.Status == ReplayGone:
				res.Gone++
				continue
			case errors.Is(err, ErrReplayFailed):
				res.Failed++
			case errors.Is(err, ErrNotReplayable):
				res.NotReplayable++
			default:
				return e.ID, err // outage: stop, nothing was changed for e
			}
			if len(res.Failures) < maxReportedFailures {
				res.Failures = append(res.Failures, rr)
			}
		}
		return "", nil
	})
	return res, err
}

func (h *ReplayPoisoned) names() []string {
	out := make([]string, 0, len(h.byName))
	for n := range h.byName {
		out = append(out, n)
	}
	return out
}
