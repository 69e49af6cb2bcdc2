package adapters_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/checkins/checkins/adapters"
	"github.com/checkins/checkins/adapters/redistest"
	"github.com/checkins/checkins/app"
	"github.com/checkins/checkins/app/command"
	"github.com/checkins/checkins/app/ops"
	"github.com/checkins/checkins/app/projection"
	"github.com/checkins/checkins/domain"
)

// The trim floor and the policy are command.TrimStream's; these run it on a real stream, through
// the adapter's XINFO, XRANGE and XTRIM MINID.

// retentionEnv is a stream with consumer groups in chosen states on a real Redis.
type retentionEnv struct {
	client *redis.Client
	keys   adapters.KeySpace
	ids    []string
}

func newRetentionEnv(t *testing.T, entries int, firstMs int64) *retentionEnv {
	t.Helper()
	env := redistest.Open(t)
	e := &retentionEnv{client: redistest.Client(t, env.URL), keys: adapters.KeySpace{Prefix: env.Prefix}}
	for i := range entries {
		// Explicit IDs, one ms apart, so an age policy has old entries to work on.
		id, err := e.client.XAdd(context.Background(), &redis.XAddArgs{Stream: e.keys.Stream(), ID: fmt.Sprintf("%d-0", firstMs+int64(i)),
			Values: map[string]any{"n": i}}).Result()
		require.NoError(t, err)
		e.ids = append(e.ids, id)
	}
	return e
}

// group creates a group that has read the first read entries and acked all of them but unacked.
func (e *retentionEnv) group(t *testing.T, name string, read int, unacked ...int) {
	t.Helper()
	ctx := context.Background()
	require.NoError(t, e.client.XGroupCreate(ctx, e.keys.Stream(), name, "0").Err())
	if read == 0 {
		return
	}
	_, err := e.client.XReadGroup(ctx, &redis.XReadGroupArgs{Group: name, Consumer: "c", Streams: []string{e.keys.Stream(), ">"}, Count: int64(read)}).Result()
	require.NoError(t, err)
	keep := map[int]bool{}
	for _, i := range unacked {
		keep[i] = true
	}
	var ack []string
	for i := range read {
		if !keep[i] {
			ack = append(ack, e.ids[i])
		}
	}
	if len(ack) > 0 {
		require.NoError(t, e.client.XAck(ctx, e.keys.Stream(), name, ack...).Err())
	}
}

// needed is every entry some group has not acknowledged: pending in a group, or not yet
// delivered to it.
func (e *retentionEnv) needed(t *testing.T) map[string]bool {
	t.Helper()
	ctx := context.Background()
	out := map[string]bool{}
	groups, err := e.client.XInfoGroups(ctx, e.keys.Stream()).Result()
	require.NoError(t, err)
	for _, g := range groups {
		pend, err := e.client.XPendingExt(ctx, &redis.XPendingExtArgs{Stream: e.keys.Stream(), Group: g.Name, Start: "-", End: "+", Count: 100000}).Result()
		require.NoError(t, err)
		for _, p := range pend {
			out[p.ID] = true
		}
		rest, err := e.client.XRange(ctx, e.keys.Stream(), "("+g.LastDeliveredID, "+").Result()
		require.NoError(t, err)
		for _, x := range rest {
			out[x.ID] = true
		}
	}
	return out
}

func (e *retentionEnv) present(t *testing.T) map[string]bool {
	t.Helper()
	xs, err := e.client.XRange(context.Background(), e.keys.Stream(), "-", "+").Result()
	require.NoError(t, err)
	out := map[string]bool{}
	for _, x := range xs {
		out[x.ID] = true
	}
	return out
}

func (e *retentionEnv) trimmer(t *testing.T, p command.RetentionPolicy) *command.TrimStream {
	t.Helper()
	tr, err := command.NewTrimStream(adapters.NewStreamAdmin(e.client, e.keys), p)
	require.NoError(t, err)
	return tr
}

func TestRetentionNeverTrimsWhatAGroupStillNeeds(t *testing.T) {
	t.Parallel()
	old := time.Now().Add(-48 * time.Hour).UnixMilli()
	for seed := range uint64(12) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			t.Parallel()
			rng := rand.New(rand.NewPCG(seed, 99))
			e := newRetentionEnv(t, 200, old)
			for g := range 1 + rng.IntN(3) {
				read := rng.IntN(201)
				var unacked []int
				for range rng.IntN(4) {
					if read > 0 {
						unacked = append(unacked, rng.IntN(read))
					}
				}
				e.group(t, fmt.Sprintf("g%d.v1", g), read, unacked...)
			}
			policy := command.RetentionPolicy{MaxEntries: int64(1 + rng.IntN(50))}
			if seed%2 == 1 {
				policy = command.RetentionPolicy{MaxAge: time.Hour} // every entry is older
			}
			needed := e.needed(t)
			res, err := e.trimmer(t, policy).TrimOnce(context.Background())
			require.NoError(t, err)
			present := e.present(t)
			for id := range needed {
				assert.True(t, present[id], "entry %s was still needed by a group but was trimmed (floor %s, min id %s)", id, res.Floor, res.MinID)
			}
			// And it did trim what nobody needs, below the floor, as far as the policy asks.
			for i, id := range e.ids {
				if needed[id] {
					break // everything from the first needed entry on is kept
				}
				wantGone := policy.MaxAge > 0 || int64(len(e.ids)-i) > policy.MaxEntries
				assert.Equal(t, wantGone, !present[id], "entry %d (%s), policy %s", i, id, policy)
			}
		})
	}
}

func TestRetentionLeavesAStreamWithoutGroupsAlone(t *testing.T) {
	t.Parallel()
	e := newRetentionEnv(t, 20, time.Now().Add(-time.Hour).UnixMilli())
	res, err := e.trimmer(t, command.RetentionPolicy{MaxEntries: 1}).TrimOnce(context.Background())
	require.NoError(t, err)
	assert.Zero(t, res.Trimmed)
	assert.Len(t, e.present(t), 20, "no group has seen anything yet: nothing may go")

	// Off: nothing ever goes, even with a group that acked everything.
	e.group(t, "done.v1", 20)
	res, err = e.trimmer(t, command.RetentionPolicy{}).TrimOnce(context.Background())
	require.NoError(t, err)
	assert.Zero(t, res.Trimmed)
	assert.Len(t, e.present(t), 20)
}

// TestRetentionAndRebuildWaitForAPartitionMigration: while `partitions migrate` holds the stream
// (its quiesce flag in <prefix>:meta), a trim removes nothing and a rebuild creates no group
// (what they did to the old streams would be lost with them); both say why, and go on once the
// flag is gone.
func TestRetentionAndRebuildWaitForAPartitionMigration(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newRetentionEnv(t, 100, time.Now().Add(-time.Hour).UnixMilli())
	e.group(t, "users.v1", 100)
	applier, err := adapters.NewProjectionApplier(e.client, e.keys, adapters.DefaultDedupeWindow)
	require.NoError(t, err)
	var a app.Application
	require.NoError(t, a.AddOps(app.OpsConfig{Backend: adapters.NewOpsBackend(e.client, e.keys),
		Applier: applier, Projections: []projection.Projection{projection.UserStats{}},
		Retention: command.RetentionPolicy{MaxEntries: 10}, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}))
	require.NoError(t, e.client.HSet(ctx, e.keys.Meta(), "quiesce", "1 to 8 partitions").Err())

	_, err = a.Commands.TrimStream.TrimOnce(ctx)
	require.ErrorIs(t, err, domain.ErrMigrating)
	assert.ErrorContains(t, err, "1 to 8 partitions")
	assert.ErrorContains(t, err, "checkins partitions migrate --to N")
	assert.Len(t, e.present(t), 100, "nothing trimmed during the migration")
	_, err = a.Commands.RebuildProjection.Start(ctx, "users")
	require.ErrorIs(t, err, domain.ErrMigrating)
	groups, err := e.client.XInfoGroups(ctx, e.keys.Stream()).Result()
	require.NoError(t, err)
	assert.Len(t, groups, 1, "no rebuild group created during the migration")

	require.NoError(t, e.client.HDel(ctx, e.keys.Meta(), "quiesce").Err())
	res, err := a.Commands.TrimStream.TrimOnce(ctx)
	require.NoError(t, err)
	assert.Equal(t, int64(90), res.Trimmed)
	_, err = a.Commands.RebuildProjection.Start(ctx, "users")
	require.NoError(t, err)
}

// TestRetentionTrimsEachPartitionBelowItsOwnGroups: with P = 4 partitions each partition is
// trimmed by itself, below the floor of its own groups (the same group names on each partition),
// with MaxEntries shared out (each keeps ceil(MaxEntries/P)): a group far behind on one partition
// holds back that partition only, a partition no group has read yet keeps everything, and the
// result sums the partitions up (Trimmed in total, the highest cut, the lowest floor).
func TestRetentionTrimsEachPartitionBelowItsOwnGroups(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	env := redistest.Open(t)
	client := redistest.Client(t, env.URL)
	keys, err := adapters.KeySpace{Prefix: env.Prefix}.WithPartitions(4)
	require.NoError(t, err)
	streams := keys.Partitions().Streams()
	old := time.Now().Add(-48 * time.Hour).UnixMilli()
	ids := make([][]string, len(streams))
	for p, s := range streams {
		for i := range 100 {
			// Each partition its own IDs, interleaved in time as ingest makes them.
			id, err := client.XAdd(ctx, &redis.XAddArgs{Stream: s, ID: fmt.Sprintf("%d-0", old+int64(i*len(streams)+p)), Values: map[string]any{"n": i}}).Result()
			require.NoError(t, err)
			ids[p] = append(ids[p], id)
		}
	}
	// read[p][g]: how far group g has read (and acked) partition p; -1: no group there yet.
	read := [][2]int{{100, 100}, {100, 10}, {60, 100}, {-1, -1}}
	for p, s := range streams {
		for g, n := range read[p] {
			if n < 0 {
				continue
			}
			name := fmt.Sprintf("g%d.v1", g)
			require.NoError(t, client.XGroupCreate(ctx, s, name, "0").Err())
			if n == 0 {
				continue
			}
			_, err := client.XReadGroup(ctx, &redis.XReadGroupArgs{Group: name, Consumer: "c", Streams: []string{s, ">"}, Count: int64(n)}).Result()
			require.NoError(t, err)
			require.NoError(t, client.XAck(ctx, s, name, ids[p][:n]...).Err())
		}
	}
	admin := adapters.NewStreamAdmin(client, keys)
	length := func(p int) int64 {
		n, err := client.XLen(ctx, streams[p]).Result()
		require.NoError(t, err)
		return n
	}

	tr, err := command.NewTrimStream(admin, command.RetentionPolicy{MaxEntries: 80}) // 20 per partition
	require.NoError(t, err)
	res, err := tr.TrimOnce(ctx)
	require.NoError(t, err)
	// Partition 0: both groups are through, it keeps its share. 1: one group acked only 10, so
	// only those go. 2: the slower group read 60, so 40 stay, more than the share of 20.
	// 3: no group has read it, nothing goes.
	want := []int64{20, 90, 40, 100}
	for p := range streams {
		assert.Equal(t, want[p], length(p), "partition %d", p)
	}
	after := func(id string) string { return strings.TrimSuffix(id, "-0") + "-1" } // the ID after a ms-0 one
	assert.Equal(t, int64(80+10+60), res.Trimmed, "the sum of the partitions")
	assert.Equal(t, after(ids[1][9]), res.Floor, "the lowest floor: partition 1's slow group")
	assert.Equal(t, after(ids[0][79]), res.MinID, "the highest cut: partition 0's")
	first, err := client.XRange(ctx, streams[2], "-", "+").Result()
	require.NoError(t, err)
	assert.Equal(t, ids[2][60], first[0].ID, "partition 2 kept what its slower group has not read")

	// An age policy (every entry is older): each partition goes down to its own floor.
	tr, err = command.NewTrimStream(admin, command.RetentionPolicy{MaxAge: time.Hour})
	require.NoError(t, err)
	res, err = tr.TrimOnce(ctx)
	require.NoError(t, err)
	want = []int64{0, 90, 40, 100}
	for p := range streams {
		assert.Equal(t, want[p], length(p), "partition %d", p)
	}
	assert.Equal(t, int64(20), res.Trimmed, "only partition 0 had entries below its floor left")
	assert.Equal(t, after(ids[1][9]), res.Floor)
}

// destroyBefore destroys a group on the real server just before the client sends the first
// command named cmd that names it: a rebuild dropping the group between two reads.
type destroyBefore struct {
	admin       *redis.Client
	stream, cmd string
	group       string
	destroyed   bool
	wholeStream bool // delete the stream instead of the group
}

func (h *destroyBefore) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *destroyBefore) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (h *destroyBefore) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		name := strings.ToLower(fmt.Sprint(cmd.Args()[0]))
		if len(cmd.Args()) > 1 && name == "xinfo" {
			name += " " + strings.ToLower(fmt.Sprint(cmd.Args()[1]))
		}
		if !h.destroyed && name == h.cmd && strings.Contains(fmt.Sprint(cmd.Args()), h.group) {
			h.destroyed = true
			if h.wholeStream {
				if err := h.admin.Del(ctx, h.stream).Err(); err != nil {
					return err
				}
			} else if err := h.admin.XGroupDestroy(ctx, h.stream, h.group).Err(); err != nil {
				return err
			}
		}
		return next(ctx, cmd)
	}
}

// readInfoWhile runs ReadStreamInfo on a stream of 5 entries with groups users.v1 (1 pending),
// v2 and v3, through a client whose hook h (its admin and stream filled in) deletes before its
// command.
func readInfoWhile(t *testing.T, h destroyBefore) (ops.StreamInfo, *destroyBefore, error) {
	t.Helper()
	e := newRetentionEnv(t, 5, 1_000)
	e.group(t, "users.v1", 5, 1)
	e.group(t, "users.v2", 3, 0)
	e.group(t, "users.v3", 2)
	reader := redis.NewClient(e.client.Options())
	t.Cleanup(func() { _ = reader.Close() })
	h.admin, h.stream = e.client, e.keys.Stream()
	reader.AddHook(&h)
	info, err := adapters.ReadStreamInfo(context.Background(), reader, e.keys.Stream())
	return info, &h, err
}

// groupNames are info's groups' names, in order.
func groupNames(info ops.StreamInfo) []string {
	var names []string
	for _, g := range info.Groups {
		names = append(names, g.Name)
	}
	return names
}

// TestStreamInfoOfAStreamDeletedWhileItReads: a stream deleted between ReadStreamInfo's reads (a
// partition migration's cleanup deletes the old partitions while `status` reads them) answers
// "no such key"; that is no storage failure either: the stream reads as missing, or with the
// groups read before it went.
func TestStreamInfoOfAStreamDeletedWhileItReads(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		cmd, group string
		exists     bool
		groups     []string
	}{
		{"xinfo groups", "", false, nil},
		{"xinfo consumers", "users.v2", true, []string{"users.v1"}},
		{"xpending", "users.v2", true, []string{"users.v1"}},
	} {
		t.Run(tc.cmd, func(t *testing.T) {
			t.Parallel()
			info, hook, err := readInfoWhile(t, destroyBefore{cmd: tc.cmd, group: tc.group, wholeStream: true})
			require.NoError(t, err)
			require.True(t, hook.destroyed, "the stream went while the reads ran")
			assert.Equal(t, tc.exists, info.Exists)
			assert.Equal(t, tc.groups, groupNames(info))
		})
	}
}

func TestStreamInfoLeavesOutAGroupDestroyedWhileItReads(t *testing.T) {
	t.Parallel()
	for _, cmd := range []string{"xinfo consumers", "xpending"} {
		t.Run(cmd, func(t *testing.T) {
			t.Parallel()
			info, hook, err := readInfoWhile(t, destroyBefore{cmd: cmd, group: "users.v2"})
			require.NoError(t, err, "a group that went between XINFO GROUPS and its next read is not a storage failure")
			require.True(t, hook.destroyed, "the group went while the reads ran")
			assert.Equal(t, []string{"users.v1", "users.v3"}, groupNames(info))
			assert.Equal(t, int64(1), info.Groups[0].Pending)
			assert.Equal(t, int64(5), info.Length)
		})
	}
}

// TestStreamStarts: per stream, the first ID a group created at "0" would read now: the first
// entry's, past the last ID an emptied stream had, every ID of a stream never written.
func TestStreamStarts(t *testing.T) {
	t.Parallel()
	env := redistest.Open(t)
	client := redistest.Client(t, env.URL)
	keys := adapters.KeySpace{Prefix: env.Prefix}
	ctx := context.Background()
	admin := adapters.NewStreamAdmin(client, keys)
	starts, err := admin.Starts(ctx)
	require.NoError(t, err)
	assert.Equal(t, map[string]string{keys.Stream(): "0-1"}, starts, "never written")

	for _, id := range []string{"1700000000000-0", "1700000000000-1", "1700000000005-0"} {
		require.NoError(t, client.XAdd(ctx, &redis.XAddArgs{Stream: keys.Stream(), ID: id, Values: map[string]any{"f": "v"}}).Err())
	}
	require.NoError(t, client.XTrimMinID(ctx, keys.Stream(), "1700000000000-1").Err())
	starts, err = admin.Starts(ctx)
	require.NoError(t, err)
	assert.Equal(t, map[string]string{keys.Stream(): "1700000000000-1"}, starts, "the first entry")

	require.NoError(t, client.XTrimMaxLen(ctx, keys.Stream(), 0).Err())
	starts, err = admin.Starts(ctx)
	require.NoError(t, err)
	assert.Equal(t, map[string]string{keys.Stream(): "1700000000005-1"}, starts, "emptied: past its last ID")
}

// runBefore runs do once, on the real server, just before the client sends the first command
// whose name (and, for XGROUP and XINFO, subcommand) is one of cmds: another process acting
// between two of this one's commands.
type runBefore struct {
	cmds []string
	do   func(ctx context.Context) error
	done bool
}

func (h *runBefore) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *runBefore) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (h *runBefore) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		a := cmd.Args()
		name := strings.ToLower(fmt.Sprint(a[0]))
		if len(a) > 1 && (name == "xgroup" || name == "xinfo") {
			name += " " + strings.ToLower(fmt.Sprint(a[1]))
		}
		if !h.done && slices.Contains(h.cmds, name) {
			h.done = true
			if err := h.do(ctx); err != nil {
				return err
			}
		}
		return next(ctx, cmd)
	}
}

// TestRetentionHoldsForAGroupCreatedDuringTheRound: a group created at "0" (a rebuild or a new
// projection's backfill, started on another projector) after a retention round read the groups
// and before it trims keeps every entry: the trim reads the groups again itself.
func TestRetentionHoldsForAGroupCreatedDuringTheRound(t *testing.T) {
	t.Parallel()
	e := newRetentionEnv(t, 100, time.Now().Add(-48*time.Hour).UnixMilli())
	e.group(t, "users.v1", 100) // has read and acknowledged everything
	trimmer := redis.NewClient(e.client.Options())
	t.Cleanup(func() { _ = trimmer.Close() })
	h := &runBefore{cmds: []string{"xtrim", "evalsha", "eval"}, do: func(ctx context.Context) error {
		return e.client.XGroupCreate(ctx, e.keys.Stream(), "users.v2", "0").Err()
	}}
	trimmer.AddHook(h)
	tr, err := command.NewTrimStream(adapters.NewStreamAdmin(trimmer, e.keys), command.RetentionPolicy{MaxAge: time.Hour})
	require.NoError(t, err)
	res, err := tr.TrimOnce(context.Background())
	require.NoError(t, err)
	require.True(t, h.done, "the group was created between the round's reads and its trim")
	assert.Zero(t, res.Trimmed, "users.v2 needs every entry")
	assert.Len(t, e.present(t), 100, "users.v2, created at 0, still reads every entry")

	// Once users.v2 has read and acknowledged entries, the policy applies again, down to its
	// oldest pending entry.
	_, err = e.client.XReadGroup(context.Background(), &redis.XReadGroupArgs{Group: "users.v2", Consumer: "c", Streams: []string{e.keys.Stream(), ">"}, Count: 100, Block: -1}).Result()
	require.NoError(t, err)
	require.NoError(t, e.client.XAck(context.Background(), e.keys.Stream(), "users.v2", e.ids[:50]...).Err())
	res, err = e.trimmer(t, command.RetentionPolicy{MaxAge: time.Hour}).TrimOnce(context.Background())
	require.NoError(t, err)
	assert.Equal(t, int64(50), res.Trimmed, "down to users.v2's oldest pending entry")
	assert.Equal(t, e.ids[50], res.MinID)
}

// TestRebuildRecordsTheStartItsGroupReads: where a rebuild's build begins (ops.BuildStart, by
// which a replay tells whether the build went through a parked entry) is what its group reads,
// even when another projector's retention round trims the stream while the rebuild starts.
func TestRebuildRecordsTheStartItsGroupReads(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newRetentionEnv(t, 100, time.Now().Add(-48*time.Hour).UnixMilli())
	e.group(t, "users.v1", 100)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	newApp := func(c *redis.Client) *app.Application {
		applier, err := adapters.NewProjectionApplier(c, e.keys, adapters.DefaultDedupeWindow)
		require.NoError(t, err)
		var a app.Application
		require.NoError(t, a.AddOps(app.OpsConfig{Backend: adapters.NewOpsBackend(c, e.keys), Applier: applier,
			Projections: []projection.Projection{projection.UserStats{}}, Retention: command.RetentionPolicy{MaxAge: time.Hour}, Logger: log}))
		return &a
	}
	other := newApp(e.client) // another projector's retention loop
	starter := redis.NewClient(e.client.Options())
	t.Cleanup(func() { _ = starter.Close() })
	var trimmed int64
	h := &runBefore{cmds: []string{"xgroup create"}, do: func(ctx context.Context) error {
		res, err := other.Commands.TrimStream.TrimOnce(ctx)
		trimmed = res.Trimmed
		return err
	}}
	starter.AddHook(h)
	_, err := newApp(starter).Commands.RebuildProjection.Start(ctx, "users")
	require.NoError(t, err)
	require.True(t, h.done)
	require.Equal(t, int64(100), trimmed, "the round trimmed what users.v1 had read, before users.v2 existed")
	require.NoError(t, e.client.XAdd(ctx, &redis.XAddArgs{Stream: e.keys.Stream(), Values: map[string]any{"n": 100}}).Err())
	b, ok, err := adapters.NewProjectionVersions(e.client, e.keys).BuildStart(ctx, "users", 2)
	require.NoError(t, err)
	require.True(t, ok)
	xs, err := e.client.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "users.v2", Consumer: "c", Streams: []string{e.keys.Stream(), ">"}, Count: 10, Block: -1}).Result()
	require.NoError(t, err)
	require.Len(t, xs[0].Messages, 1)
	from := b.Streams[e.keys.Stream()]
	for _, id := range e.ids {
		require.Negative(t, ops.CompareEntryIDs(id, from), "entry %s was trimmed before users.v2 existed, so the build never went through it; yet it is at or after where the build is said to begin (%s), and a replay of it would be taken for superseded", id, from)
	}
	assert.GreaterOrEqual(t, ops.CompareEntryIDs(xs[0].Messages[0].ID, from), 0, "what the group reads is at or after where the build begins")
}

// TestRetentionByAgeCutsByTheServersClock: an age is measured by the clock of the Redis server
// holding the stream, which numbered its entries: the cut is made in the trim's script from
// TIME. It was made from the projector's clock, so one running 90 minutes ahead dropped entries
// recorded seconds earlier under RETENTION=1h (and so did a cluster master whose clock is
// behind the projector's).
func TestRetentionByAgeCutsByTheServersClock(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	env := redistest.Open(t)
	client := redistest.Client(t, env.URL)
	keys := adapters.KeySpace{Prefix: env.Prefix}
	now, err := client.Time(ctx).Result()
	require.NoError(t, err)
	id := func(ago time.Duration) string { return strconv.FormatInt(now.Add(-ago).UnixMilli(), 10) + "-0" }
	for _, ago := range []time.Duration{3 * time.Hour, 2 * time.Hour, 59 * time.Minute, time.Minute} {
		require.NoError(t, client.XAdd(ctx, &redis.XAddArgs{Stream: keys.Stream(), ID: id(ago), Values: map[string]any{"n": ago.String()}}).Err())
	}
	require.NoError(t, client.XGroupCreate(ctx, keys.Stream(), "live", "$").Err()) // holds nothing back

	admin := adapters.NewStreamAdmin(client, keys)
	n, cut, err := admin.TrimBelow(ctx, "99999999999999-0", time.Hour)
	require.NoError(t, err)
	assert.EqualValues(t, 2, n, "the two entries older than an hour by the server's clock")
	c, err := ops.ParseEntryID(cut)
	require.NoError(t, err)
	assert.InDelta(t, now.Add(-time.Hour).UnixMilli(), int64(c.Ms), 5000, "the cut is an hour before the server's time")
	ids, err := client.XRange(ctx, keys.Stream(), "-", "+").Result()
	require.NoError(t, err)
	require.Len(t, ids, 2)
	assert.Equal(t, id(59*time.Minute), ids[0].ID)

	// And without an age, minID alone.
	n, _, err = admin.TrimBelow(ctx, id(30*time.Minute), 0)
	require.NoError(t, err)
	assert.EqualValues(t, 1, n)
}
