package main

import (
	"context"
	"flag"
	"io"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/checkins/checkins/adapters"
	"github.com/checkins/checkins/adapters/redistest"
)

// TestProjectorStartsDuringAMigrationWithAnUpgradeDue: a projector (mode project) of a
// release whose leaderboards layout is newer than the serving version's starts while a partition
// migration runs (its quiesce flag set). Joins wait for the migration (JoinWaits), but
// initialTargets' UpgradeLayouts calls Start, which refuses with domain.ErrMigrating, not a
// transient error: NewService failed and the process exited (found by a review). The upgrade
// now waits for a poll after the migration, and the process starts.
func TestProjectorStartsDuringAMigrationWithAnUpgradeDue(t *testing.T) {
	t.Parallel()
	rdb := redistest.Open(t)
	client := redistest.Client(t, rdb.URL)
	ctx := context.Background()
	keys := adapters.KeySpace{Prefix: rdb.Prefix}
	require.NoError(t, client.HSet(ctx, keys.Projections(), "leaderboards.layout", "1").Err())
	require.NoError(t, client.HSet(ctx, keys.Meta(), "quiesce", "1 to 2 partitions").Err())

	env := map[string]string{"REDIS_URL": rdb.URL, "KEY_PREFIX": rdb.Prefix, "HTTP_ADDR": "127.0.0.1:0", "OPS_ADDR": "127.0.0.1:0",
		"STATE_DIR": t.TempDir(), "LOG_LEVEL": "warn"}
	withTestAuth(env)
	cfg, _, err := parseConfig(flag.NewFlagSet("test", flag.ContinueOnError), nil, func(k string) string { return env[k] })
	require.NoError(t, err)
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	svc, err := NewService(sctx, cfg, Mode{Projections: true}, newLogger(io.Discard, cfg.LogLevel))
	if svc != nil {
		defer svc.close()
	}
	assert.NoError(t, err, "a projector started during a migration waits for it, as its joins do")
}
