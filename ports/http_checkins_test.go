package ports_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/checkins/checkins/adapters"
	"github.com/checkins/checkins/adapters/redistest"
	"github.com/checkins/checkins/app"
	"github.com/checkins/checkins/app/command"
	"github.com/checkins/checkins/app/query"
	"github.com/checkins/checkins/domain"
	"github.com/checkins/checkins/ports"
)

const apiRequestTimeout = 3 * time.Second

// apiEnv is the real HTTP server on a real listener, wired like cmd/ wires it, on a private
// redis-server the test may kill.
type apiEnv struct {
	redis  *redistest.Server
	rdb    *redis.Client // the test's own client, for checks behind the API's back
	keys   adapters.KeySpace
	url    string
	client *http.Client
	idem   *adapters.IdempotencyStore // the API's own, to leave reservations as another process would
}

// pingReadiness is ready while Redis answers, as the service's readiness is.
type pingReadiness struct{ c *redis.Client }

func (r pingReadiness) Ready(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	return r.c.Ping(ctx).Err()
}

func newAPIEnv(t *testing.T) *apiEnv { return newAPIEnvWith(t, apiOptions{}) }

type apiOptions struct {
	redis          *redistest.Server       // shared with another env, as two API processes share one; nil: a private one
	requestTimeout time.Duration           // 0: apiRequestTimeout
	takeoverAge    time.Duration           // 0: the handler's default
	http           ports.HTTPConfig        // authentication and rate limits (RequestTimeout is set here)
	cors           []string                // CORS_ALLOWED_ORIGINS
	limits         *ports.ServerLimits     // serve through ports.ListenHTTP with these; nil: httptest
	routes         func(*ports.HTTPServer) // adds test-only routes before serving
	// userLimit, when set, limits POST /checkins per user in Redis (the command's limiter).
	userLimit command.RateLimit
	// oneStep records check-ins as serve does on a single Redis: the limit, the reservation and
	// the XADD in one script call (adapters.ReservingPublisher), through an auto-pipeline.
	oneStep bool
}

func newAPIEnvWith(t *testing.T, o apiOptions) *apiEnv {
	t.Helper()
	srv := o.redis
	if srv == nil {
		srv = redistest.Start(t, redistest.Options{AppendOnly: true})
	}
	if o.requestTimeout == 0 {
		o.requestTimeout = apiRequestTimeout
	}
	keys := adapters.KeySpace{Prefix: "checkins"}
	newClient := func() *redis.Client {
		c, err := adapters.NewRedisClient(adapters.ClientOptions{URL: srv.URL(), DialTimeout: 500 * time.Millisecond,
			ReadTimeout: time.Second, WriteTimeout: time.Second})
		require.NoError(t, err)
		return c
	}
	client := newClient()
	t.Cleanup(func() { _ = client.Close() })
	var pipe *adapters.AutoPipeline
	if o.oneStep {
		pipeClient := newClient()
		pipe = adapters.NewAutoPipeline(pipeClient, 64, 2)
		t.Cleanup(func() { _ = pipe.Close(); _ = pipeClient.Close() })
	}
	var pub *adapters.EventPublisher
	var err error
	if pipe != nil {
		pub, err = adapters.NewPipelinedEventPublisher(newClient(), pipe, keys, watermill.NopLogger{})
	} else {
		pub, err = adapters.NewEventPublisher(newClient(), keys, watermill.NopLogger{})
	}
	require.NoError(t, err)
	t.Cleanup(func() { _ = pub.Close() })
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	idem := adapters.NewIdempotencyStore(client, keys, time.Hour)
	if pipe != nil {
		idem.WithAutoPipeline(pipe)
	}
	rec, err := command.NewRecordCheckinHandler(pub, idem, time.Now, uuid.NewString, log)
	require.NoError(t, err)
	rec.WithTakeoverAge(o.takeoverAge)
	application := app.Application{
		Commands: app.Commands{RecordCheckin: rec},
		Queries: app.Queries{
			Checkins:  query.NewCheckins(adapters.NewEventLog(client, keys)),
			Users:     app.UserQueries{Reader: adapters.NewProjectionReader(client, keys, "users")},
			Locations: app.LocationQueries{Reader: adapters.NewProjectionReader(client, keys, "locations")},
		},
	}
	hc := o.http
	hc.RequestTimeout = o.requestTimeout
	hc.CORSAllowedOrigins = o.cors
	var limiter *adapters.RedisRateLimiter
	if !o.userLimit.Off() {
		l, err := adapters.NewRedisRateLimiter(client, pipe, keys, o.userLimit)
		require.NoError(t, err)
		limiter = l.WithReservations(idem)
		rec.WithUserLimit(limiter)
		hc.UserLimit = o.userLimit
	}
	if pipe != nil {
		rp, err := adapters.NewReservingPublisher(pub, pipe, idem, limiter)
		require.NoError(t, err)
		rec.WithReservingPublisher(rp)
	}
	server := ports.NewHTTPServer(application, pingReadiness{client}, hc, log)
	if o.routes != nil {
		o.routes(server)
	}
	url := serveForTest(t, server, o.limits, log)
	return &apiEnv{
		redis: srv, rdb: redistest.Client(t, srv.URL()), keys: keys, url: url, idem: idem,
		// Generous, so a hang fails the test instead of stalling it; not a timing assertion.
		client: &http.Client{Timeout: 4 * o.requestTimeout, Transport: contract.Transport(nil)},
	}
}

type apiResponse struct {
	status int
	header http.Header
	body   []byte
}

// json decodes the body keeping numbers as json.Number, so a test can tell 42 from "42".
func (r apiResponse) json(t testing.TB) map[string]any {
	t.Helper()
	dec := json.NewDecoder(bytes.NewReader(r.body))
	dec.UseNumber()
	var m map[string]any
	require.NoError(t, dec.Decode(&m), "body %s", r.body)
	return m
}

type apiErrorBody struct {
	Code    string `json:"code"`
	Message string `json:"message"`
	Field   string `json:"field"`
}

// apiError checks the error envelope strictly: only error, with code and message.
func (r apiResponse) apiError(t testing.TB) apiErrorBody {
	t.Helper()
	assert.Equal(t, "application/json", strings.Split(r.header.Get("Content-Type"), ";")[0])
	dec := json.NewDecoder(bytes.NewReader(r.body))
	dec.DisallowUnknownFields()
	var env struct {
		Error *apiErrorBody `json:"error"`
	}
	require.NoError(t, dec.Decode(&env), "error body %s", r.body)
	require.NotNil(t, env.Error, "error body %s", r.body)
	assert.NotEmpty(t, env.Error.Code)
	assert.NotEmpty(t, env.Error.Message)
	return *env.Error
}

func (e *apiEnv) do(t testing.TB, method, path, contentType string, body io.Reader, header map[string]string) apiResponse {
	t.Helper()
	req, err := http.NewRequest(method, e.url+path, body)
	require.NoError(t, err)
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := e.client.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return apiResponse{status: resp.StatusCode, header: resp.Header, body: b}
}

func (e *apiEnv) post(t testing.TB, body string, header map[string]string) apiResponse {
	t.Helper()
	return e.do(t, http.MethodPost, "/checkins", "application/json", strings.NewReader(body), header)
}

func (e *apiEnv) get(t testing.TB, path string) apiResponse {
	t.Helper()
	return e.do(t, http.MethodGet, path, "", nil, nil)
}

func (e *apiEnv) xlen(t testing.TB) int64 {
	t.Helper()
	n, err := e.rdb.XLen(context.Background(), e.keys.Stream()).Result()
	require.NoError(t, err)
	return n
}

func (e *apiEnv) idemKeys(t testing.TB) []string {
	t.Helper()
	ks, err := e.rdb.Keys(context.Background(), e.keys.IdempotencyPrefix()+"*").Result()
	require.NoError(t, err)
	return ks
}

func TestPostCheckinRejectsBadInput(t *testing.T) {
	t.Parallel()
	e := newAPIEnv(t)
	future := time.Now().Add(10 * time.Minute).UnixMilli()
	big := `{"userId":1,"locationId":1,"starRating":1,"checkinId":"` + strings.Repeat("a", 17<<10) + `"}`
	tests := []struct {
		name        string
		contentType string
		header      map[string]string
		body        string
		status      int
		code        string // checked when set
		field       string
	}{
		{name: "malformed JSON", body: `{"userId":`, status: 400, code: "malformed_json"},
		{name: "not JSON", body: `userId=1`, status: 400, code: "malformed_json"},
		{name: "empty body", body: ``, status: 400, code: "malformed_json"},
		{name: "JSON array", body: `[{"userId":1}]`, status: 400, code: "malformed_json"},
		{name: "JSON string", body: `"hi"`, status: 400, code: "malformed_json"},
		{name: "JSON null", body: ` null `, status: 400, code: "malformed_json"},
		{name: "two objects", body: `{"userId":1,"locationId":1,"starRating":1}{"userId":2}`, status: 400, code: "malformed_json"},
		{name: "trailing bracket", body: `{"userId":1,"locationId":1,"starRating":1}]`, status: 400, code: "malformed_json"},
		{name: "trailing garbage", body: `{"userId":1,"locationId":1,"starRating":1} x`, status: 400, code: "malformed_json"},
		{name: "userId as string", body: `{"userId":"42","locationId":1,"starRating":1}`, status: 400, code: "wrong_type", field: "userId"},
		{name: "userId float", body: `{"userId":4.5,"locationId":1,"starRating":1}`, status: 400, code: "wrong_type", field: "userId"},
		{name: "userId exponent", body: `{"userId":1e3,"locationId":1,"starRating":1}`, status: 400, code: "wrong_type", field: "userId"},
		{name: "userId overflow", body: `{"userId":99999999999999999999,"locationId":1,"starRating":1}`, status: 400, code: "out_of_range", field: "userId"},
		{name: "userId bool", body: `{"userId":true,"locationId":1,"starRating":1}`, status: 400, code: "wrong_type", field: "userId"},
		{name: "locationId as string", body: `{"userId":1,"locationId":"7","starRating":1}`, status: 400, code: "wrong_type", field: "locationId"},
		{name: "starRating float", body: `{"userId":1,"locationId":1,"starRating":4.5}`, status: 400, code: "wrong_type", field: "starRating"},
		{name: "timestamp as string", body: `{"userId":1,"locationId":1,"starRating":1,"timestamp":"now"}`, status: 400, code: "wrong_type", field: "timestamp"},
		{name: "userId beyond int64", body: `{"userId":9223372036854775808,"locationId":1,"starRating":1}`, status: 400, code: "out_of_range", field: "userId"},
		{name: "timestamp below int64", body: `{"userId":1,"locationId":1,"starRating":1,"timestamp":-9223372036854775809}`, status: 400, code: "out_of_range", field: "timestamp"},
		{name: "checkinId as number", body: `{"userId":1,"locationId":1,"starRating":1,"checkinId":5}`, status: 400, code: "wrong_type", field: "checkinId"},
		{name: "userId missing", body: `{"locationId":1,"starRating":1}`, status: 400, code: "required", field: "userId"},
		{name: "userId null", body: `{"userId":null,"locationId":1,"starRating":1}`, status: 400, code: "required", field: "userId"},
		{name: "locationId missing", body: `{"userId":1,"starRating":1}`, status: 400, code: "required", field: "locationId"},
		{name: "starRating missing", body: `{"userId":1,"locationId":1}`, status: 400, code: "required", field: "starRating"},
		{name: "empty object", body: `{}`, status: 400, code: "required", field: "userId"},
		{name: "userId 0", body: `{"userId":0,"locationId":1,"starRating":1}`, status: 400, code: "out_of_range", field: "userId"},
		{name: "userId -1", body: `{"userId":-1,"locationId":1,"starRating":1}`, status: 400, code: "out_of_range", field: "userId"},
		{name: "locationId 0", body: `{"userId":1,"locationId":0,"starRating":1}`, status: 400, code: "out_of_range", field: "locationId"},
		{name: "starRating 6", body: `{"userId":1,"locationId":1,"starRating":6}`, status: 400, code: "out_of_range", field: "starRating"},
		{name: "starRating -1", body: `{"userId":1,"locationId":1,"starRating":-1}`, status: 400, code: "out_of_range", field: "starRating"},
		{name: "timestamp 0", body: `{"userId":1,"locationId":1,"starRating":1,"timestamp":0}`, status: 400, code: "out_of_range", field: "timestamp"},
		{name: "timestamp in the future", body: fmt.Sprintf(`{"userId":1,"locationId":1,"starRating":1,"timestamp":%d}`, future), status: 400, code: "out_of_range", field: "timestamp"},
		{name: "checkinId empty", body: `{"userId":1,"locationId":1,"starRating":1,"checkinId":""}`, status: 400, field: "checkinId"},
		{name: "checkinId bad characters", body: `{"userId":1,"locationId":1,"starRating":1,"checkinId":"a b"}`, status: 400, code: "invalid", field: "checkinId"},
		{name: "checkinId too long", body: `{"userId":1,"locationId":1,"starRating":1,"checkinId":"` + strings.Repeat("a", 129) + `"}`, status: 400, code: "out_of_range", field: "checkinId"},
		// The characters are what is wrong, not the length (130 bytes): the message says so.
		{name: "checkinId of 65 non-ASCII letters", body: `{"userId":1,"locationId":1,"starRating":1,"checkinId":"` + strings.Repeat("é", 65) + `"}`, status: 400, code: "invalid", field: "checkinId"},
		{name: "unknown field", body: `{"userId":1,"locationId":1,"starRating":1,"rating":5}`, status: 400, code: "unknown_field", field: "rating"},
		{name: "unknown field first", body: `{"user_id":1}`, status: 400, code: "unknown_field", field: "user_id"},
		// Strict decoding: what encoding/json alone would take with a 202.
		{name: "duplicate key", body: `{"userId":1,"userId":2,"locationId":1,"starRating":1}`, status: 400, code: "duplicate_field", field: "userId"},
		{name: "duplicate key, same value", body: `{"userId":1,"locationId":1,"starRating":1,"starRating":1}`, status: 400, code: "duplicate_field", field: "starRating"},
		{name: "duplicate key spelled with an escape", body: `{"userId":1,"\u0075serId":2,"locationId":1,"starRating":1}`, status: 400, code: "duplicate_field", field: "userId"},
		{name: "duplicate key at the end", body: `{"checkinId":"a","locationId":1,"starRating":1,"userId":1,"checkinId":"b"}`, status: 400, code: "duplicate_field", field: "checkinId"},
		{name: "key in upper case", body: `{"USERID":43,"locationId":1,"starRating":1}`, status: 400, code: "unknown_field", field: "USERID"},
		{name: "key in other case", body: `{"userId":1,"locationId":1,"starRating":1,"TIMESTAMP":1609602085397}`, status: 400, code: "unknown_field", field: "TIMESTAMP"},
		{name: "case variant next to the real key", body: `{"userId":1,"userid":2,"locationId":1,"starRating":1}`, status: 400, code: "unknown_field", field: "userid"},
		{name: "key matching by Unicode folding (long s)", body: `{"userId":1,"locationId":1,"ſtarRating":1}`, status: 400, code: "unknown_field", field: "ſtarRating"},
		{name: "key matching by Unicode folding (Kelvin sign)", body: `{"userId":1,"locationId":1,"starRating":1,"checKinId":"x"}`, status: 400, code: "unknown_field", field: "checKinId"},
		{name: "invalid UTF-8 in a value", body: "{\"userId\":1,\"locationId\":1,\"starRating\":1,\"checkinId\":\"a\xffb\"}", status: 400, code: "invalid_utf8"},
		{name: "invalid UTF-8 in a key", body: "{\"userId\":1,\"locationId\":1,\"starRating\":1,\"\xc3\":1}", status: 400, code: "invalid_utf8"},
		{name: "object as a value", body: `{"userId":{"userId":2},"locationId":1,"starRating":1}`, status: 400, code: "wrong_type", field: "userId"},
		{name: "trailing object after the body", body: `{"userId":1,"locationId":1,"starRating":1} {"userId":2}`, status: 400, code: "malformed_json"},
		{name: "trailing comma", body: `{"userId":1,"locationId":1,"starRating":1,}`, status: 400, code: "malformed_json"},
		{name: "body over 16 KiB", body: big, status: 413},
		{name: "text/plain", contentType: "text/plain", body: `{"userId":1,"locationId":1,"starRating":1}`, status: 415},
		{name: "no Content-Type", contentType: "-", body: `{"userId":1,"locationId":1,"starRating":1}`, status: 415},
		{name: "form Content-Type", contentType: "application/x-www-form-urlencoded", body: `userId=1`, status: 415},
		{name: "Idempotency-Key differs from checkinId", header: map[string]string{"Idempotency-Key": "k-1"},
			body: `{"userId":1,"locationId":1,"starRating":1,"checkinId":"k-2"}`, status: 400, field: "checkinId"},
		{name: "Idempotency-Key sent empty", header: map[string]string{"Idempotency-Key": ""},
			body: `{"userId":1,"locationId":1,"starRating":1}`, status: 400, code: "required", field: "Idempotency-Key"},
		{name: "Idempotency-Key with bad characters", header: map[string]string{"Idempotency-Key": "k 1"},
			body: `{"userId":1,"locationId":1,"starRating":1}`, status: 400, code: "invalid", field: "Idempotency-Key"},
		{name: "Idempotency-Key too long", header: map[string]string{"Idempotency-Key": strings.Repeat("k", 129)},
			body: `{"userId":1,"locationId":1,"starRating":1}`, status: 400, code: "out_of_range", field: "Idempotency-Key"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ct := "application/json"
			switch tt.contentType {
			case "-":
				ct = ""
			case "":
			default:
				ct = tt.contentType
			}
			events, reserved := e.xlen(t), len(e.idemKeys(t))
			resp := e.do(t, http.MethodPost, "/checkins", ct, strings.NewReader(tt.body), tt.header)
			require.Equal(t, tt.status, resp.status, "body %s", resp.body)
			ae := resp.apiError(t)
			assert.Equal(t, tt.field, ae.Field, "message %q", ae.Message)
			if tt.code != "" {
				assert.Equal(t, tt.code, ae.Code, "message %q", ae.Message)
			}
			if tt.field != "" {
				assert.Contains(t, ae.Message, tt.field, "the message names the field")
			}
			assert.Equal(t, events, e.xlen(t), "a rejected request writes no event")
			assert.Len(t, e.idemKeys(t), reserved, "a rejected request reserves nothing")
		})
	}
}

func TestPostCheckinAccepts(t *testing.T) {
	t.Parallel()
	e := newAPIEnv(t)
	ts := time.Now().Add(-time.Hour).UnixMilli()

	resp := e.post(t, fmt.Sprintf(`{"checkinId":"ck-1","userId":42,"locationId":7,"starRating":5,"timestamp":%d}`, ts),
		map[string]string{"X-Correlation-ID": "corr-1"})
	require.Equal(t, http.StatusAccepted, resp.status, "body %s", resp.body)
	assert.Equal(t, "corr-1", resp.header.Get("X-Correlation-ID"))
	body := resp.json(t)
	assert.Equal(t, map[string]any{
		"checkinId": "ck-1", "userId": json.Number("42"), "locationId": json.Number("7"),
		"starRating": json.Number("5"), "timestamp": json.Number(fmt.Sprint(ts)),
	}, body)
	require.Equal(t, int64(1), e.xlen(t), "202 means the event is in Redis")
	xs, err := e.rdb.XRange(context.Background(), e.keys.Stream(), "-", "+").Result()
	require.NoError(t, err)
	assert.Equal(t, "corr-1", xs[0].Values["meta:correlation_id"], "the correlation ID flows into the event")
	assert.Equal(t, "42", xs[0].Values["userId"])

	// A correlation ID that is not 1-128 visible ASCII characters (no quotes or markup) is
	// replaced by a new one: it would travel into the event, the logs and the answer as it is.
	for _, bad := range []string{"a\tb", "a b", "caf\xc3\xa9", "\xff\xfe", "<script>", `a"b`, strings.Repeat("x", 129)} {
		resp := e.do(t, http.MethodGet, "/healthz", "", nil, map[string]string{"X-Correlation-ID": bad})
		got := resp.header.Get("X-Correlation-ID")
		assert.NotEqual(t, bad, got, "%q", bad)
		_, err := uuid.Parse(got)
		assert.NoError(t, err, "a new UUID for %q, got %q", bad, got)
	}
	assert.Equal(t, "Req-42_x.y:z/1", e.do(t, http.MethodGet, "/healthz", "", nil, map[string]string{"X-Correlation-ID": "Req-42_x.y:z/1"}).header.Get("X-Correlation-ID"))

	// Retry: same answer, no second event.
	again := e.post(t, fmt.Sprintf(`{"checkinId":"ck-1","userId":42,"locationId":7,"starRating":5,"timestamp":%d}`, ts), nil)
	require.Equal(t, http.StatusAccepted, again.status)
	assert.Equal(t, body, again.json(t))
	assert.Equal(t, "true", again.header.Get("Idempotent-Replayed"))
	assert.Equal(t, int64(1), e.xlen(t))

	// Same checkinId, different body: conflict, nothing written.
	conflict := e.post(t, fmt.Sprintf(`{"checkinId":"ck-1","userId":42,"locationId":7,"starRating":4,"timestamp":%d}`, ts), nil)
	require.Equal(t, http.StatusConflict, conflict.status, "body %s", conflict.body)
	ae := conflict.apiError(t)
	assert.Equal(t, "conflict", ae.Code)
	assert.Equal(t, "checkinId", ae.Field)
	assert.Equal(t, int64(1), e.xlen(t))
}

func TestPostCheckinDefaultsAndIdempotencyKey(t *testing.T) {
	t.Parallel()
	e := newAPIEnv(t)
	before := time.Now().UnixMilli()

	// No checkinId, no timestamp: both are filled in.
	resp := e.post(t, `{"userId":1,"locationId":2,"starRating":0}`, nil)
	require.Equal(t, http.StatusAccepted, resp.status, "body %s", resp.body)
	body := resp.json(t)
	id, ok := body["checkinId"].(string)
	require.True(t, ok, "checkinId is a string: %v", body["checkinId"])
	assert.NoError(t, uuid.Validate(id))
	tsNum, ok := body["timestamp"].(json.Number)
	require.True(t, ok, "timestamp is a number: %v", body["timestamp"])
	tsVal, err := tsNum.Int64()
	require.NoError(t, err)
	assert.GreaterOrEqual(t, tsVal, before)
	assert.Equal(t, json.Number("0"), body["starRating"])

	// Idempotency-Key is the checkinId; a retry without a timestamp answers the first timestamp.
	key := map[string]string{"Idempotency-Key": "key-1"}
	first := e.post(t, `{"userId":1,"locationId":2,"starRating":3}`, key)
	require.Equal(t, http.StatusAccepted, first.status, "body %s", first.body)
	assert.Equal(t, "key-1", first.json(t)["checkinId"])
	firstTS, err := first.json(t)["timestamp"].(json.Number).Int64()
	require.NoError(t, err)
	// Let the clock pass the first timestamp, so a retry that took "now" again would differ.
	require.Eventually(t, func() bool { return time.Now().UnixMilli() > firstTS }, time.Second, time.Millisecond)
	again := e.post(t, `{"userId":1,"locationId":2,"starRating":3}`, key)
	require.Equal(t, http.StatusAccepted, again.status)
	assert.Equal(t, first.json(t), again.json(t))

	// The header may repeat the body's checkinId; charset parameters are fine.
	same := e.do(t, http.MethodPost, "/checkins", "application/json; charset=utf-8",
		strings.NewReader(`{"checkinId":"key-2","userId":1,"locationId":2,"starRating":3}`), map[string]string{"Idempotency-Key": "key-2"})
	require.Equal(t, http.StatusAccepted, same.status, "body %s", same.body)
	assert.Equal(t, "key-2", same.json(t)["checkinId"])

	assert.Equal(t, int64(3), e.xlen(t), "three distinct check-ins, each once")
}

func TestPostCheckinRedisDown(t *testing.T) {
	t.Parallel()
	e := newAPIEnv(t)
	require.Equal(t, http.StatusAccepted, e.post(t, `{"userId":1,"locationId":2,"starRating":3}`, nil).status)
	e.redis.Kill()

	for _, body := range []string{`{"userId":1,"locationId":2,"starRating":3}`, `{"checkinId":"x1","userId":1,"locationId":2,"starRating":3}`} {
		resp := e.post(t, body, nil)
		require.Equal(t, http.StatusServiceUnavailable, resp.status, "body %s", resp.body)
		ae := resp.apiError(t)
		assert.Equal(t, "unavailable", ae.Code)
		assert.Empty(t, ae.Field)
	}
	// Bad input is still told apart from an outage.
	resp := e.post(t, `{"userId":0,"locationId":2,"starRating":3}`, nil)
	assert.Equal(t, http.StatusBadRequest, resp.status)

	e.redis.Restart()
	require.EventuallyWithT(t, func(ct *assert.CollectT) {
		assert.Equal(ct, http.StatusAccepted, e.post(t, `{"checkinId":"x1","userId":1,"locationId":2,"starRating":3}`, nil).status)
	}, 10*time.Second, 50*time.Millisecond, "the API recovers by itself")
}

// A hung Redis (alive, accepting connections, never answering) is worse than a dead one: the
// request must still end in a 503 by the request timeout instead of hanging.
func TestPostCheckinRedisHung(t *testing.T) {
	t.Parallel()
	// The timed-out request's reservation may reach Redis once it answers again, and its retry
	// waits for it to be old enough to take over: a short takeover age keeps the test short.
	e := newAPIEnvWith(t, apiOptions{takeoverAge: time.Second})
	require.Equal(t, http.StatusAccepted, e.post(t, `{"userId":1,"locationId":2,"starRating":3}`, nil).status)
	info, err := e.rdb.InfoMap(context.Background(), "server").Result()
	require.NoError(t, err)
	pid, err := strconv.Atoi(info["Server"]["process_id"])
	require.NoError(t, err)
	require.NoError(t, syscall.Kill(pid, syscall.SIGSTOP))
	t.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGCONT) })

	resp := e.post(t, `{"checkinId":"hung-1","userId":1,"locationId":2,"starRating":3}`, nil)
	require.Equal(t, http.StatusServiceUnavailable, resp.status, "body %s", resp.body)
	assert.Equal(t, "unavailable", resp.apiError(t).Code)
	resp = e.get(t, "/users/1")
	require.Equal(t, http.StatusServiceUnavailable, resp.status, "body %s", resp.body)

	require.NoError(t, syscall.Kill(pid, syscall.SIGCONT))
	require.EventuallyWithT(t, func(ct *assert.CollectT) {
		assert.Equal(ct, http.StatusAccepted, e.post(t, `{"checkinId":"hung-1","userId":1,"locationId":2,"starRating":3}`, nil).status)
	}, 10*time.Second, 50*time.Millisecond)
	assert.Equal(t, int64(2), e.xlen(t), "the timed-out request and its retry make one event")
}

// postAll sends n requests with body at once and returns their responses.
func (e *apiEnv) postAll(t *testing.T, body string, n int) []apiResponse {
	t.Helper()
	start := make(chan struct{})
	out := make(chan apiResponse, n)
	for range n {
		go func() {
			<-start
			out <- e.post(t, body, nil)
		}()
	}
	close(start)
	resps := make([]apiResponse, n)
	for i := range resps {
		resps[i] = <-out
	}
	return resps
}

// assertOneRecorded checks that all answers accepted the same check-in and exactly one of
// them recorded it (no Idempotent-Replayed header).
func assertOneRecorded(t *testing.T, resps []apiResponse) {
	t.Helper()
	recorded := 0
	for _, r := range resps {
		require.Equal(t, http.StatusAccepted, r.status, "body %s", r.body)
		assert.Equal(t, resps[0].json(t), r.json(t), "every answer is the first accepted check-in")
		if r.header.Get("Idempotent-Replayed") == "" {
			recorded++
		} else {
			assert.Equal(t, "true", r.header.Get("Idempotent-Replayed"))
		}
	}
	assert.Equal(t, 1, recorded, "exactly one answer without Idempotent-Replayed")
}

// A client retrying eagerly (or a load balancer duplicating) sends the same new check-in many
// times at once: one event, one listing, whatever the answers' order.
func TestPostCheckinSimultaneousFirstRequests(t *testing.T) {
	t.Parallel()
	for _, oneStep := range []bool{false, true} {
		t.Run(stepName(oneStep), func(t *testing.T) {
			t.Parallel()
			e := newAPIEnvWith(t, apiOptions{oneStep: oneStep})
			// No timestamp: each request would default its own; all must answer the first one's.
			resps := e.postAll(t, `{"checkinId":"race-1","userId":42,"locationId":7,"starRating":5}`, 50)
			assertOneRecorded(t, resps)
			assert.Equal(t, int64(1), e.xlen(t), "exactly one event on the stream")

			list := e.get(t, "/checkins")
			require.Equal(t, http.StatusOK, list.status, "body %s", list.body)
			var page struct {
				Checkins []map[string]any `json:"checkins"`
			}
			require.NoError(t, json.Unmarshal(list.body, &page))
			assert.Len(t, page.Checkins, 1, "listed once")
		})
	}
}

// stepName names a subtest of the two ways a check-in is recorded.
func stepName(oneStep bool) string {
	if oneStep {
		return "one-step"
	}
	return "reserve-then-publish"
}

func TestPostCheckinSimultaneousAcrossProcesses(t *testing.T) {
	t.Parallel()
	for _, oneStep := range []bool{false, true} {
		t.Run(stepName(oneStep), func(t *testing.T) {
			t.Parallel()
			a := newAPIEnvWith(t, apiOptions{oneStep: oneStep})
			// The other process records in the other way: a rolling upgrade has both at once.
			b := newAPIEnvWith(t, apiOptions{redis: a.redis, oneStep: !oneStep})
			body := `{"checkinId":"race-2","userId":42,"locationId":7,"starRating":5}`
			out := make(chan []apiResponse, 2)
			for _, e := range []*apiEnv{a, b} {
				go func() { out <- e.postAll(t, body, 25) }()
			}
			assertOneRecorded(t, append(<-out, <-out...))
			assert.Equal(t, int64(1), a.xlen(t), "exactly one XADD across both processes")
		})
	}
}

// reserveElsewhere leaves a reservation as a request of another process does before its XADD.
func (e *apiEnv) reserveElsewhere(t *testing.T, id string, userID, locationID, stars, ts int64, reservedAt time.Time) command.IdempotencyRecord {
	t.Helper()
	in := domain.CheckinInput{CheckinID: &id, UserID: &userID, LocationID: &locationID, StarRating: &stars, Timestamp: &ts}
	rec := command.IdempotencyRecord{Fingerprint: in.Fingerprint(), RecordedAt: reservedAt.UnixMilli(), Owner: "elsewhere",
		ReservedAt: reservedAt.UnixMilli(), Checkin: domain.Checkin{ID: id, UserID: userID, LocationID: locationID, StarRating: int(stars), Timestamp: ts}}
	got, err := e.idem.Reserve(context.Background(), rec)
	require.NoError(t, err)
	require.Nil(t, got)
	return rec
}

func TestPostCheckinConflictWhileWaiting(t *testing.T) {
	t.Parallel()
	e := newAPIEnv(t)
	ts := time.Now().Add(-time.Hour).UnixMilli()
	theirs := e.reserveElsewhere(t, "wait-1", 42, 7, 5, ts, time.Now())
	body := fmt.Sprintf(`{"checkinId":"wait-1","userId":42,"locationId":7,"starRating":5,"timestamp":%d}`, ts)

	sets := redistest.CommandCalls(t, e.rdb, "set")
	waiter := make(chan apiResponse, 1)
	go func() { waiter <- e.post(t, body, nil) }()
	require.Eventually(t, func() bool { return redistest.CommandCalls(t, e.rdb, "set") >= sets+3 }, 5*time.Second, time.Millisecond,
		"the request waits, polling the reservation")

	conflict := e.post(t, fmt.Sprintf(`{"checkinId":"wait-1","userId":42,"locationId":7,"starRating":1,"timestamp":%d}`, ts), nil)
	require.Equal(t, http.StatusConflict, conflict.status, "body %s", conflict.body)
	assert.Equal(t, "conflict", conflict.apiError(t).Code)

	// The other process publishes and marks it (its XADD is not this test's concern).
	require.NoError(t, e.idem.MarkPublished(context.Background(), theirs))
	resp := <-waiter
	require.Equal(t, http.StatusAccepted, resp.status, "body %s", resp.body)
	assert.Equal(t, "true", resp.header.Get("Idempotent-Replayed"))
	assert.Equal(t, "wait-1", resp.json(t)["checkinId"])
	assert.Equal(t, int64(0), e.xlen(t), "the waiter did not publish")
}

func TestPostCheckinWaitEndsWithTheRequest(t *testing.T) {
	t.Parallel()
	e := newAPIEnvWith(t, apiOptions{requestTimeout: 300 * time.Millisecond})
	ts := time.Now().Add(-time.Hour).UnixMilli()
	e.reserveElsewhere(t, "wait-2", 42, 7, 5, ts, time.Now())

	resp := e.post(t, fmt.Sprintf(`{"checkinId":"wait-2","userId":42,"locationId":7,"starRating":5,"timestamp":%d}`, ts), nil)
	require.Equal(t, http.StatusServiceUnavailable, resp.status, "body %s", resp.body)
	assert.Equal(t, "unavailable", resp.apiError(t).Code)
	assert.Equal(t, int64(0), e.xlen(t))
}

func TestPostCheckinTakesOverAnAbandonedReservation(t *testing.T) {
	t.Parallel()
	e := newAPIEnvWith(t, apiOptions{takeoverAge: 200 * time.Millisecond})
	ts := time.Now().Add(-time.Hour).UnixMilli()
	e.reserveElsewhere(t, "dead-1", 42, 7, 5, ts, time.Now())

	resps := e.postAll(t, fmt.Sprintf(`{"checkinId":"dead-1","userId":42,"locationId":7,"starRating":5,"timestamp":%d}`, ts), 10)
	for _, r := range resps {
		require.Equal(t, http.StatusAccepted, r.status, "body %s", r.body)
		assert.Equal(t, "true", r.header.Get("Idempotent-Replayed"), "the check-in was first accepted elsewhere")
	}
	assert.Equal(t, int64(1), e.xlen(t), "published once, by one taker")
}
