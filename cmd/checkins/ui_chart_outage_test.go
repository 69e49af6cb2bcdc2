package main

// The dashboard's charts while the status cannot be read.

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/checkins/checkins/adapters"
	"github.com/checkins/checkins/adapters/redistest"
	"github.com/checkins/checkins/ports"
)

// TestChartDuringAnOutageMakesUpNoRate: the README says that while the status cannot be
// read "the overview shows the error and no figures (the chart keeps the last ones)", and the
// lag chart does leave a gap (null) for such a sample. But the check-ins per second chart gets a
// point of 0 for every failed sample: an outage draws as ingest dropping to nothing, a figure
// nobody measured (the same made-up 0 the overview stopped showing).
func TestChartDuringAnOutageMakesUpNoRate(t *testing.T) {
	t.Parallel()
	rdb := redistest.Open(t)
	client := redistest.Client(t, rdb.URL)
	ctx := context.Background()
	keys := adapters.KeySpace{Prefix: rdb.Prefix}
	require.NoError(t, client.XAdd(ctx, &redis.XAddArgs{Stream: keys.Stream(), Values: []any{"n", 1}}).Err())
	require.NoError(t, client.XGroupCreate(ctx, keys.Stream(), "users.v1", "0").Err())
	svc := startInProcess(t, map[string]string{"REDIS_URL": rdb.URL, "KEY_PREFIX": rdb.Prefix, "OPS_ADDR": "localhost:0"}, Mode{API: true})
	resp, events := openSSE(t, svc.ops+"/ui/events", testToken(5, ports.ScopeOpsRead))
	require.Equal(t, http.StatusOK, resp.StatusCode)

	for ev := range events { // a good sample first: the chart has the group
		if ev.Event == "chart" && strings.Contains(ev.Data, "users.v1") {
			break
		}
	}
	// The status cannot be read (the stream's key holds something else for a while).
	require.NoError(t, client.Rename(ctx, keys.Stream(), keys.Stream()+":aside").Err())
	require.NoError(t, client.Set(ctx, keys.Stream(), "x", 0).Err())

	var cd struct {
		T    []int64             `json:"t"`
		Rate []*float64          `json:"rate"`
		Lag  map[string][]*int64 `json:"lag"`
	}
	outage := false
	deadline := time.After(15 * time.Second)
	for {
		select {
		case ev, ok := <-events:
			require.True(t, ok, "the stream ended")
			if ev.Event == "overview" {
				outage = strings.Contains(ev.Data, "status unavailable")
			}
			if ev.Event != "chart" || !outage {
				continue
			}
			require.NoError(t, json.Unmarshal([]byte(ev.Data), &cd), ev.Data)
			last := len(cd.T) - 1
			require.GreaterOrEqual(t, last, 0)
			t.Logf("the overview says status unavailable; the chart's last point: rate %v, lag of users.v1 %v",
				fmtF(cd.Rate[last]), cd.Lag["users.v1"][last])
			assert.Nil(t, cd.Lag["users.v1"][last], "the lag chart leaves a gap")
			assert.Nil(t, cd.Rate[last], "the rate chart draws a measured-looking 0 check-ins/s for a sample that failed")
			return
		case <-deadline:
			t.Fatal("no chart during the outage within 15s")
		}
	}
}

func fmtF(f *float64) any {
	if f == nil {
		return nil
	}
	return *f
}
