// Package app holds the use cases: commands that record check-ins, rebuild projections, replay
// and purge the poison queue and trim the stream; queries over the event stream, the
// projections' read models and the consumers' state. It imports domain only; adapters implement
// its interfaces.
package app

import (
	"context"
	"log/slog"
	"time"

	"github.com/checkins/checkins/app/command"
	"github.com/checkins/checkins/app/ops"
	"github.com/checkins/checkins/app/projection"
	"github.com/checkins/checkins/app/query"
)

// Application is what the ports drive.
type Application struct {
	Commands Commands
	Queries  Queries
}

// Commands change state. The operational ones (rebuild, replay, purge, trim) are driven alike
// by the /ops routes and the CLI verbs.
type Commands struct {
	RecordCheckin *command.RecordCheckinHandler

	RebuildProjection *command.RebuildProjection
	ReplayPoisoned    *command.ReplayPoisoned
	PurgePoisoned     *command.PurgePoisoned
	TrimStream        *command.TrimStream
	RecordFormat      *command.RecordFormat
	DisbandLiveGroup  *command.DisbandLiveGroup
	DropMovedVersion  *command.DropMovedVersion
	// MigratePartitions is set only for `checkins partitions migrate`, which connects without
	// checking the configured partition count.
	MigratePartitions *command.MigratePartitions
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

	// Operations: consumer groups and stalls, the poison queue, projection versions.
	Status             *query.Status
	ListPoisoned       *query.ListPoisoned
	ProjectionVersions *query.ProjectionVersions
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

// OpsConfig is what the operational use cases are built on.
type OpsConfig struct {
	Backend ops.Backend
	// Applier applies replayed events.
	Applier     command.EventApplier
	Projections []projection.Projection // every projection this build knows
	RetireGrace time.Duration           // 0: command.DefaultRetireGrace
	StallAfter  time.Duration           // 0: status and the projections list flag no stalls
	Retention   command.RetentionPolicy
	// ClaimIdle is CLAIM_IDLE: a live group is disbanded only once its consumers were idle
	// that long (0: command.DefaultClaimIdle).
	ClaimIdle time.Duration
	Logger    *slog.Logger
}

// MinStoppedIdle is the least idle time after which disband and drop take a projector's
// consumers for stopped, whatever CLAIM_IDLE.
const MinStoppedIdle = 2 * time.Second

// AddOps adds the operational commands and queries to a.
func (a *Application) AddOps(cfg OpsConfig) error {
	c, q := &a.Commands, &a.Queries
	var err error
	if c.RebuildProjection, err = command.NewRebuildProjection(command.RebuildProjectionConfig{Backend: cfg.Backend,
		Projections: cfg.Projections, RetireGrace: cfg.RetireGrace, Logger: cfg.Logger}); err != nil {
		return err
	}
	if c.ReplayPoisoned, err = command.NewReplayPoisoned(command.ReplayPoisonedConfig{Backend: cfg.Backend,
		Projections: cfg.Projections, Applier: cfg.Applier, Logger: cfg.Logger}); err != nil {
		return err
	}
	if c.PurgePoisoned, err = command.NewPurgePoisoned(cfg.Backend.Poison, cfg.Logger, cfg.Projections); err != nil {
		return err
	}
	if c.TrimStream, err = command.NewTrimStream(cfg.Backend.Stream, cfg.Retention); err != nil {
		return err
	}
	c.TrimStream.WaitForMigrations(cfg.Backend.Migration)
	if c.RecordFormat, err = command.NewRecordFormat(cfg.Backend.Records); err != nil {
		return err
	}
	claimIdle := cfg.ClaimIdle
	if claimIdle <= 0 {
		claimIdle = command.DefaultClaimIdle
	}
	// On a quiet stream a running projector's only sign of life is its checkpoint, every 250ms:
	// with CLAIM_IDLE below a few of them (it may be 100ms), a disband's or a drop's check passed
	// between two checkpoints while the projector ran.
	stoppedIdle := max(claimIdle, MinStoppedIdle)
	if c.DisbandLiveGroup, err = command.NewDisbandLiveGroup(cfg.Backend, stoppedIdle); err != nil {
		return err
	}
	if c.DropMovedVersion, err = command.NewDropMovedVersion(cfg.Backend, stoppedIdle); err != nil {
		return err
	}
	if q.Status, err = query.NewStatus(cfg.Backend, cfg.Projections, cfg.StallAfter); err != nil {
		return err
	}
	if q.ListPoisoned, err = query.NewListPoisoned(cfg.Backend.Poison); err != nil {
		return err
	}
	q.ProjectionVersions, err = query.NewProjectionVersions(cfg.Backend, cfg.Projections, cfg.StallAfter)
	return err
}
