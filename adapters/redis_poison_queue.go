package adapters

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/checkins/checkins/app/ops"
	"github.com/checkins/checkins/app/projection"
	"github.com/checkins/checkins/domain"
)

// Fields a poison entry adds to the original entry's fields (which it keeps unchanged).
const (
	PoisonFieldStream     = "poison:stream"
	PoisonFieldEntryID    = "poison:entry_id"
	PoisonFieldProjection = "poison:projection"
	PoisonFieldGroup      = "poison:group"   // consumer group the event came through
	PoisonFieldVersion    = "poison:version" // projection version that failed
	PoisonFieldError      = "poison:error"
	PoisonFieldAttempts   = "poison:attempts"
	PoisonFieldFailedAt   = "poison:failed_at"
	// PoisonFieldDecision is the dedupe decision for the event when it was parked: "counted" or
	// "duplicate" (absent: not decided, e.g. an entry that is not a valid event).
	PoisonFieldDecision = "poison:decision"
	// PoisonFieldParkedAt is when the entry was first parked (ms, the server's clock): written
	// by a re-park, which gives the entry a new ID; a first park's is its ID's time.
	PoisonFieldParkedAt = "poison:parked_at"
)

// PoisonQueue is the Redis stream of parked events for one event stream (ops.PoisonQueue).
type PoisonQueue struct {
	client redis.UniversalClient
	stream string
	parked string // KeySpace.PoisonParked
	repark *redis.Script

	countMu sync.Mutex
	counted poisonCount // what CountByProjection counted last
}

// poisonCount is a count of the queue per projection, with the stream's state it was made at.
type poisonCount struct {
	by            map[string]int64 // nil: none yet
	added, length int64            // the stream's entries-added and length before the count
	first         string           // its first entry then: another one after a delete, or a new stream
	last          string           // the last entry counted
}

// NewPoisonQueue uses keys.PoisonStream().
func NewPoisonQueue(client redis.UniversalClient, keys KeySpace) *PoisonQueue {
	return &PoisonQueue{client: client, stream: keys.PoisonStream(), parked: keys.PoisonParked(), repark: redis.NewScript(reparkScript)}
}

// parkedField is a unit's field in the parked hash.
func parkedField(u ops.UnitRef) string {
	return u.Group + "\n" + u.Stream + "\n" + u.Entry + "\n" + u.Member
}

// parkLua adds a poison entry and records its unit as parked, together: a projector that takes
// the entry over from one that died before acknowledging it leaves the unit to the replay.
// ARGV[1]: the parking consumer's lease (Redis ms, 0: none; projection.WithLease), from which it
// parks nothing: another projector may have taken the entry over and applied the unit.
var parkLua = redis.NewScript(leaseLua + `
if pastLease(ARGV[1]) then return leaseRefused() end
local id = redis.call('XADD', KEYS[1], '*', unpack(ARGV, 3))
redis.call('HSET', KEYS[2], ARGV[2], id)
return id
`)

// SweepParked drops the records of units whose entries are acknowledged (acked says so), from
// cursor on, a page at a time; it returns where the next call goes on (0: the whole hash was
// looked at). A record lives from the park until its entry's XACK is seen to have landed, not
// to its poison entry's replay or purge: an entry still pending (its process died after the
// park, or before its XACK reached Redis) is taken over later, and its parked unit must be left
// alone then too, replayed or purged already. The caller decides from the groups' positions;
// the records of a stream that no longer exists (an old partition after a migration) go too.
func (q *PoisonQueue) SweepParked(ctx context.Context, cursor uint64, acked func(ops.UnitRef) bool) (uint64, error) {
	if cursor == 0 {
		n, err := q.client.HLen(ctx, q.parked).Result()
		if err != nil || n == 0 {
			return 0, err
		}
	}
	kvs, next, err := q.client.HScan(ctx, q.parked, cursor, "", 500).Result()
	if err != nil {
		return cursor, fmt.Errorf("read the parked units' records: %w", err)
	}
	var drop []string
	left := map[string][]string{} // stream -> its records not dropped yet
	for i := 0; i+1 < len(kvs); i += 2 {
		u, ok := parseParkedField(kvs[i])
		switch {
		case !ok:
		case acked(u):
			drop = append(drop, kvs[i])
		default:
			left[u.Stream] = append(left[u.Stream], kvs[i])
		}
	}
	// A stream deleted since (an old partition after a migration) delivers nothing again.
	if len(left) > 0 {
		exists := map[string]*redis.IntCmd{}
		pipe := q.client.Pipeline()
		for stream := range left {
			exists[stream] = pipe.Exists(ctx, stream)
		}
		if _, err := pipe.Exec(ctx); err != nil {
			return cursor, fmt.Errorf("read whether the parked units' streams exist: %w", err)
		}
		for stream, c := range exists {
			if c.Val() == 0 {
				drop = append(drop, left[stream]...)
			}
		}
	}
	if len(drop) > 0 {
		if err := q.client.HDel(ctx, q.parked, drop...).Err(); err != nil {
			return cursor, fmt.Errorf("drop the records of parked units whose entries are acknowledged: %w", err)
		}
	}
	return next, nil
}

// parseParkedField is parkedField's unit.
func parseParkedField(f string) (ops.UnitRef, bool) {
	p := strings.Split(f, "\n")
	if len(p) != 4 {
		return ops.UnitRef{}, false
	}
	return ops.UnitRef{Group: p[0], Stream: p[1], Entry: p[2], Member: p[3]}, true
}

// Parked says which of units are parked and their entries not acknowledged since.
func (q *PoisonQueue) Parked(ctx context.Context, units []ops.UnitRef) ([]bool, error) {
	out := make([]bool, len(units))
	if len(units) == 0 {
		return out, nil
	}
	fields := make([]string, len(units))
	for i, u := range units {
		fields[i] = parkedField(u)
	}
	vs, err := q.client.HMGet(ctx, q.parked, fields...).Result()
	if err != nil {
		return nil, fmt.Errorf("read which units are parked: %w", err)
	}
	for i, v := range vs {
		out[i] = v != nil
	}
	return out, nil
}

// Stream is the poison stream's key.
func (q *PoisonQueue) Stream() string { return q.stream }

// Park adds e to the queue and returns its ID.
func (q *PoisonQueue) Park(ctx context.Context, e ops.PoisonEntry) (string, error) {
	lease, _ := projection.LeaseOf(ctx)
	args := append([]any{lease, parkedField(e.Unit())}, poisonValues(e)...)
	id, err := parkLua.Run(ctx, q.client, []string{q.stream, q.parked}, args...).Text()
	if isLeaseExpired(err) {
		return "", fmt.Errorf("park event %s of %s: %w", e.EntryID, e.Projection, projection.ErrLeaseExpired)
	}
	if err != nil {
		return "", fmt.Errorf("park event %s of %s in %s: %w", e.EntryID, e.Projection, q.stream, err)
	}
	return id, nil
}

// reparkScript replaces a poison entry by a new one atomically, and only if the old one is still
// there: two operators replaying the same entry at once cannot duplicate it.
const reparkScript = `
if redis.call('XDEL', KEYS[1], ARGV[1]) == 0 then return false end
return redis.call('XADD', KEYS[1], '*', unpack(ARGV, 2))
`

// Repark replaces the entry e.ID by e (with its new error, attempts and time) and returns the
// new ID; domain.ErrNotFound when e.ID is no longer in the queue. Stream entries cannot be
// updated in place, so the entry gets a new ID at the end of the queue.
func (q *PoisonQueue) Repark(ctx context.Context, e ops.PoisonEntry) (string, error) {
	args := append([]any{e.ID}, poisonValues(e)...)
	id, err := q.repark.Run(ctx, q.client, []string{q.stream}, args...).Text()
	if errors.Is(err, redis.Nil) {
		return "", fmt.Errorf("poison entry %s: %w", e.ID, domain.ErrNotFound)
	}
	if err != nil {
		return "", fmt.Errorf("re-park poison entry %s: %w", e.ID, err)
	}
	return id, nil
}

// LastID is the ID of the newest entry, "" when the queue is empty. Bulk operations stop there,
// so entries parked (or re-parked) while they run are left for the next run.
func (q *PoisonQueue) LastID(ctx context.Context) (string, error) {
	xs, err := q.client.XRevRangeN(ctx, q.stream, "+", "-", 1).Result()
	if err != nil || len(xs) == 0 {
		return "", err
	}
	return xs[0].ID, nil
}

// Range returns up to count entries with after < ID <= until, oldest first ("" after: from the start).
func (q *PoisonQueue) Range(ctx context.Context, after, until string, count int64) ([]ops.PoisonEntry, error) {
	start := "-"
	if after != "" {
		start = "(" + after
	}
	xs, err := q.client.XRangeN(ctx, q.stream, start, until, count).Result()
	if err != nil {
		return nil, err
	}
	out := make([]ops.PoisonEntry, len(xs))
	for i, x := range xs {
		out[i] = toPoisonEntry(x)
	}
	return out, nil
}

// DeleteIDs removes entries and returns how many were there.
func (q *PoisonQueue) DeleteIDs(ctx context.Context, ids ...string) (int64, error) {
	if len(ids) == 0 {
		return 0, nil
	}
	return q.client.XDel(ctx, q.stream, ids...).Result()
}

func poisonValues(e ops.PoisonEntry) []any {
	values := make([]any, 0, 2*(len(e.Fields)+8))
	for k, v := range e.Fields {
		if strings.HasPrefix(k, "poison:") {
			continue // a replayed poison entry parked again keeps only the newest reason
		}
		values = append(values, k, v)
	}
	values = append(values,
		PoisonFieldStream, e.Stream, PoisonFieldEntryID, e.EntryID, PoisonFieldProjection, e.Projection,
		PoisonFieldGroup, e.Group, PoisonFieldVersion, strconv.Itoa(e.Version),
		PoisonFieldError, e.Error, PoisonFieldAttempts, strconv.Itoa(e.Attempts),
		PoisonFieldFailedAt, strconv.FormatInt(e.FailedAt.UnixMilli(), 10))
	if e.Decision != "" {
		values = append(values, PoisonFieldDecision, e.Decision)
	}
	if e.ParkedAt > 0 {
		values = append(values, PoisonFieldParkedAt, strconv.FormatInt(e.ParkedAt, 10))
	}
	sortPairs(values) // the stream's order (SortedXAddValues)
	return values
}

// List returns up to count entries after the cursor ("" from the start), oldest first, and the
// cursor to continue ("" when done).
func (q *PoisonQueue) List(ctx context.Context, cursor string, count int64) ([]ops.PoisonEntry, string, error) {
	start := "-"
	if cursor != "" {
		if _, ok := parseEntryID(cursor); !ok {
			return nil, "", &domain.ValidationError{Code: domain.CodeInvalid, Field: "cursor", Message: fmt.Sprintf("is not a poison entry ID: %q", cursor)}
		}
		start = "(" + cursor
	}
	// One more than asked, to know whether a page follows: a last page of exactly count
	// entries has no cursor to an empty one.
	xs, err := q.client.XRangeN(ctx, q.stream, start, "+", count+1).Result()
	if err != nil {
		return nil, "", err
	}
	next := ""
	if count > 0 && int64(len(xs)) > count {
		xs = xs[:count]
		next = xs[len(xs)-1].ID
	}
	out := make([]ops.PoisonEntry, len(xs))
	for i, x := range xs {
		out[i] = toPoisonEntry(x)
	}
	return out, next, nil
}

// Get returns one entry; domain.ErrNotFound when it is not there.
func (q *PoisonQueue) Get(ctx context.Context, id string) (ops.PoisonEntry, error) {
	if _, ok := parseEntryID(id); !ok {
		return ops.PoisonEntry{}, &domain.ValidationError{Code: domain.CodeInvalid, Field: "id", Message: fmt.Sprintf("is not a poison entry ID: %q", id)}
	}
	xs, err := q.client.XRangeN(ctx, q.stream, id, id, 1).Result()
	if err != nil {
		return ops.PoisonEntry{}, err
	}
	if len(xs) == 0 {
		return ops.PoisonEntry{}, fmt.Errorf("poison entry %s: %w", id, domain.ErrNotFound)
	}
	return toPoisonEntry(xs[0]), nil
}

// Delete removes one entry; domain.ErrNotFound when it was not there.
func (q *PoisonQueue) Delete(ctx context.Context, id string) error {
	if _, ok := parseEntryID(id); !ok {
		return &domain.ValidationError{Code: domain.CodeInvalid, Field: "id", Message: fmt.Sprintf("is not a poison entry ID: %q", id)}
	}
	n, err := q.DeleteIDs(ctx, id)
	if err != nil {
		return err
	}
	if n == 0 {
		return fmt.Errorf("poison entry %s: %w", id, domain.ErrNotFound)
	}
	return nil
}

// Len is the number of parked entries.
func (q *PoisonQueue) Len(ctx context.Context) (int64, error) {
	return q.client.XLen(ctx, q.stream).Result()
}

// CountByProjection counts parked entries per projection. The status (and the dashboard, every
// second) asks for it, and a queue can hold a great many entries: the count is kept and only
// what changed is read again. Unchanged (the stream's entries-added and length as at the last
// count): nothing is read. Entries added and none deleted: those after the last one counted.
// Otherwise (a replay or purge deleted some), or on a server that does not report
// entries-added (the embedded quick start's), the whole queue, in chunks.
func (q *PoisonQueue) CountByProjection(ctx context.Context) (map[string]int64, error) {
	q.countMu.Lock()
	defer q.countMu.Unlock()
	info, err := q.client.XInfoStream(ctx, q.stream).Result()
	if err != nil {
		if isNoSuchKey(err) {
			q.counted = poisonCount{}
			return map[string]int64{}, nil
		}
		return nil, err
	}
	c := q.counted
	// The same stream, grown by additions only: entries-added never went back (a stream deleted
	// and made again, a failover to a replica that lagged), and the first entry is the same.
	same := c.by != nil && info.EntriesAdded > 0 && info.EntriesAdded >= c.added && info.FirstEntry.ID == c.first
	switch {
	case same && info.EntriesAdded == c.added && info.Length == c.length:
		return maps.Clone(c.by), nil
	case same && info.EntriesAdded-c.added == info.Length-c.length:
		c.by = maps.Clone(c.by)
	default:
		c = poisonCount{by: map[string]int64{}}
	}
	c.added, c.length, c.first = info.EntriesAdded, info.Length, info.FirstEntry.ID
	start := "-"
	if c.last != "" {
		start = "(" + c.last
	}
	for {
		xs, err := q.client.XRangeN(ctx, q.stream, start, "+", 1000).Result()
		if err != nil {
			return nil, err
		}
		for _, x := range xs {
			p, _ := x.Values[PoisonFieldProjection].(string)
			c.by[p]++
		}
		if len(xs) > 0 {
			c.last = xs[len(xs)-1].ID
			start = "(" + c.last
		}
		if len(xs) < 1000 {
			break
		}
	}
	q.counted = c
	return maps.Clone(c.by), nil
}

func toPoisonEntry(x redis.XMessage) ops.PoisonEntry {
	e := ops.PoisonEntry{ID: x.ID, Fields: map[string]string{}}
	for k, v := range x.Values {
		s, _ := v.(string)
		switch k {
		case PoisonFieldStream:
			e.Stream = s
		case PoisonFieldEntryID:
			e.EntryID = s
		case PoisonFieldProjection:
			e.Projection = s
		case PoisonFieldGroup:
			e.Group = s
		case PoisonFieldVersion:
			e.Version, _ = strconv.Atoi(s)
		case PoisonFieldError:
			e.Error = s
		case PoisonFieldAttempts:
			e.Attempts, _ = strconv.Atoi(s)
		case PoisonFieldFailedAt:
			ms, _ := strconv.ParseInt(s, 10, 64)
			e.FailedAt = time.UnixMilli(ms).UTC()
		case PoisonFieldDecision:
			e.Decision = s
		case PoisonFieldParkedAt:
			e.ParkedAt, _ = strconv.ParseInt(s, 10, 64)
		default:
			e.Fields[k] = s
		}
	}
	if e.ParkedAt == 0 { // first parked as this entry: its ID is the server's time of the park
		if t, ok := ops.EntryTime(x.ID); ok {
			e.ParkedAt = t.UnixMilli()
		}
	}
	return e
}

// ErrPoisonQueue wraps failures to park, so callers can tell them from handler failures.
var ErrPoisonQueue = errors.New("poison queue")

var _ ops.PoisonQueue = (*PoisonQueue)(nil)
