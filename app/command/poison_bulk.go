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

// PoisonChunk is how many parked entries a bulk replay or purge reads per round trip.
const PoisonChunk = 100

// BulkRequest selects entries for a bulk replay or purge.
type BulkRequest struct {
	Projection string // "" for all
	// Version, with Projection, keeps only the entries that version of it parked (0: every
	// version's).
	Version int
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
	// StoppedBy is why a run that had done part of its work stopped before the end (an outage):
	// the counts above are what it did, and Next and Until continue it.
	StoppedBy string `json:"stoppedBy,omitempty"`
}

// Progressed reports whether the run changed anything (or found entries another run handled).
func (r BulkResult) Progressed() bool {
	return r.Replayed+r.Gone+r.Failed+r.NotReplayable > 0 || r.Purged > 0
}

const maxReportedFailures = 100

// deadlineReserve is the time a bulk call keeps in hand before its context's deadline, to stop
// cleanly and answer rather than be cut off mid-entry.
const deadlineReserve = 500 * time.Millisecond

var errStopEarly = errors.New("stop early")

// walkPoison walks the queue from r.After to r.Until in chunks, handing the entries of
// r.Projection to do. do returns the ID of the first entry it did not handle when it stops early.
// A whole run (from the start to its end) for a projection that no entry names and that known
// (the build's projections) does not hold is refused: a misspelt name would otherwise do
// nothing and say it succeeded.
func walkPoison(ctx context.Context, q ops.PoisonQueue, r BulkRequest, known []string, res *BulkResult, do func([]ops.PoisonEntry) (string, error)) error {
	if r.Version < 0 || r.Version > 0 && r.Projection == "" {
		return &domain.ValidationError{Code: domain.CodeInvalid, Field: "version",
			Message: fmt.Sprintf("must be a projection version (1 or more) and go with a projection, got %d", r.Version)}
	}
	matched := false
	err := walkPoisonRange(ctx, q, r, res, func(es []ops.PoisonEntry) (string, error) {
		matched = true
		return do(es)
	})
	if err == nil && r.Projection != "" && !matched && r.After == "" && res.Next == "" && !slices.Contains(known, r.Projection) {
		return &domain.ValidationError{Code: domain.CodeInvalid, Field: "projection",
			Message: fmt.Sprintf("no parked entry names projection %q and this build has no such projection (known: %s)", r.Projection, strings.Join(known, ", "))}
	}
	return err
}

// walkPoisonRange is walkPoison's walk.
func walkPoisonRange(ctx context.Context, q ops.PoisonQueue, r BulkRequest, res *BulkResult, do func([]ops.PoisonEntry) (string, error)) error {
	if err := ops.ValidateCursor("after", r.After); err != nil {
		return err
	}
	if r.Until != "" {
		if err := ops.ValidateCursor("until", r.Until); err != nil {
			return err
		}
	}
	if stopSoon(ctx) {
		res.Next, res.Until = resumeAt(r.After), r.Until
		return nil
	}
	// Never past the queue's last entry now: a replay that fails re-parks its entry at the end,
	// and a bound beyond it walked into those (after a full chunk) and replayed them again.
	last, err := q.LastID(ctx)
	if err != nil {
		return ops.Unavailable(err)
	}
	if last == "" {
		return nil
	}
	if r.Until == "" || ops.CompareEntryIDs(r.Until, last) > 0 {
		r.Until = last
	}
	res.Until = r.Until
	after, handled := r.After, 0
	for {
		if stopSoon(ctx) || (r.Max > 0 && handled >= r.Max) {
			res.Next = resumeAt(after)
			return nil
		}
		chunk := int64(PoisonChunk)
		if r.Max > 0 {
			chunk = int64(min(PoisonChunk, r.Max-handled))
		}
		es, err := q.Range(ctx, after, r.Until, chunk)
		if err != nil {
			res.Next = resumeAt(after)
			return ops.Unavailable(err)
		}
		if len(es) == 0 {
			return nil
		}
		mine := es[:0:0]
		for _, e := range es {
			if r.Projection == "" || e.Projection == r.Projection && (r.Version == 0 || failedVersion(e) == r.Version) {
				mine = append(mine, e)
			}
		}
		if len(mine) > 0 {
			stoppedAt, err := do(mine)
			if err != nil {
				res.Next = resumeAt(previousID(es, stoppedAt, after))
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

// resumeAt is the Next of a run that stops after cursor: "0-0" when it stopped before its
// first entry, since an empty Next says the run is complete (a run stopped at once by a short
// REQUEST_TIMEOUT answered 200 without next, all its entries still in the queue).
func resumeAt(cursor string) string {
	if cursor == "" {
		return "0-0"
	}
	return cursor
}

// previousID is the cursor that resumes at stoppedAt: the ID before it in es, or after.
func previousID(es []ops.PoisonEntry, stoppedAt, after string) string {
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
	if !ok {
		return false
	}
	reserve, ok := ctx.Value(reserveKey{}).(time.Duration)
	if !ok {
		reserve = deadlineReserve
	}
	return time.Until(d) < reserve
}

type reserveKey struct{}

// withReserve fixes, as a bulk run begins, what it keeps in hand before its deadline:
// deadlineReserve, or a quarter of the time it has when that is shorter. A run given 500 ms or
// less (REQUEST_TIMEOUT accepts 1 ms) stopped before its first entry, every time, and never got
// anywhere.
func withReserve(ctx context.Context) context.Context {
	d, ok := ctx.Deadline()
	if !ok {
		return ctx
	}
	return context.WithValue(ctx, reserveKey{}, min(deadlineReserve, time.Until(d)/4))
}
