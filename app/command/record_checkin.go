// Package command holds the use cases that change state.
package command

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/checkins/checkins/domain"
)

// EventPublisher appends events to the event stream. It returns only once the event is stored.
type EventPublisher interface {
	// PublishCheckinRecorded returns an error wrapping ErrNotPublished when the event is known
	// not to be on the stream; any other error leaves open whether it was stored.
	PublishCheckinRecorded(ctx context.Context, e domain.CheckinRecorded, correlationID string) error
}

// ErrNotPublished marks a publish error after which the event is certainly not on the stream
// (it was refused before it was sent).
var ErrNotPublished = errors.New("event not published")

// IdempotencyRecord is what was first accepted under a checkinId.
type IdempotencyRecord struct {
	Fingerprint string
	Checkin     domain.Checkin
	RecordedAt  int64
	Published   bool // the event is known to be on the stream
	// Owner is the token of the attempt that holds an unpublished reservation ("" in records
	// written before reservations had owners); ReservedAt (ms since epoch) is when it took it.
	Owner      string
	ReservedAt int64
}

// IdempotencyStore remembers which checkinIds were accepted, so a retry is answered without a
// second event and a different check-in reusing the ID is refused.
type IdempotencyStore interface {
	// Reserve stores rec under its checkinId unless one exists; it returns the existing one, or
	// nil when rec was stored.
	Reserve(ctx context.Context, rec IdempotencyRecord) (*IdempotencyRecord, error)
	// MarkPublished records that the event of rec (as reserved) is on the stream.
	MarkPublished(ctx context.Context, rec IdempotencyRecord) error
	// TakeOver atomically replaces the reservation seen with next, if it is still unpublished
	// and held by seen.Owner; otherwise it returns what is stored now (nil: nothing).
	TakeOver(ctx context.Context, seen, next IdempotencyRecord) (taken bool, current *IdempotencyRecord, err error)
	// Release deletes the reservation rec, only if it is still exactly rec (unpublished, ours).
	Release(ctx context.Context, rec IdempotencyRecord) error
}

// RecordCheckin is the command to accept one check-in.
type RecordCheckin struct {
	Input         domain.CheckinInput
	CorrelationID string
}

// RecordCheckinResult is the accepted check-in and whether this call recorded it (false: a retry).
type RecordCheckinResult struct {
	Checkin  domain.Checkin
	Replayed bool
}

// RecordCheckinHandler validates a check-in and records it as a CheckinRecorded event.
type RecordCheckinHandler struct {
	publisher EventPublisher
	idem      IdempotencyStore
	now       func() time.Time
	newID     func() string
	log       *slog.Logger
}

// NewRecordCheckinHandler fails fast on missing dependencies.
func NewRecordCheckinHandler(p EventPublisher, idem IdempotencyStore, now func() time.Time, newID func() string, log *slog.Logger) (*RecordCheckinHandler, error) {
	if p == nil || idem == nil || now == nil || newID == nil || log == nil {
		return nil, errors.New("command: RecordCheckinHandler needs a publisher, an idempotency store, a clock, an ID source and a logger")
	}
	return &RecordCheckinHandler{publisher: p, idem: idem, now: now, newID: newID, log: log}, nil
}

// Handle answers only after the event is stored: an acknowledged check-in is never lost. The
// same checkinId with the same body is safe to retry; with a different body it is a conflict.
func (h *RecordCheckinHandler) Handle(ctx context.Context, cmd RecordCheckin) (RecordCheckinResult, error) {
	now := h.now()
	c, err := domain.NewCheckin(cmd.Input, now, h.newID)
	if err != nil {
		return RecordCheckinResult{}, err
	}
	rec := IdempotencyRecord{Fingerprint: cmd.Input.Fingerprint(), Checkin: c, RecordedAt: now.UnixMilli()}
	existing, err := h.idem.Reserve(ctx, rec)
	if err != nil {
		return RecordCheckinResult{}, fmt.Errorf("reserve checkinId %q: %w: %w", c.ID, domain.ErrUnavailable, err)
	}
	if existing != nil {
		if existing.Fingerprint != rec.Fingerprint {
			return RecordCheckinResult{}, fmt.Errorf("checkinId %q: %w", c.ID, domain.ErrConflict)
		}
		if existing.Published {
			return RecordCheckinResult{Checkin: existing.Checkin, Replayed: true}, nil
		}
		// An earlier attempt reserved the ID but may have died before the event was stored:
		// publish the original again. Projections dedupe by checkinId, so this cannot count twice.
		rec = *existing
	}
	ev := domain.CheckinRecorded{Checkin: rec.Checkin, RecordedAt: rec.RecordedAt}
	if err := h.publisher.PublishCheckinRecorded(ctx, ev, cmd.CorrelationID); err != nil {
		return RecordCheckinResult{}, fmt.Errorf("publish %s %q: %w: %w", domain.EventCheckinRecorded, c.ID, domain.ErrUnavailable, err)
	}
	if err := h.idem.MarkPublished(ctx, rec); err != nil {
		// The event is stored, which is what the answer promises; a retry would publish a
		// duplicate that projections ignore.
		h.log.WarnContext(ctx, "could not mark check-in as published", "checkin_id", rec.Checkin.ID, "error", err)
	}
	return RecordCheckinResult{Checkin: rec.Checkin, Replayed: existing != nil}, nil
}
