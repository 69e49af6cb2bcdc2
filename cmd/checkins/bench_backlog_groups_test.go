package main

import (
	"context"
	"flag"
	"io"
	"log/slog"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/checkins/checkins/adapters/redistest"
)

// TestSustainedBacklogLeavesOutGroupsNotWaitedFor: with --target, sustained waits only
// for the consumer groups some consumer reads, and names the others "not waited for". The
// backlog it reports "when the load stopped" (entries_behind, "the most any group had
// undelivered + pending", and the group count in the note) must be that of the groups it waits
// for. backlog() read every group on the stream: a stale group (left by an older PROJECTIONS
// list) owed every entry added since it was made, and that became the phase's backlog. (Found by
// a review of the bench.)
func TestSustainedBacklogLeavesOutGroupsNotWaitedFor(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t, redistest.Options{})
	rc := redistest.Client(t, srv.URL())
	ctx := context.Background()
	// A group nobody reads, made before the target starts.
	require.NoError(t, rc.XGroupCreateMkStream(ctx, "target:events", "stale", "$").Err())

	env := envWith(map[string]string{"REDIS_URL": srv.URL(), "KEY_PREFIX": "target", "LOG_LEVEL": "warn", "RATE_LIMIT_IP": "off", "PROJECTIONS": ""})
	cfg, _, err := parseConfig(flag.NewFlagSet("test", flag.ContinueOnError), []string{"--http-addr", "127.0.0.1:0"}, env)
	require.NoError(t, err)
	sctx, cancel := context.WithCancel(ctx)
	svc, err := NewService(sctx, cfg, Mode{API: true, Projections: true}, newLogger(io.Discard, slog.LevelWarn))
	require.NoError(t, err)
	addr, err := svc.Listen()
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() { done <- svc.Run(sctx) }()
	t.Cleanup(func() { cancel(); <-done })

	res := runBenchJSON(t, env, "--phases", "sustained", "--target", "http://"+addr.String(), "--duration", "1s", "--clients", "4")
	require.Len(t, res.Phases, 1)
	p := res.Phases[0]
	require.NotNil(t, p.Backlog)
	t.Logf("sustained: %d answered; backlog groups %+v; entries_behind %d; note: %s", p.Count, p.Backlog.Groups, p.Backlog.EntriesBehind, p.Note)
	assert.Contains(t, p.Note, "not waited for: consumer groups no consumer reads (stale;")

	var waited int64
	for name, g := range p.Backlog.Groups {
		if name != "stale" {
			waited = max(waited, g.Undelivered+g.Pending)
		}
	}
	assert.NotContains(t, p.Backlog.Groups, "stale", "a group the phase does not wait for is no part of its backlog")
	assert.Equal(t, waited, p.Backlog.EntriesBehind,
		"entries_behind is %d: the stale group's lag (the whole load), not the waited-for groups' %d", p.Backlog.EntriesBehind, waited)
}
