// Package app holds the use cases: commands that record check-ins, queries over the event stream
// and the projections' read models. It imports domain only; adapters implement its interfaces.
package app

import (
	"context"

	"github.com/checkins/checkins/app/command"
	"github.com/checkins/checkins/app/projection"
	"github.com/checkins/checkins/app/query"
)

// Application is what the ports drive.
type Application struct {
	Commands Commands
	Queries  Queries
}

// Commands change state.
type Commands struct {
	RecordCheckin *command.RecordCheckinHandler
}

// Queries read state.
type Queries struct {
	Checkins  query.Checkins
	Users     UserQueries
	Locations LocationQueries
	// Projection read models added with the leaderboards, recent and daily projections.
	Leaderboards LeaderboardQueries
	Recent       RecentCheckinQueries
	Daily        DailyCheckinQueries
}

// UserQueries read the users projection.
type UserQueries struct {
	Reader projection.Reader
}

// Stats is one user's statistics.
func (q UserQueries) Stats(ctx context.Context, userID int64) (projection.UserStatsView, error) {
	return projection.UserStats{}.Get(ctx, q.Reader, userID)
}

// LocationQueries read the locations projection.
type LocationQueries struct {
	Reader projection.Reader
}

// Stats is one location's statistics.
func (q LocationQueries) Stats(ctx context.Context, locationID int64) (projection.LocationStatsView, error) {
	return projection.LocationStats{}.Get(ctx, q.Reader, locationID)
}

// LeaderboardQueries read the leaderboards projection.
type LeaderboardQueries struct {
	Reader      projection.Reader
	Leaderboard projection.Leaderboards
}

// Locations is the location board by projection.ByCheckins or projection.ByRating.
func (q LeaderboardQueries) Locations(ctx context.Context, by string, limit int) ([]projection.LeaderboardLocation, error) {
	return q.Leaderboard.TopLocations(ctx, q.Reader, by, limit)
}

// Users is the user board by check-ins.
func (q LeaderboardQueries) Users(ctx context.Context, limit int) ([]projection.LeaderboardUser, error) {
	return q.Leaderboard.TopUsers(ctx, q.Reader, limit)
}

// RecentCheckinQueries read the recent_checkins projection.
type RecentCheckinQueries struct {
	Reader projection.Reader
}

// OfUser is a user's latest check-ins, newest first.
func (q RecentCheckinQueries) OfUser(ctx context.Context, userID int64) (projection.RecentCheckinsView, error) {
	return projection.RecentCheckins{}.Get(ctx, q.Reader, userID)
}

// DailyCheckinQueries read the daily_checkins projection.
type DailyCheckinQueries struct {
	Reader projection.Reader
}

// OfLocation is a location's check-ins per UTC day from..to (YYYY-MM-DD, inclusive).
func (q DailyCheckinQueries) OfLocation(ctx context.Context, locationID int64, from, to string) (projection.DailyCheckinsView, error) {
	return projection.DailyCheckins{}.Get(ctx, q.Reader, locationID, from, to)
}
