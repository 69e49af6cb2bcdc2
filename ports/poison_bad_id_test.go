package ports_test

import (
	"net/http"
	"testing"

	"github.com/stretchr/testify/assert"
)

// TestPoisonOutOfRangeIDIsABadRequest: an entry ID that matches ^[0-9]+-[0-9]+$ but that
// Redis refuses ("ERR Invalid stream ID": the milliseconds or the sequence above 2^64-1) is
// passed to XRANGE/XDEL, and Redis's refusal is reported as an outage: 503, where README
// promises 400 for a malformed ID (and the cursors, validated by ops.ValidateCursor, do get 400).
func TestPoisonOutOfRangeIDIsABadRequest(t *testing.T) {
	t.Parallel()
	h := startHarness(t, newFaulty("faulty", nil), harnessOptions{})
	ts, _ := opsAPI(t, h)
	h.park("x", 1)
	for _, id := range []string{"99999999999999999999-0", "1-99999999999999999999"} {
		for _, c := range []struct{ method, path string }{
			{"GET", "/ops/poison/" + id},
			{"DELETE", "/ops/poison/" + id},
			{"POST", "/ops/poison/" + id + "/replay"},
		} {
			var e apiErr
			status := call(t, c.method, ts.URL+c.path, &e)
			assert.Equal(t, http.StatusBadRequest, status, "%s %s: %+v", c.method, c.path, e.Error)
		}
	}
	// The same malformed value as a cursor is a 400, as it should be.
	var e apiErr
	assert.Equal(t, http.StatusBadRequest, call(t, "GET", ts.URL+"/ops/poison?cursor=99999999999999999999-0", &e))
}
