package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/checkins/checkins/adapters/redistest"
	"github.com/checkins/checkins/ports"
)

// TestPartitionedStallWithAPipeInTheKeyPrefix: the stall rule keeps, per partitioned
// group, one observation "<stream>=<signature>@<since>\t...|<since>" and read it back by
// cutting at the first "|" and the first "=". KEY_PREFIX may hold either (only spaces and
// braces are refused), and the partitions' stream names start with it: the observation then
// never read back, every check started the "unchanged" clock again, and a group that stood
// still was never reported stalled: not by /ops/status (the dashboard), /metrics or /readyz
// (found by a review). It is now cut at the last of each.
func TestPartitionedStallWithAPipeInTheKeyPrefix(t *testing.T) {
	t.Parallel()
	for name, suffix := range map[string]string{"control: plain prefix": "", "prefix with |": "|eu", "prefix with =": "=eu"} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			rdb := redistest.Open(t)
			client := redistest.Client(t, rdb.URL)
			ctx := context.Background()
			prefix := rdb.Prefix + suffix
			svc := startInProcess(t, map[string]string{"REDIS_URL": rdb.URL, "KEY_PREFIX": prefix, "OPS_ADDR": "localhost:0",
				"STREAM_PARTITIONS": "2", "STALL_AFTER": "1s"}, Mode{API: true})
			for u := 1; u <= 6; u++ {
				status, body, err := testPostCheckin(svc.base, fmt.Sprintf(`{"userId": %d, "locationId": 2, "starRating": 3}`, u), map[string]string{"Authorization": "Bearer " + testToken(int64(u))})
				require.NoError(t, err)
				require.Equal(t, http.StatusAccepted, status, "%v", body)
			}
			streams, err := client.Keys(ctx, prefix+"*").Result()
			require.NoError(t, err)
			var parts []string
			for _, k := range streams {
				if typ, _ := client.Type(ctx, k).Result(); typ == "stream" && !strings.Contains(k, "poison") {
					parts = append(parts, k)
				}
			}
			require.Len(t, parts, 2, "keys: %v", streams)
			for _, s := range parts {
				require.NoError(t, client.XGroupCreate(ctx, s, "users.v1", "0").Err()) // never read: stands still
			}
			auth := map[string]string{"Authorization": "Bearer " + testToken(3, ports.ScopeOpsRead)}
			stalled := func() (bool, string) {
				_, body := uiDo(t, uiReq{method: http.MethodGet, url: svc.ops + "/ops/status", header: auth})
				var st struct {
					Projections []struct {
						Group   string `json:"group"`
						Stalled bool   `json:"stalled"`
					} `json:"projections"`
				}
				require.NoError(t, json.Unmarshal([]byte(body), &st), body)
				_, metrics := uiDo(t, uiReq{method: http.MethodGet, url: svc.ops + "/metrics"})
				m := regexp.MustCompile(`checkins_projection_stalled\{group="users\.v1"[^}]*\} (\S+)`).FindStringSubmatch(metrics)
				for _, p := range st.Projections {
					if p.Group == "users.v1" {
						return p.Stalled, fmt.Sprint(m)
					}
				}
				return false, ""
			}
			var metric string
			ok := false
			for end := time.Now().Add(8 * time.Second); !ok && time.Now().Before(end); time.Sleep(200 * time.Millisecond) {
				ok, metric = stalled()
			}
			assert.True(t, ok, "users.v1 stood still for 8s with STALL_AFTER=1s: /ops/status never says stalled")
			t.Logf("KEY_PREFIX %q: stalled in /ops/status: %v; /metrics: %s", prefix, ok, metric)
		})
	}
}
