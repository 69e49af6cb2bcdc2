package adapters

import (
	"context"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
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

// Check reads the flag once.
func (w *QuiesceWatch) Check(ctx context.Context) error {
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
