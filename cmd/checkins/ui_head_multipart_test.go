package main

import (
	"bytes"
	"io"
	"mime/multipart"
	"net/http"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/checkins/checkins/adapters/redistest"
	"github.com/checkins/checkins/ports"
)

// The ops listener's form cap (limitBody) parsed only application/x-www-form-urlencoded
// itself; a multipart form (what `curl -F` sends) of the same login, over 64 KiB and chunked, is
// cut by MaxBytesReader, PostFormValue hides the error, and the login answers 401 "paste a
// token" for a form that had one: the fault 454c1a5 fixed for the other form encoding.
func TestChunkedMultipartLoginOverTheCapIs413(t *testing.T) {
	t.Parallel()
	rdb := redistest.Open(t)
	svc := startInProcess(t, map[string]string{"REDIS_URL": rdb.URL, "KEY_PREFIX": rdb.Prefix, "OPS_ADDR": "localhost:0"}, Mode{API: true})
	send := func(pad int) (int, string) {
		var buf bytes.Buffer
		mw := multipart.NewWriter(&buf)
		require.NoError(t, mw.WriteField("token", string(testToken(1, ports.ScopeOps))))
		require.NoError(t, mw.WriteField("pad", strings.Repeat("a", pad)))
		require.NoError(t, mw.Close())
		pr, pw := io.Pipe()
		go func() { _, _ = pw.Write(buf.Bytes()); _ = pw.Close() }()
		req, err := http.NewRequest(http.MethodPost, svc.ops+"/ui/login", pr) // no length: chunked
		require.NoError(t, err)
		req.Header.Set("Content-Type", mw.FormDataContentType())
		resp, err := uiClient.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	status, _ := send(10)
	require.Less(t, status, 400, "a small multipart login form with a valid token is accepted")
	status, body := send(80 << 10)
	assert.Equal(t, http.StatusRequestEntityTooLarge, status, "an 80 KiB chunked multipart login body; the answer says: %q",
		regexp.MustCompile(`id="login-error">([^<]*)<`).FindStringSubmatch(body))
}

// README: "Every GET route, the ops ones too, answers HEAD with the GET's status and headers and
// no body". The dashboard's GET routes on the ops listener (added with e.GET, not through
// partRouter) answered HEAD 405. Its event stream, which never ends, has no HEAD.
func TestHeadOnDashboardRoutes(t *testing.T) {
	t.Parallel()
	rdb := redistest.Open(t)
	svc := startInProcess(t, map[string]string{"REDIS_URL": rdb.URL, "KEY_PREFIX": rdb.Prefix, "OPS_ADDR": "localhost:0"}, Mode{API: true})
	for _, path := range []string{"/ui/login", "/ui/", "/ui", "/ui/static/app.js", "/ui/poison", "/ui/projections", "/ui/explore"} {
		get, err := http.NewRequest(http.MethodGet, svc.ops+path, nil)
		require.NoError(t, err)
		gr, err := uiClient.Do(get)
		require.NoError(t, err)
		_ = gr.Body.Close()
		head, err := http.NewRequest(http.MethodHead, svc.ops+path, nil)
		require.NoError(t, err)
		hr, err := uiClient.Do(head)
		require.NoError(t, err)
		_ = hr.Body.Close()
		assert.Equal(t, gr.StatusCode, hr.StatusCode, "HEAD %s answers as GET %s (%d)", path, path, gr.StatusCode)
	}
}
