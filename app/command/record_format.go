package command

import (
	"context"
	"errors"

	"github.com/checkins/checkins/app/ops"
)

// RecordFormat reads and switches the format in which the API processes write the idempotency
// records of published check-ins (ops.RecordFormatJSON or ops.RecordFormatCompact). A new
// deployment writes compact records from the start. One that earlier releases served writes
// JSON, which they read, until an operator switches it once every API process runs a release
// that reads compact records; records of both formats answer retries alike.
type RecordFormat struct {
	records ops.IdempotencyRecords
}

// NewRecordFormat is the use case on records.
func NewRecordFormat(records ops.IdempotencyRecords) (*RecordFormat, error) {
	if records == nil {
		return nil, errors.New("command: RecordFormat needs the idempotency records")
	}
	return &RecordFormat{records: records}, nil
}

// Get is the format written now.
func (c *RecordFormat) Get(ctx context.Context) (string, error) { return c.records.Format(ctx) }

// Set switches to format and returns the one written before. The API processes follow at their
// next look, within a minute.
func (c *RecordFormat) Set(ctx context.Context, format string) (before string, err error) {
	if err := ops.CheckRecordFormat(format); err != nil {
		return "", err
	}
	if before, err = c.records.Format(ctx); err != nil {
		return "", err
	}
	// Written even when it reads so already: with none recorded, Format says what the first
	// check-in would record, and that may change before it comes (a stream copied in before the
	// API starts reads as served, JSON), dropping the switch (found by a review).
	return before, c.records.SetFormat(ctx, format)
}
