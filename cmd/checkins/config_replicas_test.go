package main

import (
	"flag"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestParseConfigReplicaSettings: the replica settings parse, and a replica timeout that the
// request or the handler attempt would cut short is refused, naming both settings.
func TestParseConfigReplicaSettings(t *testing.T) {
	t.Parallel()
	cfg, err := parseEnv(map[string]string{"PROJECTION_MIN_REPLICAS": "1", "INGEST_MIN_REPLICAS": "2"})
	require.NoError(t, err)
	assert.Equal(t, 1, cfg.ProjectionMinReplicas)
	assert.Equal(t, time.Second, cfg.ProjectionReplicaTimeout, "the default")
	assert.Equal(t, 2, cfg.IngestMinReplicas)
	for _, tc := range []struct {
		env  map[string]string
		want string
	}{
		{map[string]string{"PROJECTION_MIN_REPLICAS": "1", "PROJECTION_REPLICA_TIMEOUT": "10s"},
			"invalid PROJECTION_REPLICA_TIMEOUT: 10s must be below HANDLER_TIMEOUT 10s"},
		{map[string]string{"PROJECTION_MIN_REPLICAS": "-1"}, "invalid PROJECTION_MIN_REPLICAS"},
		{map[string]string{"PROJECTION_MIN_REPLICAS": "one"}, "invalid PROJECTION_MIN_REPLICAS"},
		{map[string]string{"INGEST_MIN_REPLICAS": "1", "INGEST_REPLICA_TIMEOUT": "5s"},
			"invalid INGEST_REPLICA_TIMEOUT: 5s must be below REQUEST_TIMEOUT 5s"},
	} {
		_, err := parseEnv(tc.env)
		require.Error(t, err, "%v", tc.env)
		assert.Contains(t, err.Error(), tc.want, "%v", tc.env)
	}
	// Without PROJECTION_MIN_REPLICAS the timeout is not used, so it is not held against HANDLER_TIMEOUT.
	_, err = parseEnv(map[string]string{"PROJECTION_REPLICA_TIMEOUT": "1m"})
	assert.NoError(t, err)
}

// TestParseConfigDedupeWindow: the window defaults to IDEMPOTENCY_TTL's default, follows a
// longer IDEMPOTENCY_TTL when it is not set, and set explicitly below IDEMPOTENCY_TTL it is
// refused, naming both.
func TestParseConfigDedupeWindow(t *testing.T) {
	t.Parallel()
	cfg, err := parseEnv(nil)
	require.NoError(t, err)
	assert.Equal(t, 24*time.Hour, cfg.DedupeWindow)
	assert.Equal(t, cfg.IdempotencyTTL, cfg.DedupeWindow, "the defaults are one window")
	cfg, err = parseEnv(map[string]string{"IDEMPOTENCY_TTL": "72h"})
	require.NoError(t, err)
	assert.Equal(t, 72*time.Hour, cfg.DedupeWindow, "unset, it follows a longer IDEMPOTENCY_TTL")
	cfg, err = parseEnv(map[string]string{"IDEMPOTENCY_TTL": "1s", "REQUEST_TIMEOUT": "900ms"})
	require.NoError(t, err)
	assert.Equal(t, 24*time.Hour, cfg.DedupeWindow, "a shorter IDEMPOTENCY_TTL leaves the default")
	cfg, err = parseEnv(map[string]string{"DEDUPE_WINDOW": "96h"})
	require.NoError(t, err)
	assert.Equal(t, 96*time.Hour, cfg.DedupeWindow)
	_, err = parseEnv(map[string]string{"IDEMPOTENCY_TTL": "72h", "DEDUPE_WINDOW": "48h"})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "invalid DEDUPE_WINDOW: 48h0m0s is below IDEMPOTENCY_TTL 72h0m0s")
	// A reservation that could expire while its request still records lets a retry record the
	// check-in twice.
	_, err = parseEnv(map[string]string{"IDEMPOTENCY_TTL": "5s"})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "invalid IDEMPOTENCY_TTL: 5s must be above REQUEST_TIMEOUT 5s")
}

// TestParseConfigRefusesWhatStarvesTheService: dashboard streams that could take every
// connection of the ops listener (its health checks went unanswered), and a drain too short to
// drain anything (0s: none for HTTP, Watermill's 30s default for the projections) are refused,
// naming the setting.
func TestParseConfigRefusesWhatStarvesTheService(t *testing.T) {
	t.Parallel()
	for env, want := range map[[2]string]string{
		{"UI_MAX_STREAMS", "49"}:     "invalid UI_MAX_STREAMS: 49 leaves too few of the ops listener's 64 connections",
		{"UI_MAX_STREAMS", "100000"}: "at most 48",
		{"DRAIN_TIMEOUT", "0s"}:      "invalid DRAIN_TIMEOUT",
		{"DRAIN_TIMEOUT", "500ms"}:   "invalid DRAIN_TIMEOUT",
	} {
		_, err := parseEnv(map[string]string{env[0]: env[1]})
		require.Error(t, err, "%v", env)
		assert.Contains(t, err.Error(), want, "%v", env)
	}
	for env := range map[[2]string]bool{{"UI_MAX_STREAMS", "48"}: true, {"DRAIN_TIMEOUT", "1s"}: true} {
		_, err := parseEnv(map[string]string{env[0]: env[1]})
		assert.NoError(t, err, "%v", env)
	}
}

// TestParseConfigFlagWinsOverABadVariable: a flag overrides its variable, and the variable's
// value is then not read at all: BATCH_SIZE=abc with --batch-size 10 refused to start.
func TestParseConfigFlagWinsOverABadVariable(t *testing.T) {
	t.Parallel()
	env := map[string]string{"BATCH_SIZE": "abc", "READ_LINGER": "2ms"}
	cfg, _, err := parseConfig(flag.NewFlagSet("t", flag.ContinueOnError), []string{"--batch-size", "10"}, func(k string) string { return env[k] })
	require.NoError(t, err)
	assert.Equal(t, 10, cfg.BatchSize)
	assert.Equal(t, 2*time.Millisecond, cfg.ReadLinger, "a variable without a flag still counts")
	_, err = parseEnv(env)
	assert.ErrorContains(t, err, "invalid BATCH_SIZE", "without the flag the bad value is refused")
}
