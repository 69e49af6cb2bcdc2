package command_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/checkins/checkins/app/command"
	"github.com/checkins/checkins/domain"
)

// memOneStep is a ReservingPublisher over a memStore and a memPublisher, all or nothing as the
// Redis script is: the record is stored as published only with the event.
type memOneStep struct {
	store   *memStore
	pub     *memPublisher
	calls   atomic.Int64
	decline bool
	refuse  bool  // the limit refuses
	fail    error // the step's outcome is unknown
	limited atomic.Int64
}

func (m *memOneStep) ReserveAndPublish(ctx context.Context, rec command.IdempotencyRecord, corr string, limit bool) (command.RateDecision, *command.IdempotencyRecord, bool, error) {
	if m.decline {
		return command.RateDecision{}, nil, false, nil
	}
	m.calls.Add(1)
	if limit {
		m.limited.Add(1)
	}
	if m.fail != nil {
		return command.RateDecision{Allowed: true}, nil, true, m.fail
	}
	if m.refuse {
		return command.RateDecision{RetryAfter: time.Second}, nil, true, nil
	}
	m.store.mu.Lock()
	defer m.store.mu.Unlock()
	if old, ok := m.store.recs[rec.Checkin.ID]; ok {
		return command.RateDecision{Allowed: true, Remaining: 5}, &old, true, nil
	}
	ev := domain.CheckinRecorded{Checkin: rec.Checkin, RecordedAt: rec.RecordedAt, Fingerprint: rec.Fingerprint}
	if err := m.pub.PublishCheckinRecorded(ctx, ev, corr); err != nil {
		return command.RateDecision{Allowed: true}, nil, true, err
	}
	rec.Published = true
	m.store.recs[rec.Checkin.ID] = rec
	return command.RateDecision{Allowed: true, Remaining: 5}, nil, true, nil
}

type allowAll struct{}

func (allowAll) Allow(context.Context, int64) (command.RateDecision, error) {
	return command.RateDecision{Allowed: true, Remaining: 9}, nil
}

// TestOneStepRecordsWithoutReserveOrMark: with a ReservingPublisher a new check-in is one call,
// no reservation, publish and mark in a row; the same checkinId again is a retry, another body
// a conflict, as on the other path.
func TestOneStepRecordsWithoutReserveOrMark(t *testing.T) {
	store, pub := newMemStore(), &memPublisher{}
	one := &memOneStep{store: store, pub: pub}
	h := newHandler(t, pub, store, newClock()).WithReservingPublisher(one)
	ctx := context.Background()

	res, err := h.Handle(ctx, checkin("c1", 4))
	require.NoError(t, err)
	assert.False(t, res.Replayed)
	assert.Equal(t, "c1", res.Checkin.ID)
	assert.Nil(t, res.Rate, "no limit asked")
	require.Len(t, pub.published(), 1)
	rec, ok := store.get("c1")
	require.True(t, ok)
	assert.True(t, rec.Published)
	assert.Zero(t, store.reserves.Load(), "no reservation of its own")
	require.NoError(t, h.Close())

	res, err = h.Handle(ctx, checkin("c1", 4))
	require.NoError(t, err)
	assert.True(t, res.Replayed, "a retry")
	_, err = h.Handle(ctx, checkin("c1", 2))
	require.ErrorIs(t, err, domain.ErrConflict)
	assert.Len(t, pub.published(), 1)
	assert.Equal(t, int64(3), one.calls.Load())
	assert.Zero(t, store.reserves.Load())
}

// TestOneStepWaitsForAnotherAttemptsReservation: a checkinId another process holds (reserved,
// not published yet) is waited for as on the other path, and answered as a retry.
func TestOneStepWaitsForAnotherAttemptsReservation(t *testing.T) {
	store, pub := newMemStore(), &memPublisher{}
	clk := newClock()
	h := newHandler(t, pub, store, clk).WithReservingPublisher(&memOneStep{store: store, pub: pub})
	cmd := checkin("c1", 4)
	held := reservation(cmd, "other", clk.Millis(0))
	store.put(held)
	out := handleAsync(context.Background(), h, cmd, 1)
	time.Sleep(50 * time.Millisecond)
	select {
	case o := <-out:
		t.Fatalf("answered while the other attempt holds the checkinId: %+v", o)
	default:
	}
	require.NoError(t, store.MarkPublished(context.Background(), held))
	o := collect(t, out, 1)[0]
	require.NoError(t, o.err)
	assert.True(t, o.res.Replayed)
	assert.Empty(t, pub.published(), "the other attempt's event, not a second one")
}

// TestOneStepLimitsDeclinesAndFails: the limit's decision comes back with the answer and a
// refusal publishes nothing; a declined step takes the other path; an unknown outcome is 503.
func TestOneStepLimitsDeclinesAndFails(t *testing.T) {
	ctx := context.Background()
	limited := func(c command.RecordCheckin) command.RecordCheckin { c.LimitUser = *c.Input.UserID; return c }

	store, pub := newMemStore(), &memPublisher{}
	one := &memOneStep{store: store, pub: pub}
	h := newHandler(t, pub, store, newClock()).WithUserLimit(allowAll{}).WithReservingPublisher(one)
	res, err := h.Handle(ctx, limited(checkin("c1", 4)))
	require.NoError(t, err)
	require.NotNil(t, res.Rate)
	assert.Equal(t, 5, res.Rate.Remaining, "the step's decision, not another count")
	assert.Equal(t, int64(1), one.limited.Load(), "counted in the step")

	one.refuse = true
	_, err = h.Handle(ctx, limited(checkin("c2", 4)))
	var rl *command.RateLimitedError
	require.ErrorAs(t, err, &rl)
	assert.Len(t, pub.published(), 1, "a refused request publishes nothing")
	_, ok := store.get("c2")
	assert.False(t, ok)

	one.refuse, one.fail = false, errors.New("connection reset")
	_, err = h.Handle(ctx, limited(checkin("c3", 4)))
	require.ErrorIs(t, err, domain.ErrUnavailable)

	one.fail, one.decline = nil, true
	res, err = h.Handle(ctx, limited(checkin("c4", 4)))
	require.NoError(t, err)
	assert.False(t, res.Replayed)
	assert.Equal(t, int64(1), store.reserves.Load(), "declined: reserved, then published")
	assert.Len(t, pub.published(), 2)
	require.NoError(t, h.Close())
	rec, _ := store.get("c4")
	assert.True(t, rec.Published, "and marked")
}
