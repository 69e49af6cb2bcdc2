package projection

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/checkins/checkins/domain"
)

// RecentCheckinsKept is how many check-ins per user the projection keeps.
const RecentCheckinsKept = 50

// RecentCheckins keeps each user's latest check-ins by when they happened. Keeping the top N of
// a sorted set ordered by (timestamp, member) gives the same set whatever order events arrive
// in, so a late offline check-in lands in its place or, if too old, is dropped.
type RecentCheckins struct{}

// RecentCheckin is one check-in of a user, as kept by RecentCheckins. The field order is fixed
// (it is the sorted-set member's encoding), so the same check-in always encodes the same.
type RecentCheckin struct {
	CheckinID  string `json:"checkinId"`
	LocationID int64  `json:"locationId"`
	StarRating int    `json:"starRating"`
	Timestamp  int64  `json:"timestamp"`
}

// RecentCheckinsView is a user's latest check-ins, newest first.
type RecentCheckinsView struct {
	UserID   int64           `json:"userId"`
	Checkins []RecentCheckin `json:"checkins"`
}

// Name implements Projection.
func (RecentCheckins) Name() string { return "recent_checkins" }

// OnCheckinRecorded adds the check-in scored by its timestamp and trims to the newest N.
func (RecentCheckins) OnCheckinRecorded(ctx context.Context, e domain.CheckinRecorded, s Store) error {
	member, err := json.Marshal(RecentCheckin{CheckinID: e.ID, LocationID: e.LocationID, StarRating: e.StarRating, Timestamp: e.Timestamp})
	if err != nil {
		return fmt.Errorf("encode recent check-in %s: %w", e.ID, err)
	}
	return s.Apply(ctx, NewUpdate(userSlot(e.UserID)).
		ZAdd("recent", float64(e.Timestamp), string(member)).
		ZKeepTop("recent", RecentCheckinsKept))
}

// Get reads a user's latest check-ins; domain.ErrNotFound when the user has none.
func (RecentCheckins) Get(ctx context.Context, r Reader, userID int64) (RecentCheckinsView, error) {
	zs, err := r.ZRevRange(ctx, userSlot(userID), "recent", 0, RecentCheckinsKept-1)
	if err != nil {
		return RecentCheckinsView{}, err
	}
	if len(zs) == 0 {
		return RecentCheckinsView{}, fmt.Errorf("check-ins of user %d: %w", userID, domain.ErrNotFound)
	}
	v := RecentCheckinsView{UserID: userID, Checkins: make([]RecentCheckin, len(zs))}
	for i, z := range zs {
		if err := json.Unmarshal([]byte(z.Member), &v.Checkins[i]); err != nil {
			return RecentCheckinsView{}, fmt.Errorf("user %d recent check-in %q: %w", userID, z.Member, err)
		}
	}
	return v, nil
}
