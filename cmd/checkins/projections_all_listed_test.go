package main

import (
	"fmt"
	"net/http"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/checkins/checkins/adapters"
	"github.com/checkins/checkins/adapters/redistest"
)

// TestProjectionsListingEveryShippedOneIsTheDefault: PROJECTIONS naming all five shipped
// projections made a live group of its own, `live:daily_checkins,...`, where a process without
// PROJECTIONS runs `live` (README: `live` is all shipped projections): after such a process had
// run, it was refused ("fed by another live group"). It is `live` now.
func TestProjectionsListingEveryShippedOneIsTheDefault(t *testing.T) {
	t.Parallel()
	rdb := redistest.Open(t)
	env := map[string]string{"REDIS_URL": rdb.URL, "KEY_PREFIX": rdb.Prefix}
	l := newLedger()
	c := authedClient(10 * time.Second)
	svc := startSvc(t, "serve", env)
	for i := range 20 {
		l.post(c, svc.base, fmt.Sprintf("a-%d", i), sent{user: int64(1 + i%3), location: int64(1 + i%4), stars: int64(i % 6)})
	}
	l.verify(t, svc.base)
	require.Equal(t, 0, svc.exit(t, syscall.SIGTERM))

	listed := map[string]string{"PROJECTIONS": "recent_checkins,users,leaderboards,daily_checkins,locations"}
	for k, v := range env {
		listed[k] = v
	}
	svc = startSvc(t, "serve", listed)
	require.Eventually(t, func() bool { code, _ := faultGet(t, svc.base+"/readyz"); return code == http.StatusOK }, 30*time.Second, 50*time.Millisecond,
		"ready: %s", svc.logs)
	for i := range 20 {
		l.post(c, svc.base, fmt.Sprintf("b-%d", i), sent{user: int64(1 + i%3), location: int64(1 + i%4), stars: int64(i % 6)})
	}
	l.verifyAll(t, rdb.URL, adapters.KeySpace{Prefix: rdb.Prefix})
	require.NotContains(t, svc.logs.String(), "fed by another live group")
	groups := groupsPending(t, redistest.Client(t, rdb.URL), adapters.KeySpace{Prefix: rdb.Prefix})
	require.Contains(t, groups, "live")
	require.Len(t, groups, 1, "one group, live: %v", groups)
}
