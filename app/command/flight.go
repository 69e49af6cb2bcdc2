package command

import (
	"context"
	"errors"
	"sync"
)

// flightGroup lets concurrent calls with the same key share one call's outcome: the first call
// (the leader) runs, the others wait for it. Unlike x/sync/singleflight, a waiter stops waiting
// when its own context ends, and a leader that gave up because of its own context (or panicked)
// does not hand that failure to waiters whose contexts are still alive: they try again.
type flightGroup[T any] struct {
	mu sync.Mutex
	m  map[string]*flight[T]
}

type flight[T any] struct {
	done    chan struct{} // closed once val, err and retry are set
	val     T
	err     error
	retry   bool // the outcome is the leader's own: waiters run again instead of sharing it
	waiting int  // callers waiting on this flight (guarded by flightGroup.mu)
}

// do runs fn, or waits for the call already running under key and returns its outcome. leader
// reports whether this call ran fn. A waiter whose ctx ends returns ctx.Err().
func (g *flightGroup[T]) do(ctx context.Context, key string, fn func() (T, error)) (v T, leader bool, err error) {
	for {
		g.mu.Lock()
		if g.m == nil {
			g.m = make(map[string]*flight[T])
		}
		f, ok := g.m[key]
		if !ok {
			f = &flight[T]{done: make(chan struct{})}
			g.m[key] = f
			g.mu.Unlock()
			v, err = g.run(ctx, key, f, fn)
			return v, true, err
		}
		f.waiting++
		g.mu.Unlock()
		select {
		case <-f.done:
			if !f.retry {
				return f.val, false, f.err
			}
		case <-ctx.Done():
			g.mu.Lock()
			f.waiting--
			g.mu.Unlock()
			return v, false, ctx.Err()
		}
	}
}

func (g *flightGroup[T]) run(ctx context.Context, key string, f *flight[T], fn func() (T, error)) (T, error) {
	f.retry = true // stays so if fn panics
	defer func() {
		g.mu.Lock()
		delete(g.m, key)
		g.mu.Unlock()
		close(f.done)
	}()
	f.val, f.err = fn()
	// The leader's own deadline: its context ended, or a call refused to start with too little
	// of it left (the auto-pipeline sends nothing with under 100 ms to go) while it was alive.
	f.retry = f.err != nil && (ctx.Err() != nil || errors.Is(f.err, context.DeadlineExceeded) || errors.Is(f.err, context.Canceled))
	return f.val, f.err
}

// waiters counts the callers waiting on flights (tests use it to know a wait has begun).
func (g *flightGroup[T]) waiters() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	n := 0
	for _, f := range g.m {
		n += f.waiting
	}
	return n
}
