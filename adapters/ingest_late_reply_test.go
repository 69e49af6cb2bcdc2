package adapters_test

// The auto-pipeline's commands run once when their reply is late. Redis stalls (a slow script, a
// fork, an fsync) for longer than the pipeline client's read timeout (the service's: 3s +
// INGEST_REPLICA_TIMEOUT, below REQUEST_TIMEOUT's 5s). go-redis timed out the read and sent the
// whole pipeline again on a new connection, and once Redis was back both copies ran (found by a
// review); now such a command fails as an unknown outcome (503), which the idempotency records
// settle when the client retries. Here the read timeout is 400ms and the stall 700ms to keep the
// tests short; the mechanism is the service's.

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"strconv"
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

// busyLua keeps Redis busy for ARGV[1] microseconds (a slow script, as another client may
// run; no write, under busy-reply-threshold).
const busyLua = `
local t = redis.call('TIME')
local start = tonumber(t[1]) * 1000000 + tonumber(t[2])
while true do
  local n = redis.call('TIME')
  if tonumber(n[1]) * 1000000 + tonumber(n[2]) - start >= tonumber(ARGV[1]) then break end
end
return 1
`

// stallRedis makes Redis busy for d from another connection, and returns once it is.
func stallRedis(t *testing.T, url string, d time.Duration) {
	t.Helper()
	c := redistest.Client(t, url)
	require.NoError(t, c.Ping(context.Background()).Err())
	go func() { _ = c.Eval(context.Background(), busyLua, nil, d.Microseconds()).Err() }()
	time.Sleep(60 * time.Millisecond)
}

type lateReplyEnv struct {
	url   string
	check *redis.Client
	keys  adapters.KeySpace
	pipe  *adapters.AutoPipeline
	pub   *adapters.EventPublisher
	idem  *adapters.IdempotencyStore
}

// serviceClient is a client as the service makes them (NewRedisClient: MaxRetries 1), with read
// timeout rt (0: its default), closed at the test's end.
func serviceClient(t *testing.T, url string, rt time.Duration) *redis.Client {
	t.Helper()
	c, err := adapters.NewRedisClient(adapters.ClientOptions{URL: url, ReadTimeout: rt})
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// abandonedReservation warms h up, then reserves checkinID as a request of a minute ago that left
// the timestamp to the server and died before publishing; the takeover script is in Redis's
// cache (as after any earlier takeover). It returns that request, to be retried, and its record.
func abandonedReservation(t *testing.T, h *command.RecordCheckinHandler, idem *adapters.IdempotencyStore, checkinID string) (command.RecordCheckin, command.IdempotencyRecord) {
	t.Helper()
	ctx := context.Background()
	_, err := h.Handle(ctx, command.RecordCheckin{Input: input(ptr("warm"), 99, 1, 1, nil)})
	require.NoError(t, err)
	in := input(ptr(checkinID), 5, 6, 2, nil)
	t0 := time.Now().Add(-time.Minute).UnixMilli()
	dead := command.IdempotencyRecord{Fingerprint: in.Fingerprint(), RecordedAt: t0, Owner: "dead", ReservedAt: t0,
		Checkin: domain.Checkin{ID: checkinID, UserID: 5, LocationID: 6, StarRating: 2, Timestamp: t0}}
	got, err := idem.Reserve(ctx, dead)
	require.NoError(t, err)
	require.Nil(t, got)
	_, _, err = idem.TakeOver(ctx, ingestRecord(98, "none", 1), ingestRecord(98, "none", 1))
	require.NoError(t, err)
	return command.RecordCheckin{Input: in}, dead
}

// publishedTimestamps are the timestamps of checkinID's entries on keys' stream.
func publishedTimestamps(t *testing.T, check *redis.Client, keys adapters.KeySpace, checkinID string) []any {
	t.Helper()
	xs, err := check.XRange(context.Background(), keys.Stream(), "-", "+").Result()
	require.NoError(t, err)
	var ts []any
	for _, x := range xs {
		if x.Values[domain.FieldCheckinID] == checkinID {
			ts = append(ts, x.Values[domain.FieldTimestamp])
		}
	}
	return ts
}

// newLateReplyEnv wires the API's ingest as cmd/checkins does, with a pipeline client whose read
// timeout is readTimeout (MaxRetries 1, as NewRedisClient sets it).
func newLateReplyEnv(t *testing.T, readTimeout time.Duration) lateReplyEnv {
	t.Helper()
	srv := redistest.Start(t, redistest.Options{})
	newClient := func(rt time.Duration) *redis.Client { return serviceClient(t, srv.URL(), rt) }
	e := lateReplyEnv{url: srv.URL(), check: redistest.Client(t, srv.URL()), keys: adapters.KeySpace{Prefix: "r10"}}
	e.pipe = adapters.NewAutoPipeline(newClient(readTimeout), 256, 1)
	t.Cleanup(func() { _ = e.pipe.Close() })
	var err error
	e.pub, err = adapters.NewPipelinedEventPublisher(newClient(0), e.pipe, e.keys, watermill.NopLogger{})
	require.NoError(t, err)
	e.idem = adapters.NewIdempotencyStore(newClient(0), e.keys, time.Hour).WithAutoPipeline(e.pipe)
	return e
}

func (e lateReplyEnv) entriesOf(t *testing.T, id string) int {
	t.Helper()
	xs, err := e.check.XRange(context.Background(), e.keys.Stream(), "-", "+").Result()
	require.NoError(t, err)
	n := 0
	for _, x := range xs {
		if x.Values[domain.FieldCheckinID] == id {
			n++
		}
	}
	return n
}

func lateReplyHandler(t *testing.T, p command.EventPublisher, idem *adapters.IdempotencyStore) *command.RecordCheckinHandler {
	t.Helper()
	h, err := command.NewRecordCheckinHandler(p, idem, time.Now, uuid.NewString, slog.New(slog.NewTextHandler(io.Discard, nil)))
	require.NoError(t, err)
	t.Cleanup(func() { _ = h.Close() })
	return h
}

// TestIngestScriptRunsOnceWhenItsReplyIsLate: single Redis, the one-step path (limit,
// reservation and XADD in one script). The user has one request of quota left. Redis stalls past
// the pipeline's read timeout while the script call is in flight. The script ran twice before:
// the first run counted, reserved and wrote the check-in, the second counted again and answered
// 429 (a 429 says nothing was written), or without a limit "replayed" for the only request. Now
// the request fails as an unknown outcome (ErrUnavailable, 503) with its check-in written once,
// and the client's retry is answered as a retry.
func TestIngestScriptRunsOnceWhenItsReplyIsLate(t *testing.T) {
	t.Parallel()
	e := newLateReplyEnv(t, 400*time.Millisecond)
	policy, err := command.ParseRateLimit("1/m,burst=1")
	require.NoError(t, err)
	l, err := adapters.NewRedisRateLimiter(e.check, e.pipe, e.keys, policy)
	require.NoError(t, err)
	l = l.WithReservations(e.idem)
	rp, err := adapters.NewReservingPublisher(e.pub, e.pipe, e.idem, l)
	require.NoError(t, err)
	h := lateReplyHandler(t, e.pub, e.idem).WithUserLimit(l).WithReservingPublisher(rp)
	_, err = h.Handle(context.Background(), command.RecordCheckin{Input: input(ptr("warm"), 99, 1, 1, nil), LimitUser: 99})
	require.NoError(t, err)

	stallRedis(t, e.url, 700*time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second) // REQUEST_TIMEOUT
	defer cancel()
	ts := time.Now().Add(-time.Minute).UnixMilli()
	cmd := command.RecordCheckin{Input: input(ptr("ck-1"), 7, 3, 4, &ts), LimitUser: 7}
	_, err = h.Handle(ctx, cmd)
	var limited *command.RateLimitedError
	require.False(t, errors.As(err, &limited), "a 429 for a check-in that was recorded: %v", err)
	require.ErrorIs(t, err, domain.ErrUnavailable, "an unknown outcome")
	time.Sleep(time.Second) // the stall ends
	assert.Equal(t, 1, e.entriesOf(t, "ck-1"), "the check-in is on the stream once")

	// The limit counts every request, a retry too (README): the retry asks without it.
	cmd.LimitUser = 0
	res, err := h.Handle(ctx, cmd)
	require.NoError(t, err)
	assert.True(t, res.Replayed, "the client's retry is answered as a retry")
	assert.Equal(t, 1, e.entriesOf(t, "ck-1"))
}

// stallingPublisher stalls Redis (once armed) just before the XADD is handed over.
type stallingPublisher struct {
	inner command.EventPublisher
	armed atomic.Bool
	stall func()
}

func (p *stallingPublisher) PublishCheckinRecorded(ctx context.Context, ev domain.CheckinRecorded, corr string) error {
	if p.armed.CompareAndSwap(true, false) {
		p.stall()
	}
	return p.inner.PublishCheckinRecorded(ctx, ev, corr)
}

// TestIngestXAddRunsOnceWhenItsReplyIsLate: the two-step path (a cluster with one stream,
// INGEST_MIN_REPLICAS, or while legacy records may exist): reserve, then a plain XADD through the
// auto-pipeline. Redis stalls past the read timeout with the XADD in flight. go-redis sent the
// pipeline again and both XADDs ran: one request, answered 202 once, and its check-in twice on
// the stream. Now the request fails as an unknown outcome and the XADD runs once.
func TestIngestXAddRunsOnceWhenItsReplyIsLate(t *testing.T) {
	t.Parallel()
	e := newLateReplyEnv(t, 400*time.Millisecond)
	sp := &stallingPublisher{inner: e.pub, stall: func() { stallRedis(t, e.url, 700*time.Millisecond) }}
	h := lateReplyHandler(t, sp, e.idem)
	_, err := h.Handle(context.Background(), command.RecordCheckin{Input: input(ptr("warm"), 99, 1, 1, nil)})
	require.NoError(t, err)

	sp.armed.Store(true)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	ts := time.Now().Add(-time.Minute).UnixMilli()
	_, err = h.Handle(ctx, command.RecordCheckin{Input: input(ptr("ck-2"), 7, 3, 4, &ts)})
	require.ErrorIs(t, err, domain.ErrUnavailable, "an unknown outcome")
	time.Sleep(time.Second) // the stall ends
	assert.Equal(t, 1, e.entriesOf(t, "ck-2"), "one request, one XADD")
}

// stallOnEvalHook stalls Redis (once armed) just before the first pipeline holding an
// EVALSHA is sent.
type stallOnEvalHook struct {
	armed atomic.Bool
	stall func()
}

func (h *stallOnEvalHook) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (h *stallOnEvalHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (h *stallOnEvalHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, c := range cmds {
			if c.Name() == "evalsha" && h.armed.CompareAndSwap(true, false) {
				h.stall()
				break
			}
		}
		return next(ctx, cmds)
	}
}

// TestTakeOverRunsOnceWhenItsReplyIsLate: two-step path. A request whose body leaves the
// timestamp to the server reserved ck-5 and died before publishing. Its client retries with the
// same body after the takeover age, and Redis stalls past the read timeout with the retry's
// TakeOver in flight. The script ran twice before: the first run took the reservation, the second
// found it held by the retry's own owner, which settle read as "this attempt's own reservation"
// and published the retry's check-in (its own server-set timestamp and recordedAt), not the
// original one, as new: had the original's XADD landed after all, two identities, counted twice
// by every projection. Now the retry fails as an unknown outcome, and the next one (the
// reservation taken by the first retry, then the takeover age) publishes the original check-in,
// once, and answers as a retry.
func TestTakeOverRunsOnceWhenItsReplyIsLate(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t, redistest.Options{})
	keys := adapters.KeySpace{Prefix: "r10t"}
	check := redistest.Client(t, srv.URL())
	newClient := func(rt time.Duration) *redis.Client { return serviceClient(t, srv.URL(), rt) }
	hook := &stallOnEvalHook{stall: func() { stallRedis(t, srv.URL(), 700*time.Millisecond) }}
	pipeClient := newClient(400 * time.Millisecond)
	pipeClient.AddHook(hook)
	pipe := adapters.NewAutoPipeline(pipeClient, 256, 1)
	t.Cleanup(func() { _ = pipe.Close() })
	pub, err := adapters.NewPipelinedEventPublisher(newClient(0), pipe, keys, watermill.NopLogger{})
	require.NoError(t, err)
	idem := adapters.NewIdempotencyStore(newClient(0), keys, time.Hour).WithAutoPipeline(pipe)
	h := lateReplyHandler(t, pub, idem).WithTakeoverAge(time.Second)
	retry, dead := abandonedReservation(t, h, idem, "ck-5")
	t0 := dead.RecordedAt
	hook.armed.Store(true) // the next script call (the retry's TakeOver) meets a stall
	rctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err = h.Handle(rctx, retry)
	require.ErrorIs(t, err, domain.ErrUnavailable, "an unknown outcome")
	time.Sleep(1500 * time.Millisecond) // the stall ends; the retry's reservation ages past the takeover age
	res, err := h.Handle(rctx, retry)
	require.NoError(t, err)
	ts := publishedTimestamps(t, check, keys, "ck-5")
	assert.Equal(t, []any{strconv.FormatInt(t0, 10)}, ts, "the original check-in (timestamp %d) is what the takeover publishes", t0)
	assert.Equal(t, dead.Checkin, res.Checkin, "a retry answers with the original check-in")
	assert.True(t, res.Replayed, "a retry answers as a retry")
}

// stallOnEvalProcessHook stalls Redis (once armed) just before the first EVALSHA sent on its own
// (not in a pipeline).
type stallOnEvalProcessHook struct {
	armed atomic.Bool
	stall func()
}

func (h *stallOnEvalProcessHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *stallOnEvalProcessHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if cmd.Name() == "evalsha" && h.armed.CompareAndSwap(true, false) {
			h.stall()
		}
		return next(ctx, cmd)
	}
}
func (h *stallOnEvalProcessHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// TestTakeOverRunTwicePublishesTheOriginal: the store on a client of its own (no auto-pipeline),
// which sends a command again when its reply is late (go-redis's MaxRetries). A retry's TakeOver
// runs twice: the first run takes the reservation of a dead request, the second finds it held by
// the retry's own owner. settle published the retry's own check-in then (its own server-set
// timestamp and recording time: another identity than the original's, should that have landed
// after all) and answered it as new; it now publishes what is stored, the original, and answers
// as a retry.
func TestTakeOverRunTwicePublishesTheOriginal(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t, redistest.Options{})
	keys := adapters.KeySpace{Prefix: "r10u"}
	check := redistest.Client(t, srv.URL())
	newClient := func(rt time.Duration) *redis.Client { return serviceClient(t, srv.URL(), rt) }
	hook := &stallOnEvalProcessHook{stall: func() { stallRedis(t, srv.URL(), 700*time.Millisecond) }}
	idemClient := newClient(400 * time.Millisecond)
	idemClient.AddHook(hook)
	pub, err := adapters.NewEventPublisher(newClient(0), keys, watermill.NopLogger{})
	require.NoError(t, err)
	idem := adapters.NewIdempotencyStore(idemClient, keys, time.Hour)
	h := lateReplyHandler(t, pub, idem).WithTakeoverAge(time.Second)
	retry, dead := abandonedReservation(t, h, idem, "ck-6")
	t0 := dead.RecordedAt
	hook.armed.Store(true)
	rctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	res, err := h.Handle(rctx, retry)
	require.NoError(t, err)
	ts := publishedTimestamps(t, check, keys, "ck-6")
	assert.Equal(t, []any{strconv.FormatInt(t0, 10)}, ts, "the original check-in (timestamp %d) is what is published", t0)
	assert.Equal(t, dead.Checkin, res.Checkin)
	assert.True(t, res.Replayed, "a retry answers as a retry")
}
