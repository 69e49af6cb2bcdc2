package adapters

import (
	"context"
	"fmt"
	"regexp"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/checkins/checkins/app/query"
	"github.com/checkins/checkins/domain"
)

// EventLog reads check-ins from the event stream with XRANGE/XREVRANGE.
type EventLog struct {
	client redis.UniversalClient
	stream string
}

// NewEventLog reads keys.Stream().
func NewEventLog(client redis.UniversalClient, keys KeySpace) *EventLog {
	return &EventLog{client: client, stream: keys.Stream()}
}

var entryIDPattern = regexp.MustCompile(`^[0-9]+-[0-9]+$`)

// parseEntryID accepts only IDs Redis accepts too (both parts fit uint64), so a bad cursor is a
// 400, not a Redis error; it returns the time part.
func parseEntryID(id string) (uint64, bool) {
	if !entryIDPattern.MatchString(id) {
		return 0, false
	}
	msPart, seqPart, _ := strings.Cut(id, "-")
	ms, err := strconv.ParseUint(msPart, 10, 64)
	if err != nil {
		return 0, false
	}
	if _, err := strconv.ParseUint(seqPart, 10, 64); err != nil {
		return 0, false
	}
	return ms, true
}

// Latest implements query.EventLog. Entries that are not valid check-ins (anyone can XADD) are
// skipped, looking back a bounded number of entries.
func (l *EventLog) Latest(ctx context.Context) (query.RecordedCheckin, error) {
	end := "+"
	for range 10 {
		xs, err := l.client.XRevRangeN(ctx, l.stream, end, "-", 100).Result()
		if err != nil {
			return query.RecordedCheckin{}, fmt.Errorf("%w: %w", domain.ErrUnavailable, err)
		}
		for _, x := range xs {
			if c, ok := toCheckin(x); ok {
				return c, nil
			}
		}
		if len(xs) < 100 {
			break
		}
		end = "(" + xs[len(xs)-1].ID
	}
	return query.RecordedCheckin{}, fmt.Errorf("latest check-in: %w", domain.ErrNotFound)
}

// Range implements query.EventLog.
func (l *EventLog) Range(ctx context.Context, fromMs, toMs int64, cursor string, limit int) (query.CheckinPage, error) {
	start := strconv.FormatInt(fromMs, 10)
	if cursor != "" {
		ms, ok := parseEntryID(cursor)
		if !ok {
			return query.CheckinPage{}, &domain.ValidationError{Code: domain.CodeInvalid, Field: "cursor", Message: fmt.Sprintf("is not a cursor returned by this API: %q", cursor)}
		}
		// A cursor from another query must not widen this one below from.
		if ms >= uint64(fromMs) { // #nosec G115 -- fromMs >= 0: query.Checkins.Range refuses a negative from
			start = "(" + cursor
		}
	}
	end := strconv.FormatInt(toMs, 10)
	page := query.CheckinPage{Checkins: []query.RecordedCheckin{}}
	for len(page.Checkins) < limit {
		want := int64(limit - len(page.Checkins))
		xs, err := l.client.XRangeN(ctx, l.stream, start, end, want).Result()
		if err != nil {
			return query.CheckinPage{}, fmt.Errorf("%w: %w", domain.ErrUnavailable, err)
		}
		for _, x := range xs {
			if c, ok := toCheckin(x); ok {
				page.Checkins = append(page.Checkins, c)
			}
			page.Next = x.ID
		}
		if int64(len(xs)) < want {
			page.Next = ""
			break
		}
		start = "(" + xs[len(xs)-1].ID
	}
	return page, nil
}

func toCheckin(x redis.XMessage) (query.RecordedCheckin, bool) {
	f := make(map[string]string, len(x.Values))
	for k, v := range x.Values {
		if s, ok := v.(string); ok {
			f[k] = s
		}
	}
	ev, err := domain.ParseEvent(f)
	if err != nil {
		return query.RecordedCheckin{}, false
	}
	c, ok := ev.(domain.CheckinRecorded)
	if !ok {
		return query.RecordedCheckin{}, false
	}
	return query.RecordedCheckin{EntryID: x.ID, CheckinRecorded: c}, true
}
