package main

// The dashboard: the ops listener's body cap on its forms.

import (
	"io"
	"net/http"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/checkins/checkins/adapters/redistest"
)

// TestChunkedLoginBodyOverTheCapIs413: the README says "A body on the ops listener is
// capped at 64 KiB (413 body_too_large)". A body declared larger is; one sent chunked (no
// Content-Length) is cut by MaxBytesReader, the form parse fails silently (PostFormValue gives
// ""), and the login answers 401 "paste a token" as if nothing had been sent.
func TestChunkedLoginBodyOverTheCapIs413(t *testing.T) {
	t.Parallel()
	rdb := redistest.Open(t)
	svc := startInProcess(t, map[string]string{"REDIS_URL": rdb.URL, "KEY_PREFIX": rdb.Prefix, "OPS_ADDR": "localhost:0"}, Mode{API: true})
	body := "token=" + strings.Repeat("a", 80<<10)
	pr, pw := io.Pipe()
	go func() { _, _ = io.WriteString(pw, body); _ = pw.Close() }()
	req, err := http.NewRequest(http.MethodPost, svc.ops+"/ui/login", pr) // no length: chunked
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	resp, err := uiClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	t.Logf("%d %s: %.200s", resp.StatusCode, resp.Header.Get("Content-Type"), b)
	assert.Equal(t, http.StatusRequestEntityTooLarge, resp.StatusCode, "an 80 KiB chunked login body; the answer says: %s",
		regexp.MustCompile(`id="login-error">([^<]*)<`).FindStringSubmatch(string(b)))
}
