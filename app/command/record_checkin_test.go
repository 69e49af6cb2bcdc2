package command_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/checkins/checkins/app/command"
	"github.com/checkins/checkins/domain"
)

// memStore is an IdempotencyStore in memory, with the semantics of the Redis one.
type memStore struct {
	mu        sync.Mutex
	recs      map[string]command.IdempotencyRecord
	reserves  atomic.Int64
	takeOvers atomic.Int64
	refuse    bool // TakeOver never takes, like a record the Redis script cannot read
}

func newMemStore() *memStore { return &memStore{recs: map[string]command.IdempotencyRecord{}} }

func (s *memStore) Reserve(_ context.Context, rec command.IdempotencyRecord) (*command.IdempotencyRecord, error) {
	s.reserves.Add(1)
	s.mu.Lock()
	defer s.mu.Unlock()
	if old, ok := s.recs[rec.Checkin.ID]; ok {
		return &old, nil
	}
	s.recs[rec.Checkin.ID] = rec
	return nil, nil
}

func (s *memStore) MarkPublished(_ context.Context, rec command.IdempotencyRecord) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.recs[rec.Checkin.ID]; ok {
		rec.Published, rec.Owner = true, ""
		s.recs[rec.Checkin.ID] = rec
	}
	return nil
}

func (s *memStore) TakeOver(_ context.Context, seen, next command.IdempotencyRecord) (bool, *command.IdempotencyRecord, error) {
	s.takeOvers.Add(1)
	s.mu.Lock()
	defer s.mu.Unlock()
	cur, ok := s.recs[next.Checkin.ID]
	if !ok {
		return false, nil, nil
	}
	if s.refuse || cur.Published || cur.Owner != seen.Owner {
		return false, &cur, nil
	}
	s.recs[next.Checkin.ID] = next
	return true, nil, nil
}

func (s *memStore) Release(_ context.Context, rec command.IdempotencyRecord) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if cur, ok := s.recs[rec.Checkin.ID]; ok && cur == rec {
		delete(s.recs, rec.Checkin.ID)
	}
	return nil
}

func (s *memStore) get(id string) (command.IdempotencyRecord, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	r, ok := s.recs[id]
	return r, ok
}

func (s *memStore) put(rec command.IdempotencyRecord) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.recs[rec.Checkin.ID] = rec
}

// memPublisher records events; a gate, when set, holds every publish until it is closed, and
// fail, when set, decides a publish's error.
type memPublisher struct {
	mu      sync.Mutex
	events  []domain.CheckinRecorded
	entered atomic.Int64
	gate    chan struct{}
	fail    func(ctx context.Context) error
}

func (p *memPublisher) PublishCheckinRecorded(ctx context.Context, e domain.CheckinRecorded, _ string) error {
	p.entered.Add(1)
	if p.gate != nil {
		select {
		case <-p.gate:
		case <-ctx.Done():
			return fmt.Errorf("%w: %w", command.ErrNotPublished, ctx.Err())
		}
	}
	if p.fail != nil {
		if err := p.fail(ctx); err != nil {
			return err
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.events = append(p.events, e)
	return nil
}

func (p *memPublisher) published() []domain.CheckinRecorded {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]domain.CheckinRecorded(nil), p.events...)
}

// clock stands still until the test moves it.
type clock struct{ ms atomic.Int64 }

func newClock() *clock {
	c := &clock{}
	c.ms.Store(time.Date(2024, 5, 1, 12, 0, 0, 0, time.UTC).UnixMilli())
	return c
}

func (c *clock) Now() time.Time                 { return time.UnixMilli(c.ms.Load()) }
func (c *clock) Advance(d time.Duration)        { c.ms.Add(d.Milliseconds()) }
func (c *clock) Millis(ago time.Duration) int64 { return c.ms.Load() - ago.Milliseconds() }

const takeoverAge = 10 * time.Second

func newHandler(t *testing.T, pub command.EventPublisher, store command.IdempotencyStore, clk *clock) *command.RecordCheckinHandler {
	t.Helper()
	var n atomic.Int64
	h, err := command.NewRecordCheckinHandler(pub, store, clk.Now, func() string { return fmt.Sprintf("gen-%d", n.Add(1)) },
		slog.New(slog.NewTextHandler(io.Discard, nil)))
	require.NoError(t, err)
	return h.WithTakeoverAge(takeoverAge)
}

func checkin(id string, stars int64) command.RecordCheckin {
	user, loc := int64(42), int64(7)
	return command.RecordCheckin{Input: domain.CheckinInput{CheckinID: &id, UserID: &user, LocationID: &loc, StarRating: &stars}}
}

// reservation is what an attempt of another process left: reserved, unpublished.
func reservation(cmd command.RecordCheckin, owner string, reservedAt int64) command.IdempotencyRecord {
	c := domain.Checkin{ID: *cmd.Input.CheckinID, UserID: *cmd.Input.UserID, LocationID: *cmd.Input.LocationID,
		StarRating: int(*cmd.Input.StarRating), Timestamp: reservedAt - 1000}
	return command.IdempotencyRecord{Fingerprint: cmd.Input.Fingerprint(), Checkin: c, RecordedAt: reservedAt,
		Owner: owner, ReservedAt: reservedAt}
}

type outcome struct {
	res command.RecordCheckinResult
	err error
}

func handleAsync(ctx context.Context, h *command.RecordCheckinHandler, cmd command.RecordCheckin, n int) <-chan outcome {
	out := make(chan outcome, n)
	for range n {
		go func() {
			res, err := h.Handle(ctx, cmd)
			out <- outcome{res, err}
		}()
	}
	return out
}

func collect(t *testing.T, out <-chan outcome, n int) []outcome {
	t.Helper()
	var all []outcome
	for range n {
		select {
		case o := <-out:
			all = append(all, o)
		case <-time.After(10 * time.Second): // a hang fails the test instead of stalling it
			t.Fatalf("only %d of %d requests answered", len(all), n)
		}
	}
	return all
}

func TestConcurrentRequestsShareOneOutcome(t *testing.T) {
	t.Parallel()
	store, pub, clk := newMemStore(), &memPublisher{gate: make(chan struct{})}, newClock()
	h := newHandler(t, pub, store, clk)
	cmd := checkin("ck-1", 4)
	ctx := context.Background()

	leader := handleAsync(ctx, h, cmd, 1)
	require.Eventually(t, func() bool { return pub.entered.Load() == 1 }, 5*time.Second, time.Millisecond)
	clk.Advance(time.Second) // a request computing its own check-in would now differ
	followers := handleAsync(ctx, h, cmd, 49)
	require.Eventually(t, func() bool { return command.Waiters(h) == 49 }, 5*time.Second, time.Millisecond)
	close(pub.gate)

	first := collect(t, leader, 1)[0]
	require.NoError(t, first.err)
	assert.False(t, first.res.Replayed)
	for _, o := range collect(t, followers, 49) {
		require.NoError(t, o.err)
		assert.True(t, o.res.Replayed)
		assert.Equal(t, first.res.Checkin, o.res.Checkin)
	}
	assert.Len(t, pub.published(), 1)
	assert.Equal(t, int64(1), store.reserves.Load(), "waiters in the process do not ask the store")
}

func TestWaitsForAnotherProcessToPublish(t *testing.T) {
	t.Parallel()
	store, pub, clk := newMemStore(), &memPublisher{}, newClock()
	h := newHandler(t, pub, store, clk)
	cmd := checkin("ck-2", 3)
	theirs := reservation(cmd, "other-process", clk.Millis(0))
	store.put(theirs)

	out := handleAsync(context.Background(), h, cmd, 5)
	require.Eventually(t, func() bool { return store.reserves.Load() >= 3 }, 5*time.Second, time.Millisecond, "the leader polls")
	require.NoError(t, store.MarkPublished(context.Background(), theirs))

	for _, o := range collect(t, out, 5) {
		require.NoError(t, o.err)
		assert.True(t, o.res.Replayed)
		assert.Equal(t, theirs.Checkin, o.res.Checkin)
	}
	assert.Empty(t, pub.published(), "the owner published; nobody else does")
}

func TestAbandonedReservationIsTakenOverOnce(t *testing.T) {
	t.Parallel()
	store, clk := newMemStore(), newClock()
	cmd := checkin("ck-3", 5)
	dead := reservation(cmd, "dead-owner", clk.Millis(0))
	store.put(dead)
	// Three processes, four concurrent requests each.
	pubs := []*memPublisher{{}, {}, {}}
	var outs []<-chan outcome
	var handlers []*command.RecordCheckinHandler
	for _, p := range pubs {
		h := newHandler(t, p, store, clk)
		handlers = append(handlers, h)
		outs = append(outs, handleAsync(context.Background(), h, cmd, 4))
	}
	require.Eventually(t, func() bool { return store.reserves.Load() >= 9 }, 5*time.Second, time.Millisecond, "all three poll")
	clk.Advance(takeoverAge - time.Millisecond)
	polled := store.reserves.Load()
	require.Eventually(t, func() bool { return store.reserves.Load() >= polled+6 }, 5*time.Second, time.Millisecond,
		"polls that saw the moved clock")
	for _, p := range pubs {
		assert.Empty(t, p.published(), "not taken over before the takeover age")
	}
	clk.Advance(time.Millisecond)

	for _, out := range outs {
		for _, o := range collect(t, out, 4) {
			require.NoError(t, o.err)
			assert.True(t, o.res.Replayed)
			assert.Equal(t, dead.Checkin, o.res.Checkin, "the original check-in")
		}
	}
	var events []domain.CheckinRecorded
	for _, p := range pubs {
		events = append(events, p.published()...)
	}
	require.Len(t, events, 1, "one taker wins")
	assert.Equal(t, domain.CheckinRecorded{Checkin: dead.Checkin, RecordedAt: dead.RecordedAt, Fingerprint: dead.Fingerprint}, events[0])
	for _, h := range handlers {
		require.NoError(t, h.Close()) // the mark is written after the answer
	}
	rec, ok := store.get("ck-3")
	require.True(t, ok)
	assert.True(t, rec.Published)
}

func TestReservationThatCannotBeTakenOverIsWaitedFor(t *testing.T) {
	t.Parallel()
	store, pub, clk := newMemStore(), &memPublisher{}, newClock()
	store.refuse = true
	h := newHandler(t, pub, store, clk)
	cmd := checkin("ck-10", 2)
	store.put(reservation(cmd, "dead-owner", clk.Millis(2*takeoverAge)))

	ctx, cancel := context.WithCancel(context.Background())
	out := handleAsync(ctx, h, cmd, 1)
	require.Eventually(t, func() bool { return store.takeOvers.Load() >= 3 }, 5*time.Second, time.Millisecond)
	cancel()
	require.ErrorIs(t, collect(t, out, 1)[0].err, domain.ErrUnavailable)
	assert.LessOrEqual(t, store.takeOvers.Load(), store.reserves.Load(), "each refused takeover is followed by a pause and a poll, not retried at once")
	assert.Empty(t, pub.published())
}

func TestDifferentBodyIsRefusedWhileOthersWait(t *testing.T) {
	t.Parallel()
	store, pub, clk := newMemStore(), &memPublisher{}, newClock()
	h := newHandler(t, pub, store, clk)
	cmd := checkin("ck-4", 2)
	theirs := reservation(cmd, "other-process", clk.Millis(0))
	store.put(theirs)

	waiter := handleAsync(context.Background(), h, cmd, 1)
	require.Eventually(t, func() bool { return store.reserves.Load() >= 2 }, 5*time.Second, time.Millisecond)
	_, err := h.Handle(context.Background(), checkin("ck-4", 1))
	require.ErrorIs(t, err, domain.ErrConflict)

	require.NoError(t, store.MarkPublished(context.Background(), theirs))
	o := collect(t, waiter, 1)[0]
	require.NoError(t, o.err)
	assert.Equal(t, theirs.Checkin, o.res.Checkin)
}

func TestWaiterWhoseContextEndsIsUnavailable(t *testing.T) {
	t.Parallel()
	store, pub, clk := newMemStore(), &memPublisher{gate: make(chan struct{})}, newClock()
	h := newHandler(t, pub, store, clk)

	// Waiting on another process's reservation.
	cmd := checkin("ck-5", 2)
	store.put(reservation(cmd, "other-process", clk.Millis(0)))
	ctx, cancel := context.WithCancel(context.Background())
	out := handleAsync(ctx, h, cmd, 1)
	require.Eventually(t, func() bool { return store.reserves.Load() >= 2 }, 5*time.Second, time.Millisecond)
	cancel()
	o := collect(t, out, 1)[0]
	require.ErrorIs(t, o.err, domain.ErrUnavailable)
	assert.ErrorIs(t, o.err, context.Canceled)

	// Waiting on a request of this process, which goes on.
	cmd = checkin("ck-6", 2)
	leader := handleAsync(context.Background(), h, cmd, 1)
	require.Eventually(t, func() bool { return pub.entered.Load() == 1 }, 5*time.Second, time.Millisecond)
	ctx, cancel = context.WithCancel(context.Background())
	out = handleAsync(ctx, h, cmd, 1)
	require.Eventually(t, func() bool { return command.Waiters(h) == 1 }, 5*time.Second, time.Millisecond)
	cancel()
	o = collect(t, out, 1)[0]
	require.ErrorIs(t, o.err, domain.ErrUnavailable)
	assert.ErrorIs(t, o.err, context.Canceled)
	close(pub.gate)
	require.NoError(t, collect(t, leader, 1)[0].err)
	assert.Len(t, pub.published(), 1)
}

func TestLeaderWhoseContextEndsLeavesWaitersToTryAgain(t *testing.T) {
	t.Parallel()
	store, pub, clk := newMemStore(), &memPublisher{gate: make(chan struct{})}, newClock()
	h := newHandler(t, pub, store, clk)
	cmd := checkin("ck-7", 1)

	ctx, cancel := context.WithCancel(context.Background())
	leader := handleAsync(ctx, h, cmd, 1)
	require.Eventually(t, func() bool { return pub.entered.Load() == 1 }, 5*time.Second, time.Millisecond)
	followers := handleAsync(context.Background(), h, cmd, 3)
	require.Eventually(t, func() bool { return command.Waiters(h) == 3 }, 5*time.Second, time.Millisecond)
	// The client of the first request goes away before its XADD was sent: it answers
	// unavailable and frees the checkinId, and one of the others records the check-in.
	cancel()
	require.ErrorIs(t, collect(t, leader, 1)[0].err, domain.ErrUnavailable)
	require.Eventually(t, func() bool { return pub.entered.Load() == 2 }, 5*time.Second, time.Millisecond)
	close(pub.gate)

	replayed := 0
	for _, o := range collect(t, followers, 3) {
		require.NoError(t, o.err)
		if o.res.Replayed {
			replayed++
		}
	}
	assert.Equal(t, 2, replayed, "one follower recorded it, the others share its outcome")
	assert.Len(t, pub.published(), 1)
}

func TestFailedPublishReleasesOnlyWhenNothingWasStored(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	var failure atomic.Pointer[error]
	pub := &memPublisher{fail: func(context.Context) error {
		if p := failure.Swap(nil); p != nil {
			return *p
		}
		return nil
	}}
	store, clk := newMemStore(), newClock()
	h := newHandler(t, pub, store, clk)

	// Refused before it was sent: the checkinId is free again at once.
	refused := fmt.Errorf("%w: pipeline closed", command.ErrNotPublished)
	failure.Store(&refused)
	_, err := h.Handle(ctx, checkin("ck-8", 1))
	require.ErrorIs(t, err, domain.ErrUnavailable)
	_, ok := store.get("ck-8")
	assert.False(t, ok, "released")
	res, err := h.Handle(ctx, checkin("ck-8", 2))
	require.NoError(t, err, "another body may now take the checkinId: nothing was published")
	assert.False(t, res.Replayed)

	// Unknown outcome: the reservation stays until it is old enough to be taken over.
	unknown := errors.New("i/o timeout")
	failure.Store(&unknown)
	cmd := checkin("ck-9", 1)
	_, err = h.Handle(ctx, cmd)
	require.ErrorIs(t, err, domain.ErrUnavailable)
	first, ok := store.get("ck-9")
	require.True(t, ok, "not released")
	assert.False(t, first.Published)

	_, err = h.Handle(ctx, checkin("ck-9", 3))
	require.ErrorIs(t, err, domain.ErrConflict, "the reservation still guards the checkinId")
	retry := handleAsync(ctx, h, cmd, 1)
	require.Eventually(t, func() bool { return store.reserves.Load() >= 7 }, 5*time.Second, time.Millisecond, "the retry waits")
	clk.Advance(takeoverAge)
	o := collect(t, retry, 1)[0]
	require.NoError(t, o.err)
	assert.Equal(t, first.Checkin, o.res.Checkin, "the original check-in, published again")
	assert.Len(t, pub.published(), 2, "ck-8 and ck-9")
}

// TestFailedPublishAfterATakeoverKeepsTheReservation: an attempt that took over an abandoned
// reservation and could not publish must not release it. The attempt that reserved it first may
// have published before it died; released, the checkinId could be taken by another body, or by
// the same body recorded again with another timestamp (another check-in for the projections).
func TestFailedPublishAfterATakeoverKeepsTheReservation(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	refused := fmt.Errorf("%w: pipeline closed", command.ErrNotPublished)
	pub := &memPublisher{fail: func(context.Context) error { return refused }}
	store, clk := newMemStore(), newClock()
	h := newHandler(t, pub, store, clk)
	cmd := checkin("ck-taken", 1)
	store.put(reservation(cmd, "dead-owner", clk.Millis(2*takeoverAge)))

	_, err := h.Handle(ctx, cmd)
	require.ErrorIs(t, err, domain.ErrUnavailable)
	assert.Equal(t, int64(1), store.takeOvers.Load(), "it took the reservation over")
	rec, ok := store.get("ck-taken")
	require.True(t, ok, "the reservation stays after a takeover's failed publish")
	assert.NotEqual(t, "dead-owner", rec.Owner)
	_, err = h.Handle(ctx, checkin("ck-taken", 5))
	assert.ErrorIs(t, err, domain.ErrConflict, "another body is still refused")
}

// resentStore runs every first reservation of a checkinId twice, as the Redis client does when
// the reply to a pipeline is lost (a reset connection, a failover) and it sends the pipeline
// again: the attempt gets back the reservation its own first run wrote.
type resentStore struct{ *memStore }

func (s resentStore) Reserve(ctx context.Context, rec command.IdempotencyRecord) (*command.IdempotencyRecord, error) {
	if existing, err := s.memStore.Reserve(ctx, rec); existing != nil || err != nil {
		return existing, err
	}
	return s.memStore.Reserve(ctx, rec)
}

// TestOwnReservationSentTwiceIsPublished: the attempt publishes at once instead of waiting for
// "another attempt" (itself) until the takeover age, past its deadline.
func TestOwnReservationSentTwiceIsPublished(t *testing.T) {
	t.Parallel()
	store, pub, clk := newMemStore(), &memPublisher{}, newClock()
	h := newHandler(t, pub, resentStore{store}, clk)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	res, err := h.Handle(ctx, checkin("ck-resent", 4))
	require.NoError(t, err)
	assert.False(t, res.Replayed)
	require.Len(t, pub.published(), 1, "published once")
	assert.Zero(t, store.takeOvers.Load(), "without waiting to take itself over")
}

// refuseFirst refuses the first request it counts, after holding it until release is closed,
// and allows every later one (GCRA refills continuously: the next request may be allowed).
type refuseFirst struct {
	calls   atomic.Int64
	entered chan struct{}
	release chan struct{}
}

func (l *refuseFirst) Allow(context.Context, int64) (command.RateDecision, error) {
	if l.calls.Add(1) == 1 {
		close(l.entered)
		<-l.release
		return command.RateDecision{Allowed: false, RetryAfter: time.Second}, nil
	}
	return command.RateDecision{Allowed: true, Remaining: 1}, nil
}

// TestWaiterIsNotAnsweredWithTheFirstRequestsRefusal: a request that waited for another with the
// same checkinId and body, refused by its rate limit, is judged on its own limit: allowed, it is
// recorded. It used to be charged against its limit and answered 429 all the same.
func TestWaiterIsNotAnsweredWithTheFirstRequestsRefusal(t *testing.T) {
	t.Parallel()
	store, pub, clk := newMemStore(), &memPublisher{}, newClock()
	lim := &refuseFirst{entered: make(chan struct{}), release: make(chan struct{})}
	h := newHandler(t, pub, store, clk).WithUserLimit(lim)
	ctx := context.Background()
	cmd := checkin("ck-limited", 2)
	cmd.LimitUser = *cmd.Input.UserID
	first := handleAsync(ctx, h, cmd, 1)
	<-lim.entered
	waiter := handleAsync(ctx, h, cmd, 1)
	require.Eventually(t, func() bool { return command.Waiters(h) == 1 }, 5*time.Second, time.Millisecond,
		"the second request waits for the first one's outcome")
	close(lim.release)

	var limited *command.RateLimitedError
	f := collect(t, first, 1)[0]
	require.ErrorAs(t, f.err, &limited, "the first request is over its limit")
	w := collect(t, waiter, 1)[0]
	require.NoError(t, w.err, "the waiter, allowed, is recorded")
	require.NotNil(t, w.res.Rate)
	assert.True(t, w.res.Rate.Allowed)
	assert.Len(t, pub.published(), 1)
	assert.Equal(t, int64(2), lim.calls.Load(), "each request counted once")
}

func TestGeneratedIDsAreNotShared(t *testing.T) {
	t.Parallel()
	store, pub, clk := newMemStore(), &memPublisher{}, newClock()
	h := newHandler(t, pub, store, clk)
	cmd := checkin("x", 1)
	cmd.Input.CheckinID = nil
	for _, o := range collect(t, handleAsync(context.Background(), h, cmd, 10), 10) {
		require.NoError(t, o.err)
		assert.False(t, o.res.Replayed)
	}
	assert.Len(t, pub.published(), 10)
}

// slowMarks is a memStore whose MarkPublished waits until released.
type slowMarks struct {
	*memStore
	release chan struct{}
	marked  atomic.Int64
}

func (s *slowMarks) MarkPublished(ctx context.Context, rec command.IdempotencyRecord) error {
	<-s.release
	s.marked.Add(1)
	return s.memStore.MarkPublished(ctx, rec)
}

// TestAnswerDoesNotWaitForThePublishedMark: the event is stored when the answer goes out; the
// mark follows, a retry meanwhile waits for it and answers as a retry, and Close waits for it.
func TestAnswerDoesNotWaitForThePublishedMark(t *testing.T) {
	t.Parallel()
	store := &slowMarks{memStore: newMemStore(), release: make(chan struct{})}
	pub, clk := &memPublisher{}, newClock()
	h := newHandler(t, pub, store, clk)
	res, err := h.Handle(context.Background(), checkin("ck-m", 4))
	require.NoError(t, err, "answered while the mark is still being written")
	assert.False(t, res.Replayed)
	require.Len(t, pub.published(), 1)
	rec, _ := store.get("ck-m")
	assert.False(t, rec.Published, "not marked yet")

	retry := handleAsync(context.Background(), newHandler(t, pub, store, clk), checkin("ck-m", 4), 1)
	require.Eventually(t, func() bool { return store.reserves.Load() >= 3 }, 5*time.Second, time.Millisecond, "the retry polls the held reservation")
	closeAfterRelease(t, h, store.release)
	assert.Equal(t, int64(1), store.marked.Load())
	for _, o := range collect(t, retry, 1) {
		require.NoError(t, o.err)
		assert.True(t, o.res.Replayed)
	}
	assert.Len(t, pub.published(), 1, "the retry did not publish again")
}

// batchMarks is a memStore that marks in batches (command.BatchMarker), each batch waiting
// until released.
type batchMarks struct {
	*memStore
	release chan struct{}
	batches atomic.Int64
}

func (s *batchMarks) MarkPublishedAll(ctx context.Context, recs []command.IdempotencyRecord) []error {
	<-s.release
	s.batches.Add(1)
	errs := make([]error, len(recs))
	for i, r := range recs {
		errs[i] = s.MarkPublished(ctx, r)
	}
	return errs
}

// With a BatchMarker the marks are queued to one writer, which sends those waiting together;
// the answers do not wait for them, and Close waits until every one is written.
func TestPublishedMarksAreBatchedAndCloseWaitsForThem(t *testing.T) {
	t.Parallel()
	store := &batchMarks{memStore: newMemStore(), release: make(chan struct{})}
	h := newHandler(t, &memPublisher{}, store, newClock())
	const n = 20
	for i := range n {
		_, err := h.Handle(context.Background(), checkin(fmt.Sprintf("ck-b%d", i), 4))
		require.NoError(t, err, "answered while the marks wait")
	}
	closeAfterRelease(t, h, store.release)
	for i := range n {
		rec, ok := store.get(fmt.Sprintf("ck-b%d", i))
		require.True(t, ok)
		assert.True(t, rec.Published, "ck-b%d marked", i)
	}
	assert.Less(t, store.batches.Load(), int64(n), "the marks waiting were written together")
	_, err := h.Handle(context.Background(), checkin("ck-after", 4))
	require.NoError(t, err, "a check-in after Close is still answered")
	assert.Eventually(t, func() bool { r, _ := store.get("ck-after"); return r.Published }, 5*time.Second, time.Millisecond)
}

// closeAfterRelease checks that h.Close waits while the store holds the marks back, then lets
// them go (closing release) and checks that Close returns without error.
func closeAfterRelease(t *testing.T, h *command.RecordCheckinHandler, release chan struct{}) {
	t.Helper()
	closed := make(chan error, 1)
	go func() { closed <- h.Close() }()
	select {
	case <-closed:
		t.Fatal("Close returned before the marks were written")
	case <-time.After(50 * time.Millisecond):
	}
	close(release)
	require.NoError(t, <-closed)
}
