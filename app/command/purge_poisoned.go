package command

import (
	"context"
	"errors"
	"log/slog"

	"github.com/checkins/checkins/app/ops"
	"github.com/checkins/checkins/app/projection"
)

// PurgePoisoned deletes parked events.
type PurgePoisoned struct {
	queue ops.PoisonQueue
	log   *slog.Logger
	known []string // the build's projections, for a bulk run's filter
}

// NewPurgePoisoned fails fast on missing dependencies. projections are the build's, which a
// bulk purge's filter is checked against.
func NewPurgePoisoned(queue ops.PoisonQueue, log *slog.Logger, projections []projection.Projection) (*PurgePoisoned, error) {
	if queue == nil || log == nil {
		return nil, errors.New("command: PurgePoisoned needs a PoisonQueue and a Logger")
	}
	return &PurgePoisoned{queue: queue, log: log, known: projectionNames(projections)}, nil
}

// projectionNames are the names of projs.
func projectionNames(projs []projection.Projection) []string {
	out := make([]string, len(projs))
	for i, p := range projs {
		out[i] = p.Name()
	}
	return out
}

// Purge deletes one parked entry.
func (h *PurgePoisoned) Purge(ctx context.Context, id string) error {
	err := h.queue.Delete(ctx, id)
	if err != nil && !ops.IsClientError(err) {
		return ops.Unavailable(err)
	}
	if err == nil {
		h.log.Info("poison entry purged", "poison_id", id)
	}
	return err
}

// PurgeAll deletes parked entries in chunks (only those of one projection when asked). Entries
// parked while it runs are kept: it never deletes what nobody has seen.
func (h *PurgePoisoned) PurgeAll(ctx context.Context, r BulkRequest) (BulkResult, error) {
	ctx = withReserve(ctx)
	var res BulkResult
	err := walkPoison(ctx, h.queue, r, h.known, &res, func(chunk []ops.PoisonEntry) (string, error) {
		ids := make([]string, 0, len(chunk))
		for _, e := range chunk {
			ids = append(ids, e.ID)
		}
		n, err := h.queue.DeleteIDs(ctx, ids...)
		if err != nil {
			return chunk[0].ID, ops.Unavailable(err) // as Purge: a storage failure, not a bug (503)
		}
		res.Purged += n
		return "", nil
	})
	if err == nil {
		h.log.Info("poison entries purged", "count", res.Purged, "projection", r.Projection)
	}
	return res, err
}
