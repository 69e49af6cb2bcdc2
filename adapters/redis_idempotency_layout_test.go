package adapters_test

import (
	"context"
	"fmt"
	"strconv"
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

// TestIdempotencyRecordsOfAnEarlierLayoutStillAnswer: a cluster keyspace with partitions keeps
// its records in the partitions' slots ("p<P>"). Records in the layout it replaced still decide
// for IDEMPOTENCY_TTL after the switch: those an earlier version wrote in the users' slots, and
// after a `partitions migrate` those of the old partition count. A retry of such a check-in
// finds its record (and the record moves to the current key with its remaining TTL), another
// user is not bound by it, and the one-script path stands aside meanwhile. A new keyspace looks
// nothing up. (Key names only: one server holds them here.)
func TestIdempotencyRecordsOfAnEarlierLayoutStillAnswer(t *testing.T) {
	t.Parallel()
	env := newProjEnv(t)
	ctx := context.Background()
	const old = `P{"f":"fp-old","id":"%s","u":7,"l":2,"s":3,"t":10,"r":11}`
	clusterKeys := func(prefix string, p int) adapters.KeySpace {
		k, err := adapters.NewKeySpace(prefix, true)
		require.NoError(t, err)
		k, err = k.WithPartitions(p)
		require.NoError(t, err)
		return k
	}
	meta := func(k adapters.KeySpace) map[string]string {
		m, err := env.client.HGetAll(ctx, k.Meta()).Result()
		require.NoError(t, err)
		return m
	}
	retry := func(id string, user int64) command.IdempotencyRecord {
		return command.IdempotencyRecord{Fingerprint: "fp-new", Owner: "o", Checkin: domain.Checkin{ID: id, UserID: user}}
	}
	answers := func(store *adapters.IdempotencyStore, k adapters.KeySpace, id string) {
		t.Helper()
		got, err := store.Reserve(ctx, retry(id, 8))
		require.NoError(t, err)
		assert.Nil(t, got, "user 8 is not bound by user 7's record")
		got, err = store.Reserve(ctx, retry(id, 7))
		require.NoError(t, err)
		require.NotNil(t, got, "user 7's record of the earlier layout answers")
		assert.Equal(t, "fp-old", got.Fingerprint)
		ttl, err := env.client.PTTL(ctx, k.Idempotency(7, id)).Result()
		require.NoError(t, err)
		assert.Greater(t, ttl, time.Duration(0))
		assert.LessOrEqual(t, ttl, time.Hour, "moved with its remaining TTL")
	}

	// An earlier version on a cluster with 24 partitions: entries, and records in users' slots.
	k24 := clusterKeys(env.keys.Prefix+"up", 24)
	require.NoError(t, env.client.XAdd(ctx, &redis.XAddArgs{Stream: k24.Partitions().StreamOf(7), Values: map[string]any{"x": "y"}}).Err())
	userKey, err := k24.IdempotencyIn(adapters.IdemLayoutUser, 7, "c-old")
	require.NoError(t, err)
	require.NoError(t, env.client.Set(ctx, userKey, fmt.Sprintf(old, "c-old"), time.Hour).Err())
	store := adapters.NewIdempotencyStore(env.client, k24, 2*time.Hour)
	answers(store, k24, "c-old")
	m := meta(k24)
	assert.Equal(t, "p24", m["idem-layout"])
	left, err := strconv.ParseInt(m["idem-retired:user"], 10, 64)
	require.NoError(t, err, "when the users' slots were left: %v", m)
	assert.InDelta(t, time.Now().UnixMilli(), left, 60_000)
	assert.Len(t, m, 2, "the layout in use and the one left")

	// The one-script path stands aside while such records may exist, and takes over after.
	pipe := adapters.NewAutoPipeline(redistest.Client(t, env.url), 8, 1)
	t.Cleanup(func() { _ = pipe.Close() })
	pub, err := adapters.NewPipelinedEventPublisher(redistest.Client(t, env.url), pipe, k24, watermill.NopLogger{})
	require.NoError(t, err)
	rp, err := adapters.NewReservingPublisher(pub, pipe, store, nil)
	require.NoError(t, err)
	_, _, ok, err := rp.ReserveAndPublish(ctx, ingestRecord(9, "a", 1), "", false)
	require.NoError(t, err)
	assert.False(t, ok, "records of the users' slots may exist: the two-step path looks them up")
	later := adapters.NewIdempotencyStore(env.client, k24, 2*time.Hour).WithClock(func() time.Time { return time.Now().Add(3 * time.Hour) })
	rpLater, err := adapters.NewReservingPublisher(pub, pipe, later, nil)
	require.NoError(t, err)
	_, _, ok, err = rpLater.ReserveAndPublish(ctx, ingestRecord(9, "b", 1), "", false)
	require.NoError(t, err)
	assert.True(t, ok, "IDEMPOTENCY_TTL after the switch: one script")

	// `partitions migrate --to 8`: records of the 24 partitions' slots answer on 8.
	p24Key := k24.Idempotency(7, "c-mig")
	require.NoError(t, env.client.Set(ctx, p24Key, fmt.Sprintf(old, "c-mig"), time.Hour).Err())
	k8 := clusterKeys(env.keys.Prefix+"up", 8)
	require.NotEqual(t, p24Key, k8.Idempotency(7, "c-mig"))
	answers(adapters.NewIdempotencyStore(env.client, k8, 2*time.Hour), k8, "c-mig")
	m = meta(k8)
	assert.Equal(t, "p8", m["idem-layout"])
	assert.NotEmpty(t, m["idem-retired:p24"])
	// Both earlier layouts are looked up: user 7's record in the users' slots, moved to the 24
	// partitions' slots above, answers on 8 too; and so does the reservation user 8 made there.
	store8 := adapters.NewIdempotencyStore(env.client, k8, 2*time.Hour)
	for _, user := range []int64{7, 8} {
		got, err := store8.Reserve(ctx, retry("c-old", user))
		require.NoError(t, err)
		require.NotNil(t, got, "user %d's record answers after the migration", user)
		assert.Equal(t, user, got.Checkin.UserID)
	}

	// A new cluster keyspace (its partitions exist, empty, as serve's projectors create them).
	fresh := clusterKeys(env.keys.Prefix+"fresh", 24)
	for _, st := range fresh.Partitions().Streams() {
		require.NoError(t, env.client.XGroupCreateMkStream(ctx, st, "g", "0").Err())
	}
	freshStore := adapters.NewIdempotencyStore(env.client, fresh, 2*time.Hour)
	freshPub, err := adapters.NewPipelinedEventPublisher(redistest.Client(t, env.url), pipe, fresh, watermill.NopLogger{})
	require.NoError(t, err)
	rpFresh, err := adapters.NewReservingPublisher(freshPub, pipe, freshStore, nil)
	require.NoError(t, err)
	_, _, ok, err = rpFresh.ReserveAndPublish(ctx, ingestRecord(9, "a", 1), "", false)
	require.NoError(t, err)
	assert.True(t, ok, "nothing to look up: one script from the start")
	assert.Equal(t, map[string]string{"idem-layout": "p24", "idem-format": "compact"}, meta(fresh),
		"a keyspace no earlier release served writes compact records from the start")

	// A stream moved from a single server (README, From a single Redis to a cluster): its
	// partitions hold entries and no layout is recorded, which looks like an upgrade; the
	// `HSET <prefix>:meta idem-layout p24` of the move's last step makes the first process
	// record nothing and take the one-script path at once. Without it, it records the users'
	// slots as left now and looks there for IDEMPOTENCY_TTL.
	for _, hset := range []bool{true, false} {
		moved := clusterKeys(fmt.Sprintf("%smoved-%t", env.keys.Prefix, hset), 24)
		require.NoError(t, env.client.XAdd(ctx, &redis.XAddArgs{Stream: moved.Partitions().StreamOf(3), Values: map[string]any{"x": "y"}}).Err())
		if hset {
			require.NoError(t, env.client.HSet(ctx, moved.Meta(), "idem-layout", "p24").Err())
		}
		movedPub, err := adapters.NewPipelinedEventPublisher(redistest.Client(t, env.url), pipe, moved, watermill.NopLogger{})
		require.NoError(t, err)
		rpMoved, err := adapters.NewReservingPublisher(movedPub, pipe, adapters.NewIdempotencyStore(env.client, moved, 2*time.Hour), nil)
		require.NoError(t, err)
		_, _, ok, err = rpMoved.ReserveAndPublish(ctx, ingestRecord(9, "a", 1), "", false)
		require.NoError(t, err)
		if hset {
			assert.True(t, ok, "with the layout recorded by hand: one script from the start")
			assert.Equal(t, map[string]string{"idem-layout": "p24"}, meta(moved))
		} else {
			assert.False(t, ok, "without it: the two-step path, looking in the users' slots")
			assert.Contains(t, meta(moved), "idem-retired:user")
		}
	}

	// A single server (and one stream on a cluster) records no layout in <prefix>:meta; a new
	// one records only the format of its records.
	single := adapters.KeySpace{Prefix: env.keys.Prefix + "single"}
	_, err = adapters.NewIdempotencyStore(env.client, single, time.Hour).Reserve(ctx, retry("s", 1))
	require.NoError(t, err)
	assert.Equal(t, map[string]string{"idem-format": "compact"}, meta(single))
}

// TestIdempotencyLayoutsSideBySide: while API processes of two layouts run at once (a rolling
// change of INGEST_MIN_REPLICAS on a cluster with partitions: the users' slots with it, the
// partitions' without), each finds the records the other writes, because each reads the layouts
// again every refresh and records the other's as left. Without the refresh the one that started
// first never learns of the other layout.
func TestIdempotencyLayoutsSideBySide(t *testing.T) {
	t.Parallel()
	env := newProjEnv(t)
	ctx := context.Background()
	rec := func(id string) command.IdempotencyRecord {
		return command.IdempotencyRecord{Fingerprint: "fp-" + id, Owner: "o", Checkin: domain.Checkin{ID: id, UserID: 7}}
	}
	for _, refresh := range []time.Duration{10 * time.Millisecond, time.Hour} {
		t.Run(refresh.String(), func(t *testing.T) {
			k, err := adapters.NewKeySpace(env.keys.Prefix+"mixed"+refresh.String(), true)
			require.NoError(t, err)
			k, err = k.WithPartitions(24)
			require.NoError(t, err)
			durable := k.WithRecordsInUserSlots()
			require.NotEqual(t, k.Idempotency(7, "x"), durable.Idempotency(7, "x"))
			id := "c-" + refresh.String()
			fast := adapters.NewIdempotencyStore(env.client, k, time.Hour).WithLayoutRefresh(refresh)
			got, err := fast.Reserve(ctx, rec("warm-"+id)) // reads the layouts first
			require.NoError(t, err)
			require.Nil(t, got)
			slow := adapters.NewIdempotencyStore(env.client, durable, time.Hour).WithLayoutRefresh(refresh)
			got, err = slow.Reserve(ctx, rec(id)) // the other layout starts, and records it
			require.NoError(t, err)
			require.Nil(t, got)
			time.Sleep(50 * time.Millisecond)
			got, err = fast.Reserve(ctx, rec(id))
			require.NoError(t, err)
			if refresh == time.Hour {
				assert.Nil(t, got, "without a refresh the first store never looks in the other layout")
				return
			}
			require.NotNil(t, got, "the first store finds the record the other layout wrote")
			assert.Equal(t, "fp-"+id, got.Fingerprint)
			got, err = slow.Reserve(ctx, rec("warm-"+id))
			require.NoError(t, err)
			require.NotNil(t, got, "and the other finds the first's")
		})
	}
}
