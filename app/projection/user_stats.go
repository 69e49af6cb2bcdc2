package projection

import (
	"context"
	"fmt"
	"strconv"

	"github.com/checkins/checkins/domain"
)

// UserStats counts each user's check-ins and remembers the latest one.
type UserStats struct{}

// UserStatsView is the read model of one user.
type UserStatsView struct {
	UserID      int64 `json:"userId"`
	NumCheckins int64 `json:"numCheckins"`
	LastCheckin int64 `json:"lastCheckin"`
	LastSeenAt  int64 `json:"lastSeenAt"`
}

// Name implements Projection.
func (UserStats) Name() string { return "users" }

// OnCheckinRecorded counts the check-in once and moves lastCheckin forward only. Of check-ins
// at one timestamp the latest is the one of the greater RecentCheckin.Tie, whatever order they
// come in: the one recent_checkins lists first and keeps. (Releases before it held the
// checkinId alone, in field lastCheckinId, which two check-ins reusing one could share: the
// first applied won. A hash of theirs keeps that field, unread, until the version is rebuilt.)
func (UserStats) OnCheckinRecorded(ctx context.Context, e domain.CheckinRecorded, s Store) error {
	return s.Apply(ctx, NewUpdate(userSlot(e.UserID)).
		HIncrBy("stats", "numCheckins", 1).
		HMaxBy("stats", "lastCheckin", e.Timestamp, "lastCheckinTie", recentOf(e).Tie(),
			"lastSeenAt", strconv.FormatInt(e.LocationID, 10)))
}

// Get reads one user's statistics; domain.ErrNotFound when the user never checked in.
func (UserStats) Get(ctx context.Context, r Reader, userID int64) (UserStatsView, error) {
	h, err := r.HGetAll(ctx, userSlot(userID), "stats")
	if err != nil {
		return UserStatsView{}, err
	}
	if len(h) == 0 {
		return UserStatsView{}, fmt.Errorf("user %d: %w", userID, domain.ErrNotFound)
	}
	v := UserStatsView{UserID: userID}
	for _, f := range []struct {
		name string
		dst  *int64
	}{{"numCheckins", &v.NumCheckins}, {"lastCheckin", &v.LastCheckin}, {"lastSeenAt", &v.LastSeenAt}} {
		if *f.dst, err = ParseInt(h[f.name]); err != nil {
			return UserStatsView{}, fmt.Errorf("user %d field %s: %w", userID, f.name, err)
		}
	}
	return v, nil
}

func userSlot(id int64) string { return "user:" + strconv.FormatInt(id, 10) }
