package domain

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"strconv"
	"time"
)

// Limits of a valid check-in.
const (
	MinStarRating   = 0
	MaxStarRating   = 5
	MaxCheckinIDLen = 128
	MaxFutureSkew   = 5 * time.Minute
	// MaxTimestamp is the last millisecond of the year 9999 (UTC). Later values are no time
	// anyone checks in at, and every timestamp up to it stays exact as a float64 (the Redis
	// scripts compare them as numbers) and far from int64 overflow.
	MaxTimestamp     = 253402300799999
	DefaultPageLimit = 100
	MaxPageLimit     = 1000
)

// Checkin is a person checking in at a place with a star rating.
type Checkin struct {
	ID         string // business ID, unique, client-supplied or generated
	UserID     int64
	LocationID int64
	StarRating int
	Timestamp  int64 // when it happened, ms since epoch
}

// CheckinInput is what a client may send; nil means absent.
type CheckinInput struct {
	CheckinID  *string
	UserID     *int64
	LocationID *int64
	StarRating *int64
	Timestamp  *int64
}

// NewCheckin validates input; now is used for the default timestamp and the future bound, and
// newID supplies a checkinId when the client sent none.
func NewCheckin(in CheckinInput, now time.Time, newID func() string) (Checkin, error) {
	if in.UserID == nil {
		return Checkin{}, invalid(CodeRequired, "userId", "is required")
	}
	if *in.UserID < 1 {
		return Checkin{}, invalid(CodeOutOfRange, "userId", "must be an integer >= 1, got %d", *in.UserID)
	}
	if in.LocationID == nil {
		return Checkin{}, invalid(CodeRequired, "locationId", "is required")
	}
	if *in.LocationID < 1 {
		return Checkin{}, invalid(CodeOutOfRange, "locationId", "must be an integer >= 1, got %d", *in.LocationID)
	}
	if in.StarRating == nil {
		return Checkin{}, invalid(CodeRequired, "starRating", "is required")
	}
	if *in.StarRating < MinStarRating || *in.StarRating > MaxStarRating {
		return Checkin{}, invalid(CodeOutOfRange, "starRating", "must be an integer from %d to %d, got %d", MinStarRating, MaxStarRating, *in.StarRating)
	}
	c := Checkin{UserID: *in.UserID, LocationID: *in.LocationID, StarRating: int(*in.StarRating), Timestamp: now.UnixMilli()}
	if in.Timestamp != nil {
		if *in.Timestamp < 1 || *in.Timestamp > MaxTimestamp {
			return Checkin{}, invalid(CodeOutOfRange, "timestamp", "must be milliseconds since the epoch from 1 to %d (9999-12-31T23:59:59.999Z), got %d", int64(MaxTimestamp), *in.Timestamp)
		}
		// In milliseconds, saturating: now may come from an event (its recordedAt) and be as late
		// as MaxTimestamp, and nothing here may overflow into a wrong message.
		nowMs := min(max(now.UnixMilli(), 0), MaxTimestamp)
		if limit := nowMs + MaxFutureSkew.Milliseconds(); *in.Timestamp > limit {
			return Checkin{}, invalid(CodeOutOfRange, "timestamp", "is %d ms in the future; at most %s ahead is accepted", *in.Timestamp-nowMs, MaxFutureSkew)
		}
		c.Timestamp = *in.Timestamp
	}
	if in.CheckinID != nil {
		if err := ValidateCheckinID(*in.CheckinID); err != nil {
			return Checkin{}, err
		}
		c.ID = *in.CheckinID
	} else {
		c.ID = newID()
	}
	return c, nil
}

// ValidateCheckinID accepts 1-128 characters of letters, digits and . _ : -
func ValidateCheckinID(id string) error {
	if id == "" {
		return invalid(CodeRequired, "checkinId", "must not be empty")
	}
	// The characters first: with them all ASCII, the length in bytes is the length a client
	// counted (65 "é" were "at most 128 characters, got 130").
	for _, r := range id {
		ok := r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_' || r == '.' || r == ':'
		if !ok {
			return invalid(CodeInvalid, "checkinId", "may contain only letters, digits and . _ : - (got %q)", r)
		}
	}
	if len(id) > MaxCheckinIDLen {
		return invalid(CodeOutOfRange, "checkinId", "must be at most %d characters, got %d", MaxCheckinIDLen, len(id))
	}
	return nil
}

// Fingerprint identifies what the client asked for, so a retry of the same request is told apart
// from a different check-in reusing the checkinId. An absent timestamp stays absent: a retry a
// second later without one is still the same request.
func (in CheckinInput) Fingerprint() string {
	h := sha256.New()
	for _, v := range []*int64{in.UserID, in.LocationID, in.StarRating, in.Timestamp} {
		if v == nil {
			h.Write([]byte("-|"))
			continue
		}
		h.Write([]byte(strconv.FormatInt(*v, 10) + "|"))
	}
	return hex.EncodeToString(h.Sum(nil)[:16])
}

// Identity tells check-ins apart: two check-ins are the same one when they carry the same
// checkinId and the same content (user, location, rating, timestamp), however often and whenever
// they were recorded. Projections count each identity once, so a retried publish counts once
// while a checkinId reused with another body is another check-in, counted by every projection.
// It is the first 63 bits of SHA-256 over the fields, a non-negative integer: compact to keep
// in Redis, and infeasible to forge into another check-in's identity.
func (c Checkin) Identity() int64 {
	b := make([]byte, 0, len(c.ID)+64)
	b = append(b, c.ID...)
	for _, v := range []int64{c.UserID, c.LocationID, int64(c.StarRating), c.Timestamp} {
		b = append(b, '|')
		b = strconv.AppendInt(b, v, 10)
	}
	sum := sha256.Sum256(b)
	return int64(binary.BigEndian.Uint64(sum[:8]) >> 1)
}
