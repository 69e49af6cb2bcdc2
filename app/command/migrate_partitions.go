package command

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/checkins/checkins/app/ops"
	"github.com/checkins/checkins/domain"
)

// MigratePartitions moves the event stream to another number of partitions
// (`checkins partitions migrate --to N`): quiesce (the API answers 503, projectors stop reading,
// nothing pending), copy every entry to its new partition with its ID, position every consumer
// group and live-group registry entry where it was, record the new count, delete the old
// partitions. Each phase is recorded as it ends, so a rerun after a crash carries on; a rerun
// once the count is N is a no-op.
type MigratePartitions struct {
	b PartitionMigration
}

// PartitionMigration is the storage side of a migration (adapters.PartitionMigrator).
type PartitionMigration interface {
	// Lock holds the migration for this run alone for ttl, extended while it lives (ok false:
	// another run holds it); lost closes if the lock was taken from this run.
	Lock(ctx context.Context, ttl time.Duration) (lost <-chan struct{}, release func(context.Context) error, ok bool, err error)
	Recorded(ctx context.Context) (int, error)
	// MaxRequestTimeout is the longest REQUEST_TIMEOUT an API process on this stream has
	// recorded (0: none recorded).
	MaxRequestTimeout(ctx context.Context) (time.Duration, error)
	Progress(ctx context.Context) (MigrationProgress, error)
	SaveProgress(ctx context.Context, p MigrationProgress) error
	// Quiesce stops the API and the projectors, and holds off joins into the live groups of
	// the partitions of from and of to, until Finish.
	Quiesce(ctx context.Context, reason string, from, to int) error
	Finish(ctx context.Context, from, to int) error
	Layouts(from, to int) error
	TargetsEmpty(ctx context.Context, to int) error
	Pending(ctx context.Context, from int) ([]string, error)
	// BackfillsSplit lists the projection versions still backfilling whose join positions on the
	// partitions of from would not translate to to (entries would change hands between their
	// own group and the live group).
	BackfillsSplit(ctx context.Context, from, to int) ([]string, error)
	// JoinsUnsettled lists why the live groups' memberships on the partitions of from would not
	// translate to new partitions now: a member's join lost on a partition, or a live group
	// behind a member's join (both settle while the projectors run).
	JoinsUnsettled(ctx context.Context, from int) ([]string, error)
	Copy(ctx context.Context, from, to, batch int, pause time.Duration, saved func(last string) error) (CopyResult, error)
	// Position reads the old partitions up to seen (per partition, the last entry the copy read;
	// nil: to their ends).
	Position(ctx context.Context, from, to, batch int, force bool, seen []string) (PositionResult, error)
	// WaitReplicas waits until n replicas of every new partition's master have what was
	// written to it, within timeout each (an error wrapping domain.ErrNotReplicated otherwise).
	WaitReplicas(ctx context.Context, to, n int, timeout time.Duration) error
	Record(ctx context.Context, to int) error
	// Cleanup deletes the old partitions (from) of a stream moved to `to` partitions. seen is,
	// per old partition, the last entry the copy read there ("" for none): entries after it
	// (a producer writing to the stream directly while the API stood still) are copied to their
	// new partitions first, and late counts them (nil seen: none are looked for).
	Cleanup(ctx context.Context, from, to int, seen []string) (late int64, err error)
}

// notMigrating fails with domain.ErrMigrating while a partition migration holds the stream (m
// nil: nothing to ask).
func notMigrating(ctx context.Context, m ops.Migration) error {
	if m == nil {
		return nil
	}
	why, err := m.Running(ctx)
	if err != nil {
		return ops.Unavailable(err)
	}
	if why != "" {
		return fmt.Errorf("%w (%s): retry once it is done; if it stopped, `checkins partitions migrate --to N` resumes it", domain.ErrMigrating, why)
	}
	return nil
}

// MigrationProgress is what a migration has done so far (zero: none runs).
type MigrationProgress struct {
	From       int    `json:"from"`
	To         int    `json:"to"`
	Phase      string `json:"phase"`
	LastCopied string `json:"lastCopied,omitempty"`
	// Seen is, per old partition, the last entry the copy read ("" for none).
	Seen    []string `json:"seen,omitempty"`
	Started int64    `json:"started"` // ms
}

// Migration phases, in order.
const (
	PhaseQuiesce  = "quiesce"
	PhaseCopy     = "copy"
	PhasePosition = "position"
	PhaseCleanup  = "cleanup"
)

// CopyResult counts a copy pass.
type CopyResult struct {
	Entries    int64 // entries of the old partitions
	Copied     int64 // written by this pass
	Skipped    int64 // there already (an earlier run)
	Renumbered int64 // took the next free ID: another old partition held their ID
	// Last is, per old partition, the last entry read ("" for none).
	Last []string
	// Late were added to the old partitions after the copy read them (a producer writing to the
	// stream directly), copied when the old partitions were deleted.
	Late int64
}

// PositionResult counts the groups positioned.
type PositionResult struct {
	Groups int
	Holes  int // groups and new partitions where entries were left pending for projectors to take over
}

// MigrateRequest is one run of the migration.
type MigrateRequest struct {
	To    int
	Force bool          // go on with entries pending after Wait (they are delivered again after the migration)
	Wait  time.Duration // how long to wait for pending entries to be acknowledged
	// Settle is how long to wait after setting the flag before looking at pending entries: every
	// process sees it within its poll interval, and a request admitted just before may still write
	// until its deadline.
	Settle time.Duration
	// RequestTimeout is the request deadline Settle allows for (this process's REQUEST_TIMEOUT):
	// an API process that recorded a longer one (PartitionMigration.MaxRequestTimeout) makes the
	// settle longer by the difference, so that a request it admitted just before the flag has
	// ended before the copy reads the old partitions.
	RequestTimeout time.Duration
	Poll           time.Duration
	Batch          int
	Pause          time.Duration // between copy batches
	Report         func(string)  // progress for people
	// MinReplicas > 0 (INGEST_MIN_REPLICAS): the new partitions count as written, and the count
	// is recorded and the old partitions deleted, only once that many replicas of each have the
	// copy, within ReplicaTimeout each; otherwise the run stops before it changes anything more.
	MinReplicas    int
	ReplicaTimeout time.Duration
	// LockWait is how long to wait for another run's lock to be let go, or to expire when that
	// run died (0: MigrateLockTTL and a few seconds, so that a rerun right after a crash carries
	// on).
	LockWait time.Duration
	// LockTTL is how long the lock outlives a run whose process died (0: MigrateLockTTL).
	LockTTL time.Duration
}

// MigrateResult is what a run did.
type MigrateResult struct {
	From, To int
	NoOp     bool
	Copy     CopyResult
	Position PositionResult
	Took     time.Duration
}

// NewMigratePartitions migrates through b.
func NewMigratePartitions(b PartitionMigration) (*MigratePartitions, error) {
	if b == nil {
		return nil, errors.New("migrate partitions: no storage")
	}
	return &MigratePartitions{b: b}, nil
}

// MigrateLockTTL is how long the migration's lock outlives a run whose process died (a live run
// extends it every third of that).
const MigrateLockTTL = 15 * time.Second

// ErrMigrationRunning: another `checkins partitions migrate` holds the migration.
var ErrMigrationRunning = errors.New("another `checkins partitions migrate` is running")

// errMigrateLockLost ends a run whose lock was taken from it.
var errMigrateLockLost = errors.New("the migration's lock was lost (this process could not extend it in time, and another run may have taken it over): stopped; run the command again to carry on")

// Handle runs (or carries on) the migration to req.To partitions. One run at a time: a second
// one, started while the first still works (an operator who did not wait, a job retried), would
// carry on from the first's recorded phase and undo what it did since (groups positioned again
// where they were before the projectors moved on, so that they get entries again that they had
// acknowledged). It is refused, and a run whose lock is taken from it stops.
func (m *MigratePartitions) Handle(ctx context.Context, req MigrateRequest) (MigrateResult, error) {
	started := time.Now()
	report := req.Report
	if report == nil {
		report = func(string) {}
	}
	lost, release, err := m.lock(ctx, req, report)
	if err != nil {
		return MigrateResult{}, err
	}
	defer func() {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = release(rctx) // it expires by itself otherwise
	}()
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	go func() {
		select {
		case <-lost:
			cancel(errMigrateLockLost)
		case <-ctx.Done():
		}
	}()
	res, err := m.handle(ctx, req, report, started)
	if err != nil && errors.Is(context.Cause(ctx), errMigrateLockLost) {
		return res, fmt.Errorf("%w (%w)", errMigrateLockLost, err)
	}
	return res, err
}

// lock takes the migration's lock, waiting up to req.LockWait for another run to let go of it.
func (m *MigratePartitions) lock(ctx context.Context, req MigrateRequest, report func(string)) (<-chan struct{}, func(context.Context) error, error) {
	wait := req.LockWait
	if wait <= 0 {
		wait = MigrateLockTTL + 5*time.Second
	}
	deadline := time.Now().Add(wait)
	for delay := 50 * time.Millisecond; ; delay = min(2*delay, time.Second) {
		ttl := req.LockTTL
		if ttl <= 0 {
			ttl = MigrateLockTTL
		}
		lost, release, ok, err := m.b.Lock(ctx, ttl)
		if err != nil || ok {
			return lost, release, err
		}
		if delay == 50*time.Millisecond {
			report(fmt.Sprintf("another run holds the migration: waiting up to %s for it to end (or, if its process died, for its lock to expire)", wait.Round(time.Second)))
		}
		if time.Now().Add(delay).After(deadline) {
			return nil, nil, fmt.Errorf("%w: it held the migration for %s; wait for it to end, then run the command again to carry on or check", ErrMigrationRunning, wait.Round(time.Second))
		}
		if err := pause(ctx, delay); err != nil {
			return nil, nil, err
		}
	}
}

func (m *MigratePartitions) handle(ctx context.Context, req MigrateRequest, report func(string), started time.Time) (MigrateResult, error) {
	if req.Batch <= 0 {
		req.Batch = 1000
	}
	if req.Poll <= 0 {
		req.Poll = 200 * time.Millisecond
	}
	p, err := m.b.Progress(ctx)
	if err != nil {
		return MigrateResult{}, err
	}
	recorded, err := m.b.Recorded(ctx)
	if err != nil {
		return MigrateResult{}, err
	}
	if p.Phase == "" {
		if recorded == req.To {
			return MigrateResult{From: recorded, To: req.To, NoOp: true}, nil
		}
		if err := m.b.Layouts(recorded, req.To); err != nil {
			return MigrateResult{}, err
		}
		if err := m.b.TargetsEmpty(ctx, req.To); err != nil {
			return MigrateResult{}, err
		}
		if why, err := m.unsettled(ctx, recorded, req.To); err != nil || why != "" {
			if err == nil {
				err = errors.New(why + " (nothing was changed)")
			}
			return MigrateResult{}, err
		}
		p = MigrationProgress{From: recorded, To: req.To, Phase: PhaseQuiesce, Started: started.UnixMilli()}
		if err := m.b.SaveProgress(ctx, p); err != nil {
			return MigrateResult{}, err
		}
	} else if !slices.Contains([]string{PhaseQuiesce, PhaseCopy, PhasePosition, PhaseCleanup}, p.Phase) {
		return MigrateResult{}, fmt.Errorf("the recorded migration from %d to %d partitions is in a phase this release does not know, %q: carry it on with the release that started it", p.From, p.To, p.Phase)
	} else if p.To != req.To {
		return MigrateResult{}, fmt.Errorf("a migration from %d to %d partitions is under way (phase %s): finish it with `checkins partitions migrate --to %d` first",
			p.From, p.To, p.Phase, p.To)
	} else {
		report(fmt.Sprintf("carrying on the migration from %d to %d partitions (phase %s)", p.From, p.To, p.Phase))
	}
	res := MigrateResult{From: p.From, To: p.To}
	if err := m.b.Quiesce(ctx, fmt.Sprintf("%d to %d partitions", p.From, p.To), p.From, p.To); err != nil {
		return res, err
	}
	next := func(phase string) error {
		p.Phase = phase
		if err := m.b.SaveProgress(ctx, p); err != nil {
			return err
		}
		return nil
	}
	if p.Phase == PhaseQuiesce {
		settle := req.Settle
		longest, err := m.b.MaxRequestTimeout(ctx)
		if err != nil {
			return res, err
		}
		if longest > req.RequestTimeout {
			settle += longest - req.RequestTimeout
			report(fmt.Sprintf("an API process ran with REQUEST_TIMEOUT %s (recorded in <prefix>:meta max_request_timeout_ms; HDEL it once no process runs with so long a timeout)", longest))
		}
		report(fmt.Sprintf("quiescing: the API answers 503 and projectors stop reading; waiting %s for them to see it and for requests admitted before to end", settle))
		if err := pause(ctx, settle); err != nil {
			return res, err
		}
		if err := m.waitIdle(ctx, p.From, req, report); err != nil {
			return res, err
		}
		// Again, now that the projectors stand still: one may have joined a version (a
		// rebuild's, a moved one) between the checks above and the quiesce, or this run carries
		// on one that stopped here. Nothing is copied yet, so it is called off.
		why, err := m.unsettled(ctx, p.From, p.To)
		if err != nil {
			return res, err
		}
		if why != "" {
			if err := m.b.Finish(ctx, p.From, p.To); err != nil {
				return res, fmt.Errorf("%s; calling the migration off failed, the API still answers 503: %w (run it again)", why, err)
			}
			return res, fmt.Errorf("%s (this changed while the projectors were being stopped: the migration is called off and nothing was changed)", why)
		}
		if err := next(PhaseCopy); err != nil {
			return res, err
		}
	}
	if p.Phase == PhaseCopy {
		report(fmt.Sprintf("copying the entries of %d partitions into %d", p.From, p.To))
		t0 := time.Now()
		c, err := m.b.Copy(ctx, p.From, p.To, req.Batch, req.Pause, func(last string) error {
			p.LastCopied = last
			return m.b.SaveProgress(ctx, p)
		})
		res.Copy = c
		if err != nil {
			return res, err
		}
		report(fmt.Sprintf("copied %d entries in %s (%d were there from an earlier run, %d renumbered)",
			c.Copied, time.Since(t0).Round(time.Millisecond), c.Skipped, c.Renumbered))
		p.Seen = c.Last
		if err := next(PhasePosition); err != nil {
			return res, err
		}
	}
	if p.Phase == PhasePosition && recorded == p.To {
		// The count was recorded, so the groups were positioned and their copy replicated: the
		// run stopped between recording it and saving the next phase. Positioned again from the
		// old partitions, entries a projector of the new count took over and acknowledged since
		// were pending again, and counted twice (found by a review).
		report(fmt.Sprintf("the stream's count is %d already: its groups were positioned; cleaning up", p.To))
		if err := next(PhaseCleanup); err != nil {
			return res, err
		}
	}
	if p.Phase == PhasePosition {
		t0 := time.Now()
		seen := p.Seen
		if len(seen) != p.From {
			seen = nil // progress of a release before Seen
		}
		pos, err := m.b.Position(ctx, p.From, p.To, req.Batch, req.Force, seen)
		res.Position = pos
		if err != nil {
			return res, err
		}
		report(fmt.Sprintf("positioned %d consumer groups on each of the %d partitions in %s", pos.Groups, p.To, time.Since(t0).Round(time.Millisecond)))
		if pos.Holes > 0 {
			report(fmt.Sprintf("on %d group partitions, entries a group had not delivered before others it had are pending for consumer partitions-migrate: projectors take them over within CLAIM_INTERVAL", pos.Holes))
		}
		if req.MinReplicas > 0 {
			report(fmt.Sprintf("waiting for %d replicas of every new partition to have the copy", req.MinReplicas))
			if err := m.b.WaitReplicas(ctx, p.To, req.MinReplicas, req.ReplicaTimeout); err != nil {
				return res, fmt.Errorf("the copy is not yet on enough replicas, so the old partitions are kept and the count is not recorded; run the command again once the replicas have caught up: %w", err)
			}
		}
		if err := m.b.Record(ctx, p.To); err != nil {
			return res, err
		}
		if err := next(PhaseCleanup); err != nil {
			return res, err
		}
	}
	if p.Phase == PhaseCleanup {
		if len(p.Seen) != p.From {
			p.Seen = nil // recorded by a release before Seen: its copy is taken as complete, as it was
		}
		late, err := m.b.Cleanup(ctx, p.From, p.To, p.Seen)
		res.Copy.Late = late
		if err != nil {
			return res, err
		}
		if late > 0 {
			report(fmt.Sprintf("copied %d entries added to the old partitions during the migration (a producer writing to the stream directly)", late))
		}
		if err := m.b.Finish(ctx, p.From, p.To); err != nil {
			return res, err
		}
		report(fmt.Sprintf("the stream has %d partitions; the old ones are deleted; restart every process with STREAM_PARTITIONS=%d", p.To, p.To))
	}
	res.Took = time.Since(started)
	return res, nil
}

// unsettled says why the live groups' memberships on the partitions of from would not carry
// over to to now ("": they would).
func (m *MigratePartitions) unsettled(ctx context.Context, from, to int) (string, error) {
	unsettled, err := m.b.JoinsUnsettled(ctx, from)
	if err != nil {
		return "", err
	}
	if len(unsettled) > 0 {
		return fmt.Sprintf("the projection versions' joins on the %d partitions would not carry over to %d: %s; the projectors settle this by themselves (they join a lost partition again within a poll, and the live group catches up): run it again once they have",
			from, to, strings.Join(unsettled, "; ")), nil
	}
	if from > 1 {
		// Merged, a backfilling version's join positions on the old partitions may interleave
		// in the new ones: entries past the first such hole would change hands between its own
		// group and the live group, and be lost to it or counted twice.
		split, err := m.b.BackfillsSplit(ctx, from, to)
		if err != nil {
			return "", err
		}
		if len(split) > 0 {
			return fmt.Sprintf("projection versions %s are still backfilling, and the positions where they joined on the %d partitions interleave once merged into %d: some of their entries would be lost to them or counted twice; wait until `checkins projections list` shows them caught up, then run it again",
				strings.Join(split, ", "), from, to), nil
		}
	}
	return "", nil
}

// waitIdle waits until no group has entries pending, for up to req.Wait (then fails, or goes on
// with req.Force).
func (m *MigratePartitions) waitIdle(ctx context.Context, from int, req MigrateRequest, report func(string)) error {
	deadline := time.Now().Add(req.Wait)
	told := time.Time{}
	for {
		pending, err := m.b.Pending(ctx, from)
		if err != nil {
			return err
		}
		if len(pending) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			if req.Force {
				report("going on with entries pending (--force): " + strings.Join(pending, "; "))
				return nil
			}
			return fmt.Errorf("entries still pending after %s: %s; the migration is paused (the API answers 503): let the projectors acknowledge them and rerun, or rerun with --force",
				req.Wait, strings.Join(pending, "; "))
		}
		if time.Since(told) > 5*time.Second {
			report("waiting for pending entries: " + strings.Join(pending, "; "))
			told = time.Now()
		}
		if err := pause(ctx, req.Poll); err != nil {
			return err
		}
	}
}

func pause(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
