package ops

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// Processing groups ("live groups"): the projection versions a projector runs together consume
// the stream through one consumer group, so each entry is read, decoded and acknowledged once
// for all of them. A version joins its live group at a stream position J: entries after J reach
// it through the live group; entries up to J through its own group, <name>.v<N>, which starts at
// the beginning of the stream (a backfill, a rebuild) or where the service's earlier layout left
// it (an upgrade), and is removed once it has delivered and acknowledged everything up to J.

// LiveMember is one projection version's membership of a live group.
type LiveMember struct {
	// Join: entries after it reach the version through the live group.
	Join string `json:"join"`
	// Own is BackfillRunning while the version's own group still delivers entries up to Join,
	// BackfillDone after.
	Own string `json:"own"`
	// DoneAt (ms, as a string) is when the backfill was found finished.
	DoneAt string `json:"doneAt,omitempty"`
	// Legacy: entries up to it may have been applied under the earlier layout's dedupe sets
	// (an upgrade); they are checked there too.
	Legacy string `json:"legacy,omitempty"`
	// Removing: its finished backfill's own group is destroyed, and what it left (markers, the
	// stall check's observation, an earlier layout's sets) is being removed by the run that
	// holds this mark ("<token> <since, ms>"); a disband waits. "" when not.
	Removing RemovalMark `json:"removing,omitempty"`
	// Added is how many entries the stream had ever taken (XINFO STREAM entries-added) at Join,
	// in decimal; "" when Redis did not tell (before 7.0, the embedded miniredis) or the version
	// joined with nothing to backfill. See BackfillLag.
	Added string `json:"added,omitempty"`
	// Parts, with stream partitions (P > 1), is the membership on each partition, by the
	// partition's stream: a version joins each partition at a position of that partition.
	// The fields above then sum them up (Own is BackfillRunning while any partition's backfill
	// runs, Join the latest join); nil with one stream.
	Parts map[string]LiveMember `json:"-"`
	// Missing, with stream partitions, is how many partitions the version is not a member of:
	// a join under way, or one Redis lost (a failover before the join reached the replica).
	// Own is then never BackfillDone: a version missing a partition has none of its entries.
	Missing int `json:"-"`
}

// On is the membership on partition stream: m itself with one stream; ok is false when the
// version has not joined that partition (yet).
func (m LiveMember) On(stream string) (LiveMember, bool) {
	if m.Parts == nil {
		return m, true
	}
	p, ok := m.Parts[stream]
	return p, ok
}

// SumMembers sums up one version's membership on several partitions (see LiveMember.Parts).
func SumMembers(parts map[string]LiveMember) LiveMember {
	sum := LiveMember{Own: BackfillDone, Parts: parts}
	for _, p := range parts {
		if sum.Join == "" || CompareEntryIDs(p.Join, sum.Join) > 0 {
			sum.Join = p.Join
		}
		if p.Own != BackfillDone {
			sum.Own = p.Own
		}
		if len(p.DoneAt) > len(sum.DoneAt) || len(p.DoneAt) == len(sum.DoneAt) && p.DoneAt > sum.DoneAt {
			sum.DoneAt = p.DoneAt
		}
		if p.Legacy != "" {
			sum.Legacy = p.Legacy
		}
		if p.Removing != "" {
			sum.Removing = p.Removing
		}
	}
	if sum.Own != BackfillDone {
		sum.DoneAt = ""
	}
	return sum
}

// Backfill states of LiveMember.Own.
const (
	BackfillRunning = "running"
	BackfillDone    = "done"
)

// Membership is a live group's members, by "<name>.v<N>". Raw is the registry value it was
// parsed from, so a reader can tell cheaply whether it changed.
type Membership struct {
	Raw     string
	Members map[string]LiveMember
	// Joins, where read with it (a projector's every batch), changes whenever a version joins
	// any live group of the registries: the registry floors computed before may not account for
	// its backfill.
	Joins string
}

// MemberName is how a projection version is named in a membership (and its own group).
func MemberName(name string, version int) string { return name + ".v" + strconv.Itoa(version) }

// ParseMemberName reads "users.v2" as ("users", 2).
func ParseMemberName(s string) (string, int, bool) {
	i := strings.LastIndex(s, ".v")
	if i <= 0 {
		return "", 0, false
	}
	v, err := strconv.Atoi(s[i+2:])
	if err != nil || v < 1 {
		return "", 0, false
	}
	return s[:i], v, true
}

// MemberOf finds the live group a projection version is a member of.
func MemberOf(groups map[string]Membership, member string) (string, LiveMember, bool) {
	for g, ms := range groups {
		if m, ok := ms.Members[member]; ok {
			return g, m, true
		}
	}
	return "", LiveMember{}, false
}

// BackfillLag is how many entries m's backfill still has to read up to its join position, from
// its own group g: the group's lag counts the entries after the join too, which the live group
// feeds, so during a long rebuild under load it never came near 0 however close the backfill
// was to its end. Summed over the partitions whose backfill runs. ok is false when it cannot be
// told exactly (a join recorded without Added, a partition without the group, or a group whose
// entries-read Redis does not know): callers then report the group's lag.
func BackfillLag(m LiveMember, g *GroupInfo) (int64, bool) {
	if g == nil {
		return 0, false
	}
	one := func(lm LiveMember, gi GroupInfo) (int64, bool) {
		if lm.Own != BackfillRunning {
			return 0, true
		}
		added, err := strconv.ParseInt(lm.Added, 10, 64)
		if err != nil || !gi.Counted {
			return 0, false // entries-read unknown reads as 0: "to go" would be the whole history
		}
		return max(0, added-gi.EntriesRead), true
	}
	if m.Parts == nil {
		return one(m, *g)
	}
	if m.Missing > 0 {
		return 0, false
	}
	var sum int64
	for stream, lm := range m.Parts {
		gi, ok := g.On(stream)
		if !ok && lm.Own == BackfillRunning {
			return 0, false
		}
		n, ok := one(lm, gi)
		if !ok {
			return 0, false
		}
		sum += n
	}
	return sum, true
}

// InAnotherLiveGroupError: a join found the member in another live group of the registry
// (checked in the join itself, so two processes joining it to two groups at once cannot both
// succeed); Group names that group.
type InAnotherLiveGroupError struct{ Group string }

func (e *InAnotherLiveGroupError) Error() string {
	return fmt.Sprintf("the member is in live group %q already", e.Group)
}

// Moved is a projection version taken out of a live group by a disband (command.DisbandLiveGroup)
// and not yet joined to another: its own group holds its position, and feeds it from there
// once a projector that runs it joins it to its live group.
type Moved struct {
	// From is the live group it left.
	From string `json:"from"`
	// At is when (Unix ms, as a string).
	At string `json:"at"`
	// Pos is where the version's own group starts on that partition: where the live group had
	// delivered (and acknowledged) through, or the version's join where that was later.
	Pos string `json:"pos"`
	// Legacy is the membership's Legacy (an upgrade's earlier layout), carried to its next join
	// so that its sets are still removed after that backfill.
	Legacy string `json:"legacy,omitempty"`
}

// DisbandReport is what disbanding a live group did, or would do.
type DisbandReport struct {
	Group string `json:"group"`
	// Members are the projection versions it fed, sorted: each has its own group now.
	Members []string `json:"members"`
	// Positions is, per partition's stream, where the group had delivered through.
	Positions map[string]string `json:"positions"`
	// Done is false for a check that changed nothing (--dry-run).
	Done bool `json:"done"`
	// Unfinished: the group was disbanded before, and removing its markers was cut short.
	Unfinished bool `json:"unfinished,omitempty"`
}

// ErrDisbandRefused: the live group cannot be disbanded now; the error says why and what to do.
var ErrDisbandRefused = errors.New("cannot disband the live group")

// DropReport is what dropping a moved version did, or would do (command.DropMovedVersion).
type DropReport struct {
	// Member is the projection version, <name>.v<N>.
	Member string `json:"member"`
	// Positions is, per partition's stream, where its own group stood: what its read model
	// had applied.
	Positions map[string]string `json:"positions"`
	// Resumed: a drop begun earlier (cut short) was finished.
	Resumed bool `json:"resumed,omitempty"`
	// KeysRemoved is how many keys of its read model and markers went.
	KeysRemoved int64 `json:"keysRemoved"`
	// Done is false for a check that changed nothing (--dry-run).
	Done bool `json:"done"`
}

// ErrDisbandUnfinished: a join found the live group disbanded with its markers not yet removed.
var ErrDisbandUnfinished = errors.New("live group's disband is unfinished")

// ErrVersionRetired: a join of a version below the one its projection serves (a rebuild
// retired it).
var ErrVersionRetired = errors.New("projection version was retired by a rebuild")

// ErrDropUnfinished: a join found the version's drop begun and not finished.
var ErrDropUnfinished = errors.New("projection version's drop is unfinished")

// ErrDropRefused: the version cannot be dropped now; the error says why and what to do.
var ErrDropRefused = errors.New("cannot drop the projection version")

// RemovalMark is LiveMember.Removing. A build of 2026-12-07 wrote it as true: that reads as a
// mark held by none, which the next run takes up.
type RemovalMark string

// UnmarshalJSON reads a mark, or the boolean of that build.
func (r *RemovalMark) UnmarshalJSON(b []byte) error {
	switch string(b) {
	case "true":
		*r = "unknown 0"
		return nil
	case "false", "null":
		*r = ""
		return nil
	}
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("a removal mark must be a string: %w", err)
	}
	*r = RemovalMark(s)
	return nil
}
