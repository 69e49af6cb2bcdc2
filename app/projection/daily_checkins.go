package projection

import (
	"context"
	"fmt"
	"time"

	"github.com/checkins/checkins/domain"
)

// MaxDailyRangeDays is the longest range one daily read may cover (a leap year).
const MaxDailyRangeDays = 366

// DayLayout is how days are written: field names of the daily hash and query parameters.
const DayLayout = "2006-01-02"

// DailyCheckins counts check-ins per location per UTC day of the check-in's timestamp.
type DailyCheckins struct{}

// DayCount is the check-ins of one day.
type DayCount struct {
	Date     string `json:"date"`
	Checkins int64  `json:"checkins"`
}

// DailyCheckinsView is one location's check-ins per day over a range, days without any included.
type DailyCheckinsView struct {
	LocationID int64      `json:"locationId"`
	From       string     `json:"from"`
	To         string     `json:"to"`
	Total      int64      `json:"total"`
	Days       []DayCount `json:"days"`
}

// Name implements Projection.
func (DailyCheckins) Name() string { return "daily_checkins" }

// OnCheckinRecorded counts the check-in on its UTC day.
func (DailyCheckins) OnCheckinRecorded(ctx context.Context, e domain.CheckinRecorded, s Store) error {
	day := time.UnixMilli(e.Timestamp).UTC().Format(DayLayout)
	return s.Apply(ctx, NewUpdate(locationSlot(e.LocationID)).HIncrBy("daily", day, 1))
}

// ParseDayRange validates a from..to range of days (inclusive, YYYY-MM-DD, UTC).
func ParseDayRange(from, to string) (time.Time, time.Time, error) {
	parse := func(field, v string) (time.Time, error) {
		if v == "" {
			return time.Time{}, &domain.ValidationError{Code: domain.CodeRequired, Field: field, Message: "is required, as YYYY-MM-DD"}
		}
		d, err := time.Parse(DayLayout, v)
		if err != nil {
			return time.Time{}, &domain.ValidationError{Code: domain.CodeInvalid, Field: field, Message: fmt.Sprintf("must be a date as YYYY-MM-DD, got %q", v)}
		}
		return d, nil
	}
	f, err := parse("from", from)
	if err != nil {
		return time.Time{}, time.Time{}, err
	}
	t, err := parse("to", to)
	if err != nil {
		return time.Time{}, time.Time{}, err
	}
	if t.Before(f) {
		return time.Time{}, time.Time{}, &domain.ValidationError{Code: domain.CodeOutOfRange, Field: "to", Message: fmt.Sprintf("must not be before from (%s), got %s", from, to)}
	}
	// Counted by the days since the epoch: t.Sub(f) saturates at about 292 years.
	if days := (t.Unix()-f.Unix())/86400 + 1; days > MaxDailyRangeDays {
		return time.Time{}, time.Time{}, &domain.ValidationError{Code: domain.CodeOutOfRange, Field: "to",
			Message: fmt.Sprintf("range covers %d days; at most %d are allowed", days, MaxDailyRangeDays)}
	}
	return f, t, nil
}

// History is every day a location has check-ins on, with their number: the whole read model
// of the location, where Get reads a range of days (the bench's verifier compares it).
func (DailyCheckins) History(ctx context.Context, r Reader, locationID int64) (map[string]int64, error) {
	h, err := r.HGetAll(ctx, locationSlot(locationID), "daily")
	if err != nil {
		return nil, err
	}
	out := make(map[string]int64, len(h))
	for day, v := range h {
		n, err := ParseInt(v)
		if err != nil {
			return nil, fmt.Errorf("location %d day %s: %w", locationID, day, err)
		}
		out[day] = n
	}
	return out, nil
}

// Get reads a location's check-ins for every day from..to (inclusive).
func (DailyCheckins) Get(ctx context.Context, r Reader, locationID int64, from, to string) (DailyCheckinsView, error) {
	f, t, err := ParseDayRange(from, to)
	if err != nil {
		return DailyCheckinsView{}, err
	}
	var days []string
	for d := f; !d.After(t); d = d.AddDate(0, 0, 1) {
		days = append(days, d.Format(DayLayout))
	}
	vals, err := r.HMGet(ctx, locationSlot(locationID), "daily", days...)
	if err != nil {
		return DailyCheckinsView{}, err
	}
	v := DailyCheckinsView{LocationID: locationID, From: f.Format(DayLayout), To: t.Format(DayLayout), Days: make([]DayCount, len(days))}
	for i, day := range days {
		n, err := ParseInt(vals[i])
		if err != nil {
			return DailyCheckinsView{}, fmt.Errorf("location %d day %s: %w", locationID, day, err)
		}
		v.Days[i] = DayCount{Date: day, Checkins: n}
		v.Total += n
	}
	if v.Total == 0 {
		// None in the range: a location known to the projection answers its zeros, one it never
		// counted is not found, as /users/{id}/checkins and /locations/{id} answer. Only this
		// case costs the second read.
		n, err := r.HLen(ctx, locationSlot(locationID), "daily")
		if err != nil {
			return DailyCheckinsView{}, err
		}
		if n == 0 {
			return DailyCheckinsView{}, fmt.Errorf("daily check-ins of location %d: %w", locationID, domain.ErrNotFound)
		}
	}
	return v, nil
}
