package projection_test

import (
	"context"
	"fmt"
	"sort"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/checkins/checkins/app/projection"
	"github.com/checkins/checkins/domain"
)

func TestRecentCheckinsKeepsNewestFiftyWhateverTheOrder(t *testing.T) {
	t.Parallel()
	p := newProjTest(t)
	rc := projection.RecentCheckins{}
	events := history(500, 21)
	p.applyAll(t, rc, events, 2)

	ctx := context.Background()
	byUser := map[int64][]domain.CheckinRecorded{}
	for _, e := range events {
		byUser[e.UserID] = append(byUser[e.UserID], e)
	}
	for user, es := range byUser {
		// Newest first; equal timestamps fall back to the encoded member, compared here by ID
		// only where it is unambiguous.
		sort.SliceStable(es, func(i, j int) bool { return es[i].Timestamp > es[j].Timestamp })
		v, err := rc.Get(ctx, p.reader(rc.Name()), user)
		require.NoError(t, err)
		want := min(len(es), projection.RecentCheckinsKept)
		require.Len(t, v.Checkins, want, "user %d", user)
		got := map[string]bool{}
		for i, c := range v.Checkins {
			assert.Equal(t, es[i].Timestamp, c.Timestamp, "user %d position %d: newest first", user, i)
			got[c.CheckinID] = true
		}
		for _, e := range es[:want] {
			if e.Timestamp > es[want-1].Timestamp { // strictly inside the kept window
				assert.True(t, got[e.ID], "user %d keeps %s", user, e.ID)
			}
		}
	}
}

func TestRecentCheckinsUnknownUserIsNotFound(t *testing.T) {
	t.Parallel()
	p := newProjTest(t)
	_, err := projection.RecentCheckins{}.Get(context.Background(), p.reader("recent_checkins"), 404)
	assert.ErrorIs(t, err, domain.ErrNotFound)
}

// Both layouts keep the same check-ins and read back alike; the compact one stays in Redis's
// compact encoding (a listpack) with a UUID checkinId, the JSON one does not.
func TestRecentCheckinsLayoutsKeepTheSameCheckins(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	events := history(300, 5)
	for i := range events {
		events[i].ID = fmt.Sprintf("0b7c6a53-2f3e-4c1e-9a57-%012d", i) // a UUID's length
		events[i].Timestamp = 1_700_000_000_000 + int64(i)*1000        // no ties: each layout orders ties its own way
	}
	views := map[int]map[int64]projection.RecentCheckinsView{}
	for _, layout := range []int{projection.RecentCheckinsJSON, projection.RecentCheckinsCompact} {
		at, err := projection.AtLayout(projection.RecentCheckins{}, layout)
		require.NoError(t, err)
		rc := at.(projection.RecentCheckins)
		name := rc.Name()
		p := newProjTest(t) // a key space of its own: the markers are per group, not per projection
		p.applyAll(t, rc, events, 3)
		views[layout] = map[int64]projection.RecentCheckinsView{}
		for _, e := range events {
			v, err := projection.RecentCheckins{}.Get(ctx, p.reader(name), e.UserID)
			require.NoError(t, err)
			assert.Equal(t, layout, v.Layout, "the layout is told by the members read")
			views[layout][e.UserID] = v
		}
		keys, err := p.client.Keys(ctx, p.keys.ProjectionPrefix(name, 1)+"*:recent").Result()
		require.NoError(t, err)
		require.NotEmpty(t, keys)
		for _, k := range keys {
			enc, err := p.client.ObjectEncoding(ctx, k).Result()
			require.NoError(t, err)
			if layout == projection.RecentCheckinsCompact {
				assert.Equal(t, "listpack", enc, k)
			} else {
				assert.Equal(t, "skiplist", enc, k)
			}
		}
	}
	for user, v := range views[projection.RecentCheckinsCompact] {
		old := views[projection.RecentCheckinsJSON][user]
		require.Len(t, v.Checkins, len(old.Checkins), "user %d", user)
		assert.ElementsMatch(t, old.Checkins, v.Checkins, "user %d", user)
	}
}

func TestRecentCheckinMembers(t *testing.T) {
	t.Parallel()
	c := projection.RecentCheckin{CheckinID: "a:b.c-1_x", LocationID: 42, StarRating: 5, Timestamp: 1_700_000_000_123}
	m, err := c.Member(projection.RecentCheckinsCompact)
	require.NoError(t, err)
	assert.Equal(t, "1700000000123 42 5 a:b.c-1_x", m)
	j, err := c.Member(projection.RecentCheckinsJSON)
	require.NoError(t, err)
	assert.Equal(t, `{"checkinId":"a:b.c-1_x","locationId":42,"starRating":5,"timestamp":1700000000123}`, j)
	d, err := c.Member(0)
	require.NoError(t, err)
	assert.Equal(t, m, d, "0 is the current layout")

	_, err = projection.RecentCheckins{}.AtLayout(3)
	assert.ErrorContains(t, err, "recent_checkins: unknown layout 3")
}

// A member that is neither layout is an error naming it, not a zero check-in.
func TestRecentCheckinsRejectsAMalformedMember(t *testing.T) {
	t.Parallel()
	p := newProjTest(t)
	ctx := context.Background()
	key := p.keys.ProjectionPrefix("recent_checkins", 1) + "{user:7}:recent"
	for _, bad := range []string{"1700000000123 42 5", "1700000000123 x 5 id", "12 3 4 "} {
		require.NoError(t, p.client.Del(ctx, key).Err())
		require.NoError(t, p.client.ZAdd(ctx, key, redis.Z{Score: 1, Member: bad}).Err())
		_, err := projection.RecentCheckins{}.Get(ctx, p.reader("recent_checkins"), 7)
		assert.ErrorContains(t, err, fmt.Sprintf("user 7 recent check-in %q", bad))
	}
}

// TestRecentCheckinsAgreeWithUserStatsOnTies: of check-ins at the same timestamp, the one the
// recent list shows first is the one users takes for the latest. The list ordered them by the
// member's bytes, which compare the location IDs as text ("a" at location 9 first), while users
// took the greater checkinId (lastSeenAt 10). Both now take the greater RecentCheckin.Tie, the
// compact member after its timestamp: the one a full set keeps.
func TestRecentCheckinsAgreeWithUserStatsOnTies(t *testing.T) {
	t.Parallel()
	p, q := newProjTest(t), newProjTest(t) // one each: the applier dedupes per group
	ctx := context.Background()
	rc, us := projection.RecentCheckins{}, projection.UserStats{}
	events := []domain.CheckinRecorded{
		{Checkin: domain.Checkin{ID: "a", UserID: 6, LocationID: 9, StarRating: 1, Timestamp: 5_000}, RecordedAt: 5_000},
		{Checkin: domain.Checkin{ID: "b", UserID: 6, LocationID: 10, StarRating: 1, Timestamp: 5_000}, RecordedAt: 5_000},
		{Checkin: domain.Checkin{ID: "c", UserID: 6, LocationID: 2, StarRating: 1, Timestamp: 4_000}, RecordedAt: 5_000},
	}
	p.applyAll(t, rc, events, 1)
	q.applyAll(t, us, events, 1)
	stats, err := us.Get(ctx, q.reader(us.Name()), 6)
	require.NoError(t, err)
	recent, err := rc.Get(ctx, p.reader(rc.Name()), 6)
	require.NoError(t, err)
	require.Len(t, recent.Checkins, 3)
	assert.Equal(t, stats.LastSeenAt, recent.Checkins[0].LocationID, "the same latest check-in")
	assert.Equal(t, []string{"a", "b", "c"}, []string{recent.Checkins[0].CheckinID, recent.Checkins[1].CheckinID, recent.Checkins[2].CheckinID})
}
