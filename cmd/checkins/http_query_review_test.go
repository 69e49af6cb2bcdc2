package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/checkins/checkins/adapters/redistest"
)

// rawDo sends a request with the test token and returns its status and body (no validating
// transport: the tests below send what a validating client would not).
func rawDo(t *testing.T, method, url string, header map[string]string) (int, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, url, nil)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+testToken(42))
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := (&http.Client{Timeout: 10 * time.Second}).Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

// TestMalformedQueryIsRefused: a query string url.ParseQuery cannot read whole (a ';' separator,
// a bad % escape) had the offending pairs dropped without a word (Echo's QueryParam ignores the
// parse error): the filter the client asked for was not applied, and the answer was 200 over
// everything. It is 400 now, naming the parameter. (Found by a review of the read API.)
func TestMalformedQueryIsRefused(t *testing.T) {
	t.Parallel()
	rdb := redistest.Open(t)
	svc := startInProcess(t, map[string]string{"REDIS_URL": rdb.URL, "KEY_PREFIX": rdb.Prefix}, Mode{API: true, Projections: true})
	for _, b := range []string{`{"userId":42,"locationId":7,"starRating":4}`, `{"userId":43,"locationId":8,"starRating":1}`} {
		st, out, err := testPostCheckin(svc.base, b, nil)
		require.NoError(t, err)
		require.Equal(t, http.StatusAccepted, st, "%v", out)
	}
	for path, field := range map[string]string{
		"/checkins?from=1;to=2":              "from", // ';' separator: from and to both dropped
		"/checkins?to=1&limit=1%ZZ":          "limit",
		"/checkins?limit=%ZZ":                "limit",  // limit dropped: the default 100
		"/leaderboards/locations?by=rat%ing": "by",     // by dropped: the check-ins board
		"/leaderboards/users?limit=1%":       "limit",  // limit dropped: 10 rows
		"/checkins?cursor=1-0%":              "cursor", // cursor dropped: the first page again
	} {
		st, b := rawDo(t, http.MethodGet, svc.base+path, nil)
		assert.Equal(t, http.StatusBadRequest, st, "%s answered %s", path, b)
		var e struct{ Error struct{ Code, Field string } }
		require.NoError(t, json.Unmarshal(b, &e), "%s", b)
		assert.Equal(t, "invalid", e.Error.Code, path)
		assert.Equal(t, field, e.Error.Field, path)
	}
	st, b := rawDo(t, http.MethodGet, svc.base+"/checkins?limit=1&from=0", nil)
	assert.Equal(t, http.StatusOK, st, "%s", b)
}

// TestPartitionedBadCursorRefused: with STREAM_PARTITIONS > 1 a cursor that is no cursor was
// taken (200, an empty page) whenever from was past the server's clock, where a single stream
// refuses it (400, field cursor).
func TestPartitionedBadCursorRefused(t *testing.T) {
	t.Parallel()
	for _, parts := range []string{"1", "4"} {
		rdb := redistest.Open(t)
		svc := startInProcess(t, map[string]string{"REDIS_URL": rdb.URL, "KEY_PREFIX": rdb.Prefix, "STREAM_PARTITIONS": parts}, Mode{API: true})
		future := time.Now().Add(time.Hour).UnixMilli()
		st, b := rawDo(t, http.MethodGet, fmt.Sprintf("%s/checkins?from=%d&cursor=not-a-cursor", svc.base, future), nil)
		assert.Equal(t, http.StatusBadRequest, st, "STREAM_PARTITIONS=%s: %s", parts, b)
		assert.Contains(t, string(b), `"field":"cursor"`)
	}
}

// TestDuplicateIdempotencyKeyRefused: two Idempotency-Key headers with different values: the
// second was dropped silently and the check-in recorded under the first (two Authorization
// headers are refused, 401). Which one the client meant is not ours to pick: 400.
func TestDuplicateIdempotencyKeyRefused(t *testing.T) {
	t.Parallel()
	rdb := redistest.Open(t)
	svc := startInProcess(t, map[string]string{"REDIS_URL": rdb.URL, "KEY_PREFIX": rdb.Prefix}, Mode{API: true})
	req, err := http.NewRequest(http.MethodPost, svc.base+"/checkins", strings.NewReader(`{"locationId":7,"starRating":4}`))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+testToken(42))
	req.Header.Add("Idempotency-Key", "key-a")
	req.Header.Add("Idempotency-Key", "key-b")
	resp, err := (&http.Client{Timeout: 10 * time.Second}).Do(req)
	require.NoError(t, err)
	b, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	assert.Equal(t, http.StatusBadRequest, resp.StatusCode, "%s", b)
	assert.Contains(t, string(b), "Idempotency-Key header sent 2 times")
}

// TestQueryIntegersAsWritten: path ids must be integers as JSON writes them (pathID refuses "+1"
// and "01"); the query's integers were not held to it: limit=+5, limit=05, from=+5, to=007 were
// taken. They are refused now, as the ids are.
func TestQueryIntegersAsWritten(t *testing.T) {
	t.Parallel()
	rdb := redistest.Open(t)
	svc := startInProcess(t, map[string]string{"REDIS_URL": rdb.URL, "KEY_PREFIX": rdb.Prefix}, Mode{API: true, Projections: true})
	for _, path := range []string{"/users/%2B42", "/users/042", "/checkins?limit=%2B5", "/checkins?limit=05", "/checkins?from=%2B5",
		"/checkins?to=007", "/leaderboards/users?limit=%2B5", "/leaderboards/locations?limit=010"} {
		st, b := rawDo(t, http.MethodGet, svc.base+path, nil)
		assert.Equal(t, http.StatusBadRequest, st, "%s: %s", path, b)
	}
	for _, path := range []string{"/checkins?limit=5&from=0&to=10", "/leaderboards/users?limit=10"} {
		st, b := rawDo(t, http.MethodGet, svc.base+path, nil)
		assert.Equal(t, http.StatusOK, st, "%s: %s", path, b)
	}
}
