package command_test

import (
	"context"
	"errors"
	"log/slog"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/checkins/checkins/app/command"
	"github.com/checkins/checkins/app/ops"
	"github.com/checkins/checkins/app/projection"
)

// memBackend is the ops backend in memory, as far as a rebuild uses it: a registry, a stream's
// groups, live groups and projection keys. It lets the state machine be walked step by step
// without Redis (the Redis side runs in cmd/checkins/rebuild_test.go and ports' tests).
type memBackend struct {
	state   map[string]ops.VersionState
	groups  map[string]ops.GroupInfo
	length  int64
	last    string
	live    map[string]ops.Membership
	keys    map[string]int64 // projection version -> how many keys it has
	removed []string         // what went, in order
}

func newMemBackend() *memBackend {
	return &memBackend{state: map[string]ops.VersionState{}, groups: map[string]ops.GroupInfo{},
		live: map[string]ops.Membership{}, keys: map[string]int64{}}
}

func (m *memBackend) backend() ops.Backend {
	return ops.Backend{Stream: m, Registry: m, Live: m, Poison: nil, Keys: m, Observations: m, Failures: m}
}

func (m *memBackend) Name() string { return "events" }
func (m *memBackend) Info(context.Context) (ops.StreamInfo, error) {
	info := ops.StreamInfo{Stream: "events", Exists: true, Length: m.length, LastEntryID: m.last}
	for _, g := range m.groups {
		info.Groups = append(info.Groups, g)
	}
	return info, nil
}
func (m *memBackend) CountAfter(context.Context, string, int64) (int64, error) { return 0, nil }
func (m *memBackend) CreateGroup(_ context.Context, group, start string) error {
	if _, ok := m.groups[group]; !ok {
		m.groups[group] = ops.GroupInfo{Name: group, LastDeliveredID: start, Lag: m.length}
	}
	return nil
}
func (m *memBackend) DestroyGroup(_ context.Context, group string) error {
	if _, ok := m.groups[group]; ok {
		m.removed = append(m.removed, "group "+group)
	}
	delete(m.groups, group)
	return nil
}
func (m *memBackend) OldestIDs(context.Context, int64) ([]string, error) { return nil, nil }
func (m *memBackend) TrimBelow(context.Context, string, time.Duration) (int64, string, error) {
	return 0, "", nil
}

func (m *memBackend) State(_ context.Context, name string) (ops.VersionState, error) {
	st, ok := m.state[name]
	if !ok {
		st = ops.VersionState{Serving: 1}
	}
	return st, nil
}
func (m *memBackend) Current(ctx context.Context, name string) (int, error) {
	st, err := m.State(ctx, name)
	return st.Serving, err
}
func (m *memBackend) DecideLayout(ctx context.Context, name string, layout int) (int, error) {
	st, _ := m.State(ctx, name)
	if st.ServingLayout == 0 {
		st.ServingLayout = layout
		m.state[name] = st
	}
	return st.ServingLayout, nil
}
func (m *memBackend) BeginBuild(ctx context.Context, name string, layout int) (int, int, bool, error) {
	st, _ := m.State(ctx, name)
	switch {
	case st.Building > 0:
		return st.Serving, st.Building, false, nil
	case st.Retiring > 0:
		return st.Serving, 0, false, ops.ErrRetiring
	}
	st.Building = st.Serving + 1
	if layout > 1 { // as the registry records it
		st.BuildingLayout = layout
	}
	m.state[name] = st
	return st.Serving, st.Building, true, nil
}
func (m *memBackend) Promote(ctx context.Context, name string, from, to int, at time.Time) (bool, error) {
	st, _ := m.State(ctx, name)
	if st.Serving != from || st.Building != to {
		return false, nil
	}
	st.Serving, st.Retiring, st.Building, st.SwitchedAt = to, from, 0, at.UnixMilli()
	st.ServingLayout, st.BuildingLayout = st.BuildingLayout, 0
	m.state[name] = st
	return true, nil
}
func (m *memBackend) Retired(ctx context.Context, name string, version int) error {
	st, _ := m.State(ctx, name)
	if st.Retiring == version {
		st.Retiring = 0
		m.state[name] = st
	}
	return nil
}
func (m *memBackend) SetRebuildStatus(ctx context.Context, name, status string) error {
	st, _ := m.State(ctx, name)
	st.Rebuild = status
	m.state[name] = st
	return nil
}

func (m *memBackend) Starts(context.Context) (map[string]string, error) {
	return map[string]string{"events": "0-1"}, nil
}
func (m *memBackend) SetBuildStart(context.Context, string, int, ops.BuildStart) error { return nil }
func (m *memBackend) ServerTime(context.Context) (int64, error)                        { return time.Now().UnixMilli(), nil }
func (m *memBackend) BuildStart(context.Context, string, int) (ops.BuildStart, bool, error) {
	return ops.BuildStart{}, false, nil
}

func (m *memBackend) LockStart(context.Context, string, time.Duration) (func(context.Context) error, bool, error) {
	return func(context.Context) error { return nil }, true, nil
}

func (m *memBackend) ReadAll(context.Context) (map[string]ops.Membership, map[string]string, error) {
	return m.live, map[string]string{}, nil
}
func (m *memBackend) FinishBackfill(_ context.Context, group, member string, at time.Time) (bool, error) {
	lm := m.live[group].Members[member]
	if lm.Own == ops.BackfillDone {
		return false, nil
	}
	lm.Own, lm.DoneAt = ops.BackfillDone, strconv.FormatInt(at.UnixMilli(), 10)
	m.live[group].Members[member] = lm
	return true, nil
}
func (m *memBackend) Leave(_ context.Context, group, member string) error {
	delete(m.live[group].Members, member)
	return nil
}
func (m *memBackend) ForgetAcked(context.Context, string) error { return nil }

func (m *memBackend) DestroyFinishedOwnGroup(ctx context.Context, _, member, _ string, _ time.Duration) (bool, error) {
	_, ok := m.groups[member]
	return ok, m.DestroyGroup(ctx, member)
}

func (m *memBackend) EndRemoval(context.Context, string, string, string, bool) error { return nil }

func (m *memBackend) RenewRemoval(context.Context, string, string, string) (bool, error) {
	return true, nil
}

func (m *memBackend) Disband(context.Context, string, time.Duration, bool) (ops.DisbandReport, error) {
	return ops.DisbandReport{}, errors.New("the walk never disbands a live group")
}

func (m *memBackend) DropMoved(context.Context, string, time.Duration, bool) (ops.DropReport, error) {
	return ops.DropReport{}, errors.New("the walk never drops a version")
}

func (m *memBackend) EndDrop(context.Context, string) error { return nil }

func (m *memBackend) EndDisband(context.Context, string) error { return nil }

func (m *memBackend) ForgetMoved(context.Context, string) error { return nil }

func (m *memBackend) ReadMoved(context.Context) (map[string]map[string]ops.Moved, error) {
	return nil, nil
}

func (m *memBackend) RemoveVersion(_ context.Context, name string, version int) (int64, error) {
	k := ops.MemberName(name, version)
	n := m.keys[k]
	delete(m.keys, k)
	m.removed = append(m.removed, "keys "+k)
	return n, nil
}
func (m *memBackend) RemoveMarkers(_ context.Context, group string) (int64, error) {
	m.removed = append(m.removed, "markers "+group)
	return 0, nil
}
func (m *memBackend) RemoveLegacyDedupe(context.Context, string, int) (int64, error) { return 0, nil }
func (m *memBackend) Observed(_ context.Context, groups []string) ([]string, error) {
	return make([]string, len(groups)), nil
}
func (m *memBackend) Observe(context.Context, string, string) error { return nil }
func (m *memBackend) Forget(context.Context, string) error          { return nil }
func (m *memBackend) TransientReason(error) (string, bool)          { return "", false }

// TestRebuildWalksItsStates walks one rebuild through every state: building while the new
// version backfills, the switch once it caught up (and not before), the grace, the removal of
// the old version; and a second start while it runs resumes it rather than starting another.
func TestRebuildWalksItsStates(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	m := newMemBackend()
	m.length, m.last = 100, "100-0"
	m.keys["users.v1"] = 40
	m.groups["live"] = ops.GroupInfo{Name: "live", LastDeliveredID: "100-0"}
	m.live["live"] = ops.Membership{Members: map[string]ops.LiveMember{"users.v1": {Join: "0-0", Own: ops.BackfillDone}}}
	now := time.UnixMilli(1_700_000_000_000)
	rb, err := command.NewRebuildProjection(command.RebuildProjectionConfig{Backend: m.backend(),
		Projections: []projection.Projection{projection.UserStats{}}, RetireGrace: 10 * time.Second,
		Logger: slog.New(slog.DiscardHandler), Now: func() time.Time { return now }})
	require.NoError(t, err)

	_, err = rb.Start(ctx, "nope")
	assert.ErrorContains(t, err, `projection "nope" (known: users)`)

	rp, err := rb.Start(ctx, "users")
	require.NoError(t, err)
	assert.Equal(t, ops.RebuildBuilding, rp.State)
	assert.Equal(t, [2]int{1, 2}, [2]int{rp.From, rp.To})
	require.Contains(t, m.groups, "users.v2", "the build's own group is created at once, from the start")
	assert.Equal(t, "0", m.groups["users.v2"].LastDeliveredID)

	again, err := rb.Start(ctx, "users")
	require.NoError(t, err)
	assert.Equal(t, 2, again.To, "a rebuild in progress is resumed, not started twice")
	assert.Equal(t, 2, m.state["users"].Building)

	// No projector has joined v2 to the live group yet: it builds, reads stay on v1.
	rp, err = rb.Step(ctx, "users")
	require.NoError(t, err)
	assert.Equal(t, ops.RebuildBuilding, rp.State)
	assert.Equal(t, 1, m.state["users"].Serving)

	// Joined at 100-0, its backfill has delivered up to 60-0: not caught up.
	m.live["live"].Members["users.v2"] = ops.LiveMember{Join: "100-0", Own: ops.BackfillRunning}
	m.groups["users.v2"] = ops.GroupInfo{Name: "users.v2", LastDeliveredID: "60-0", Lag: 40}
	rp, err = rb.Step(ctx, "users")
	require.NoError(t, err)
	assert.Equal(t, ops.RebuildBuilding, rp.State)
	assert.Equal(t, int64(40), rp.Lag)
	assert.Equal(t, 1, m.state["users"].Serving)

	// Delivered up to the join but one entry pending: still not.
	m.groups["users.v2"] = ops.GroupInfo{Name: "users.v2", LastDeliveredID: "100-0", Pending: 1}
	_, err = rb.Step(ctx, "users")
	require.NoError(t, err)
	assert.Equal(t, 1, m.state["users"].Serving)

	// Caught up: reads switch in one step and v1 leaves the live group.
	m.groups["users.v2"] = ops.GroupInfo{Name: "users.v2", LastDeliveredID: "100-0"}
	rp, err = rb.Step(ctx, "users")
	require.NoError(t, err)
	assert.Equal(t, ops.RebuildRetiring, rp.State)
	assert.Equal(t, ops.VersionState{Serving: 2, Retiring: 1, SwitchedAt: now.UnixMilli(), Rebuild: m.state["users"].Rebuild}, m.state["users"])
	assert.NotContains(t, m.live["live"].Members, "users.v1")
	assert.Equal(t, ops.BackfillDone, m.live["live"].Members["users.v2"].Own)
	_, err = rb.Start(ctx, "users")
	assert.ErrorIs(t, err, command.ErrRebuildBusy, "no new rebuild while the old version is still to be removed")

	// Within the grace nothing is removed; after it, v1's group and keys go.
	now = now.Add(9 * time.Second)
	rp, err = rb.Step(ctx, "users")
	require.NoError(t, err)
	assert.Equal(t, ops.RebuildRetiring, rp.State)
	assert.Contains(t, m.keys, "users.v1")
	now = now.Add(time.Second)
	rp, err = rb.Step(ctx, "users")
	require.NoError(t, err)
	assert.Equal(t, ops.RebuildDone, rp.State)
	assert.NotContains(t, m.keys, "users.v1")
	assert.Equal(t, []string{"keys users.v1", "markers users.v1", "markers replay.users.v1"}, m.removed,
		"v1 had no group of its own left (the live group fed it); its markers and its replays' go")
	assert.Equal(t, ops.VersionState{Serving: 2, SwitchedAt: m.state["users"].SwitchedAt, Rebuild: m.state["users"].Rebuild}, m.state["users"])

	// Done stays done.
	rp, err = rb.Step(ctx, "users")
	require.NoError(t, err)
	assert.Equal(t, ops.RebuildDone, rp.State)
}
