package main

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/checkins/checkins/adapters"
	"github.com/checkins/checkins/adapters/redistest"
)

// TestPartitionGuardRunsOnceRedisAnswers: a process that starts while Redis is down cannot check
// its STREAM_PARTITIONS against the count recorded in <prefix>:meta. It used to take check-ins as
// soon as Redis came back, for up to a poll, into the partitions of its own count, where no
// projection of the real stream reads them. Now it answers 503 unavailable until the check has
// run; with another count it then stays at 503, naming the migration, and writes nothing; with
// the recorded count it takes check-ins.
func TestPartitionGuardRunsOnceRedisAnswers(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name       string
		configured string
		accepts    bool
	}{
		{"another count", "1", false},
		{"the recorded count", "4", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			srv := redistest.Start(t, redistest.Options{AppendOnly: true})
			ctx := context.Background()
			keys := adapters.KeySpace{Prefix: "guard"}
			check := redistest.Client(t, srv.URL())
			require.NoError(t, check.HSet(ctx, keys.Meta(), "partitions", 4).Err())
			srv.Stop()

			p := startSvc(t, "api", map[string]string{"REDIS_URL": srv.URL(), "KEY_PREFIX": keys.Prefix, "STREAM_PARTITIONS": tc.configured})
			require.Contains(t, p.logs.String(), "redis is not reachable yet")
			post := func(i int) (int, map[string]any) {
				status, body, err := testPostCheckin(p.base, fmt.Sprintf(`{"userId": %d, "locationId": 3, "starRating": 4}`, 1+i%8), nil)
				require.NoError(t, err)
				return status, body
			}
			status, body := post(0)
			require.Equal(t, http.StatusServiceUnavailable, status, "%v", body)

			srv.Restart()
			var accepted int
			var last map[string]any
			deadline := time.Now().Add(3 * adapters.QuiescePoll)
			for i := 1; time.Now().Before(deadline); i++ {
				status, body := post(i)
				switch status {
				case http.StatusAccepted:
					accepted++
				case http.StatusServiceUnavailable:
					last = body
				default:
					t.Fatalf("POST answered %d: %v", status, body)
				}
				time.Sleep(20 * time.Millisecond)
			}
			four, err := keys.WithPartitions(4)
			require.NoError(t, err)
			var inFour int64
			for _, s := range four.Partitions().Streams() {
				n, err := check.XLen(ctx, s).Result()
				require.NoError(t, err)
				inFour += n
			}
			one, err := check.Exists(ctx, keys.Stream()).Result()
			require.NoError(t, err)
			if !tc.accepts {
				assert.Zero(t, accepted, "a process with another partition count takes no check-in")
				assert.Zero(t, one, "nothing was written to the one-stream key %s, which no projection of a 4-partition stream reads", keys.Stream())
				require.NotNil(t, last)
				msg := fmt.Sprint(last["error"])
				assert.Contains(t, msg, "migrate --to 1", "the answer names the migration: %s", msg)
				assert.Equal(t, 1, p.logs.count("partition count differs"), "the mismatch is logged once")
				return
			}
			assert.Positive(t, accepted, "the recorded count: check-ins are taken once Redis answers")
			assert.Equal(t, int64(accepted), inFour, "every accepted check-in is in the 4 partitions")
			assert.Zero(t, one)
		})
	}
}
