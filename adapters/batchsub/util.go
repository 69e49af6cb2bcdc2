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
//
// Each member has a lease: a Redis time (ms) at or before the last time Redis delivered it to
// this consumer or reset its idle time (keep), so that no other consumer can take it over before
// lease + ClaimMinIdle (see Subscriber's fencing). A member another consumer took over is
// marked taken: it is let go at its next turn, neither applied, acked nor redelivered here.
type inflightSet struct {
	mu      sync.Mutex
	ids     map[string]held
	unacked int
	taken   atomic.Int32 // members marked taken (read without mu on the hot path)
	// changed is closed and replaced when the counts drop, waking everybody waiting for capacity
	// or for the drain to finish (a broadcast, unlike a buffered signal channel). It is only
	// replaced when someone took it, so the hot ack path allocates nothing while nobody waits.
	changed chan struct{}
	watched bool
	// reading is set while a read that can return members again is out (the own pending list,
	// an own XAUTOCLAIM), and gone holds the members XACKed meanwhile: Redis may have run the
	// read before the XACK, and such a member, no longer held, is no new delivery (admit).
	reading bool
	gone    map[string]struct{}
}

type held struct {
	at    int64 // when it was admitted (Unix nanoseconds)
	lease int64 // Redis ms, see inflightSet
	taken bool
	renew bool // nacked after its lease ran out: kept at the next keep, whatever HoldMax says
}

func newInflightSet(capacity int) *inflightSet {
	return &inflightSet{ids: make(map[string]held, 2*capacity), changed: make(chan struct{})}
}

// state returns the unacked count, the number of entries held, and a channel closed at the
// next decrease of either.
func (f *inflightSet) state() (unacked, held int, changed <-chan struct{}) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.watched = true
	return f.unacked, len(f.ids), f.changed
}

// admit adds ids, delivered by a command sent after Redis's clock read lease, and reports which
// of them were new. One held already (XAUTOCLAIM or the own-PEL read gave it again) is this
// consumer's again from that delivery on: its lease moves up, and it is no longer taken.
func (f *inflightSet) admit(ids []string, lease int64) []bool {
	fresh := make([]bool, len(ids))
	now := time.Now().UnixNano()
	f.mu.Lock()
	for i, id := range ids {
		h, dup := f.ids[id]
		if _, acked := f.gone[id]; !dup && acked {
			// XACKed while the read that returned it was out: its handler had it already.
			// Handed out again it was applied again, under a fresh lease (found by a review).
			continue
		}
		if !dup {
			f.ids[id] = held{at: now, lease: lease}
			f.unacked++
			fresh[i] = true
			continue
		}
		h.lease = max(h.lease, lease)
		if h.taken {
			h.taken = false
			f.taken.Add(-1)
		}
		f.ids[id] = h
	}
	f.mu.Unlock()
	return fresh
}

// heldFor splits the members not taken: those admitted at or after since (Unix nanoseconds), or
// marked by wantRenewal, whose idle time keep resets, and the others, which it only asks about.
func (f *inflightSet) heldFor(since int64) (keep, ask []string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	keep = make([]string, 0, len(f.ids))
	for id, h := range f.ids {
		switch {
		case h.taken:
		case h.at >= since || h.renew:
			keep = append(keep, id)
			if h.renew {
				h.renew = false
				f.ids[id] = h
			}
		default:
			ask = append(ask, id)
		}
	}
	return keep, ask
}

// wantRenewal marks id to be kept at the next keep, even when held longer than HoldMax: it was
// nacked after its lease ran out, so its handler is not hung, and unless it is renewed its
// writes are refused for as long as nothing claims it (this consumer's own claims wait while
// the in-flight set is full).
func (f *inflightSet) wantRenewal(id string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if h, ok := f.ids[id]; ok && !h.taken {
		h.renew = true
		f.ids[id] = h
	}
}

// renew moves the lease of the members among ids up to lease (Redis reset their idle time
// after its clock read it).
func (f *inflightSet) renew(ids []string, lease int64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, id := range ids {
		if h, ok := f.ids[id]; ok && h.lease < lease {
			h.lease = lease
			f.ids[id] = h
		}
	}
}

// markTaken marks the members among ids taken (another consumer holds them now) and returns
// them.
func (f *inflightSet) markTaken(ids []string) []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for _, id := range ids {
		if h, ok := f.ids[id]; ok {
			out = append(out, id)
			if !h.taken {
				h.taken = true
				f.ids[id] = h
				f.taken.Add(1)
			}
		}
	}
	return out
}

// isTaken says whether id is a member marked taken.
func (f *inflightSet) isTaken(id string) bool {
	if f.taken.Load() == 0 {
		return false
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.ids[id].taken
}

// lease is id's lease; ok is false when id is no member or is taken (nothing may be written
// for it any more).
func (f *inflightSet) lease(id string) (lease int64, ok bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	h, ok := f.ids[id]
	if !ok || h.taken {
		return 0, false
	}
	return h.lease, true
}

// minLease is the smallest lease of the members among ids; ok is false when none is a member.
func (f *inflightSet) minLease(ids []string) (lease int64, ok bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, id := range ids {
		if h, member := f.ids[id]; member && (!ok || h.lease < lease) {
			lease, ok = h.lease, true
		}
	}
	return lease, ok
}

// acked records that a member was acked; it stays a member until its XACK succeeded.
func (f *inflightSet) acked() {
	f.mu.Lock()
	f.unacked--
	f.notify()
	f.mu.Unlock()
}

// xacked removes members whose XACK Redis accepted, or which another consumer holds now. IDs
// that are not members (entries XAUTOCLAIM reported deleted) are ignored.
func (f *inflightSet) xacked(ids []string) {
	f.mu.Lock()
	for _, id := range ids {
		if f.ids[id].taken {
			f.taken.Add(-1)
		}
		delete(f.ids, id)
		if f.reading {
			if f.gone == nil {
				f.gone = map[string]struct{}{}
			}
			f.gone[id] = struct{}{}
		}
	}
	f.notify()
	f.mu.Unlock()
}

// beginRead marks a read out that can return members again (the own pending list, an own
// XAUTOCLAIM), until endRead; the caller holds fetchMu, so one at a time.
func (f *inflightSet) beginRead() {
	f.mu.Lock()
	f.reading = true
	f.mu.Unlock()
}

// endRead ends what beginRead began, once its entries are admitted.
func (f *inflightSet) endRead() {
	f.mu.Lock()
	f.reading = false
	clear(f.gone)
	f.mu.Unlock()
}

// drop gives up on an unacked member: it stays pending in Redis for a later delivery (here or
// by whichever consumer holds it now).
func (f *inflightSet) drop(id string) {
	f.mu.Lock()
	if h, ok := f.ids[id]; ok {
		if h.taken {
			f.taken.Add(-1)
		}
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
