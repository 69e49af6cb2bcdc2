package ports

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/checkins/checkins/app/projection"
)

// Projections consume the stream in batches: a batching subscriber turns the subscriber's
// messages (one per stream entry) into one Watermill message per run of entries that are ready
// together, and the router hands that message to one handler call, through the middleware chain
// (poison queue, retry, timeout, recovery) like any message. One batch is decoded once, fed to
// every projection of the group, and applied in a few script calls; its entries are acked when
// the batch is. What would fail one event fails one unit of the batch (an event for one
// projection), which is retried and parked on its own, while the rest goes on.

// MetaQueued is the metadata the batched subscriber (adapters/batchsub) sets on each message:
// how many more are ready right behind it. Without it a batch is one message.
const MetaQueued = "_queued"

// batch is the content of a batch message: the entries' messages, in order.
type batch struct {
	msgs []*message.Message

	decodeOnce sync.Once
	events     []projection.Entry

	mu       sync.Mutex
	resolved []bool // acked (or nacked) on its own, before the batch message
}

type batchKey struct{}

func batchOf(msg *message.Message) (*batch, error) {
	b, ok := msg.Context().Value(batchKey{}).(*batch)
	if !ok {
		return nil, fmt.Errorf("%w: message %s is not a batch of stream entries", ErrPermanent, msg.UUID)
	}
	return b, nil
}

// resolve acks the inner message i now (every unit of its entry is done: applied or parked),
// so that a later nack of the batch does not redeliver it.
func (b *batch) resolve(i int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.resolved[i] {
		b.resolved[i] = true
		b.msgs[i].Ack()
	}
}

// resolvedNow is which inner messages were acked on their own so far (nil: none).
func (b *batch) resolvedNow() []bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !slices.Contains(b.resolved, true) {
		return nil
	}
	return slices.Clone(b.resolved)
}

// finish acks or nacks every inner message not resolved on its own.
func (b *batch) finish(ack bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for i, m := range b.msgs {
		if b.resolved[i] {
			continue
		}
		b.resolved[i] = true
		if ack {
			m.Ack()
		} else {
			m.Nack()
		}
	}
}

// batchingSubscriber groups an inner subscriber's messages into batch messages of up to max.
type batchingSubscriber struct {
	message.Subscriber
	max int
}

// batching wraps sub so that each delivered message is a batch of up to max entries.
func batching(sub message.Subscriber, max int) message.Subscriber {
	return &batchingSubscriber{Subscriber: sub, max: max}
}

// Subscribe implements message.Subscriber.
func (s *batchingSubscriber) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	in, err := s.Subscriber.Subscribe(ctx, topic)
	if err != nil {
		return nil, err
	}
	out := make(chan *message.Message)
	go func() {
		defer close(out)
		for {
			first, ok := <-in
			if !ok {
				return
			}
			msgs := []*message.Message{first}
			// Take what is ready now; never wait for more, so a quiet stream adds no latency.
			for more := queuedBehind(first); more > 0 && len(msgs) < s.max; {
				m, ok := <-in
				if !ok {
					break
				}
				msgs = append(msgs, m)
				more = queuedBehind(m)
			}
			b := &batch{msgs: msgs, resolved: make([]bool, len(msgs))}
			bm := message.NewMessage(watermill.NewUUID(), nil)
			bm.SetContext(context.WithValue(first.Context(), batchKey{}, b))
			// The router reads until this channel closes, also while it shuts down (the inner
			// subscriber then drains what it read), so a blocking send is never stuck.
			out <- bm
			go func() {
				select {
				case <-bm.Acked():
					b.finish(true)
				case <-bm.Nacked():
					b.finish(false)
				}
			}()
		}
	}()
	return out, nil
}

func queuedBehind(m *message.Message) int {
	n, err := strconv.Atoi(m.Metadata.Get(MetaQueued))
	if err != nil || n < 0 {
		return 0
	}
	return n
}

// unit is one entry of a batch for one projection version (a member, "<name>.v<N>").
type unit struct {
	entry  int
	member string
}

// attemptPlan says what one handler call does: which units (nil: every unit the membership
// gives), which entries it must not apply even when all their units succeed (one of their units
// failed for good and is not parked yet: applying the rest first could lose it), and how far it
// got (for a timeout to tell what was running).
type attemptPlan struct {
	units    []unit
	hold     map[int]bool
	progress *attemptProgress
}

type attemptProgress struct {
	flushing atomic.Bool
	current  atomic.Value // unit being handled
	units    atomic.Value // []unit: every unit of the attempt
}

// all is every unit of the attempt, as the handler worked them out.
func (p *attemptProgress) all() []unit {
	us, _ := p.units.Load().([]unit)
	return us
}

type attemptKey struct{}

func withPlan(msg *message.Message, p *attemptPlan) *message.Message {
	m := msg.Copy()
	m.SetContext(context.WithValue(msg.Context(), attemptKey{}, p))
	return m
}

func planOf(ctx context.Context) *attemptPlan {
	if p, ok := ctx.Value(attemptKey{}).(*attemptPlan); ok {
		return p
	}
	return &attemptPlan{progress: &attemptProgress{}}
}

// unitFailure is a unit whose handling failed in the last attempt.
type unitFailure struct {
	unit     unit
	err      error
	attempts int
}

// BatchFailure is what a batch handler returns when some units failed: Failed with their
// errors, Held the units that succeeded but were not applied because another unit of their entry
// failed (an entry is applied as a whole).
type BatchFailure struct {
	Failed []unitFailure
	Held   []unit
}

func (f *BatchFailure) Error() string {
	msgs := make([]string, 0, min(len(f.Failed), 3))
	for i, u := range f.Failed {
		if i == 3 {
			msgs = append(msgs, fmt.Sprintf("and %d more", len(f.Failed)-3))
			break
		}
		msgs = append(msgs, fmt.Sprintf("entry %d for %s: %v", u.unit.entry, u.unit.member, u.err))
	}
	return fmt.Sprintf("%d of the batch's units failed (%d held back): %s", len(f.Failed), len(f.Held), strings.Join(msgs, "; "))
}

func asBatchFailure(err error) (*BatchFailure, bool) {
	var bf *BatchFailure
	ok := errors.As(err, &bf)
	return bf, ok
}
