package batchsub_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-redisstream/pkg/redisstream"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/checkins/checkins/adapters/batchsub"
	"github.com/checkins/checkins/adapters/redistest"
)

const (
	group       = "projections"
	waitFor     = 15 * time.Second // generous: 2 shared cores under -race
	pollEvery   = 10 * time.Millisecond
	quietPeriod = 500 * time.Millisecond // how long "nothing more arrives" is watched
)

// ---------------------------------------------------------------------------------------------
// helpers

// newClient returns a client of srv with a hook counting commands; closed when the test ends.
func newClient(t testing.TB, srv *redistest.Server) (*redis.Client, *cmdCounter) {
	t.Helper()
	c := redistest.Client(t, srv.URL())
	counter := &cmdCounter{calls: map[string]int{}, errs: map[string]int{}}
	c.AddHook(counter)
	return c, counter
}

// newSub builds a subscriber with test-friendly defaults; closed when the test ends.
func newSub(t testing.TB, client redis.UniversalClient, cfg batchsub.Config) *batchsub.Subscriber {
	t.Helper()
	cfg.Client = client
	if cfg.ConsumerGroup == "" {
		cfg.ConsumerGroup = group
	}
	sub, err := batchsub.NewSubscriber(cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = sub.Close() })
	return sub
}

// publish appends n entries the way the stock publisher does, pipelined. UUIDs are prefix-i and
// every message carries metadata "i".
func publish(t testing.TB, c redis.UniversalClient, topic, prefix string, n int) (uuids, ids []string) {
	t.Helper()
	ctx := context.Background()
	m := redisstream.DefaultMarshallerUnmarshaller{}
	for start := 0; start < n; start += 1000 {
		p := c.Pipeline()
		var cmds []*redis.StringCmd
		for i := start; i < min(start+1000, n); i++ {
			msg := message.NewMessage(fmt.Sprintf("%s-%d", prefix, i), []byte("payload-"+strconv.Itoa(i)))
			msg.Metadata.Set("i", strconv.Itoa(i))
			values, err := m.Marshal(topic, msg)
			require.NoError(t, err)
			cmds = append(cmds, p.XAdd(ctx, &redis.XAddArgs{Stream: topic, Values: values}))
			uuids = append(uuids, msg.UUID)
		}
		_, err := p.Exec(ctx)
		require.NoError(t, err)
		for _, cmd := range cmds {
			ids = append(ids, cmd.Val())
		}
	}
	return uuids, ids
}

func receive(t testing.TB, ch <-chan *message.Message) *message.Message {
	t.Helper()
	select {
	case msg, ok := <-ch:
		require.True(t, ok, "channel closed")
		return msg
	case <-time.After(waitFor):
		require.FailNow(t, "no message received")
		return nil
	}
}

// collector acks (or not) everything a channel yields and records it.
type collector struct {
	mu    sync.Mutex
	msgs  []*message.Message
	count map[string]int
	done  chan struct{}
}

func collect(ch <-chan *message.Message, ack bool) *collector {
	c := &collector{count: map[string]int{}, done: make(chan struct{})}
	go func() {
		defer close(c.done)
		for msg := range ch {
			c.mu.Lock()
			c.msgs = append(c.msgs, msg)
			c.count[msg.UUID]++
			c.mu.Unlock()
			if ack {
				msg.Ack()
			}
		}
	}()
	return c
}

func (c *collector) len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.msgs)
}

func (c *collector) snapshot() ([]*message.Message, map[string]int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	counts := make(map[string]int, len(c.count))
	for k, v := range c.count {
		counts[k] = v
	}
	return append([]*message.Message(nil), c.msgs...), counts
}

func pendingCount(t testing.TB, c redis.UniversalClient, topic string) int64 {
	t.Helper()
	p, err := c.XPending(context.Background(), topic, group).Result()
	require.NoError(t, err)
	return p.Count
}

func consumerPending(t testing.TB, c redis.UniversalClient, topic, consumer string) int64 {
	t.Helper()
	p, err := c.XPending(context.Background(), topic, group).Result()
	require.NoError(t, err)
	return p.Consumers[consumer]
}

// cmdCounter is a go-redis hook counting commands, failures and XACKed IDs.
type cmdCounter struct {
	mu          sync.Mutex
	calls       map[string]int
	errs        map[string]int
	ackedIDs    int
	scriptTargs []string // consumer argument of every script run (the delete-if-idle script)
}

func (c *cmdCounter) record(cmd redis.Cmder, err error) {
	name := strings.ToLower(cmd.Name())
	args := cmd.Args()
	if (name == "evalsha" || name == "eval") && len(args) > 1 && (args[1] == batchsub.AckScriptSHA || args[1] == batchsub.AckScript) {
		// The subscriber's XACKs go through its fenced ack script: counted as the XACKs they are.
		name = "xack"
		args = args[4:]
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.calls[name]++
	if err != nil && !errors.Is(err, redis.Nil) {
		c.errs[name]++
	}
	switch name {
	case "xack":
		if err == nil {
			c.ackedIDs += len(args) - 3
		}
	case "evalsha", "eval":
		if len(args) == 6 {
			c.scriptTargs = append(c.scriptTargs, fmt.Sprint(args[5]))
		}
	}
}

func (c *cmdCounter) get(name string) (calls, errs int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.calls[name], c.errs[name]
}

func (c *cmdCounter) acked() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.ackedIDs
}

func (c *cmdCounter) DialHook(next redis.DialHook) redis.DialHook { return next }

func (c *cmdCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		c.record(cmd, err)
		return err
	}
}

func (c *cmdCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		for _, cmd := range cmds {
			c.record(cmd, cmd.Err())
		}
		return err
	}
}

// captureLogger records Error and Info lines.
type captureLogger struct {
	mu     sync.Mutex
	errors []string
	infos  []string
}

func (l *captureLogger) Error(msg string, err error, _ watermill.LogFields) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.errors = append(l.errors, fmt.Sprintf("%s: %v", msg, err))
}

func (l *captureLogger) Info(msg string, _ watermill.LogFields) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.infos = append(l.infos, msg)
}
func (l *captureLogger) Debug(string, watermill.LogFields)                {}
func (l *captureLogger) Trace(string, watermill.LogFields)                {}
func (l *captureLogger) With(watermill.LogFields) watermill.LoggerAdapter { return l }

func (l *captureLogger) errorCount() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.errors)
}

func (l *captureLogger) hasInfo(substr string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, m := range l.infos {
		if strings.Contains(m, substr) {
			return true
		}
	}
	return false
}

// runRouter runs a Watermill router with one handler on topic.
func runRouter(t testing.TB, sub message.Subscriber, topic string, h message.NoPublishHandlerFunc) (*message.Router, <-chan struct{}) {
	t.Helper()
	r, err := message.NewRouter(message.RouterConfig{CloseTimeout: time.Minute}, watermill.NopLogger{})
	require.NoError(t, err)
	r.AddNoPublisherHandler("projection", topic, sub, h)
	done := make(chan struct{})
	go func() {
		defer close(done)
		assert.NoError(t, r.Run(context.Background()))
	}()
	select {
	case <-r.Running():
	case <-time.After(waitFor):
		require.FailNow(t, "router did not start")
	}
	t.Cleanup(func() { _ = r.Close() })
	return r, done
}

// ---------------------------------------------------------------------------------------------
// configuration

func TestNewSubscriberValidatesAndFillsDefaults(t *testing.T) {
	t.Parallel()

	_, err := batchsub.NewSubscriber(batchsub.Config{})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "Client")
	assert.Contains(t, err.Error(), "ConsumerGroup")

	client := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}) // never dialled
	t.Cleanup(func() { _ = client.Close() })
	_, err = batchsub.NewSubscriber(batchsub.Config{Client: client, ConsumerGroup: "g", NackDelay: -time.Second})
	require.Error(t, err, "a negative NackDelay would be a hot redelivery loop")

	sub, err := batchsub.NewSubscriber(batchsub.Config{Client: client, ConsumerGroup: "g"})
	require.NoError(t, err)
	host, _ := os.Hostname()
	assert.True(t, strings.HasPrefix(sub.ConsumerName(), fmt.Sprintf("%s-%d-", host, os.Getpid())), sub.ConsumerName())
	other, err := batchsub.NewSubscriber(batchsub.Config{Client: client, ConsumerGroup: "g"})
	require.NoError(t, err)
	assert.NotEqual(t, sub.ConsumerName(), other.ConsumerName(), "default names are unique within a process")
	require.NoError(t, sub.Close())
	require.NoError(t, other.Close())
}

// ---------------------------------------------------------------------------------------------
// 1. group creation, own PEL first, batches, stream order, metadata, MaxInFlight

func TestSubscribeDeliversInStreamOrderWithMetadata(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t, redistest.Options{})
	client, _ := newClient(t, srv)
	const topic, n = "checkins", 50
	uuids, ids := publish(t, client, topic, "m", n)

	// BatchSize 7: the 50 entries come in several XREADGROUP batches.
	sub := newSub(t, client, batchsub.Config{BatchSize: 7})
	msgs, err := sub.Subscribe(context.Background(), topic)
	require.NoError(t, err)

	groups, err := client.XInfoGroups(context.Background(), topic).Result()
	require.NoError(t, err)
	require.Len(t, groups, 1)
	assert.Equal(t, group, groups[0].Name)

	for i := 0; i < n; i++ {
		msg := receive(t, msgs)
		require.Equal(t, uuids[i], msg.UUID, "stream order")
		assert.Equal(t, "payload-"+strconv.Itoa(i), string(msg.Payload))
		assert.Equal(t, strconv.Itoa(i), msg.Metadata.Get("i"))
		assert.Equal(t, topic, msg.Metadata.Get(batchsub.MetaStream))
		assert.Equal(t, ids[i], msg.Metadata.Get(batchsub.MetaEntryID))
		assert.Equal(t, "1", msg.Metadata.Get(batchsub.MetaDeliveries))
		assert.Empty(t, msg.Metadata.Get(batchsub.MetaUnmarshalErr))
		msg.Ack()
	}
	assert.Eventually(t, func() bool { return pendingCount(t, client, topic) == 0 }, waitFor, pollEvery)
}

// TestReadLingerGathersABusyStreamIntoBatches: the first entry after a quiet spell comes at
// once; entries arriving one by one right behind it are read together after ReadLinger.
func TestReadLingerGathersABusyStreamIntoBatches(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t, redistest.Options{})
	client, counter := newClient(t, srv)
	const topic = "checkins"
	sub := newSub(t, client, batchsub.Config{BatchSize: 100, ReadLinger: 400 * time.Millisecond, BlockTime: 50 * time.Millisecond})
	msgs, err := sub.Subscribe(context.Background(), topic)
	require.NoError(t, err)
	publish(t, client, topic, "first", 1)
	first := receive(t, msgs)
	assert.Equal(t, "first-0", first.UUID)
	first.Ack()
	reads, _ := counter.get("xreadgroup")
	for i := range 5 { // one XADD at a time, as requests come
		publish(t, client, topic, "next"+strconv.Itoa(i), 1)
		time.Sleep(5 * time.Millisecond)
	}
	for i := range 5 {
		msg := receive(t, msgs)
		assert.Equal(t, "next"+strconv.Itoa(i)+"-0", msg.UUID)
		assert.Equal(t, strconv.Itoa(4-i), msg.Metadata.Get(batchsub.MetaQueued), "read in one batch")
		msg.Ack()
	}
	now, _ := counter.get("xreadgroup")
	assert.LessOrEqual(t, now-reads, 2, "one read for the five, after the linger")
}

func TestSubscribeRedeliversOwnPendingEntriesFirst(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t, redistest.Options{})
	client, _ := newClient(t, srv)
	ctx := context.Background()
	const topic, consumer = "checkins", "worker-1"
	uuids, _ := publish(t, client, topic, "m", 10)

	// A previous life of worker-1 read four entries and died before acking them.
	require.NoError(t, client.XGroupCreateMkStream(ctx, topic, group, "0").Err())
	require.NoError(t, client.XReadGroup(ctx, &redis.XReadGroupArgs{
		Group: group, Consumer: consumer, Streams: []string{topic, ">"}, Count: 4, Block: -1,
	}).Err())

	sub := newSub(t, client, batchsub.Config{Consumer: consumer, ClaimMinIdle: time.Hour, BatchSize: 3})
	msgs, err := sub.Subscribe(ctx, topic)
	require.NoError(t, err)
	for i := 0; i < 10; i++ {
		msg := receive(t, msgs)
		require.Equal(t, uuids[i], msg.UUID)
		want := "1"
		if i < 4 {
			want = "2" // XREADGROUP 0 counted a second delivery
		}
		assert.Equal(t, want, msg.Metadata.Get(batchsub.MetaDeliveries), "entry %d", i)
		msg.Ack()
	}
	assert.Eventually(t, func() bool { return pendingCount(t, client, topic) == 0 }, waitFor, pollEvery)
}

func TestSubscribeNewGroupStartsAtOldestID(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t, redistest.Options{})
	client, _ := newClient(t, srv)
	const topic = "checkins"
	publish(t, client, topic, "old", 5)

	sub := newSub(t, client, batchsub.Config{OldestID: "$"})
	msgs, err := sub.Subscribe(context.Background(), topic)
	require.NoError(t, err)
	uuids, _ := publish(t, client, topic, "new", 3)
	for i := range uuids {
		msg := receive(t, msgs)
		assert.Equal(t, uuids[i], msg.UUID)
		msg.Ack()
	}
	select {
	case msg := <-msgs:
		t.Fatalf("unexpected message %s", msg.UUID)
	case <-time.After(quietPeriod):
	}
}

func TestMaxInFlightBoundsUnackedMessages(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t, redistest.Options{})
	client, _ := newClient(t, srv)
	const topic = "checkins"
	publish(t, client, topic, "m", 100)

	sub := newSub(t, client, batchsub.Config{MaxInFlight: 12, BatchSize: 4})
	msgs, err := sub.Subscribe(context.Background(), topic)
	require.NoError(t, err)
	c := collect(msgs, false)

	assert.Eventually(t, func() bool { return c.len() == 12 }, waitFor, pollEvery)
	assert.Never(t, func() bool { return c.len() > 12 }, quietPeriod, pollEvery, "no more than MaxInFlight unacked")
	assert.EqualValues(t, 12, consumerPending(t, client, topic, sub.ConsumerName()), "reading stopped while full")

	got, _ := c.snapshot()
	for _, msg := range got[:4] {
		msg.Ack()
	}
	// Room for 4 more: more come (how many at once is the reader's batching policy), never more
	// than 4.
	assert.Eventually(t, func() bool { return c.len() > 12 }, waitFor, pollEvery)
	assert.Never(t, func() bool { return c.len() > 16 }, quietPeriod, pollEvery)

	// Ack everything from now on: the rest flows.
	go func() {
		acked := 4
		for {
			select {
			case <-c.done:
				return
			case <-time.After(pollEvery):
			}
			got, _ := c.snapshot()
			for _, msg := range got[acked:] {
				msg.Ack()
			}
			acked = len(got)
		}
	}()
	assert.Eventually(t, func() bool { return c.len() == 100 }, waitFor, pollEvery)
	assert.Eventually(t, func() bool { return pendingCount(t, client, topic) == 0 }, waitFor, pollEvery)
}

// ---------------------------------------------------------------------------------------------
// 2. batched XACK, retried through an outage

func TestAcksAreBatched(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t, redistest.Options{})
	client, counter := newClient(t, srv)
	const topic, n = "checkins", 2000
	publish(t, client, topic, "m", n)

	// A 20ms window keeps the count below meaningful even if -race on busy cores slows delivery
	// to a few thousand messages per second (the default 2ms is tuned for ~100k/s).
	sub := newSub(t, client, batchsub.Config{AckFlushInterval: 20 * time.Millisecond})
	msgs, err := sub.Subscribe(context.Background(), topic)
	require.NoError(t, err)
	c := collect(msgs, true)

	assert.Eventually(t, func() bool { return c.len() == n }, waitFor, pollEvery)
	assert.Eventually(t, func() bool { return pendingCount(t, client, topic) == 0 }, waitFor, pollEvery)
	require.NoError(t, sub.Close())
	<-c.done

	xacks, _ := counter.get("xack")
	assert.Equal(t, n, counter.acked(), "every ack written exactly once")
	assert.LessOrEqual(t, xacks, n/20, "XACKs carry many IDs each (got %d XACKs for %d acks)", xacks, n)
	t.Logf("%d acks in %d XACK commands", n, xacks)
}

func TestAcksAreKeptAndRetriedWhileRedisIsDown(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t, redistest.Options{AppendOnly: true}) // the PEL survives the restart
	client, counter := newClient(t, srv)
	const topic, n = "checkins", 20
	publish(t, client, topic, "m", n)

	sub := newSub(t, client, batchsub.Config{})
	msgs, err := sub.Subscribe(context.Background(), topic)
	require.NoError(t, err)
	var held []*message.Message
	for i := 0; i < n; i++ {
		held = append(held, receive(t, msgs))
	}
	require.EqualValues(t, n, pendingCount(t, client, topic))

	srv.Stop()
	for _, msg := range held {
		msg.Ack()
	}
	assert.Eventually(t, func() bool { _, errs := counter.get("xack"); return errs >= 2 }, waitFor, pollEvery,
		"XACK is retried while Redis is down")
	srv.Restart()

	assert.Eventually(t, func() bool {
		p, err := client.XPending(context.Background(), topic, group).Result()
		return err == nil && p.Count == 0
	}, waitFor, pollEvery, "the kept acks reach Redis once it is back")
	require.NoError(t, sub.Close())
}

// ---------------------------------------------------------------------------------------------
// 3. nack

func TestNackRedeliversAfterDelayWithoutStallingOthers(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t, redistest.Options{})
	client, _ := newClient(t, srv)
	const topic, nackDelay = "checkins", 2 * time.Second // long enough for the others under -race on busy cores
	uuids, ids := publish(t, client, topic, "m", 10)

	sub := newSub(t, client, batchsub.Config{NackDelay: nackDelay})
	msgs, err := sub.Subscribe(context.Background(), topic)
	require.NoError(t, err)

	first := receive(t, msgs)
	require.Equal(t, uuids[0], first.UUID)
	first.Metadata.Set(batchsub.MetaEntryID, "tampered by a handler")
	nackedAt := time.Now()
	require.True(t, first.Nack())

	// The nine behind it are not held up by the nacked one.
	for i := 1; i < 10; i++ {
		msg := receive(t, msgs)
		require.Equal(t, uuids[i], msg.UUID, "the nacked message must not come back before the others")
		msg.Ack()
	}

	again := receive(t, msgs)
	assert.GreaterOrEqual(t, time.Since(nackedAt), nackDelay, "redelivered after NackDelay")
	assert.Equal(t, uuids[0], again.UUID)
	assert.NotSame(t, first, again, "a copy with fresh ack channels")
	assert.Equal(t, "0", again.Metadata.Get("i"))
	assert.Equal(t, ids[0], again.Metadata.Get(batchsub.MetaEntryID), "our metadata is restored")
	assert.Equal(t, topic, again.Metadata.Get(batchsub.MetaStream))
	assert.Equal(t, "1", again.Metadata.Get(batchsub.MetaDeliveries), "in-process redelivery: Redis count unchanged")
	select {
	case <-again.Acked():
		t.Fatal("fresh ack channel expected")
	default:
	}
	require.NoError(t, again.Context().Err())
	again.Ack()
	assert.Eventually(t, func() bool { return pendingCount(t, client, topic) == 0 }, waitFor, pollEvery)
}

// ---------------------------------------------------------------------------------------------
// 4. poison entries

func TestUnmarshalErrorIsDeliveredFlaggedAndConsumptionContinues(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t, redistest.Options{})
	client, _ := newClient(t, srv)
	ctx := context.Background()
	const topic = "checkins"
	before, _ := publish(t, client, topic, "before", 3)
	// What `redis-cli XADD checkins '*' foo bar baz qux` writes: no _watermill_message_uuid.
	garbageID, err := client.XAdd(ctx, &redis.XAddArgs{Stream: topic, Values: []string{"foo", "bar", "baz", "qux"}}).Result()
	require.NoError(t, err)
	after, _ := publish(t, client, topic, "after", 3)

	sub := newSub(t, client, batchsub.Config{})
	msgs, err := sub.Subscribe(ctx, topic)
	require.NoError(t, err)

	for _, id := range before {
		msg := receive(t, msgs)
		require.Equal(t, id, msg.UUID)
		assert.Empty(t, msg.Metadata.Get(batchsub.MetaUnmarshalErr))
		msg.Ack()
	}
	poison := receive(t, msgs)
	assert.Equal(t, garbageID, poison.UUID, "UUID is the entry ID")
	assert.Empty(t, poison.Payload)
	assert.Contains(t, poison.Metadata.Get(batchsub.MetaUnmarshalErr), redisstream.UUIDHeaderKey)
	assert.Equal(t, garbageID, poison.Metadata.Get(batchsub.MetaEntryID))
	assert.Equal(t, topic, poison.Metadata.Get(batchsub.MetaStream))
	assert.Equal(t, "1", poison.Metadata.Get(batchsub.MetaDeliveries))
	assert.Equal(t, "bar", poison.Metadata.Get(batchsub.MetaRawPrefix+"foo"))
	assert.Equal(t, "qux", poison.Metadata.Get(batchsub.MetaRawPrefix+"baz"))
	poison.Ack() // what a poison-queue middleware does after parking it

	for _, id := range after {
		msg := receive(t, msgs)
		require.Equal(t, id, msg.UUID)
		msg.Ack()
	}
	later, _ := publish(t, client, topic, "later", 1)
	last := receive(t, msgs)
	assert.Equal(t, later[0], last.UUID, "still consuming")
	last.Ack()
	assert.Eventually(t, func() bool { return pendingCount(t, client, topic) == 0 }, waitFor, pollEvery)
}

// ---------------------------------------------------------------------------------------------
// 5. crash takeover

func TestCrashedConsumersEntriesAreTakenOver(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t, redistest.Options{})
	client, _ := newClient(t, srv)
	ctx := context.Background()
	const topic, n, crashed = "checkins", 100, "crashed-worker"
	uuids, ids := publish(t, client, topic, "m", n)

	// A consumer read 40 entries and crashed without acking any of them; one of those entries
	// was deleted from the stream afterwards.
	require.NoError(t, client.XGroupCreateMkStream(ctx, topic, group, "0").Err())
	require.NoError(t, client.XReadGroup(ctx, &redis.XReadGroupArgs{
		Group: group, Consumer: crashed, Streams: []string{topic, ">"}, Count: 40, Block: -1,
	}).Err())
	require.NoError(t, client.XDel(ctx, topic, ids[5]).Err())
	require.EqualValues(t, 40, consumerPending(t, client, topic, crashed))

	sub := newSub(t, client, batchsub.Config{
		ClaimMinIdle:  300 * time.Millisecond,
		ClaimInterval: 100 * time.Millisecond,
		BatchSize:     16, // several XAUTOCLAIM pages
	})
	msgs, err := sub.Subscribe(ctx, topic)
	require.NoError(t, err)
	c := collect(msgs, true)

	assert.Eventually(t, func() bool { return c.len() >= n-1 }, waitFor, pollEvery)
	assert.Never(t, func() bool { return c.len() > n-1 }, quietPeriod, pollEvery, "each entry exactly once")
	got, counts := c.snapshot()
	require.Len(t, counts, n-1)
	for i, id := range uuids {
		if i == 5 {
			assert.Zero(t, counts[id], "a deleted entry is not delivered")
			continue
		}
		assert.Equal(t, 1, counts[id], "entry %d", i)
	}
	for _, msg := range got {
		i, _ := strconv.Atoi(msg.Metadata.Get("i"))
		want := "1"
		if i < 40 {
			want = "2" // the crashed consumer's delivery plus ours
		}
		assert.Equal(t, want, msg.Metadata.Get(batchsub.MetaDeliveries), "entry %d", i)
	}
	assert.Eventually(t, func() bool { return pendingCount(t, client, topic) == 0 }, waitFor, pollEvery,
		"all acked, and the deleted entry left the PEL")
}

// TestSlowLiveConsumerKeepsItsEntries: a consumer working on entries for longer than
// ClaimMinIdle (a batch retried through a slow Redis) keeps them: another consumer of the group
// does not take them over and apply them beside it. It used to, after ClaimMinIdle; and once
// the other had acknowledged them, the first one's next attempt found their markers stale.
func TestSlowLiveConsumerKeepsItsEntries(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t, redistest.Options{})
	client, _ := newClient(t, srv)
	ctx := context.Background()
	const topic, n = "checkins", 10
	publish(t, client, topic, "m", n)
	fast := batchsub.Config{ClaimMinIdle: 300 * time.Millisecond, ClaimInterval: 100 * time.Millisecond}

	slowCfg := fast
	slowCfg.Consumer = "slow"
	slow, err := newSub(t, client, slowCfg).Subscribe(ctx, topic)
	require.NoError(t, err)
	held := make([]*message.Message, 0, n)
	for range n {
		held = append(held, receive(t, slow)) // and not acked for a while
	}

	otherCfg := fast
	otherCfg.Consumer = "other"
	other, err := newSub(t, client, otherCfg).Subscribe(ctx, topic)
	require.NoError(t, err)
	c := collect(other, true)
	assert.Never(t, func() bool { return c.len() > 0 }, 2*time.Second, pollEvery,
		"no entry of the live consumer is taken over, for several times ClaimMinIdle")
	assert.EqualValues(t, n, consumerPending(t, client, topic, "slow"))
	for _, msg := range held {
		msg.Ack()
	}
	assert.Eventually(t, func() bool { return pendingCount(t, client, topic) == 0 }, waitFor, pollEvery)
	assert.Zero(t, c.len())

}

// TestEntryHeldPastHoldMaxIsTakenOver: a handler that hangs does not hold its entry forever.
func TestEntryHeldPastHoldMaxIsTakenOver(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t, redistest.Options{})
	client, _ := newClient(t, srv)
	ctx := context.Background()
	const topic = "checkins"
	uuids, _ := publish(t, client, topic, "m", 1)
	cfg := batchsub.Config{ClaimMinIdle: 300 * time.Millisecond, ClaimInterval: 100 * time.Millisecond,
		Consumer: "hung", HoldMax: 500 * time.Millisecond, DrainTimeout: 100 * time.Millisecond}
	hung, err := newSub(t, client, cfg).Subscribe(ctx, topic)
	require.NoError(t, err)
	assert.Equal(t, uuids[0], receive(t, hung).UUID) // never acked: the handler hangs

	cfg.Consumer, cfg.HoldMax = "other", 0
	other, err := newSub(t, client, cfg).Subscribe(ctx, topic)
	require.NoError(t, err)
	c := collect(other, true)
	assert.Never(t, func() bool { return c.len() > 0 }, 300*time.Millisecond, pollEvery, "kept while held less than HoldMax")
	assert.Eventually(t, func() bool { return c.len() == 1 }, waitFor, pollEvery, "taken over once held past HoldMax")
}

// ---------------------------------------------------------------------------------------------
// 6. dead consumer cleanup

func TestIdleConsumersWithoutPendingEntriesAreRemoved(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t, redistest.Options{})
	client, counter := newClient(t, srv)
	ctx := context.Background()
	const topic = "checkins"
	publish(t, client, topic, "m", 2)
	require.NoError(t, client.XGroupCreateMkStream(ctx, topic, group, "0").Err())
	require.NoError(t, client.XGroupCreateConsumer(ctx, topic, group, "ghost").Err())
	require.NoError(t, client.XReadGroup(ctx, &redis.XReadGroupArgs{ // holder keeps one entry pending
		Group: group, Consumer: "holder", Streams: []string{topic, ">"}, Count: 1, Block: -1,
	}).Err())

	sub := newSub(t, client, batchsub.Config{
		ConsumerIdleRemove: 300 * time.Millisecond,
		ClaimInterval:      100 * time.Millisecond,
		ClaimMinIdle:       time.Hour, // holder's entry is not taken over
	})
	msgs, err := sub.Subscribe(ctx, topic)
	require.NoError(t, err)
	receive(t, msgs).Ack()

	consumers := func() map[string]int64 {
		list, err := client.XInfoConsumers(ctx, topic, group).Result()
		require.NoError(t, err)
		m := map[string]int64{}
		for _, c := range list {
			m[c.Name] = c.Pending
		}
		return m
	}
	assert.Eventually(t, func() bool { _, ghost := consumers()["ghost"]; return !ghost }, waitFor, pollEvery)
	// Several more cleanup rounds: the holder (pending entries, however idle) and this consumer stay.
	assert.Never(t, func() bool {
		now := consumers()
		_, self := now[sub.ConsumerName()]
		return now["holder"] != 1 || !self
	}, quietPeriod, pollEvery)
	counter.mu.Lock()
	assert.NotContains(t, counter.scriptTargs, sub.ConsumerName(), "never tries to delete itself while running")
	assert.NotContains(t, counter.scriptTargs, "holder", "XINFO already shows the holder's pending entry")
	counter.mu.Unlock()
}

// ---------------------------------------------------------------------------------------------
// 7. Redis outage

func TestConsumptionResumesAfterRedisRestart(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t, redistest.Options{}) // no persistence: stream and group are lost
	// No go-redis retries of its own, so the attempt rate seen below is our backoff alone.
	client := redis.NewClient(&redis.Options{Addr: srv.Addr(), MaxRetries: -1, DialerRetries: 1})
	t.Cleanup(func() { _ = client.Close() })
	counter := &cmdCounter{calls: map[string]int{}, errs: map[string]int{}}
	client.AddHook(counter)
	logs := &captureLogger{}
	const topic = "checkins"
	first, _ := publish(t, client, topic, "before", 50)

	sub := newSub(t, client, batchsub.Config{Logger: logs, ClaimInterval: 200 * time.Millisecond})
	msgs, err := sub.Subscribe(context.Background(), topic)
	require.NoError(t, err)
	c := collect(msgs, true)
	assert.Eventually(t, func() bool { return c.len() == len(first) }, waitFor, pollEvery)
	assert.Eventually(t, func() bool { return pendingCount(t, client, topic) == 0 }, waitFor, pollEvery)
	errorsBefore := logs.errorCount()

	srv.Stop()
	outageStart := time.Now()
	assert.Eventually(t, func() bool { _, errs := counter.get("xreadgroup"); return errs >= 3 }, waitFor, pollEvery)
	time.Sleep(time.Until(outageStart.Add(3 * time.Second))) // the outage lasts 3s: this is the scenario, not a wait
	_, readErrs := counter.get("xreadgroup")
	outage := time.Since(outageStart)
	srv.Restart()

	second, _ := publish(t, client, topic, "after", 50)
	assert.Eventually(t, func() bool { return c.len() == len(first)+len(second) }, waitFor, pollEvery,
		"the same subscription resumes, without resubscribing")
	_, counts := c.snapshot()
	for _, id := range second {
		assert.Equal(t, 1, counts[id])
	}
	assert.True(t, logs.hasInfo("recreated"), "the lost consumer group was recreated")

	// Reader, claimer and consumer cleanup all failed during the outage; one line per 5s in all.
	outageErrors := logs.errorCount() - errorsBefore
	assert.GreaterOrEqual(t, outageErrors, 1)
	assert.LessOrEqual(t, outageErrors, 1+int(outage/(5*time.Second)),
		"throttled: not one log line per attempt (%d failed reads in %s)", readErrs, outage)
	// 100ms doubling (jittered to [d/2, d]) allows about 8 attempts in 3s; a hot loop thousands.
	assert.LessOrEqual(t, readErrs, 15, "backoff between attempts")
	t.Logf("outage %s: %d failed XREADGROUP, %d error log lines: %q", outage, readErrs, outageErrors, logs.errors[errorsBefore:])
	require.NoError(t, sub.Close())
}

// ---------------------------------------------------------------------------------------------
// 8. Close and ctx cancellation drain

func TestRouterCloseMidStreamLeavesNothingPending(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t, redistest.Options{})
	client, _ := newClient(t, srv)
	const topic, n = "checkins", 5000
	uuids, _ := publish(t, client, topic, "m", n)

	var (
		mu        sync.Mutex
		processed = map[string]int{}
		total     atomic.Int64
		halfway   = make(chan struct{})
		once      sync.Once
	)
	handler := func(msg *message.Message) error {
		mu.Lock()
		processed[msg.UUID]++
		mu.Unlock()
		if total.Add(1) == 500 {
			once.Do(func() { close(halfway) })
		}
		return nil
	}

	subA := newSub(t, client, batchsub.Config{Consumer: "a", MaxInFlight: 100, BatchSize: 50})
	routerA, doneA := runRouter(t, subA, topic, handler)
	select {
	case <-halfway:
	case <-time.After(waitFor):
		t.Fatal("router A did not process 500 messages")
	}
	require.NoError(t, routerA.Close())
	<-doneA
	require.NoError(t, subA.Close(), "idempotent")
	byA := total.Load()
	require.Less(t, byA, int64(n), "closed mid-stream")
	assert.Zero(t, pendingCount(t, client, topic), "everything A read was delivered, acked and XACKed before Close returned")

	subB := newSub(t, client, batchsub.Config{Consumer: "b"})
	routerB, doneB := runRouter(t, subB, topic, handler)
	assert.Eventually(t, func() bool { return total.Load() >= n }, waitFor, pollEvery)
	assert.Never(t, func() bool { return total.Load() > n }, quietPeriod, pollEvery)
	require.NoError(t, routerB.Close())
	<-doneB

	mu.Lock()
	defer mu.Unlock()
	require.Len(t, processed, n)
	for _, id := range uuids {
		require.Equal(t, 1, processed[id], "processed exactly once: %s", id)
	}
	assert.Zero(t, pendingCount(t, client, topic))
	t.Logf("router A processed %d, router B %d", byA, int64(n)-byA)
}

func TestSubscribeCtxCancelDrainsAndNackedEntriesStayPending(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t, redistest.Options{})
	client, _ := newClient(t, srv)
	const topic, n = "checkins", 10
	uuids, _ := publish(t, client, topic, "m", n)

	sub := newSub(t, client, batchsub.Config{MaxInFlight: 4, BatchSize: 2})
	ctx, cancel := context.WithCancel(context.Background())
	msgs, err := sub.Subscribe(ctx, topic)
	require.NoError(t, err)

	m0, m1, m2 := receive(t, msgs), receive(t, msgs), receive(t, msgs)
	cancel()
	// Draining: what was read is still delivered and acks are still taken.
	m0.Nack() // failed during shutdown: not retried in-process, left pending for a redelivery
	m1.Ack()
	m2.Ack()
	delivered := map[string]int{m0.UUID: 1, m1.UUID: 1, m2.UUID: 1}
	for msg := range msgs {
		delivered[msg.UUID]++
		msg.Ack()
	}
	// channel closed: the subscription has drained
	assert.Equal(t, 1, delivered[m0.UUID], "a nack during the drain is not redelivered in-process")
	assert.Less(t, len(delivered), n, "no new entries were read after the cancel")
	assert.EqualValues(t, 1, pendingCount(t, client, topic), "only the nacked entry is left pending")

	// The same subscriber can subscribe again; its own PEL (the nacked entry) comes first.
	msgs, err = sub.Subscribe(context.Background(), topic)
	require.NoError(t, err)
	again := receive(t, msgs)
	assert.Equal(t, m0.UUID, again.UUID)
	assert.Equal(t, "2", again.Metadata.Get(batchsub.MetaDeliveries))
	again.Ack()
	for len(delivered) < n {
		msg := receive(t, msgs)
		delivered[msg.UUID]++
		msg.Ack()
	}
	for _, id := range uuids {
		assert.Equal(t, 1, delivered[id], id)
	}
	require.NoError(t, sub.Close())
	assert.Zero(t, pendingCount(t, client, topic))
}

func TestMessageContext(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t, redistest.Options{})
	client, _ := newClient(t, srv)
	const topic = "checkins"
	publish(t, client, topic, "m", 2)

	type key struct{}
	sub := newSub(t, client, batchsub.Config{DrainTimeout: 300 * time.Millisecond})
	msgs, err := sub.Subscribe(context.WithValue(context.Background(), key{}, "v"), topic)
	require.NoError(t, err)

	acked := receive(t, msgs)
	assert.Equal(t, "v", acked.Context().Value(key{}), "values of Subscribe's ctx are kept")
	acked.Ack()
	assert.Never(t, func() bool { return acked.Context().Err() != nil }, quietPeriod, pollEvery,
		"not cancelled on ack: work after an early ack is not interrupted")

	held := receive(t, msgs) // never acked: Close has to give up on it
	start := time.Now()
	require.NoError(t, sub.Close(), "a drain timeout is logged, not returned")
	assert.GreaterOrEqual(t, time.Since(start), 300*time.Millisecond, "waited DrainTimeout for the ack")
	select {
	case <-held.Context().Done():
	default:
		t.Fatal("hard close cancels the message contexts")
	}
	_, open := <-msgs
	assert.False(t, open)
	assert.EqualValues(t, 1, consumerPending(t, client, topic, sub.ConsumerName()),
		"the unacked entry stays pending for another consumer")
}

func TestCloseIsIdempotentAndSafeWithConcurrentSubscribe(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t, redistest.Options{})
	client, _ := newClient(t, srv)
	sub := newSub(t, client, batchsub.Config{})

	_, err := sub.Subscribe(context.Background(), "dup")
	require.NoError(t, err)
	_, err = sub.Subscribe(context.Background(), "dup")
	require.ErrorIs(t, err, batchsub.ErrAlreadySubscribed)

	var (
		wg               sync.WaitGroup
		started, refused atomic.Int32
	)
	for i := 0; i < 20; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ch, err := sub.Subscribe(context.Background(), fmt.Sprintf("topic-%d", i))
			if err != nil {
				assert.ErrorIs(t, err, batchsub.ErrClosed)
				refused.Add(1)
				return
			}
			started.Add(1)
			for msg := range ch { // until Close closes it
				msg.Ack()
			}
		}()
		if i == 10 {
			wg.Add(1)
			go func() { defer wg.Done(); assert.NoError(t, sub.Close()) }()
		}
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(waitFor):
		t.Fatal("an output channel was not closed")
	}
	assert.EqualValues(t, 20, started.Load()+refused.Load())
	require.NoError(t, sub.Close())
	_, err = sub.Subscribe(context.Background(), "late")
	require.ErrorIs(t, err, batchsub.ErrClosed)
}

// Not parallel, so that the goroutine count is not disturbed by other tests.
func TestCloseLeavesNoGoroutineBehind(t *testing.T) {
	srv := redistest.Start(t, redistest.Options{})
	baseline := runtime.NumGoroutine()

	client := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	sub, err := batchsub.NewSubscriber(batchsub.Config{Client: client, ConsumerGroup: group, NackDelay: time.Hour})
	require.NoError(t, err)
	for i := 0; i < 3; i++ {
		topic := fmt.Sprintf("topic-%d", i)
		publish(t, client, topic, "m", 20)
		msgs, err := sub.Subscribe(context.Background(), topic)
		require.NoError(t, err)
		receive(t, msgs).Nack() // one waiting for a redelivery
		for j := 1; j < 20; j++ {
			receive(t, msgs).Ack()
		}
	}
	require.NoError(t, sub.Close())
	require.NoError(t, client.Close())
	// Polled by hand: assert.Eventually runs its condition in a goroutine of its own.
	deadline := time.Now().Add(waitFor)
	for runtime.NumGoroutine() > baseline && time.Now().Before(deadline) {
		time.Sleep(pollEvery)
	}
	if n := runtime.NumGoroutine(); n > baseline {
		buf := make([]byte, 1<<20)
		t.Fatalf("goroutines: %d, baseline %d\n%s", n, baseline, buf[:runtime.Stack(buf, true)])
	}
}

// ---------------------------------------------------------------------------------------------
// 10. benchmarks

const benchEntries = 50_000

// BenchmarkDrain preloads 50,000 entries and measures draining them through a Watermill router
// whose handler acks, with this subscriber and with the stock redisstream one, plus a raw
// go-redis loop (XREADGROUP COUNT 500 and one pipelined XACK per batch) as the ceiling.
//
//	go test -run '^$' -bench BenchmarkDrain -benchtime 1x ./adapters/batchsub/
func BenchmarkDrain(b *testing.B) {
	srv := redistest.Start(b, redistest.Options{})
	client := redistest.Client(b, srv.URL())
	const topic = "bench"
	publish(b, client, topic, "m", benchEntries)

	newClient := func() *redis.Client { return redis.NewClient(&redis.Options{Addr: srv.Addr()}) }
	groupSeq := 0
	nextGroup := func() string { groupSeq++; return fmt.Sprintf("bench-%d", groupSeq) }

	b.Run("batchsub", func(b *testing.B) {
		c := newClient()
		defer c.Close()
		drainWithRouter(b, topic, func(group string) message.Subscriber {
			sub, err := batchsub.NewSubscriber(batchsub.Config{Client: c, ConsumerGroup: group})
			require.NoError(b, err)
			return sub
		}, nextGroup)
	})
	b.Run("batchsub-channel", func(b *testing.B) {
		c := newClient()
		defer c.Close()
		drainChannel(b, topic, func(group string) message.Subscriber {
			sub, err := batchsub.NewSubscriber(batchsub.Config{Client: c, ConsumerGroup: group})
			require.NoError(b, err)
			return sub
		}, nextGroup)
	})
	b.Run("stock-redisstream", func(b *testing.B) {
		drainWithRouter(b, topic, func(group string) message.Subscriber {
			// The stock subscriber closes its client itself.
			sub, err := redisstream.NewSubscriber(redisstream.SubscriberConfig{
				Client: newClient(), ConsumerGroup: group,
			}, watermill.NopLogger{})
			require.NoError(b, err)
			return sub
		}, nextGroup)
	})
	b.Run("raw-goredis", func(b *testing.B) { drainRaw(b, topic, newClient(), nextGroup, false) })
	b.Run("raw-goredis+unmarshal", func(b *testing.B) { drainRaw(b, topic, newClient(), nextGroup, true) })
}

// drainRaw is the ceiling: one XREADGROUP COUNT 500 and one XACK per batch, optionally with the
// Unmarshaller's work on each entry (the least any Watermill subscriber must do).
func drainRaw(b *testing.B, topic string, c *redis.Client, nextGroup func() string, unmarshal bool) {
	defer c.Close()
	ctx := context.Background()
	var elapsed, cpu time.Duration
	for i := 0; i < b.N; i++ {
		g := nextGroup()
		require.NoError(b, c.XGroupCreate(ctx, topic, g, "0").Err())
		start, cpuStart := time.Now(), cpuTime(b)
		for done := 0; done < benchEntries; {
			res, err := c.XReadGroup(ctx, &redis.XReadGroupArgs{
				Group: g, Consumer: "raw", Streams: []string{topic, ">"}, Count: 500, Block: 100 * time.Millisecond,
			}).Result()
			require.NoError(b, err)
			ids := make([]string, 0, len(res[0].Messages))
			for _, m := range res[0].Messages {
				if unmarshal {
					_, err := redisstream.DefaultMarshallerUnmarshaller{}.Unmarshal(m.Values)
					require.NoError(b, err)
				}
				ids = append(ids, m.ID)
			}
			require.NoError(b, c.XAck(ctx, topic, g, ids...).Err())
			done += len(ids)
		}
		elapsed += time.Since(start)
		cpu += cpuTime(b) - cpuStart
	}
	reportRate(b, elapsed, cpu)
}

// cpuTime is the CPU time (user+system) this process has used so far. Reported per message next
// to msgs/s because the cores are shared: wall-clock rates swing with the neighbours' load,
// CPU per message much less. (redis-server's own CPU is not included.)
func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	require.NoError(b, syscall.Getrusage(syscall.RUSAGE_SELF, &ru))
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func reportRate(b *testing.B, elapsed, cpu time.Duration) {
	msgs := float64(benchEntries * b.N)
	b.ReportMetric(msgs/elapsed.Seconds(), "msgs/s")
	b.ReportMetric(float64(cpu.Microseconds())/msgs, "cpu-µs/msg")
}

// drainWithRouter consumes all benchEntries with a fresh consumer group per iteration.
func drainWithRouter(b *testing.B, topic string, newSub func(group string) message.Subscriber, nextGroup func() string) {
	var elapsed, cpu time.Duration
	for i := 0; i < b.N; i++ {
		sub := newSub(nextGroup())
		var processed atomic.Int64
		all := make(chan struct{})
		r, err := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
		require.NoError(b, err)
		r.AddNoPublisherHandler("bench", topic, sub, func(*message.Message) error {
			if processed.Add(1) == benchEntries {
				close(all)
			}
			return nil
		})
		start, cpuStart := time.Now(), cpuTime(b)
		go func() { _ = r.Run(context.Background()) }()
		select {
		case <-all:
		case <-time.After(5 * time.Minute):
			b.Fatal("timed out")
		}
		elapsed += time.Since(start)
		cpu += cpuTime(b) - cpuStart
		require.NoError(b, r.Close())
		_ = sub.Close()
	}
	reportRate(b, elapsed, cpu)
}

// drainChannel consumes all benchEntries straight from the subscriber's channel, acking each
// message in the reading goroutine: the subscriber's own cost, without the router's.
func drainChannel(b *testing.B, topic string, newSub func(group string) message.Subscriber, nextGroup func() string) {
	var elapsed, cpu time.Duration
	for i := 0; i < b.N; i++ {
		sub := newSub(nextGroup())
		start, cpuStart := time.Now(), cpuTime(b)
		msgs, err := sub.Subscribe(context.Background(), topic)
		require.NoError(b, err)
		for n := 0; n < benchEntries; n++ {
			(<-msgs).Ack()
		}
		elapsed += time.Since(start)
		cpu += cpuTime(b) - cpuStart
		require.NoError(b, sub.Close())
	}
	reportRate(b, elapsed, cpu)
}
