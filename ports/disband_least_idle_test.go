package ports_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/checkins/checkins/app"
	"github.com/checkins/checkins/app/ops"
	"github.com/checkins/checkins/app/projection"
)

// TestDisbandRefusesARunningProjectorAtTheLeastClaimIdle: CLAIM_IDLE may be as low as
// 100ms (config.go), and the disband took it as the idle time that proves no projector runs the
// group (now at least app.MinStoppedIdle). A projector's sign of life on a quiet stream is its checkpoint, every 250ms
// (DefaultCheckpointInterval): with CLAIM_IDLE below that, the check passes between two
// checkpoints while the projector runs, and the disband would go ahead (README: "the command
// refuses, changing nothing, while a projector still runs the group").
func TestDisbandRefusesARunningProjectorAtTheLeastClaimIdle(t *testing.T) {
	t.Parallel()
	h := newDisbandHarness(t)
	ctx := context.Background()
	users := []ops.ProjectionTarget{{Projection: projection.UserStats{}, Version: 1}}
	_, stop := h.start("live", users)
	defer stop()
	h.add(3)
	require.Eventually(t, func() bool { return h.count() == 3 }, 20*time.Second, 20*time.Millisecond)

	// As wired from CLAIM_IDLE=100ms, its least allowed value.
	a := opsApp(t, h.client, h.keys, []projection.Projection{projection.UserStats{}}, app.OpsConfig{ClaimIdle: 100 * time.Millisecond})
	d := a.Commands.DisbandLiveGroup
	passed := 0
	deadline := time.Now().Add(3 * time.Second)
	for time.Now().Before(deadline) {
		if _, err := d.Run(ctx, "live", true); err == nil { // --dry-run: a check only
			passed++
		}
		time.Sleep(15 * time.Millisecond)
	}
	require.Zero(t, passed, "the disband's check passed %d times while a projector was running the live group", passed)
}
