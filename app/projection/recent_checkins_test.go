package projection_test

import (
	"context"
	"sort"
	"testing"

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
