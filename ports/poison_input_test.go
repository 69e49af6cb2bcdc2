package ports_test

import (
	"bytes"
	"context"
	"flag"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/checkins/checkins/adapters"
	"github.com/checkins/checkins/app"
	"github.com/checkins/checkins/app/ops"
	"github.com/checkins/checkins/app/projection"
	"github.com/checkins/checkins/domain"
	"github.com/checkins/checkins/ports"
)

// parkFor parks one check-in for projection name (version 1, live group).
func parkFor(t *testing.T, h *harness, name, checkinID string) string {
	t.Helper()
	e := domain.CheckinRecorded{Checkin: domain.Checkin{ID: checkinID, UserID: 1, LocationID: 2, StarRating: 3, Timestamp: 1_700_000_000_000}, RecordedAt: 1_700_000_000_000}
	pid, err := adapters.NewPoisonQueue(h.client, h.keys).Park(context.Background(), ops.PoisonEntry{
		Stream: h.keys.Stream(), EntryID: "1-1", Projection: name, Version: 1, Group: testGroup, Error: "test", Attempts: 5,
		FailedAt: time.Now(), Fields: e.Fields()})
	require.NoError(t, err)
	return pid
}

// poisonCLI runs `checkins poison <args...>` against the harness's Redis.
func poisonCLI(t *testing.T, h *harness, projs []projection.Projection, args ...string) (string, error) {
	t.Helper()
	a := opsApp(t, h.client, h.keys, projs, app.OpsConfig{})
	connect := func(_ string, fs *flag.FlagSet, args []string) (*ports.CLISession, error) {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		return &ports.CLISession{App: a, Args: fs.Args(), Close: func() {}}, nil
	}
	var out, errOut bytes.Buffer
	err := ports.PoisonCommand(context.Background(), args, &out, &errOut, connect)
	return out.String() + errOut.String(), err
}

// TestPoisonCLIRefusesFlagsItDoesNotTake: the poison verbs shared list's flags and ignored those
// they do not take. `poison purge --all --limit 1` purged the whole queue, and `poison purge
// <id> --projection users` an entry of locations. Now such a flag is refused, naming it, and
// nothing changes (found by a review).
func TestPoisonCLIRefusesFlagsItDoesNotTake(t *testing.T) {
	t.Parallel()
	p := newFaulty("users", nil)
	h := startHarness(t, p, harnessOptions{})
	for _, id := range []string{"a", "b", "c"} {
		parkFor(t, h, "users", id)
	}
	loc := parkFor(t, h, "locations", "d")
	projs := []projection.Projection{p}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"purge", "--all", "--limit", "1"}, "poison purge does not take --limit"},
		{[]string{"replay", "--all", "--cursor", loc}, "poison replay does not take --cursor"},
		{[]string{"purge", loc, "--projection", "users"}, "poison purge does not take --projection without --all"},
		{[]string{"replay", loc, "--projection", "users"}, "poison replay does not take --projection without --all"},
		{[]string{"show", loc, "--all"}, "poison show does not take --all"},
	} {
		out, err := poisonCLI(t, h, projs, c.args...)
		require.Error(t, err, "%v: %s", c.args, out)
		assert.Contains(t, err.Error(), c.want, "%v", c.args)
		assert.Len(t, h.poison(), 4, "%v changed nothing", c.args)
	}
	out, err := poisonCLI(t, h, projs, "purge", "--all", "--projection", "users")
	require.NoError(t, err)
	assert.Equal(t, "purged 3 entries\n", out)
	assert.Len(t, h.poison(), 1, "what it takes still works")
}

// TestPoisonBulkRefusesAnUnknownProjection: a bulk purge or replay filtered by a projection no
// parked entry names and the build does not have (a typo: "user") said it succeeded, having done
// nothing: the operator believed the queue of "users" handled. Now it is refused, from the CLI
// and over HTTP (400, field projection); a projection the build has, or one an entry names, is
// no error.
func TestPoisonBulkRefusesAnUnknownProjection(t *testing.T) {
	t.Parallel()
	p := newFaulty("users", nil)
	h := startHarness(t, p, harnessOptions{})
	parkFor(t, h, "users", "a")
	parkFor(t, h, "retired", "b") // a projection this build no longer has
	ts, _ := opsAPI(t, h)
	projs := []projection.Projection{p}

	for _, verb := range []string{"purge", "replay"} {
		out, err := poisonCLI(t, h, projs, verb, "--all", "--projection", "user")
		require.Error(t, err)
		assert.Contains(t, err.Error(), `no parked entry names projection "user" and this build has no such projection (known: users)`)
		assert.Empty(t, out, "no report of a run that did not run")
	}
	var e apiErr
	assert.Equal(t, http.StatusBadRequest, call(t, http.MethodDelete, ts.URL+"/ops/poison?projection=user", &e))
	assert.Equal(t, "projection", e.Error.Field)
	assert.Equal(t, http.StatusBadRequest, call(t, http.MethodPost, ts.URL+"/ops/poison/replay?projection=user", &e))
	assert.Len(t, h.poison(), 2, "nothing changed")

	for range 2 { // the second time none is parked: the build has it, so that is no error
		var res map[string]any
		assert.Equal(t, http.StatusOK, call(t, http.MethodDelete, ts.URL+"/ops/poison?projection=users", &res))
	}
	assert.Len(t, h.poison(), 1)
	out, err := poisonCLI(t, h, projs, "purge", "--all", "--projection", "retired")
	require.NoError(t, err, "an entry names it")
	assert.Equal(t, "purged 1 entries\n", out)
	assert.Empty(t, h.poison())
}

// TestPoisonBulkRouteRefusesAnUnknownParameter: DELETE /ops/poison?projetion=users (the filter's
// name misspelt) purged the whole queue: the route ignored parameters it does not know. Now
// they are refused (400, naming the parameter), and nothing changes.
func TestPoisonBulkRouteRefusesAnUnknownParameter(t *testing.T) {
	t.Parallel()
	p := newFaulty("users", nil)
	h := startHarness(t, p, harnessOptions{})
	parkFor(t, h, "users", "a")
	parkFor(t, h, "locations", "b")
	ts, _ := opsAPI(t, h)
	for _, m := range []string{http.MethodDelete + " /ops/poison?projetion=users", http.MethodPost + " /ops/poison/replay?projetion=users"} {
		method, path, _ := strings.Cut(m, " ")
		var e apiErr
		assert.Equal(t, http.StatusBadRequest, call(t, method, ts.URL+path, &e), m)
		assert.Equal(t, "projetion", e.Error.Field, m)
		assert.Contains(t, e.Error.Message, "is not a parameter of this route (it takes projection, version, after, until, limit)", m)
	}
	assert.Len(t, h.poison(), 2, "a request with a parameter the route does not know changes nothing")
}

// TestPoisonBulkByVersion: --version (HTTP: version) keeps a bulk run to the entries one version
// of the projection parked, which `projections drop` tells an operator to purge: without it the
// serving version's parked events went too, uncounted for good. It goes with --all and
// --projection; a bad one is refused, naming it, and nothing changes.
func TestPoisonBulkByVersion(t *testing.T) {
	t.Parallel()
	p := newFaulty("users", nil)
	h := startHarness(t, p, harnessOptions{})
	q := adapters.NewPoisonQueue(h.client, h.keys)
	e := domain.CheckinRecorded{Checkin: domain.Checkin{ID: "v", UserID: 1, LocationID: 2, StarRating: 3, Timestamp: 1_700_000_000_000}, RecordedAt: 1_700_000_000_000}
	parkV := func(version int) string {
		id, err := q.Park(context.Background(), ops.PoisonEntry{Stream: h.keys.Stream(), EntryID: "1-1", Projection: "users", Version: version,
			Group: testGroup, Error: "test", Attempts: 5, FailedAt: time.Now(), Fields: e.Fields()})
		require.NoError(t, err)
		return id
	}
	parkV(1)
	parkV(1)
	v2 := parkV(2)
	ts, _ := opsAPI(t, h)
	projs := []projection.Projection{p}

	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"purge", v2, "--version", "2"}, "poison purge does not take --version without --all"},
		{[]string{"purge", "--all", "--version", "2"}, "must be a projection version (1 or more) and go with a projection, got 2"},
		{[]string{"purge", "--all", "--projection", "users", "--version", "-1"}, "must be a projection version (1 or more) and go with a projection, got -1"},
	} {
		_, err := poisonCLI(t, h, projs, c.args...)
		require.Error(t, err, "%v", c.args)
		assert.Contains(t, err.Error(), c.want, "%v", c.args)
	}
	for _, query := range []string{"projection=users&version=0", "projection=users&version=x", "version=1"} {
		var ae apiErr
		assert.Equal(t, http.StatusBadRequest, call(t, http.MethodDelete, ts.URL+"/ops/poison?"+query, &ae), query)
		assert.Equal(t, "version", ae.Error.Field, query)
	}
	require.Len(t, h.poison(), 3, "nothing changed")

	var res map[string]any
	require.Equal(t, http.StatusOK, call(t, http.MethodDelete, ts.URL+"/ops/poison?projection=users&version=1", &res))
	assert.EqualValues(t, 2, res["purged"])
	left := h.poison()
	require.Len(t, left, 1)
	assert.Equal(t, v2, left[0].ID, "version 2's entry stays")
	out, err := poisonCLI(t, h, projs, "purge", "--all", "--projection", "users", "--version", "2")
	require.NoError(t, err)
	assert.Equal(t, "purged 1 entries\n", out)
	assert.Empty(t, h.poison())
}
