package ports_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/checkins/checkins/adapters"
	"github.com/checkins/checkins/app"
	"github.com/checkins/checkins/app/command"
	"github.com/checkins/checkins/app/ops"
	"github.com/checkins/checkins/app/projection"
	"github.com/checkins/checkins/app/query"
	"github.com/checkins/checkins/domain"
	"github.com/checkins/checkins/ports"
)

// poisonOps are the replay and purge commands the ops routes drive.
type poisonOps struct {
	*command.ReplayPoisoned
	*command.PurgePoisoned
}

// opsApp is the application's operational use cases on Redis (client, keys) for projs.
func opsApp(t *testing.T, client redis.UniversalClient, keys adapters.KeySpace, projs []projection.Projection, cfg app.OpsConfig) app.Application {
	t.Helper()
	applier, err := adapters.NewProjectionApplier(client, keys, 0)
	require.NoError(t, err)
	cfg.Backend, cfg.Applier, cfg.Projections = adapters.NewOpsBackend(client, keys), applier, projs
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	var a app.Application
	require.NoError(t, a.AddOps(cfg))
	return a
}

// opsAPI serves the ops routes over a real listener, on the harness's Redis and keys.
func opsAPI(t *testing.T, h *harness) (*httptest.Server, poisonOps) {
	t.Helper()
	log := slog.New(slog.DiscardHandler)
	a := opsApp(t, h.client, h.keys, []projection.Projection{h.proj}, app.OpsConfig{})
	srv := ports.NewHTTPServer(app.Application{}, nil, ports.HTTPConfig{RequestTimeout: 5 * time.Second}, log)
	require.NoError(t, ports.RegisterOpsRoutes(srv.Echo(), a))
	ts := httptest.NewServer(srv.Handler())
	t.Cleanup(ts.Close)
	return ts, poisonOps{a.Commands.ReplayPoisoned, a.Commands.PurgePoisoned}
}

// call does one request and decodes the JSON answer into out (when not nil).
func call(t *testing.T, method, url string, out any) int {
	t.Helper()
	req, err := http.NewRequest(method, url, nil)
	require.NoError(t, err)
	resp, err := contractClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	if out != nil && len(body) > 0 {
		require.NoError(t, json.Unmarshal(body, out), "body: %s", body)
	}
	return resp.StatusCode
}

type apiErr struct {
	Error struct {
		Code, Message, Field string
	} `json:"error"`
	Result command.ReplayResult `json:"result"`
}

func TestOpsPoisonListShowReplayPurgeOverHTTP(t *testing.T) {
	t.Parallel()
	broken := func(_ context.Context, id string, _ int) error {
		if id == "bad-1" || id == "bad-2" {
			return errors.New("bug in the projection")
		}
		return nil
	}
	p := newFaulty("faulty", broken)
	h := startHarness(t, p, harnessOptions{})
	ts, _ := opsAPI(t, h)

	h.add("good", 1)
	h.add("bad-1", 4)
	h.add("bad-2", 5)
	garbageID := h.xadd(map[string]any{"hello": "world"})
	h.settled(1)
	require.Eventually(t, func() bool { return len(h.poison()) == 3 }, 10*time.Second, 20*time.Millisecond)

	// List, paged.
	var page query.PoisonPage
	require.Equal(t, http.StatusOK, call(t, "GET", ts.URL+"/ops/poison", &page))
	require.Len(t, page.Entries, 3)
	assert.Empty(t, page.Next)
	// bad-1 and bad-2 are the projection's; the garbage entry, not an event at all, is parked
	// once for the group, under no projection.
	require.Equal(t, http.StatusOK, call(t, "GET", ts.URL+"/ops/poison?projection=faulty&limit=1", &page))
	require.Len(t, page.Entries, 1)
	require.NotEmpty(t, page.Next)
	var rest query.PoisonPage
	require.Equal(t, http.StatusOK, call(t, "GET", ts.URL+"/ops/poison?projection=faulty&limit=2&cursor="+page.Next, &rest))
	require.Len(t, rest.Entries, 1)
	var none query.PoisonPage
	require.Equal(t, http.StatusOK, call(t, "GET", ts.URL+"/ops/poison?projection=other", &none))
	assert.Empty(t, none.Entries)
	var all query.PoisonPage
	require.Equal(t, http.StatusOK, call(t, "GET", ts.URL+"/ops/poison", &all))
	byCheckin := map[string]ops.PoisonEntry{}
	for _, e := range all.Entries {
		byCheckin[e.Fields[domain.FieldCheckinID]] = e
	}
	bad1, bad2 := byCheckin["bad-1"], byCheckin["bad-2"]
	garbage := byCheckin[""]
	assert.Equal(t, garbageID, garbage.EntryID)

	// Bad input and missing entries, in the API's error format.
	var e apiErr
	for url, code := range map[string]string{
		"/ops/poison?limit=0":    domain.CodeOutOfRange, // the same codes as the public routes' limits
		"/ops/poison?limit=1001": domain.CodeOutOfRange,
		"/ops/poison?limit=many": domain.CodeInvalid,
	} {
		e = apiErr{}
		assert.Equal(t, http.StatusBadRequest, call(t, "GET", ts.URL+url, &e), url)
		assert.Equal(t, "limit", e.Error.Field, url)
		assert.Equal(t, code, e.Error.Code, url)
		assert.Contains(t, e.Error.Message, "must be an integer from 1 to 1000", url)
	}
	assert.Equal(t, http.StatusBadRequest, call(t, "GET", ts.URL+"/ops/poison?cursor=yesterday", &e))
	assert.Equal(t, "cursor", e.Error.Field)
	// The bulk calls name their own parameters.
	for _, bulk := range []struct{ method, path string }{{"POST", "/ops/poison/replay"}, {"DELETE", "/ops/poison"}} {
		for _, param := range []string{"after", "until"} {
			e = apiErr{}
			assert.Equal(t, http.StatusBadRequest, call(t, bulk.method, ts.URL+bulk.path+"?"+param+"=yesterday", &e), "%s %s", bulk.method, param)
			assert.Equal(t, param, e.Error.Field, "%s %s?%s=", bulk.method, bulk.path, param)
		}
		for limit, code := range map[string]string{"0": domain.CodeOutOfRange, "-5": domain.CodeOutOfRange, "all": domain.CodeInvalid} {
			e = apiErr{}
			assert.Equal(t, http.StatusBadRequest, call(t, bulk.method, ts.URL+bulk.path+"?limit="+limit, &e), "%s limit=%s", bulk.method, limit)
			assert.Equal(t, "limit", e.Error.Field)
			assert.Equal(t, code, e.Error.Code, "%s limit=%s", bulk.method, limit)
		}
	}
	assert.Equal(t, http.StatusBadRequest, call(t, "GET", ts.URL+"/ops/poison/not-an-id", &e))
	assert.Equal(t, "id", e.Error.Field)
	assert.Equal(t, http.StatusNotFound, call(t, "GET", ts.URL+"/ops/poison/1-1", &e))
	assert.Equal(t, domain.CodeNotFound, e.Error.Code)

	// Show.
	var shown ops.PoisonEntry
	require.Equal(t, http.StatusOK, call(t, "GET", ts.URL+"/ops/poison/"+bad1.ID, &shown))
	assert.Equal(t, bad1, shown)

	// Replay while the handler is still broken: kept, with the new error, under a new ID.
	require.Equal(t, http.StatusUnprocessableEntity, call(t, "POST", ts.URL+"/ops/poison/"+bad1.ID+"/replay", &e))
	assert.Equal(t, "replay_failed", e.Error.Code)
	require.NotEmpty(t, e.Result.NewID)
	assert.Equal(t, http.StatusNotFound, call(t, "GET", ts.URL+"/ops/poison/"+bad1.ID, nil))
	var kept ops.PoisonEntry
	require.Equal(t, http.StatusOK, call(t, "GET", ts.URL+"/ops/poison/"+e.Result.NewID, &kept))
	assert.Contains(t, kept.Error, "replay: bug in the projection")
	assert.Equal(t, bad1.Attempts+1, kept.Attempts)
	assert.Equal(t, bad1.EntryID, kept.EntryID)
	assert.Equal(t, bad1.Fields, kept.Fields, "the event itself is unchanged")
	assert.Equal(t, int64(1), h.count())

	// Replay of a malformed entry fails clearly and keeps it as it is.
	require.Equal(t, http.StatusUnprocessableEntity, call(t, "POST", ts.URL+"/ops/poison/"+garbage.ID+"/replay", &e))
	assert.Equal(t, "not_replayable", e.Error.Code)
	assert.Contains(t, e.Error.Message, "missing event type")
	assert.Equal(t, http.StatusOK, call(t, "GET", ts.URL+"/ops/poison/"+garbage.ID, nil))

	// Fix the handler; replay counts the event once and removes the entry.
	p.setBehaviour(nil)
	var rr command.ReplayResult
	require.Equal(t, http.StatusOK, call(t, "POST", ts.URL+"/ops/poison/"+kept.ID+"/replay", &rr))
	assert.Equal(t, command.ReplayReplayed, rr.Status)
	assert.True(t, rr.Applied)
	assert.Equal(t, int64(2), h.count())
	assert.Equal(t, http.StatusNotFound, call(t, "POST", ts.URL+"/ops/poison/"+kept.ID+"/replay", &e), "replayed entries are gone")

	// Replay all: bad-2 is replayed, the garbage stays.
	var bulk command.BulkResult
	require.Equal(t, http.StatusOK, call(t, "POST", ts.URL+"/ops/poison/replay", &bulk))
	assert.Equal(t, 1, bulk.Replayed)
	assert.Equal(t, 1, bulk.NotReplayable)
	assert.Empty(t, bulk.Next)
	assert.Equal(t, int64(3), h.count())
	assert.Equal(t, int64(1+4+5), h.stars())
	_ = bad2

	// Status.
	var st query.StatusReport
	require.Equal(t, http.StatusOK, call(t, "GET", ts.URL+"/ops/status", &st))
	assert.Equal(t, h.keys.Stream(), st.Stream)
	assert.Equal(t, int64(4), st.StreamLength)
	assert.Equal(t, int64(1), st.Poisoned)
	require.Len(t, st.Projections, 1)
	ps := st.Projections[0]
	assert.Equal(t, testGroup, ps.Group)
	assert.Equal(t, "live", ps.Kind)
	assert.Equal(t, []string{"faulty.v1"}, ps.Members)
	assert.True(t, ps.GroupExists)
	assert.Zero(t, ps.Pending)
	require.NotNil(t, ps.Lag)
	assert.Zero(t, *ps.Lag)
	assert.Nil(t, ps.OldestPending)
	assert.Equal(t, int64(1), ps.Poisoned)
	require.Len(t, ps.Consumers, 1)
	assert.Equal(t, "c1", ps.Consumers[0].Name)

	// Purge.
	assert.Equal(t, http.StatusNoContent, call(t, "DELETE", ts.URL+"/ops/poison/"+garbage.ID, nil))
	assert.Equal(t, http.StatusNotFound, call(t, "DELETE", ts.URL+"/ops/poison/"+garbage.ID, &e))
	assert.Empty(t, h.poison())
}

func (h *harness) stars() int64 {
	v, err := h.client.HGet(context.Background(), h.keys.ProjectionKey(h.proj.name, 1, "all", "stats"), "stars").Int64()
	require.NoError(h.t, err)
	return v
}

// park puts a valid event in the poison queue as if projection faulty had given up on it.
func (h *harness) park(id string, stars int) string {
	h.t.Helper()
	e := domain.CheckinRecorded{Checkin: domain.Checkin{ID: id, UserID: 1, LocationID: 2, StarRating: stars, Timestamp: 1_700_000_000_000}, RecordedAt: 1_700_000_000_000}
	pid, err := adapters.NewPoisonQueue(h.client, h.keys).Park(context.Background(), ops.PoisonEntry{
		Stream: h.keys.Stream(), EntryID: "1-1", Projection: "faulty", Group: testGroup, Error: "test", Attempts: 5,
		FailedAt: time.Now(), Fields: e.Fields()})
	require.NoError(h.t, err)
	return pid
}

func TestOpsReplayNeverDoubleCounts(t *testing.T) {
	t.Parallel()
	p := newFaulty("faulty", nil)
	h := startHarness(t, p, harnessOptions{})
	_, ops := opsAPI(t, h)
	ctx := context.Background()

	h.add("counted", 3)
	h.settled(1)
	// The same event parked twice (its batch was nacked after parking, say) and replayed twice:
	// the second replay finds the first one's markers and changes nothing.
	first, second := h.park("parked", 2), h.park("parked", 2)
	res, err := ops.Replay(ctx, first)
	require.NoError(t, err)
	assert.True(t, res.Applied)
	res, err = ops.Replay(ctx, second)
	require.NoError(t, err)
	assert.False(t, res.Applied, "already counted by the first replay")
	assert.Equal(t, int64(2), h.count())
	assert.Equal(t, int64(3+2), h.stars())
	assert.Empty(t, h.poison())
	// A replay cut off after applying and before deleting the entry is run again: a no-op.
	third := h.park("parked", 2)
	res, err = ops.Replay(ctx, third)
	require.NoError(t, err)
	assert.False(t, res.Applied)
	assert.Equal(t, int64(2), h.count())
}

// TestOpsReplayOfAReplacedVersionNeverDoubleCounts: an entry parked by version 1 is replayed
// after a rebuild made version 2 the one serving reads. Version 2 was built from the stream,
// which still holds the entry, so it handled the entry itself (here: counted it): the replay
// deletes the parked entry and applies nothing. It used to apply it to version 2 under the
// replay's own markers, counting it twice. An entry the stream no longer holds (trimmed, maybe
// before the rebuild) is still replayed into version 2.
func TestOpsReplayOfAReplacedVersionNeverDoubleCounts(t *testing.T) {
	t.Parallel()
	p := newFaulty("faulty", nil)
	h := startHarness(t, p, harnessOptions{})
	_, replay := opsAPI(t, h)
	ctx := context.Background()
	q := adapters.NewPoisonQueue(h.client, h.keys)
	countV2 := func() int64 {
		v, err := h.client.HGet(ctx, h.keys.ProjectionKey("faulty", 2, "all", "stats"), "count").Int64()
		if errors.Is(err, redis.Nil) {
			return 0
		}
		require.NoError(t, err)
		return v
	}
	parkV1 := func(ev domain.CheckinRecorded, entryID string) string {
		id, err := q.Park(ctx, ops.PoisonEntry{Stream: h.keys.Stream(), EntryID: entryID, Projection: "faulty", Group: testGroup,
			Version: 1, Error: "test", Attempts: 5, FailedAt: time.Now(), Fields: ev.Fields(), Decision: ops.DecisionCounted})
		require.NoError(t, err)
		return id
	}

	ev := domain.CheckinRecorded{Checkin: domain.Checkin{ID: "in-stream", UserID: 1, LocationID: 2, StarRating: 3, Timestamp: time.Now().UnixMilli()},
		RecordedAt: time.Now().UnixMilli()}
	entryID := h.xadd(h.values(ev, "corr"))
	h.settled(1)
	// Version 2's build went through the stream and counted it; then it became the one serving.
	_, err := h.apply.ApplyEvent(ctx, "faulty.v2", p, 2, ev, entryID)
	require.NoError(t, err)
	require.NoError(t, h.client.HSet(ctx, h.keys.Projections(), "faulty.version", "2").Err())
	require.Equal(t, int64(1), countV2())

	res, err := replay.Replay(ctx, parkV1(ev, entryID))
	require.NoError(t, err)
	assert.False(t, res.Applied, "version 2 handled the entry itself")
	assert.Equal(t, int64(1), countV2())
	assert.Empty(t, h.poison(), "the parked entry is gone")

	trimmed := domain.CheckinRecorded{Checkin: domain.Checkin{ID: "trimmed", UserID: 1, LocationID: 2, StarRating: 1, Timestamp: 1_600_000_000_000},
		RecordedAt: 1_600_000_000_000}
	res, err = replay.Replay(ctx, parkV1(trimmed, "1600000000000-0"))
	require.NoError(t, err)
	assert.True(t, res.Applied, "an entry older than the stream's first is replayed into version 2")
	assert.Equal(t, int64(2), countV2())

	// Where version 2's build began recorded (Start does it): replays are judged by that.
	reg := adapters.NewProjectionVersions(h.client, h.keys)
	checkin := func(id string) domain.CheckinRecorded {
		return domain.CheckinRecorded{Checkin: domain.Checkin{ID: id, UserID: 1, LocationID: 2, StarRating: 1, Timestamp: time.Now().UnixMilli()},
			RecordedAt: time.Now().UnixMilli()}
	}
	begin := checkin("build-began-here")
	beginID := h.xadd(h.values(begin, "corr"))
	park := func(ev domain.CheckinRecorded, entryID string, version int, at time.Time) string {
		id, err := q.Park(ctx, ops.PoisonEntry{Stream: h.keys.Stream(), EntryID: entryID, Projection: "faulty", Group: testGroup,
			Version: version, Error: "test", Attempts: 5, FailedAt: at, Fields: ev.Fields(), Decision: ops.DecisionCounted})
		require.NoError(t, err)
		return id
	}
	// Parked by an earlier build of version 2 (abandoned, started again), before this one began
	// (by the server's clock: the entry's ID against the build start's TIME).
	earlier := park(checkin("earlier-build"), beginID, 2, time.Now())
	time.Sleep(3 * time.Millisecond)
	builtAt := time.Now()
	require.NoError(t, reg.SetBuildStart(ctx, "faulty", 2, ops.BuildStart{At: builtAt.UnixMilli(), Streams: map[string]string{h.keys.Stream(): beginID}}))

	// Version 1 parked it; version 2's build counted it; then RETENTION trimmed it.
	gone := checkin("built-then-trimmed")
	goneID := h.xadd(h.values(gone, "corr"))
	_, err = h.apply.ApplyEvent(ctx, "faulty.v2", p, 2, gone, goneID)
	require.NoError(t, err)
	ms, seq, _ := strings.Cut(goneID, "-")
	n, err := strconv.Atoi(seq)
	require.NoError(t, err)
	require.NoError(t, h.client.XTrimMinID(ctx, h.keys.Stream(), ms+"-"+strconv.Itoa(n+1)).Err())
	before := countV2()
	res, err = replay.Replay(ctx, park(gone, goneID, 1, time.Now()))
	require.NoError(t, err)
	assert.False(t, res.Applied, "the build went through it, though the stream no longer holds it")
	assert.Equal(t, before, countV2())

	// Parked by an earlier build of version 2 (abandoned, started again): this build went
	// through it too.
	res, err = replay.Replay(ctx, earlier)
	require.NoError(t, err)
	assert.False(t, res.Applied, "parked before this build began")
	assert.Equal(t, before, countV2())

	// Parked by this build: replayed into it.
	res, err = replay.Replay(ctx, park(checkin("this-build"), goneID, 2, builtAt.Add(time.Second)))
	require.NoError(t, err)
	assert.True(t, res.Applied, "parked by this build")
	assert.Equal(t, before+1, countV2())

	// Below where the build began (trimmed before it): replayed into version 2.
	res, err = replay.Replay(ctx, park(checkin("before-the-build"), "1600000000001-0", 1, time.Now()))
	require.NoError(t, err)
	assert.True(t, res.Applied, "the build never saw it")
	assert.Equal(t, before+2, countV2())
}

func TestOpsReplayAllGoesInChunksAndResumes(t *testing.T) {
	t.Parallel()
	p := newFaulty("faulty", nil)
	h := startHarness(t, p, harnessOptions{})
	ts, ops := opsAPI(t, h)
	const n = 250
	for i := range n {
		h.park("chunk-"+strconv.Itoa(i), 1)
	}
	// Over HTTP, a bounded call answers where to continue.
	var bulk command.BulkResult
	require.Equal(t, http.StatusOK, call(t, "POST", ts.URL+"/ops/poison/replay?limit=120", &bulk))
	assert.Equal(t, 120, bulk.Replayed)
	require.NotEmpty(t, bulk.Next)
	require.NotEmpty(t, bulk.Until)
	// Entries parked after the run began are not part of it.
	late := h.park("late", 1)
	var more command.BulkResult
	require.Equal(t, http.StatusOK, call(t, "POST", ts.URL+"/ops/poison/replay?after="+bulk.Next+"&until="+bulk.Until, &more))
	assert.Equal(t, n-120, more.Replayed)
	assert.Empty(t, more.Next)
	assert.Equal(t, int64(n), h.count())
	es := h.poison()
	require.Len(t, es, 1)
	assert.Equal(t, late, es[0].ID)

	// The CLI's form: everything in one call, chunk by chunk.
	for i := range n {
		h.park("again-"+strconv.Itoa(i), 1)
	}
	res, err := ops.ReplayAll(context.Background(), command.BulkRequest{})
	require.NoError(t, err)
	assert.Equal(t, n+1, res.Replayed)
	assert.Equal(t, int64(2*n+1), h.count())
	assert.Empty(t, h.poison())

	// Purge all, by projection.
	for i := range 150 {
		h.park("purge-"+strconv.Itoa(i), 1)
	}
	pr, err := ops.PurgeAll(context.Background(), command.BulkRequest{Projection: "other"})
	require.ErrorContains(t, err, `no parked entry names projection "other"`, "neither an entry nor the build names it")
	assert.Zero(t, pr.Purged)
	pr, err = ops.PurgeAll(context.Background(), command.BulkRequest{Projection: "faulty"})
	require.NoError(t, err)
	assert.Equal(t, int64(150), pr.Purged)
	assert.Empty(t, h.poison())
}

// TestOpsConcurrentBulkRunsReportWhatEachDid: three replay-all runs at once over the same parked
// entries each report only what they replayed themselves (the others' entries are "gone" for
// them), so the totals add up to what was parked and every event counts once; the same for
// purge-all.
func TestOpsConcurrentBulkRunsReportWhatEachDid(t *testing.T) {
	t.Parallel()
	p := newFaulty("faulty", nil)
	h := startHarness(t, p, harnessOptions{})
	_, ops := opsAPI(t, h)
	const n = 600
	for i := range n {
		h.park("c-"+strconv.Itoa(i), 1)
	}
	run := func(f func(context.Context, command.BulkRequest) (command.BulkResult, error)) []command.BulkResult {
		out := make([]command.BulkResult, 3)
		var wg sync.WaitGroup
		for i := range out {
			wg.Add(1)
			go func() {
				defer wg.Done()
				res, err := f(context.Background(), command.BulkRequest{})
				assert.NoError(t, err)
				out[i] = res
			}()
		}
		wg.Wait()
		return out
	}
	replayed, gone := 0, 0
	for _, r := range run(ops.ReplayAll) {
		replayed += r.Replayed
		gone += r.Gone
		assert.Zero(t, r.Failed)
	}
	assert.Equal(t, n, replayed, "each entry reported replayed by exactly one run (gone for the others: %d)", gone)
	assert.Equal(t, int64(n), h.count(), "every event applied once")
	assert.Empty(t, h.poison())

	for i := range n {
		h.park("p-"+strconv.Itoa(i), 1)
	}
	var purged int64
	for _, r := range run(ops.PurgeAll) {
		purged += r.Purged
	}
	assert.Equal(t, int64(n), purged, "each entry reported purged by exactly one run")
	assert.Empty(t, h.poison())
}

func TestOpsStatusShowsPendingAndLag(t *testing.T) {
	t.Parallel()
	p := newFaulty("faulty", nil)
	h := startHarness(t, p, harnessOptions{})
	ctx := context.Background()
	// A second group that a crashed consumer left with pending entries and undelivered lag.
	for i := range 5 {
		h.add("e-"+strconv.Itoa(i), 1)
	}
	h.settled(5)
	require.NoError(t, h.client.XGroupCreate(ctx, h.keys.Stream(), "faulty.v2", "0").Err())
	_, err := h.client.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "faulty.v2", Consumer: "crashed", Streams: []string{h.keys.Stream(), ">"}, Count: 2}).Result()
	require.NoError(t, err)
	status := opsApp(t, h.client, h.keys, []projection.Projection{p}, app.OpsConfig{}).Queries.Status
	st, err := status.Status(ctx)
	require.NoError(t, err)
	require.Len(t, st.Projections, 2)
	v2 := st.Projections[1]
	assert.Equal(t, "faulty.v2", v2.Group)
	assert.False(t, v2.Serving)
	assert.Equal(t, int64(2), v2.Pending)
	require.NotNil(t, v2.Lag)
	assert.Equal(t, int64(3), *v2.Lag)
	require.NotNil(t, v2.OldestPending)
	assert.Equal(t, "crashed", v2.OldestPending.Consumer)
	assert.Equal(t, int64(1), v2.OldestPending.Deliveries)
	require.Len(t, v2.Consumers, 1)
	assert.Equal(t, int64(2), v2.Consumers[0].Pending)
}

// failNthXDel fails every XDEL of a client from the nth on: Redis lost in the middle of a bulk
// purge.
type failNthXDel struct {
	n, seen int
}

func (h *failNthXDel) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *failNthXDel) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (h *failNthXDel) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if strings.EqualFold(cmd.Name(), "xdel") {
			if h.seen++; h.seen >= h.n {
				cmd.SetErr(&net.OpError{Op: "read", Net: "tcp", Err: syscall.ECONNRESET})
				return cmd.Err()
			}
		}
		return next(ctx, cmd)
	}
}

// TestOpsBulkRunCutShortByAnOutageSaysWhatItDid: a bulk purge over HTTP that loses Redis after
// it purged a chunk answers what it purged, where to continue and why it stopped, not a bare
// 503 (the entries are gone either way); one that did nothing yet is a 503.
func TestOpsBulkRunCutShortByAnOutageSaysWhatItDid(t *testing.T) {
	t.Parallel()
	h := startHarness(t, newFaulty("faulty", nil), harnessOptions{})
	for i := range 250 {
		h.park("outage-"+strconv.Itoa(i), 1)
	}
	hook := &failNthXDel{n: 2}
	hooked := redis.NewClient(h.client.Options())
	t.Cleanup(func() { _ = hooked.Close() })
	hooked.AddHook(hook)
	a := opsApp(t, hooked, h.keys, []projection.Projection{h.proj}, app.OpsConfig{})
	srv := ports.NewHTTPServer(app.Application{}, nil, ports.HTTPConfig{RequestTimeout: 5 * time.Second}, slog.New(slog.DiscardHandler))
	require.NoError(t, ports.RegisterOpsRoutes(srv.Echo(), a))
	ts := httptest.NewServer(srv.Handler())
	t.Cleanup(ts.Close)

	var res command.BulkResult
	require.Equal(t, http.StatusOK, call(t, "DELETE", ts.URL+"/ops/poison", &res))
	assert.EqualValues(t, 100, res.Purged, "the first chunk went")
	assert.Contains(t, res.StoppedBy, "connection reset by peer")
	require.NotEmpty(t, res.Next)
	require.NotEmpty(t, res.Until)
	assert.Len(t, h.poison(), 150)

	// Redis still lost: a run that purges nothing is a 503.
	var body map[string]any
	assert.Equal(t, http.StatusServiceUnavailable, call(t, "DELETE", ts.URL+"/ops/poison?after="+res.Next+"&until="+res.Until, &body))

	// Back: the run continues where it stopped.
	hook.n = 1 << 30
	var more command.BulkResult
	require.Equal(t, http.StatusOK, call(t, "DELETE", ts.URL+"/ops/poison?after="+res.Next+"&until="+res.Until, &more))
	assert.EqualValues(t, 150, more.Purged)
	assert.Empty(t, more.StoppedBy)
	assert.Empty(t, h.poison())
}

// TestRouterParksTheProjectionWhoseKeyIsOfAnotherType: a key of another type under one
// projection (written by hand, or by another program) failed the apply script half-way; the
// one-by-one search then applied each projection's updates alone, under the marker they share,
// so the second found it and answered "already applied": the event was lost for that projection
// without an error and without a parked event. Now only that projection's unit is parked, the
// others count the event, and once the key is fixed the replay counts it once.
func TestRouterParksTheProjectionWhoseKeyIsOfAnotherType(t *testing.T) {
	t.Parallel()
	p, q := newFaulty("faulty", nil), newFaulty("other", nil)
	var badKey string
	reg := prometheus.NewRegistry()
	metrics, err := ports.NewMetrics(reg)
	require.NoError(t, err)
	h := startHarness(t, p, harnessOptions{
		observer: metrics,
		targets:  []ops.ProjectionTarget{{Projection: p, Version: 1}, {Projection: q, Version: 1}},
		before: func(h *harness) {
			badKey = h.keys.ProjectionKey("other", 1, "all", "stats")
			require.NoError(t, h.client.Set(context.Background(), badKey, "not a hash", 0).Err())
		},
	})
	ctx := context.Background()
	h.add("before", 1)
	h.add("e1", 2)
	h.add("after", 3)
	h.settled(3)
	require.Eventually(t, func() bool { return len(h.poison()) == 3 }, 10*time.Second, 20*time.Millisecond)
	es := h.poison()
	for _, e := range es {
		assert.Equal(t, "other", e.Projection, "only the projection whose key is of another type is parked")
		assert.Contains(t, e.Error, "WRONGTYPE")
	}
	assert.Equal(t, int64(1+2+3), h.stars(), "the other projection counted every event once")
	mfs, err := reg.Gather()
	require.NoError(t, err)
	events := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() == "checkins_projection_events_total" {
			for _, m := range mf.GetMetric() {
				l := map[string]string{}
				for _, lp := range m.GetLabel() {
					l[lp.GetName()] = lp.GetValue()
				}
				events[l["projection"]+" "+l["outcome"]] += m.GetCounter().GetValue()
			}
		}
	}
	assert.GreaterOrEqual(t, events["faulty applied"], float64(3), "%v", events) // a redelivery counts again
	assert.Zero(t, events["other applied"], "nothing of the parked projection was applied: %v", events)
	assert.Equal(t, float64(3), events["other poisoned"], "%v", events)

	// Fixed, and replayed: counted once.
	require.NoError(t, h.client.Del(ctx, badKey).Err())
	a := opsApp(t, h.client, h.keys, []projection.Projection{p, q}, app.OpsConfig{})
	for _, e := range es {
		res, err := a.Commands.ReplayPoisoned.Replay(ctx, e.ID)
		require.NoError(t, err)
		assert.True(t, res.Applied)
	}
	n, err := h.client.HGet(ctx, badKey, "count").Int64()
	require.NoError(t, err)
	assert.Equal(t, int64(3), n, "the parked events, once each")
	assert.Equal(t, int64(3), h.count())
	assert.Empty(t, h.poison())
}

// TestOpsBulkReplayPastTheQueueEndTriesEachEntryOnce: a replay-all given an until past the
// queue's last entry (the API takes any entry ID) walked on, after a full chunk, into the entries
// its own failed replays had just re-parked at the queue's end, and replayed them again: with
// max 300 and 100 entries still failing (one chunk), each was replayed and re-parked 3 times in
// one call, and reported failed 3 times. The bound is now the queue's last entry when the run
// starts.
func TestOpsBulkReplayPastTheQueueEndTriesEachEntryOnce(t *testing.T) {
	t.Parallel()
	p := newFaulty("faulty", func(context.Context, string, int) error { return errors.New("still broken") })
	h := startHarness(t, p, harnessOptions{})
	_, ops := opsAPI(t, h)
	for i := range command.PoisonChunk {
		h.park("broken-"+strconv.Itoa(i), 1)
	}
	res, err := ops.ReplayAll(context.Background(), command.BulkRequest{Until: "99999999999999-0", Max: 3 * command.PoisonChunk})
	require.NoError(t, err)
	assert.Equal(t, command.PoisonChunk, res.Failed, "%+v", res)
	assert.Len(t, h.poison(), command.PoisonChunk, "each re-parked once")
	assert.Equal(t, 1, p.attempts("broken-0"), "replayed once")
}
