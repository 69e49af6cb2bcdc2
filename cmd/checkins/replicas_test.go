package main

import (
	"context"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/checkins/checkins/adapters"
	"github.com/checkins/checkins/adapters/redistest"
)

// TestIngestMinReplicasOnOneServerRetryIsSafe: one server with a replica the test starts, and
// INGEST_MIN_REPLICAS=1. While the replica lags, a check-in answers 503 not_replicated; once it is
// back, the client's retry with the same checkinId gets a 202 (after the reservation's takeover
// age), and the check-in is counted once although the stream holds it twice.
func TestIngestMinReplicasOnOneServerRetryIsSafe(t *testing.T) {
	t.Parallel()
	master := redistest.Start(t, redistest.Options{})
	replica := redistest.Start(t, redistest.Options{Args: []string{"--replicaof", "127.0.0.1", strings.TrimPrefix(master.Addr(), "127.0.0.1:")}})
	mc := redistest.Client(t, master.URL())
	online := func() bool {
		info, _ := mc.Info(context.Background(), "replication").Result()
		return strings.Contains(info, "state=online")
	}
	require.Eventually(t, online, 10*time.Second, 20*time.Millisecond)
	svc := startSvc(t, "serve", map[string]string{"REDIS_URL": master.URL(), "KEY_PREFIX": "rep",
		"INGEST_MIN_REPLICAS": "1", "INGEST_REPLICA_TIMEOUT": "1s", "REQUEST_TIMEOUT": "3s"}) // 200 ms was too short for a replica's ack on a loaded CI machine
	client := authedClient(10 * time.Second)
	post := func(id string) (int, string) {
		code, raw, err := postRaw(client, svc.base, `{"checkinId":"`+id+`","userId":7,"locationId":3,"starRating":4,"timestamp":1700000000000}`)
		require.NoError(t, err)
		return code, string(raw)
	}
	code, body := post("rep-1")
	require.Equal(t, http.StatusAccepted, code, body)

	require.NoError(t, replica.Signal(syscall.SIGSTOP))
	require.NoError(t, mc.Do(context.Background(), "CLIENT", "KILL", "TYPE", "replica").Err())
	code, body = post("rep-2")
	assert.Equal(t, http.StatusServiceUnavailable, code, body)
	assert.Contains(t, body, `"code":"not_replicated"`)
	assert.Contains(t, body, "INGEST_MIN_REPLICAS")

	require.NoError(t, replica.Signal(syscall.SIGCONT))
	require.Eventually(t, online, 20*time.Second, 50*time.Millisecond, "the replica is back")
	require.Eventually(t, func() bool { code, _ := post("rep-2"); return code == http.StatusAccepted },
		30*time.Second, 200*time.Millisecond, "the retry with the same checkinId is accepted")
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		code, got, err := testGetStats(svc.base, "/users/7")
		if assert.NoError(c, err) && assert.Equal(c, http.StatusOK, code) {
			assert.Equal(c, int64(2), got["numCheckins"], "rep-1 and rep-2, each once")
		}
	}, 30*time.Second, 100*time.Millisecond)
	n, err := mc.XLen(context.Background(), adapters.KeySpace{Prefix: "rep"}.Stream()).Result()
	require.NoError(t, err)
	assert.Equal(t, int64(3), n, "rep-2 is in the stream twice: the unconfirmed write and the retry's")
}
