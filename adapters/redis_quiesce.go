package adapters

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/checkins/checkins/domain"
)

// QuiesceWatch tells a running process, within QuiescePoll, that it must stand still: a
// partition migration runs (the quiesce flag in <prefix>:meta), or one has changed the stream's
// partition count to another than the process runs with (it must be restarted with the new
// STREAM_PARTITIONS). The API answers 503 then and projectors stop reading.
type QuiesceWatch struct {
	client redis.UniversalClient
	keys   KeySpace
	p      int
	state  atomic.Pointer[string] // nil or "": go on
	// startCheck, until it has passed (verified), is the partition guard a start could not run.
	startCheck func(context.Context) error
	verified   atomic.Bool
	// requestTimeout, once recorded (published), is this API process's REQUEST_TIMEOUT in
	// <prefix>:meta, kept as the longest of every process's, for a migration's settle.
	requestTimeout time.Duration
	published      atomic.Bool
}

// WithRequestTimeout makes the watch record d (an API process's REQUEST_TIMEOUT) in
// <prefix>:meta, where it stays as the longest of every process's: a partition migration waits,
// after it sets the flag, for requests admitted just before to end, and the CLI that runs it
// knows only its own REQUEST_TIMEOUT. Recorded on the first check that reaches Redis.
func (w *QuiesceWatch) WithRequestTimeout(d time.Duration) *QuiesceWatch {
	w.requestTimeout = d
	return w
}

var recordLongerLua = redis.NewScript(`
local cur = tonumber(redis.call('HGET', KEYS[1], ARGV[1]) or '0') or 0
if tonumber(ARGV[2]) > cur then redis.call('HSET', KEYS[1], ARGV[1], ARGV[2]) return 1 end
return 0
`)

// notVerified is the reason a process stands still until its start check has passed.
const notVerified = "the event stream's partition count has not been checked yet (Redis was unreachable at start)"

// WithStartCheck makes the process stand still until check passes: the partition guard a start
// runs against <prefix>:meta (EnsurePartitions), when Redis did not answer at start. Until then
// the API would otherwise write check-ins to the partitions of a count the stream may not have,
// where no projection reads them. Check runs check on each poll until it passes; a mismatch is
// the reason given, naming the migration.
func (w *QuiesceWatch) WithStartCheck(check func(context.Context) error) *QuiesceWatch {
	w.startCheck = check
	r := notVerified
	w.state.Store(&r)
	return w
}

// NewQuiesceWatch watches keys' stream for a process running with keys' partitions.
func NewQuiesceWatch(client redis.UniversalClient, keys KeySpace) *QuiesceWatch {
	return &QuiesceWatch{client: client, keys: keys, p: keys.Partitions().Count()}
}

// Quiesced is why the process must stand still ("" and false: it need not).
func (w *QuiesceWatch) Quiesced() (string, bool) {
	s := w.state.Load()
	if s == nil || *s == "" {
		return "", false
	}
	return *s, true
}

// Err is Quiesced as an error (nil: go on). While the start check has not passed, it wraps
// domain.ErrUnavailable: Redis has not answered yet, nothing is being migrated.
func (w *QuiesceWatch) Err() error {
	why, ok := w.Quiesced()
	switch {
	case !ok:
		return nil
	case why == notVerified:
		return fmt.Errorf("%w: %s", domain.ErrUnavailable, why)
	}
	return errors.New(why)
}

// Check reads the flag once (after the start check, while that has not passed).
func (w *QuiesceWatch) Check(ctx context.Context) error {
	if w.startCheck != nil && !w.verified.Load() {
		if err := w.startCheck(ctx); err != nil {
			if errors.Is(err, ErrPartitionMismatch) {
				r := err.Error()
				w.state.Store(&r)
			}
			return err
		}
		w.verified.Store(true)
	}
	vals, err := w.client.HMGet(ctx, w.keys.Meta(), metaQuiesce, metaPartitions).Result()
	if err != nil {
		return err // keep the last state: Redis trouble is reported elsewhere
	}
	reason := ""
	if s, ok := vals[0].(string); ok && s != "" {
		reason = "the event stream is being migrated (" + s + ")"
	} else if s, ok := vals[1].(string); ok {
		if p, err := strconv.Atoi(s); err == nil && p != w.p {
			reason = "the event stream now has " + s + " partitions but this process runs with " + strconv.Itoa(w.p) +
				": restart it with STREAM_PARTITIONS=" + s
		}
	}
	w.state.Store(&reason)
	if w.requestTimeout > 0 && !w.published.Load() {
		if err := recordLongerLua.Run(ctx, w.client, []string{w.keys.Meta()}, metaRequestTimeout, w.requestTimeout.Milliseconds()).Err(); err != nil {
			return err // recorded on a later check
		}
		w.published.Store(true)
	}
	return nil
}

// Run checks every QuiescePoll until ctx ends.
func (w *QuiesceWatch) Run(ctx context.Context) error {
	t := time.NewTicker(QuiescePoll)
	defer t.Stop()
	for {
		cctx, cancel := context.WithTimeout(ctx, QuiescePoll)
		_ = w.Check(cctx)
		cancel()
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}
