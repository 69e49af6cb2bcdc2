package ports_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/checkins/checkins/adapters"
	"github.com/checkins/checkins/app/projection"
	"github.com/checkins/checkins/domain"
)

func TestGetStatsRejectsBadIDs(t *testing.T) {
	t.Parallel()
	e := newAPIEnv(t)
	for _, res := range []struct{ path, field string }{{"/users/", "userId"}, {"/locations/", "locationId"}} {
		for _, id := range []string{"abc", "0", "-1", "1.5", "1e3", "99999999999999999999", "%20"} {
			resp := e.get(t, res.path+id)
			require.Equal(t, http.StatusBadRequest, resp.status, "%s%s: %s", res.path, id, resp.body)
			ae := resp.apiError(t)
			assert.Equal(t, res.field, ae.Field)
			assert.Contains(t, ae.Message, res.field)
		}
		resp := e.get(t, res.path+"5")
		require.Equal(t, http.StatusNotFound, resp.status, "%s5 was never written: %s", res.path, resp.body)
		assert.Equal(t, "not_found", resp.apiError(t).Code)
	}
}

func TestGetStatsReturnsNumbers(t *testing.T) {
	t.Parallel()
	e := newAPIEnv(t)
	ctx := context.Background()
	// Write the read models directly through the projections, as the projector would.
	for _, ev := range []domain.CheckinRecorded{
		{Checkin: domain.Checkin{ID: "a", UserID: 42, LocationID: 7, StarRating: 5, Timestamp: 2000}, RecordedAt: 2000},
		{Checkin: domain.Checkin{ID: "b", UserID: 42, LocationID: 8, StarRating: 2, Timestamp: 1000}, RecordedAt: 2001},
		{Checkin: domain.Checkin{ID: "c", UserID: 43, LocationID: 7, StarRating: 3, Timestamp: 3000}, RecordedAt: 3000},
	} {
		applier, err := adapters.NewProjectionApplier(e.rdb, e.keys, 0)
		require.NoError(t, err)
		for _, p := range []projection.Projection{projection.UserStats{}, projection.LocationStats{}} {
			_, err := applier.ApplyEvent(ctx, "test."+p.Name(), p, 1, ev, "")
			require.NoError(t, err)
		}
	}

	resp := e.get(t, "/users/42")
	require.Equal(t, http.StatusOK, resp.status, "body %s", resp.body)
	assert.Equal(t, map[string]any{"userId": json.Number("42"), "numCheckins": json.Number("2"),
		"lastCheckin": json.Number("2000"), "lastSeenAt": json.Number("7")}, resp.json(t))

	resp = e.get(t, "/users/%34%32") // the same URI as /users/42
	require.Equal(t, http.StatusOK, resp.status, "body %s", resp.body)
	assert.Equal(t, json.Number("42"), resp.json(t)["userId"])

	resp = e.get(t, "/locations/7")
	require.Equal(t, http.StatusOK, resp.status, "body %s", resp.body)
	assert.Equal(t, map[string]any{"locationId": json.Number("7"), "numCheckins": json.Number("2"),
		"numStars": json.Number("8"), "averageStars": json.Number("4")}, resp.json(t))
}

func TestGetLatestCheckin(t *testing.T) {
	t.Parallel()
	e := newAPIEnv(t)
	resp := e.get(t, "/checkins/latest")
	require.Equal(t, http.StatusNotFound, resp.status, "empty stream: %s", resp.body)
	assert.Equal(t, "not_found", resp.apiError(t).Code)

	require.Equal(t, http.StatusAccepted, e.post(t, `{"checkinId":"ck-1","userId":1,"locationId":2,"starRating":3,"timestamp":1000}`, nil).status)
	require.Equal(t, http.StatusAccepted, e.post(t, `{"checkinId":"ck-2","userId":4,"locationId":5,"starRating":1,"timestamp":500}`, nil).status)
	// Someone XADDs garbage after them: latest skips it.
	require.NoError(t, e.rdb.XAdd(context.Background(), &redis.XAddArgs{Stream: e.keys.Stream(), Values: map[string]any{"foo": "bar"}}).Err())

	resp = e.get(t, "/checkins/latest")
	require.Equal(t, http.StatusOK, resp.status, "body %s", resp.body)
	body := resp.json(t)
	assert.Equal(t, "ck-2", body["checkinId"], "latest recorded, not greatest timestamp")
	assert.Equal(t, json.Number("4"), body["userId"])
	assert.Equal(t, json.Number("5"), body["locationId"])
	assert.Equal(t, json.Number("1"), body["starRating"])
	assert.Equal(t, json.Number("500"), body["timestamp"])
	assert.IsType(t, json.Number(""), body["recordedAt"])
	assert.IsType(t, "", body["entryId"])
}

func TestListCheckins(t *testing.T) {
	t.Parallel()
	e := newAPIEnv(t)
	ctx := context.Background()
	var all []string
	for ms := int64(1000); ms <= 9000; ms += 1000 {
		for seq := range 2 {
			id := fmt.Sprintf("%d-%d", ms, seq)
			ev := domain.CheckinRecorded{Checkin: domain.Checkin{ID: "ck-" + id, UserID: 1, LocationID: 1, StarRating: 1, Timestamp: ms}, RecordedAt: ms}
			values := map[string]any{}
			for k, v := range ev.Fields() {
				values[k] = v
			}
			require.NoError(t, e.rdb.XAdd(ctx, &redis.XAddArgs{Stream: e.keys.Stream(), ID: id, Values: values}).Err())
			all = append(all, id)
		}
		require.NoError(t, e.rdb.XAdd(ctx, &redis.XAddArgs{Stream: e.keys.Stream(), ID: fmt.Sprintf("%d-9", ms), Values: map[string]any{"junk": "1"}}).Err())
	}
	type page struct {
		Checkins []struct {
			CheckinID  string `json:"checkinId"`
			EntryID    string `json:"entryId"`
			UserID     int64  `json:"userId"`
			RecordedAt int64  `json:"recordedAt"`
		} `json:"checkins"`
		NextCursor string `json:"nextCursor"`
	}
	list := func(q url.Values) page {
		t.Helper()
		resp := e.get(t, "/checkins?"+q.Encode())
		require.Equal(t, http.StatusOK, resp.status, "%s: %s", q.Encode(), resp.body)
		var p page
		require.NoError(t, json.Unmarshal(resp.body, &p))
		require.NotNil(t, p.Checkins, "checkins is [] not null")
		return p
	}

	p := list(url.Values{})
	require.Len(t, p.Checkins, len(all), "default: everything (fewer than the default limit)")
	assert.Empty(t, p.NextCursor)
	assert.Equal(t, "ck-1000-0", p.Checkins[0].CheckinID, "oldest first")
	assert.Equal(t, int64(1), p.Checkins[0].UserID)
	assert.Equal(t, int64(1000), p.Checkins[0].RecordedAt)

	p = list(url.Values{"from": {"3000"}, "to": {"4000"}})
	var got []string
	for _, c := range p.Checkins {
		got = append(got, c.EntryID)
	}
	assert.Equal(t, []string{"3000-0", "3000-1", "4000-0", "4000-1"}, got)

	p = list(url.Values{"from": {"50000"}})
	assert.Empty(t, p.Checkins)

	// Cursor pagination visits every entry in [2000, 8000] exactly once.
	got = nil
	q := url.Values{"from": {"2000"}, "to": {"8000"}, "limit": {"3"}}
	for pages := 0; ; pages++ {
		require.Less(t, pages, 50)
		p := list(q)
		assert.LessOrEqual(t, len(p.Checkins), 3)
		for _, c := range p.Checkins {
			got = append(got, c.EntryID)
		}
		if p.NextCursor == "" {
			break
		}
		q.Set("cursor", p.NextCursor)
	}
	assert.Equal(t, all[2:16], got)

	for _, tt := range []struct{ query, field string }{
		{"limit=0", "limit"}, {"limit=1001", "limit"}, {"limit=abc", "limit"}, {"limit=-1", "limit"},
		{"from=abc", "from"}, {"to=1.5", "to"}, {"from=-5", "from"}, {"from=10&to=5", "to"},
		{"cursor=nope", "cursor"}, {"cursor=99999999999999999999999-0", "cursor"},
	} {
		resp := e.get(t, "/checkins?"+tt.query)
		require.Equal(t, http.StatusBadRequest, resp.status, "%s: %s", tt.query, resp.body)
		assert.Equal(t, tt.field, resp.apiError(t).Field, tt.query)
	}
	assert.Equal(t, http.StatusOK, e.get(t, "/checkins?limit=1000").status)
}

func TestHealthAndReadiness(t *testing.T) {
	t.Parallel()
	e := newAPIEnv(t)
	assert.Equal(t, http.StatusOK, e.get(t, "/healthz").status)
	assert.Equal(t, http.StatusOK, e.get(t, "/readyz").status)

	e.redis.Kill()
	assert.Equal(t, http.StatusOK, e.get(t, "/healthz").status, "alive even without Redis")
	resp := e.get(t, "/readyz")
	assert.Equal(t, http.StatusServiceUnavailable, resp.status)
	assert.Equal(t, "unavailable", resp.json(t)["status"])
	for _, path := range []string{"/users/1", "/locations/1", "/checkins/latest", "/checkins"} {
		resp := e.get(t, path)
		require.Equal(t, http.StatusServiceUnavailable, resp.status, "%s: %s", path, resp.body)
		assert.Equal(t, "unavailable", resp.apiError(t).Code, path)
	}

	e.redis.Restart()
	assert.Eventually(t, func() bool { return e.get(t, "/readyz").status == http.StatusOK }, 10*time.Second, 50*time.Millisecond)
}

func TestUnknownRoutesAnswerJSON(t *testing.T) {
	t.Parallel()
	e := newAPIEnv(t)
	resp := e.get(t, "/nope")
	assert.Equal(t, http.StatusNotFound, resp.status)
	resp.apiError(t)
	resp = e.do(t, http.MethodDelete, "/checkins", "", nil, nil)
	assert.Equal(t, http.StatusMethodNotAllowed, resp.status)
	resp.apiError(t)
}
