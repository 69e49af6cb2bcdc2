package adapters_test

// The owner of a reservation whose XADD reaches the stream only after another attempt may have
// taken the reservation over: the stream refuses it, so the check-in is written once.

import (
	"context"
	"errors"
	"io"
	"log/slog"
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

// TestLateXAddOfATakenOverReservationIsRefused is the two-step path of a cluster with one
// stream: the idempotency records on one server, the stream on another. Request A reserves its
// checkinId and sends its XADD, which the stream's server holds (CLIENT PAUSE WRITE, as a server
// stalled by a fork, a slow disk or a long script would). Request B, a retry with the same
// checkinId and body, waits for A's outcome, takes the reservation over after the takeover age
// and sends its own XADD. When the server resumes, both XADDs reach it: before the fence both
// ran and the check-in was on the stream twice (GET /checkins listed it twice). Now A's is
// refused by the stream's clock (A answers unavailable, B as recorded) and the entry is there once.
func TestLateXAddOfATakenOverReservationIsRefused(t *testing.T) {
	t.Parallel()
	records := redistest.Start(t, redistest.Options{})
	stream := redistest.Start(t, redistest.Options{})
	admin := redistest.Client(t, stream.URL())
	keys := adapters.KeySpace{Prefix: "fence"}
	newClient := func(url string) *redis.Client { return serviceClient(t, url, 0) }
	streamPipe := adapters.NewAutoPipeline(newClient(stream.URL()), 64, 2)
	t.Cleanup(func() { _ = streamPipe.Close() })
	pub, err := adapters.NewPipelinedEventPublisher(newClient(stream.URL()), streamPipe, keys, watermill.NopLogger{})
	require.NoError(t, err)
	recordsPipe := adapters.NewAutoPipeline(newClient(records.URL()), 64, 2)
	t.Cleanup(func() { _ = recordsPipe.Close() })
	idem := adapters.NewIdempotencyStore(newClient(records.URL()), keys, time.Hour).WithAutoPipeline(recordsPipe)
	// Two API processes: one process's requests for one checkinId share one attempt.
	newHandler := func() *command.RecordCheckinHandler {
		h, err := command.NewRecordCheckinHandler(pub, idem, time.Now, uuid.NewString, slog.New(slog.NewTextHandler(io.Discard, nil)))
		require.NoError(t, err)
		h.WithTakeoverAge(time.Second) // the fence: 750ms after the reservation
		t.Cleanup(func() { _ = h.Close() })
		return h
	}
	h, h2 := newHandler(), newHandler()
	ctx := context.Background()
	_, err = h.Handle(ctx, command.RecordCheckin{Input: input(ptr("warm"), 1, 1, 1, nil)})
	require.NoError(t, err)

	// The stream's server holds every write for 1.4s: A's XADD (sent at once) runs after its
	// fence, B's (sent at the takeover, about 1s in) before its own.
	require.NoError(t, admin.Do(ctx, "CLIENT", "PAUSE", "1400", "WRITE").Err())
	in := input(ptr("late-owner"), 7, 3, 4, ptr(int64(1_700_000_000_000)))
	type outcome struct {
		res command.RecordCheckinResult
		err error
	}
	a, b := make(chan outcome, 1), make(chan outcome, 1)
	go func() {
		res, err := h.Handle(ctx, command.RecordCheckin{Input: in})
		a <- outcome{res, err}
	}()
	time.Sleep(100 * time.Millisecond) // A holds the reservation
	go func() {
		res, err := h2.Handle(ctx, command.RecordCheckin{Input: in})
		b <- outcome{res, err}
	}()
	ra, rb := <-a, <-b

	require.NoError(t, rb.err, "B took the reservation over and recorded the check-in")
	assert.Equal(t, "late-owner", rb.res.Checkin.ID)

	entries, err := admin.XRange(ctx, keys.Stream(), "-", "+").Result()
	require.NoError(t, err)
	n := 0
	for _, e := range entries {
		if e.Values[domain.FieldCheckinID] == "late-owner" {
			n++
		}
	}
	assert.Equal(t, 1, n, "the check-in is on the stream once")
	require.Error(t, ra.err, "A's XADD came after its fence")
	assert.True(t, errors.Is(ra.err, command.ErrPublishTooLate), "%v", ra.err)
	assert.True(t, errors.Is(ra.err, domain.ErrUnavailable), "A answers 503: %v", ra.err)

	// A retry now is answered from the record B marked published.
	require.Eventually(t, func() bool {
		res, err := h.Handle(ctx, command.RecordCheckin{Input: in})
		return err == nil && res.Replayed
	}, 5*time.Second, 20*time.Millisecond)
}

// TestFencedXAddWaitsForReplicas: INGEST_MIN_REPLICAS's WAIT follows a fenced XADD as it
// follows a plain one (it matched XADD by name): on a server without replicas the publish fails
// as not replicated.
func TestFencedXAddWaitsForReplicas(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t, redistest.Options{})
	keys := adapters.KeySpace{Prefix: "fencewait"}
	newClient := func() *redis.Client { return serviceClient(t, srv.URL(), 0) }
	pipeClient := newClient()
	require.NoError(t, adapters.RequireReplicas(pipeClient, 1, 50*time.Millisecond))
	pipe := adapters.NewAutoPipeline(pipeClient, 64, 2)
	t.Cleanup(func() { _ = pipe.Close() })
	pub, err := adapters.NewPipelinedEventPublisher(newClient(), pipe, keys, watermill.NopLogger{})
	require.NoError(t, err)
	ev := domain.CheckinRecorded{Checkin: domain.Checkin{ID: "w", UserID: 1, LocationID: 1, StarRating: 1, Timestamp: 1}, RecordedAt: 1}
	err = pub.PublishCheckinRecordedWithin(context.Background(), ev, "", time.Hour)
	require.Error(t, err)
	assert.True(t, errors.Is(err, domain.ErrNotReplicated), "%v", err)

	// And past its deadline the script adds nothing, which the failed WAIT does not make a
	// maybe: the server holds the XADD for 100ms, and it had a nanosecond.
	require.NoError(t, redistest.Client(t, srv.URL()).Do(context.Background(), "CLIENT", "PAUSE", "100", "WRITE").Err())
	err = pub.PublishCheckinRecordedWithin(context.Background(), ev, "", time.Nanosecond)
	assert.True(t, errors.Is(err, command.ErrPublishTooLate), "%v", err)
	assert.True(t, errors.Is(err, command.ErrNotPublished), "%v", err)
	n, err := redistest.Client(t, srv.URL()).XLen(context.Background(), keys.Stream()).Result()
	require.NoError(t, err)
	assert.Equal(t, int64(1), n, "the first XADD only (on the master, not replicated)")
}

// TestFenceIsJudgedOnTheAPIsOwnClock: a reservation's ReservedAt is the API process's
// clock (h.now), the fence's deadline is judged by the stream server's TIME. An API host whose
// clock lags the Redis host's by more than the takeover age less the margin (here 5.5s, with the
// takeover age service.go wires by default: REQUEST_TIMEOUT 5s + 1s) has every check-in of the
// two-call path refused and answered 503, with no takeover anywhere. Before 4c00901 the XADD did
// not depend on Redis's clock at all; the README only speaks of "1 s for clock skew".
func TestFenceIsJudgedOnTheAPIsOwnClock(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t, redistest.Options{})
	keys := adapters.KeySpace{Prefix: "review4skew"}
	newClient := func() *redis.Client { return serviceClient(t, srv.URL(), 0) }
	pipe := adapters.NewAutoPipeline(newClient(), 64, 2)
	t.Cleanup(func() { _ = pipe.Close() })
	pub, err := adapters.NewPipelinedEventPublisher(newClient(), pipe, keys, watermill.NopLogger{})
	require.NoError(t, err)
	idem := adapters.NewIdempotencyStore(newClient(), keys, time.Hour).WithAutoPipeline(pipe)
	lagging := func() time.Time { return time.Now().Add(-5500 * time.Millisecond) }
	h, err := command.NewRecordCheckinHandler(pub, idem, lagging, uuid.NewString, slog.New(slog.NewTextHandler(io.Discard, nil)))
	require.NoError(t, err)
	h.WithTakeoverAge(6 * time.Second)
	t.Cleanup(func() { _ = h.Close() })

	_, err = h.Handle(context.Background(), command.RecordCheckin{Input: input(ptr("skewed-1"), 1, 2, 3, nil)})
	require.NoError(t, err, "a lone check-in, nobody else holding its checkinId, from an API host 5.5s behind Redis")
}
