package query

import (
	"context"
	"errors"
	"fmt"

	"github.com/checkins/checkins/app/ops"
	"github.com/checkins/checkins/domain"
)

// DefaultPoisonListLimit and MaxPoisonListLimit bound one page of parked entries.
const (
	DefaultPoisonListLimit = 50
	MaxPoisonListLimit     = 1000
)

// poisonScanChunk is how many entries a filtered listing reads per round trip.
const poisonScanChunk = 100

// ListPoisoned lists and shows parked events.
type ListPoisoned struct {
	queue ops.PoisonQueue
}

// NewListPoisoned reads queue.
func NewListPoisoned(queue ops.PoisonQueue) (*ListPoisoned, error) {
	if queue == nil {
		return nil, errors.New("query: ListPoisoned needs a PoisonQueue")
	}
	return &ListPoisoned{queue: queue}, nil
}

// PoisonFilter selects a page of parked entries.
type PoisonFilter struct {
	Projection string // "" for all
	Cursor     string // ID of the last entry of the previous page, "" from the start
	Limit      int    // 0: DefaultPoisonListLimit
}

// PoisonPage is one page of parked entries, oldest first.
type PoisonPage struct {
	Entries []ops.PoisonEntry `json:"entries"`
	// Next is the cursor for the following page, "" when there is none.
	Next string `json:"next,omitempty"`
}

// List returns parked entries, filtered by projection when asked (which scans the queue).
func (q *ListPoisoned) List(ctx context.Context, f PoisonFilter) (PoisonPage, error) {
	if f.Limit == 0 {
		f.Limit = DefaultPoisonListLimit
	}
	if f.Limit < 1 || f.Limit > MaxPoisonListLimit {
		return PoisonPage{}, &domain.ValidationError{Code: domain.CodeOutOfRange, Field: "limit",
			Message: fmt.Sprintf("must be from 1 to %d, got %d", MaxPoisonListLimit, f.Limit)}
	}
	if err := ops.ValidateCursor("cursor", f.Cursor); err != nil {
		return PoisonPage{}, err
	}
	// One matching entry more than asked, to know whether a page follows: a last page of
	// exactly the limit has no cursor to an empty one.
	page := PoisonPage{Entries: []ops.PoisonEntry{}}
	after := f.Cursor
	for {
		chunk := int64(f.Limit + 1 - len(page.Entries))
		if f.Projection != "" {
			chunk = max(chunk, poisonScanChunk)
		}
		es, err := q.queue.Range(ctx, after, "+", chunk)
		if err != nil {
			return PoisonPage{}, ops.Unavailable(err)
		}
		for _, e := range es {
			after = e.ID
			if f.Projection != "" && e.Projection != f.Projection {
				continue
			}
			if len(page.Entries) == f.Limit {
				page.Next = page.Entries[len(page.Entries)-1].ID
				return page, nil
			}
			page.Entries = append(page.Entries, e)
		}
		if int64(len(es)) < chunk {
			return page, nil
		}
	}
}

// Show returns one parked entry.
// Newest is the ID of the newest parked entry ("" when the queue is empty): a page that offers
// to replay or purge "all" bounds the run by it, so that what was parked after the operator
// looked is left alone.
func (q *ListPoisoned) Newest(ctx context.Context) (string, error) {
	id, err := q.queue.LastID(ctx)
	if err != nil {
		return "", ops.Unavailable(err)
	}
	return id, nil
}

func (q *ListPoisoned) Show(ctx context.Context, id string) (ops.PoisonEntry, error) {
	e, err := q.queue.Get(ctx, id)
	if err != nil && !ops.IsClientError(err) {
		return e, ops.Unavailable(err)
	}
	return e, err
}
