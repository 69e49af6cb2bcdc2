package ports

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/checkins/checkins/adapters"
	"github.com/checkins/checkins/app/projection"
	"github.com/checkins/checkins/domain"
)

// Poison queue operations, shared by the CLI (checkins poison ...) and HTTP (/ops/poison).
const (
	// ReplayChunk is how many parked entries a bulk replay or purge reads per round trip.
	ReplayChunk = 100
	// DefaultPoisonListLimit and MaxPoisonListLimit bound one page of `poison list`.
	DefaultPoisonListLimit = 50
	MaxPoisonListLimit     = 1000
)

// ErrReplayFailed is returned when the projection failed again on a replayed event; the entry
// stays in the queue with the new error.
var ErrReplayFailed = errors.New("replay failed")

// ErrNotReplayable is returned for an entry no replay can fix (it does not decode to a valid
// event, or names a projection this build does not have); the entry is kept unchanged.
var ErrNotReplayable = errors.New("entry cannot be replayed")

// PoisonOpsConfig wires PoisonOps.
type PoisonOpsConfig struct {
	Redis       redis.UniversalClient
	Keys        adapters.KeySpace
	Projections []projection.Projection // every projection this build knows
	// Applier applies a replayed event (with markers of its own per projection version, so a
	// replay that is interrupted, or run twice at once, still counts the event once).
	Applier *adapters.ProjectionApplier
	Logger  *slog.Logger
	Now     func() time.Time // default time.Now
}

// PoisonOps lists, shows, replays and purges parked events.
type PoisonOps struct {
	cfg      PoisonOpsConfig
	queue    *adapters.PoisonQueue
	versions *adapters.ProjectionVersions
	byName   map[string]projection.Projection
}

// NewPoisonOps fails fast on missing dependencies.
func NewPoisonOps(cfg PoisonOpsConfig) (*PoisonOps, error) {
	if cfg.Redis == nil || cfg.Logger == nil || cfg.Applier == nil {
		return nil, errors.New("ports: PoisonOps needs Redis, an Applier and Logger")
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	o := &PoisonOps{cfg: cfg, queue: adapters.NewPoisonQueue(cfg.Redis, cfg.Keys),
		versions: adapters.NewProjectionVersions(cfg.Redis, cfg.Keys), byName: map[string]projection.Projection{}}
	for _, p := range cfg.Projections {
		o.byName[p.Name()] = p
	}
	return o, nil
}

// PoisonFilter selects a page of parked entries.
type PoisonFilter struct {
	Projection string // "" for all
	Cursor     string // ID of the last entry of the previous page, "" from the start
	Limit      int    // 0: DefaultPoisonListLimit
}

// PoisonPage is one page of parked entries, oldest first.
type PoisonPage struct {
	Entries []adapters.PoisonEntry `json:"entries"`
	// Next is the cursor for the following page, "" when there is none.
	Next string `json:"next,omitempty"`
}

// List returns parked entries, filtered by projection when asked (which scans the queue).
func (o *PoisonOps) List(ctx context.Context, f PoisonFilter) (PoisonPage, error) {
	if f.Limit == 0 {
		f.Limit = DefaultPoisonListLimit
	}
	if f.Limit < 1 || f.Limit > MaxPoisonListLimit {
		return PoisonPage{}, &domain.ValidationError{Code: domain.CodeOutOfRange, Field: "limit",
			Message: fmt.Sprintf("must be from 1 to %d, got %d", MaxPoisonListLimit, f.Limit)}
	}
	if err := validateCursor(f.Cursor); err != nil {
		return PoisonPage{}, err
	}
	page := PoisonPage{Entries: []adapters.PoisonEntry{}}
	after := f.Cursor
	for {
		chunk := int64(f.Limit - len(page.Entries))
		if f.Projection != "" {
			chunk = max(chunk, ReplayChunk)
		}
		es, err := o.queue.Range(ctx, after, "+", chunk)
		if err != nil {
			return PoisonPage{}, unavailable(err)
		}
		for _, e := range es {
			if f.Projection != "" && e.Projection != f.Projection {
				after = e.ID
				continue
			}
			page.Entries = append(page.Entries, e)
			after = e.ID
			if len(page.Entries) == f.Limit {
				page.Next = e.ID
				return page, nil
			}
		}
		if int64(len(es)) < chunk {
			return page, nil
		}
	}
}

// Show returns one parked entry.
func (o *PoisonOps) Show(ctx context.Context, id string) (adapters.PoisonEntry, error) {
	e, err := o.queue.Get(ctx, id)
	if err != nil && !isClientError(err) {
		return e, unavailable(err)
	}
	return e, err
}

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

// Replay statuses.
const (
	ReplayReplayed      = "replayed"
	ReplayFailed        = "failed"
	ReplayNotReplayable = "not_replayable"
	// ReplayGone: another run replayed or purged the entry first; this one changed nothing.
	ReplayGone = "gone"
)

// ReplayGroup names the markers a replay of projection version writes under: a group of its
// own, whose markers are never pruned (replays are few), so that a replay run twice, at once or
// after an interruption, counts the event once.
func ReplayGroup(name string, version int) string {
	return "replay." + adapters.MemberName(name, version)
}

// Replay runs one parked event through the projection that failed, directly against its store
// (whose dedupe makes a replay of an event already counted a no-op), and deletes the entry on
// success. A failure keeps the entry, with the new error, and returns ErrReplayFailed or
// ErrNotReplayable along with the result. An outage returns the error and changes nothing.
func (o *PoisonOps) Replay(ctx context.Context, id string) (ReplayResult, error) {
	e, err := o.queue.Get(ctx, id)
	if err != nil {
		if isClientError(err) {
			return ReplayResult{ID: id}, err
		}
		return ReplayResult{ID: id}, unavailable(err)
	}
	return o.replay(ctx, e)
}

func (o *PoisonOps) replay(ctx context.Context, e adapters.PoisonEntry) (ReplayResult, error) {
	res := ReplayResult{ID: e.ID, Projection: e.Projection}
	parsed, err := domain.ParseEvent(e.Fields)
	if err != nil {
		res.Status, res.Error = ReplayNotReplayable, fmt.Sprintf("the parked entry is not a valid event: %v", err)
		return res, fmt.Errorf("%w: poison entry %s: %s", ErrNotReplayable, e.ID, res.Error)
	}
	p, ok := o.byName[e.Projection]
	if !ok {
		res.Status, res.Error = ReplayNotReplayable, fmt.Sprintf("projection %q is not known to this build (known: %s)", e.Projection, strings.Join(o.names(), ", "))
		return res, fmt.Errorf("%w: poison entry %s: %s", ErrNotReplayable, e.ID, res.Error)
	}
	ev, ok := parsed.(domain.CheckinRecorded)
	if !ok {
		res.Status, res.Error = ReplayNotReplayable, fmt.Sprintf("events of type %s cannot be replayed", parsed.EventName())
		return res, fmt.Errorf("%w: poison entry %s: %s", ErrNotReplayable, e.ID, res.Error)
	}
	version, err := o.replayVersion(ctx, e)
	if err != nil {
		return res, unavailable(err)
	}
	outcome, err := o.cfg.Applier.ApplyDecided(ctx, ReplayGroup(p.Name(), version), p, version, ev, e.EntryID, e.DecisionRef())
	switch {
	case err == nil:
		res.Status, res.Applied = ReplayReplayed, outcome == adapters.Applied
		n, derr := o.queue.DeleteIDs(ctx, e.ID)
		if derr != nil {
			// Replaying again later is harmless (markers); say so rather than pretend.
			return res, unavailable(fmt.Errorf("replayed poison entry %s but could not delete it (a later replay is a no-op): %w", e.ID, derr))
		}
		if n == 0 {
			// Another run got there first: it replayed (or purged) the entry, and reports it.
			res.Status, res.Applied = ReplayGone, false
			return res, fmt.Errorf("poison entry %s was replayed or purged by another run meanwhile: %w", e.ID, domain.ErrNotFound)
		}
		o.cfg.Logger.Info("poison entry replayed", "poison_id", e.ID, "projection", e.Projection, "version", version,
			"entry_id", e.EntryID, "applied", res.Applied)
		return res, nil
	case ctx.Err() != nil || IsTransient(err) || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled):
		// Not the event's fault: keep the entry as it is.
		return res, unavailable(err)
	}
	res.Status, res.Error = ReplayFailed, err.Error()
	e.Error, e.Attempts, e.FailedAt = "replay: "+err.Error(), e.Attempts+1, o.cfg.Now()
	newID, rerr := o.queue.Repark(ctx, e)
	if rerr != nil {
		if errors.Is(rerr, domain.ErrNotFound) {
			// Someone else replayed or purged it meanwhile.
			return res, fmt.Errorf("%w: poison entry %s: %w (and it was removed meanwhile)", ErrReplayFailed, e.ID, err)
		}
		return res, unavailable(fmt.Errorf("replay of poison entry %s failed (%w) and recording the new error failed: %w", e.ID, err, rerr))
	}
	res.NewID = newID
	o.cfg.Logger.Warn("poison entry replay failed, kept with the new error", "poison_id", e.ID, "new_poison_id", newID,
		"projection", e.Projection, "error", err)
	return res, fmt.Errorf("%w: poison entry %s (kept as %s): %w", ErrReplayFailed, e.ID, newID, err)
}

// replayVersion is the projection version a replay writes to: the version that failed if it is
// still being built (a rebuild newer than the one serving), else the version serving reads (an
// older version that failed has been replaced by it).
func (o *PoisonOps) replayVersion(ctx context.Context, e adapters.PoisonEntry) (int, error) {
	current, err := o.versions.Current(ctx, e.Projection)
	if err != nil {
		return 0, err
	}
	if e.Version > current {
		return e.Version, nil
	}
	if _, v, ok := strings.Cut(e.Group, ".v"); ok {
		if n, err := strconv.Atoi(v); err == nil && n > current {
			return n, nil
		}
	}
	return current, nil
}

// BulkRequest selects entries for a bulk replay or purge.
type BulkRequest struct {
	Projection string // "" for all
	// After continues a previous call ("" from the start); Until bounds the run to entries that
	// were in the queue when it began ("" = the newest entry now), so entries re-parked by a
	// failed replay are not replayed again in the same run.
	After, Until string
	// Max bounds the entries handled by this call (0: no bound); the HTTP API uses it to stay
	// within the request timeout and returns Next to continue.
	Max int
}

// BulkResult summarises a bulk replay or purge.
type BulkResult struct {
	Replayed int `json:"replayed,omitempty"`
	// Gone counts entries another run replayed or purged first (this run changed nothing for
	// them), so the totals of concurrent runs add up to what was parked.
	Gone          int            `json:"gone,omitempty"`
	Failed        int            `json:"failed,omitempty"`
	NotReplayable int            `json:"notReplayable,omitempty"`
	Purged        int64          `json:"purged,omitempty"`
	Failures      []ReplayResult `json:"failures,omitempty"` // the first maxReportedFailures
	// Next and Until continue the run when it stopped early (Max or a deadline); Next is ""
	// when the run is complete.
	Next  string `json:"next,omitempty"`
	Until string `json:"until,omitempty"`
}

const maxReportedFailures = 100

// deadlineReserve is the time a bulk call keeps in hand before its context's deadline, to stop
// cleanly and answer rather than be cut off mid-entry.
const deadlineReserve = 500 * time.Millisecond

// ReplayAll replays parked entries in chunks of ReplayChunk, oldest first. Failures are kept
// (see Replay) and counted; an outage stops the run with an error and the progress so far.
func (o *PoisonOps) ReplayAll(ctx context.Context, r BulkRequest) (BulkResult, error) {
	var res BulkResult
	err := o.bulk(ctx, r, &res, func(chunk []adapters.PoisonEntry) (string, error) {
		for _, e := range chunk {
			if stopSoon(ctx) {
				return e.ID, errStopEarly
			}
			rr, err := o.replay(ctx, e)
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

// PurgeAll deletes parked entries in chunks (only those of one projection when asked). Entries
// parked while it runs are kept: it never deletes what nobody has seen.
func (o *PoisonOps) PurgeAll(ctx context.Context, r BulkRequest) (BulkResult, error) {
	var res BulkResult
	err := o.bulk(ctx, r, &res, func(chunk []adapters.PoisonEntry) (string, error) {
		ids := make([]string, 0, len(chunk))
		for _, e := range chunk {
			ids = append(ids, e.ID)
		}
		n, err := o.queue.DeleteIDs(ctx, ids...)
		if err != nil {
			return chunk[0].ID, err
		}
		res.Purged += n
		return "", nil
	})
	if err == nil {
		o.cfg.Logger.Info("poison entries purged", "count", res.Purged, "projection", r.Projection)
	}
	return res, err
}

// Purge deletes one parked entry.
func (o *PoisonOps) Purge(ctx context.Context, id string) error {
	err := o.queue.Delete(ctx, id)
	if err != nil && !isClientError(err) {
		return unavailable(err)
	}
	if err == nil {
		o.cfg.Logger.Info("poison entry purged", "poison_id", id)
	}
	return err
}

var errStopEarly = errors.New("stop early")

// bulk walks the queue from r.After to r.Until in chunks, handing the entries of r.Projection to
// do. do returns the ID of the first entry it did not handle when it stops early.
func (o *PoisonOps) bulk(ctx context.Context, r BulkRequest, res *BulkResult, do func([]adapters.PoisonEntry) (string, error)) error {
	if err := validateCursor(r.After); err != nil {
		return err
	}
	if r.Until != "" {
		if err := validateCursorField("until", r.Until); err != nil {
			return err
		}
	} else {
		last, err := o.queue.LastID(ctx)
		if err != nil {
			return unavailable(err)
		}
		if last == "" {
			return nil
		}
		r.Until = last
	}
	res.Until = r.Until
	after, handled := r.After, 0
	for {
		if stopSoon(ctx) || (r.Max > 0 && handled >= r.Max) {
			res.Next = after
			return nil
		}
		chunk := int64(ReplayChunk)
		if r.Max > 0 {
			chunk = int64(min(ReplayChunk, r.Max-handled))
		}
		es, err := o.queue.Range(ctx, after, r.Until, chunk)
		if err != nil {
			res.Next = after
			return unavailable(err)
		}
		if len(es) == 0 {
			return nil
		}
		mine := es[:0:0]
		for _, e := range es {
			if r.Projection == "" || e.Projection == r.Projection {
				mine = append(mine, e)
			}
		}
		if len(mine) > 0 {
			stoppedAt, err := do(mine)
			if err != nil {
				res.Next = previousID(es, stoppedAt, after)
				if errors.Is(err, errStopEarly) {
					return nil
				}
				return err
			}
		}
		handled += len(es)
		after = es[len(es)-1].ID
		if int64(len(es)) < chunk {
			return nil
		}
	}
}

// previousID is the cursor that resumes at stoppedAt: the ID before it in es, or after.
func previousID(es []adapters.PoisonEntry, stoppedAt, after string) string {
	for i, e := range es {
		if e.ID == stoppedAt {
			if i == 0 {
				return after
			}
			return es[i-1].ID
		}
	}
	return after
}

func stopSoon(ctx context.Context) bool {
	if ctx.Err() != nil {
		return true
	}
	d, ok := ctx.Deadline()
	return ok && time.Until(d) < deadlineReserve
}

func (o *PoisonOps) names() []string {
	out := make([]string, 0, len(o.byName))
	for n := range o.byName {
		out = append(out, n)
	}
	return out
}

func validateCursor(c string) error { return validateCursorField("cursor", c) }

func validateCursorField(field, c string) error {
	if c == "" {
		return nil
	}
	if _, ok := adapters.EntryTime(c); !ok || strings.Count(c, "-") != 1 {
		return &domain.ValidationError{Code: domain.CodeInvalid, Field: field, Message: fmt.Sprintf("is not a poison entry ID like 1700000000000-0: %q", c)}
	}
	if _, err := strconv.ParseUint(c[strings.Index(c, "-")+1:], 10, 64); err != nil {
		return &domain.ValidationError{Code: domain.CodeInvalid, Field: field, Message: fmt.Sprintf("is not a poison entry ID like 1700000000000-0: %q", c)}
	}
	return nil
}

func isClientError(err error) bool {
	var ve *domain.ValidationError
	return errors.As(err, &ve) || errors.Is(err, domain.ErrNotFound)
}

// unavailable marks a Redis failure so the HTTP port answers 503.
func unavailable(err error) error {
	if err == nil || errors.Is(err, domain.ErrUnavailable) {
		return err
	}
	return fmt.Errorf("%w: %w", domain.ErrUnavailable, err)
}
