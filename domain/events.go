package domain

import (
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Event names are past tense, versioned and stable once shipped.
const (
	EventCheckinRecorded = "checkin.recorded.v1"
)

// Event is anything that happened and is recorded on the stream.
type Event interface {
	EventName() string
}

// CheckinRecorded says a check-in was accepted.
type CheckinRecorded struct {
	Checkin
	RecordedAt int64 // ms since epoch when the API accepted it
	// Fingerprint is CheckinInput.Fingerprint of the request that recorded it: the body as the
	// client sent it, a timestamp it left out included. "" for events from elsewhere.
	Fingerprint string
}

// Identity tells check-ins apart for the projections' dedupe. An event the API recorded is
// identified by its checkinId and the body the client sent (Fingerprint): a client that sends
// the same body again, even after IDEMPOTENCY_TTL and without a timestamp of its own (the API
// then stamps another time), sends the same check-in (a duplicate to the projections while it is
// within DEDUPE_WINDOW of the counted one). An event without a fingerprint (written by
// another producer, or before the field existed) is identified by its checkinId and content
// (Checkin.Identity). Both are the first 63 bits of a SHA-256, a non-negative integer.
func (e CheckinRecorded) Identity() int64 {
	if e.Fingerprint == "" {
		return e.Checkin.Identity()
	}
	b := make([]byte, 0, len(e.ID)+len(e.Fingerprint)+4)
	b = append(b, "fp|"...)
	b = append(b, e.ID...)
	b = append(b, '|')
	b = append(b, e.Fingerprint...)
	sum := sha256.Sum256(b)
	return int64(binary.BigEndian.Uint64(sum[:8]) >> 1)
}

// EventName implements Event.
func (CheckinRecorded) EventName() string { return EventCheckinRecorded }

// Field names of an event on the stream: flat, readable with plain XRANGE.
const (
	FieldType       = "type"
	FieldCheckinID  = "checkinId"
	FieldUserID     = "userId"
	FieldLocationID = "locationId"
	FieldStarRating = "starRating"
	FieldTimestamp  = "timestamp"
	FieldRecordedAt = "recordedAt"
	// FieldFingerprint is optional: CheckinRecorded.Fingerprint.
	FieldFingerprint = "fingerprint"
)

// Fields is the flat form of the event.
func (e CheckinRecorded) Fields() map[string]string {
	f := map[string]string{
		FieldType:       EventCheckinRecorded,
		FieldCheckinID:  e.ID,
		FieldUserID:     strconv.FormatInt(e.UserID, 10),
		FieldLocationID: strconv.FormatInt(e.LocationID, 10),
		FieldStarRating: strconv.Itoa(e.StarRating),
		FieldTimestamp:  strconv.FormatInt(e.Timestamp, 10),
		FieldRecordedAt: strconv.FormatInt(e.RecordedAt, 10),
	}
	if e.Fingerprint != "" {
		f[FieldFingerprint] = e.Fingerprint
	}
	return f
}

// ParseEvent decodes the flat form written by Fields, validating it as strictly as the API does,
// because anyone can XADD to the stream.
// entryID is the stream entry's ID ("<ms>-<seq>"): the time Redis recorded an entry that
// carries no recordedAt (one a producer wrote by hand), by which its timestamp is bounded.
func ParseEvent(entryID string, f map[string]string) (Event, error) {
	switch t := f[FieldType]; t {
	case EventCheckinRecorded:
		e, err := parseCheckinRecorded(entryID, f)
		if err != nil {
			return nil, err // never a zero event beside an error
		}
		return e, nil
	case "":
		return nil, invalid(CodeInvalidEvent, FieldType, "missing event type")
	default:
		return nil, invalid(CodeInvalidEvent, FieldType, "unknown event type %q", t)
	}
}

func parseCheckinRecorded(entryID string, f map[string]string) (CheckinRecorded, error) {
	var in CheckinInput
	for _, p := range []struct {
		name string
		dst  **int64
	}{{FieldUserID, &in.UserID}, {FieldLocationID, &in.LocationID}, {FieldStarRating, &in.StarRating}, {FieldTimestamp, &in.Timestamp}} {
		s, ok := f[p.name]
		if !ok {
			return CheckinRecorded{}, invalid(CodeInvalidEvent, p.name, "is missing")
		}
		v, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return CheckinRecorded{}, invalid(CodeInvalidEvent, p.name, "is not an integer: %q", s)
		}
		*p.dst = &v
	}
	id, ok := f[FieldCheckinID]
	if !ok {
		return CheckinRecorded{}, invalid(CodeInvalidEvent, FieldCheckinID, "is missing")
	}
	in.CheckinID = &id
	// The future bound protects the read models from clock-skewed clients; an event already
	// recorded is judged against when it was recorded, not against now, so old events replay
	// fine: its recordedAt, or for an entry a producer wrote without one, the time Redis gave
	// it in its entry ID. (Bounding by the timestamp itself, as before, let such an entry set a
	// user's latest check-in to the year 9999 for good.)
	// A recordedAt of 0 is none (what Fields writes for an event that has none).
	recordedAt := int64(0)
	var ref time.Time
	if s, ok := f[FieldRecordedAt]; ok {
		v, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return CheckinRecorded{}, invalid(CodeInvalidEvent, FieldRecordedAt, "is not an integer: %q", s)
		}
		if v < 0 || v > MaxTimestamp {
			return CheckinRecorded{}, invalid(CodeInvalidEvent, FieldRecordedAt, "must be milliseconds since the epoch from 1 to %d (0: none), got %d", int64(MaxTimestamp), v)
		}
		recordedAt, ref = v, time.UnixMilli(v)
	}
	if recordedAt == 0 {
		ms, ok := entryMillis(entryID)
		if !ok {
			return CheckinRecorded{}, invalid(CodeInvalidEvent, FieldRecordedAt, "is missing, and the stream entry ID %q gives no time to bound the timestamp by", entryID)
		}
		ref = time.UnixMilli(ms)
	}
	c, err := NewCheckin(in, ref, nil)
	if err != nil {
		return CheckinRecorded{}, fmt.Errorf("invalid %s event: %w", EventCheckinRecorded, err)
	}
	fp := f[FieldFingerprint]
	if _, ok := f[FieldFingerprint]; ok && !isFingerprint(fp) {
		return CheckinRecorded{}, invalid(CodeInvalidEvent, FieldFingerprint, "must be 32 lowercase hex digits, got %q", fp)
	}
	return CheckinRecorded{Checkin: c, RecordedAt: recordedAt, Fingerprint: fp}, nil
}

// entryMillis is the milliseconds part of a stream entry ID ("<ms>-<seq>").
func entryMillis(id string) (int64, bool) {
	ms, seq, ok := strings.Cut(id, "-")
	if !ok {
		return 0, false
	}
	v, err := strconv.ParseInt(ms, 10, 64)
	if _, serr := strconv.ParseUint(seq, 10, 64); err != nil || serr != nil || v < 0 {
		return 0, false
	}
	return v, true
}

// isFingerprint: what CheckinInput.Fingerprint writes.
func isFingerprint(s string) bool {
	if len(s) != 32 {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}
