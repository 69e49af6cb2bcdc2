package adapters_test

import (
	"context"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/checkins/checkins/adapters"
	"github.com/checkins/checkins/adapters/redistest"
)

// pipelineCounter counts the pipelines a client sends, to prove commands were coalesced.
type pipelineCounter struct{ pipelines, cmds atomic.Int64 }

func (c *pipelineCounter) DialHook(next redis.DialHook) redis.DialHook { return next }
func (c *pipelineCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return next
}
func (c *pipelineCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		c.pipelines.Add(1)
		c.cmds.Add(int64(len(cmds)))
		return next(ctx, cmds)
	}
}

func TestAutoPipelineHookCoalescesConcurrentCommands(t *testing.T) {
	t.Parallel()
	env := redistest.Open(t)
	exec := redistest.Client(t, env.URL)
	counter := &pipelineCounter{}
	exec.AddHook(counter)
	p := adapters.NewAutoPipeline(exec, 64, 1)
	t.Cleanup(func() { _ = p.Close() })
	hooked := redistest.Client(t, env.URL)
	hooked.AddHook(p.Hook())

	stream := env.Prefix + ":s"
	const n = 400
	var wg sync.WaitGroup
	ids := make([]string, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			id, err := hooked.XAdd(context.Background(), &redis.XAddArgs{Stream: stream, Values: []any{"i", i}}).Result()
			assert.NoError(t, err)
			ids[i] = id
		}()
	}
	wg.Wait()
	plain := redistest.Client(t, env.URL)
	assert.EqualValues(t, n, plain.XLen(context.Background(), stream).Val(), "every XADD is on the stream")
	for _, id := range ids {
		assert.NotEmpty(t, id, "each caller got its own entry ID back")
	}
	assert.GreaterOrEqual(t, counter.cmds.Load(), int64(n), "every command went through a pipeline")
	assert.Less(t, counter.pipelines.Load(), int64(n), "concurrent commands shared round trips")

	// Replies and errors reach the right caller.
	v, err := p.Do(context.Background(), "GET", env.Prefix+":missing")
	assert.Nil(t, v)
	assert.ErrorIs(t, err, redis.Nil)
	_, err = p.Do(context.Background(), "INCR", stream)
	assert.ErrorContains(t, err, "WRONGTYPE")
	require.NoError(t, p.Close())
	_, err = p.Do(context.Background(), "PING")
	assert.ErrorIs(t, err, adapters.ErrPipelineClosed)
}

func TestAutoPipelineHonoursTheCallersDeadline(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t, redistest.Options{})
	// The service's clients honour context deadlines on the socket; so does this one.
	client, err := adapters.NewRedisClient(adapters.ClientOptions{URL: srv.URL()})
	require.NoError(t, err)
	t.Cleanup(func() { _ = client.Close() })
	p := adapters.NewAutoPipeline(client, 10, 1)
	t.Cleanup(func() { _ = p.Close() })
	require.NoError(t, client.Ping(context.Background()).Err())
	// A hung server (SIGSTOP): the call must give up at its own deadline, not the pipeline's.
	require.NoError(t, srv.Signal(syscall.SIGSTOP))
	t.Cleanup(func() { _ = srv.Signal(syscall.SIGCONT) })
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	_, err = p.Do(ctx, "SET", "k", "v")
	require.Error(t, err)
	var ne net.Error
	assert.True(t, errors.Is(err, context.DeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout()),
		"the call gave up at its deadline instead of waiting for the hung server: %v", err)
	require.NoError(t, srv.Signal(syscall.SIGCONT))
	assert.Eventually(t, func() bool {
		_, err := p.Do(context.Background(), "PING")
		return err == nil
	}, 10*time.Second, 50*time.Millisecond, "works again once the server answers")
}

// TestAutoPipelineOneCallerOutOfTimeFailsNoOther: a command whose caller ran out of time while it
// waited in the queue (a request whose body took its whole timeout to arrive), or nearly, is not
// sent, and the other commands of its pipeline run and succeed. The pipeline takes the earliest
// deadline of its commands, so one such caller used to fail every command sent with it.
func TestAutoPipelineOneCallerOutOfTimeFailsNoOther(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t, redistest.Options{})
	client, err := adapters.NewRedisClient(adapters.ClientOptions{URL: srv.URL()})
	require.NoError(t, err)
	t.Cleanup(func() { _ = client.Close() })
	p := adapters.NewAutoPipeline(client, 64, 1)
	t.Cleanup(func() { _ = p.Close() })
	ctx := context.Background()
	require.NoError(t, client.Ping(ctx).Err())

	// Hold the one worker in a pipeline of its own while the others queue up behind it.
	require.NoError(t, srv.Signal(syscall.SIGSTOP))
	t.Cleanup(func() { _ = srv.Signal(syscall.SIGCONT) })
	var wg sync.WaitGroup
	wg.Go(func() {
		_, err := p.Do(ctx, "INCR", "first")
		assert.NoError(t, err)
	})
	time.Sleep(100 * time.Millisecond)
	var lateErr, tightErr error
	wg.Go(func() {
		lctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
		defer cancel()
		_, lateErr = p.Do(lctx, "INCR", "late")
	})
	wg.Go(func() { // 50 ms left when the pipeline goes out
		tctx, cancel := context.WithTimeout(ctx, 450*time.Millisecond)
		defer cancel()
		_, tightErr = p.Do(tctx, "INCR", "tight")
	})
	const others = 20
	var failed atomic.Int64
	for range others {
		wg.Go(func() {
			octx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			if _, err := p.Do(octx, "INCR", "others"); err != nil {
				failed.Add(1)
				t.Logf("another caller's command failed: %v", err)
			}
		})
	}
	time.Sleep(400 * time.Millisecond) // the late caller's deadline passes while it is queued
	require.NoError(t, srv.Signal(syscall.SIGCONT))
	wg.Wait()

	assert.Zero(t, failed.Load(), "no command failed for another caller's deadline")
	n, err := client.Get(ctx, "others").Int()
	require.NoError(t, err)
	assert.Equal(t, others, n, "every other caller's command ran once")
	assert.ErrorIs(t, lateErr, context.DeadlineExceeded, "the caller out of time gets its context's error")
	assert.ErrorIs(t, client.Get(ctx, "late").Err(), redis.Nil, "and its command was not sent")
	assert.ErrorIs(t, tightErr, context.DeadlineExceeded, "so does one with too little time left")
	assert.ErrorIs(t, client.Get(ctx, "tight").Err(), redis.Nil)
}

// TestAutoPipelineReloadsLostScripts: after SCRIPT FLUSH (a restart, a promoted replica that
// never loaded the script) the EVALSHAs of a pipeline answer NOSCRIPT; the pipeline loads the
// script and sends only those again, so each caller's script runs exactly once and gets its own
// reply, and the plain commands of the same pipeline are not sent twice.
func TestAutoPipelineReloadsLostScripts(t *testing.T) {
	t.Parallel()
	env := redistest.Open(t)
	client := redistest.Client(t, env.URL)
	p := adapters.NewAutoPipeline(client, 64, 1)
	t.Cleanup(func() { _ = p.Close() })
	ctx := context.Background()
	script := redis.NewScript(`return redis.call('INCR', KEYS[1]) * 1000 + tonumber(ARGV[1])`)
	key, plain := env.Prefix+":runs", env.Prefix+":plain"
	for round := range 3 {
		require.NoError(t, client.ScriptFlush(ctx).Err(), "round %d", round)
		const n = 50
		var wg sync.WaitGroup
		replies := make([]int64, n)
		for i := range n {
			wg.Go(func() {
				v, err := p.Run(ctx, script, []string{key}, i)
				if assert.NoError(t, err) {
					replies[i] = v.(int64)
				}
				_, err = p.Do(ctx, "INCR", plain)
				assert.NoError(t, err)
			})
		}
		wg.Wait()
		runs := map[int64]bool{}
		for i, v := range replies {
			assert.Equal(t, int64(i), v%1000, "caller %d got its own reply", i)
			runs[v/1000] = true
		}
		assert.Len(t, runs, n, "round %d: every call ran once (distinct INCR results)", round)
		assert.Equal(t, int64((round+1)*n), mustInt(t, client.Get(ctx, key)), "round %d: the script ran exactly once per call", round)
		assert.Equal(t, int64((round+1)*n), mustInt(t, client.Get(ctx, plain)), "round %d: no plain command was sent twice", round)
	}
}

func mustInt(t *testing.T, c *redis.StringCmd) int64 {
	t.Helper()
	n, err := c.Int64()
	require.NoError(t, err)
	return n
}
