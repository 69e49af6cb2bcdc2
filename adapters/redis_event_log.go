package adapters

import (
	"cmp"
	"context"
	"fmt"
	"math"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/redis/go-redis/v9"

	"github.com/checkins/checkins/app/query"
	"github.com/checkins/checkins/domain"
)

// EventLog reads check-ins from the event stream with XRANGE/XREVRANGE: from one stream, or
// merged across the P partitions of a partitioned one.
//
// Across partitions, check-ins are ordered by entry ID and then by partition: two partitions can
// hold the same ID (each stream numbers its own entries; a migration keeps IDs, so copies from one
// stream never collide). A page's cursor is its last entry's ID, and with P > 1 also its partition,
// "<ms>-<seq>.<partition>": the next page starts right after that entry in this order. A cursor
// without a partition (issued by a service with one stream) means after that ID in every
// partition, which is exactly where it pointed before the stream was split.
type EventLog struct {
	client  redis.UniversalClient
	streams []string
}

// NewEventLog reads and merges every partition of keys (keys.Stream() unless
// keys.WithPartitions).
func NewEventLog(client redis.UniversalClient, keys KeySpace) *EventLog {
	return NewPartitionedEventLog(client, keys.Partitions())
}

// NewPartitionedEventLog reads and merges every partition of parts.
func NewPartitionedEventLog(client redis.UniversalClient, parts Partitions) *EventLog {
	return &EventLog{client: client, streams: parts.Streams()}
}

var (
	entryIDPattern = regexp.MustCompile(`^[0-9]+-[0-9]+$`)
	cursorPattern  = regexp.MustCompile(`^([0-9]+-[0-9]+)(?:\.([0-9]{1,4}))?$`)
)

// parseEntryID accepts only IDs Redis accepts too (both parts fit uint64), so a bad cursor is a
// 400, not a Redis error.
func parseEntryID(id string) (entryPos, bool) {
	if !entryIDPattern.MatchString(id) {
		return entryPos{}, false
	}
	msPart, seqPart, _ := strings.Cut(id, "-")
	ms, err := strconv.ParseUint(msPart, 10, 64)
	if err != nil {
		return entryPos{}, false
	}
	seq, err := strconv.ParseUint(seqPart, 10, 64)
	if err != nil {
		return entryPos{}, false
	}
	return entryPos{ms: ms, seq: seq}, true
}

// entryPos is an entry's place in the merged order: its ID, then its partition.
type entryPos struct {
	ms, seq   uint64
	partition int
}

func (a entryPos) compare(b entryPos) int {
	if c := cmp.Compare(a.ms, b.ms); c != 0 {
		return c
	}
	if c := cmp.Compare(a.seq, b.seq); c != 0 {
		return c
	}
	return cmp.Compare(a.partition, b.partition)
}

func (a entryPos) id() string {
	return strconv.FormatUint(a.ms, 10) + "-" + strconv.FormatUint(a.seq, 10)
}

// Latest implements query.EventLog. Entries that are not valid check-ins (anyone can XADD) are
// skipped, looking back a bounded number of entries in each partition.
func (l *EventLog) Latest(ctx context.Context) (query.RecordedCheckin, error) {
	var best query.RecordedCheckin
	var bestPos entryPos
	found := false
	for p, stream := range l.streams {
		c, ok, err := latestIn(ctx, l.client, stream)
		if err != nil {
			return query.RecordedCheckin{}, fmt.Errorf("%w: %w", domain.ErrUnavailable, err)
		}
		if !ok {
			continue
		}
		pos, _ := parseEntryID(c.EntryID)
		pos.partition = p
		if !found || pos.compare(bestPos) > 0 {
			best, bestPos, found = c, pos, true
		}
	}
	if !found {
		return query.RecordedCheckin{}, fmt.Errorf("latest check-in: %w", domain.ErrNotFound)
	}
	return best, nil
}

func latestIn(ctx context.Context, client redis.UniversalClient, stream string) (query.RecordedCheckin, bool, error) {
	cs, err := newestIn(ctx, client, stream, "-", 1)
	if err != nil || len(cs) == 0 {
		return query.RecordedCheckin{}, false, err
	}
	return cs[0], true, nil
}

// newestScanBudget is how many entries newestIn reads back from the end of one stream at most:
// a stream ending in that many entries that are no check-ins answers with what it found.
const newestScanBudget = 1000

// newestIn reads stream from its end down to from (an entry ID or "-"): its newest limit check-ins, newest first.
func newestIn(ctx context.Context, client redis.UniversalClient, stream, from string, limit int) ([]query.RecordedCheckin, error) {
	var out []query.RecordedCheckin
	end := "+"
	batch := max(limit, 100)
	for scanned := 0; scanned < newestScanBudget; scanned += batch {
		xs, err := client.XRevRangeN(ctx, stream, end, from, int64(batch)).Result()
		if err != nil {
			return nil, err
		}
		for _, x := range xs {
			if c, ok := toCheckin(x); ok {
				if out = append(out, c); len(out) == limit {
					return out, nil
				}
			}
		}
		if len(xs) < batch {
			break
		}
		end = "(" + xs[len(xs)-1].ID
	}
	return out, nil
}

// Newest implements query.EventLog: each partition's newest limit check-ins since sinceMs,
// merged (entry ID, then partition) from the end.
func (l *EventLog) Newest(ctx context.Context, sinceMs int64, limit int) ([]query.RecordedCheckin, error) {
	type at struct {
		pos entryPos
		c   query.RecordedCheckin
	}
	var all []at
	for p, stream := range l.streams {
		cs, err := newestIn(ctx, l.client, stream, strconv.FormatInt(sinceMs, 10), limit)
		if err != nil {
			return nil, fmt.Errorf("%w: %w", domain.ErrUnavailable, err)
		}
		for _, c := range cs {
			pos, _ := parseEntryID(c.EntryID)
			pos.partition = p
			all = append(all, at{pos, c})
		}
	}
	slices.SortFunc(all, func(a, b at) int { return b.pos.compare(a.pos) })
	out := make([]query.RecordedCheckin, 0, min(len(all), limit))
	for _, a := range all[:min(len(all), limit)] {
		out = append(out, a.c)
	}
	return out, nil
}

// Range implements query.EventLog. With partitions it lists entries up to the millisecond before
// the request at most (the least clock of the servers holding them): each partition numbers its
// own entries, so a check-in recorded after a page, in that page's last millisecond, on a
// partition before the cursor's, took an ID below the cursor and no later page listed it (found
// by a review). Every later XADD gets an ID above the cap.
func (l *EventLog) Range(ctx context.Context, fromMs, toMs int64, cursor string, limit int) (query.CheckinPage, error) {
	// A cursor that is no cursor is refused whatever the range (it was taken, with an empty
	// page, when the partitions' clock cap left nothing to read).
	if cursor != "" {
		if _, err := l.parseCursor(cursor); err != nil {
			return query.CheckinPage{}, err
		}
	}
	if len(l.streams) > 1 {
		now, err := l.serverNow(ctx)
		if err != nil {
			return query.CheckinPage{}, fmt.Errorf("%w: %w", domain.ErrUnavailable, err)
		}
		toMs = min(toMs, now-1)
		if toMs < fromMs {
			return query.CheckinPage{Checkins: []query.RecordedCheckin{}}, nil
		}
	}
	// after: the page starts after this position (nil: at fromMs); a cursor from another query
	// must not widen this one below from.
	var after *entryPos
	if cursor != "" {
		pos, err := l.parseCursor(cursor)
		if err != nil {
			return query.CheckinPage{}, err
		}
		if pos.ms >= uint64(fromMs) { // #nosec G115 -- fromMs >= 0: query.Checkins.Range refuses a negative from
			after = &pos
		}
	}
	end := strconv.FormatInt(toMs, 10)
	page := query.CheckinPage{Checkins: []query.RecordedCheckin{}}
	for scanned := 0; len(page.Checkins) < limit; {
		if scanned >= RangeScanBudget {
			break // a short page; its cursor goes on where the scan stopped
		}
		// Entries that are no check-ins (other event types, anything a producer XADDs) are
		// skipped: read at least a hundred per round trip, whatever is still wanted.
		// The budget counts what Redis read, every partition's: a round reads up to want+1 of
		// each and keeps want of them merged, so with many partitions far more than it keeps.
		batch, more, read, err := l.rangeMerged(ctx, fromMs, after, end, max(limit-len(page.Checkins), 100))
		if err != nil {
			return query.CheckinPage{}, fmt.Errorf("%w: %w", domain.ErrUnavailable, err)
		}
		scanned += read
		for i, e := range batch {
			if c, ok := toCheckin(e.msg); ok {
				page.Checkins = append(page.Checkins, c)
			}
			page.Next, after = l.cursorOf(e.pos), &batch[i].pos
			if len(page.Checkins) == limit {
				more = more || i < len(batch)-1
				break
			}
		}
		if !more {
			page.Next = ""
			break
		}
	}
	return page, nil
}

// serverNow is the least of the clocks (ms) of the servers holding the partitions: TIME of each
// master on a cluster, of the server otherwise.
func (l *EventLog) serverNow(ctx context.Context) (int64, error) {
	cc, ok := l.client.(*redis.ClusterClient)
	if !ok {
		t, err := l.client.Time(ctx).Result()
		return t.UnixMilli(), err
	}
	var mu sync.Mutex
	least := int64(math.MaxInt64)
	err := cc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error {
		t, err := c.Time(ctx).Result()
		if err != nil {
			return err
		}
		mu.Lock()
		least = min(least, t.UnixMilli())
		mu.Unlock()
		return nil
	})
	return least, err
}

// RangeScanBudget is about the most stream entries one page of Range reads (of every partition): past it, the page is
// answered as far as it got, with a cursor to go on from. Without it a range of many entries
// that are no check-ins took a round trip per entry, and one request could hold Redis for
// seconds.
const RangeScanBudget = 10_000

// parseCursor reads a cursor of this log; a partition beyond the log's is refused, a cursor
// without one means after its ID in every partition.
func (l *EventLog) parseCursor(cursor string) (entryPos, error) {
	bad := &domain.ValidationError{Code: domain.CodeInvalid, Field: "cursor",
		Message: fmt.Sprintf("is not a cursor returned by this API: %q", cursor)}
	m := cursorPattern.FindStringSubmatch(cursor)
	if m == nil {
		return entryPos{}, bad
	}
	pos, ok := parseEntryID(m[1])
	if !ok {
		return entryPos{}, bad
	}
	pos.partition = len(l.streams) - 1
	if m[2] != "" {
		p, err := strconv.Atoi(m[2])
		if err != nil {
			return entryPos{}, bad
		}
		// A partition beyond this count: a cursor of a count before a migration to fewer
		// partitions, which was refused (found by a review). It means after its ID in every
		// partition, as a cursor without one does (the README: it may skip or repeat entries
		// that share its ID).
		pos.partition = min(p, len(l.streams)-1)
	}
	return pos, nil
}

// cursorOf is the cursor continuing after pos: its ID alone with one stream (as before
// partitions), with the partition otherwise.
func (l *EventLog) cursorOf(pos entryPos) string {
	if len(l.streams) == 1 {
		return pos.id()
	}
	return pos.id() + "." + strconv.Itoa(pos.partition)
}

type mergedEntry struct {
	pos entryPos
	msg redis.XMessage
}

// rangeMerged returns the first want entries of every partition in [after or fromMs, end], in
// merged order, and whether more follow them: each partition is asked for one entry more than
// want, so a last page of exactly want entries says there is nothing after it (no cursor to an
// empty page).
func (l *EventLog) rangeMerged(ctx context.Context, fromMs int64, after *entryPos, end string, want int) (_ []mergedEntry, more bool, read int, _ error) {
	cmds := make([]*redis.XMessageSliceCmd, len(l.streams))
	pipe := l.client.Pipeline()
	for p, stream := range l.streams {
		start := strconv.FormatInt(fromMs, 10)
		if after != nil {
			// Entries of a later partition with after's very ID come after it; of this or an
			// earlier partition, they do not.
			start = after.id()
			if p <= after.partition {
				if after.ms == math.MaxUint64 && after.seq == math.MaxUint64 {
					continue // nothing comes after the greatest ID (Redis refuses the range)
				}
				start = "(" + start
			}
		}
		cmds[p] = pipe.XRangeN(ctx, stream, start, end, int64(want)+1)
	}
	if _, err := pipe.Exec(ctx); err != nil { // nothing to send: no error
		return nil, false, 0, err
	}
	var all []mergedEntry
	for p, cmd := range cmds {
		if cmd == nil {
			continue
		}
		xs := cmd.Val()
		for _, x := range xs {
			pos, ok := parseEntryID(x.ID)
			if !ok {
				return nil, false, 0, fmt.Errorf("stream %s returned entry ID %q", l.streams[p], x.ID)
			}
			pos.partition = p
			all = append(all, mergedEntry{pos: pos, msg: x})
		}
	}
	slices.SortFunc(all, func(a, b mergedEntry) int { return a.pos.compare(b.pos) })
	if len(all) > want {
		return all[:want], true, len(all), nil
	}
	return all, false, len(all), nil
}

func toCheckin(x redis.XMessage) (query.RecordedCheckin, bool) {
	f := make(map[string]string, len(x.Values))
	for k, v := range x.Values {
		if s, ok := v.(string); ok {
			f[k] = s
		}
	}
	ev, err := domain.ParseEvent(x.ID, f)
	if err != nil {
		return query.RecordedCheckin{}, false
	}
	c, ok := ev.(domain.CheckinRecorded)
	if !ok {
		return query.RecordedCheckin{}, false
	}
	return query.RecordedCheckin{EntryID: x.ID, CheckinRecorded: c}, true
}
