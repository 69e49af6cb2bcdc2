package adapters_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/checkins/checkins/adapters"
	"github.com/checkins/checkins/adapters/redistest"
	"github.com/checkins/checkins/app/command"
	"github.com/checkins/checkins/app/ops"
	"github.com/checkins/checkins/app/projection"
	"github.com/checkins/checkins/domain"
)

// userOn is a user whose check-ins go to partition i of p.
func userOn(i, p int) int64 {
	for u := int64(1); ; u++ {
		if adapters.PartitionOf(u, p) == i {
			return u
		}
	}
}

func checkinValues(id string, user int64) map[string]any {
	ev := domain.CheckinRecorded{Checkin: domain.Checkin{ID: id, UserID: user, LocationID: 1, StarRating: 3, Timestamp: 1_700_000_000_000},
		RecordedAt: 1_700_000_000_000}
	out := map[string]any{}
	for k, v := range ev.Fields() {
		out[k] = v
	}
	return out
}

// twoPartitions is a private key space whose stream has two partitions, and a user whose
// check-ins go to each.
func twoPartitions(t *testing.T) (*redis.Client, adapters.KeySpace, adapters.Partitions, int64, int64) {
	t.Helper()
	rdb := redistest.Open(t)
	client := redistest.Client(t, rdb.URL)
	keys := adapters.KeySpace{Prefix: rdb.Prefix}
	k2, err := keys.WithPartitions(2)
	require.NoError(t, err)
	require.NoError(t, adapters.EnsurePartitions(context.Background(), client, keys, 2))
	return client, keys, k2.Partitions(), userOn(0, 2), userOn(1, 2)
}

// TestMigrateMergesPartitionsExactly: 2 -> 1 where both old partitions hold entry IDs 1-1 and
// 2-0 (each stream numbers its own), and the live group stood at different places on each.
// The merged stream holds every entry in ID order, partition 0 first on a tie, the later copy of
// a shared ID renumbered to the next free one; the group stands at the last entry it had
// delivered, the ones before it that it had not are pending for partitions-migrate (idle, to be
// taken over) and every delivered one is acknowledged; the registry is translated; an invalid
// entry goes to partition 0.
func TestMigrateMergesPartitionsExactly(t *testing.T) {
	t.Parallel()
	client, keys, parts, u0, u1 := twoPartitions(t)
	ctx := context.Background()
	add := func(stream, id string, values map[string]any) {
		require.NoError(t, client.XAdd(ctx, &redis.XAddArgs{Stream: stream, ID: id, Values: values}).Err())
	}
	add(parts.Stream(0), "1-1", checkinValues("a", u0))
	add(parts.Stream(0), "2-0", checkinValues("b", u0))
	add(parts.Stream(0), "3-0", checkinValues("c", u0))
	add(parts.Stream(1), "1-1", checkinValues("d", u1))
	add(parts.Stream(1), "2-0", map[string]any{"hello": "world"}) // not a check-in
	add(parts.Stream(1), "4-0", checkinValues("e", u1))
	// live delivered a (1-1) on partition 0, everything on partition 1.
	require.NoError(t, client.XGroupCreate(ctx, parts.Stream(0), "live", "1-1").Err())
	require.NoError(t, client.XGroupCreate(ctx, parts.Stream(1), "live", "4-0").Err())
	for i := range 2 {
		require.NoError(t, client.HSet(ctx, parts.Registry(i), "live:live", `{"users.v1":{"join":"0-0","own":"done","doneAt":"1"}}`,
			"acked:live", map[int]string{0: "1-1", 1: "4-0"}[i]).Err())
	}

	mp, err := command.NewMigratePartitions(adapters.NewPartitionMigrator(client, keys))
	require.NoError(t, err)
	res, err := mp.Handle(ctx, command.MigrateRequest{To: 1, Batch: 2})
	require.NoError(t, err)
	assert.EqualValues(t, 6, res.Copy.Copied)
	assert.EqualValues(t, 2, res.Copy.Renumbered, "d's 1-1 and the invalid entry's 2-0 were taken")

	msgs, err := client.XRange(ctx, keys.Stream(), "-", "+").Result()
	require.NoError(t, err)
	var got []string
	for _, m := range msgs {
		id, _ := m.Values["checkinId"].(string)
		if id == "" {
			id = "bad"
		}
		got = append(got, m.ID+" "+id)
	}
	assert.Equal(t, []string{"1-1 a", "1-2 d", "2-0 b", "2-1 bad", "3-0 c", "4-0 e"}, got)
	sortedEntries(t, rawFieldNames(t, client, keys.Stream()), 6) // the copies keep the stream's field order

	gs, err := client.XInfoGroups(ctx, keys.Stream()).Result()
	require.NoError(t, err)
	require.Len(t, gs, 1)
	assert.Equal(t, "4-0", gs[0].LastDeliveredID, "live stands at the last entry it had delivered")
	assert.EqualValues(t, 6, gs[0].EntriesRead)
	pel, err := client.XPendingExt(ctx, &redis.XPendingExtArgs{Stream: keys.Stream(), Group: "live", Start: "-", End: "+", Count: 10}).Result()
	require.NoError(t, err)
	var pending []string
	for _, p := range pel {
		pending = append(pending, p.ID+" "+p.Consumer)
		assert.Greater(t, p.Idle.Hours(), 1.0, "idle: taken over at once")
	}
	assert.Equal(t, []string{"2-0 partitions-migrate", "3-0 partitions-migrate"}, pending, "b and c had not been delivered")

	reg, err := client.HGetAll(ctx, keys.Projections()).Result()
	require.NoError(t, err)
	assert.Equal(t, "1-2", reg["acked:live"], "acknowledged through a and d, the first two of the merged stream")
	m, err := adapters.ParseMembership("live", reg["live:live"])
	require.NoError(t, err)
	assert.Equal(t, "0-0", m.Members["users.v1"].Join)
	assert.Equal(t, "done", m.Members["users.v1"].Own)
	for i := range 2 {
		assert.Zero(t, client.Exists(ctx, parts.Stream(i), parts.Registry(i)).Val(), "old partition %d deleted", i)
	}
	assert.Equal(t, "1", client.HGet(ctx, keys.Meta(), "partitions").Val())
	assert.Zero(t, client.HExists(ctx, keys.Meta(), "quiesce").Val())

	res, err = mp.Handle(ctx, command.MigrateRequest{To: 1})
	require.NoError(t, err)
	assert.True(t, res.NoOp)
}

// TestMigrateMovesTheDecisionOfARenumberedEntry: merging partitions renumbers an entry whose ID
// the other partition holds too. The dedupe registry remembers the counted copy of a check-in
// by its entry's position, so the migration moves that memory with the entry: a consumer group
// that had not applied it yet (a rebuild behind the live group) counts it at its new ID, the
// group that had applied it sees a redelivery, and a later copy is still a duplicate.
func TestMigrateMovesTheDecisionOfARenumberedEntry(t *testing.T) {
	t.Parallel()
	client, keys, parts, u0, u1 := twoPartitions(t)
	ctx := context.Background()
	d := checkinValues("d", u1)
	require.NoError(t, client.XAdd(ctx, &redis.XAddArgs{Stream: parts.Stream(0), ID: "5-0", Values: checkinValues("a", u0)}).Err())
	require.NoError(t, client.XAdd(ctx, &redis.XAddArgs{Stream: parts.Stream(1), ID: "5-0", Values: d}).Err())
	fields := map[string]string{}
	for k, v := range d {
		fields[k] = v.(string)
	}
	parsed, err := domain.ParseEvent("5-0", fields)
	require.NoError(t, err)
	ev := parsed.(domain.CheckinRecorded)

	applier, err := adapters.NewProjectionApplier(client, keys, 0)
	require.NoError(t, err)
	out, err := applier.ApplyEvent(ctx, "live", projection.UserStats{}, 1, ev, "5-0")
	require.NoError(t, err)
	require.Equal(t, projection.Applied, out, "live counted d at 5-0 on partition 1")

	mp, err := command.NewMigratePartitions(adapters.NewPartitionMigrator(client, keys))
	require.NoError(t, err)
	res, err := mp.Handle(ctx, command.MigrateRequest{To: 1})
	require.NoError(t, err)
	require.EqualValues(t, 1, res.Copy.Renumbered)
	msgs, err := client.XRange(ctx, keys.Stream(), "5-1", "5-1").Result()
	require.NoError(t, err)
	require.Len(t, msgs, 1)
	require.Equal(t, "d", msgs[0].Values["checkinId"], "d took the next free ID")

	out, err = applier.ApplyEvent(ctx, "users.v2", projection.UserStats{}, 2, ev, "5-1")
	require.NoError(t, err)
	assert.Equal(t, projection.Applied, out, "a group that had not applied d counts it at its new ID")
	out, err = applier.ApplyEvent(ctx, "live", projection.UserStats{}, 1, ev, "5-1")
	require.NoError(t, err)
	assert.Equal(t, projection.AlreadyApplied, out, "the group that had applied it sees a redelivery")
	out, err = applier.ApplyEvent(ctx, "users.v2", projection.UserStats{}, 2, ev, "9-0")
	require.NoError(t, err)
	assert.Equal(t, projection.Duplicate, out, "a copy published later is still a duplicate")
	for v := 1; v <= 2; v++ {
		n, err := client.HGet(ctx, keys.ProjectionPrefix("users", v)+"{user:"+strconv.FormatInt(u1, 10)+"}:stats", "numCheckins").Int64()
		require.NoError(t, err)
		assert.Equal(t, int64(1), n, "users v%d counts d once", v)
	}
}

// lateProducer is the real migrator with a producer that XADDs to the old partitions after the
// copy, as one writing to the stream directly would while the API stands still: right before
// the groups are positioned (beforePosition) or right after.
type lateProducer struct {
	*adapters.PartitionMigrator
	beforePosition bool
	add            func()
}

func (l lateProducer) Position(ctx context.Context, from, to, batch int, force bool, seen []string) (command.PositionResult, error) {
	if l.beforePosition {
		l.add()
	}
	r, err := l.PartitionMigrator.Position(ctx, from, to, batch, force, seen)
	if !l.beforePosition {
		l.add()
	}
	return r, err
}

// TestMigrateCopiesEntriesAddedAfterTheCopy: entries a producer adds to the old partitions
// after the copy read them are copied to their new partitions before the old ones are deleted,
// each once, after what the new partition holds.
func TestMigrateCopiesEntriesAddedAfterTheCopy(t *testing.T) {
	t.Parallel()
	client, keys, old, u0, u1 := twoPartitions(t)
	ctx := context.Background()
	want := map[string]bool{}
	add := func(stream, id, checkin string, user int64) {
		t.Helper()
		require.NoError(t, client.XAdd(ctx, &redis.XAddArgs{Stream: stream, ID: id, Values: checkinValues(checkin, user)}).Err())
		want[checkin] = true
	}
	add(old.Stream(0), "1-0", "a", u0)
	add(old.Stream(1), "1-0", "b", u1)
	add(old.Stream(1), "2-0", "c", u1)
	late := 0
	lp := lateProducer{adapters.NewPartitionMigrator(client, keys), false, func() {
		add(old.Stream(0), "3-0", "late-a", u0)
		add(old.Stream(1), "*", "late-b", u1)
		add(old.Stream(1), "*", "late-c", u1)
		late += 3
	}}
	mp, err := command.NewMigratePartitions(lp)
	require.NoError(t, err)
	var said []string
	res, err := mp.Handle(ctx, command.MigrateRequest{To: 3, Report: func(s string) { said = append(said, s) }})
	require.NoError(t, err)
	assert.EqualValues(t, late, res.Copy.Late)
	assert.Contains(t, strings.Join(said, "\n"), "copied 3 entries added to the old partitions during the migration")

	k3, err := keys.WithPartitions(3)
	require.NoError(t, err)
	got := map[string]int{}
	for j, s := range k3.Partitions().Streams() {
		msgs, err := client.XRange(ctx, s, "-", "+").Result()
		require.NoError(t, err)
		for i, m := range msgs {
			got[m.Values["checkinId"].(string)]++
			if i > 0 {
				prev, _ := ops.ParseEntryID(msgs[i-1].ID)
				cur, _ := ops.ParseEntryID(m.ID)
				assert.True(t, prev.Less(cur), "partition %d in ID order", j)
			}
		}
		assert.Empty(t, client.HKeys(ctx, k3.Partitions().Registry(j)).Val(), "partition %d's registry has no tail marks left", j)
	}
	for c := range want {
		assert.Equal(t, 1, got[c], "%s copied once", c)
	}
	assert.Len(t, got, len(want))
	for i := range 2 {
		assert.Zero(t, client.Exists(ctx, old.Stream(i)).Val(), "old partition %d deleted", i)
	}
}

// TestMigrateCleanupCarriesOnATailCopy: a cleanup that copied an old partition's late entry and
// crashed before deleting the partition, run again, copies nothing twice.
func TestMigrateCleanupCarriesOnATailCopy(t *testing.T) {
	t.Parallel()
	rdb := redistest.Open(t)
	client := redistest.Client(t, rdb.URL)
	ctx := context.Background()
	keys := adapters.KeySpace{Prefix: rdb.Prefix}
	src := keys.Stream() // one old partition
	require.NoError(t, client.XAdd(ctx, &redis.XAddArgs{Stream: src, ID: "1-0", Values: checkinValues("a", 7)}).Err())
	require.NoError(t, client.XAdd(ctx, &redis.XAddArgs{Stream: src, ID: "2-0", Values: checkinValues("late", 7)}).Err())
	k2, err := keys.WithPartitions(2)
	require.NoError(t, err)
	dst := k2.Partitions()
	j := adapters.PartitionOf(7, 2)
	// What the first run left: a copied, and the late entry copied with its mark.
	require.NoError(t, client.XAdd(ctx, &redis.XAddArgs{Stream: dst.Stream(j), ID: "1-0", Values: checkinValues("a", 7)}).Err())
	require.NoError(t, client.XAdd(ctx, &redis.XAddArgs{Stream: dst.Stream(j), ID: "2-0", Values: checkinValues("late", 7)}).Err())
	require.NoError(t, client.HSet(ctx, dst.Registry(j), "migrate-tail:0", "2-0").Err())

	n, err := adapters.NewPartitionMigrator(client, keys).Cleanup(ctx, 1, 2, []string{"1-0"})
	require.NoError(t, err)
	assert.Zero(t, n, "the late entry was copied by the first run")
	assert.Equal(t, int64(2), client.XLen(ctx, dst.Stream(j)).Val())
	assert.Zero(t, client.Exists(ctx, src).Val(), "the old stream is deleted")
	assert.Empty(t, client.HKeys(ctx, dst.Registry(j)).Val())
}

// TestMigrateCleanupRerunAfterAPartialOne: a cleanup that stopped after deleting the first old
// partition, run again, deletes the rest and takes the missing one for deleted.
func TestMigrateCleanupRerunAfterAPartialOne(t *testing.T) {
	t.Parallel()
	rdb := redistest.Open(t)
	client := redistest.Client(t, rdb.URL)
	ctx := context.Background()
	keys := adapters.KeySpace{Prefix: rdb.Prefix}
	k2, err := keys.WithPartitions(2)
	require.NoError(t, err)
	old := k2.Partitions()
	require.NoError(t, client.XAdd(ctx, &redis.XAddArgs{Stream: old.Stream(1), ID: "4-0", Values: checkinValues("b", userOn(1, 2))}).Err())
	// Partition 0 (last entry 3-0) is gone already; 1 still holds what the copy read.
	n, err := adapters.NewPartitionMigrator(client, keys).Cleanup(ctx, 2, 1, []string{"3-0", "4-0"})
	require.NoError(t, err)
	assert.Zero(t, n)
	assert.Zero(t, client.Exists(ctx, old.Stream(0), old.Stream(1)).Val())
	assert.Zero(t, client.XLen(ctx, keys.Stream()).Val(), "nothing copied: partition 1 had nothing late")
}

// TestMigratePositionsOnWhatTheCopyRead: an entry added to an old partition after the copy, with
// an ID below another partition's (explicit IDs, or masters' clocks apart), does not move where
// the groups are positioned: a group that had delivered everything stands at the last copied
// entry with nothing pending, and the late entry comes after it, to be delivered.
func TestMigratePositionsOnWhatTheCopyRead(t *testing.T) {
	t.Parallel()
	client, keys, old, u0, u1 := twoPartitions(t)
	ctx := context.Background()
	add := func(stream, id, checkin string, user int64) {
		t.Helper()
		require.NoError(t, client.XAdd(ctx, &redis.XAddArgs{Stream: stream, ID: id, Values: checkinValues(checkin, user)}).Err())
	}
	add(old.Stream(0), "5-0", "a", u0)
	add(old.Stream(1), "5-0", "b", u1)
	add(old.Stream(1), "5-1", "c", u1)
	require.NoError(t, client.XGroupCreate(ctx, old.Stream(0), "live", "5-0").Err())
	require.NoError(t, client.XGroupCreate(ctx, old.Stream(1), "live", "5-1").Err())
	mp, err := command.NewMigratePartitions(lateProducer{adapters.NewPartitionMigrator(client, keys), true, func() {
		add(old.Stream(0), "5-1", "late", u0)
	}})
	require.NoError(t, err)
	_, err = mp.Handle(ctx, command.MigrateRequest{To: 1})
	require.NoError(t, err)

	msgs, err := client.XRange(ctx, keys.Stream(), "-", "+").Result()
	require.NoError(t, err)
	var got []string
	for _, m := range msgs {
		got = append(got, m.ID+" "+m.Values["checkinId"].(string))
	}
	assert.Equal(t, []string{"5-0 a", "5-1 b", "5-2 c", "5-3 late"}, got)
	gs, err := client.XInfoGroups(ctx, keys.Stream()).Result()
	require.NoError(t, err)
	require.Len(t, gs, 1)
	assert.Equal(t, "5-2", gs[0].LastDeliveredID, "live had delivered a, b and c")
	assert.Zero(t, gs[0].Pending)
	assert.EqualValues(t, 1, gs[0].Lag, "the late entry is still to be delivered")
}

// positionGate is a migrator whose Position waits for goOn (or for its run to be stopped) after
// saying it got there.
type positionGate struct {
	*adapters.PartitionMigrator
	entered, goOn chan struct{}
}

func (g positionGate) Position(ctx context.Context, from, to, batch int, force bool, seen []string) (command.PositionResult, error) {
	close(g.entered)
	select {
	case <-g.goOn:
	case <-ctx.Done():
	}
	return g.PartitionMigrator.Position(ctx, from, to, batch, force, seen)
}

// TestMigrateOneRunAtATime: a second `partitions migrate --to N` started while the first still
// works is refused, not taken for a resume: it would read the old layout's groups and, after the
// first run finished and projectors moved on, position them back where they were (every entry
// acknowledged since delivered again). Once the first has ended, a run reports it done; and a
// progress record of a phase this release does not know is refused, not passed over.
func TestMigrateOneRunAtATime(t *testing.T) {
	t.Parallel()
	rdb := redistest.Open(t)
	client := redistest.Client(t, rdb.URL)
	ctx := context.Background()
	keys := adapters.KeySpace{Prefix: rdb.Prefix}
	u0, u1 := userOn(0, 2), userOn(1, 2)
	for i, u := range []int64{u0, u1, u0, u1} {
		require.NoError(t, client.XAdd(ctx, &redis.XAddArgs{Stream: keys.Stream(), Values: checkinValues("c"+strconv.Itoa(i), u)}).Err())
	}
	require.NoError(t, client.XGroupCreate(ctx, keys.Stream(), "live", "$").Err())

	a := positionGate{adapters.NewPartitionMigrator(client, keys), make(chan struct{}), make(chan struct{})}
	mpA, err := command.NewMigratePartitions(a)
	require.NoError(t, err)
	aDone := make(chan error, 1)
	go func() {
		_, err := mpA.Handle(ctx, command.MigrateRequest{To: 2, Wait: time.Second})
		aDone <- err
	}()
	<-a.entered

	mpB, err := command.NewMigratePartitions(adapters.NewPartitionMigrator(redistest.Client(t, rdb.URL), keys))
	require.NoError(t, err)
	var saidB []string
	_, err = mpB.Handle(ctx, command.MigrateRequest{To: 2, Wait: time.Second, LockWait: 300 * time.Millisecond, Report: func(s string) { saidB = append(saidB, s) }})
	require.ErrorIs(t, err, command.ErrMigrationRunning)
	assert.Contains(t, err.Error(), "wait for it to end")
	require.Len(t, saidB, 1, "the second run waited for the lock and did nothing: %q", saidB)
	assert.Contains(t, saidB[0], "another run holds the migration")

	close(a.goOn)
	require.NoError(t, <-aDone)
	res, err := mpB.Handle(ctx, command.MigrateRequest{To: 2, Wait: time.Second})
	require.NoError(t, err)
	assert.True(t, res.NoOp, "once the first run ended, the stream has its 2 partitions")
	assert.Zero(t, client.Exists(ctx, keys.MigrateLock()).Val(), "the lock is let go")

	require.NoError(t, client.HSet(ctx, keys.Meta(), "migrate", `{"from":2,"to":4,"phase":"verify"}`).Err())
	_, err = mpB.Handle(ctx, command.MigrateRequest{To: 4, Wait: time.Second})
	require.Error(t, err)
	assert.Contains(t, err.Error(), `a phase this release does not know, "verify"`)
	assert.Zero(t, client.HExists(ctx, keys.Meta(), "quiesce").Val(), "nothing quiesced")
}

// TestMigrateSettlesForTheLongestRequestTimeout: API processes record their REQUEST_TIMEOUT (the
// longest stays), and a migration run from a CLI with a shorter one waits, after setting the
// flag, for the longest: a request an API process admitted just before must have ended before
// the copy reads the old partitions.
func TestMigrateSettlesForTheLongestRequestTimeout(t *testing.T) {
	t.Parallel()
	rdb := redistest.Open(t)
	client := redistest.Client(t, rdb.URL)
	ctx := context.Background()
	keys := adapters.KeySpace{Prefix: rdb.Prefix}
	for _, d := range []time.Duration{1500 * time.Millisecond, 700 * time.Millisecond} {
		require.NoError(t, adapters.NewQuiesceWatch(client, keys).WithRequestTimeout(d).Check(ctx))
	}
	got, err := adapters.NewPartitionMigrator(client, keys).MaxRequestTimeout(ctx)
	require.NoError(t, err)
	assert.Equal(t, 1500*time.Millisecond, got, "the longest stays")

	require.NoError(t, client.XAdd(ctx, &redis.XAddArgs{Stream: keys.Stream(), Values: checkinValues("c", userOn(0, 2))}).Err())
	mp, err := command.NewMigratePartitions(adapters.NewPartitionMigrator(client, keys))
	require.NoError(t, err)
	var said []string
	start := time.Now()
	_, err = mp.Handle(ctx, command.MigrateRequest{To: 2, Wait: time.Second, Settle: 200 * time.Millisecond, RequestTimeout: 100 * time.Millisecond,
		Report: func(s string) { said = append(said, s) }})
	require.NoError(t, err)
	assert.GreaterOrEqual(t, time.Since(start), 1600*time.Millisecond)
	require.GreaterOrEqual(t, len(said), 2)
	assert.Contains(t, said[0], "an API process ran with REQUEST_TIMEOUT 1.5s", "it says where the longer settle comes from")
	assert.Contains(t, said[1], "waiting 1.6s", "200ms of settle, of which the CLI's 100ms request timeout becomes the recorded 1.5s")
}

// TestMigrateWaitsForReplicasOfTheCopy: with MinReplicas (INGEST_MIN_REPLICAS), a migration whose
// copy the replicas do not have stops before it records the count or deletes the old stream,
// which the replica has had all along; run again once the replica is back, it carries on.
func TestMigrateWaitsForReplicasOfTheCopy(t *testing.T) {
	t.Parallel()
	master, replica, mc := startReplicated(t)
	ctx := context.Background()
	keys := adapters.KeySpace{Prefix: "t-migrate-replicas"}
	for i := range 20 {
		require.NoError(t, mc.XAdd(ctx, &redis.XAddArgs{Stream: keys.Stream(), Values: checkinValues("c"+strconv.Itoa(i), int64(1+i%5))}).Err())
	}
	require.NoError(t, mc.XGroupCreate(ctx, keys.Stream(), "live", "$").Err())
	client := redistest.Client(t, master.URL())
	mp, err := command.NewMigratePartitions(adapters.NewPartitionMigrator(client, keys))
	require.NoError(t, err)
	req := command.MigrateRequest{To: 2, Wait: time.Second, MinReplicas: 1, ReplicaTimeout: 300 * time.Millisecond}

	resume := lagReplica(t, mc, replica.Signal)
	_, err = mp.Handle(ctx, req)
	require.ErrorIs(t, err, domain.ErrNotReplicated)
	assert.ErrorContains(t, err, "the old partitions are kept")
	recorded, err := adapters.NewPartitionMigrator(client, keys).Recorded(ctx)
	require.NoError(t, err)
	assert.Equal(t, 1, recorded, "the count is not recorded")
	assert.EqualValues(t, 20, mc.XLen(ctx, keys.Stream()).Val(), "the old stream is kept")

	resume()
	require.Eventually(t, func() bool {
		_, err := mp.Handle(ctx, req)
		return err == nil
	}, 30*time.Second, 200*time.Millisecond, "the replica is back: the run carries on and ends")
	recorded, err = adapters.NewPartitionMigrator(client, keys).Recorded(ctx)
	require.NoError(t, err)
	assert.Equal(t, 2, recorded)
	assert.Zero(t, mc.Exists(ctx, keys.Stream()).Val(), "the old stream is deleted once the copy is replicated")
}

// TestMigrateStopsWhenItsLockIsTaken: a run whose lock another run took (it could not extend it
// in time) stops at once, saying so, instead of working on beside the other.
func TestMigrateStopsWhenItsLockIsTaken(t *testing.T) {
	t.Parallel()
	rdb := redistest.Open(t)
	client := redistest.Client(t, rdb.URL)
	ctx := context.Background()
	keys := adapters.KeySpace{Prefix: rdb.Prefix}
	require.NoError(t, client.XAdd(ctx, &redis.XAddArgs{Stream: keys.Stream(), Values: checkinValues("c", userOn(0, 2))}).Err())
	require.NoError(t, client.XGroupCreate(ctx, keys.Stream(), "live", "$").Err())
	a := positionGate{adapters.NewPartitionMigrator(client, keys), make(chan struct{}), make(chan struct{})}
	mp, err := command.NewMigratePartitions(a)
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() {
		_, err := mp.Handle(ctx, command.MigrateRequest{To: 2, Wait: time.Second, LockTTL: 300 * time.Millisecond})
		done <- err
	}()
	<-a.entered
	require.NoError(t, client.Set(ctx, keys.MigrateLock(), "another run", time.Minute).Err())
	defer close(a.goOn)
	// At its next extension (every 100ms) the run finds its lock taken and stops: the gate
	// lets it go on when its context ends.
	select {
	case err = <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("the run went on without its lock")
	}
	require.Error(t, err)
	assert.Contains(t, err.Error(), "the migration's lock was lost")
	recorded, err := adapters.NewPartitionMigrator(client, keys).Recorded(ctx)
	require.NoError(t, err)
	assert.Equal(t, 1, recorded, "it stopped before recording the count")
	assert.Equal(t, "another run", client.Get(ctx, keys.MigrateLock()).Val())
}

// TestMigrateRefusesToSplitABackfillingVersion: users.v2 backfills; it joined the live group at
// 10-0 on partition 0 and at 40-0 on partition 1 (a join walks the partitions one after another
// while check-ins arrive). Merged into one partition, x (30-0, partition 0, past the join there)
// comes before h (40-0, partition 1, at the join there): one join for the new partition cannot
// say that x is the live group's and h the own group's, so one of them would be lost to the
// version or counted twice. The migration is refused before it changes anything, naming the
// version; once the backfill is done it goes.
func TestMigrateRefusesToSplitABackfillingVersion(t *testing.T) {
	t.Parallel()
	client, keys, parts, u0, u1 := twoPartitions(t)
	ctx := context.Background()
	for _, e := range []struct {
		p      int
		id, ck string
		user   int64
	}{{0, "10-0", "a", u0}, {0, "30-0", "x", u0}, {1, "40-0", "h", u1}} {
		require.NoError(t, client.XAdd(ctx, &redis.XAddArgs{Stream: parts.Stream(e.p), ID: e.id, Values: checkinValues(e.ck, e.user)}).Err())
	}
	for i, join := range []string{"10-0", "40-0"} {
		require.NoError(t, client.XGroupCreate(ctx, parts.Stream(i), "live", "$").Err())
		require.NoError(t, client.XGroupCreate(ctx, parts.Stream(i), "users.v2", "0").Err())
		require.NoError(t, client.HSet(ctx, parts.Registry(i), "live:live", `{"users.v2":{"join":"`+join+`","own":"running"}}`).Err())
	}

	mp, err := command.NewMigratePartitions(adapters.NewPartitionMigrator(client, keys))
	require.NoError(t, err)
	_, err = mp.Handle(ctx, command.MigrateRequest{To: 1, Batch: 2})
	require.ErrorContains(t, err, "projection versions users.v2 are still backfilling, and the positions where they joined on the 2 partitions interleave")
	assert.Zero(t, client.Exists(ctx, keys.Stream()).Val(), "nothing copied")
	p, err := adapters.NewPartitionMigrator(client, keys).Progress(ctx)
	require.NoError(t, err)
	assert.Empty(t, p.Phase, "no migration recorded, nothing quiesced")

	// Joins that do not interleave (x at or below the join on partition 0) translate: it goes.
	require.NoError(t, client.HSet(ctx, parts.Registry(0), "live:live", `{"users.v2":{"join":"30-0","own":"running"}}`).Err())
	split, err := adapters.NewPartitionMigrator(client, keys).BackfillsSplit(ctx, 2, 1)
	require.NoError(t, err)
	assert.Empty(t, split)
	// As does a finished backfill.
	for i, join := range []string{"10-0", "40-0"} {
		require.NoError(t, client.HSet(ctx, parts.Registry(i), "live:live", `{"users.v2":{"join":"`+join+`","own":"done","doneAt":"1"}}`).Err())
	}
	_, err = mp.Handle(ctx, command.MigrateRequest{To: 1, Batch: 2})
	require.NoError(t, err)
	assert.EqualValues(t, 3, client.XLen(ctx, keys.Stream()).Val())
}

// TestMigrateForceCarriesParkedUnitsOver: with --force, an entry a group still had pending is
// delivered again on its new partition. Where a projection had parked its unit of that entry,
// the record that says so goes with the entry, to its new stream and ID (renumbered or not):
// the projection leaves the unit to the poison queue's replay there too, instead of applying it
// and having the replay count it a second time.
func TestMigrateForceCarriesParkedUnitsOver(t *testing.T) {
	t.Parallel()
	client, keys, parts, u0, u1 := twoPartitions(t)
	ctx := context.Background()
	// Both old partitions hold 5-0; merged, partition 1's copy is renumbered to 5-1.
	require.NoError(t, client.XAdd(ctx, &redis.XAddArgs{Stream: parts.Stream(0), ID: "5-0", Values: checkinValues("a", u0)}).Err())
	require.NoError(t, client.XAdd(ctx, &redis.XAddArgs{Stream: parts.Stream(1), ID: "5-0", Values: checkinValues("d", u1)}).Err())
	pq := adapters.NewPoisonQueue(client, keys)
	for i, s := range parts.Streams() {
		require.NoError(t, client.XGroupCreate(ctx, s, "live", "0").Err())
		// A consumer that died after it parked its unit and before it acknowledged the entry.
		require.NoError(t, client.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "live", Consumer: "dead", Streams: []string{s, ">"}}).Err())
		_, err := pq.Park(ctx, ops.PoisonEntry{Stream: s, EntryID: "5-0", Projection: "locations", Version: 1, Group: "live",
			Error: "boom", Attempts: 1, FailedAt: time.Now(), Fields: map[string]string{"checkinId": strconv.Itoa(i)}})
		require.NoError(t, err)
	}
	// What is not the locations unit of a pending entry of the old partitions stays as it was.
	other := ops.UnitRef{Group: "live", Stream: "elsewhere", Entry: "5-0", Member: "locations.v1"}
	require.NoError(t, client.HSet(ctx, keys.PoisonParked(), other.Group+"\n"+other.Stream+"\n"+other.Entry+"\n"+other.Member, "1-0").Err())

	mp, err := command.NewMigratePartitions(adapters.NewPartitionMigrator(client, keys))
	require.NoError(t, err)
	_, err = mp.Handle(ctx, command.MigrateRequest{To: 1, Force: true, Wait: 100 * time.Millisecond})
	require.NoError(t, err)

	fresh, err := client.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "live", Consumer: "new", Streams: []string{keys.Stream(), ">"}, Block: -1}).Result()
	if !errors.Is(err, redis.Nil) {
		require.NoError(t, err)
		require.Empty(t, fresh[0].Messages, "no entry pending before is delivered as a first delivery")
	}
	pending, err := client.XPendingExt(ctx, &redis.XPendingExtArgs{Stream: keys.Stream(), Group: "live", Start: "-", End: "+", Count: 10}).Result()
	require.NoError(t, err)
	var ids []string
	for _, p := range pending {
		ids = append(ids, p.ID)
		assert.Equal(t, "partitions-migrate", p.Consumer, "%s is pending, for a projector to take over", p.ID)
	}
	require.Equal(t, []string{"5-0", "5-1"}, ids, "both entries are pending again on the new stream")
	// A projector's takeover is a redelivery (a delivery count of 2): it asks about parked units.
	_, _, err = client.XAutoClaim(ctx, &redis.XAutoClaimArgs{Stream: keys.Stream(), Group: "live", Consumer: "new", MinIdle: time.Millisecond, Start: "0"}).Result()
	require.NoError(t, err)
	pending, err = client.XPendingExt(ctx, &redis.XPendingExtArgs{Stream: keys.Stream(), Group: "live", Start: "-", End: "+", Count: 10}).Result()
	require.NoError(t, err)
	for _, p := range pending {
		assert.EqualValues(t, 2, p.RetryCount, "%s is delivered again", p.ID)
	}
	unit := func(entry, member string) ops.UnitRef {
		return ops.UnitRef{Group: "live", Stream: keys.Stream(), Entry: entry, Member: member}
	}
	got, err := pq.Parked(ctx, []ops.UnitRef{unit("5-0", "locations.v1"), unit("5-1", "locations.v1"), unit("5-0", "users.v1"), other})
	require.NoError(t, err)
	assert.Equal(t, []bool{true, true, false, true}, got,
		"the locations units of both entries are parked at their new places (5-1: renumbered); users' are not")
}
