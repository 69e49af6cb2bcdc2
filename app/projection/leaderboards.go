package projection

import (
	"context"
	"fmt"
	"strconv"

	"github.com/checkins/checkins/domain"
)

// Leaderboard limits: how many entries one read may ask for.
const (
	DefaultLeaderboardLimit = 10
	MaxLeaderboardLimit     = 100
)

// Leaderboard orders.
const (
	ByCheckins = "checkins"
	ByRating   = "rating"
)

// leaderboardSlot holds every leaderboard key: the rating board needs each location's counts at
// the moment it updates the score, and one slot keeps that read and the write in one script.
const leaderboardSlot = "all"

// Keys of the leaderboards slot.
const (
	lbLocationCheckins = "locations_by_checkins" // zset locationId -> check-ins
	lbLocationRating   = "locations_by_rating"   // zset locationId -> exact average stars, once qualified
	lbLocationCounts   = "location_counts"       // hash "<id>:n" and "<id>:stars"
	lbUserCheckins     = "users_by_checkins"     // zset userId -> check-ins
)

// Leaderboards ranks locations by check-ins and by average rating, and users by check-ins.
// MinCheckins is how many check-ins a location needs before it enters the rating board, so one
// five-star visit does not top it. It is applied when events are handled: changing it takes a
// rebuild (`checkins projections rebuild leaderboards`).
type Leaderboards struct {
	MinCheckins int64
}

// LeaderboardLocation is one row of a location board.
type LeaderboardLocation struct {
	Rank          int     `json:"rank"`
	LocationID    int64   `json:"locationId"`
	NumCheckins   int64   `json:"numCheckins"`
	AverageRating float64 `json:"averageRating"` // exact: stars / check-ins
}

// LeaderboardUser is one row of the user board.
type LeaderboardUser struct {
	Rank        int   `json:"rank"`
	UserID      int64 `json:"userId"`
	NumCheckins int64 `json:"numCheckins"`
}

// Name implements Projection.
func (Leaderboards) Name() string { return "leaderboards" }

// OnCheckinRecorded counts the check-in for its location and user and, once the location has
// MinCheckins, sets its rating score from the counts the same script just updated.
func (l Leaderboards) OnCheckinRecorded(ctx context.Context, e domain.CheckinRecorded, s Store) error {
	loc := strconv.FormatInt(e.LocationID, 10)
	return s.Apply(ctx, NewUpdate(leaderboardSlot).
		ZIncrBy(lbLocationCheckins, 1, loc).
		HIncrBy(lbLocationCounts, loc+":n", 1).
		HIncrBy(lbLocationCounts, loc+":stars", int64(e.StarRating)).
		ZRatioAtMin(lbLocationRating, loc, lbLocationCounts, loc+":stars", loc+":n", max(l.MinCheckins, 1)).
		ZIncrBy(lbUserCheckins, 1, strconv.FormatInt(e.UserID, 10)))
}

// ValidateLeaderboardLimit turns 0 into the default and rejects anything outside 1..Max.
func ValidateLeaderboardLimit(limit int) (int, error) {
	if limit == 0 {
		return DefaultLeaderboardLimit, nil
	}
	if limit < 1 || limit > MaxLeaderboardLimit {
		return 0, &domain.ValidationError{Code: domain.CodeOutOfRange, Field: "limit",
			Message: fmt.Sprintf("must be from 1 to %d, got %d", MaxLeaderboardLimit, limit)}
	}
	return limit, nil
}

// TopLocations is the location board ordered by ByCheckins or ByRating, best first.
func (Leaderboards) TopLocations(ctx context.Context, r Reader, by string, limit int) ([]LeaderboardLocation, error) {
	var key string
	switch by {
	case ByCheckins, "":
		key = lbLocationCheckins
	case ByRating:
		key = lbLocationRating
	default:
		return nil, &domain.ValidationError{Code: domain.CodeInvalid, Field: "by",
			Message: fmt.Sprintf("must be %s or %s, got %q", ByRating, ByCheckins, by)}
	}
	limit, err := ValidateLeaderboardLimit(limit)
	if err != nil {
		return nil, err
	}
	zs, err := r.ZRevRange(ctx, leaderboardSlot, key, 0, int64(limit-1))
	if err != nil {
		return nil, err
	}
	out := make([]LeaderboardLocation, 0, len(zs))
	if len(zs) == 0 {
		return out, nil
	}
	fields := make([]string, 0, 2*len(zs))
	for _, z := range zs {
		fields = append(fields, z.Member+":n", z.Member+":stars")
	}
	counts, err := r.HMGet(ctx, leaderboardSlot, lbLocationCounts, fields...)
	if err != nil {
		return nil, err
	}
	for i, z := range zs {
		id, err := strconv.ParseInt(z.Member, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("leaderboard member %q is not a location ID: %w", z.Member, err)
		}
		n, err := ParseInt(counts[2*i])
		if err != nil {
			return nil, fmt.Errorf("location %d count: %w", id, err)
		}
		stars, err := ParseInt(counts[2*i+1])
		if err != nil {
			return nil, fmt.Errorf("location %d stars: %w", id, err)
		}
		row := LeaderboardLocation{Rank: i + 1, LocationID: id, NumCheckins: n}
		if n > 0 {
			row.AverageRating = float64(stars) / float64(n)
		}
		out = append(out, row)
	}
	return out, nil
}

// TopUsers is the user board by check-ins, most first.
func (Leaderboards) TopUsers(ctx context.Context, r Reader, limit int) ([]LeaderboardUser, error) {
	limit, err := ValidateLeaderboardLimit(limit)
	if err != nil {
		return nil, err
	}
	zs, err := r.ZRevRange(ctx, leaderboardSlot, lbUserCheckins, 0, int64(limit-1))
	if err != nil {
		return nil, err
	}
	out := make([]LeaderboardUser, 0, len(zs))
	for i, z := range zs {
		id, err := strconv.ParseInt(z.Member, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("leaderboard member %q is not a user ID: %w", z.Member, err)
		}
		out = append(out, LeaderboardUser{Rank: i + 1, UserID: id, NumCheckins: int64(z.Score)})
	}
	return out, nil
}
