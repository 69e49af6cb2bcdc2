package ports_test

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/labstack/echo/v4"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/checkins/checkins/ports"
)

// serveForTest serves the API on a real loopback listener: ports.ListenHTTP with limits when
// given (as cmd/ serves it), otherwise httptest's. It returns the base URL.
func serveForTest(t *testing.T, server *ports.HTTPServer, limits *ports.ServerLimits, log *slog.Logger) string {
	t.Helper()
	if limits == nil {
		hs := httptest.NewServer(server.Handler())
		t.Cleanup(hs.Close)
		return hs.URL
	}
	l, err := ports.ListenHTTP("http", "127.0.0.1:0", server.Handler(), *limits, log)
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() { done <- l.Serve() }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		assert.NoError(t, l.Shutdown(ctx))
		assert.NoError(t, <-done, "Serve returns nil after Shutdown")
	})
	return "http://" + l.Addr().String()
}

func TestSecurityHeadersOnEveryAnswer(t *testing.T) {
	t.Parallel()
	e := newAPIEnvWith(t, apiOptions{routes: func(s *ports.HTTPServer) {
		// An HTML answer, as a dashboard would give.
		s.Echo().GET("/test-page", func(c echo.Context) error { return c.HTML(http.StatusOK, "<p>hi</p>") })
	}})
	valid := `{"userId":1,"locationId":1,"starRating":1}`
	for _, tc := range []struct {
		name, method, path, body string
		status                   int
		html                     bool
	}{
		{"202", http.MethodPost, "/checkins", valid, http.StatusAccepted, false},
		{"400", http.MethodPost, "/checkins", `{"userId":`, http.StatusBadRequest, false},
		{"404 unknown route", http.MethodGet, "/nope", "", http.StatusNotFound, false},
		{"404 unknown user", http.MethodGet, "/users/999", "", http.StatusNotFound, false},
		{"405", http.MethodDelete, "/checkins", "", http.StatusMethodNotAllowed, false},
		{"healthz", http.MethodGet, "/healthz", "", http.StatusOK, false},
		{"HTML", http.MethodGet, "/test-page", "", http.StatusOK, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp := e.do(t, tc.method, tc.path, "application/json", strings.NewReader(tc.body), nil)
			require.Equal(t, tc.status, resp.status, "body %s", resp.body)
			assert.Equal(t, "nosniff", resp.header.Get("X-Content-Type-Options"))
			assert.Equal(t, "DENY", resp.header.Get("X-Frame-Options"))
			assert.Empty(t, resp.header.Values("Server"), "no Server header names the stack")
			assert.Empty(t, resp.header.Values("Strict-Transport-Security"), "HSTS only over HTTPS")
			csp := resp.header.Get("Content-Security-Policy")
			assert.Contains(t, csp, "frame-ancestors 'none'")
			assert.Contains(t, csp, "default-src 'none'")
			if tc.html {
				assert.Contains(t, resp.header.Get("Content-Type"), "text/html")
				assert.Contains(t, csp, "script-src 'self'", "an HTML page may run its own scripts only")
				assert.NotContains(t, csp, "unsafe-inline")
			} else {
				assert.NotContains(t, csp, "script-src", "a JSON answer runs nothing")
			}
		})
	}
}

func TestClientIPIgnoresForwardedHeaders(t *testing.T) {
	t.Parallel()
	e := newAPIEnvWith(t, apiOptions{routes: func(s *ports.HTTPServer) {
		s.Echo().GET("/test-ip", func(c echo.Context) error { return c.String(http.StatusOK, c.RealIP()) })
	}})
	resp := e.do(t, http.MethodGet, "/test-ip", "", nil, map[string]string{
		"X-Forwarded-For": "203.0.113.9, 198.51.100.1", "X-Real-IP": "203.0.113.10"})
	require.Equal(t, http.StatusOK, resp.status)
	assert.Equal(t, "127.0.0.1", string(resp.body), "the client's address is the connection's peer")
}

func TestCORS(t *testing.T) {
	t.Parallel()
	const allowed, denied = "https://app.example.com", "https://evil.example.net"
	preflight := func(e *apiEnv, origin string) apiResponse {
		return e.do(t, http.MethodOptions, "/checkins", "", nil, map[string]string{"Origin": origin,
			"Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "content-type,authorization"})
	}
	get := func(e *apiEnv, origin string) apiResponse {
		return e.do(t, http.MethodGet, "/healthz", "", nil, map[string]string{"Origin": origin})
	}
	t.Run("off by default", func(t *testing.T) {
		t.Parallel()
		e := newAPIEnv(t)
		for _, resp := range []apiResponse{get(e, allowed), preflight(e, allowed)} {
			for k := range resp.header {
				assert.False(t, strings.HasPrefix(k, "Access-Control-"), "header %s with CORS off", k)
			}
		}
	})
	t.Run("listed origins", func(t *testing.T) {
		t.Parallel()
		e := newAPIEnvWith(t, apiOptions{cors: []string{allowed, "http://localhost:3000"}})

		resp := get(e, allowed)
		require.Equal(t, http.StatusOK, resp.status)
		assert.Equal(t, allowed, resp.header.Get("Access-Control-Allow-Origin"))
		assert.Contains(t, resp.header.Values("Vary"), "Origin")
		assert.Contains(t, resp.header.Get("Access-Control-Expose-Headers"), "X-Correlation-ID")
		for _, h := range []string{"RateLimit", "RateLimit-Policy", "Retry-After", "Idempotent-Replayed"} {
			assert.Contains(t, strings.Split(resp.header.Get("Access-Control-Expose-Headers"), ","), h, "a page may read %s", h)
		}
		assert.Empty(t, resp.header.Get("Access-Control-Allow-Credentials"))

		resp = get(e, denied)
		require.Equal(t, http.StatusOK, resp.status, "a denied origin is not answered for, the request itself is served")
		assert.Empty(t, resp.header.Get("Access-Control-Allow-Origin"))

		// A pattern-looking origin is not a pattern.
		resp = get(e, "https://app.example.com.evil.example.net")
		assert.Empty(t, resp.header.Get("Access-Control-Allow-Origin"))

		resp = preflight(e, allowed)
		require.Equal(t, http.StatusNoContent, resp.status)
		assert.Equal(t, allowed, resp.header.Get("Access-Control-Allow-Origin"))
		assert.Contains(t, resp.header.Get("Access-Control-Allow-Methods"), "POST")
		assert.Contains(t, resp.header.Get("Access-Control-Allow-Headers"), "Authorization")
		assert.Contains(t, resp.header.Get("Access-Control-Allow-Headers"), "Content-Type")
		assert.Equal(t, "600", resp.header.Get("Access-Control-Max-Age"))

		resp = preflight(e, denied)
		assert.Empty(t, resp.header.Get("Access-Control-Allow-Origin"))
		assert.Empty(t, resp.header.Get("Access-Control-Allow-Methods"))
		assert.Equal(t, int64(0), e.xlen(t), "a preflight writes nothing")
	})
}

func TestParseCORSOrigins(t *testing.T) {
	t.Parallel()
	got, err := ports.ParseCORSOrigins(" https://app.example.com, http://localhost:3000 ,")
	require.NoError(t, err)
	assert.Equal(t, []string{"https://app.example.com", "http://localhost:3000"}, got)
	got, err = ports.ParseCORSOrigins("")
	require.NoError(t, err)
	assert.Empty(t, got)
	for _, bad := range []string{"*", "https://*.example.com", "app.example.com", "https://app.example.com/", "https://app.example.com/x",
		"ftp://app.example.com", "https://user@app.example.com", "https://app.example.com?x=1"} {
		_, err := ports.ParseCORSOrigins(bad)
		assert.Error(t, err, "%q", bad)
		if err != nil {
			assert.Contains(t, err.Error(), bad)
		}
	}
}

// TestMaxHeaderBytes: headers past the limit get 431 and write nothing; headers below it are served.
func TestMaxHeaderBytes(t *testing.T) {
	t.Parallel()
	const limit = 4096
	e := newAPIEnvWith(t, apiOptions{limits: &ports.ServerLimits{ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout: 10 * time.Second, WriteTimeout: 10 * time.Second, IdleTimeout: time.Minute, MaxHeaderBytes: limit}})
	body := `{"userId":1,"locationId":1,"starRating":1}`
	// net/http reads up to MaxHeaderBytes plus 4 KiB of slack before it refuses.
	resp := e.post(t, body, map[string]string{"X-Padding": strings.Repeat("a", 2*limit+4096)})
	assert.Equal(t, http.StatusRequestHeaderFieldsTooLarge, resp.status)
	assert.Equal(t, int64(0), e.xlen(t), "a refused request writes nothing")

	resp = e.post(t, body, map[string]string{"X-Padding": strings.Repeat("a", limit/2)})
	assert.Equal(t, http.StatusAccepted, resp.status, "body %s", resp.body)
	assert.Equal(t, int64(1), e.xlen(t))
}

// TestSlowBodyIsCutOffByReadTimeout: a body trickling in is answered 408 (or the connection
// closed) once ReadTimeout passes, and nothing is written.
func TestSlowBodyIsCutOffByReadTimeout(t *testing.T) {
	t.Parallel()
	e := newAPIEnvWith(t, apiOptions{limits: &ports.ServerLimits{ReadHeaderTimeout: time.Second,
		ReadTimeout: time.Second, WriteTimeout: 10 * time.Second, IdleTimeout: time.Minute, MaxHeaderBytes: 1 << 14}})
	conn, err := net.Dial("tcp", strings.TrimPrefix(e.url, "http://"))
	require.NoError(t, err)
	defer conn.Close()
	body := `{"userId":1,"locationId":1,"starRating":1}`
	_, err = fmt.Fprintf(conn, "POST /checkins HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body[:3])
	require.NoError(t, err)
	stop := make(chan struct{})
	defer close(stop)
	go func() { // the rest, one byte every 300ms: 12 s in all, far past ReadTimeout
		for i := 3; i < len(body); i++ {
			select {
			case <-stop:
				return
			case <-time.After(300 * time.Millisecond):
			}
			if _, err := conn.Write([]byte{body[i]}); err != nil {
				return
			}
		}
	}()
	require.NoError(t, conn.SetReadDeadline(time.Now().Add(8*time.Second)))
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	require.NoError(t, err, "an answer before the body ends")
	defer resp.Body.Close()
	assert.Equal(t, http.StatusRequestTimeout, resp.StatusCode)
	assert.Equal(t, int64(0), e.xlen(t))
}

// TestConnectionCapIsPerListener: a listener saturated at its MaxConns makes new connections
// wait, while another listener of the process (operations, health) answers at once; once a held
// connection closes, the waiting request is served.
func TestConnectionCapIsPerListener(t *testing.T) {
	t.Parallel()
	log := slog.New(slog.DiscardHandler)
	ok := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok")) })
	serve := func(lim ports.ServerLimits) string {
		l, err := ports.ListenHTTP("test", "127.0.0.1:0", ok, lim, log)
		require.NoError(t, err)
		go func() { _ = l.Serve() }()
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			_ = l.Shutdown(ctx)
		})
		return l.Addr().String()
	}
	base := ports.ServerLimits{ReadHeaderTimeout: time.Minute, ReadTimeout: time.Minute, WriteTimeout: time.Minute, IdleTimeout: time.Minute}
	capped := base
	capped.MaxConns = 2
	public, other := serve(capped), serve(base)

	var held []net.Conn
	for range capped.MaxConns {
		c, err := net.Dial("tcp", public)
		require.NoError(t, err)
		held = append(held, c)
	}
	defer func() {
		for _, c := range held {
			_ = c.Close()
		}
	}()
	waiting := make(chan error, 1)
	go func() {
		resp, err := (&http.Client{Timeout: 30 * time.Second}).Get("http://" + public + "/")
		if err == nil {
			_ = resp.Body.Close()
		}
		waiting <- err
	}()

	resp, err := (&http.Client{Timeout: 10 * time.Second}).Get("http://" + other + "/")
	require.NoError(t, err, "the other listener answers while the public one is saturated")
	_ = resp.Body.Close()
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	select {
	case err := <-waiting:
		t.Fatalf("a connection past the cap was served while %d are held (err %v)", capped.MaxConns, err)
	case <-time.After(300 * time.Millisecond): // it waits: nothing to wait for beyond this
	}

	_ = held[0].Close()
	select {
	case err := <-waiting:
		assert.NoError(t, err, "served once a held connection closed")
	case <-time.After(30 * time.Second):
		t.Fatal("the waiting request was not served after a held connection closed")
	}
}

func TestLoadTLS(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	certFile, keyFile := dir+"/cert.pem", dir+"/key.pem"
	hs := httptest.NewTLSServer(http.NotFoundHandler()) // a certificate and key to write out
	hs.Close()
	cert := hs.TLS.Certificates[0]
	require.NoError(t, os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: cert.Certificate[0]}), 0o600))
	keyDER, err := x509.MarshalPKCS8PrivateKey(cert.PrivateKey)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}), 0o600))

	cfg, err := ports.LoadTLS(certFile, keyFile)
	require.NoError(t, err)
	assert.Equal(t, uint16(tls.VersionTLS12), cfg.MinVersion, "TLS 1.2 at least, whatever the toolchain's default")
	require.Len(t, cfg.Certificates, 1)

	_, err = ports.LoadTLS(certFile, certFile)
	assert.Error(t, err, "a certificate is not a key")
	_, err = ports.LoadTLS(dir+"/nope.pem", keyFile)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "nope.pem")
}
