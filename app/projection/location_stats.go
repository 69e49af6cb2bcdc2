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

// OnCheckinRecorded adds the check-in and its stars and recomputes the rounded average.
func (LocationStats) OnCheckinRecorded(ctx context.Context, e domain.CheckinRecorded, s Store) error {
	u := NewUpdate(locationSlot(e.LocationID), e.ID).
		HIncrBy("stats", "numCheckins", 1).
		HIncrBy("stats", "numStars", int64(e.StarRating)).
		HRound("stats", "averageStars", "numStars", "numCheckins")
	_, err := s.Apply(ctx, u)
	return err
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
	}{{"numCheckins", &v.NumCheckins}, {"numStars", &v.NumStars}, {"averageStars", &v.AverageStars}} {
		if *f.dst, err = ParseInt(h[f.name]); err != nil {
			return LocationStatsView{}, fmt.Errorf("location %d field %s: %w", locationID, f.name, err)
		}
	}
	return v, nil
}

func locationSlot(id int64) string { return "location:" + strconv.FormatInt(id, 10) }
