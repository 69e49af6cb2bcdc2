package batchsub

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/redis/go-redis/v9"
)

// finalFlushTimeout bounds the XACK flush at the end of a subscription when Redis keeps
// failing; the acks that still could not be written are reported by Close (ErrUnflushedAcks).
const finalFlushTimeout = 5 * time.Second

// acker collects the IDs of acked messages and writes them with one XACK per batch instead of
// one round trip per message. IDs leave the in-flight set only once Redis accepted the XACK, so
// a drain is not finished before its acks are durable, and the backlog of acks waiting for a
// dead Redis is bounded (see subscription.room).
type acker struct {
	sub      *subscription
	client   redis.UniversalClient
	stream   string
	group    string
	batch    int
	interval time.Duration
	inflight *inflightSet
	log      *throttledLog
	logger   watermill.LoggerAdapter
	fields   watermill.LogFields

	mu     sync.Mutex
	ids    []string
	closed bool // after the final flush started; later acks are left pending

	notEmpty chan struct{} // cap 1: the first ID of a window arrived
	full     chan struct{} // cap 1: a whole batch is queued, flush before the window ends
	finish   chan struct{} // closed by the subscription: final flush, then stop

	unflushed int // IDs the final flush gave up on; read after run returned
}

func newAcker(sub *subscription) *acker {
	return &acker{
		sub:      sub,
		client:   sub.cfg.Client,
		stream:   sub.topic,
		group:    sub.cfg.ConsumerGroup,
		batch:    int(sub.cfg.BatchSize),
		interval: sub.cfg.AckFlushInterval,
		inflight: sub.inflight,
		log:      sub.errLog,
		logger:   sub.logger,
		fields:   sub.fields,
		notEmpty: make(chan struct{}, 1),
		full:     make(chan struct{}, 1),
		finish:   make(chan struct{}),
	}
}

// add queues an acked entry ID.
func (a *acker) add(id string) {
	a.mu.Lock()
	if a.closed {
		a.mu.Unlock()
		return
	}
	a.ids = append(a.ids, id)
	n := len(a.ids)
	a.mu.Unlock()
	if n == 1 {
		select {
		case a.notEmpty <- struct{}{}:
		default:
		}
	}
	if n >= a.batch {
		select {
		case a.full <- struct{}{}:
		default:
		}
	}
}

func (a *acker) take() []string {
	a.mu.Lock()
	ids := a.ids
	a.ids = nil
	a.mu.Unlock()
	return ids
}

// putBack returns IDs whose XACK failed, ahead of those queued meanwhile.
func (a *acker) putBack(ids []string) {
	a.mu.Lock()
	a.ids = append(ids, a.ids...)
	a.mu.Unlock()
}

// flush XACKs ids, fenced (ackScript), pipelining one call per BatchSize IDs when more have
// piled up (after an outage).
func (a *acker) flush(ctx context.Context, ids []string) error {
	chunk := min(a.batch, maxAckIDs)
	if len(ids) <= chunk {
		if err := a.xack(ctx, a.client, ids, false).Err(); err != nil {
			return fmt.Errorf("xack %d entries: %w", len(ids), err)
		}
	} else {
		_, err := a.client.Pipelined(ctx, func(p redis.Pipeliner) error {
			for start := 0; start < len(ids); start += chunk {
				a.xack(ctx, p, ids[start:min(start+chunk, len(ids))], true)
			}
			return nil
		})
		if err != nil {
			// Some XACKs of the pipeline may have succeeded; XACK is idempotent, so all are retried.
			return fmt.Errorf("xack %d entries (pipelined): %w", len(ids), err)
		}
	}
	// Those another consumer holds now were left pending to it; this one is done with them too.
	a.inflight.xacked(ids)
	return nil
}

// maxAckIDs bounds the IDs of one ackScript call (Lua's unpack takes a few thousand values).
const maxAckIDs = 1000

// xack acknowledges ids in one ackScript call, under the smallest of their leases. In a
// pipeline the script is sent whole (EVAL): a NOSCRIPT there would not be retried.
func (a *acker) xack(ctx context.Context, c redis.Scripter, ids []string, pipelined bool) *redis.Cmd {
	until := int64(0)
	if lease, ok := a.inflight.minLease(ids); ok {
		until = max(lease+a.sub.leaseSpan(), 1)
	}
	args := make([]any, 0, 3+len(ids))
	args = append(args, a.group, a.sub.cfg.Consumer, until)
	for _, id := range ids {
		args = append(args, id)
	}
	if pipelined {
		return a.sub.s.ack.Eval(ctx, c, []string{a.stream}, args...)
	}
	return a.sub.s.ack.Run(ctx, c, []string{a.stream}, args...)
}

func (a *acker) run() {
	var bo backoff
	window := time.NewTimer(time.Hour)
	window.Stop()
	for {
		select {
		case <-a.finish:
			a.final()
			return
		default:
		}
		select {
		case <-a.notEmpty:
		case <-a.finish:
			a.final()
			return
		}
		// Collect acks for one window; a full batch or the end of the subscription cuts it short.
		window.Reset(a.interval)
		select {
		case <-window.C:
		case <-a.full:
		case <-a.finish:
		}
		window.Stop()
		for {
			ids := a.take()
			if len(ids) == 0 {
				break
			}
			err := a.flush(context.Background(), ids)
			if err == nil {
				bo.reset()
				a.log.ok("XACK")
				break
			}
			// Never drop acks: keep them and retry after a backoff (or in the final flush).
			a.putBack(ids)
			a.log.fail("XACK failed; keeping the acks and retrying", err)
			if !sleep(bo.next(), a.finish) {
				break
			}
		}
	}
}

// final flushes what is left, retrying for finalFlushTimeout at most.
func (a *acker) final() {
	a.mu.Lock()
	a.closed = true
	ids := a.ids
	a.ids = nil
	a.mu.Unlock()
	if len(ids) == 0 {
		return
	}
	deadline := time.Now().Add(finalFlushTimeout)
	var bo backoff
	for {
		ctx, cancel := context.WithDeadline(context.Background(), deadline)
		err := a.flush(ctx, ids)
		cancel()
		if err == nil {
			return
		}
		d := bo.next()
		if time.Now().Add(d).After(deadline) {
			a.unflushed = len(ids)
			a.logger.Error("Giving up XACK at close; these entries stay pending and will be redelivered",
				err, a.fields.Add(watermill.LogFields{"entries": len(ids)}))
			return
		}
		time.Sleep(d)
	}
}
