package projection

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/checkins/checkins/domain"
)

// RecentCheckinsKept is how many check-ins per user the projection keeps.
const RecentCheckinsKept = 50

// Recent check-ins' layouts: how a check-in is encoded as its sorted-set member. A version is
// written in one layout for its whole life (Layouts); reads decode either.
const (
	// RecentCheckinsJSON is the layout of earlier releases: the member is the check-in's JSON
	// ({"checkinId":...,"timestamp":...}), about 85 bytes with a short checkinId. Over Redis's
	// zset-max-listpack-value (64) every user's set is a skiplist with a dictionary beside it,
	// about 2.5 times the memory of the compact encoding and a dictionary insert per event.
	RecentCheckinsJSON = 1
	// RecentCheckinsCompact encodes a check-in as "<timestamp> <locationId> <starRating>
	// <checkinId>": 57 bytes with a UUID checkinId, so a user's set stays a listpack.
	RecentCheckinsCompact = 2
	// RecentCheckinsLayout is the layout new versions are built in.
	RecentCheckinsLayout = RecentCheckinsCompact
)

// RecentCheckins keeps each user's latest check-ins by when they happened. Keeping the top N of
// a sorted set ordered by (timestamp, member) gives the same set whatever order events arrive
// in, so a late offline check-in lands in its place or, if too old, is dropped.
type RecentCheckins struct {
	// Layout is the member encoding written; 0 is RecentCheckinsLayout.
	Layout int
}

// RecentCheckin is one check-in of a user, as kept by RecentCheckins. The JSON field order is
// fixed (it was the sorted-set member's encoding in RecentCheckinsJSON).
type RecentCheckin struct {
	CheckinID  string `json:"checkinId"`
	LocationID int64  `json:"locationId"`
	StarRating int    `json:"starRating"`
	Timestamp  int64  `json:"timestamp"`
}

// Member is c as the sorted-set member of layout (0: RecentCheckinsLayout). Members of equal
// timestamps are ordered by these bytes, so it decides which of them a full set keeps.
func (c RecentCheckin) Member(layout int) (string, error) {
	if layout == RecentCheckinsJSON {
		b, err := json.Marshal(c)
		return string(b), err
	}
	var buf [48]byte
	b := strconv.AppendInt(buf[:0], c.Timestamp, 10)
	b = append(b, ' ')
	return string(c.appendTie(b)), nil
}

// Tie settles which of a user's check-ins of equal timestamps is the latest: the greater Tie in
// byte order. It is the compact member after its timestamp ("<locationId> <starRating>
// <checkinId>"), so the check-ins a full set of RecentCheckinsCompact keeps are the latest by
// it, and UserStats takes the same one for the user's latest (HMaxBy's tie). It tells apart two
// check-ins that reuse a checkinId with other bodies (another location or rating), so that
// which is the latest does not depend on the order they were applied in.
func (c RecentCheckin) Tie() string {
	var buf [48]byte
	return string(c.appendTie(buf[:0]))
}

func (c RecentCheckin) appendTie(b []byte) []byte {
	b = strconv.AppendInt(b, c.LocationID, 10)
	b = append(b, ' ')
	b = strconv.AppendInt(b, int64(c.StarRating), 10)
	b = append(b, ' ')
	return append(b, c.CheckinID...)
}

// recentOf is the check-in e, as RecentCheckins keeps it.
func recentOf(e domain.CheckinRecorded) RecentCheckin {
	return RecentCheckin{CheckinID: e.ID, LocationID: e.LocationID, StarRating: e.StarRating, Timestamp: e.Timestamp}
}

// parseRecentMember decodes a member of either layout: a JSON one starts with '{', which no
// compact one does.
func parseRecentMember(m string) (RecentCheckin, error) {
	var c RecentCheckin
	if strings.HasPrefix(m, "{") {
		err := json.Unmarshal([]byte(m), &c)
		return c, err
	}
	f := strings.SplitN(m, " ", 4)
	if len(f) != 4 || f[3] == "" {
		return c, fmt.Errorf("want \"<timestamp> <locationId> <starRating> <checkinId>\"")
	}
	var err error
	if c.Timestamp, err = strconv.ParseInt(f[0], 10, 64); err != nil {
		return c, fmt.Errorf("timestamp: %w", err)
	}
	if c.LocationID, err = strconv.ParseInt(f[1], 10, 64); err != nil {
		return c, fmt.Errorf("locationId: %w", err)
	}
	if c.StarRating, err = strconv.Atoi(f[2]); err != nil {
		return c, fmt.Errorf("starRating: %w", err)
	}
	c.CheckinID = f[3]
	return c, nil
}

// RecentCheckinsView is a user's latest check-ins, newest first.
type RecentCheckinsView struct {
	UserID   int64           `json:"userId"`
	Checkins []RecentCheckin `json:"checkins"`
	// Layout is the layout the check-ins were read in (what orders equal timestamps).
	Layout int `json:"-"`
}

func (r RecentCheckins) layout() int {
	if r.Layout == 0 {
		return RecentCheckinsLayout
	}
	return r.Layout
}

// CurrentLayout implements Layouts.
func (RecentCheckins) CurrentLayout() int { return RecentCheckinsLayout }

// AtLayout implements Layouts.
func (r RecentCheckins) AtLayout(layout int) (Projection, error) {
	if layout != RecentCheckinsJSON && layout != RecentCheckinsCompact {
		return nil, fmt.Errorf("recent_checkins: unknown layout %d (this build knows %d and %d)", layout, RecentCheckinsJSON, RecentCheckinsCompact)
	}
	r.Layout = layout
	return r, nil
}

// Name implements Projection.
func (RecentCheckins) Name() string { return "recent_checkins" }

// OnCheckinRecorded adds the check-in scored by its timestamp and trims to the newest N.
func (r RecentCheckins) OnCheckinRecorded(ctx context.Context, e domain.CheckinRecorded, s Store) error {
	member, err := recentOf(e).Member(r.layout())
	if err != nil {
		return fmt.Errorf("encode recent check-in %s: %w", e.ID, err)
	}
	return s.Apply(ctx, NewUpdate(userSlot(e.UserID)).
		ZAdd("recent", float64(e.Timestamp), member).
		ZKeepTop("recent", RecentCheckinsKept))
}

// Get reads a user's latest check-ins; domain.ErrNotFound when the user has none.
func (RecentCheckins) Get(ctx context.Context, r Reader, userID int64) (RecentCheckinsView, error) {
	return recentGet(ctx, r, userID, RecentCheckinsKept-1)
}

// All is Get of every check-in the user's set holds, RecentCheckinsKept at most unless a trim
// went wrong (the bench's verifier compares it).
func (RecentCheckins) All(ctx context.Context, r Reader, userID int64) (RecentCheckinsView, error) {
	return recentGet(ctx, r, userID, -1)
}

// recentGet reads a user's check-ins of ranks 0..stop, newest first.
func recentGet(ctx context.Context, r Reader, userID, stop int64) (RecentCheckinsView, error) {
	zs, err := r.ZRevRange(ctx, userSlot(userID), "recent", 0, stop)
	if err != nil {
		return RecentCheckinsView{}, err
	}
	if len(zs) == 0 {
		return RecentCheckinsView{}, fmt.Errorf("check-ins of user %d: %w", userID, domain.ErrNotFound)
	}
	v := RecentCheckinsView{UserID: userID, Checkins: make([]RecentCheckin, len(zs)), Layout: RecentCheckinsCompact}
	for i, z := range zs {
		c, err := parseRecentMember(z.Member)
		if err != nil {
			return RecentCheckinsView{}, fmt.Errorf("user %d recent check-in %q: %w", userID, z.Member, err)
		}
		if strings.HasPrefix(z.Member, "{") {
			v.Layout = RecentCheckinsJSON
		}
		v.Checkins[i] = c
	}
	// Of equal timestamps the greater Tie first, the one users takes for the latest. It is the
	// order Redis lists compact members in; JSON members (an earlier layout) it orders by their
	// checkinId first.
	slices.SortStableFunc(v.Checkins, func(a, b RecentCheckin) int {
		if c := cmp.Compare(b.Timestamp, a.Timestamp); c != 0 {
			return c
		}
		return strings.Compare(b.Tie(), a.Tie())
	})
	return v, nil
}
