package adapters_test

// The auto-pipeline on a Redis Cluster during a slot migration (a reshard: adding a master,
// `redis-cli --cluster rebalance`): a command that meets TRYAGAIN does not make go-redis send the
// others of its node's batch again (sendOnce; found by a review).

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/checkins/checkins/adapters"
	"github.com/checkins/checkins/adapters/redistest"
	"github.com/checkins/checkins/app/command"
	"github.com/checkins/checkins/domain"
)

// TestClusterTryAgainRunsAnotherRequestsXAddOnce: a cluster with one stream (the two-step
// path). User A's slot, on the stream's master, is migrating; A's rate key is still on the old
// master and the new reservation's key is not, so A's limit+reserve script gets TRYAGAIN. The
// auto-pipeline batched it, first, with user B's XADD to the stream (same master). go-redis's
// ClusterClient retries the WHOLE node batch when its first command fails with a retryable error
// (pipelineReadCmds: cmds[0].rawErr() -> mapCmdsByNode(failedCmds, cmds)), up to MaxRedirects
// times: B's XADD, which succeeded, ran again each time (four copies of B's check-in). Now A's
// request fails (503: the client retries) and B's XADD runs once.
func TestClusterTryAgainRunsAnotherRequestsXAddOnce(t *testing.T) {
	t.Parallel()
	cl := redistest.StartCluster(t, redistest.ClusterOptions{})
	ctx := context.Background()
	keys, err := adapters.NewKeySpace("r10c", true)
	require.NoError(t, err)
	check := redistest.ClusterClient(t, cl.URL())
	pipe, block, pub, _, l := clusterIngest(t, cl, keys, "100/s,burst=100")

	streamSlot := adapters.KeySlot(keys.Stream())
	streamMaster := cl.MasterOf(t, streamSlot)
	var userA int64
	for u := int64(1); u < 1000; u++ {
		s := adapters.KeySlot(keys.RateLimitUser(u))
		if s != streamSlot && cl.MasterOf(t, s) == streamMaster {
			userA = u
			break
		}
	}
	require.NotZero(t, userA)
	const userB = 5000
	// Warm up: the store's first look at the keyspace, a check-in on the stream, A's rate key.
	_, _, err = l.AllowAndReserve(ctx, ingestRecord(userB+1, "warm", 1))
	require.NoError(t, err)
	require.NoError(t, pub.PublishCheckinRecorded(ctx, domain.CheckinRecorded{Checkin: domain.Checkin{ID: "warm", UserID: userB + 1, LocationID: 1, Timestamp: 5}, RecordedAt: 5}, ""))
	_, err = l.Allow(ctx, userA)
	require.NoError(t, err)

	cl.StartSlotMigration(t, adapters.KeySlot(keys.RateLimitUser(userA)))

	go func() { _, _ = pipe.Do(ctx, "ECHO", "block") }() // the worker is busy: the next two share a batch
	<-block.started
	var wg sync.WaitGroup
	wg.Add(2)
	var errA, errB error
	go func() {
		defer wg.Done()
		_, _, errA = l.AllowAndReserve(ctx, ingestRecord(userA, "ck-a", 1))
	}()
	time.Sleep(30 * time.Millisecond)
	go func() {
		defer wg.Done()
		ev := domain.CheckinRecorded{Checkin: domain.Checkin{ID: "ck-b", UserID: userB, LocationID: 2, StarRating: 3, Timestamp: 7}, RecordedAt: 7, Fingerprint: "fp-b"}
		errB = pub.PublishCheckinRecorded(ctx, ev, "")
	}()
	wg.Wait()
	t.Logf("A (migrating slot): %v; B: %v", errA, errB)
	require.Error(t, errA, "A's script met the migrating slot")

	xs, err := check.XRange(ctx, keys.Stream(), "-", "+").Result()
	require.NoError(t, err)
	n := 0
	for _, x := range xs {
		if x.Values[domain.FieldCheckinID] == "ck-b" {
			n++
		}
	}
	assert.NoError(t, errB)
	assert.Equal(t, 1, n, "B published once; its XADD ran %d times", n)
}

// TestClusterTryAgainRunsAnotherUsersScriptOnce: a cluster with stream partitions
// (the one-step path: limit, reservation and XADD in one script). User A's partition slot is
// migrating, so A's script gets TRYAGAIN; user B's script, on the same master and batched after
// it, ran and recorded B's check-in, but go-redis sends the node's whole batch again (up to
// MaxRedirects times): B's script ran again, counted B's limit again and, B having one request of
// quota, answered "refused": B's only request got 429 while its check-in was on the stream. Now
// B's script runs once and B's request is recorded.
func TestClusterTryAgainRunsAnotherUsersScriptOnce(t *testing.T) {
	t.Parallel()
	cl := redistest.StartCluster(t, redistest.ClusterOptions{})
	ctx := context.Background()
	keys, err := adapters.NewKeySpace("r10p", true)
	require.NoError(t, err)
	keys, err = keys.WithPartitions(adapters.DefaultClusterPartitions)
	require.NoError(t, err)
	check := redistest.ClusterClient(t, cl.URL())
	pipe, block, pub, idem, l := clusterIngest(t, cl, keys, "1/m,burst=1")
	rp, err := adapters.NewReservingPublisher(pub, pipe, idem, l)
	require.NoError(t, err)
	h := lateReplyHandler(t, pub, idem).WithUserLimit(l).WithReservingPublisher(rp)

	slotOf := func(u int64) int { return adapters.KeySlot(keys.Partitions().StreamOf(u)) }
	var userA, userB int64
	for a := int64(1); a < 200 && userB == 0; a++ {
		for b := a + 1; b < 200; b++ {
			if slotOf(a) != slotOf(b) && cl.MasterOf(t, slotOf(a)) == cl.MasterOf(t, slotOf(b)) {
				userA, userB = a, b
				break
			}
		}
	}
	require.NotZero(t, userB)
	// A's earlier check-in: A's partition stream and rate key exist on the slot's master.
	_, err = h.Handle(ctx, command.RecordCheckin{Input: input(ptr("a-0"), userA, 1, 1, nil), LimitUser: userA})
	require.NoError(t, err)
	cl.StartSlotMigration(t, slotOf(userA))

	go func() { _, _ = pipe.Do(ctx, "ECHO", "block") }()
	<-block.started
	var wg sync.WaitGroup
	wg.Add(2)
	var errA, errB error
	go func() {
		defer wg.Done()
		_, errA = h.Handle(ctx, command.RecordCheckin{Input: input(ptr("ck-a"), userA, 1, 1, nil), LimitUser: userA})
	}()
	time.Sleep(30 * time.Millisecond)
	go func() {
		defer wg.Done()
		_, errB = h.Handle(ctx, command.RecordCheckin{Input: input(ptr("ck-b"), userB, 2, 3, nil), LimitUser: userB})
	}()
	wg.Wait()
	t.Logf("A (migrating slot): %v; B: %v", errA, errB)
	xs, err := check.XRange(ctx, keys.Partitions().StreamOf(userB), "-", "+").Result()
	require.NoError(t, err)
	n := 0
	for _, x := range xs {
		if x.Values[domain.FieldCheckinID] == "ck-b" {
			n++
		}
	}
	assert.Equal(t, 1, n, "B's check-in is on the stream")
	assert.NoError(t, errB, "B's only request, recorded, must not be refused")
}

// clusterIngest wires the API's ingest on cl as cmd/checkins does, with the per-user limit
// policy: one auto-pipeline worker, whose client's ECHO block holds it up (block) so that the
// next commands share a batch.
func clusterIngest(t *testing.T, cl *redistest.Cluster, keys adapters.KeySpace, policy string) (*adapters.AutoPipeline, *blockingEchoHook,
	*adapters.EventPublisher, *adapters.IdempotencyStore, *adapters.RedisRateLimiter) {
	t.Helper()
	ctx := context.Background()
	newClient := func() redis.UniversalClient {
		c, err := adapters.NewUniversalRedisClient(ctx, adapters.ClientOptions{URL: cl.URL()})
		require.NoError(t, err)
		t.Cleanup(func() { _ = c.Close() })
		return c
	}
	pipeClient := newClient()
	block := &blockingEchoHook{delay: 300 * time.Millisecond, started: make(chan struct{})}
	pipeClient.AddHook(block)
	pipe := adapters.NewAutoPipeline(pipeClient, 64, 1)
	t.Cleanup(func() { _ = pipe.Close() })
	pub, err := adapters.NewPipelinedEventPublisher(newClient(), pipe, keys, watermill.NopLogger{})
	require.NoError(t, err)
	idem := adapters.NewIdempotencyStore(newClient(), keys, time.Hour).WithAutoPipeline(pipe)
	p, err := command.ParseRateLimit(policy)
	require.NoError(t, err)
	l, err := adapters.NewRedisRateLimiter(newClient(), pipe, keys, p)
	require.NoError(t, err)
	return pipe, block, pub, idem, l.WithReservations(idem)
}
