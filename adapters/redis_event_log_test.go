package adapters_test

import (
	"context"
	"fmt"
	"slices"
	"sync/atomic"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/checkins/checkins/adapters"
	"github.com/checkins/checkins/adapters/redistest"
	"github.com/checkins/checkins/domain"
)

// xadd writes fields under an explicit entry ID ("*" for a server-chosen one).
func xadd(t testing.TB, c redis.UniversalClient, stream, id string, fields map[string]string) string {
	t.Helper()
	values := make(map[string]any, len(fields))
	for k, v := range fields {
		values[k] = v
	}
	got, err := c.XAdd(context.Background(), &redis.XAddArgs{Stream: stream, ID: id, Values: values}).Result()
	require.NoError(t, err)
	return got
}

var garbage = []map[string]string{
	{"foo": "bar"},
	{"type": "checkin.recorded.v1", "checkinId": "bad", "userId": "x", "locationId": "1", "starRating": "1", "timestamp": "1"},
	{"type": "checkin.deleted.v9"},
	{"_watermill_message_uuid": "u", "payload": `{"userId":1}`},
}

func TestEventLogLatestSkipsMalformed(t *testing.T) {
	t.Parallel()
	env := newProjEnv(t)
	ctx := context.Background()
	log := adapters.NewEventLog(env.client, env.keys)

	_, err := log.Latest(ctx)
	require.ErrorIs(t, err, domain.ErrNotFound, "empty stream")

	stream := env.keys.Stream()
	xadd(t, env.client, stream, "*", recorded("old", 1, 1, 1, 100).Fields())
	valid := recorded("ck-1", 42, 7, 3, 1_700_000_000_000)
	id := xadd(t, env.client, stream, "*", valid.Fields())
	for _, g := range garbage {
		xadd(t, env.client, stream, "*", g)
	}
	got, err := log.Latest(ctx)
	require.NoError(t, err)
	assert.Equal(t, id, got.EntryID)
	assert.Equal(t, valid, got.CheckinRecorded)

	// Only garbage: not found, not an error.
	only := env.with("garbage")
	for _, g := range garbage {
		xadd(t, env.client, only.keys.Stream(), "*", g)
	}
	_, err = adapters.NewEventLog(env.client, only.keys).Latest(ctx)
	assert.ErrorIs(t, err, domain.ErrNotFound)
}

// rangeStream writes check-ins at entry times 1000, 1000, 2000, ..., with garbage in between, and
// returns the IDs of the valid entries per entry time.
func rangeStream(t testing.TB, env projEnv) map[int64][]string {
	t.Helper()
	stream := env.keys.Stream()
	valid := map[int64][]string{}
	n := 0
	for ms := int64(1000); ms <= 10000; ms += 1000 {
		for seq := range 3 {
			id := fmt.Sprintf("%d-%d", ms, seq)
			if seq == 1 {
				xadd(t, env.client, stream, id, garbage[n%len(garbage)])
				continue
			}
			n++
			xadd(t, env.client, stream, id, recorded(fmt.Sprintf("ck-%d", n), 1, 1, 1, 5).Fields())
			valid[ms] = append(valid[ms], id)
		}
	}
	return valid
}

func TestEventLogRange(t *testing.T) {
	t.Parallel()
	env := newProjEnv(t)
	ctx := context.Background()
	valid := rangeStream(t, env)
	log := adapters.NewEventLog(env.client, env.keys)
	want := func(from, to int64) []string {
		var out []string
		for ms := from - from%1000; ms <= to; ms += 1000 {
			if ms >= from {
				out = append(out, valid[ms]...)
			}
		}
		return out
	}
	ids := func(from, to int64, cursor string, limit int) ([]string, string) {
		page, err := log.Range(ctx, from, to, cursor, limit)
		require.NoError(t, err)
		var out []string
		for _, c := range page.Checkins {
			out = append(out, c.EntryID)
			assert.NotEmpty(t, c.ID)
		}
		return out, page.Next
	}

	got, next := ids(0, 1<<62, "", 1000)
	assert.Equal(t, want(0, 20000), got, "everything, oldest first, no garbage")
	assert.Empty(t, next)

	got, _ = ids(3000, 5000, "", 1000)
	assert.Equal(t, want(3000, 5000), got, "from and to are inclusive entry times")
	got, _ = ids(3001, 4999, "", 1000)
	assert.Equal(t, want(4000, 4000), got)
	got, _ = ids(20000, 30000, "", 1000)
	assert.Empty(t, got)

	got, next = ids(0, 1<<62, "", 3)
	assert.Equal(t, want(0, 20000)[:3], got, "limit")
	assert.NotEmpty(t, next)

	// A last page of exactly limit check-ins has no cursor (to an empty page).
	got, next = ids(0, 1<<62, "", len(want(0, 20000)))
	assert.Equal(t, want(0, 20000), got)
	assert.Empty(t, next, "nothing after the last page")
	got, next = ids(2000, 3000, "", len(want(2000, 3000)))
	assert.Equal(t, want(2000, 3000), got)
	assert.Empty(t, next, "nothing after the last page of a time range")

	// Walk all pages of every size: each entry exactly once, in order.
	for limit := 1; limit <= 7; limit++ {
		var all []string
		cursor := ""
		for pages := 0; ; pages++ {
			require.Less(t, pages, 100, "the cursor does not advance")
			got, next := ids(2000, 8000, cursor, limit)
			assert.LessOrEqual(t, len(got), limit)
			all = append(all, got...)
			if next == "" {
				break
			}
			cursor = next
		}
		assert.Equal(t, want(2000, 8000), all, "limit %d", limit)
	}
}

func TestEventLogRangeCursorStaysInRange(t *testing.T) {
	t.Parallel()
	env := newProjEnv(t)
	ctx := context.Background()
	valid := rangeStream(t, env)
	log := adapters.NewEventLog(env.client, env.keys)
	// A cursor from an earlier time range must not widen the query below from.
	page, err := log.Range(ctx, 5000, 6000, "1000-0", 100)
	require.NoError(t, err)
	var got []string
	for _, c := range page.Checkins {
		got = append(got, c.EntryID)
	}
	assert.Equal(t, append(append([]string{}, valid[5000]...), valid[6000]...), got)
}

func TestEventLogRangeInvalidCursor(t *testing.T) {
	t.Parallel()
	env := newProjEnv(t)
	rangeStream(t, env)
	log := adapters.NewEventLog(env.client, env.keys)
	for _, cursor := range []string{"abc", "1", "1-", "-1", "1-2-3", "+", "(1-0", "99999999999999999999999-0", "1-99999999999999999999999"} {
		_, err := log.Range(context.Background(), 0, 1<<62, cursor, 10)
		var ve *domain.ValidationError
		require.ErrorAs(t, err, &ve, "cursor %q", cursor)
		assert.Equal(t, "cursor", ve.Field)
		assert.NotErrorIs(t, err, domain.ErrUnavailable)
	}
}

// A cursor at the greatest stream ID is well formed, and nothing comes after it: an empty last
// page, not a storage failure (Redis refuses a range that starts after that ID).
func TestEventLogRangeAfterTheGreatestID(t *testing.T) {
	t.Parallel()
	env := newProjEnv(t)
	rangeStream(t, env)
	log := adapters.NewEventLog(env.client, env.keys)
	for _, cursor := range []string{"18446744073709551615-18446744073709551615", "18446744073709551615-18446744073709551614"} {
		page, err := log.Range(context.Background(), 0, 1<<62, cursor, 10)
		require.NoError(t, err, cursor)
		assert.Empty(t, page.Checkins, cursor)
		assert.Empty(t, page.Next, cursor)
	}
}

func TestEventLogUnavailable(t *testing.T) {
	t.Parallel()
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1})
	defer c.Close()
	log := adapters.NewEventLog(c, adapters.KeySpace{Prefix: "x"})
	_, err := log.Latest(context.Background())
	assert.ErrorIs(t, err, domain.ErrUnavailable)
	_, err = log.Range(context.Background(), 0, 10, "", 10)
	assert.ErrorIs(t, err, domain.ErrUnavailable)
}

// TestPartitionedEventLogMergesExactly: check-ins spread over P partitions, with entry IDs that
// repeat across partitions and garbage in between, read back page by page for every limit, are
// exactly the merged order (entry ID, then partition), on a single server and on a cluster. A
// cursor issued with one stream (an ID without a partition) still continues after its ID.
func TestPartitionedEventLogMergesExactly(t *testing.T) {
	eachEnv(t, func(t *testing.T, env projEnv) {
		ctx := context.Background()
		parts, err := adapters.NewPartitions(env.keys, 4)
		require.NoError(t, err)
		type at struct {
			id string
			p  int
		}
		var want []at // in merged order
		n := 0
		for ms := int64(1000); ms <= 6000; ms += 1000 {
			for seq := range 3 {
				id := fmt.Sprintf("%d-%d", ms, seq)
				for p := range parts.Count() {
					if (int(ms/1000)+seq+p)%3 == 0 { // some IDs in several partitions, some in none
						continue
					}
					if (seq+p)%4 == 1 {
						xadd(t, env.client, parts.Stream(p), id, garbage[n%len(garbage)])
						n++
						continue
					}
					n++
					xadd(t, env.client, parts.Stream(p), id, recorded(fmt.Sprintf("ck-%d", n), int64(p+1), 1, 1, 5).Fields())
					want = append(want, at{id, p})
				}
			}
		}
		log := adapters.NewPartitionedEventLog(env.client, parts)
		// Each partition's check-ins carry userId p+1, so an answer says its partition.
		read := func(from, to int64, cursor string, limit int) ([]at, []string) {
			var got []at
			var cursors []string
			for range 1000 {
				page, err := log.Range(ctx, from, to, cursor, limit)
				require.NoError(t, err)
				require.LessOrEqual(t, len(page.Checkins), limit)
				for _, c := range page.Checkins {
					got = append(got, at{c.EntryID, int(c.UserID - 1)})
				}
				if page.Next == "" {
					return got, cursors
				}
				cursors = append(cursors, page.Next)
				cursor = page.Next
			}
			t.Fatal("paging did not end")
			return nil, nil
		}
		for limit := 1; limit <= len(want)+1; limit++ {
			got, cursors := read(0, 1<<40, "", limit)
			require.Equal(t, want, got, "limit %d", limit)
			for _, c := range cursors {
				assert.Regexp(t, `^[0-9]+-[0-9]+\.[0-3]$`, c)
			}
		}
		inRange := func(from, to int64) []at {
			var out []at
			for _, a := range want {
				if pos, _ := adapters.ScoreOfEntry(a.id); pos/1024 >= from && pos/1024 <= to {
					out = append(out, a)
				}
			}
			return out
		}
		got, _ := read(2000, 4000, "", 3)
		assert.Equal(t, inRange(2000, 4000), got)

		// A cursor of one stream ("3000-1"): everything after that ID, whatever the partition.
		got, _ = read(0, 1<<40, "3000-1", 5)
		var after []at
		for _, a := range want {
			if pos, _ := adapters.ScoreOfEntry(a.id); pos > 3000*1024+1 {
				after = append(after, a)
			}
		}
		assert.Equal(t, after, got)

		latest, err := log.Latest(ctx)
		require.NoError(t, err)
		last := want[len(want)-1]
		assert.Equal(t, last, at{latest.EntryID, int(latest.UserID - 1)})

		// Newest is the same merged order read from its end, down to since.
		for limit := 1; limit <= len(want)+1; limit++ {
			for _, since := range []int64{0, 4000} {
				cs, err := log.Newest(ctx, since, limit)
				require.NoError(t, err)
				var got, rev []at
				for _, c := range cs {
					got = append(got, at{c.EntryID, int(c.UserID - 1)})
				}
				for _, a := range slices.Backward(inRange(since, 1<<40)) {
					if len(rev) < limit {
						rev = append(rev, a)
					}
				}
				require.Equal(t, rev, got, "limit %d since %d", limit, since)
			}
		}

		// A partition beyond the count (a cursor of before a migration to fewer partitions)
		// means after its ID in every partition, as a cursor without one does.
		beyond, err := log.Range(ctx, 0, 1<<40, "1000-0.4", 10)
		require.NoError(t, err)
		plain, err := log.Range(ctx, 0, 1<<40, "1000-0", 10)
		require.NoError(t, err)
		assert.Equal(t, plain, beyond)
		for _, bad := range []string{"1000-0.", "1000-0.-1", "1000-0.00000", "1000-0:1", "x.1"} {
			_, err := log.Range(ctx, 0, 1<<40, bad, 10)
			var ve *domain.ValidationError
			require.ErrorAs(t, err, &ve, "cursor %q", bad)
			assert.Equal(t, "cursor", ve.Field)
		}
	})
}

// xrangeCounter counts the XRANGE commands a client sends, pipelined or not (n), and the
// entries the pipelined ones bring back (entries).
type xrangeCounter struct{ n, entries atomic.Int64 }

func (h *xrangeCounter) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *xrangeCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if cmd.Name() == "xrange" {
			h.n.Add(1)
		}
		return next(ctx, cmd)
	}
}
func (h *xrangeCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		for _, c := range cmds {
			if x, ok := c.(*redis.XMessageSliceCmd); ok && c.Name() == "xrange" {
				h.n.Add(1)
				h.entries.Add(int64(len(x.Val())))
			}
		}
		return err
	}
}

// TestEventLogRangeOverEntriesThatAreNoCheckins: a range of many entries that are no check-ins
// (another event type, anything a producer XADDs) is read a hundred or more at a time, and one
// page reads at most RangeScanBudget entries, answering what it found with a cursor to go on:
// it took a round trip per entry (20,000 entries: 2.7 s), and one request could hold Redis.
func TestEventLogRangeOverEntriesThatAreNoCheckins(t *testing.T) {
	t.Parallel()
	env := newProjEnv(t)
	ctx := context.Background()
	pipe := env.client.Pipeline()
	junk := adapters.RangeScanBudget + 2_000
	for i := range junk {
		pipe.XAdd(ctx, &redis.XAddArgs{Stream: env.keys.Stream(), ID: fmt.Sprintf("1000-%d", i+1), Values: []string{"type", "other.v1"}})
	}
	_, err := pipe.Exec(ctx)
	require.NoError(t, err)
	c := domain.CheckinRecorded{Checkin: domain.Checkin{ID: "real", UserID: 1, LocationID: 2, StarRating: 3, Timestamp: 1000}, RecordedAt: 1000}
	real := xadd(t, env.client, env.keys.Stream(), "1001-0", c.Fields())

	counter := &xrangeCounter{}
	client := redistest.Client(t, env.url)
	client.AddHook(counter)
	log := adapters.NewEventLog(client, env.keys)
	page, err := log.Range(ctx, 0, 2000, "", 1)
	require.NoError(t, err)
	assert.Empty(t, page.Checkins, "the budget ends the first page")
	require.NotEmpty(t, page.Next, "with a cursor to go on")
	assert.LessOrEqual(t, counter.n.Load(), int64(adapters.RangeScanBudget/100+1), "a hundred entries or more per XRANGE")
	page, err = log.Range(ctx, 0, 2000, page.Next, 1)
	require.NoError(t, err)
	require.Len(t, page.Checkins, 1)
	assert.Equal(t, real, page.Checkins[0].EntryID)
	assert.Empty(t, page.Next, "nothing after it")
	assert.LessOrEqual(t, counter.n.Load(), int64(junk/100+2))
}

// TestEventLogRangeBudgetCountsEveryPartitionsReads: with partitions a round reads up to
// want+1 entries of each and keeps want merged; the page's budget counts what was read, so a
// page over entries that are no check-ins reads about RangeScanBudget entries whatever the
// partition count (it counted the kept ones: 8 partitions read eight times the budget).
func TestEventLogRangeBudgetCountsEveryPartitionsReads(t *testing.T) {
	t.Parallel()
	env := newProjEnv(t)
	ctx := context.Background()
	keys, err := env.keys.WithPartitions(8)
	require.NoError(t, err)
	pipe := env.client.Pipeline()
	for p, stream := range keys.Partitions().Streams() {
		for i := range 3_000 {
			pipe.XAdd(ctx, &redis.XAddArgs{Stream: stream, ID: fmt.Sprintf("1000-%d", i*8+p+1), Values: []string{"type", "other.v1"}})
		}
	}
	_, err = pipe.Exec(ctx)
	require.NoError(t, err)
	reads := &xrangeCounter{}
	client := redistest.Client(t, env.url)
	client.AddHook(reads)
	page, err := adapters.NewEventLog(client, keys).Range(ctx, 0, 2000, "", 1)
	require.NoError(t, err)
	assert.Empty(t, page.Checkins)
	assert.NotEmpty(t, page.Next)
	assert.LessOrEqual(t, reads.entries.Load(), int64(adapters.RangeScanBudget+8*101), "entries read for one page")
}
