package main

import (
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/golang-jwt/jwt/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/checkins/checkins/adapters/redistest"
	"github.com/checkins/checkins/ports"
)

// TestBrowserLoginWithATokenTooLargeForACookie: the login takes any token up to MaxTokenBytes
// (8 KiB) and keeps it whole in the cookie, but a browser keeps no cookie larger than 4096
// bytes: an identity provider's token of 4-8 KiB (many claims, groups) was accepted, the login
// answered with its redirect, and the browser was back at the login form at once, with no word
// of why (found by a review). Now the login refuses it and says why; the token still works as a
// bearer token.
func TestBrowserLoginWithATokenTooLargeForACookie(t *testing.T) {
	t.Parallel()
	rdb := redistest.Open(t)
	svc := startInProcess(t, map[string]string{"REDIS_URL": rdb.URL, "KEY_PREFIX": rdb.Prefix, "OPS_ADDR": "localhost:0"}, Mode{API: true})
	now := time.Now()
	tok, err := jwt.NewWithClaims(jwt.SigningMethodHS256, jwt.MapClaims{
		"iss": defaultIssuer, "aud": defaultIssuer, "sub": "7", "iat": now.Unix(), "exp": now.Add(time.Hour).Unix(),
		"scope": ports.ScopeOpsRead, "groups": strings.Repeat("g", 4000),
	}).SignedString([]byte(testAuthSecret))
	require.NoError(t, err)
	require.Greater(t, len(tok), 4096)
	require.Less(t, len(tok), ports.MaxTokenBytes)

	// The service takes it: as a bearer token, and at the login.
	resp, body := uiDo(t, uiReq{method: http.MethodGet, url: svc.ops + "/ui/", header: map[string]string{"Authorization": "Bearer " + tok}})
	require.Equal(t, http.StatusOK, resp.StatusCode, body)
	resp, body = uiDo(t, uiReq{method: http.MethodPost, url: svc.ops + "/ui/login", form: url.Values{"token": {tok}}})
	require.Equal(t, http.StatusUnauthorized, resp.StatusCode, body)
	assert.Empty(t, resp.Cookies())

	b := newBrowser(t)
	b.run(chromedp.Navigate(svc.ops+"/ui/login"), chromedp.WaitVisible(chromedp.CSS("#token")),
		chromedp.SetValue(chromedp.CSS("#token"), tok), chromedp.Click(chromedp.CSS("#login-submit")))
	time.Sleep(2 * time.Second)
	where := eval[string](b, `location.pathname + " | " + (document.querySelector("header .who") ? "logged in" : "login form: " + (document.querySelector("#login-error") ? document.querySelector("#login-error").innerText : "no error shown"))`)
	t.Logf("after the login the browser is at %s", where)
	assert.Contains(t, where, "too large for a browser session", "the login says why it cannot keep the token")
}
