package ops

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// StreamInfo is what the backend says about the event stream and its consumer groups.
type StreamInfo struct {
	Stream string
	Exists bool
	Length int64
	// EntriesAdded is how many entries were ever added (XINFO STREAM entries-added; summed
	// over partitions): unlike Length it does not fall when the stream is trimmed. 0 when the
	// server does not tell (before Redis 7.0).
	EntriesAdded int64
	LastEntryID  string
	Groups       []GroupInfo
}

// Group finds a consumer group by name (nil when it does not exist).
func (s StreamInfo) Group(name string) *GroupInfo {
	for i := range s.Groups {
		if s.Groups[i].Name == name {
			return &s.Groups[i]
		}
	}
	return nil
}

// GroupInfo is one consumer group (XINFO GROUPS, XINFO CONSUMERS, XPENDING).
type GroupInfo struct {
	Name            string
	LastDeliveredID string
	EntriesRead     int64
	// Lag is the number of entries not yet delivered to the group; -1 when Redis cannot tell
	// (entries were deleted from the middle of the stream) or is older than 7.0.
	Lag int64
	// Counted: Redis told the group's entries-read and lag itself (Redis 7, unless the group
	// was created at an ID in mid-stream or entries were deleted from the middle); Lag may then
	// still be a count this process made. With partitions, on every partition.
	Counted   bool
	Pending   int64
	Consumers []ConsumerInfo
	// Oldest pending entry: its ID, how long since it was last delivered, delivery count and
	// owner. Zero when nothing is pending.
	OldestPendingID         string
	OldestPendingIdle       time.Duration
	OldestPendingDeliveries int64
	OldestPendingConsumer   string
	// Parts, with stream partitions (P > 1), is the group on each partition, by the
	// partition's stream; the fields above sum them up (see StreamAdmin.Info). nil with one
	// stream.
	Parts map[string]GroupInfo
	// Missing, in Parts only: the partition exists and the group does not there (a master that
	// came back empty); everything on it is undelivered, so its Lag is the partition's length.
	Missing bool
}

// On is the group on partition stream: g itself with one stream; ok is false when the group
// does not exist on that partition.
func (g GroupInfo) On(stream string) (GroupInfo, bool) {
	if g.Parts == nil {
		return g, true
	}
	p, ok := g.Parts[stream]
	return p, ok && !p.Missing
}

// ConsumerInfo is one consumer of a group.
type ConsumerInfo struct {
	Name    string
	Pending int64
	Idle    time.Duration // since its last attempted interaction (read or claim)
}

// GroupPosition is how far one consumer group got.
type GroupPosition struct {
	LastDeliveredID string
	Pending         int64
	// AckedThrough: every entry up to it is acknowledged (just before the oldest pending
	// entry, or the last delivered one when nothing is pending).
	AckedThrough string
	// Parts, with stream partitions (P > 1): the group on each partition where it exists, by
	// the partition's stream. Pending is then the sum, AckedThrough the least of them (every
	// partition acknowledged through it), LastDeliveredID the latest. nil with one stream.
	Parts map[string]GroupPosition
}

// On is the group's position on partition stream (itself with one stream).
func (g GroupPosition) On(stream string) (GroupPosition, bool) {
	if g.Parts == nil {
		return g, true
	}
	p, ok := g.Parts[stream]
	return p, ok
}

// SumPositions sums up a group's positions on several partitions (see GroupPosition.Parts).
func SumPositions(parts map[string]GroupPosition) GroupPosition {
	sum := GroupPosition{Parts: parts}
	for _, p := range parts {
		sum.Pending += p.Pending
		if sum.AckedThrough == "" || CompareEntryIDs(p.AckedThrough, sum.AckedThrough) < 0 {
			sum.AckedThrough = p.AckedThrough
		}
		if sum.LastDeliveredID == "" || CompareEntryIDs(p.LastDeliveredID, sum.LastDeliveredID) > 0 {
			sum.LastDeliveredID = p.LastDeliveredID
		}
	}
	return sum
}

// LagCountCap bounds the count of a lag the server cannot tell; beyond it, the cap is
// reported (a lower bound).
const LagCountCap = 10000

// GroupLag is the number of entries not yet delivered to g. Redis 7 reports it unless entries
// were deleted from the middle of the stream; then they are counted, up to LagCountCap.
func GroupLag(ctx context.Context, s Stream, info StreamInfo, g *GroupInfo) (int64, error) {
	// Delivered up to the newest entry means nothing is undelivered, whatever the counter says
	// (the embedded miniredis does not keep it).
	if g.LastDeliveredID == info.LastEntryID || info.Length == 0 {
		return 0, nil
	}
	if g.Lag >= 0 {
		return g.Lag, nil
	}
	n, err := s.CountAfter(ctx, g.LastDeliveredID, LagCountCap)
	if err != nil {
		return 0, fmt.Errorf("count lag of %s: %w", g.Name, err)
	}
	return n, nil
}

// SplitGroup reads "users.v2" as ("users", 2); other names come back whole with version 0.
func SplitGroup(g string) (string, int) {
	i := strings.LastIndex(g, ".v")
	if i < 0 {
		return g, 0
	}
	v, err := strconv.Atoi(g[i+2:])
	if err != nil {
		return g, 0
	}
	return g[:i], v
}
