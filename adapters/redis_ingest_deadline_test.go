package adapters_test

// Ingest under deadlines: what a request that ran out of time leaves to the next ones.

import (
	"context"
	"io"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/checkins/checkins/adapters"
	"github.com/checkins/checkins/adapters/redistest"
	"github.com/checkins/checkins/app/command"
	"github.com/checkins/checkins/domain"
)

// slowAfterSetHook delays, once armed, the return of the first pipeline holding a SET (the
// reservation): Redis ran it, and its caller gets its answer late, as under load.
type slowAfterSetHook struct {
	armed atomic.Bool
	delay time.Duration
}

func (h *slowAfterSetHook) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (h *slowAfterSetHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (h *slowAfterSetHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		for _, c := range cmds {
			if strings.EqualFold(c.Name(), "set") && h.armed.CompareAndSwap(true, false) {
				time.Sleep(h.delay)
				break
			}
		}
		return err
	}
}

// TestUnsentXAddReleasesItsReservation: on the two-step path (a cluster with one stream, or
// INGEST_MIN_REPLICAS), a request reserves its checkinId and then hands its XADD to the
// auto-pipeline with less than minHeadroom (100ms) of its deadline left. The pipeline does not
// send it; that is reported as not published, so the handler releases the reservation. It kept
// it: the checkinId was held by a request that certainly wrote nothing, and every retry within
// the takeover age (max(5s, REQUEST_TIMEOUT+1s)) waited its whole deadline and got 503.
func TestUnsentXAddReleasesItsReservation(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t, redistest.Options{})
	check := redistest.Client(t, srv.URL())
	keys := adapters.KeySpace{Prefix: "rev"}
	newClient := func() *redis.Client {
		c, err := adapters.NewRedisClient(adapters.ClientOptions{URL: srv.URL()})
		require.NoError(t, err)
		t.Cleanup(func() { _ = c.Close() })
		return c
	}
	slow := &slowAfterSetHook{delay: 250 * time.Millisecond}
	pipeClient := newClient()
	pipeClient.AddHook(slow)
	pipe := adapters.NewAutoPipeline(pipeClient, 64, 2)
	t.Cleanup(func() { _ = pipe.Close() })
	pub, err := adapters.NewPipelinedEventPublisher(newClient(), pipe, keys, watermill.NopLogger{})
	require.NoError(t, err)
	idem := adapters.NewIdempotencyStore(newClient(), keys, time.Hour).WithAutoPipeline(pipe)
	h, err := command.NewRecordCheckinHandler(pub, idem, time.Now, uuid.NewString, slog.New(slog.NewTextHandler(io.Discard, nil)))
	require.NoError(t, err)
	h.WithTakeoverAge(5 * time.Second) // serve's: max(5s, REQUEST_TIMEOUT + 1s)
	t.Cleanup(func() { _ = h.Close() })

	// Warm up (the store's first look at the keyspace), so the next SET is the reservation.
	_, err = h.Handle(context.Background(), command.RecordCheckin{Input: input(ptr("warm"), 1, 1, 1, nil)})
	require.NoError(t, err)

	cmd := command.RecordCheckin{Input: input(ptr("late-1"), 7, 3, 4, ptr(int64(1_700_000_000_000)))}
	slow.armed.Store(true)
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	_, err = h.Handle(ctx, cmd)
	cancel()
	require.ErrorIs(t, err, domain.ErrUnavailable)
	n, err := check.XLen(context.Background(), keys.Stream()).Result()
	require.NoError(t, err)
	require.Equal(t, int64(1), n, "the XADD was never sent: only the warm-up's entry")

	exists, err := check.Exists(context.Background(), keys.Idempotency(7, "late-1")).Result()
	require.NoError(t, err)
	assert.Zero(t, exists, "nothing was written: the reservation should have been released")

	// The client retries at once, with a whole request timeout of its own.
	rctx, rcancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer rcancel()
	start := time.Now()
	res, err := h.Handle(rctx, cmd)
	assert.NoError(t, err, "a retry after a request that wrote nothing must be recorded (waited %s)", time.Since(start).Round(time.Millisecond))
	assert.Equal(t, "late-1", res.Checkin.ID)
}

// TestOneStepFailureMakesUpNoRateDecision: when the one-step script's outcome is an error (here
// its XADD is refused), the handler handed back the ReservingPublisher's placeholder decision
// {Remaining: -1, ResetAfter: -1} as if it were the limiter's answer, and the HTTP port wrote
// `RateLimit: "user";r=0;t=0` on the 503: "no quota left, and it is back now", neither of which
// the limiter said. Like the two-step path when the limiter's call fails, it gives none.
func TestOneStepFailureMakesUpNoRateDecision(t *testing.T) {
	t.Parallel()
	e := newIngestEnv(t, "revrate")
	ctx := context.Background()
	policy, err := command.ParseRateLimit("10/s,burst=20")
	require.NoError(t, err)
	l, err := adapters.NewRedisRateLimiter(e.check, e.pipe, e.keys, policy)
	require.NoError(t, err)
	l = l.WithReservations(e.idem)
	rp, err := adapters.NewReservingPublisher(e.pub, e.pipe, e.idem, l)
	require.NoError(t, err)
	h, err := command.NewRecordCheckinHandler(e.pub, e.idem, time.Now, uuid.NewString, slog.New(slog.NewTextHandler(io.Discard, nil)))
	require.NoError(t, err)
	h.WithUserLimit(l).WithReservingPublisher(rp)
	t.Cleanup(func() { _ = h.Close() })

	ok := command.RecordCheckin{Input: input(ptr("warm"), 7, 1, 1, nil), LimitUser: 7}
	res, err := h.Handle(ctx, ok)
	require.NoError(t, err)
	require.NotNil(t, res.Rate)
	require.Equal(t, 19, res.Rate.Remaining)

	require.NoError(t, e.check.Del(ctx, e.keys.Stream()).Err())
	require.NoError(t, e.check.Set(ctx, e.keys.Stream(), "not a stream", 0).Err())
	res, err = h.Handle(ctx, command.RecordCheckin{Input: input(ptr("c-1"), 7, 1, 1, nil), LimitUser: 7})
	require.ErrorIs(t, err, domain.ErrUnavailable)
	if res.Rate != nil {
		assert.GreaterOrEqual(t, res.Rate.Remaining, 0, "a decision the limiter never made: %+v", *res.Rate)
		assert.GreaterOrEqual(t, res.Rate.ResetAfter, time.Duration(0), "a decision the limiter never made: %+v", *res.Rate)
	}
}

// blockingEchoHook holds a pipeline holding `ECHO block` for delay: the auto-pipeline's worker is
// busy, as behind a slow pipeline under load.
type blockingEchoHook struct {
	delay   time.Duration
	started chan struct{} // closed as the first such pipeline starts waiting
	once    sync.Once
}

func (h *blockingEchoHook) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (h *blockingEchoHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (h *blockingEchoHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, c := range cmds {
			if a := c.Args(); len(a) == 2 && a[0] == "ECHO" && a[1] == "block" {
				h.once.Do(func() { close(h.started) })
				time.Sleep(h.delay)
			}
		}
		return next(ctx, cmds)
	}
}

// TestLeaderOutOfHeadroomLetsItsWaitersTry: concurrent identical requests in one process share
// the first one's outcome, except when the first gave up because of its own deadline. That test
// was ctx.Err() != nil after the leader returned; but the auto-pipeline refuses a call with less
// than 100ms of its deadline left while that context is still alive, so the waiter, with seconds
// left, was answered 503 with the leader's failure instead of recording the check-in.
func TestLeaderOutOfHeadroomLetsItsWaitersTry(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t, redistest.Options{})
	check := redistest.Client(t, srv.URL())
	keys := adapters.KeySpace{Prefix: "revflight"}
	newClient := func() *redis.Client {
		c, err := adapters.NewRedisClient(adapters.ClientOptions{URL: srv.URL()})
		require.NoError(t, err)
		t.Cleanup(func() { _ = c.Close() })
		return c
	}
	pipeClient := newClient()
	block := &blockingEchoHook{delay: time.Second, started: make(chan struct{})}
	pipeClient.AddHook(block)
	pipe := adapters.NewAutoPipeline(pipeClient, 64, 1)
	t.Cleanup(func() { _ = pipe.Close() })
	pub, err := adapters.NewPipelinedEventPublisher(newClient(), pipe, keys, watermill.NopLogger{})
	require.NoError(t, err)
	idem := adapters.NewIdempotencyStore(newClient(), keys, time.Hour).WithAutoPipeline(pipe)
	rp, err := adapters.NewReservingPublisher(pub, pipe, idem, nil)
	require.NoError(t, err)
	h, err := command.NewRecordCheckinHandler(pub, idem, time.Now, uuid.NewString, slog.New(slog.NewTextHandler(io.Discard, nil)))
	require.NoError(t, err)
	h.WithReservingPublisher(rp)
	t.Cleanup(func() { _ = h.Close() })
	_, err = h.Handle(context.Background(), command.RecordCheckin{Input: input(ptr("warm"), 1, 1, 1, nil)})
	require.NoError(t, err)

	cmd := command.RecordCheckin{Input: input(ptr("shared-1"), 7, 3, 4, ptr(int64(1_700_000_000_000)))}
	go func() { _, _ = pipe.Do(context.Background(), "ECHO", "block") }() // the worker is busy 1s
	<-block.started
	leaderCtx, cancelLeader := context.WithTimeout(context.Background(), 1050*time.Millisecond)
	defer cancelLeader()
	leaderDone := make(chan error, 1)
	go func() { _, err := h.Handle(leaderCtx, cmd); leaderDone <- err }()
	time.Sleep(300 * time.Millisecond) // the leader's script call waits in the queue
	waiterCtx, cancelWaiter := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancelWaiter()
	res, werr := h.Handle(waiterCtx, cmd)
	lerr := <-leaderDone
	require.ErrorIs(t, lerr, domain.ErrUnavailable, "the leader ran out of headroom")
	assert.NoError(t, werr, "the waiter had seconds left: it must not get the leader's deadline failure")
	assert.Equal(t, "shared-1", res.Checkin.ID)
	n, err := check.XLen(context.Background(), keys.Stream()).Result()
	require.NoError(t, err)
	assert.Equal(t, int64(2), n, "the warm-up and the shared check-in")
}
