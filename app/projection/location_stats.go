package projection

import (
	"context"
	"fmt"
	"strconv"

	"github.com/checkins/checkins/domain"
)

// LocationStats counts check-ins and stars per location.
type LocationStats struct{}

// LocationStatsView is the read model of one location.
type LocationStatsView struct {
	LocationID   int64 `json:"locationId"`
	NumCheckins  int64 `json:"numCheckins"`
	NumStars     int64 `json:"numStars"`
	AverageStars int64 `json:"averageStars"`
}

// Name implements Projection.
func (LocationStats) Name() string { return "locations" }

// OnCheckinRecorded adds the check-in and its stars. The rounded average is computed when read
// (Get): storing it would cost Redis a write per event for a value the two counts determine.
func (LocationStats) OnCheckinRecorded(ctx context.Context, e domain.CheckinRecorded, s Store) error {
	return s.Apply(ctx, NewUpdate(locationSlot(e.LocationID)).
		HIncrBy("stats", "numCheckins", 1).
		HIncrBy("stats", "numStars", int64(e.StarRating)))
}

// AverageStars is floor(stars/checkins + 0.5) in integers (the rounding the original sample
// stores), 0 without check-ins.
func AverageStars(stars, checkins int64) int64 {
	if checkins <= 0 {
		return 0
	}
	return (2*stars + checkins) / (2 * checkins)
}

// Get reads one location's statistics; domain.ErrNotFound when nobody checked in there.
func (LocationStats) Get(ctx context.Context, r Reader, locationID int64) (LocationStatsView, error) {
	h, err := r.HGetAll(ctx, locationSlot(locationID), "stats")
	if err != nil {
		return LocationStatsView{}, err
	}
	if len(h) == 0 {
		return LocationStatsView{}, fmt.Errorf("location %d: %w", locationID, domain.ErrNotFound)
	}
	v := LocationStatsView{LocationID: locationID}
	for _, f := range []struct {
		name string
		dst  *int64
	}{{"numCheckins", &v.NumCheckins}, {"numStars", &v.NumStars}} {
		if *f.dst, err = ParseInt(h[f.name]); err != nil {
			return LocationStatsView{}, fmt.Errorf("location %d field %s: %w", locationID, f.name, err)
		}
	}
	v.AverageStars = AverageStars(v.NumStars, v.NumCheckins)
	return v, nil
}

func locationSlot(id int64) string { return "location:" + strconv.FormatInt(id, 10) }
