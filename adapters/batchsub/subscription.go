package batchsub

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"
)

// subscription is one Subscribe call. Its goroutines:
//
//	reader    XREADGROUP: first this consumer's own PEL ("0"), then new entries (">")
//	preparer  unmarshals the reader's batches into messages, in order, so that the next
//	          XREADGROUP overlaps with it (the reader was the bottleneck when it did both)
//	claimer   XAUTOCLAIM of idle entries of any consumer, and removal of dead consumers
//	dispatch  the only sender on out: queued entries in order, nacked ones after NackDelay
//	watch     one per handed-out message, waiting for its Ack/Nack
//	acker     batched XACK
//	keeper    keeps the entries held from being taken over while this consumer is alive
//
// Reader, preparer and claimer only produce; every entry they admit to the in-flight set is
// handed to dispatch, so an entry is in exactly one place: being prepared, queued, handed out,
// waiting for redelivery or waiting for its XACK.
type subscription struct {
	s      *Subscriber
	cfg    *Config
	client redis.UniversalClient
	logger watermill.LoggerAdapter
	topic  string
	fields watermill.LogFields
	out    chan *message.Message

	// msgCtx is every message's context. It keeps ctx's values but not its cancellation, and
	// is cancelled only when the drain times out: a handler still working on a message during
	// a clean drain must be allowed to finish, and an acked message's work is not interrupted.
	msgCtx     context.Context
	cancelMsgs context.CancelFunc

	stopReading   chan struct{} // closed when draining starts
	hardStop      chan struct{} // closed when dispatch has returned
	producersDone chan struct{} // closed when reader, preparer and claimer have returned

	raw     chan rawBatch // reader -> preparer; closed by the reader
	batches chan []*entry // preparer and claimer -> dispatch
	nacks   chan nack

	// fetchMu makes "how much room is left" and "read that many" one step for reader and
	// claimer together, so that they cannot both fill the same free slots.
	fetchMu      sync.Mutex
	inflight     *inflightSet
	acks         *acker
	errLog       *throttledLog // Redis failures
	unmarshalLog *throttledLog // poison entries

	// clock is the latest Redis time (ms) keep read, clockAt when (Unix nanoseconds, this
	// process's clock): a command sent after it was read runs at that Redis time or later.
	clock, clockAt atomic.Int64
	keepNow        chan struct{} // cap 1: run keep now (a lease of a nacked entry ran out)
}

// leaseKey is the context key of a message's lease (LeaseUntil).
type leaseKey struct{}

type leaseRef struct {
	sub *subscription
	id  string
}

// LeaseUntil is the Redis time (ms since the epoch, as TIME gives it) from which another
// consumer of the group may have taken over the entry of a message this package delivered
// (ctx is the message's context); ok is false for a message from elsewhere. Whatever a handler
// writes for the entry must not land from then on: compare it with Redis's TIME in the script
// that writes (see Fencing in the package doc). An entry another consumer holds now has a lease
// in the past.
func LeaseUntil(ctx context.Context) (until int64, ok bool) {
	l, ok := ctx.Value(leaseKey{}).(leaseRef)
	if !ok {
		return 0, false
	}
	lease, held := l.sub.inflight.lease(l.id)
	if !held {
		return 1, true
	}
	return lease + l.sub.leaseSpan(), true
}

// leaseSpan is how long (ms) after its lease an entry is still certainly this consumer's:
// ClaimMinIdle, less a margin for the clocks of a cluster's nodes (the stream's node times the
// takeover, the node of the keys written checks the lease) of a fifth of it, at most a second.
func (sub *subscription) leaseSpan() int64 {
	idle := sub.cfg.ClaimMinIdle
	return (idle - min(idle/5, time.Second)).Milliseconds()
}

// observeClock records t, a Redis time (ms) read now.
func (sub *subscription) observeClock(t int64) {
	for {
		cur := sub.clock.Load()
		if t <= cur {
			return
		}
		if sub.clock.CompareAndSwap(cur, t) {
			sub.clockAt.Store(time.Now().UnixNano())
			return
		}
	}
}

// leaseRanOut says whether e's lease has run out by this process's estimate of Redis's clock.
func (sub *subscription) leaseRanOut(e *entry) bool {
	lease, held := sub.inflight.lease(e.id)
	if !held {
		return true
	}
	now := sub.clock.Load() + (time.Now().UnixNano()-sub.clockAt.Load())/int64(time.Millisecond)
	return now >= lease+sub.leaseSpan()
}

// messageContext is the context of e's messages: the subscription's, with e's lease.
func (sub *subscription) messageContext(id string) context.Context {
	return context.WithValue(sub.msgCtx, leaseKey{}, leaseRef{sub: sub, id: id})
}

type entry struct {
	id         string
	deliveries string
	msg        *message.Message // what dispatch hands out next; replaced by a copy after a nack
}

type rawBatch struct {
	msgs        []redis.XMessage
	fresh       []bool
	redelivered bool
}

type nack struct {
	e   *entry
	msg *message.Message
}

type retryItem struct {
	e   *entry
	due time.Time
}

func newSubscription(ctx context.Context, s *Subscriber, topic string) *subscription {
	fields := watermill.LogFields{
		"provider":       "redis",
		"topic":          topic,
		"consumer_group": s.cfg.ConsumerGroup,
		"consumer":       s.cfg.Consumer,
	}
	sub := &subscription{
		s:             s,
		cfg:           &s.cfg,
		client:        s.cfg.Client,
		logger:        s.logger,
		topic:         topic,
		fields:        fields,
		out:           make(chan *message.Message),
		stopReading:   make(chan struct{}),
		hardStop:      make(chan struct{}),
		producersDone: make(chan struct{}),
		raw:           make(chan rawBatch, 1),
		batches:       make(chan []*entry, 1),
		nacks:         make(chan nack, 64),
		inflight:      newInflightSet(s.cfg.MaxInFlight),
		errLog:        &throttledLog{logger: s.logger, fields: fields, interval: errorLogInterval},
		unmarshalLog:  &throttledLog{logger: s.logger, fields: fields, interval: errorLogInterval},
		keepNow:       make(chan struct{}, 1),
	}
	sub.msgCtx, sub.cancelMsgs = context.WithCancel(context.WithoutCancel(ctx))
	sub.acks = newAcker(sub)
	return sub
}

// run drives the subscription; ctx is Subscribe's: when it is done, the subscription drains.
func (sub *subscription) run(ctx context.Context) {
	// Already closed or cancelled (Close raced with Subscribe): do not read anything at all.
	select {
	case <-ctx.Done():
		close(sub.stopReading)
	case <-sub.s.closing:
		close(sub.stopReading)
	default:
		go func() {
			select {
			case <-ctx.Done():
			case <-sub.s.closing:
			}
			close(sub.stopReading)
		}()
	}

	// ioCtx is for Redis calls. It keeps ctx's values but is not cancelled when draining starts:
	// cutting off an XREADGROUP whose entries Redis already moved to our PEL would strand them.
	ioCtx, cancelIO := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelIO()
	var producers sync.WaitGroup
	producers.Add(3)
	go func() { defer producers.Done(); defer close(sub.raw); sub.read(ioCtx) }()
	go func() { defer producers.Done(); sub.prepareLoop(ioCtx) }()
	go func() { defer producers.Done(); sub.claimLoop(ioCtx) }()
	go func() { producers.Wait(); close(sub.producersDone) }()
	ackerDone := make(chan struct{})
	go func() { defer close(ackerDone); sub.acks.run() }()
	keepDone := make(chan struct{})
	go func() { defer close(keepDone); sub.keepLoop(ioCtx) }()

	hard := sub.dispatch()
	if hard {
		unacked, _, _ := sub.inflight.state()
		sub.logger.Error("Drain timed out; unacked entries stay pending and will be redelivered",
			nil, sub.fields.Add(watermill.LogFields{"entries": unacked, "drain_timeout": sub.cfg.DrainTimeout.String()}))
		sub.cancelMsgs()
	}
	close(sub.hardStop)
	cancelIO() // after a clean drain the producers are gone already; after a hard one, hurry them
	<-sub.producersDone
	<-keepDone
	close(sub.acks.finish)
	<-ackerDone

	var err error
	if n := sub.acks.unflushed; n > 0 {
		err = fmt.Errorf("%w: %d entries of %q stay pending", ErrUnflushedAcks, n, sub.topic)
	}
	if !hard && err == nil {
		sub.removeSelfIfIdle(ctx)
	}
	sub.logger.Info("Subscription closed", sub.fields.Add(watermill.LogFields{"drain_timed_out": hard}))
	sub.s.unregister(sub.topic, err)
	close(sub.out)
	sub.s.wg.Done()
}

// dispatch hands entries out on the unbuffered out channel until the subscription has drained
// (clean, returns false) or DrainTimeout passed (returns true).
func (sub *subscription) dispatch() (hard bool) {
	var (
		queue    fifo[*entry]    // stream order
		retries  fifo[retryItem] // NackDelay is constant, so due times only grow
		timer    = time.NewTimer(time.Hour)
		timerDue time.Time
		draining bool
		stop     = sub.stopReading   // nil once draining
		produced = sub.producersDone // nil once reader, preparer and claimer are gone
		drainT   *time.Timer
		deadline <-chan time.Time
	)
	timer.Stop()
	defer func() {
		timer.Stop()
		if drainT != nil {
			drainT.Stop()
		}
	}()

	for {
		var (
			next      *entry
			fromRetry bool
			timerC    <-chan time.Time
		)
		if retries.len() > 0 {
			if due := retries.peek().due; !time.Now().Before(due) {
				next, fromRetry = retries.peek().e, true
			} else {
				if !timerDue.Equal(due) {
					timer.Reset(time.Until(due))
					timerDue = due
				}
				timerC = timer.C
			}
		}
		if next == nil && queue.len() > 0 {
			next = queue.peek()
		}
		if fromRetry && sub.inflight.isTaken(next.id) {
			// Another consumer took it over while this one stood still: it is that one's now.
			// (Only a redelivery is let go here: the queue's entries were counted in the
			// MetaQueued of a message handed out already, and must come. Handed out, a taken
			// entry's writes are refused and its nack lets it go.)
			retries.pop()
			sub.inflight.drop(next.id)
			continue
		}
		var (
			out chan<- *message.Message
			msg *message.Message
		)
		if next != nil {
			out, msg = sub.out, next.msg
			// How many more are ready right behind this one: a consumer batching messages
			// can take them without waiting to see whether another comes.
			queued := queue.len()
			if !fromRetry {
				queued--
			}
			msg.Metadata.Set(MetaQueued, strconv.Itoa(queued))
		}

		var changed <-chan struct{}
		if draining && produced == nil {
			// Everything read is in the in-flight set until XACKed or given up on, so an empty
			// set with no producer left means the drain is complete.
			_, held, ch := sub.inflight.state()
			if held == 0 {
				return false
			}
			changed = ch
		}

		select {
		case out <- msg:
			if fromRetry {
				retries.pop()
			} else {
				queue.pop()
			}
			go sub.watch(next, msg)
		case b := <-sub.batches:
			queue.push(b...)
		case n := <-sub.nacks:
			if draining {
				// The handler failed and we are shutting down: leave the entry in our PEL, where
				// XAUTOCLAIM (or this consumer after a restart) picks it up again.
				sub.inflight.drop(n.e.id)
				continue
			}
			if sub.inflight.isTaken(n.e.id) {
				sub.inflight.drop(n.e.id)
				continue
			}
			if sub.leaseRanOut(n.e) {
				// Its writes were refused, most likely: keep now tells whether it is still this
				// consumer's (and renews its lease, even past HoldMax: its handler is not hung) or
				// another's (and lets it go).
				sub.inflight.wantRenewal(n.e.id)
				select {
				case sub.keepNow <- struct{}{}:
				default:
				}
			}
			n.e.msg = sub.redelivery(n.e, n.msg)
			retries.push(retryItem{e: n.e, due: time.Now().Add(sub.cfg.NackDelay)})
		case <-timerC:
			timerDue = time.Time{}
		case <-stop:
			draining, stop = true, nil
			// Entries waiting for a redelivery failed already; do not retry them during the drain.
			for retries.len() > 0 {
				sub.inflight.drop(retries.peek().e.id)
				retries.pop()
			}
			timer.Stop()
			timerDue = time.Time{}
			drainT = time.NewTimer(sub.cfg.DrainTimeout)
			deadline = drainT.C
		case <-produced:
			produced = nil
		case <-changed:
		case <-deadline:
			return true
		}
	}
}

// redelivery prepares a nacked message for another round: fresh ack channels, and our
// metadata restored in case a handler or middleware changed it.
func (sub *subscription) redelivery(e *entry, prev *message.Message) *message.Message {
	msg := prev.Copy()
	msg.Metadata.Set(MetaStream, sub.topic)
	msg.Metadata.Set(MetaEntryID, e.id)
	msg.Metadata.Set(MetaDeliveries, e.deliveries)
	msg.SetContext(sub.messageContext(e.id))
	return msg
}

// watch waits for the outcome of one handed-out message. One goroutine per message is what
// lets a slow or nacked message not hold up the acks of those behind it.
func (sub *subscription) watch(e *entry, msg *message.Message) {
	select {
	case <-msg.Acked():
		sub.inflight.acked()
		sub.acks.add(e.id)
	case <-msg.Nacked():
		select {
		case sub.nacks <- nack{e: e, msg: msg}:
		case <-sub.hardStop:
		}
	case <-sub.hardStop:
	}
}

// waitCapacity blocks until at least need entries may be fetched; false when draining.
func (sub *subscription) waitCapacity(need int) bool {
	for {
		select {
		case <-sub.stopReading:
			return false
		default:
		}
		unacked, held, changed := sub.inflight.state()
		if sub.free(unacked, held) >= need {
			return true
		}
		select {
		case <-changed:
		case <-sub.stopReading:
			return false
		}
	}
}

// free is how many entries may be fetched: MaxInFlight bounds the unacked ones, and the acked
// ones still waiting for their XACK may add up to MaxInFlight more. Normally that backlog is one
// flush window; the second bound stops reading when XACKs fail but reads somehow do not.
func (sub *subscription) free(unacked, held int) int {
	return min(sub.cfg.MaxInFlight-unacked, 2*sub.cfg.MaxInFlight-held)
}

// room is how many entries to fetch now; call with fetchMu held.
func (sub *subscription) room() int64 {
	unacked, held, _ := sub.inflight.state()
	return min(sub.cfg.BatchSize, int64(sub.free(unacked, held)))
}

func (sub *subscription) read(ctx context.Context) {
	var bo backoff
	// Wait for room for a good part of a batch rather than reading a few entries per freed slot,
	// but not for a whole one, so the next batch arrives before the queue runs dry.
	threshold := int(min(sub.cfg.BatchSize, int64(max(1, sub.cfg.MaxInFlight/4))))
	// Start with this consumer's own pending entries: a restarted process with a stable
	// consumer name resumes what it had read and not acked.
	ownPEL, lastID := true, "0"
	lingerBelow := max(1, int(sub.cfg.BatchSize/4))
	for {
		if !sub.waitCapacity(threshold) {
			return
		}
		if !ownPEL && sub.cfg.Paused != nil && sub.cfg.Paused() {
			if !sleep(sub.cfg.BlockTime, sub.stopReading) {
				return
			}
			continue
		}
		args := &redis.XReadGroupArgs{
			Group:    sub.cfg.ConsumerGroup,
			Consumer: sub.cfg.Consumer,
			Streams:  []string{sub.topic, ">"},
			Block:    sub.cfg.BlockTime,
		}
		if ownPEL {
			args.Streams[1] = lastID
			args.Block = -1 // ignored by Redis for the PEL, and go-redis then uses the plain read timeout
		}

		if sub.clock.Load() == 0 && !sub.keep(ctx) {
			// Nothing is read before Redis's clock is known: it is what the leases start from.
			if !sleep(bo.next(), sub.stopReading) {
				return
			}
			continue
		}
		sub.fetchMu.Lock()
		if args.Count = sub.room(); args.Count <= 0 {
			sub.fetchMu.Unlock()
			continue
		}
		lease := sub.clock.Load()
		if ownPEL {
			sub.inflight.beginRead()
		}
		res, err := sub.client.XReadGroup(ctx, args).Result()
		var (
			read  []redis.XMessage // what the read returned (the PEL cursor moves past all of it)
			msgs  []redis.XMessage // what is handed out
			fresh []bool
		)
		if err == nil && len(res) > 0 {
			read = res[0].Messages
			msgs = read
			if ownPEL && len(msgs) > 0 {
				msgs, lease, err = sub.renewRead(ctx, msgs)
			}
			if err == nil {
				fresh = sub.inflight.admit(entryIDs(msgs), lease)
			}
		}
		if ownPEL {
			sub.inflight.endRead()
		}
		sub.fetchMu.Unlock()

		if errors.Is(err, redis.Nil) { // BLOCK timed out
			bo.reset()
			sub.errLog.ok("XREADGROUP")
			continue
		}
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			sub.redisFailed(ctx, "XREADGROUP failed; backing off", err)
			if !sleep(bo.next(), sub.stopReading) {
				return
			}
			// A read whose reply was lost (connection cut mid-answer) still put its entries in
			// this consumer's PEL: go through the PEL again so they are not left to the takeover
			// after CLAIM_IDLE. Entries already in flight are not delivered twice (admit).
			ownPEL, lastID = true, "0"
			continue
		}
		bo.reset()
		sub.errLog.ok("XREADGROUP")
		if ownPEL {
			if len(read) == 0 {
				ownPEL = false
				continue
			}
			lastID = read[len(read)-1].ID
			if len(msgs) == 0 {
				continue
			}
		}
		select {
		case sub.raw <- rawBatch{msgs: msgs, fresh: fresh, redelivered: ownPEL}:
		case <-sub.hardStop:
			return
		}
		if sub.cfg.ReadLinger > 0 && !ownPEL && len(msgs) < lingerBelow {
			// A few entries: more are likely on their way. Let them gather for one batch.
			if !sleep(sub.cfg.ReadLinger, sub.stopReading) {
				return
			}
		}
	}
}

// prepareLoop turns the reader's batches into messages and hands them to dispatch, in order.
func (sub *subscription) prepareLoop(ctx context.Context) {
	for rb := range sub.raw {
		if !sub.hand(sub.prepare(ctx, rb.msgs, rb.fresh, rb.redelivered)) {
			return
		}
	}
}

func (sub *subscription) claimLoop(ctx context.Context) {
	ticker := time.NewTicker(sub.cfg.ClaimInterval)
	defer ticker.Stop()
	for {
		if !sub.claimRound(ctx) {
			return
		}
		sub.removeIdleConsumers(ctx)
		select {
		case <-ticker.C:
		case <-sub.stopReading:
			return
		}
	}
}

// claimRound takes over every entry of the group idle for ClaimMinIdle, walking the XAUTOCLAIM
// cursor, as far as MaxInFlight allows (it waits for room rather than skipping, so a busy
// consumer still rescues a dead one's entries). False when the subscription stops.
func (sub *subscription) claimRound(ctx context.Context) bool {
	cursor := "0-0"
	claimed := 0
	defer func() {
		if claimed > 0 {
			sub.logger.Info("Took over idle pending entries", sub.fields.Add(watermill.LogFields{"entries": claimed}))
		}
	}()
	for {
		if !sub.waitCapacity(1) {
			return false
		}
		if sub.clock.Load() == 0 && !sub.keep(ctx) {
			return true // Redis's clock is not known yet: the leases start from it
		}
		sub.fetchMu.Lock()
		count := sub.room()
		if count <= 0 {
			sub.fetchMu.Unlock()
			continue
		}
		lease := sub.clock.Load()
		sub.inflight.beginRead()
		msgs, next, deleted, err := sub.client.XAutoClaimWithDeleted(ctx, &redis.XAutoClaimArgs{
			Stream:   sub.topic,
			Group:    sub.cfg.ConsumerGroup,
			Consumer: sub.cfg.Consumer,
			MinIdle:  sub.cfg.ClaimMinIdle,
			Start:    cursor,
			Count:    count,
		}).Result()
		var fresh []bool
		if err == nil {
			fresh = sub.inflight.admit(entryIDs(msgs), lease)
		}
		sub.inflight.endRead()
		sub.fetchMu.Unlock()

		if err != nil {
			if ctx.Err() != nil {
				return false
			}
			sub.redisFailed(ctx, "XAUTOCLAIM failed; retrying at the next claim interval", err)
			return true
		}
		sub.errLog.ok("XAUTOCLAIM")
		// Entries deleted from the stream can never be processed. Redis 7 already dropped
		// them from the PEL; the XACK makes sure of it (and is what older servers need). One
		// this consumer still holds (its handler past HoldMax, say) is let go like one taken
		// over: its writes are refused, and it leaves the in-flight set when it is acked or
		// nacked, not before (its unacked slot with it).
		for _, id := range deleted {
			if held := sub.inflight.markTaken([]string{id}); len(held) == 0 {
				sub.acks.add(id)
			}
		}
		batch := sub.prepare(ctx, msgs, fresh, true)
		claimed += len(batch)
		if !sub.hand(batch) {
			return false
		}
		if next == "0-0" || next == "" {
			return true
		}
		cursor = next
	}
}

// keepLoop keeps the entries this consumer holds from being taken over (Config.HoldMax), and
// reads Redis's clock for the leases, every ClaimMinIdle/3 and whenever a nacked entry's lease
// ran out, until ctx ends (after the drain).
func (sub *subscription) keepLoop(ctx context.Context) {
	ticker := time.NewTicker(max(sub.cfg.ClaimMinIdle/3, time.Millisecond))
	defer ticker.Stop()
	for {
		select {
		case <-ticker.C:
		case <-sub.keepNow:
		case <-ctx.Done():
			return
		}
		sub.keep(ctx)
	}
}

// keep reads Redis's clock, resets the idle time of the entries held for less than HoldMax
// that are still pending to this consumer (renewing their leases), and marks taken those that
// another consumer took over. False when Redis could not be asked.
func (sub *subscription) keep(ctx context.Context) bool {
	var keep, ask []string
	if sub.cfg.HoldMax < 0 {
		keep, ask = sub.inflight.heldFor(math.MaxInt64) // only those wantRenewal marked
	} else {
		keep, ask = sub.inflight.heldFor(time.Now().Add(-sub.cfg.HoldMax).UnixNano())
	}
	args := make([]any, 0, 3+len(keep)+len(ask))
	args = append(args, sub.cfg.ConsumerGroup, sub.cfg.Consumer, len(keep))
	for _, id := range keep {
		args = append(args, id)
	}
	for _, id := range ask {
		args = append(args, id)
	}
	now, gone, renewed, err := sub.runKeep(ctx, args)
	if err != nil {
		if ctx.Err() == nil {
			sub.redisFailed(ctx, "could not keep the entries held from being taken over; retrying at the next interval", err)
		}
		return false
	}
	sub.errLog.ok("keep")
	sub.inflight.renew(renewed, now)
	// Gone are the entries XACKed since the snapshot, and any that another consumer took over
	// while this one did not keep them (stood still longer than ClaimMinIdle): it may be
	// applying them, or have applied and acknowledged them, and this one must let them go.
	// Those still held here are the latter.
	if taken := sub.inflight.markTaken(gone); len(taken) > 0 {
		sub.logger.Info("Entries held here are no longer this consumer's (another took them over, or acknowledged them, while this one stood still longer than ClaimMinIdle); letting them go",
			sub.fields.Add(watermill.LogFields{"entries": len(taken), "first": taken[0]}))
	}
	return true
}

// renewRead starts again the leases of msgs, entries read from this consumer's own pending list.
// Redis replicates no such read: it reset their idle time on the master alone, and after a
// failover a replica would still count it from their last delivery, and let another consumer
// take them over within the lease the read would give. The keep script resets their idle time
// in a way that is replicated (and, where deliveries must be, confirmed by the replicas before
// it answers); their leases start at its clock. Entries no longer this consumer's are left out.
func (sub *subscription) renewRead(ctx context.Context, msgs []redis.XMessage) ([]redis.XMessage, int64, error) {
	args := make([]any, 0, 3+len(msgs))
	args = append(args, sub.cfg.ConsumerGroup, sub.cfg.Consumer, len(msgs))
	for _, m := range msgs {
		args = append(args, m.ID)
	}
	now, _, renewed, err := sub.runKeep(ctx, args)
	if err != nil {
		return nil, 0, fmt.Errorf("renew the leases of entries read again: %w", err)
	}
	ours := make(map[string]bool, len(renewed))
	for _, id := range renewed {
		ours[id] = true
	}
	kept := msgs[:0:0]
	for _, m := range msgs {
		if ours[m.ID] {
			kept = append(kept, m)
		}
	}
	return kept, now, nil
}

// runKeep runs the keep script (keepScript; args from ARGV[1] on) and observes the clock it read:
// now, the IDs no longer this consumer's (gone), and those whose leases start again at now.
func (sub *subscription) runKeep(ctx context.Context, args []any) (now int64, gone, renewed []string, err error) {
	reply, err := sub.s.keep.Run(ctx, sub.client, []string{sub.topic}, args...).Slice()
	if err != nil {
		return 0, nil, nil, err
	}
	var ngone int64
	var ok, ok2 bool
	if len(reply) >= 2 {
		now, ok = reply[0].(int64)
		ngone, ok2 = reply[1].(int64)
	}
	if !ok || !ok2 || ngone < 0 || int(ngone) > len(reply)-2 {
		return 0, nil, nil, fmt.Errorf("keep: unexpected reply %v", reply)
	}
	sub.observeClock(now)
	ids := make([]string, 0, len(reply)-2)
	for _, v := range reply[2:] {
		if id, ok := v.(string); ok {
			ids = append(ids, id)
		}
	}
	n := min(int(ngone), len(ids))
	return now, ids[:n], ids[n:], nil
}

// removeIdleConsumers deletes consumers of the group (not this one) that have nothing pending
// and have been idle longer than ConsumerIdleRemove, e.g. crashed processes whose entries were
// taken over. The delete is a script that re-checks the PEL atomically, because DELCONSUMER
// drops the consumer's pending entries with it.
func (sub *subscription) removeIdleConsumers(ctx context.Context) {
	if sub.cfg.ConsumerIdleRemove < 0 {
		return
	}
	consumers, err := sub.client.XInfoConsumers(ctx, sub.topic, sub.cfg.ConsumerGroup).Result()
	if err != nil {
		if ctx.Err() == nil {
			sub.redisFailed(ctx, "XINFO CONSUMERS failed", err)
		}
		return
	}
	for _, c := range consumers {
		if c.Name == sub.cfg.Consumer || c.Pending > 0 || c.Idle <= sub.cfg.ConsumerIdleRemove {
			continue
		}
		if sub.deleteConsumerIfIdle(ctx, c.Name) {
			sub.logger.Info("Removed idle consumer from the group", sub.fields.Add(watermill.LogFields{
				"removed_consumer": c.Name, "idle": c.Idle.String(),
			}))
		}
	}
}

// removeSelfIfIdle deletes this consumer after a clean end if it holds no pending entry, so that
// short-lived consumers with generated names do not pile up in the group.
func (sub *subscription) removeSelfIfIdle(ctx context.Context) {
	if sub.cfg.ConsumerIdleRemove < 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
	defer cancel()
	sub.deleteConsumerIfIdle(ctx, sub.cfg.Consumer)
}

func (sub *subscription) deleteConsumerIfIdle(ctx context.Context, name string) bool {
	res, err := sub.s.delIfIdle.Run(ctx, sub.client, []string{sub.topic}, sub.cfg.ConsumerGroup, name).Int64()
	if err != nil {
		if ctx.Err() == nil {
			sub.logger.Error("Could not remove idle consumer", err, sub.fields.Add(watermill.LogFields{"removed_consumer": name}))
		}
		return false
	}
	return res >= 0
}

// redisFailed logs (throttled) and recreates the consumer group when Redis lost it, e.g.
// after a restart without persistence.
func (sub *subscription) redisFailed(ctx context.Context, msg string, err error) {
	sub.errLog.fail(msg, err)
	if !isNoGroup(err) {
		return
	}
	created, cerr := sub.s.createGroup(ctx, sub.topic)
	if cerr != nil {
		sub.errLog.fail("Recreating the consumer group failed", cerr)
		return
	}
	if created {
		sub.logger.Info("Consumer group was missing (Redis lost its data?); recreated it",
			sub.fields.Add(watermill.LogFields{"oldest_id": sub.cfg.OldestID}))
	}
}

// hand passes a batch to dispatch; false if the subscription ended meanwhile (the entries stay
// in our PEL for XAUTOCLAIM).
func (sub *subscription) hand(batch []*entry) bool {
	if len(batch) == 0 {
		return true
	}
	select {
	case sub.batches <- batch:
		return true
	case <-sub.hardStop:
		return false
	}
}

// prepare turns the freshly admitted entries of msgs into messages. redelivered marks entries
// that were delivered before (own PEL, XAUTOCLAIM), whose delivery count is asked from Redis.
func (sub *subscription) prepare(ctx context.Context, msgs []redis.XMessage, fresh []bool, redelivered bool) []*entry {
	var counts map[string]int64
	if redelivered {
		ids := make([]string, 0, len(msgs))
		for i, xm := range msgs {
			if fresh[i] && xm.Values != nil {
				ids = append(ids, xm.ID)
			}
		}
		counts = sub.deliveryCounts(ctx, ids)
	}
	batch := make([]*entry, 0, len(msgs))
	for i, xm := range msgs {
		if !fresh[i] {
			continue // we hold it already (handed out, or waiting for a redelivery or its XACK)
		}
		if xm.Values == nil {
			// Pending entry deleted from the stream (XDEL/XTRIM): nothing to process, but it has
			// to leave the PEL. The acker's XACK also takes it out of the in-flight set.
			sub.inflight.acked()
			sub.acks.add(xm.ID)
			continue
		}
		deliveries := "1"
		if redelivered {
			// If XPENDING failed we only know it was delivered before, so report the lower bound.
			deliveries = "2"
			if n, ok := counts[xm.ID]; ok {
				deliveries = strconv.FormatInt(n, 10)
			}
		}
		batch = append(batch, sub.newEntry(xm, deliveries))
	}
	return batch
}

// deliveryCounts asks XPENDING for the delivery count of each id (pipelined, one round trip).
// Only used for redeliveries, which are rare.
func (sub *subscription) deliveryCounts(ctx context.Context, ids []string) map[string]int64 {
	if len(ids) == 0 {
		return nil
	}
	cmds, err := sub.client.Pipelined(ctx, func(p redis.Pipeliner) error {
		for _, id := range ids {
			p.XPendingExt(ctx, &redis.XPendingExtArgs{
				Stream: sub.topic, Group: sub.cfg.ConsumerGroup, Start: id, End: id, Count: 1,
			})
		}
		return nil
	})
	if err != nil && ctx.Err() == nil {
		sub.errLog.fail("XPENDING for delivery counts failed; reporting a lower bound", err)
	}
	counts := make(map[string]int64, len(ids))
	for _, c := range cmds {
		pc, ok := c.(*redis.XPendingExtCmd)
		if !ok {
			continue
		}
		if res, err := pc.Result(); err == nil && len(res) == 1 {
			counts[res[0].ID] = res[0].RetryCount
		}
	}
	return counts
}

func (sub *subscription) newEntry(xm redis.XMessage, deliveries string) *entry {
	msg, err := sub.unmarshal(xm.Values)
	if err != nil {
		// Never stop on a poison entry (the stock subscriber ends the subscription here). Hand it
		// out flagged, with its raw fields, so a middleware can park it and ack it.
		sub.unmarshalLog.fail("Cannot unmarshal stream entry; delivering it flagged with "+MetaUnmarshalErr,
			fmt.Errorf("entry %s: %w", xm.ID, err))
		msg = message.NewMessage(xm.ID, message.Payload{})
		msg.Metadata.Set(MetaUnmarshalErr, err.Error())
		for k, v := range xm.Values {
			msg.Metadata.Set(MetaRawPrefix+k, rawString(v))
		}
	}
	if msg.Metadata == nil {
		msg.Metadata = make(message.Metadata, 3)
	}
	msg.Metadata.Set(MetaStream, sub.topic)
	msg.Metadata.Set(MetaEntryID, xm.ID)
	msg.Metadata.Set(MetaDeliveries, deliveries)
	msg.SetContext(sub.messageContext(xm.ID))
	return &entry{id: xm.ID, deliveries: deliveries, msg: msg}
}

// unmarshal turns a panicking Unmarshaller (the default one type-asserts field values) into an
// error, since a panic would take the whole process down on one bad entry.
func (sub *subscription) unmarshal(values map[string]interface{}) (msg *message.Message, err error) {
	defer func() {
		if r := recover(); r != nil {
			msg, err = nil, fmt.Errorf("unmarshaller panicked: %v", r)
		}
	}()
	msg, err = sub.cfg.Unmarshaller.Unmarshal(values)
	if err == nil && msg == nil {
		err = errors.New("unmarshaller returned no message")
	}
	return msg, err
}

func rawString(v interface{}) string {
	if s, ok := v.(string); ok {
		return s
	}
	return fmt.Sprint(v)
}

func entryIDs(msgs []redis.XMessage) []string {
	ids := make([]string, len(msgs))
	for i, m := range msgs {
		ids[i] = m.ID
	}
	return ids
}
