package main

import (
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/checkins/checkins/adapters/redistest"
	"github.com/checkins/checkins/ports"
)

// TestSharedPortDashboardStreamsLeaveConnections: on a separate ops listener
// UI_MAX_STREAMS is refused above 48 so that 16 connections stay for /healthz, /readyz and
// /metrics ("with every connection a stream, /healthz and /readyz there went unanswered"). With
// OPS_ADDR = HTTP_ADDR (one port, as the README offers) the streams come out of HTTP_MAX_CONNS,
// and nothing related the two: with HTTP_MAX_CONNS=4 (UI_MAX_STREAMS 32, the default) four
// dashboard tabs of a read-only ops token held every connection, and /healthz, /readyz and every
// check-in waited in the kernel's queue for as long as the tabs stayed open. The streams take at
// most a quarter of HTTP_MAX_CONNS there now: the second tab gets 503.
func TestSharedPortDashboardStreamsLeaveConnections(t *testing.T) {
	t.Parallel()
	env := redistest.Open(t)
	p := startSvc(t, "serve", map[string]string{"REDIS_URL": env.URL, "KEY_PREFIX": env.Prefix, "HTTP_MAX_CONNS": "4"})
	var codes []int
	for i := 0; i < 4; i++ {
		resp, _ := openSSE(t, p.base+"/ui/events", testToken(5, ports.ScopeOpsRead))
		codes = append(codes, resp.StatusCode)
		if resp.StatusCode != http.StatusOK {
			_, _ = io.Copy(io.Discard, resp.Body)
			_ = resp.Body.Close() // its connection goes back to the client's idle ones
		}
	}
	assert.Equal(t, []int{http.StatusOK, http.StatusServiceUnavailable, http.StatusServiceUnavailable, http.StatusServiceUnavailable}, codes,
		"one stream of a quarter of HTTP_MAX_CONNS=4")
	resp, err := (&http.Client{Timeout: 5 * time.Second}).Get(p.base + "/healthz")
	if err == nil {
		_ = resp.Body.Close()
	}
	assert.NoError(t, err, "/healthz answers while dashboards are open (HTTP_MAX_CONNS=4, shared port)")
}
