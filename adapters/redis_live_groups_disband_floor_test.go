package adapters_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/checkins/checkins/adapters"
	"github.com/checkins/checkins/adapters/redistest"
	"github.com/checkins/checkins/app/ops"
)

// twoSetsOfTenEntries: two sets from the first start, live (users.v1) and live:daily_checkins
// (daily_checkins.v1), on a stream of ten entries. read(group, n) has group deliver and
// acknowledge its next n entries and returns the last one's ID.
func twoSetsOfTenEntries(t *testing.T, l *adapters.LiveGroups, c redis.UniversalClient, stream string) (read func(group string, n int64) string) {
	t.Helper()
	ctx := context.Background()
	_, err := l.Join(ctx, "live", "users.v1")
	require.NoError(t, err)
	_, err = l.Join(ctx, "live:daily_checkins", "daily_checkins.v1")
	require.NoError(t, err)
	for range 10 {
		require.NoError(t, c.XAdd(ctx, &redis.XAddArgs{Stream: stream, Values: []any{"k", "v"}}).Err())
	}
	return func(group string, n int64) string {
		res, err := c.XReadGroup(ctx, &redis.XReadGroupArgs{Group: group, Consumer: "c-" + group, Streams: []string{stream, ">"}, Count: n, Block: -1}).Result()
		require.NoError(t, err)
		last := ""
		for _, m := range res[0].Messages {
			require.NoError(t, c.XAck(ctx, stream, group, m.ID).Err())
			last = m.ID
		}
		return last
	}
}

// TestFloorsDuringADisbandHoldTheMovedVersions: a projector's checkpoint reads every
// group's position first (Positions) and the memberships and moved records after
// (inside DedupeFloors). A disband between the two reads leaves the old
// live group out of the memberships, and the moved versions' own groups, created after the
// positions were read, out of progress: DedupeFloors takes a moved version without progress for
// one whose group was destroyed by hand and skips it, so the floor jumps to the other live
// groups' position, far above where the moved versions still have to decide from. (A join read
// the same way holds the floors: a live group missing from progress makes ok false.)
func TestFloorsDuringADisbandHoldTheMovedVersions(t *testing.T) {
	t.Parallel()
	env := newProjEnv(t)
	ctx := context.Background()
	c, keys := env.client, env.keys
	l := adapters.NewLiveGroups(c, keys)
	b := adapters.NewProjectorBackend(c, keys)
	stream := keys.Stream()
	read := twoSetsOfTenEntries(t, l, c, stream)
	var err error
	p := read("live", 3)                 // live's projectors stopped here
	q := read("live:daily_checkins", 10) // the other set is at the end
	time.Sleep(5 * time.Millisecond)

	// Another set's projector checkpoints: positions first ...
	info, err := b.Positions(ctx)
	require.NoError(t, err)
	// ... the operator disbands live meanwhile ...
	_, err = l.Disband(ctx, "live", time.Millisecond, true)
	require.NoError(t, err)
	// ... then the memberships and the floors.
	floors, ok, err := b.DedupeFloors(ctx, info, 24*time.Hour, time.Now())
	require.NoError(t, err)
	t.Logf("live was at %s, live:daily_checkins at %s; floors %v ok %v", p, q, floors, ok)
	if ok {
		require.LessOrEqual(t, ops.CompareEntryIDs(floors[0], p), 0,
			"users.v1 still decides everything after %s (its own group starts there): the floor must not pass it", p)
	}
}

// afterFirstPipeline runs f once, right after the client's first pipeline that reads a hash
// (HGETALL).
type afterFirstPipeline struct {
	once sync.Once
	f    func()
}

func (a *afterFirstPipeline) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (a *afterFirstPipeline) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (a *afterFirstPipeline) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		if len(cmds) > 0 && cmds[0].Name() == "hgetall" {
			a.once.Do(a.f)
		}
		return err
	}
}

// TestFloorsReadAMovedVersionsJoinInOneView: users.v1 was moved out of live by a disband; its own
// group starts at p, far below the other set's position. A projector of the other set computes
// the floors while a projector of users joins it to live:users, which removes its moved record
// and adds its membership in one step. The memberships and the moved records were read one after
// the other (ReadAll, then ReadMoved): a join between the two left users.v1 in neither, and the
// floor went past p (suspected by a review). Read in one view, it is in one of them.
func TestFloorsReadAMovedVersionsJoinInOneView(t *testing.T) {
	t.Parallel()
	env := newProjEnv(t)
	ctx := context.Background()
	c, keys := env.client, env.keys
	l := adapters.NewLiveGroups(c, keys)
	stream := keys.Stream()
	read := twoSetsOfTenEntries(t, l, c, stream)
	var err error
	p := read("live", 3)
	read("live:daily_checkins", 10)
	time.Sleep(5 * time.Millisecond)
	_, err = l.Disband(ctx, "live", time.Millisecond, true)
	require.NoError(t, err)
	require.NoError(t, l.EndDisband(ctx, "live"))
	info, err := adapters.NewProjectorBackend(c, keys).Positions(ctx)
	require.NoError(t, err)

	hooked := redistest.Client(t, env.url)
	hooked.AddHook(&afterFirstPipeline{f: func() {
		_, err := l.Join(ctx, "live:users", "users.v1")
		require.NoError(t, err)
	}})
	floors, ok, err := adapters.NewProjectorBackend(hooked, keys).DedupeFloors(ctx, info, 24*time.Hour, time.Now())
	require.NoError(t, err)
	ms, err := l.Read(ctx, "live:users")
	require.NoError(t, err)
	require.Contains(t, ms.Members, "users.v1", "the join went through meanwhile")
	if ok {
		require.LessOrEqual(t, ops.CompareEntryIDs(floors[0], p), 0,
			"users.v1 still decides everything after %s (its own group starts there): the floor must not pass it", p)
	}
}
