package ops

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/checkins/checkins/app/projection"
	"github.com/checkins/checkins/domain"
)

// Values of PoisonEntry.Decision.
const (
	DecisionCounted   = "counted"
	DecisionDuplicate = "duplicate"
)

// PoisonEntry is one event a projection gave up on.
type PoisonEntry struct {
	ID         string            `json:"id"` // entry ID in the poison stream
	Stream     string            `json:"stream"`
	EntryID    string            `json:"entryId"` // original entry ID in Stream
	Projection string            `json:"projection"`
	Group      string            `json:"group,omitempty"`   // consumer group, e.g. live or users.v2
	Version    int               `json:"version,omitempty"` // projection version that failed (0: older entries, see Group)
	Error      string            `json:"error"`
	Attempts   int               `json:"attempts"`
	FailedAt   time.Time         `json:"failedAt"`
	Fields     map[string]string `json:"fields"` // the original entry, unchanged
	// Decision is DecisionCounted or DecisionDuplicate: whether this copy of the check-in counts,
	// as decided when it was parked ("" when it was not decided). A replay keeps it, whatever
	// the dedupe registry has forgotten since.
	Decision string `json:"decision,omitempty"`
	// ParkedAt is when the entry was first parked, in Unix milliseconds of the Redis server's
	// clock (the time of its first poison entry ID; a re-park after a failed replay keeps it).
	// A replay tells a build's own parked entries from an earlier build's by it, against
	// BuildStart.At, which is of the server's clock too.
	ParkedAt int64 `json:"-"`
}

// UnitRef names one unit of a stream entry: the entry (its stream and ID) as a consumer group
// delivered it, for one member (a projection version, "<name>.v<N>"; "" for an entry that is no
// event, parked once for the group).
type UnitRef struct {
	Group, Stream, Entry, Member string
}

// Unit is the unit e parked.
func (e PoisonEntry) Unit() UnitRef {
	u := UnitRef{Group: e.Group, Stream: e.Stream, Entry: e.EntryID}
	if e.Projection != "" && e.Version > 0 {
		u.Member = MemberName(e.Projection, e.Version)
	}
	return u
}

// DecisionRef is e's decision as EventRef.Decision.
func (e PoisonEntry) DecisionRef() projection.Decision {
	switch e.Decision {
	case DecisionCounted:
		return projection.DecidedCounted
	case DecisionDuplicate:
		return projection.DecidedDuplicate
	}
	return projection.Undecided
}

// ValidateCursor checks that c ("" is fine) is a poison entry ID; the error names field.
func ValidateCursor(field, c string) error {
	if c == "" {
		return nil
	}
	if _, ok := EntryTime(c); !ok || strings.Count(c, "-") != 1 {
		return &domain.ValidationError{Code: domain.CodeInvalid, Field: field, Message: fmt.Sprintf("is not a poison entry ID like 1700000000000-0: %q", c)}
	}
	if _, err := strconv.ParseUint(c[strings.Index(c, "-")+1:], 10, 64); err != nil {
		return &domain.ValidationError{Code: domain.CodeInvalid, Field: field, Message: fmt.Sprintf("is not a poison entry ID like 1700000000000-0: %q", c)}
	}
	return nil
}
