package command_test

import (
	"context"
	"errors"
	"log/slog"
	"strconv"
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

// switchedEnv is a real Redis with users.v1 in live group "live", n entries on the stream, and
// a rebuild of users to v2 started and switched (v2 joined and its backfill caught up): the
// registry says v2 serves and v1 retires.
type switchedEnv struct {
	client  *redis.Client
	keys    adapters.KeySpace
	be      ops.Backend
	switch_ time.Time
}

func switchedRebuild(t *testing.T) switchedEnv {
	t.Helper()
	ctx := context.Background()
	env := redistest.Open(t)
	client := redistest.Client(t, env.URL)
	keys := adapters.KeySpace{Prefix: env.Prefix}
	add := func(i int) {
		e := domain.CheckinRecorded{Checkin: domain.Checkin{ID: "c" + strconv.Itoa(i), UserID: 7, LocationID: 1, StarRating: 2, Timestamp: int64(i)}}
		values := map[string]any{}
		for k, v := range e.Fields() {
			values[k] = v
		}
		require.NoError(t, client.XAdd(ctx, &redis.XAddArgs{Stream: keys.Stream(), Values: values}).Err())
	}
	live := adapters.NewLiveGroups(client, keys)
	_, err := live.Join(ctx, "live", "users.v1") // a first start: joined at 0-0
	require.NoError(t, err)
	for i := range 10 {
		add(i)
	}
	// The live group delivered everything (as a running projector's would).
	require.NoError(t, client.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "live", Consumer: "p", Streams: []string{keys.Stream(), ">"}, Count: 100}).Err())
	ids, err := client.XRange(ctx, keys.Stream(), "-", "+").Result()
	require.NoError(t, err)
	for _, m := range ids {
		require.NoError(t, client.XAck(ctx, keys.Stream(), "live", m.ID).Err())
	}

	be := adapters.NewOpsBackend(client, keys)
	now := time.Now()
	rb, err := command.NewRebuildProjection(command.RebuildProjectionConfig{Backend: be, Projections: []projection.Projection{projection.UserStats{}},
		RetireGrace: 10 * time.Second, Logger: slog.New(slog.DiscardHandler), Now: func() time.Time { return now }})
	require.NoError(t, err)
	rp, err := rb.Start(ctx, "users")
	require.NoError(t, err)
	require.Equal(t, 2, rp.To)
	_, err = live.Join(ctx, "live", "users.v2")
	require.NoError(t, err)
	// v2's own group backfills up to its join and acknowledges it all.
	require.NoError(t, client.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "users.v2", Consumer: "p", Streams: []string{keys.Stream(), ">"}, Count: 100}).Err())
	for _, m := range ids {
		require.NoError(t, client.XAck(ctx, keys.Stream(), "users.v2", m.ID).Err())
	}
	rp, err = rb.Step(ctx, "users")
	require.NoError(t, err)
	require.Equal(t, ops.RebuildRetiring, rp.State)
	st, err := be.Registry.State(ctx, "users")
	require.NoError(t, err)
	require.Equal(t, 2, st.Serving)
	require.Equal(t, 1, st.Retiring)
	return switchedEnv{client: client, keys: keys, be: be, switch_: now}
}

func (e switchedEnv) rebuild(t *testing.T, be ops.Backend, now func() time.Time) *command.RebuildProjection {
	t.Helper()
	rb, err := command.NewRebuildProjection(command.RebuildProjectionConfig{Backend: be, Projections: []projection.Projection{projection.UserStats{}},
		RetireGrace: 10 * time.Second, Logger: slog.New(slog.DiscardHandler), Now: now})
	require.NoError(t, err)
	return rb
}

// hookedRegistry runs afterState after each State read, and afterRetired after each Retired.
type hookedRegistry struct {
	ops.Registry
	afterState   func()
	afterRetired func()
}

func (h hookedRegistry) State(ctx context.Context, name string) (ops.VersionState, error) {
	st, err := h.Registry.State(ctx, name)
	if h.afterState != nil {
		h.afterState()
	}
	return st, err
}

func (h hookedRegistry) Retired(ctx context.Context, name string, version int) error {
	err := h.Registry.Retired(ctx, name, version)
	if h.afterRetired != nil {
		h.afterRetired()
	}
	return err
}

// TestRebuildProgressDoneAfterTwoDrivers: two drivers (an operator's CLI driving the rebuild,
// and a projector's StepAll) step one rebuild. The CLI reads the registry while the grace still
// runs (RebuildWaitGrace); before it writes its progress ("retiring"), the projector removes v1,
// clears the retiring field and writes "done". The CLI's write lands last: the stored progress
// says "retiring" while nothing is in progress, and it stayed so (StepAll steps nothing any more,
// and Step's default branch returned the stored record as it is): the CLI's Drive never returned,
// and `projections list` / GET /ops/projections reported the rebuild retiring for good (found by
// a review). Read against the registry (VersionState.Progress), it is done, and Step records it.
func TestRebuildProgressDoneAfterTwoDrivers(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := switchedRebuild(t)
	projector := e.rebuild(t, e.be, func() time.Time { return e.switch_.Add(11 * time.Second) })

	once := true
	cliBackend := e.be
	cliBackend.Registry = hookedRegistry{Registry: e.be.Registry, afterState: func() {
		if !once {
			return
		}
		once = false
		// Between the CLI's read of the registry and its write of the progress: the projector's
		// step after the grace removes v1 and finishes the rebuild.
		rp, err := projector.Step(ctx, "users")
		require.NoError(t, err)
		require.Equal(t, ops.RebuildDone, rp.State)
	}}
	cliNow := e.switch_.Add(9 * time.Second) // the grace has not passed yet by the CLI's clock
	cli := e.rebuild(t, cliBackend, func() time.Time { return cliNow })
	rp, err := cli.Step(ctx, "users")
	require.NoError(t, err)
	t.Logf("CLI step: %s", rp.State)

	st, err := e.be.Registry.State(ctx, "users")
	require.NoError(t, err)
	assert.Equal(t, ops.VersionState{Serving: 2, SwitchedAt: st.SwitchedAt, Rebuild: st.Rebuild}, st, "the rebuild is over in the registry")
	stored, _ := st.Progress()
	assert.Equal(t, ops.RebuildDone, stored.State, "the progress of a finished rebuild, as projections list reads it")

	// The CLI drives on (its clock past the grace now): it never sees the rebuild done.
	cliNow = e.switch_.Add(time.Minute)
	dctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	var seen string
	_, err = cli.Drive(dctx, "users", 50*time.Millisecond, func(p ops.RebuildProgress) { seen = p.State })
	assert.NoError(t, err, "Drive of a finished rebuild returns (last progress reported: %s)", seen)
}

// TestRebuildProgressDoneAfterAStopPastRetired: a projector stopped (SIGTERM: its context
// ends) right after Step's Retired, before its progress write, leaves the stored progress
// "retiring" while nothing is in progress; no later step fixed it (StepAll does not step a
// projection with nothing in progress), so status reported it retiring and a CLI watching it
// (Drive) never returned. Now it reads done, and Drive returns.
func TestRebuildProgressDoneAfterAStopPastRetired(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := switchedRebuild(t)
	after := func() time.Time { return e.switch_.Add(11 * time.Second) }

	sctx, stop := context.WithCancel(ctx)
	be := e.be
	be.Registry = hookedRegistry{Registry: e.be.Registry, afterRetired: stop}
	_, err := e.rebuild(t, be, after).Step(sctx, "users")
	t.Logf("step stopped after Retired: %v", err)

	other := e.rebuild(t, e.be, after)
	require.NoError(t, other.StepAll(ctx, []projection.Projection{projection.UserStats{}}))
	st, err := e.be.Registry.State(ctx, "users")
	require.NoError(t, err)
	require.Zero(t, st.Retiring)
	require.Zero(t, st.Building)
	stored, _ := st.Progress()
	assert.Equal(t, ops.RebuildDone, stored.State, "the progress once v1 is gone and nothing is in progress, as projections list reads it")

	dctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	var seen string
	_, err = other.Drive(dctx, "users", 50*time.Millisecond, func(p ops.RebuildProgress) { seen = p.State })
	assert.NoError(t, err, "Drive of a finished rebuild returns (last progress reported: %s)", seen)
}

// TestUpgradeLayoutsWaitsOutAMigration: a projector starting while a partition migration
// runs (its quiesce flag is set) with a projection whose serving version is of an earlier layout:
// UpgradeLayouts calls Start, which refuses with domain.ErrMigrating, and UpgradeLayouts returned
// that error. cmd's initialTargets treats only transient errors and deadlines as "start later",
// so the process refused to start (a supervisor restarts it in a loop until the migration is
// over), whereas every other part of the start waits for the migration (JoinWaits); the registry
// watch loop likewise failed every poll for all projections (found by a review). Now the
// upgrade waits for the next poll.
func TestUpgradeLayoutsWaitsOutAMigration(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	env := redistest.Open(t)
	client := redistest.Client(t, env.URL)
	keys := adapters.KeySpace{Prefix: env.Prefix}
	be := adapters.NewOpsBackend(client, keys)
	// leaderboards v1 serves in layout 1 (an earlier release's), a migration runs.
	require.NoError(t, client.HSet(ctx, keys.Projections(), "leaderboards.layout", "1").Err())
	require.NoError(t, client.HSet(ctx, keys.Meta(), "quiesce", "1 to 2 partitions").Err())
	projs := []projection.Projection{projection.Leaderboards{}, projection.UserStats{}}
	rb, err := command.NewRebuildProjection(command.RebuildProjectionConfig{Backend: be, Projections: projs,
		Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	err = rb.UpgradeLayouts(ctx, projs)
	assert.NoError(t, err, "an upgrade that must wait for the migration holds nothing else off")
	t.Logf("UpgradeLayouts: %v (domain.ErrMigrating: %v)", err, errors.Is(err, domain.ErrMigrating))
	st, err := be.Registry.State(ctx, "leaderboards")
	require.NoError(t, err)
	assert.Zero(t, st.Building, "nothing started during the migration")
}

// TestStepAllStepsTheOthersPastAFailure: one projection's step fails (here its registry entry
// is unreadable), and StepAll returned at it: the rebuilds of the projections after it were not
// stepped on any poll while it failed. Now each is stepped, and the error names the one that
// failed.
func TestStepAllStepsTheOthersPastAFailure(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := switchedRebuild(t)
	require.NoError(t, e.client.HSet(ctx, e.keys.Projections(), "locations.version", "x").Err())
	rb := e.rebuild(t, e.be, func() time.Time { return e.switch_.Add(11 * time.Second) })
	err := rb.StepAll(ctx, []projection.Projection{projection.LocationStats{}, projection.UserStats{}})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "rebuild of locations")
	st, err := e.be.Registry.State(ctx, "users")
	require.NoError(t, err)
	assert.Zero(t, st.Retiring, "users' retire went on past locations' failure")
}
