// Package projection holds the read models kept from the event stream. A projection is a type
// with a stable Name and handlers for the events it wants; the shared machinery (subscription,
// consumer group, retry, poison queue, dedupe, metrics, backfill) comes from ports and adapters.
//
// Writes go through Store as Updates: every Update names the entity (slot) it touches. The
// machinery applies a handler's updates after it returns, each atomically, and at most once per
// (projection version, slot, check-in): it knows which event the handler was given and dedupes
// on that check-in's identity (domain.Checkin.Identity), so a projection author cannot forget
// idempotency, and every update stays in one Redis Cluster hash slot.
package projection

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/checkins/checkins/domain"
)

// Projection is a read model fed by events. Name names its consumer group and its keys: never
// change it once shipped.
type Projection interface {
	Name() string
}

// Layouts is implemented by a projection whose keys changed their layout in some release. A
// projection version is written and read in one layout for its whole life: the registry records
// the layout each version is built in, a version of a release before layouts has layout 1, and
// a serving version of an older layout than CurrentLayout is replaced by a rebuild that starts
// by itself (command.RebuildProjection.UpgradeLayouts).
type Layouts interface {
	Projection
	// CurrentLayout is the layout new versions are built in.
	CurrentLayout() int
	// AtLayout is the projection as it writes (and reads) layout; an error for a layout this
	// build does not know.
	AtLayout(layout int) (Projection, error)
}

// CurrentLayout is p's current layout: 1 for a projection without Layouts.
func CurrentLayout(p Projection) int {
	if l, ok := p.(Layouts); ok {
		return l.CurrentLayout()
	}
	return 1
}

// AtLayout is p as it writes layout (0 or 1 for a version recorded before layouts: 1); p itself
// for a projection without Layouts.
func AtLayout(p Projection, layout int) (Projection, error) {
	l, ok := p.(Layouts)
	if !ok {
		return p, nil
	}
	return l.AtLayout(max(layout, 1))
}

// CheckinRecordedHandler is implemented by projections that want CheckinRecorded events.
type CheckinRecordedHandler interface {
	OnCheckinRecorded(ctx context.Context, e domain.CheckinRecorded, s Store) error
}

// Store takes the updates a handler makes for the one event it is handling. They are applied
// once the handler has returned without an error (and not at all when it fails, so a failed
// handler never leaves half its work behind): each update atomically, and not again if the same
// check-in already reached that slot of this projection version.
type Store interface {
	Apply(ctx context.Context, u *Update) error
}

// Reader reads one projection's read model (the version that currently serves reads).
type Reader interface {
	HGetAll(ctx context.Context, slot, key string) (map[string]string, error)
	HMGet(ctx context.Context, slot, key string, fields ...string) ([]string, error) // "" for missing
	HLen(ctx context.Context, slot, key string) (int64, error)                       // 0 for a missing hash
	// ZRevRange returns members from the highest score down, ranks start..stop inclusive.
	ZRevRange(ctx context.Context, slot, key string, start, stop int64) ([]Scored, error)
	// ZRevRanges is ZRevRange of several sorted sets, of any slots, in one round trip (on a
	// cluster, one per master, in parallel): how a sharded read model is read at once.
	ZRevRanges(ctx context.Context, reads []RangeRead) ([][]Scored, error)
	// ReadSlots reads, for each read, some fields of a hash and the scores of some members of a
	// sorted set of one slot at one moment (a transaction per slot), all in one round trip: how
	// numbers kept in two keys are read without a write between them.
	ReadSlots(ctx context.Context, reads []SlotRead) ([]SlotValues, error)
}

// SlotRead is some fields of a hash and some members of a sorted set, in one slot.
type SlotRead struct {
	Slot      string
	Hash      string
	Fields    []string
	SortedSet string
	Members   []string
}

// SlotValues answer a SlotRead: the fields ("" for a missing one) and the members' scores (0
// for a missing one), in the order asked.
type SlotValues struct {
	Fields []string
	Scores []float64
}

// RangeRead is one sorted set's ranks start..stop, read from the highest score down.
type RangeRead struct {
	Slot, Key   string
	Start, Stop int64
}

// Scored is one sorted-set member.
type Scored struct {
	Member string
	Score  float64
}

// OpKind is one primitive of an update. Each is applied by the store's script in order.
type OpKind string

// The primitives. Each is deterministic and, combined with dedupe, order-insensitive where the
// projections below need it.
const (
	OpHIncrBy     OpKind = "hincrby"     // key field delta
	OpHSet        OpKind = "hset"        // key field value
	OpHMaxBy      OpKind = "hmaxby"      // key field value tiefield tie [field value]...: set all if (value, tie) > current
	OpHRound      OpKind = "hround"      // key dst num den: dst = floor(num/den + 0.5)
	OpZAdd        OpKind = "zadd"        // key score member
	OpZIncrBy     OpKind = "zincrby"     // key delta member
	OpZKeepTop    OpKind = "zkeeptop"    // key n: keep the n highest-scored members
	OpZRatioAtMin OpKind = "zratioatmin" // zkey member hkey num den min: zkey[member] = num/den when den >= min
	// zkey hkey dkey; member num den min: zkey[member] = floor(hkey.num / dkey[den] * RatioScale)
	// when dkey[den] >= min
	OpZScaledRatioAtMin OpKind = "zscaledratioatmin"
)

// RatioScale is what OpZScaledRatioAtMin multiplies a ratio by before it drops the fraction:
// 2^49, so a ratio up to 8 gives an integer below 2^52, which Redis keeps in a small sorted set
// as an integer (a fraction is kept as text and parsed with strtod whenever the set is
// scanned). Two ratios of counts below 2^24 that differ get different scores.
const RatioScale = 1 << 49

// Op is one primitive with its logical key (a name within the update's slot) and arguments.
type Op struct {
	Kind OpKind
	Keys []string
	Args []string
}

// Update is one atomic, idempotent change to the keys of one slot.
type Update struct {
	Slot string // the entity the keys belong to, e.g. "user:42"; all keys share its hash slot
	Ops  []Op
	// first holds the first ops NewUpdate's builders add, in the Update's own allocation: the
	// shipped projections' updates have one to three ops, and growing Ops from nil took up to
	// three allocations more per update, in every event of every projection.
	first [3]Op
}

// NewUpdate starts an update of slot.
func NewUpdate(slot string) *Update {
	u := &Update{Slot: slot}
	u.Ops = u.first[:0]
	return u
}

// add appends an op whose keys are the first nkeys of s and whose args are the rest: one
// slice for both, so an op costs one allocation for its strings, not two.
func (u *Update) add(kind OpKind, nkeys int, s ...string) *Update {
	u.Ops = append(u.Ops, Op{Kind: kind, Keys: s[:nkeys:nkeys], Args: s[nkeys:]})
	return u
}

// HIncrBy adds delta to hash field.
func (u *Update) HIncrBy(key, field string, delta int64) *Update {
	return u.add(OpHIncrBy, 1, key, field, strconv.FormatInt(delta, 10))
}

// HSet sets a hash field.
func (u *Update) HSet(key, field, value string) *Update {
	return u.add(OpHSet, 1, key, field, value)
}

// HMaxBy sets field=value and the extra fields when (value, tie) is greater than what the hash
// holds in field and tieField: the greatest wins whatever order events arrive in, and equal
// values are settled by tie so every ordering gives the same result.
func (u *Update) HMaxBy(key, field string, value int64, tieField, tie string, extra ...string) *Update {
	if len(extra)%2 != 0 {
		panic(fmt.Sprintf("projection: HMaxBy extra must be field/value pairs, got %d strings", len(extra)))
	}
	s := make([]string, 0, 5+len(extra))
	s = append(s, key, field, strconv.FormatInt(value, 10), tieField, tie)
	return u.add(OpHMaxBy, 1, append(s, extra...)...)
}

// HRound stores floor(num/den + 0.5) of two fields of the hash into dst.
func (u *Update) HRound(key, dst, num, den string) *Update {
	return u.add(OpHRound, 1, key, dst, num, den)
}

// ZAdd sets member's score.
func (u *Update) ZAdd(key string, score float64, member string) *Update {
	return u.add(OpZAdd, 1, key, strconv.FormatFloat(score, 'f', -1, 64), member)
}

// ZIncrBy adds delta to member's score.
func (u *Update) ZIncrBy(key string, delta float64, member string) *Update {
	return u.add(OpZIncrBy, 1, key, strconv.FormatFloat(delta, 'f', -1, 64), member)
}

// ZKeepTop trims the sorted set to its n highest-scored members.
func (u *Update) ZKeepTop(key string, n int) *Update {
	return u.add(OpZKeepTop, 1, key, strconv.Itoa(n))
}

// ZRatioAtMin sets zkey[member] = hkey.num / hkey.den once hkey.den >= min.
func (u *Update) ZRatioAtMin(zkey, member, hkey, num, den string, min int64) *Update {
	return u.add(OpZRatioAtMin, 2, zkey, hkey, member, num, den, strconv.FormatInt(min, 10))
}

// ZScaledRatioAtMin sets zkey[member] = floor(hkey.num / dkey[den] * RatioScale) once
// dkey[den] (a sorted set member's score) >= min: the ratio as an integer score.
func (u *Update) ZScaledRatioAtMin(zkey, member, hkey, num, dkey, den string, min int64) *Update {
	return u.add(OpZScaledRatioAtMin, 3, zkey, hkey, dkey, member, num, den, strconv.FormatInt(min, 10))
}

// ParseInt reads a stored integer field; "" is 0.
func ParseInt(s string) (int64, error) {
	if s == "" {
		return 0, nil
	}
	return strconv.ParseInt(s, 10, 64)
}

// Handles reports whether p wants events like e.
func Handles(p Projection, e domain.Event) bool {
	switch e.(type) {
	case domain.CheckinRecorded:
		_, ok := p.(CheckinRecordedHandler)
		return ok
	}
	return false
}

// Updates runs p's handler for e and returns the updates it made: none when p has no handler
// for e's type. An error means the handler failed; its updates must then not be applied.
func Updates(ctx context.Context, p Projection, e domain.Event) ([]*Update, error) {
	var c collector
	switch ev := e.(type) {
	case domain.CheckinRecorded:
		if h, ok := p.(CheckinRecordedHandler); ok {
			if err := h.OnCheckinRecorded(ctx, ev, &c); err != nil {
				return nil, err
			}
		}
	}
	return c.updates, nil
}

// collector is the Store handlers get: it keeps their updates for the machinery to apply.
type collector struct{ updates []*Update }

func (c *collector) Apply(_ context.Context, u *Update) error {
	if u == nil {
		return errors.New("projection: Apply(nil)")
	}
	c.updates = append(c.updates, u)
	return nil
}
