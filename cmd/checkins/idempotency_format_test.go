package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/checkins/checkins/adapters"
	"github.com/checkins/checkins/adapters/redistest"
	"github.com/checkins/checkins/domain"
)

// TestIdempotencyFormatSwitch: a deployment that an earlier release served (its stream holds an
// entry, and a JSON record answers for a check-in of it) keeps writing JSON records under this
// release; `checkins idempotency format compact` switches it, and after that a record is a
// dozen bytes; retries of records of either format are replayed and a reused checkinId with
// another body is refused, through the real binary.
func TestIdempotencyFormatSwitch(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t, redistest.Options{})
	c := redistest.Client(t, srv.URL())
	ctx := context.Background()
	keys := adapters.KeySpace{Prefix: "checkins"}
	env := map[string]string{"REDIS_URL": srv.URL()}

	// What an earlier release left: an entry on the stream and its record, as JSON.
	old := domain.CheckinRecorded{Checkin: domain.Checkin{ID: "old-1", UserID: 7, LocationID: 3, StarRating: 4, Timestamp: 1700000000000},
		RecordedAt: 1700000000100}
	u, l, s, ts := old.UserID, old.LocationID, int64(old.StarRating), old.Timestamp
	old.Fingerprint = domain.CheckinInput{UserID: &u, LocationID: &l, StarRating: &s, Timestamp: &ts}.Fingerprint()
	xaddEvent(t, c, keys.Stream(), old)
	require.NoError(t, c.Set(ctx, keys.Idempotency(7, "old-1"), fmt.Sprintf(`P{"f":%q,"id":"old-1","u":7,"l":3,"s":4,"t":1700000000000,"r":1700000000100}`,
		old.Fingerprint), 0).Err())

	body := func(id string, loc int) string {
		return fmt.Sprintf(`{"checkinId":%q,"locationId":%d,"starRating":4,"timestamp":1700000000000}`, id, loc)
	}
	post := func(base, id string, loc int) (int, http.Header) {
		t.Helper()
		code, h, _ := plainDo(t, http.MethodPost, base+"/checkins", testToken(7), body(id, loc))
		return code, h
	}
	// record is id's record once published: on this keyspace (its stream held entries before
	// scoped keys were marked) the API takes the two-step path, which marks the record published
	// after the answer.
	record := func(id string) string {
		var v string
		require.Eventually(t, func() bool {
			var err error
			v, err = c.Get(ctx, keys.Idempotency(7, id)).Result()
			return err == nil && strings.HasPrefix(v, "P")
		}, 10*time.Second, 5*time.Millisecond, "%s's record is not marked published: %q", id, v)
		return v
	}
	format := func(args ...string) (int, string, string) {
		return runCLI(t, env, append([]string{"idempotency", "format"}, args...)...)
	}

	svc := startSvc(t, "serve", env)
	code, _ := post(svc.base, "a-1", 3)
	require.Equal(t, http.StatusAccepted, code)
	v := record("a-1")
	assert.True(t, strings.HasPrefix(v, `P{"f":`), "JSON while earlier releases may run: %q", v)
	rc, out, errOut := format()
	require.Zero(t, rc, errOut)
	assert.Equal(t, "idempotency records are written json\n", out)

	rc, out, errOut = format("compact")
	require.Zero(t, rc, errOut)
	assert.Contains(t, out, "were written json and are written compact from now on")
	rc, out, errOut = format("--json")
	require.Zero(t, rc, errOut)
	var got struct{ Format string }
	require.NoError(t, json.Unmarshal([]byte(out), &got))
	assert.Equal(t, "compact", got.Format)

	// A process reads the format at its first check-in (and every minute after).
	svc.exit(t, syscall.SIGTERM)
	svc = startSvc(t, "serve", env)
	code, _ = post(svc.base, "b-1", 3)
	require.Equal(t, http.StatusAccepted, code)
	v = record("b-1")
	assert.Less(t, len(v), 20, "compact: %q", v)

	for _, id := range []string{"old-1", "a-1", "b-1"} {
		code, h := post(svc.base, id, 3)
		assert.Equal(t, http.StatusAccepted, code, "a retry of %s", id)
		assert.Equal(t, "true", h.Get("Idempotent-Replayed"), "a retry of %s is replayed", id)
		code, _ = post(svc.base, id, 4)
		assert.Equal(t, http.StatusConflict, code, "%s with another body", id)
	}
	// A request that leaves the timestamp to the server: its retry (again without one) is
	// replayed with the first answer's timestamp, one with a timestamp conflicts.
	noTS := `{"checkinId":"b-2","locationId":3,"starRating":1}`
	code, _, first := plainDo(t, http.MethodPost, svc.base+"/checkins", testToken(7), noTS)
	require.Equal(t, http.StatusAccepted, code)
	v = record("b-2")
	assert.Less(t, len(v), 20, "compact: %q", v)
	code, h, again := plainDo(t, http.MethodPost, svc.base+"/checkins", testToken(7), noTS)
	assert.Equal(t, http.StatusAccepted, code)
	assert.Equal(t, "true", h.Get("Idempotent-Replayed"))
	assert.JSONEq(t, first, again, "the same check-in, its timestamp the server's")
	code, _, _ = plainDo(t, http.MethodPost, svc.base+"/checkins", testToken(7), `{"checkinId":"b-2","locationId":3,"starRating":1,"timestamp":1700000000000}`)
	assert.Equal(t, http.StatusConflict, code)

	n, err := c.XLen(ctx, keys.Stream()).Result()
	require.NoError(t, err)
	assert.EqualValues(t, 4, n, "retries add nothing")

	rc, _, errOut = format("binary")
	assert.NotZero(t, rc)
	assert.Contains(t, errOut, `unknown idempotency record format "binary": compact or json`)
	rc, _, errOut = format("compact", "json")
	assert.NotZero(t, rc)
	assert.Contains(t, errOut, "unexpected arguments: [json]")
}
