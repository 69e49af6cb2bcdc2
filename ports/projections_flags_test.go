package ports_test

import (
	"bytes"
	"context"
	"flag"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/checkins/checkins/adapters"
	"github.com/checkins/checkins/adapters/redistest"
	"github.com/checkins/checkins/app"
	"github.com/checkins/checkins/app/projection"
	"github.com/checkins/checkins/ports"
)

// TestProjectionsVerbsRefuseFlagsTheyDoNotTake: `checkins projections` declares --dry-run for every verb
// (it is meant for disband and drop). An operator who types
// `checkins projections rebuild users --dry-run` expecting a check gets a real rebuild: a new
// version's group at the start of the stream, backfilled by every running projector, and reads
// switched to it. The flag must be refused for rebuild (as poison replay/purge refuse flags they
// do not honour), and nothing must start.
func TestProjectionsVerbsRefuseFlagsTheyDoNotTake(t *testing.T) {
	t.Parallel()
	env := redistest.Open(t)
	client := redistest.Client(t, env.URL)
	keys := adapters.KeySpace{Prefix: env.Prefix}
	ctx := context.Background()
	require.NoError(t, client.XAdd(ctx, &redis.XAddArgs{Stream: keys.Stream(), Values: []any{"k", "v"}}).Err())
	a := opsApp(t, client, keys, []projection.Projection{projection.UserStats{}}, app.OpsConfig{})
	connect := func(_ string, fs *flag.FlagSet, args []string) (*ports.CLISession, error) {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		return &ports.CLISession{App: a, Args: fs.Args(), Poll: 50 * time.Millisecond, Close: func() {}}, nil
	}
	rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	var stdout, stderr bytes.Buffer
	err := ports.ProjectionsCommand(rctx, []string{"rebuild", "users", "--dry-run"}, &stdout, &stderr, connect)

	building, herr := client.HGet(ctx, keys.Projections(), "users.building").Result()
	if herr == redis.Nil {
		building = ""
	} else {
		require.NoError(t, herr)
	}
	require.Empty(t, building, "`projections rebuild users --dry-run` started a real rebuild (users.building=%s); output: %s", building, stdout.String())
	require.Error(t, err, "--dry-run is not a flag of rebuild: it must be refused")
	require.Contains(t, err.Error(), "projections rebuild does not take --dry-run")

	for _, args := range [][]string{{"disband", "live", "--no-wait"}, {"list", "--dry-run"}, {"drop", "users.v1", "--no-wait"}} {
		err := ports.ProjectionsCommand(rctx, args, &stdout, &stderr, connect)
		require.Error(t, err, "%v", args)
		require.Contains(t, err.Error(), "does not take --", "%v", args)
	}
}
