package batchsub_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/checkins/checkins/adapters/batchsub"
	"github.com/checkins/checkins/adapters/redistest"
)

// ackRaceHook fails the subscriber's fenced XACKs while failAcks is set, fails one XREADGROUP of
// new entries when failRead is set, and holds back the reply of the keep script (the script
// renewRead runs after an own-PEL read) for delayKeep, signalling keepRan when Redis ran it.
type ackRaceHook struct {
	failAcks  atomic.Bool
	failRead  atomic.Bool
	delayKeep atomic.Int64 // nanoseconds
	keepRan   chan struct{}
}

func (h *ackRaceHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *ackRaceHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

func (h *ackRaceHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		name := strings.ToLower(cmd.Name())
		args := cmd.Args()
		if isAckScript(cmd) && h.failAcks.Load() {
			err := errors.New("test: XACK refused by the test")
			cmd.SetErr(err)
			return err
		}
		if name == "xreadgroup" && args[len(args)-1] == ">" && h.failRead.CompareAndSwap(true, false) {
			err := errors.New("test: XREADGROUP cut by the test")
			cmd.SetErr(err)
			return err
		}
		isKeep := (name == "evalsha" || name == "eval") && batchsub.StartsLease(cmd)
		err := next(ctx, cmd)
		if isKeep {
			if d := time.Duration(h.delayKeep.Load()); d > 0 {
				select {
				case h.keepRan <- struct{}{}:
				default:
				}
				time.Sleep(d)
			}
		}
		return err
	}
}

// TestAckedEntryIsNotDeliveredAgainByTheOwnPELRead: after a failed XREADGROUP the reader
// reads this consumer's own PEL again, and renewRead runs the keep script on what it returned,
// then admits it. An entry the handler acked whose XACK was still waiting (XACKs failing during
// the same blip) is in that PEL. If the acker's retry XACKs it and removes it from the in-flight
// set (xacked) after the keep script ran but before admit, admit finds no member and takes it for
// a new one: the entry, acked and XACKed, is delivered again (its lease valid, not pending in
// Redis any more). read's comment promises "Entries already in flight are not delivered twice
// (admit)".
//
// Interleaving: handler acks E; XACK fails (putBack, backoff); XREADGROUP ">" fails; reader reads
// PEL "0" -> E; keep script (renewRead) runs in Redis: E is still mine; acker retries: XACK E
// succeeds, xacked(E) removes it; keep reply arrives; admit(E) -> fresh; E was handed out again
// (found by a review). The members XACKed while such a read is out are no new deliveries now.
func TestAckedEntryIsNotDeliveredAgainByTheOwnPELRead(t *testing.T) {
	srv := redistest.Start(t, redistest.Options{})
	client, _ := newClient(t, srv)
	hook := &ackRaceHook{keepRan: make(chan struct{}, 1)}
	client.AddHook(hook)
	ctx := context.Background()
	const topic = "acked-again"
	_, ids := publish(t, client, topic, "m", 1)

	sub := newSub(t, client, batchsub.Config{
		Consumer:      "a",
		ClaimInterval: time.Hour,
		DrainTimeout:  2 * time.Second,
	})
	msgs, err := sub.Subscribe(ctx, topic)
	require.NoError(t, err)

	first := receive(t, msgs)
	require.Equal(t, ids[0], first.Metadata.Get(batchsub.MetaEntryID))

	hook.failAcks.Store(true)
	first.Ack() // its XACK fails and is retried with backoff
	time.Sleep(150 * time.Millisecond)
	hook.delayKeep.Store(int64(2 * time.Second))
	hook.failRead.Store(true) // the next read fails: the reader goes through its own PEL again

	select {
	case <-hook.keepRan: // renewRead's keep script ran: E was still pending to a
	case <-time.After(waitFor):
		t.Fatal("the own-PEL read's keep script never ran")
	}
	hook.failAcks.Store(false) // the acker's next retry XACKs E while the keep reply is on its way

	notDeliveredAgain(t, client, msgs, topic)
	require.Zero(t, pendingCount(t, client, topic))
}

// ackRaceClaimHook fails the fenced XACKs while failAcks is set and, while delayClaim is set,
// holds back the reply of an XAUTOCLAIM that claimed something, signalling claimed.
type ackRaceClaimHook struct {
	failAcks   atomic.Bool
	delayClaim atomic.Int64
	claimed    chan struct{}
}

func (h *ackRaceClaimHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *ackRaceClaimHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

func (h *ackRaceClaimHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if isAckScript(cmd) && h.failAcks.Load() {
			err := errors.New("test: XACK refused by the test")
			cmd.SetErr(err)
			return err
		}
		err := next(ctx, cmd)
		if c, ok := cmd.(*redis.XAutoClaimWithDeletedCmd); ok && err == nil {
			if d := time.Duration(h.delayClaim.Load()); d > 0 {
				if msgs, _, _ := c.Val(); len(msgs) > 0 {
					select {
					case h.claimed <- struct{}{}:
					default:
					}
					time.Sleep(d)
				}
			}
		}
		return err
	}
}

// TestAckedEntryIsNotDeliveredAgainByItsOwnClaim: the same race through claimRound. An
// entry held longer than HoldMax is no longer kept, so after ClaimMinIdle this consumer's own
// XAUTOCLAIM claims it back (a dup: only its lease moves). Its handler acks it meanwhile (a slow
// handler, or a process that stood still). If the acker's XACK lands and xacked removes it after
// Redis ran the XAUTOCLAIM but before its reply is admitted, admit took it for new: the acked,
// XACKed entry was handed out again (found by a review).
func TestAckedEntryIsNotDeliveredAgainByItsOwnClaim(t *testing.T) {
	srv := redistest.Start(t, redistest.Options{})
	client, _ := newClient(t, srv)
	hook := &ackRaceClaimHook{claimed: make(chan struct{}, 1)}
	client.AddHook(hook)
	ctx := context.Background()
	const topic = "acked-claimed"
	_, ids := publish(t, client, topic, "m", 1)

	sub := newSub(t, client, batchsub.Config{
		Consumer:      "a",
		ClaimMinIdle:  5 * time.Second,
		ClaimInterval: 50 * time.Millisecond,
		HoldMax:       100 * time.Millisecond,
		DrainTimeout:  2 * time.Second,
	})
	msgs, err := sub.Subscribe(ctx, topic)
	require.NoError(t, err)

	first := receive(t, msgs)
	require.Equal(t, ids[0], first.Metadata.Get(batchsub.MetaEntryID))
	// Past HoldMax keep no longer renews it; a's own XAUTOCLAIM takes it back at ClaimMinIdle.
	time.Sleep(4700 * time.Millisecond)

	hook.failAcks.Store(true)
	first.Ack() // the slow handler acks; its XACK fails once or twice and is retried with backoff
	hook.delayClaim.Store(int64(time.Second))
	select {
	case <-hook.claimed: // a's own XAUTOCLAIM claimed E (idle past ClaimMinIdle) in Redis
	case <-time.After(waitFor):
		t.Fatal("no XAUTOCLAIM claimed the entry")
	}
	hook.failAcks.Store(false) // the acker's retry XACKs E while the XAUTOCLAIM reply is on its way

	notDeliveredAgain(t, client, msgs, topic)
}

// isAckScript tells whether cmd runs the subscriber's fenced XACK script.
func isAckScript(cmd redis.Cmder) bool {
	name, args := strings.ToLower(cmd.Name()), cmd.Args()
	return (name == "evalsha" || name == "eval") && len(args) > 1 &&
		(args[1] == batchsub.AckScriptSHA || args[1] == batchsub.AckScript)
}

// notDeliveredAgain fails the test when msgs hands out a message within 4 s: the entry, acked and
// XACKed, was delivered again.
func notDeliveredAgain(t *testing.T, client *redis.Client, msgs <-chan *message.Message, topic string) {
	t.Helper()
	select {
	case m := <-msgs:
		pending := pendingCount(t, client, topic)
		until, _ := batchsub.LeaseUntil(m.Context())
		now, _ := client.Time(context.Background()).Result()
		t.Fatalf("entry %s was delivered again (deliveries %s) after its message was acked and XACKed (pending in the group now: %d; lease left by Redis's clock: %dms)",
			m.Metadata.Get(batchsub.MetaEntryID), m.Metadata.Get(batchsub.MetaDeliveries), pending, until-now.UnixMilli())
	case <-time.After(4 * time.Second):
	}
}
