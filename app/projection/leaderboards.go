package projection

import (
	"context"
	"fmt"
	"strconv"
	"sync"

	"github.com/checkins/checkins/domain"
)

// Leaderboard limits: how many entries one read may ask for.
const (
	DefaultLeaderboardLimit = 10
	MaxLeaderboardLimit     = 100
)

// Leaderboard orders.
const (
	ByCheckins = "checkins"
	ByRating   = "rating"
)

// Leaderboard key layouts. A layout is fixed for a projection version: a deployment's version of
// an earlier layout keeps being written and read in it until a rebuild (started by itself, see
// Layouts) replaces it with a version of the current one.
const (
	// LeaderboardsSingleSlot is the layout of earlier releases: every key in the one slot {all},
	// one master's hot spot on a cluster.
	LeaderboardsSingleSlot = 1
	// LeaderboardsSharded shards every board over LeaderboardShards slots: the location boards
	// and counts by locationId, the user board by userId.
	LeaderboardsSharded = 2
	// LeaderboardsBoardCounts is the sharded layout with two writes fewer per check-in for Redis:
	// a location's count is its score on the check-ins board (no "<id>:n" field beside it), and
	// its rating score is an integer, floor(stars / count * RatioScale), which a small sorted set
	// keeps as an integer instead of text it parses on every insert. The order is the exact
	// ratings' for locations below 2^24 check-ins each.
	LeaderboardsBoardCounts = 3
	// LeaderboardsLayout is the layout new versions are built in.
	LeaderboardsLayout = LeaderboardsBoardCounts
)

// LeaderboardShards is S, the shards of each board in the sharded layout. A read asks every
// shard for its top `limit` (S ZREVRANGEs of at most 100 in one round trip, then one HMGET per
// shard the merged top came from, in a second), so S is a trade: enough shards to spread over
// the masters, few enough to keep a read small. 24 divides by 1, 2, 3, 4, 6, 8, 12 and 24
// masters (the stream's partition count, for the same reason); with another M every master
// still holds within one shard of S/M. Changing it is a new layout, i.e. a rebuild.
const LeaderboardShards = 24

// leaderboardSlot holds every key of the single-slot layout.
const leaderboardSlot = "all"

// Keys of a leaderboards slot (in the sharded layout each shard has its own of each).
const (
	lbLocationCheckins = "locations_by_checkins" // zset locationId -> check-ins
	lbLocationRating   = "locations_by_rating"   // zset locationId -> average stars (scaled in LeaderboardsBoardCounts), once qualified
	lbLocationCounts   = "location_counts"       // hash "<id>:stars", and "<id>:n" before LeaderboardsBoardCounts
	lbUserCheckins     = "users_by_checkins"     // zset userId -> check-ins
)

// leaderboardShardSlots are the sharded layout's slots, on evenly spaced hash slots (computed
// once, on first use: the tag table takes a few milliseconds).
var leaderboardShardSlots = sync.OnceValue(func() []string { return SpreadTags(LeaderboardShards) })

// Leaderboards ranks locations by check-ins and by average rating, and users by check-ins.
// MinCheckins is how many check-ins a location needs before it enters the rating board, so one
// five-star visit does not top it. It is applied when events are handled: changing it takes a
// rebuild (`checkins projections rebuild leaderboards`).
//
// In the sharded layout a location's entries and counts live in shard ShardOf(locationId) (the
// rating is set from the counts by the same script, so they share its slot), a user's in shard
// ShardOf(userId); a read merges the shards' tops exactly (see mergeTop).
type Leaderboards struct {
	MinCheckins int64
	// Layout is the key layout written and read; 0 is LeaderboardsLayout.
	Layout int
}

// ShardOf is the shard of a board member among s: FNV-1a 64 of its decimal ID, mod s (stable
// across processes, versions and languages).
func ShardOf(id int64, s int) int {
	if s <= 1 {
		return 0
	}
	var buf [20]byte
	h := uint64(14695981039346656037)
	for _, c := range strconv.AppendInt(buf[:0], id, 10) {
		h ^= uint64(c)
		h *= 1099511628211
	}
	return int(h % uint64(s)) // #nosec G115 -- below s, an int
}

// LeaderboardShardSlots are the slots of layout's shards, in shard order.
func LeaderboardShardSlots(layout int) []string {
	if layout == LeaderboardsSingleSlot {
		return []string{leaderboardSlot}
	}
	return append([]string(nil), leaderboardShardSlots()...)
}

func (l Leaderboards) layout() int {
	if l.Layout == 0 {
		return LeaderboardsLayout
	}
	return l.Layout
}

func (l Leaderboards) slots() []string {
	if l.layout() == LeaderboardsSingleSlot {
		return []string{leaderboardSlot}
	}
	return leaderboardShardSlots()
}

func (l Leaderboards) slotOf(id int64) string {
	s := l.slots()
	return s[ShardOf(id, len(s))]
}

// CurrentLayout implements Layouts.
func (Leaderboards) CurrentLayout() int { return LeaderboardsLayout }

// AtLayout implements Layouts.
func (l Leaderboards) AtLayout(layout int) (Projection, error) {
	if layout < LeaderboardsSingleSlot || layout > LeaderboardsBoardCounts {
		return nil, fmt.Errorf("leaderboards: unknown layout %d (this build knows %d to %d)", layout, LeaderboardsSingleSlot, LeaderboardsBoardCounts)
	}
	l.Layout = layout
	return l, nil
}

// LeaderboardLocation is one row of a location board.
type LeaderboardLocation struct {
	Rank          int     `json:"rank"`
	LocationID    int64   `json:"locationId"`
	NumCheckins   int64   `json:"numCheckins"`
	AverageRating float64 `json:"averageRating"` // exact: stars / check-ins
}

// LeaderboardUser is one row of the user board.
type LeaderboardUser struct {
	Rank        int   `json:"rank"`
	UserID      int64 `json:"userId"`
	NumCheckins int64 `json:"numCheckins"`
}

// Name implements Projection.
func (Leaderboards) Name() string { return "leaderboards" }

// OnCheckinRecorded counts the check-in for its location and user and, once the location has
// MinCheckins, sets its rating score from the counts the same script just updated.
func (l Leaderboards) OnCheckinRecorded(ctx context.Context, e domain.CheckinRecorded, s Store) error {
	loc, user := strconv.FormatInt(e.LocationID, 10), strconv.FormatInt(e.UserID, 10)
	locUpdate := NewUpdate(l.slotOf(e.LocationID)).ZIncrBy(lbLocationCheckins, 1, loc)
	if l.layout() == LeaderboardsBoardCounts {
		locUpdate.HIncrBy(lbLocationCounts, loc+":stars", int64(e.StarRating)).
			ZScaledRatioAtMin(lbLocationRating, loc, lbLocationCounts, loc+":stars", lbLocationCheckins, loc, max(l.MinCheckins, 1))
	} else {
		locUpdate.HIncrBy(lbLocationCounts, loc+":n", 1).
			HIncrBy(lbLocationCounts, loc+":stars", int64(e.StarRating)).
			ZRatioAtMin(lbLocationRating, loc, lbLocationCounts, loc+":stars", loc+":n", max(l.MinCheckins, 1))
	}
	if l.layout() == LeaderboardsSingleSlot {
		return s.Apply(ctx, locUpdate.ZIncrBy(lbUserCheckins, 1, user))
	}
	if err := s.Apply(ctx, locUpdate); err != nil {
		return err
	}
	return s.Apply(ctx, NewUpdate(l.slotOf(e.UserID)).ZIncrBy(lbUserCheckins, 1, user))
}

// ValidateLeaderboardLimit turns 0 into the default and rejects anything outside 1..Max.
func ValidateLeaderboardLimit(limit int) (int, error) {
	if limit == 0 {
		return DefaultLeaderboardLimit, nil
	}
	if limit < 1 || limit > MaxLeaderboardLimit {
		return 0, &domain.ValidationError{Code: domain.CodeOutOfRange, Field: "limit",
			Message: fmt.Sprintf("must be from 1 to %d, got %d", MaxLeaderboardLimit, limit)}
	}
	return limit, nil
}

// TopLocations is the location board ordered by ByCheckins or ByRating, best first.
func (l Leaderboards) TopLocations(ctx context.Context, r Reader, by string, limit int) ([]LeaderboardLocation, error) {
	var key string
	switch by {
	case ByCheckins, "":
		key = lbLocationCheckins
	case ByRating:
		key = lbLocationRating
	default:
		return nil, &domain.ValidationError{Code: domain.CodeInvalid, Field: "by",
			Message: fmt.Sprintf("must be %s or %s, got %q", ByRating, ByCheckins, by)}
	}
	limit, err := ValidateLeaderboardLimit(limit)
	if err != nil {
		return nil, err
	}
	zs, l, err := l.top(ctx, r, key, limit)
	if err != nil {
		return nil, err
	}
	members := make([]string, len(zs))
	for i, z := range zs {
		members[i] = z.Member
	}
	return l.rows(ctx, r, members)
}

// Locations is the leaderboards' counts of the locations ids (rank 0: not ranked), whether
// they are near the top or not (the bench's verifier compares every location's).
func (l Leaderboards) Locations(ctx context.Context, r Reader, ids []int64) ([]LeaderboardLocation, error) {
	_, l, err := l.top(ctx, r, lbLocationCheckins, 1) // the layout the version is written in
	if err != nil {
		return nil, err
	}
	members := make([]string, len(ids))
	for i, id := range ids {
		members[i] = strconv.FormatInt(id, 10)
	}
	rows, err := l.rows(ctx, r, members)
	for i := range rows {
		rows[i].Rank = 0
	}
	return rows, err
}

// rows reads the counts of the locations members, ranked in their order.
func (l Leaderboards) rows(ctx context.Context, r Reader, members []string) ([]LeaderboardLocation, error) {
	out := make([]LeaderboardLocation, 0, len(members))
	if len(members) == 0 {
		return out, nil
	}
	// The counts of the merged top, one read per shard it came from, in one round trip. Before
	// LeaderboardsBoardCounts both are fields of one hash (one HMGET); since, a location's count
	// is its score on the check-ins board, read with its stars in one transaction of the shard,
	// so a check-in applied meanwhile is in both numbers or in neither.
	onBoard := l.layout() == LeaderboardsBoardCounts
	ids := make([]int64, len(members))
	var reads []SlotRead
	readOf := map[string]int{}         // slot -> its read
	at := make([][2]int, len(members)) // row -> its read and the index of its first field there
	for i, member := range members {
		id, err := strconv.ParseInt(member, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("leaderboard member %q is not a location ID: %w", member, err)
		}
		ids[i] = id
		slot := l.slotOf(id)
		n, ok := readOf[slot]
		if !ok {
			n = len(reads)
			readOf[slot] = n
			reads = append(reads, SlotRead{Slot: slot, Hash: lbLocationCounts})
			if onBoard {
				reads[n].SortedSet = lbLocationCheckins
			}
		}
		at[i] = [2]int{n, len(reads[n].Fields)}
		if onBoard {
			reads[n].Fields = append(reads[n].Fields, member+":stars")
			reads[n].Members = append(reads[n].Members, member)
		} else {
			reads[n].Fields = append(reads[n].Fields, member+":n", member+":stars")
		}
	}
	vals, err := r.ReadSlots(ctx, reads)
	if err != nil {
		return nil, err
	}
	for i, id := range ids {
		v := vals[at[i][0]]
		f := v.Fields[at[i][1]:]
		var n, stars int64
		var err error
		if onBoard {
			n = int64(v.Scores[at[i][1]])
		} else {
			if n, err = ParseInt(f[0]); err != nil {
				return nil, fmt.Errorf("location %d count: %w", id, err)
			}
			f = f[1:]
		}
		if stars, err = ParseInt(f[0]); err != nil {
			return nil, fmt.Errorf("location %d stars: %w", id, err)
		}
		row := LeaderboardLocation{Rank: i + 1, LocationID: id, NumCheckins: n}
		if n > 0 {
			row.AverageRating = float64(stars) / float64(n)
		}
		out = append(out, row)
	}
	return out, nil
}

// TopUsers is the user board by check-ins, most first.
func (l Leaderboards) TopUsers(ctx context.Context, r Reader, limit int) ([]LeaderboardUser, error) {
	limit, err := ValidateLeaderboardLimit(limit)
	if err != nil {
		return nil, err
	}
	zs, _, err := l.top(ctx, r, lbUserCheckins, limit)
	if err != nil {
		return nil, err
	}
	out := make([]LeaderboardUser, 0, len(zs))
	for i, z := range zs {
		id, err := strconv.ParseInt(z.Member, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("leaderboard member %q is not a user ID: %w", z.Member, err)
		}
		out = append(out, LeaderboardUser{Rank: i + 1, UserID: id, NumCheckins: int64(z.Score)})
	}
	return out, nil
}

// BoardUsers is the user board's name for Board.
const BoardUsers = "users"

// Board is every member of a board (ByCheckins or ByRating of the locations, or BoardUsers)
// with its score, best first: for a check against an independent computation, which the pages
// of at most MaxLeaderboardLimit rows cannot see past (a member missing below the top 100).
func (l Leaderboards) Board(ctx context.Context, r Reader, board string) ([]Scored, error) {
	key := map[string]string{ByCheckins: lbLocationCheckins, ByRating: lbLocationRating, BoardUsers: lbUserCheckins}[board]
	if key == "" {
		return nil, fmt.Errorf("no leaderboard %q", board)
	}
	slots := l.slots()
	reads := make([]RangeRead, len(slots), len(slots)+1)
	for i, slot := range slots {
		reads[i] = RangeRead{Slot: slot, Key: key, Start: 0, Stop: -1}
	}
	if l.layout() != LeaderboardsSingleSlot {
		reads = append(reads, RangeRead{Slot: leaderboardSlot, Key: key, Start: 0, Stop: -1})
	}
	tops, err := r.ZRevRanges(ctx, reads)
	if err != nil {
		return nil, err
	}
	if len(tops) > len(slots) {
		if single := tops[len(slots)]; len(single) > 0 {
			return single, nil
		}
		tops = tops[:len(slots)]
	}
	n := 0
	for _, t := range tops {
		n += len(t)
	}
	return mergeTop(tops, n), nil
}

// top is the board key's `limit` best members over every shard: each shard's top `limit` in one
// round trip, merged. The sharded layout also reads the key of the single-slot layout in the
// same round trip: the version serving reads during an upgrade's rebuild is still written in
// that layout, which is the only one holding anything then. It returns l at the layout read.
func (l Leaderboards) top(ctx context.Context, r Reader, key string, limit int) ([]Scored, Leaderboards, error) {
	slots := l.slots()
	reads := make([]RangeRead, len(slots), len(slots)+1)
	for i, slot := range slots {
		reads[i] = RangeRead{Slot: slot, Key: key, Start: 0, Stop: int64(limit - 1)}
	}
	if l.layout() != LeaderboardsSingleSlot {
		reads = append(reads, RangeRead{Slot: leaderboardSlot, Key: key, Start: 0, Stop: int64(limit - 1)})
	}
	tops, err := r.ZRevRanges(ctx, reads)
	if err != nil {
		return nil, l, err
	}
	if len(tops) > len(slots) {
		if single := tops[len(slots)]; len(single) > 0 {
			l.Layout = LeaderboardsSingleSlot
			return single, l, nil
		}
		tops = tops[:len(slots)]
	}
	return mergeTop(tops, limit), l, nil
}

// mergeTop merges the shards' tops into the first `limit` of the whole board, in the order one
// sorted set of every member would give with ZREVRANGE: higher score first, and equal scores by
// member, the greater byte string first. Every member of the whole top `limit` is within its own
// shard's top `limit` (a shard orders its members the same way), so the merge is exact. Each
// shard's top is in that order already: the merge takes the best head, `limit` times.
func mergeTop(tops [][]Scored, limit int) []Scored {
	if len(tops) == 1 {
		return tops[0][:min(limit, len(tops[0]))]
	}
	out := make([]Scored, 0, limit)
	next := make([]int, len(tops))
	for len(out) < limit {
		best := -1
		for i, t := range tops {
			if next[i] < len(t) && (best < 0 || ahead(t[next[i]], tops[best][next[best]])) {
				best = i
			}
		}
		if best < 0 {
			break
		}
		out = append(out, tops[best][next[best]])
		next[best]++
	}
	return out
}

// ahead reports whether a comes before b in ZREVRANGE order.
func ahead(a, b Scored) bool {
	if a.Score != b.Score {
		return a.Score > b.Score
	}
	return a.Member > b.Member
}
