package adapters_test

import (
	"context"
	"strconv"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/checkins/checkins/adapters"
	"github.com/checkins/checkins/app/projection"
	"github.com/checkins/checkins/domain"
)

// TestReusedCheckinIDAtOneTimestampIsOrderIndependent: a checkinId reused with another body is
// another check-in (README). Two such check-ins of one user at one timestamp had the same tie in
// users (the checkinId), so the first applied stayed the latest: a rebuild in stream order and
// an incremental run where the first was parked and replayed after the second disagreed on
// lastSeenAt. The tie now tells their bodies apart.
func TestReusedCheckinIDAtOneTimestampIsOrderIndependent(t *testing.T) {
	t.Parallel()
	env := newProjEnv(t)
	ctx := context.Background()
	const ts = 1_700_000_000_000
	evA := recorded("same-id", 1, 2, 3, ts) // location 2
	evB := recorded("same-id", 1, 9, 3, ts) // location 9: another body, another identity
	require.NotEqual(t, evA.Identity(), evB.Identity())

	run := func(suffix string, first, second int64) projection.UserStatsView {
		e := env.with(suffix)
		a := e.applier(t, e.client)
		evs := map[int64]string{2: "1700000000000-0", 9: "1700000000001-0"}
		for _, loc := range []int64{first, second} {
			ev := evA
			if loc == 9 {
				ev = evB
			}
			_, err := a.Apply(ctx, []projection.Work{userWork(t, "g", ev, evs[loc])}, noPrune)
			require.NoError(t, err)
		}
		v, err := projection.UserStats{}.Get(ctx, adapters.NewProjectionReader(e.client, e.keys, "users"), 1)
		require.NoError(t, err)
		return v
	}
	inOrder := run("in-order", 2, 9)
	reversed := run("reversed", 9, 2) // e.g. the first parked and replayed after the second
	assert.Equal(t, int64(2), inOrder.NumCheckins)
	assert.Equal(t, inOrder, reversed, "lastSeenAt does not depend on the order the two check-ins were applied in")
}

// TestRecentKeepsTheUsersLatestAtEqualTimestamps: with more than 50 check-ins of a user at one
// timestamp, recent_checkins keeps the 50 of the greatest members (their bytes: the location ID
// as text first), while users took the greatest checkinId for the latest: its lastSeenAt named
// a check-in the user's recent list did not hold. Both now settle ties by RecentCheckin.Tie.
func TestRecentKeepsTheUsersLatestAtEqualTimestamps(t *testing.T) {
	t.Parallel()
	env := newProjEnv(t)
	ctx := context.Background()
	a := env.applier(t, env.client)
	const ts = 1_700_000_000_000
	var works []projection.Work
	add := func(ev domainEv, id string) {
		for _, p := range []projection.Projection{projection.UserStats{}, projection.RecentCheckins{}} {
			us, err := projection.Updates(ctx, p, ev)
			require.NoError(t, err)
			works = append(works, projection.Work{Group: "g", Projection: p.Name(), Version: 1, Event: projection.RefOf(ev, id), Updates: us})
		}
	}
	add(recorded("z-latest", 1, 1, 5, ts), "1700000000500-0")
	for i := range 50 {
		add(recorded(fmtID(i), 1, 2, 5, ts), entry(1_700_000_001_000+int64(i)))
	}
	_, err := a.Apply(ctx, works, noPrune)
	require.NoError(t, err)
	u, err := projection.UserStats{}.Get(ctx, adapters.NewProjectionReader(env.client, env.keys, "users"), 1)
	require.NoError(t, err)
	r, err := projection.RecentCheckins{}.Get(ctx, adapters.NewProjectionReader(env.client, env.keys, "recent_checkins"), 1)
	require.NoError(t, err)
	require.Len(t, r.Checkins, 50)
	assert.Equal(t, u.LastSeenAt, r.Checkins[0].LocationID, "the newest recent check-in is the one users calls the latest")
	assert.Equal(t, "a149", r.Checkins[0].CheckinID)
}

type domainEv = domain.CheckinRecorded

func fmtID(i int) string { return "a" + strconv.Itoa(100+i) }
