package bench

import (
	"context"
	"io"
	"log/slog"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/checkins/checkins/adapters/redistest"
)

// TestUsedMemoryLeavesOutTheScriptCache: the memory phase's readings on a private server leave
// out Redis's script cache. Scripts stay once a phase has loaded them, so the memory phase alone
// charged the projector's (about 15 KiB) to N and not to 2N, and its figures depended on the
// phases run before (with --memory-events 1000: growth +29.8% alone, +39.8% after a drain).
func TestUsedMemoryLeavesOutTheScriptCache(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t, redistest.Options{})
	ctx := context.Background()
	h := testHost()
	cfg := Config{RedisURL: srv.URL(), LogLevel: slog.LevelWarn}
	b, err := newBencher(ctx, h, cfg, benchOptions{Projections: ProjectionNames(h.Projections(cfg)), AllProjections: true},
		h.NewLogger(io.Discard, slog.LevelWarn), io.Discard)
	require.NoError(t, err)
	t.Cleanup(b.close)
	b.redis.private = true // as when the bench runs its own server
	client := redistest.Client(t, srv.URL())

	before, err := b.usedMemory(ctx)
	require.NoError(t, err)
	// A script of 256 KiB in the cache.
	big := "return '" + strings.Repeat("x", 256<<10) + "'"
	require.NoError(t, client.ScriptLoad(ctx, big).Err())
	after, err := b.usedMemory(ctx)
	require.NoError(t, err)
	assert.Less(t, after-before, int64(64<<10), "the script cache grew by 256 KiB; used memory by %d B", after-before)
}
