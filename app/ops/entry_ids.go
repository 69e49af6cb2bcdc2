package ops

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Stream entry IDs are "<ms>-<seq>": the time the entry was added and a sequence number.

// EntryID is a parsed stream entry ID, ordered as the stream orders entries.
type EntryID struct{ Ms, Seq uint64 }

// ParseEntryID reads "ms-seq".
func ParseEntryID(s string) (EntryID, error) {
	ms, seq, ok := strings.Cut(s, "-")
	a, err1 := strconv.ParseUint(ms, 10, 64)
	b, err2 := strconv.ParseUint(seq, 10, 64)
	if !ok || err1 != nil || err2 != nil {
		return EntryID{}, fmt.Errorf("not a stream entry ID: %q", s)
	}
	return EntryID{a, b}, nil
}

func (id EntryID) String() string {
	return strconv.FormatUint(id.Ms, 10) + "-" + strconv.FormatUint(id.Seq, 10)
}

// Next is the smallest ID after id.
func (id EntryID) Next() EntryID {
	if id.Seq == ^uint64(0) {
		return EntryID{id.Ms + 1, 0}
	}
	return EntryID{id.Ms, id.Seq + 1}
}

// Less orders IDs as the stream does.
func (id EntryID) Less(o EntryID) bool {
	return id.Ms < o.Ms || id.Ms == o.Ms && id.Seq < o.Seq
}

// MinEntryID is the smaller of a and b.
func MinEntryID(a, b EntryID) EntryID {
	if a.Less(b) {
		return a
	}
	return b
}

// CompareEntryIDs orders two stream entry IDs (-1, 0, 1); malformed IDs sort first.
func CompareEntryIDs(a, b string) int {
	am, as, _ := strings.Cut(a, "-")
	bm, bs, _ := strings.Cut(b, "-")
	x, _ := strconv.ParseUint(am, 10, 64)
	y, _ := strconv.ParseUint(bm, 10, 64)
	if x != y {
		if x < y {
			return -1
		}
		return 1
	}
	p, _ := strconv.ParseUint(as, 10, 64)
	q, _ := strconv.ParseUint(bs, 10, 64)
	switch {
	case p < q:
		return -1
	case p > q:
		return 1
	}
	return 0
}

// PrevEntryID is the greatest entry ID below id ("0-0" has none).
func PrevEntryID(id string) (string, bool) {
	ms, seq, ok := strings.Cut(id, "-")
	m, err1 := strconv.ParseUint(ms, 10, 64)
	s, err2 := strconv.ParseUint(seq, 10, 64)
	if !ok || err1 != nil || err2 != nil {
		return "", false
	}
	switch {
	case s > 0:
		return fmt.Sprintf("%d-%d", m, s-1), true
	case m > 0:
		return fmt.Sprintf("%d-%d", m-1, uint64(1<<64-1)), true
	default:
		return "0-0", true
	}
}

// EntryTime is the time encoded in a stream entry ID (when the entry was added).
func EntryTime(id string) (time.Time, bool) {
	ms, _, ok := strings.Cut(id, "-")
	n, err := strconv.ParseInt(ms, 10, 64)
	if !ok || err != nil {
		return time.Time{}, false
	}
	return time.UnixMilli(n).UTC(), true
}
