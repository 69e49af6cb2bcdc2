package batchsub

import (
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
)

// inflightSet tracks the entries a subscription has read from Redis.
//
// ids holds every entry until it is XACKed or given up on: its membership deduplicates entries
// that XAUTOCLAIM or the own-PEL read hand us again while we still hold them, and an empty set is
// what "drained" means. unacked counts the members not yet acked by a handler (queued, handed
// out, or waiting for a nack redelivery); that is what MaxInFlight bounds. Acked entries only
// wait for the next XACK flush, and gating reads on that round trip would stall the pipeline.
type inflightSet struct {
	mu      sync.Mutex
	ids     map[string]int64 // -> when it was admitted (Unix nanoseconds)
	unacked int
	// changed is closed and replaced when the counts drop, waking everybody waiting for capacity
	// or for the drain to finish (a broadcast, unlike a buffered signal channel). It is only
	// replaced when someone took it, so the hot ack path allocates nothing while nobody waits.
	changed chan struct{}
	watched bool
}

func newInflightSet(capacity int) *inflightSet {
	return &inflightSet{ids: make(map[string]int64, 2*capacity), changed: make(chan struct{})}
}

// state returns the unacked count, the number of entries held, and a channel closed at the
// next decrease of either.
func (f *inflightSet) state() (unacked, held int, changed <-chan struct{}) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.watched = true
	return f.unacked, len(f.ids), f.changed
}

// admit adds ids and reports which of them were new.
func (f *inflightSet) admit(ids []string) []bool {
	fresh := make([]bool, len(ids))
	now := time.Now().UnixNano()
	f.mu.Lock()
	for i, id := range ids {
		if _, dup := f.ids[id]; !dup {
			f.ids[id] = now
			f.unacked++
			fresh[i] = true
		}
	}
	f.mu.Unlock()
	return fresh
}

// heldSince is the members admitted at or after since (Unix nanoseconds).
func (f *inflightSet) heldSince(since int64) []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	ids := make([]string, 0, len(f.ids))
	for id, at := range f.ids {
		if at >= since {
			ids = append(ids, id)
		}
	}
	return ids
}

// stillHeld is those of ids that are members.
func (f *inflightSet) stillHeld(ids []string) []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for _, id := range ids {
		if _, ok := f.ids[id]; ok {
			out = append(out, id)
		}
	}
	return out
}

// acked records that a member was acked; it stays a member until its XACK succeeded.
func (f *inflightSet) acked() {
	f.mu.Lock()
	f.unacked--
	f.notify()
	f.mu.Unlock()
}

// xacked removes members whose XACK Redis accepted. IDs that are not members (entries XAUTOCLAIM
// reported deleted) are ignored.
func (f *inflightSet) xacked(ids []string) {
	f.mu.Lock()
	for _, id := range ids {
		delete(f.ids, id)
	}
	f.notify()
	f.mu.Unlock()
}

// drop gives up on an unacked member: it stays pending in Redis for a later delivery.
func (f *inflightSet) drop(id string) {
	f.mu.Lock()
	if _, ok := f.ids[id]; ok {
		delete(f.ids, id)
		f.unacked--
	}
	f.notify()
	f.mu.Unlock()
}

func (f *inflightSet) notify() {
	if f.watched {
		close(f.changed)
		f.changed = make(chan struct{})
		f.watched = false
	}
}

// backoff yields 100ms doubling to 5s, jittered to [d/2, d] so that many consumers hitting the
// same dead Redis do not retry in lockstep.
type backoff struct{ cur time.Duration }

const (
	backoffMin = 100 * time.Millisecond
	backoffMax = 5 * time.Second
)

func (b *backoff) next() time.Duration {
	if b.cur == 0 {
		b.cur = backoffMin
	} else {
		b.cur = min(2*b.cur, backoffMax)
	}
	half := b.cur / 2
	return half + rand.N(half+1) // #nosec G404 -- backoff jitter, not a secret
}

func (b *backoff) reset() { b.cur = 0 }

// sleep waits d or until stop is closed; it reports whether the full d elapsed.
func sleep(d time.Duration, stop <-chan struct{}) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-stop:
		return false
	}
}

// throttledLog logs a failing Redis at most once per interval instead of once per attempt (an
// outage would otherwise produce a log line every backoff step from every goroutine), and says
// once when things work again.
type throttledLog struct {
	logger     watermill.LoggerAdapter
	fields     watermill.LogFields
	interval   time.Duration
	failing    atomic.Bool // fast path for ok(), which runs after every successful call
	mu         sync.Mutex
	last       time.Time
	suppressed int
}

const errorLogInterval = 5 * time.Second

func (l *throttledLog) fail(msg string, err error) {
	l.failing.Store(true)
	l.mu.Lock()
	now := time.Now()
	if !l.last.IsZero() && now.Sub(l.last) < l.interval {
		l.suppressed++
		l.mu.Unlock()
		return
	}
	suppressed := l.suppressed
	l.suppressed = 0
	l.last = now
	l.mu.Unlock()
	l.logger.Error(msg, err, l.fields.Add(watermill.LogFields{
		"suppressed_errors": suppressed,
		"next_log_in":       l.interval.String(),
	}))
}

func (l *throttledLog) ok(what string) {
	if !l.failing.Load() {
		return
	}
	l.mu.Lock()
	if !l.failing.Load() {
		l.mu.Unlock()
		return
	}
	l.failing.Store(false)
	suppressed := l.suppressed
	l.suppressed = 0
	// last is kept: a flapping connection must not turn into one error line per flap.
	l.mu.Unlock()
	l.logger.Info("Redis works again: "+what, l.fields.Add(watermill.LogFields{"suppressed_errors": suppressed}))
}

// fifo is a queue over a slice. Its consumed prefix is reclaimed on push once it is at least
// half of the slice, so a queue that never quite empties (steady load) does not grow forever,
// and the copying stays amortised O(1) per element.
type fifo[T any] struct {
	items []T
	head  int
}

func (q *fifo[T]) len() int { return len(q.items) - q.head }

func (q *fifo[T]) peek() T { return q.items[q.head] }

func (q *fifo[T]) pop() {
	var zero T
	q.items[q.head] = zero // let the GC have it
	if q.head++; q.head == len(q.items) {
		q.items, q.head = q.items[:0], 0
	}
}

func (q *fifo[T]) push(v ...T) {
	if q.head > 0 && q.head >= len(q.items)/2 {
		n := copy(q.items, q.items[q.head:])
		clear(q.items[n:])
		q.items, q.head = q.items[:n], 0
	}
	q.items = append(q.items, v...)
}
