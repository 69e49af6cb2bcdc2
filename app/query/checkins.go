// Package query holds the read use cases.
package query

import (
	"context"
	"fmt"

	"github.com/checkins/checkins/domain"
)

// RecordedCheckin is a check-in as the event stream holds it.
type RecordedCheckin struct {
	EntryID string // stream entry ID; its time part is when the check-in was recorded
	domain.CheckinRecorded
}

// CheckinPage is one page of a time-range listing; Next continues it ("" when done).
type CheckinPage struct {
	Checkins []RecordedCheckin
	Next     string
}

// EventLog reads check-ins straight from the event stream.
type EventLog interface {
	// Latest is the newest valid check-in; domain.ErrNotFound when there is none.
	Latest(ctx context.Context) (RecordedCheckin, error)
	// Range lists check-ins recorded in [fromMs, toMs], oldest first, after the cursor.
	Range(ctx context.Context, fromMs, toMs int64, cursor string, limit int) (CheckinPage, error)
	// Newest lists the newest check-ins recorded at or after sinceMs, newest first, at most limit.
	Newest(ctx context.Context, sinceMs int64, limit int) ([]RecordedCheckin, error)
}

// Checkins answers questions about the recorded check-ins.
type Checkins struct {
	log EventLog
}

// NewCheckins reads from log.
func NewCheckins(log EventLog) Checkins { return Checkins{log: log} }

// Latest is the newest check-in on the stream.
func (q Checkins) Latest(ctx context.Context) (RecordedCheckin, error) { return q.log.Latest(ctx) }

// Newest is at most limit check-ins recorded at or after sinceMs (ms since epoch), newest first:
// read from the end of the stream, so a busy minute still shows what came last.
func (q Checkins) Newest(ctx context.Context, sinceMs int64, limit int) ([]RecordedCheckin, error) {
	if sinceMs < 0 {
		return nil, &domain.ValidationError{Code: domain.CodeOutOfRange, Field: "since", Message: "must be >= 0"}
	}
	if limit < 1 || limit > domain.MaxPageLimit {
		return nil, &domain.ValidationError{Code: domain.CodeOutOfRange, Field: "limit", Message: fmt.Sprintf("must be from 1 to %d, got %d", domain.MaxPageLimit, limit)}
	}
	return q.log.Newest(ctx, sinceMs, limit)
}

// RangeQuery selects check-ins recorded between From and To (ms since epoch, inclusive).
type RangeQuery struct {
	From, To int64
	Limit    int
	Cursor   string
}

// Range validates the query and reads one page.
func (q Checkins) Range(ctx context.Context, r RangeQuery) (CheckinPage, error) {
	if r.From < 0 {
		return CheckinPage{}, &domain.ValidationError{Code: domain.CodeOutOfRange, Field: "from", Message: "must be >= 0"}
	}
	if r.To < r.From {
		return CheckinPage{}, &domain.ValidationError{Code: domain.CodeOutOfRange, Field: "to", Message: fmt.Sprintf("must be >= from (%d), got %d", r.From, r.To)}
	}
	if r.Limit == 0 {
		r.Limit = domain.DefaultPageLimit
	}
	if r.Limit < 1 || r.Limit > domain.MaxPageLimit {
		return CheckinPage{}, &domain.ValidationError{Code: domain.CodeOutOfRange, Field: "limit", Message: fmt.Sprintf("must be from 1 to %d, got %d", domain.MaxPageLimit, r.Limit)}
	}
	return q.log.Range(ctx, r.From, r.To, r.Cursor, r.Limit)
}
