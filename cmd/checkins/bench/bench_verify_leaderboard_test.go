package bench

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/checkins/checkins/adapters"
	"github.com/checkins/checkins/adapters/redistest"
	"github.com/checkins/checkins/domain"
)

// TestLeaderboardBelowTop100IsChecked: the leaderboards check read each board at
// MaxLeaderboardLimit (100) rows only, so a wrong (here: missing) entry of a user or location
// ranked below 100 was never seen, although the bench claims every read model equals the
// independent computation (sustained has 10,000 users and 1,000 locations).
func TestLeaderboardBelowTop100IsChecked(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t, redistest.Options{})
	ctx := context.Background()
	h := testHost()
	cfg := Config{RedisURL: srv.URL(), LogLevel: slog.LevelWarn}
	opts := benchOptions{Projections: ProjectionNames(h.Projections(cfg)), AllProjections: true}
	b, err := newBencher(ctx, h, cfg, opts, h.NewLogger(io.Discard, slog.LevelWarn), io.Discard)
	require.NoError(t, err)
	t.Cleanup(b.close)
	client := redistest.Client(t, srv.URL())

	now := time.Now().UnixMilli()
	// 150 users and 150 locations: users/locations 1..149 have 2 check-ins, 150 has 1, so it
	// ranks last on both check-in boards.
	var checkins []domain.Checkin
	for i := range 299 {
		id := 1 + int64(i%150)
		checkins = append(checkins, domain.Checkin{ID: fmt.Sprintf("c%d", i), UserID: id, LocationID: id,
			StarRating: i % 6, Timestamp: now - int64(i)*60_000})
	}
	keys := adapters.KeySpace{Prefix: "lb"}
	applier, err := adapters.NewProjectionApplier(client, keys, 0)
	require.NoError(t, err)
	for _, p := range h.Projections(cfg) {
		for _, c := range checkins {
			_, err := applier.ApplyEvent(ctx, "test."+p.Name(), p, 1, domain.CheckinRecorded{Checkin: c, RecordedAt: now}, "")
			require.NoError(t, err)
		}
	}
	want := newExpectedModel()
	for _, c := range checkins {
		want.add(c)
	}
	ok, detail, err := b.verifyReadModels(ctx, keys, want)
	require.NoError(t, err)
	require.True(t, ok, detail)

	// Lose user 150 and location 150 from the check-in boards (as a lost increment would).
	removed := 0
	ks, err := client.Keys(ctx, "lb:p:leaderboards:*").Result()
	require.NoError(t, err)
	for _, k := range ks {
		if strings.HasSuffix(k, ":users_by_checkins") || strings.HasSuffix(k, ":locations_by_checkins") {
			n, err := client.ZRem(ctx, k, "150").Result()
			require.NoError(t, err)
			removed += int(n)
		}
	}
	require.Equal(t, 2, removed, "user 150 and location 150 were on the boards")

	ok, detail, err = b.verifyReadModels(ctx, keys, want)
	require.NoError(t, err)
	require.False(t, ok, "the boards lack user 150 and location 150, yet the check says OK (%s)", detail)
	require.Contains(t, detail, "leaderboard users: 150 is missing")
	require.Contains(t, detail, "leaderboard checkins: 150 is missing")
}
