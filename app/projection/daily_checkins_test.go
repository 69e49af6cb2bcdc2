package projection_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/checkins/checkins/app/projection"
	"github.com/checkins/checkins/domain"
)

func TestDailyCheckinsCountsPerUTCDay(t *testing.T) {
	t.Parallel()
	p := newProjTest(t)
	dc := projection.DailyCheckins{}
	events := history(700, 31)
	// Two check-ins a millisecond either side of midnight UTC land on different days.
	midnight := time.Date(2023, 11, 20, 0, 0, 0, 0, time.UTC).UnixMilli()
	events = append(events,
		domain.CheckinRecorded{Checkin: domain.Checkin{ID: "before-midnight", UserID: 1, LocationID: 1, Timestamp: midnight - 1}},
		domain.CheckinRecorded{Checkin: domain.Checkin{ID: "at-midnight", UserID: 1, LocationID: 1, Timestamp: midnight}})
	p.applyAll(t, dc, events, 3)

	want := map[int64]map[string]int64{}
	for _, e := range events {
		if want[e.LocationID] == nil {
			want[e.LocationID] = map[string]int64{}
		}
		want[e.LocationID][time.UnixMilli(e.Timestamp).UTC().Format(projection.DayLayout)]++
	}
	ctx := context.Background()
	for loc, days := range want {
		// The range starts before and ends after the history, so days with none appear as 0.
		v, err := dc.Get(ctx, p.reader(dc.Name()), loc, "2023-11-10", "2023-11-30")
		require.NoError(t, err)
		require.Len(t, v.Days, 21)
		var total int64
		for _, d := range v.Days {
			assert.Equal(t, days[d.Date], d.Checkins, "location %d on %s", loc, d.Date)
			total += days[d.Date]
		}
		assert.Equal(t, total, v.Total)
		assert.Equal(t, "2023-11-10", v.Days[0].Date)
		assert.Equal(t, "2023-11-30", v.Days[20].Date)
	}
}

func TestParseDayRange(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, from, to string
		field          string // "" when valid
		covers         string // the message says so
	}{
		{"the whole calendar", "0001-01-01", "9999-12-31", "to", "range covers 3652059 days"}, // not a duration's 106752
		{"one day", "2024-03-01", "2024-03-01", "", ""},
		{"leap year is 366 days", "2024-01-01", "2024-12-31", "", ""},
		{"367 days", "2024-01-01", "2025-01-01", "to", "range covers 367 days"},
		{"to before from", "2024-03-02", "2024-03-01", "to", ""},
		{"missing from", "", "2024-03-01", "from", ""},
		{"missing to", "2024-03-01", "", "to", ""},
		{"not a date", "2024-13-01", "2024-03-01", "from", ""},
		{"timestamp instead of date", "2024-03-01", "2024-03-01T00:00:00Z", "to", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, _, err := projection.ParseDayRange(tc.from, tc.to)
			if tc.covers != "" {
				assert.ErrorContains(t, err, tc.covers)
			}
			if tc.field == "" {
				assert.NoError(t, err)
				return
			}
			var ve *domain.ValidationError
			require.ErrorAs(t, err, &ve)
			assert.Equal(t, tc.field, ve.Field)
			assert.NotEmpty(t, ve.Message)
		})
	}
}
