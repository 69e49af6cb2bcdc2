package adapters

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/checkins/checkins/adapters/batchsub"
	"github.com/checkins/checkins/domain"
)

// RequireReplicas makes every XADD sent through client (fenced ones too: fencedXAddScript) count
// only once n replicas have it: a pipeline holding an XADD gets `WAIT n <timeout>` appended, on
// the same connection in the same round trip, and when fewer than n replicas confirm within
// timeout, every XADD of the pipeline
// fails with an error wrapping domain.ErrNotReplicated (the entry is on the master, but may be
// lost with it in a failover). A lone XADD is sent as such a pipeline.
//
// On a cluster the hook sits on every node client (call this before the client's first
// command): go-redis splits a pipeline by node, and WAIT, which names no key, must reach the node
// that took the XADD, on the connection that carried it.
func RequireReplicas(client redis.UniversalClient, n int, timeout time.Duration) error {
	return requireReplicas(client, n, timeout, addsEntry, "RequireReplicas")
}

// RequireDeliveryReplicas makes the batched subscriber's deliveries on client count only once n
// replicas have them (batchsub.StartsLease: its XREADGROUP, XAUTOCLAIM and keep script), as
// RequireReplicas does for XADD: an entry's lease then starts only where a failover keeps it.
// Without it, a promoted replica that never saw a delivery lets another consumer read the entry
// at once, within the lease of the one that holds it. A delivery fewer replicas confirm within
// timeout fails: its entries stay in the consumer's pending list, not handed out, and the
// subscriber reads them again from there once the replicas are back (or another consumer takes
// them over after CLAIM_IDLE).
func RequireDeliveryReplicas(client redis.UniversalClient, n int, timeout time.Duration) error {
	return requireReplicas(client, n, timeout, batchsub.StartsLease, "RequireDeliveryReplicas")
}

// requireReplicas hooks a WAIT onto every pipeline of client holding a command that matches.
func requireReplicas(client redis.UniversalClient, n int, timeout time.Duration, match func(redis.Cmder) bool, what string) error {
	if n < 1 || timeout <= 0 {
		return fmt.Errorf("adapters: %s needs n >= 1 and a positive timeout, got %d and %s", what, n, timeout)
	}
	hook := func(node *redis.Client) *replicaWait {
		return &replicaWait{node: node, n: int64(n), timeout: timeout, match: match}
	}
	switch c := client.(type) {
	case *redis.Client:
		c.AddHook(hook(c))
	case *redis.ClusterClient:
		c.OnNewNode(func(node *redis.Client) { node.AddHook(hook(node)) })
	default:
		return fmt.Errorf("adapters: %s: unsupported client %T", what, client)
	}
	return nil
}

type replicaWait struct {
	node    *redis.Client
	n       int64
	timeout time.Duration
	match   func(redis.Cmder) bool // the commands that count only once replicated
}

func isXAdd(c redis.Cmder) bool { return strings.EqualFold(c.Name(), "xadd") }

// fenceRefused: c is fencedXAddScript's call, which ran and added nothing (its reply [false]):
// certainly not on the stream, which a failed WAIT must not turn into "maybe".
func fenceRefused(c redis.Cmder) bool {
	if s, ok := c.(sendOnce); ok {
		c = s.Cmder
	}
	cmd, ok := c.(*redis.Cmd)
	if !ok || !isFencedXAdd(c) {
		return false
	}
	v, ok := cmd.Val().([]any)
	return ok && len(v) == 1 && v[0] == nil
}

// addsEntry: c is an XADD, plain or fenced (fencedXAddScript).
func addsEntry(c redis.Cmder) bool { return isXAdd(c) || isFencedXAdd(c) }

func (h *replicaWait) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *replicaWait) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if !h.match(cmd) {
			return next(ctx, cmd)
		}
		pipe := h.node.Pipeline()
		_ = pipe.Process(ctx, cmd)
		_, _ = pipe.Exec(ctx) // through ProcessPipelineHook, which adds the WAIT
		return cmd.Err()
	}
}

func (h *replicaWait) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if !slices.ContainsFunc(cmds, h.match) {
			return next(ctx, cmds)
		}
		wait := redis.NewIntCmd(ctx, "wait", h.n, h.timeout.Milliseconds())
		err := next(ctx, append(cmds[:len(cmds):len(cmds)], wait))
		got, werr := wait.Result()
		if werr == nil && got >= h.n {
			return err
		}
		reason := fmt.Errorf("%w: %d of %d replicas confirmed within %s", domain.ErrNotReplicated, got, h.n, h.timeout)
		if werr != nil {
			reason = fmt.Errorf("%w: WAIT %d %d: %w", domain.ErrNotReplicated, h.n, h.timeout.Milliseconds(), werr)
		}
		for _, c := range cmds {
			if h.match(c) && c.Err() == nil && !fenceRefused(c) {
				c.SetErr(reason)
			}
		}
		if err == nil {
			err = reason
		}
		return err
	}
}
