package main

import (
	"context"
	"io"
	"net/http"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/labstack/echo/v4"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/checkins/checkins/adapters"
	"github.com/checkins/checkins/adapters/redistest"
	"github.com/checkins/checkins/examples/checkinsclient"
	"github.com/checkins/checkins/ports"
	"github.com/checkins/checkins/ports/openapitest"
)

// contract validates every response the test clients (testHTTPClient, authedClient,
// plainClient) receive against ports/openapi.yml; TestMain fails the run on any mismatch.
var contract = openapitest.MustNew()

// specRoutes is "METHOD /path" of every operation of the spec, split by listener: the ops
// routes (tagged ops) and the health checks on the ops listener, the rest on the public one.
func specRoutes(t *testing.T) (public, ops []string) {
	t.Helper()
	doc, err := openapitest.Load(context.Background())
	require.NoError(t, err)
	for path, item := range doc.Paths.Map() {
		for method, op := range item.Operations() {
			rs := []string{method + " " + path}
			if method == http.MethodGet {
				// The spec's description: every GET route answers HEAD too.
				rs = append(rs, http.MethodHead+" "+path)
			}
			for _, r := range rs {
				switch {
				case path == "/healthz" || path == "/readyz":
					public, ops = append(public, r), append(ops, r)
				case contains(op.Tags, "ops"):
					ops = append(ops, r)
				default:
					public = append(public, r)
				}
			}
		}
	}
	sort.Strings(public)
	sort.Strings(ops)
	return public, ops
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

// echoRoutes is "METHOD /path" of every route registered on e, in the spec's {param} syntax.
func echoRoutes(routes []string) []string {
	sort.Strings(routes)
	return routes
}

func registered(s *Service) (public, ops []string) {
	conv := func(path string) string {
		parts := strings.Split(path, "/")
		for i, p := range parts {
			if strings.HasPrefix(p, ":") {
				parts[i] = "{" + p[1:] + "}"
			}
		}
		return strings.Join(parts, "/")
	}
	// The dashboard (/ui/, and GET / that sends a browser to it or to /docs) is HTML for people,
	// not part of the API: its contract is the browser tests (ui_browser_test.go, ui_test.go).
	dashboard := func(r *echo.Route) bool {
		return r.Path == "/" || r.Path == "/ui" || strings.HasPrefix(r.Path, "/ui/")
	}
	for _, r := range s.http.Echo().Routes() {
		if !dashboard(r) {
			public = append(public, r.Method+" "+conv(r.Path))
		}
	}
	for _, r := range s.http.OpsEcho().Routes() {
		if !dashboard(r) {
			ops = append(ops, r.Method+" "+conv(r.Path))
		}
	}
	return echoRoutes(public), echoRoutes(ops)
}

// Every route the service registers on either listener is in the spec, on the listener the spec
// says, and every path of the spec is registered.
func TestOpenAPIRoutesAreTheServicesRoutes(t *testing.T) {
	t.Parallel()
	wantPublic, wantOps := specRoutes(t)
	rdb := redistest.Open(t)
	svc := startInProcess(t, map[string]string{"REDIS_URL": rdb.URL, "KEY_PREFIX": rdb.Prefix, "OPS_ADDR": "127.0.0.1:0"}, Mode{API: true, Projections: true})
	public, ops := registered(svc.svc)
	assert.Equal(t, wantPublic, public, "public listener")
	assert.Equal(t, wantOps, ops, "ops listener")

	// A projector-only process records nothing: POST /checkins is the one route it leaves out.
	proj := startInProcess(t, map[string]string{"REDIS_URL": rdb.URL, "KEY_PREFIX": rdb.Prefix, "OPS_ADDR": "127.0.0.1:0"}, Mode{Projections: true})
	public, _ = registered(proj.svc)
	var want []string
	for _, r := range wantPublic {
		if r != "POST /checkins" {
			want = append(want, r)
		}
	}
	assert.Equal(t, want, public)
}

// A client generated from the spec as the README says (examples/checkinsclient) records and
// reads check-ins on the real service, and decodes its typed errors.
func TestGeneratedClientDrivesTheService(t *testing.T) {
	t.Parallel()
	rdb := redistest.Open(t)
	svc := startInProcess(t, map[string]string{"REDIS_URL": rdb.URL, "KEY_PREFIX": rdb.Prefix}, Mode{API: true, Projections: true})
	ctx := context.Background()
	token := testToken(42, ports.ScopeOps)
	c, err := checkinsclient.NewClientWithResponses(svc.base, checkinsclient.WithHTTPClient(plainClient),
		checkinsclient.WithRequestEditorFn(func(_ context.Context, r *http.Request) error {
			r.Header.Set("Authorization", "Bearer "+token)
			return nil
		}))
	require.NoError(t, err)

	id := "generated-client-1"
	res, err := c.PostCheckinWithResponse(ctx, &checkinsclient.PostCheckinParams{IdempotencyKey: &id},
		checkinsclient.CheckinRequest{LocationId: 7, StarRating: 4})
	require.NoError(t, err)
	require.Equal(t, http.StatusAccepted, res.StatusCode(), "%s", res.Body)
	require.NotNil(t, res.JSON202)
	assert.Equal(t, id, res.JSON202.CheckinId)
	assert.Equal(t, int64(42), res.JSON202.UserId)

	bad, err := c.PostCheckinWithResponse(ctx, nil, checkinsclient.CheckinRequest{LocationId: 7, StarRating: 9})
	require.NoError(t, err)
	require.Equal(t, http.StatusBadRequest, bad.StatusCode())
	require.NotNil(t, bad.JSON400)
	assert.Equal(t, "out_of_range", bad.JSON400.Error.Code)
	require.NotNil(t, bad.JSON400.Error.Field)
	assert.Equal(t, "starRating", *bad.JSON400.Error.Field)

	require.Eventually(t, func() bool {
		u, err := c.GetUserWithResponse(ctx, 42, nil)
		return err == nil && u.JSON200 != nil && u.JSON200.NumCheckins == 1 && u.JSON200.LastSeenAt == 7
	}, 30*time.Second, 50*time.Millisecond)
	latest, err := c.GetLatestCheckinWithResponse(ctx, nil)
	require.NoError(t, err)
	require.NotNil(t, latest.JSON200, "%s", latest.Body)
	assert.Equal(t, id, latest.JSON200.CheckinId)

	st, err := c.GetOpsStatusWithResponse(ctx, nil)
	require.NoError(t, err)
	require.NotNil(t, st.JSON200, "%s", st.Body)
	assert.EqualValues(t, 1, st.JSON200.StreamLength)
}

// TestForeignEntryAnswersTheContract: an entry another producer added without recordedAt is a
// check-in (the stream is open to every writer); /checkins/latest and /checkins still answer the
// RecordedCheckin schema, recordedAt the time Redis recorded the entry (its ID's milliseconds).
func TestForeignEntryAnswersTheContract(t *testing.T) {
	t.Parallel()
	rdb := redistest.Open(t)
	svc := startInProcess(t, map[string]string{"REDIS_URL": rdb.URL, "KEY_PREFIX": rdb.Prefix}, Mode{API: true})
	keys := adapters.KeySpace{Prefix: rdb.Prefix}
	id, err := redistest.Client(t, rdb.URL).XAdd(context.Background(), &redis.XAddArgs{Stream: keys.Stream(), Values: map[string]any{
		"type": "checkin.recorded.v1", "checkinId": "hand-1", "userId": "44", "locationId": "8", "starRating": "3", "timestamp": "1609602085397"}}).Result()
	require.NoError(t, err)
	ms, _, _ := strings.Cut(id, "-")
	for _, path := range []string{"/checkins/latest", "/checkins"} {
		resp, err := plainClient.Get(svc.base + path) // the transport checks the answer against openapi.yml
		require.NoError(t, err, path)
		b, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		require.Equal(t, http.StatusOK, resp.StatusCode, "%s: %s", path, b)
		assert.Contains(t, string(b), `"recordedAt":`+ms, path)
	}
}
