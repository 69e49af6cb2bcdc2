package ports_test

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"

	"github.com/checkins/checkins/ports"
	"github.com/checkins/checkins/ports/openapitest"
)

// contract validates every response the test clients of this package receive against
// openapi.yml (apiEnv.client, contractClient); TestMain fails the run on any mismatch.
var contract = openapitest.MustNew()

var contractClient = &http.Client{Timeout: 30 * time.Second, Transport: contract.Transport(nil)}

func TestMain(m *testing.M) {
	code := m.Run()
	if err := contract.Err(); err != nil { // also the mismatches a test's retry loop swallowed
		fmt.Fprintln(os.Stderr, "FAIL: responses that openapi.yml does not describe:", err)
		code = 1
	}
	os.Exit(code)
}

func TestOpenAPISpecIsValid(t *testing.T) {
	t.Parallel()
	doc, err := openapitest.Load(context.Background())
	require.NoError(t, err)
	assert.Equal(t, "3.0.3", doc.OpenAPI)

	for path, item := range doc.Paths.Map() {
		ops := strings.HasPrefix(path, "/ops/") || path == "/metrics"
		for method, op := range item.Operations() {
			name := method + " " + path
			assert.NotEmpty(t, op.OperationID, name)
			assert.Equal(t, ops, contains(op.Tags, "ops"), "%s: the ops routes, and only they, are tagged ops", name)
			if op.RequestBody != nil {
				for mt, c := range op.RequestBody.Value.Content {
					require.NotNil(t, c.Schema, name)
					ap := c.Schema.Value.AdditionalProperties
					assert.True(t, ap.Has != nil && !*ap.Has, "%s %s: request schema must have additionalProperties: false", name, mt)
				}
			}
			assert.NotNil(t, op.Responses.Value("431"), "%s: net/http answers 431 on every route", name)
			for status, r := range op.Responses.Map() {
				if status == "431" {
					continue // net/http's own answer, before any middleware
				}
				h := r.Value.Headers[ports.HeaderCorrelationID]
				if assert.NotNil(t, h, "%s %s: every answer carries X-Correlation-ID", name, status) {
					assert.True(t, h.Value.Required, "%s %s", name, status)
				}
				if status == "429" {
					assert.NotNil(t, r.Value.Headers["Retry-After"], "%s 429 sends Retry-After", name)
				}
				if status == "401" {
					assert.NotNil(t, r.Value.Headers["WWW-Authenticate"], "%s 401 sends WWW-Authenticate", name)
				}
			}
			assert.NotNil(t, op.Responses.Value("429"), "%s: the per-address limit covers every route", name)
			if ops && path != "/metrics" {
				// Every ops route needs a scope; mutations need checkins:ops itself.
				require.NotNil(t, op.Security, name)
				want := [][]string{{ports.ScopeOpsRead}, {ports.ScopeOps}}
				if method != http.MethodGet {
					want = [][]string{{ports.ScopeOps}}
				}
				var got [][]string
				for _, req := range *op.Security {
					got = append(got, req["bearerAuth"])
				}
				assert.Equal(t, want, got, "%s: scopes", name)
				for _, s := range []string{"401", "403"} {
					assert.NotNil(t, op.Responses.Value(s), "%s answers %s", name, s)
				}
			}
		}
	}
	post := doc.Paths.Find("/checkins").Post
	for _, s := range []string{"202", "400", "401", "403", "409", "413", "415", "429", "503"} {
		assert.NotNil(t, post.Responses.Value(s), "POST /checkins answers %s", s)
	}
	assert.Equal(t, openapi3.SecurityRequirements{{"bearerAuth": {}}}, *post.Security)
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

// The generated glue passes the path ids on as text, so that the handlers' own parsing answers
// with the API's exact errors (oapi-server-overlay.yml); without the overlay the glue refuses
// these itself with "Invalid format for parameter id".
func TestOpenAPIGlueKeepsTheParameterErrors(t *testing.T) {
	t.Parallel()
	env := newAPIEnv(t)
	for _, tc := range []struct {
		path, field, code, message string
	}{
		{"/users/abc", "userId", "invalid", `userId must be an integer >= 1, got "abc"`},
		{"/users/1,2", "userId", "invalid", `userId must be an integer >= 1, got "1,2"`},
		{"/users/99999999999999999999", "userId", "invalid", `userId must be an integer >= 1, got "99999999999999999999"`},
		{"/users/0", "userId", "invalid", `userId must be an integer >= 1, got "0"`},
		{"/locations/-3", "locationId", "invalid", `locationId must be an integer >= 1, got "-3"`},
		{"/users/%2531", "userId", "invalid", `userId must be an integer >= 1, got "%31"`}, // decoded once, not twice
		{"/users/+1", "userId", "invalid", `userId must be an integer >= 1, got "+1"`},
		{"/users/01", "userId", "invalid", `userId must be an integer >= 1, got "01"`},
		{"/checkins?limit=x", "limit", "invalid", `limit: must be an integer from 1 to 1000, got "x"`},
		{"/checkins?limit=0", "limit", "out_of_range", `limit: must be an integer from 1 to 1000, got "0"`},
		{"/checkins?limit=1001", "limit", "out_of_range", `limit: must be an integer from 1 to 1000, got "1001"`},
		{"/checkins?from=yesterday", "from", "invalid", `from must be milliseconds since the epoch, got "yesterday"`},
	} {
		r := env.do(t, http.MethodGet, tc.path, "", nil, nil)
		require.Equal(t, http.StatusBadRequest, r.status, "%s: %s", tc.path, r.body)
		e := r.apiError(t)
		assert.Equal(t, tc.code, e.Code, tc.path)
		assert.Equal(t, tc.field, e.Field, tc.path)
		assert.Equal(t, tc.message, e.Message, tc.path)
	}
	// A repeated query parameter is read as before: the first value counts. A repeated
	// Idempotency-Key is refused (which key the client meant is not ours to pick).
	r := env.do(t, http.MethodGet, "/checkins?limit=2&limit=x", "", nil, nil)
	assert.Equal(t, http.StatusOK, r.status, "%s", r.body)
	req, err := http.NewRequest(http.MethodPost, env.url+"/checkins", strings.NewReader(`{"userId":1,"locationId":2,"starRating":3}`))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Add(ports.HeaderIdempotencyKey, "dup-key-1")
	req.Header.Add(ports.HeaderIdempotencyKey, "dup-key-2")
	resp, err := env.client.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	var out map[string]any
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&out))
	assert.Equal(t, http.StatusBadRequest, resp.StatusCode, "%v", out)
	assert.Equal(t, map[string]any{"code": "invalid", "field": "Idempotency-Key", "message": "Idempotency-Key header sent 2 times: send it once"}, out["error"])
}

func TestOpenAPIServedAsJSONAndYAML(t *testing.T) {
	t.Parallel()
	env := newAPIEnv(t)
	r := env.do(t, http.MethodGet, "/openapi.yaml", "", nil, nil)
	require.Equal(t, http.StatusOK, r.status)
	assert.Equal(t, "application/yaml", r.header.Get("Content-Type"))
	assert.Equal(t, ports.OpenAPIYAML, r.body)

	r = env.do(t, http.MethodGet, "/openapi.json", "", nil, nil)
	require.Equal(t, http.StatusOK, r.status)
	assert.Equal(t, "application/json", r.header.Get("Content-Type"))
	// The same document: the JSON loads, validates and equals the YAML.
	doc, err := openapi3.NewLoader().LoadFromData(r.body)
	require.NoError(t, err)
	require.NoError(t, doc.Validate(context.Background()))
	var fromYAML any
	require.NoError(t, yaml.Unmarshal(ports.OpenAPIYAML, &fromYAML))
	want, err := json.Marshal(fromYAML)
	require.NoError(t, err)
	assert.JSONEq(t, string(want), string(r.body))
}

func TestDocsPageIsLocalAndUnderCSP(t *testing.T) {
	t.Parallel()
	// Reads need a token here (PublicReads false): the document and its page still do not.
	policy := hs256Policy(t, 0)
	policy.PublicReads = false
	env := newAPIEnvWith(t, apiOptions{http: ports.HTTPConfig{Auth: policy}})
	require.Equal(t, http.StatusUnauthorized, env.do(t, http.MethodGet, "/checkins/latest", "", nil, nil).status)
	r := env.do(t, http.MethodGet, "/docs", "", nil, nil)
	require.Equal(t, http.StatusOK, r.status, "the page needs no token: %s", r.body)
	assert.Equal(t, "text/html; charset=UTF-8", r.header.Get("Content-Type"))
	csp := r.header.Get("Content-Security-Policy")
	assert.Equal(t, ports.DocsCSP, csp)
	assert.Contains(t, csp, "script-src 'self';")
	assert.NotContains(t, csp, "unsafe-eval")
	assert.NotContains(t, strings.SplitN(csp, "style-src", 2)[0], "unsafe-inline", "no inline script")

	// Every file the page loads is one of ours, served here; no inline script.
	html := string(r.body)
	refs := regexp.MustCompile(`(?:src|href)="([^"]*)"`).FindAllStringSubmatch(html, -1)
	require.NotEmpty(t, refs)
	for _, m := range refs {
		ref := m[1]
		require.True(t, strings.HasPrefix(ref, "/docs/assets/"), "the page loads %q, not a local file", ref)
		a := env.do(t, http.MethodGet, ref, "", nil, nil)
		assert.Equal(t, http.StatusOK, a.status, ref)
		assert.NotEmpty(t, a.body, ref)
		assert.Equal(t, "nosniff", a.header.Get("X-Content-Type-Options"))
	}
	for _, m := range regexp.MustCompile(`(?s)<script([^>]*)>(.*?)</script>`).FindAllStringSubmatch(html, -1) {
		assert.Contains(t, m[1], "src=", "inline script: %s", m[0])
		assert.Empty(t, strings.TrimSpace(m[2]), "inline script: %s", m[0])
	}
	for _, p := range []string{"/docs/assets/docs.js", "/docs/assets/swagger-ui-bundle.js"} {
		a := env.do(t, http.MethodGet, p, "", nil, nil)
		assert.Equal(t, "text/javascript; charset=utf-8", a.header.Get("Content-Type"), p)
	}
	js := env.do(t, http.MethodGet, "/docs/assets/docs.js", "", nil, nil)
	assert.Contains(t, string(js.body), `url: "/openapi.json"`)
	assert.Contains(t, string(js.body), `validatorUrl: null`)
	lic := env.do(t, http.MethodGet, "/docs/assets/LICENSE", "", nil, nil)
	assert.Contains(t, string(lic.body), "Apache License")

	nf := env.do(t, http.MethodGet, "/docs/assets/..%2fopenapi.go", "", nil, nil)
	assert.Equal(t, http.StatusNotFound, nf.status)
	nf = env.do(t, http.MethodGet, "/docs/assets/package.json", "", nil, nil)
	assert.Equal(t, http.StatusNotFound, nf.status, "only the files the page needs are served")
}

// The vendored viewer is what npm served: each file's sha256 is in SHA256SUMS (written by
// docs/vendor/update.sh), and the embedded bytes match it.
func TestDocsVendoredFiles(t *testing.T) {
	t.Parallel()
	dir := filepath.Join("docs", "vendor", "swagger-ui-dist")
	f, err := os.Open(filepath.Join(dir, "SHA256SUMS"))
	require.NoError(t, err)
	defer f.Close()
	sums := map[string]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		sum, name, ok := strings.Cut(sc.Text(), "  ")
		require.True(t, ok, "line %q", sc.Text())
		sums[name] = sum
	}
	require.NoError(t, sc.Err())
	for _, need := range []string{"LICENSE", "package.json", "swagger-ui-bundle.js", "swagger-ui.css"} {
		assert.Contains(t, sums, need)
	}
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	for _, e := range entries {
		if e.Name() != "SHA256SUMS" {
			assert.Contains(t, sums, e.Name(), "a vendored file without a checksum")
		}
	}
	for name, sum := range sums {
		b, err := ports.DocsFile("docs/vendor/swagger-ui-dist/" + name)
		require.NoError(t, err, name)
		got := sha256.Sum256(b)
		assert.Equal(t, sum, hex.EncodeToString(got[:]), "%s is not the vendored file", name)
	}
	var pkg struct{ Name, Version, License string }
	b, err := ports.DocsFile("docs/vendor/swagger-ui-dist/package.json")
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(b, &pkg))
	assert.Equal(t, "swagger-ui-dist", pkg.Name)
	assert.Equal(t, "Apache-2.0", pkg.License)
	t.Logf("vendored %s %s", pkg.Name, pkg.Version)
}

// A response that the spec does not describe fails the client's request.
func TestContractValidatorRejectsWhatTheSpecDoesNotDescribe(t *testing.T) {
	t.Parallel()
	v := openapitest.MustNew()
	req, err := http.NewRequest(http.MethodGet, "http://127.0.0.1:1/users/7", nil)
	require.NoError(t, err)
	header := func(kv ...string) http.Header {
		h := http.Header{}
		for i := 0; i < len(kv); i += 2 {
			h.Set(kv[i], kv[i+1])
		}
		return h
	}
	h := header("Content-Type", "application/json", ports.HeaderCorrelationID, "c-1")
	ok := `{"userId":7,"numCheckins":1,"lastCheckin":5,"lastSeenAt":3}`
	require.NoError(t, v.Check(req, http.StatusOK, h, []byte(ok)))
	for name, tc := range map[string]struct {
		status int
		header http.Header
		body   string
	}{
		"an extra field":        {200, h, `{"userId":7,"numCheckins":1,"lastCheckin":5,"lastSeenAt":3,"x":1}`},
		"a missing field":       {200, h, `{"userId":7,"numCheckins":1,"lastCheckin":5}`},
		"a wrong type":          {200, h, `{"userId":"7","numCheckins":1,"lastCheckin":5,"lastSeenAt":3}`},
		"an undocumented 409":   {409, h, `{"error":{"code":"conflict","message":"m"}}`},
		"no correlation header": {200, header("Content-Type", "application/json"), ok},
		"another media type":    {200, header("Content-Type", "text/plain", ports.HeaderCorrelationID, "c"), ok},
		"a bad error body":      {404, h, `{"error":{"code":"not_found"}}`},
	} {
		assert.Error(t, v.Check(req, tc.status, tc.header, []byte(tc.body)), name)
	}
	// Outside the spec's paths: a refusal has the error body (a 2xx there is a route the test
	// added itself; the service's routes are the spec's, TestOpenAPIRoutesAreTheServicesRoutes).
	other, err := http.NewRequest(http.MethodGet, "http://127.0.0.1:1/nope", nil)
	require.NoError(t, err)
	require.NoError(t, v.Check(other, 404, h, []byte(`{"error":{"code":"not_found","message":"Not Found"}}`)))
	assert.Error(t, v.Check(other, 404, h, []byte(`{}`)))
	assert.Error(t, v.Check(other, 500, h, []byte(`oops`)))

	// Through the transport: the client's request fails.
	srv := http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set(ports.HeaderCorrelationID, "c")
		_, _ = io.WriteString(w, `{"userId":7}`)
	})}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	_, err = v.Client(nil).Get("http://" + ln.Addr().String() + "/users/7")
	require.Error(t, err)
	assert.Contains(t, err.Error(), "does not describe")
	assert.Error(t, v.Err(), "the mismatch is kept for TestMain")
}

// TestCheckinRequestNullsAreInTheContract: the API takes an optional field sent as null for
// absent; the contract says so (it refused what the service accepts).
func TestCheckinRequestNullsAreInTheContract(t *testing.T) {
	t.Parallel()
	doc, err := openapitest.Load(context.Background())
	require.NoError(t, err)
	schema := doc.Components.Schemas["CheckinRequest"].Value
	body := `{"checkinId":null,"userId":null,"locationId":3,"starRating":2,"timestamp":null}`
	var v any
	require.NoError(t, json.Unmarshal([]byte(body), &v))
	assert.NoError(t, schema.VisitJSON(v))
	var nullRequired any
	require.NoError(t, json.Unmarshal([]byte(`{"locationId":null,"starRating":2}`), &nullRequired))
	assert.Error(t, schema.VisitJSON(nullRequired), "a required field is never null")

	env := newAPIEnv(t)
	resp := env.post(t, `{"checkinId":null,"userId":4,"locationId":3,"starRating":2,"timestamp":null}`, nil)
	assert.Equal(t, http.StatusAccepted, resp.status, "%s", resp.body)
	resp = env.post(t, `{"userId":4,"locationId":null,"starRating":2}`, nil)
	assert.Equal(t, http.StatusBadRequest, resp.status, "%s", resp.body)
}
