// Package domain holds the check-in, its validation, its events and typed errors. It imports
// nothing of ours and no infrastructure.
package domain

import (
	"errors"
	"fmt"
)

// Error codes are short, stable and machine-readable; ports map them to HTTP statuses.
const (
	CodeRequired      = "required"
	CodeOutOfRange    = "out_of_range"
	CodeInvalid       = "invalid"
	CodeConflict      = "conflict"
	CodeNotFound      = "not_found"
	CodeUnavailable   = "unavailable"
	CodeNotReplicated = "not_replicated"
	CodeInvalidEvent  = "invalid_event"
)

// Sentinel errors: test with errors.Is.
var (
	ErrNotFound = errors.New("not found")
	// ErrConflict means a check-in with this checkinId exists with a different body.
	ErrConflict = errors.New("checkinId already used with a different check-in")
	// ErrUnavailable means the event store or a read model could not be reached.
	ErrUnavailable = errors.New("storage unavailable")
	// ErrNotReplicated means the event was written, but fewer replicas than required confirmed
	// it in time: it may be lost in a failover, so it is not acknowledged.
	ErrNotReplicated = errors.New("event not confirmed by enough replicas")
	// ErrMigrating means a partition migration holds the event stream: what would write to it,
	// trim it or add consumer groups to it waits until the migration is done.
	ErrMigrating = errors.New("the event stream is being migrated to another partition count")
)

// ValidationError names the field and the problem; it carries a machine-readable code.
type ValidationError struct {
	Code    string
	Field   string
	Message string
}

func (e *ValidationError) Error() string {
	if e.Field == "" {
		return e.Message
	}
	return fmt.Sprintf("%s: %s", e.Field, e.Message)
}

func invalid(code, field, format string, args ...any) *ValidationError {
	return &ValidationError{Code: code, Field: field, Message: fmt.Sprintf(format, args...)}
}
