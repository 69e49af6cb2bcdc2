package domain_test

import (
	"maps"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/checkins/checkins/domain"
)

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
	got, err := domain.ParseEvent(f)
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
			ev, err := domain.ParseEvent(f)
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
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			f := sampleEvent().Fields()
			tt.change(f)
			before := maps.Clone(f)
			ev, err := domain.ParseEvent(f)
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

func TestParseEventEmpty(t *testing.T) {
	t.Parallel()
	for _, f := range []map[string]string{nil, {}, {"foo": "bar"}} {
		_, err := domain.ParseEvent(f)
		var ve *domain.ValidationError
		require.ErrorAs(t, err, &ve)
		assert.Equal(t, "type", ve.Field)
		assert.Equal(t, domain.CodeInvalidEvent, ve.Code)
	}
}
