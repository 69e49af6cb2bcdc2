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
