package ports_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/checkins/checkins/adapters"
	"github.com/checkins/checkins/app/command"
	"github.com/checkins/checkins/app/ops"
	"github.com/checkins/checkins/app/projection"
)

// oomBefore sets maxmemory to 1 byte (Redis answers OOM to every deny-oom command) right before
// the first command named cmd goes out on the client it hooks.
type oomBefore struct {
	admin *redis.Client
	cmd   string
	done  bool
}

func (h *oomBefore) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *oomBefore) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (h *oomBefore) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		a := cmd.Args()
		name := strings.ToLower(fmt.Sprint(a[0]))
		if len(a) > 1 {
			name += " " + strings.ToLower(fmt.Sprint(a[1]))
		}
		if !h.done && name == h.cmd {
			h.done = true
			if err := h.admin.ConfigSet(ctx, "maxmemory", "1").Err(); err != nil {
				return err
			}
		}
		return next(ctx, cmd)
	}
}

// TestRebuildStartCutShortByOOMIsCompleted: Redis runs out of memory between the rebuild's
// BeginBuild (registry: building v2) and the XGROUP CREATE of its group: the rebuild answers 503.
// Memory is freed, the operator runs the rebuild again: it answered "resuming", an empty
// progress, and never created the group nor recorded where the build began (BuildStart). The
// rebuild went on (the projector's join created the group), v2 counted everything, reads
// switched; RETENTION then trimmed the old entries, and a replay of the entry v1 parked (the bug
// since fixed, v2's build counted it) took the stream's start now for where the build began:
// the entry was below it, judged not superseded, and counted into v2 a second time. The second
// start completes the first now. (Found by a review of resource faults.)
func TestRebuildStartCutShortByOOMIsCompleted(t *testing.T) {
	t.Parallel()
	for _, oom := range []bool{false, true} {
		t.Run(fmt.Sprintf("oom=%v", oom), func(t *testing.T) {
			t.Parallel()
			broken := true
			p := newFaulty("faulty", func(_ context.Context, id string, _ int) error {
				if id == "bad" && broken {
					return errors.New("bug in v1")
				}
				return nil
			})
			h := startHarness(t, p, harnessOptions{})
			_, replay := opsAPI(t, h)
			ctx := context.Background()
			h.add("a", 3)
			h.add("bad", 3)
			h.add("c", 3)
			require.Eventually(t, func() bool { return len(h.poison()) == 1 && h.pending() == 0 }, 15*time.Second, 20*time.Millisecond)
			require.Equal(t, int64(2), h.count())
			p.setBehaviour(nil) // the bug is fixed: rebuild
			parked := h.poison()[0].ID

			log := slog.New(slog.DiscardHandler)
			starter := redis.NewClient(h.client.Options())
			t.Cleanup(func() { _ = starter.Close() })
			hook := &oomBefore{admin: h.client, cmd: "xgroup create"}
			if oom {
				starter.AddHook(hook)
			}
			rb, err := command.NewRebuildProjection(command.RebuildProjectionConfig{Backend: adapters.NewOpsBackend(starter, h.keys),
				Projections: []projection.Projection{p}, Logger: log})
			require.NoError(t, err)
			_, err = rb.Start(ctx, "faulty")
			if oom {
				require.True(t, hook.done)
				require.Error(t, err, "OOM at the group's creation")
				t.Logf("first start under OOM: %v", err)
				require.NoError(t, h.client.ConfigSet(ctx, "maxmemory", "0").Err())
				rp, err := rb.Start(ctx, "faulty") // the operator runs it again
				require.NoError(t, err)
				assert.Equal(t, 2, rp.To, "the second start's progress: %+v", rp)
				assert.Equal(t, ops.RebuildBuilding, rp.State)
			} else {
				require.NoError(t, err)
			}
			_, ok, err := adapters.NewProjectionVersions(h.client, h.keys).BuildStart(ctx, "faulty", 2)
			require.NoError(t, err)
			assert.True(t, ok, "where v2's build began is recorded")

			// The projector runs v2 too; its build counts all three.
			_, _, err = h.router.SetTargets(ctx, []ops.ProjectionTarget{{Projection: p, Version: 1}, {Projection: p, Version: 2}})
			require.NoError(t, err)
			countV2 := func() int64 {
				v, err := h.client.HGet(ctx, h.keys.ProjectionKey("faulty", 2, "all", "stats"), "count").Int64()
				if errors.Is(err, redis.Nil) {
					return 0
				}
				require.NoError(t, err)
				return v
			}
			require.Eventually(t, func() bool { return countV2() == 3 }, 15*time.Second, 20*time.Millisecond)
			require.Eventually(t, func() bool {
				rp, err := rb.Step(ctx, "faulty")
				return err == nil && rp.State == ops.RebuildRetiring
			}, 15*time.Second, 50*time.Millisecond, "v2 never switched")

			// A check-in more, counted, then a retention round trims what every group acknowledged.
			h.add("d", 3)
			require.Eventually(t, func() bool { return countV2() == 4 }, 15*time.Second, 20*time.Millisecond)
			tr, err := command.NewTrimStream(adapters.NewStreamAdmin(h.client, h.keys), command.RetentionPolicy{MaxEntries: 1})
			require.NoError(t, err)
			require.Eventually(t, func() bool {
				res, err := tr.TrimOnce(ctx)
				require.NoError(t, err)
				n, err := h.client.XLen(ctx, h.keys.Stream()).Result()
				require.NoError(t, err)
				t.Logf("trim: %+v, stream length %d", res, n)
				return n == 1
			}, 15*time.Second, 200*time.Millisecond)

			res, err := replay.Replay(ctx, parked)
			t.Logf("replay: %+v, %v", res, err)
			assert.Equal(t, int64(4), countV2(), "v2's build counted the parked check-in; the replay must not count it again")
		})
	}
}
