package ports_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/checkins/checkins/adapters"
	"github.com/checkins/checkins/adapters/batchsub"
	"github.com/checkins/checkins/adapters/redistest"
	"github.com/checkins/checkins/app/command"
	"github.com/checkins/checkins/app/projection"
	"github.com/checkins/checkins/ports"
)

// lostParkReply makes the first park script call (the XADD+HSET on the poison stream and its
// parked hash) run on the server, then reports a connection reset to the caller: the reply was
// lost on the way back.
type lostParkReply struct {
	parked string
	lost   atomic.Int32
}

func (h *lostParkReply) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *lostParkReply) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (h *lostParkReply) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		name := strings.ToLower(cmd.Name())
		if err == nil && (name == "evalsha" || name == "eval") && h.isPark(cmd) && h.lost.Add(1) == 1 {
			lost := syscall.ECONNRESET
			cmd.SetErr(lost)
			return lost
		}
		return err
	}
}

func (h *lostParkReply) isPark(cmd redis.Cmder) bool {
	for _, a := range cmd.Args() {
		if s, ok := a.(string); ok && s == h.parked {
			return true
		}
	}
	return false
}

// TestParkWithLostReplyThenSuccessCountsOnce: the park script ran (poison entry and record
// written) but its reply was lost, so the batch was nacked. The batched subscriber redelivers it
// in-process with _deliveries "1", so parkedUnits does not ask the poison queue, and the process
// did not mark the unit parked (markParked only runs after a park that answered). The failure was
// intermittent: the redelivery applied the unit under the live group, while the poison entry
// stayed in the queue; the operator's replay counted the check-in a second time. The record was
// never dropped either. Now an entry whose park failed here is asked about in the records when it
// comes back, and the records go by the group's acknowledged position.
func TestParkWithLostReplyThenSuccessCountsOnce(t *testing.T) {
	t.Parallel()
	const retries = 3
	faulty := newFaulty("faulty", func(_ context.Context, id string, attempt int) error {
		if id == "lost-reply" && attempt <= retries {
			return errors.New("intermittent failure in the projection")
		}
		return nil
	})
	var hook *lostParkReply
	h := startHarness(t, faulty, harnessOptions{subscriber: "batched", before: func(h *harness) {
		hook = &lostParkReply{parked: h.keys.PoisonParked()}
		h.client.AddHook(hook)
	}})
	ctx := context.Background()
	h.add("lost-reply", 4)
	require.Eventually(t, func() bool { return hook.lost.Load() >= 1 && h.pending() == 0 }, 15*time.Second, 20*time.Millisecond,
		"the park's reply is lost, the batch comes back and is acknowledged")
	es := h.poison()
	require.Len(t, es, 1, "the park did happen")
	countBefore := h.count()

	rp, err := command.NewReplayPoisoned(command.ReplayPoisonedConfig{Backend: adapters.NewOpsBackend(h.client, h.keys),
		Projections: []projection.Projection{faulty}, Applier: testApplier(t, h.client, h.keys), Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	_, err = rp.Replay(ctx, es[0].ID)
	require.NoError(t, err)

	assert.Equal(t, int64(1), h.count(), "one check-in counted once (live group applied it %d time(s) before the replay)", countBefore)
	assert.Eventually(t, func() bool {
		n, err := h.client.HLen(ctx, h.keys.PoisonParked()).Result()
		return err == nil && n == 0
	}, 5*time.Second, 20*time.Millisecond, "the record of a unit whose entry is acknowledged is dropped")
}

// swallowXAck drops every XACK on the subscriber's connection as if it had been sent: the process
// died right after its acker took the IDs (or the XACK never reached Redis before a kill).
type swallowXAck struct{ n atomic.Int32 }

// isXAck says whether c acknowledges entries: an XACK, or the batched subscriber's fenced ack
// script.
func isXAck(c redis.Cmder) bool {
	if strings.EqualFold(c.Name(), "xack") {
		return true
	}
	args := c.Args()
	return (strings.EqualFold(c.Name(), "evalsha") || strings.EqualFold(c.Name(), "eval")) && len(args) > 1 &&
		(args[1] == batchsub.AckScriptSHA || args[1] == batchsub.AckScript)
}

func (h *swallowXAck) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *swallowXAck) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		kept := cmds[:0:0]
		for _, c := range cmds {
			if isXAck(c) {
				h.n.Add(1)
				continue
			}
			kept = append(kept, c)
		}
		if len(kept) == 0 {
			return nil
		}
		return next(ctx, kept)
	}
}
func (h *swallowXAck) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if isXAck(cmd) {
			h.n.Add(1)
			return nil
		}
		return next(ctx, cmd)
	}
}

// TestParkedRecordStaysUntilTheXAckLands: forgetParked dropped the parked unit's record (HDEL)
// inside the handler, before the router acked the batch and before the batched subscriber's acker
// sent the XACK (asynchronous, batched, retried on failure). A process that died in between left
// the entry pending with no record: the projector that took it over applied the parked unit (the
// failure was intermittent), and the operator's replay counted it again. Now a record goes only
// once a checkpoint reads the entry acknowledged in Redis.
func TestParkedRecordStaysUntilTheXAckLands(t *testing.T) {
	t.Parallel()
	r := &takeoverRun{t: t, ctx: context.Background(), log: slog.New(slog.DiscardHandler), kind: adapters.SubscriberBatched}
	r.env = redistest.Open(t)
	r.keys = adapters.KeySpace{Prefix: r.env.Prefix}
	r.client = redistest.Client(t, r.env.URL)
	faulty := newFaulty("faulty", func(_ context.Context, id string, attempt int) error {
		if id == "ack-lost" && attempt <= takeoverRetries {
			return errors.New("intermittent failure in the projection")
		}
		return nil
	})
	r.projs = []projection.Projection{faulty}
	swallow := &swallowXAck{}
	stopA := r.startWith("a", testApplier(t, r.client, r.keys), time.Hour, func(c *redis.Client) { c.AddHook(swallow) })
	r.h = &harness{t: t, keys: r.keys, client: r.client, proj: faulty}
	r.h.add("ack-lost", 4)
	require.Eventually(t, func() bool { return len(r.h.poison()) == 1 && swallow.n.Load() > 0 },
		15*time.Second, 20*time.Millisecond, "a parks faulty's unit and acks the batch")
	stopA() // it dies before its XACK reached Redis
	records, err := r.client.HLen(r.ctx, r.keys.PoisonParked()).Result()
	require.NoError(t, err)
	require.Equal(t, int64(1), r.h.pendingIn(), "the entry is still pending")

	t.Cleanup(r.start("b", testApplier(t, r.client, r.keys), 300*time.Millisecond))
	require.Eventually(t, func() bool { return r.h.pendingIn() == 0 }, 15*time.Second, 20*time.Millisecond, "b takes the entry over")
	before := r.countOf("faulty")
	r.replay()
	assert.Equal(t, int64(1), r.countOf("faulty"),
		"counted once, by the replay (b applied the parked unit %d time(s); records left while the entry was pending: %d)", before, records)
}

func (h *harness) pendingIn() int64 {
	p, err := h.client.XPending(context.Background(), h.keys.Stream(), ports.LiveGroupName(nil, true)).Result()
	require.NoError(h.t, err)
	return p.Count
}

// TestRecordsOfEntriesResolvedBeforeANackAreDropped: the poison middleware parks the
// failed units of a batch and acks at once (b.resolve) the entries with nothing left to apply,
// then applies the held units of the others. When that met a transient error the batch was
// nacked, so forgetParked never ran for it; the entries acked on their own were never delivered
// again, so no later batch dropped their records either: they stayed in the parked hash for good.
// Now the checkpoint's sweep drops them by the group's acknowledged position.
func TestRecordsOfEntriesResolvedBeforeANackAreDropped(t *testing.T) {
	t.Parallel()
	r := &takeoverRun{t: t, ctx: context.Background(), log: slog.New(slog.DiscardHandler), kind: adapters.SubscriberBatched}
	r.env = redistest.Open(t)
	r.keys = adapters.KeySpace{Prefix: r.env.Prefix}
	r.client = redistest.Client(t, r.env.URL)
	real, err := adapters.NewProjectionApplier(r.client, r.keys, 0)
	require.NoError(t, err)
	applier := &flakyApplier{ProjectionApplier: real}
	faulty := newFaulty("faulty", func(_ context.Context, id string, attempt int) error {
		if id == "e2" && attempt == takeoverRetries {
			applier.fail.Store(takeoverRetries) // the held unit's apply after the park meets a Redis blip
		}
		return errors.New("bad event for faulty")
	})
	other := newFaulty("other", func(_ context.Context, id string, _ int) error {
		if id == "e1" {
			return errors.New("bad event for other")
		}
		return nil
	})
	r.projs = []projection.Projection{faulty, other}
	r.h = &harness{t: t, keys: r.keys, client: r.client, proj: faulty}
	r.h.add("e1", 1) // both units fail: acked on its own right after the park
	r.h.add("e2", 2) // faulty fails; other's unit is held, and applied after the park
	t.Cleanup(r.start("c1", applier, time.Hour))

	require.Eventually(t, func() bool {
		return len(r.h.poison()) == 3 && r.h.pendingIn() == 0 && r.countOf("other") == 1
	}, 15*time.Second, 20*time.Millisecond, "three units parked, e2's other unit applied on the redelivery, nothing pending")
	var left []string
	assert.Eventually(t, func() bool {
		var err error
		left, err = r.client.HKeys(r.ctx, r.keys.PoisonParked()).Result()
		return err == nil && len(left) == 0
	}, 5*time.Second, 20*time.Millisecond, "every parked unit's entry is acknowledged: no record should be left")
	assert.Empty(t, left)
}
