package ports_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/checkins/checkins/adapters"
	"github.com/checkins/checkins/adapters/redistest"
	"github.com/checkins/checkins/app"
	"github.com/checkins/checkins/app/projection"
	"github.com/checkins/checkins/domain"
	"github.com/checkins/checkins/ports"
)

// projAPI is the HTTP server with the projection routes, on a real listener and Redis.
type projAPI struct {
	url    string
	client *redis.Client
	keys   adapters.KeySpace
}

func newProjAPI(t *testing.T, minCheckins int64) *projAPI {
	t.Helper()
	env := redistest.Open(t)
	client := redistest.Client(t, env.URL)
	keys := adapters.KeySpace{Prefix: env.Prefix}
	reader := func(name string) projection.Reader { return adapters.NewProjectionReader(client, keys, name) }
	q := app.Queries{
		Leaderboards: app.LeaderboardQueries{Reader: reader("leaderboards"), Leaderboard: projection.Leaderboards{MinCheckins: minCheckins}},
		Recent:       app.RecentCheckinQueries{Reader: reader("recent_checkins")},
		Daily:        app.DailyCheckinQueries{Reader: reader("daily_checkins")},
	}
	s := ports.NewHTTPServer(app.Application{Queries: q}, nil, ports.HTTPConfig{}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	s.RegisterProjectionRoutes()
	hs := httptest.NewServer(s.Handler())
	t.Cleanup(hs.Close)
	return &projAPI{url: hs.URL, client: client, keys: keys}
}

func (a *projAPI) apply(t *testing.T, events []domain.CheckinRecorded, minCheckins int64) {
	t.Helper()
	for _, h := range []interface {
		projection.Projection
		projection.CheckinRecordedHandler
	}{projection.Leaderboards{MinCheckins: minCheckins}, projection.RecentCheckins{}, projection.DailyCheckins{}} {
		applier, err := adapters.NewProjectionApplier(a.client, a.keys, 0)
		require.NoError(t, err)
		for _, e := range events {
			if e.RecordedAt == 0 {
				e.RecordedAt = e.Timestamp // the clock of the dedupe window, without a stream
			}
			_, err := applier.ApplyEvent(context.Background(), "test."+h.Name(), h, 1, e, "")
			require.NoError(t, err)
		}
	}
}

func (a *projAPI) get(t *testing.T, path string, out any) int {
	t.Helper()
	resp, err := contractClient.Get(a.url + path)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	if out != nil {
		require.NoError(t, json.Unmarshal(body, out), "GET %s: %s", path, body)
	}
	return resp.StatusCode
}

type projAPIError struct {
	Error struct {
		Code, Message, Field string
	} `json:"error"`
}

func TestProjectionRoutesRejectBadInput(t *testing.T) {
	t.Parallel()
	a := newProjAPI(t, 2)
	for _, tc := range []struct{ path, field string }{
		{"/leaderboards/locations?by=stars", "by"},
		{"/leaderboards/locations?limit=0", "limit"},
		{"/leaderboards/locations?limit=101", "limit"},
		{"/leaderboards/locations?by=rating&limit=ten", "limit"},
		{"/leaderboards/users?limit=-3", "limit"},
		{"/leaderboards/users?limit=1000", "limit"},
		{"/users/abc/checkins", "userId"},
		{"/users/0/checkins", "userId"},
		{"/locations/x/daily?from=2024-01-01&to=2024-01-02", "locationId"},
		{"/locations/1/daily?to=2024-01-02", "from"},
		{"/locations/1/daily?from=2024-01-01", "to"},
		{"/locations/1/daily?from=2024-02-30&to=2024-03-02", "from"},
		{"/locations/1/daily?from=2024-01-01&to=01/02/2024", "to"},
		{"/locations/1/daily?from=2024-03-02&to=2024-03-01", "to"},
		{"/locations/1/daily?from=2023-01-01&to=2024-01-02", "to"},
	} {
		var body projAPIError
		status := a.get(t, tc.path, &body)
		assert.Equal(t, http.StatusBadRequest, status, tc.path)
		assert.Equal(t, tc.field, body.Error.Field, tc.path)
		assert.NotEmpty(t, body.Error.Message, tc.path)
	}
	// A limit that is not an integer is invalid; an integer outside the range out_of_range, as
	// on every other route with a limit.
	for path, code := range map[string]string{
		"/leaderboards/locations?limit=ten": domain.CodeInvalid,
		"/leaderboards/users?limit=0":       domain.CodeOutOfRange,
		"/leaderboards/users?limit=-3":      domain.CodeOutOfRange,
		"/leaderboards/locations?limit=101": domain.CodeOutOfRange,
	} {
		var body projAPIError
		require.Equal(t, http.StatusBadRequest, a.get(t, path, &body), path)
		assert.Equal(t, code, body.Error.Code, path)
		assert.Contains(t, body.Error.Message, "must be an integer from 1 to 100", path)
	}
	var nf projAPIError
	require.Equal(t, http.StatusNotFound, a.get(t, "/users/7/checkins", &nf), "a user with no check-ins")
	assert.Equal(t, domain.CodeNotFound, nf.Error.Code)
}

func TestProjectionRoutesAnswerFromTheReadModels(t *testing.T) {
	t.Parallel()
	const minCheckins = 3
	a := newProjAPI(t, minCheckins)
	day := func(d int, h int) int64 { return time.Date(2024, 2, d, h, 0, 0, 0, time.UTC).UnixMilli() }
	var events []domain.CheckinRecorded
	add := func(user, loc int64, stars int, ts int64) {
		events = append(events, domain.CheckinRecorded{Checkin: domain.Checkin{ID: fmt.Sprintf("e%d", len(events)), UserID: user,
			LocationID: loc, StarRating: stars, Timestamp: ts}})
	}
	// Location 1: 4 check-ins averaging 4.5; location 2: 3 averaging 5; location 3: 2 with 5 stars
	// (below the minimum, so not on the rating board).
	add(1, 1, 5, day(1, 10))
	add(1, 1, 4, day(1, 23))
	add(2, 1, 5, day(3, 0))
	add(2, 1, 4, day(3, 1))
	add(2, 2, 5, day(2, 8))
	add(3, 2, 5, day(2, 9))
	add(3, 2, 5, day(4, 9))
	add(3, 3, 5, day(5, 9))
	add(3, 3, 5, day(5, 10))
	a.apply(t, events, minCheckins)

	var byRating struct {
		By        string                           `json:"by"`
		Limit     int                              `json:"limit"`
		Locations []projection.LeaderboardLocation `json:"locations"`
	}
	require.Equal(t, http.StatusOK, a.get(t, "/leaderboards/locations?by=rating", &byRating))
	assert.Equal(t, "rating", byRating.By)
	assert.Equal(t, projection.DefaultLeaderboardLimit, byRating.Limit)
	assert.Equal(t, []projection.LeaderboardLocation{
		{Rank: 1, LocationID: 2, NumCheckins: 3, AverageRating: 5},
		{Rank: 2, LocationID: 1, NumCheckins: 4, AverageRating: 4.5},
	}, byRating.Locations)

	var byCount struct {
		Locations []projection.LeaderboardLocation `json:"locations"`
	}
	require.Equal(t, http.StatusOK, a.get(t, "/leaderboards/locations?by=checkins&limit=2", &byCount))
	require.Len(t, byCount.Locations, 2)
	assert.Equal(t, int64(1), byCount.Locations[0].LocationID)
	assert.Equal(t, int64(4), byCount.Locations[0].NumCheckins)

	var users struct {
		Users []projection.LeaderboardUser `json:"users"`
	}
	require.Equal(t, http.StatusOK, a.get(t, "/leaderboards/users?limit=1", &users))
	assert.Equal(t, []projection.LeaderboardUser{{Rank: 1, UserID: 3, NumCheckins: 4}}, users.Users)

	var recent projection.RecentCheckinsView
	require.Equal(t, http.StatusOK, a.get(t, "/users/2/checkins", &recent))
	require.Len(t, recent.Checkins, 3)
	assert.Equal(t, []int64{day(3, 1), day(3, 0), day(2, 8)},
		[]int64{recent.Checkins[0].Timestamp, recent.Checkins[1].Timestamp, recent.Checkins[2].Timestamp}, "newest first")

	var daily projection.DailyCheckinsView
	require.Equal(t, http.StatusOK, a.get(t, "/locations/1/daily?from=2024-01-31&to=2024-02-04", &daily))
	assert.Equal(t, int64(4), daily.Total)
	assert.Equal(t, []projection.DayCount{{Date: "2024-01-31"}, {Date: "2024-02-01", Checkins: 2}, {Date: "2024-02-02"},
		{Date: "2024-02-03", Checkins: 2}, {Date: "2024-02-04"}}, daily.Days)

	// A location counted before answers zeros for a range without its check-ins; one never
	// counted is not found, as /users/{id}/checkins and /locations/{id} answer.
	require.Equal(t, http.StatusOK, a.get(t, "/locations/1/daily?from=2023-01-01&to=2023-01-02", &daily))
	assert.Equal(t, int64(0), daily.Total)
	assert.Equal(t, []projection.DayCount{{Date: "2023-01-01"}, {Date: "2023-01-02"}}, daily.Days)
	assert.Equal(t, http.StatusNotFound, a.get(t, "/locations/999/daily?from=2024-01-31&to=2024-02-04", nil))
}
