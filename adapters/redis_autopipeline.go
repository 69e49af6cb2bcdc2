package adapters

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// AutoPipeline coalesces commands of concurrent callers into pipelines: the API handles many
// requests and the router many events at once, and sending their commands one round trip each
// costs a write and a read syscall per command on both sides. Commands queue up while a pipeline
// is in flight and go out together in the next one, so under load one round trip carries up to
// maxBatch commands, while a lone command still goes out at once.
//
// A caller always waits for its command's pipeline, so a command is never written to by the
// pipeline after its caller has returned. The pipeline's deadline is the earliest deadline of
// the commands it sends (capped at maxWait): no command is written past its caller's deadline,
// which the takeover of a reservation relies on (cmd/checkins/service.go). A command whose
// caller has less than minHeadroom left when its pipeline goes out is not sent (its caller gets
// context.DeadlineExceeded, and nothing ran): one caller out of time must not set a deadline that
// fails the commands of all the others (a request whose body took its whole timeout to arrive
// would otherwise fail up to maxBatch other requests' writes, which then count as unknown
// outcomes).
type AutoPipeline struct {
	client   redis.UniversalClient
	queue    chan *pipelineCall
	maxBatch int
	maxWait  time.Duration
	stop     chan struct{}
	wg       sync.WaitGroup
	mu       sync.RWMutex
	closed   bool
}

type pipelineCall struct {
	ctx    context.Context
	cmd    redis.Cmder
	script *redis.Script // set for EVALSHA calls, to load the script on NOSCRIPT
	done   chan struct{}
}

// ErrPipelineClosed is returned for commands sent after Close.
var ErrPipelineClosed = errors.New("auto pipeline closed")

// ErrNotSent wraps the context error of a call the pipeline never sent: its caller's context
// ended while it waited for room in the queue, or too little of it was left (minHeadroom).
// Nothing of it ran, so a write it carried certainly did not happen.
var ErrNotSent = errors.New("not sent to redis")

// NewAutoPipeline starts workers goroutines, each sending pipelines of at most maxBatch commands
// on client (which must not itself route commands through this pipeline).
func NewAutoPipeline(client redis.UniversalClient, maxBatch, workers int) *AutoPipeline {
	maxBatch = max(maxBatch, 1)
	p := &AutoPipeline{client: client, queue: make(chan *pipelineCall, maxBatch*max(workers, 1)),
		maxBatch: maxBatch, maxWait: 5 * time.Second, stop: make(chan struct{})}
	for range max(workers, 1) {
		p.wg.Add(1)
		go p.worker()
	}
	return p
}

// Process sends cmd in the next pipeline and waits for its reply (set on cmd, as go-redis does).
func (p *AutoPipeline) Process(ctx context.Context, cmd redis.Cmder) error {
	return p.process(ctx, cmd, nil)
}

// Run sends one EVALSHA of script (loading it if the server lost it) and returns its reply.
func (p *AutoPipeline) Run(ctx context.Context, script *redis.Script, keys []string, args ...any) (any, error) {
	cmdArgs := make([]any, 0, 3+len(keys)+len(args))
	cmdArgs = append(cmdArgs, "evalsha", script.Hash(), len(keys))
	for _, k := range keys {
		cmdArgs = append(cmdArgs, k)
	}
	cmd := redis.NewCmd(ctx, append(cmdArgs, args...)...)
	if err := p.process(ctx, cmd, script); err != nil {
		return nil, err
	}
	return cmd.Result()
}

// Do sends one plain command (e.g. "SET", key, value, "NX"); a nil reply is redis.Nil.
func (p *AutoPipeline) Do(ctx context.Context, args ...any) (any, error) {
	cmd := redis.NewCmd(ctx, args...)
	if err := p.process(ctx, cmd, nil); err != nil {
		return nil, err
	}
	return cmd.Result()
}

func (p *AutoPipeline) process(ctx context.Context, cmd redis.Cmder, script *redis.Script) error {
	if err := ctx.Err(); err != nil {
		cmd.SetErr(err)
		return err
	}
	c := &pipelineCall{ctx: ctx, cmd: cmd, script: script, done: make(chan struct{})}
	// The read lock keeps Close from stopping the workers between the closed check and the
	// send, which would leave the call queued with nobody to run it.
	p.mu.RLock()
	if p.closed {
		p.mu.RUnlock()
		cmd.SetErr(ErrPipelineClosed)
		return ErrPipelineClosed
	}
	select {
	case p.queue <- c:
		p.mu.RUnlock()
	case <-ctx.Done():
		p.mu.RUnlock()
		err := fmt.Errorf("%w: %w", ErrNotSent, ctx.Err())
		cmd.SetErr(err)
		return err
	}
	<-c.done
	return cmd.Err()
}

// Close stops the workers after the commands already queued have run.
func (p *AutoPipeline) Close() error {
	p.mu.Lock()
	if !p.closed {
		p.closed = true
		close(p.stop)
	}
	p.mu.Unlock()
	p.wg.Wait()
	return nil
}

// Hook routes every single command of the client it is added to through p (pipelines and
// blocking reads must not use such a client). Watermill's publisher gets a client with this
// hook, so the XADDs of concurrent check-ins share round trips while each request still answers
// only after its own XADD succeeded.
func (p *AutoPipeline) Hook() redis.Hook { return pipelineHook{p} }

type pipelineHook struct{ p *AutoPipeline }

func (h pipelineHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h pipelineHook) ProcessHook(redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if x, ok := ctx.Value(xaddScriptKey{}).(*xaddScript); ok && isXAdd(cmd) {
			return h.p.xaddInScript(ctx, x, cmd)
		}
		return h.p.Process(ctx, cmd)
	}
}

// xaddScript, as a context value of an XADD sent through the hook, has the XADD run inside a
// script instead: EVALSHA script with keys then the XADD's stream as KEYS, and args then the
// XADD's arguments after the stream as ARGV. With fields, the script holds those field names
// itself: an XADD of `* f1 v1 f2 v2 ...` with exactly these fields in this order is sent as '1'
// and its values after args, any other as '0' and its arguments after the stream. The script's
// reply is a table whose last element is the XADD's reply (nil when the script decided not to
// add): it is kept in reply.
type xaddScript struct {
	script *redis.Script
	keys   []string
	args   []any
	fields []string
	reply  []any // set once the script ran
}

// xaddArgs appends the XADD's arguments after the stream (xadd) to args, as x's script takes them.
func (x *xaddScript) xaddArgs(args, xadd []any) []any {
	if x.fields == nil {
		return append(args, xadd...)
	}
	if len(xadd) == 1+2*len(x.fields) && xadd[0] == "*" {
		n := len(args)
		args = append(args, "1")
		for j, f := range x.fields {
			if xadd[1+2*j] != f {
				return append(append(args[:n], "0"), xadd...)
			}
			args = append(args, xadd[2+2*j])
		}
		return args
	}
	return append(append(args, "0"), xadd...)
}

type xaddScriptKey struct{}

// errXAddNotRun is the XADD's error when its script ran and decided not to add the entry.
var errXAddNotRun = errors.New("the script did not add the entry")

func (p *AutoPipeline) xaddInScript(ctx context.Context, x *xaddScript, cmd redis.Cmder) error {
	a := cmd.Args() // xadd stream [maxlen ...] id field value ...
	sc, ok := cmd.(*redis.StringCmd)
	if !ok || len(a) < 3 {
		err := fmt.Errorf("auto pipeline: cannot run %v in a script", a)
		cmd.SetErr(err)
		return err
	}
	stream, _ := a[1].(string)
	// Appended past x's own lengths: x.keys and x.args stay what they were.
	keys := append(x.keys, stream)
	v, err := p.Run(ctx, x.script, keys, x.xaddArgs(x.args, a[2:])...)
	if err != nil {
		cmd.SetErr(err)
		return err
	}
	vals, ok := v.([]any)
	if !ok || len(vals) == 0 {
		err := fmt.Errorf("auto pipeline: unexpected reply %v of the XADD's script", v)
		cmd.SetErr(err)
		return err
	}
	x.reply = vals
	if id, ok := vals[len(vals)-1].(string); ok {
		sc.SetVal(id)
		return nil
	}
	cmd.SetErr(errXAddNotRun)
	return errXAddNotRun
}

func (h pipelineHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

func (p *AutoPipeline) worker() {
	defer p.wg.Done()
	batch := make([]*pipelineCall, 0, p.maxBatch)
	for {
		select {
		case c := <-p.queue:
			batch = append(batch[:0], c)
		case <-p.stop:
			for {
				select {
				case c := <-p.queue:
					p.exec([]*pipelineCall{c})
				default:
					return
				}
			}
		}
	fill:
		for len(batch) < p.maxBatch {
			select {
			case c := <-p.queue:
				batch = append(batch, c)
			default:
				break fill
			}
		}
		p.exec(batch)
	}
}

func (p *AutoPipeline) exec(batch []*pipelineCall) {
	defer func() {
		for _, c := range batch {
			close(c.done)
		}
	}()
	now := time.Now()
	send, deadline := sendable(batch, now, now.Add(p.maxWait))
	if len(send) == 0 {
		return
	}
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	for attempt := 0; ; attempt++ {
		pipe := p.client.Pipeline()
		for _, c := range send {
			_ = pipe.Process(ctx, sendOnce{c.cmd})
		}
		_, _ = pipe.Exec(ctx)
		if attempt > 0 {
			return
		}
		// The server lost its script cache (restart, SCRIPT FLUSH): load the scripts and send
		// again only the commands that failed with NOSCRIPT (they ran nothing).
		send = noScript(send)
		if len(send) == 0 {
			return
		}
		loaded := map[*redis.Script]bool{}
		for _, c := range send {
			if c.script != nil && !loaded[c.script] {
				loaded[c.script] = true
				_ = c.script.Load(ctx, p.client).Err()
			}
			c.cmd.SetErr(nil)
		}
	}
}

// sendOnce is a command go-redis must not send again (Cmder.NoRetry): the client re-sent a
// whole pipeline when the reply to the first was late (a read timeout, or a connection lost after
// the write) and, on a cluster, a node's whole batch when its first command failed with TRYAGAIN
// (a slot migrating). Once Redis answered again both copies had run: an ingest script counted
// the limit twice and answered 429 (or "replayed") for the check-in its first run recorded, a
// plain XADD wrote the event twice, and another request's XADD in the batch ran up to four times
// (found by a review). The pipeline's commands are writes whose outcome a caller must learn
// once: such an error is an unknown outcome, which the idempotency records settle when the client
// retries. MOVED and ASK, which ran nothing, are still followed (go-redis sends only those
// commands again), as is the NOSCRIPT load below.
type sendOnce struct{ redis.Cmder }

func (sendOnce) NoRetry() bool { return true }

// minHeadroom is the least time a command's caller must have left for the command to be sent: a
// round trip under load takes a few milliseconds, and a pipeline's deadline is its earliest
// caller's.
const minHeadroom = 100 * time.Millisecond

// sendable is the calls of batch whose callers have minHeadroom left (the others get their
// context's error, or context.DeadlineExceeded, and are not sent), and the deadline of their
// pipeline: the earliest of theirs, capped at limit. It is batch itself when every call goes
// (the usual case: no copy on the hot path).
func sendable(batch []*pipelineCall, now, limit time.Time) ([]*pipelineCall, time.Time) {
	var send []*pipelineCall // nil until a call is left out
	deadline := limit
	for i, c := range batch {
		err := c.ctx.Err()
		d, ok := c.ctx.Deadline()
		if err == nil && ok && d.Sub(now) < minHeadroom {
			err = context.DeadlineExceeded
		}
		if err != nil {
			c.cmd.SetErr(fmt.Errorf("%w: %w", ErrNotSent, err))
			if send == nil {
				send = append(make([]*pipelineCall, 0, len(batch)), batch[:i]...)
			}
			continue
		}
		if send != nil {
			send = append(send, c)
		}
		if ok && d.Before(deadline) {
			deadline = d
		}
	}
	if send == nil {
		return batch, deadline
	}
	return send, deadline
}

func noScript(batch []*pipelineCall) []*pipelineCall {
	var out []*pipelineCall
	for _, c := range batch {
		if err := c.cmd.Err(); err != nil && c.script != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
			out = append(out, c)
		}
	}
	return out
}
