package domain_test

import (
	"maps"
	"math"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/checkins/checkins/domain"
)

// testEntryID is the stream entry ID Redis would give sampleEvent: recorded at testNow.
var testEntryID = strconv.FormatInt(testNow.UnixMilli(), 10) + "-0"

func sampleEvent() domain.CheckinRecorded {
	return domain.CheckinRecorded{
		Checkin: domain.Checkin{
			ID: "ck-7", UserID: 42, LocationID: 9, StarRating: 3,
			Timestamp: testNow.Add(-time.Minute).UnixMilli(),
		},
		RecordedAt: testNow.UnixMilli(),
	}
}

func TestCheckinRecordedRoundTrip(t *testing.T) {
	t.Parallel()
	ev := sampleEvent()
	f := ev.Fields()
	assert.Equal(t, map[string]string{
		"type": "checkin.recorded.v1", "checkinId": "ck-7", "userId": "42", "locationId": "9",
		"starRating": "3", "timestamp": strconv.FormatInt(ev.Timestamp, 10), "recordedAt": strconv.FormatInt(ev.RecordedAt, 10),
	}, f)
	got, err := domain.ParseEvent(testEntryID, f)
	require.NoError(t, err)
	assert.Equal(t, ev, got)
	assert.Equal(t, domain.EventCheckinRecorded, got.EventName())
}

func TestParseEventAcceptsOldAndPartialEvents(t *testing.T) {
	t.Parallel()
	old := time.Date(2019, 1, 2, 3, 4, 5, 0, time.UTC)
	tests := map[string]func(map[string]string){
		// Replaying history must work years later: the future bound is judged against recordedAt.
		"recorded years ago": func(f map[string]string) {
			f["timestamp"] = strconv.FormatInt(old.UnixMilli(), 10)
			f["recordedAt"] = strconv.FormatInt(old.Add(time.Second).UnixMilli(), 10)
		},
		"timestamp years before recordedAt": func(f map[string]string) {
			f["timestamp"] = strconv.FormatInt(old.UnixMilli(), 10)
		},
		"no recordedAt (written by hand)": func(f map[string]string) {
			f["timestamp"] = strconv.FormatInt(old.UnixMilli(), 10)
			delete(f, "recordedAt")
		},
		"timestamp slightly ahead of recordedAt": func(f map[string]string) {
			f["timestamp"] = strconv.FormatInt(testNow.UnixMilli()+int64(4*time.Minute/time.Millisecond), 10)
		},
		"extra unknown fields": func(f map[string]string) { f["meta:correlation_id"] = "abc"; f["foo"] = "bar" },
	}
	for name, change := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			f := sampleEvent().Fields()
			change(f)
			ev, err := domain.ParseEvent(testEntryID, f)
			require.NoError(t, err)
			c, ok := ev.(domain.CheckinRecorded)
			require.True(t, ok)
			assert.Equal(t, f["timestamp"], strconv.FormatInt(c.Timestamp, 10))
			assert.Equal(t, "ck-7", c.ID)
		})
	}
}

func TestParseEventRejects(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name      string
		change    func(map[string]string)
		wantField string
	}{
		{"type missing", func(f map[string]string) { delete(f, "type") }, "type"},
		{"type empty", func(f map[string]string) { f["type"] = "" }, "type"},
		{"type unknown", func(f map[string]string) { f["type"] = "checkin.deleted.v1" }, "type"},
		{"type of another version", func(f map[string]string) { f["type"] = "checkin.recorded.v2" }, "type"},
		{"checkinId missing", func(f map[string]string) { delete(f, "checkinId") }, "checkinId"},
		{"checkinId empty", func(f map[string]string) { f["checkinId"] = "" }, "checkinId"},
		{"checkinId bad characters", func(f map[string]string) { f["checkinId"] = "a b" }, "checkinId"},
		{"userId missing", func(f map[string]string) { delete(f, "userId") }, "userId"},
		{"userId not an integer", func(f map[string]string) { f["userId"] = "abc" }, "userId"},
		{"userId float", func(f map[string]string) { f["userId"] = "4.5" }, "userId"},
		{"userId empty", func(f map[string]string) { f["userId"] = "" }, "userId"},
		{"userId overflow", func(f map[string]string) { f["userId"] = "99999999999999999999" }, "userId"},
		{"userId zero", func(f map[string]string) { f["userId"] = "0" }, "userId"},
		{"locationId missing", func(f map[string]string) { delete(f, "locationId") }, "locationId"},
		{"locationId not an integer", func(f map[string]string) { f["locationId"] = "x1" }, "locationId"},
		{"locationId negative", func(f map[string]string) { f["locationId"] = "-3" }, "locationId"},
		{"starRating missing", func(f map[string]string) { delete(f, "starRating") }, "starRating"},
		{"starRating not an integer", func(f map[string]string) { f["starRating"] = "five" }, "starRating"},
		{"starRating 6", func(f map[string]string) { f["starRating"] = "6" }, "starRating"},
		{"starRating -1", func(f map[string]string) { f["starRating"] = "-1" }, "starRating"},
		{"timestamp missing", func(f map[string]string) { delete(f, "timestamp") }, "timestamp"},
		{"timestamp not an integer", func(f map[string]string) { f["timestamp"] = "2026-01-01" }, "timestamp"},
		{"timestamp zero", func(f map[string]string) { f["timestamp"] = "0" }, "timestamp"},
		{"timestamp far after recordedAt", func(f map[string]string) {
			f["timestamp"] = strconv.FormatInt(testNow.Add(time.Hour).UnixMilli(), 10)
		}, "timestamp"},
		{"recordedAt not an integer", func(f map[string]string) { f["recordedAt"] = "yesterday" }, "recordedAt"},
		{"recordedAt 0, timestamp far after the entry ID", func(f map[string]string) {
			f["recordedAt"] = "0"
			f["timestamp"] = "253402300799999"
		}, "timestamp"},
		{"recordedAt negative", func(f map[string]string) { f["recordedAt"] = "-5" }, "recordedAt"},
		{"recordedAt empty", func(f map[string]string) { f["recordedAt"] = "" }, "recordedAt"},
		// Without recordedAt (an entry a producer wrote by hand) the entry ID's time bounds the
		// timestamp: the year 9999 would otherwise be a user's latest check-in for good.
		{"no recordedAt, timestamp far after the entry ID", func(f map[string]string) {
			delete(f, "recordedAt")
			f["timestamp"] = "253402300799999"
		}, "timestamp"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			f := sampleEvent().Fields()
			tt.change(f)
			before := maps.Clone(f)
			ev, err := domain.ParseEvent(testEntryID, f)
			require.Error(t, err)
			assert.Nil(t, ev)
			var ve *domain.ValidationError
			require.ErrorAs(t, err, &ve)
			assert.Equal(t, tt.wantField, ve.Field)
			assert.Contains(t, err.Error(), tt.wantField)
			assert.Equal(t, before, f, "ParseEvent must not modify its input")
		})
	}
}

// TestParseEventWithoutRecordedAtNeedsItsEntryID: an entry without recordedAt is bounded by the
// time in its stream entry ID; without a usable one it is refused, saying so.
func TestParseEventWithoutRecordedAtNeedsItsEntryID(t *testing.T) {
	t.Parallel()
	f := sampleEvent().Fields()
	delete(f, "recordedAt")
	for _, id := range []string{"", "x", "12", "-1-0", "12-x"} {
		_, err := domain.ParseEvent(id, f)
		var ve *domain.ValidationError
		require.ErrorAs(t, err, &ve, "entry ID %q", id)
		assert.Equal(t, "recordedAt", ve.Field)
		assert.Contains(t, err.Error(), "is missing, and the stream entry ID")
	}
	ahead := strconv.FormatInt(testNow.Add(4*time.Minute).UnixMilli(), 10)
	f["timestamp"] = ahead
	_, err := domain.ParseEvent(testEntryID, f)
	require.NoError(t, err, "within the 5 minutes of skew the API allows")
	f["timestamp"] = strconv.FormatInt(testNow.Add(6*time.Minute).UnixMilli(), 10)
	_, err = domain.ParseEvent(testEntryID, f)
	require.ErrorContains(t, err, "in the future")
	ev, err := domain.ParseEvent(strconv.FormatInt(testNow.Add(2*time.Minute).UnixMilli(), 10)+"-3", f)
	require.NoError(t, err, "an entry Redis recorded later")
	assert.Zero(t, ev.(domain.CheckinRecorded).RecordedAt, "no recordedAt is made up")
}

func TestParseEventEmpty(t *testing.T) {
	t.Parallel()
	for _, f := range []map[string]string{nil, {}, {"foo": "bar"}} {
		_, err := domain.ParseEvent(testEntryID, f)
		var ve *domain.ValidationError
		require.ErrorAs(t, err, &ve)
		assert.Equal(t, "type", ve.Field)
		assert.Equal(t, domain.CodeInvalidEvent, ve.Code)
	}
}

// TestExtremeIntegersGetTheRightReason: values at the ends of int64, in events written by hand
// (with or without recordedAt) and in client input, are refused saying what is wrong; no
// arithmetic on them overflows into a wrong message ("is 0 ms in the future").
func TestExtremeIntegersGetTheRightReason(t *testing.T) {
	t.Parallel()
	maxI, minI := strconv.FormatInt(math.MaxInt64, 10), strconv.FormatInt(math.MinInt64, 10)
	tests := []struct {
		name   string
		change func(map[string]string)
		field  string
		reason string
	}{
		{"timestamp max int64, no recordedAt", func(f map[string]string) { delete(f, "recordedAt"); f["timestamp"] = maxI }, "timestamp", "from 1 to 253402300799999 (9999-12-31T23:59:59.999Z), got " + maxI},
		{"timestamp max int64", func(f map[string]string) { f["timestamp"] = maxI }, "timestamp", "got " + maxI},
		{"timestamp min int64", func(f map[string]string) { f["timestamp"] = minI }, "timestamp", "got " + minI},
		{"timestamp one past year 9999", func(f map[string]string) { delete(f, "recordedAt"); f["timestamp"] = "253402300800000" }, "timestamp", "got 253402300800000"},
		{"recordedAt max int64", func(f map[string]string) { f["recordedAt"] = maxI }, "recordedAt", "from 1 to 253402300799999 (0: none), got " + maxI},
		{"recordedAt min int64", func(f map[string]string) { f["recordedAt"] = minI }, "recordedAt", "from 1 to 253402300799999 (0: none), got " + minI},
		{"userId min int64", func(f map[string]string) { f["userId"] = minI }, "userId", "must be an integer >= 1, got " + minI},
		{"starRating max int64", func(f map[string]string) { f["starRating"] = maxI }, "starRating", "from 0 to 5, got " + maxI},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			f := sampleEvent().Fields()
			tt.change(f)
			_, err := domain.ParseEvent(testEntryID, f)
			var ve *domain.ValidationError
			require.ErrorAs(t, err, &ve)
			assert.Equal(t, tt.field, ve.Field)
			assert.Contains(t, err.Error(), tt.reason)
			assert.NotContains(t, err.Error(), "0 ms in the future")
		})
	}
	// At the limits, valid values are taken as they are.
	f := sampleEvent().Fields()
	f["recordedAt"], f["timestamp"], f["userId"], f["locationId"] = "253402300799999", "253402300799999", maxI, maxI
	ev, err := domain.ParseEvent(testEntryID, f)
	require.NoError(t, err)
	c := ev.(domain.CheckinRecorded).Checkin
	assert.Equal(t, int64(domain.MaxTimestamp), c.Timestamp)
	assert.Equal(t, int64(math.MaxInt64), c.UserID)

	// Client input, judged against now.
	now := time.Now()
	one, zero := int64(1), int64(3)
	for ts, reason := range map[int64]string{
		math.MaxInt64:                  "from 1 to 253402300799999",
		math.MinInt64:                  "got " + minI,
		now.Add(time.Hour).UnixMilli(): "is 3600000 ms in the future",
	} {
		in := domain.CheckinInput{UserID: &one, LocationID: &one, StarRating: &zero, Timestamp: &ts}
		_, err := domain.NewCheckin(in, now, func() string { return "id" })
		require.Error(t, err, "timestamp %d", ts)
		assert.Contains(t, err.Error(), reason, "timestamp %d", ts)
	}
}

// TestEventIdentity: with the fingerprint of the request, the same body sent again is the same
// check-in whatever time the API stamped on it; another body under the same checkinId is
// another; without a fingerprint the content decides. The fingerprint survives the flat form,
// and a malformed one is refused.
func TestEventIdentity(t *testing.T) {
	t.Parallel()
	user, loc, stars := int64(1), int64(2), int64(3)
	id := "ck"
	in := domain.CheckinInput{CheckinID: &id, UserID: &user, LocationID: &loc, StarRating: &stars}
	mk := func(in domain.CheckinInput, ts int64) domain.CheckinRecorded {
		c, err := domain.NewCheckin(in, time.UnixMilli(ts), nil)
		require.NoError(t, err)
		return domain.CheckinRecorded{Checkin: c, RecordedAt: ts, Fingerprint: in.Fingerprint()}
	}
	a, later := mk(in, 1_000), mk(in, 90_000_000)
	require.NotEqual(t, a.Timestamp, later.Timestamp)
	assert.Equal(t, a.Identity(), later.Identity(), "the same body, stamped at another time")
	other := stars + 1
	b := mk(domain.CheckinInput{CheckinID: &id, UserID: &user, LocationID: &loc, StarRating: &other}, 1_000)
	assert.NotEqual(t, a.Identity(), b.Identity(), "another body")
	plain := domain.CheckinRecorded{Checkin: a.Checkin, RecordedAt: a.RecordedAt}
	assert.Equal(t, a.Checkin.Identity(), plain.Identity(), "no fingerprint: the content")
	assert.NotEqual(t, plain.Identity(), domain.CheckinRecorded{Checkin: later.Checkin}.Identity())
	assert.GreaterOrEqual(t, a.Identity(), int64(0))

	ev, err := domain.ParseEvent(testEntryID, a.Fields())
	require.NoError(t, err)
	assert.Equal(t, a, ev)
	for _, bad := range []string{"", "xyz", strings.Repeat("A", 32), strings.Repeat("0", 31)} {
		f := a.Fields()
		f["fingerprint"] = bad
		_, err := domain.ParseEvent(testEntryID, f)
		require.Error(t, err, "fingerprint %q", bad)
		assert.Contains(t, err.Error(), "fingerprint")
	}
}
