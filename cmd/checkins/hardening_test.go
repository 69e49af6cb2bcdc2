package main

// Hardening of the public listener, tested on the real binary: slow clients, idle keep-alive
// connections and more connections than descriptors, as the issue measured them (300 slow
// bodies and 2,000 idle connections still open after 40 s; ~20,000 held connections exhausting
// descriptors), and TLS.

import (
	"bufio"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/checkins/checkins/adapters/redistest"
)

func (p *svcProc) addr() string {
	return strings.TrimPrefix(strings.TrimPrefix(p.base, "http://"), "https://")
}

func (p *svcProc) running() bool {
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// closedByServer waits until the server closes conn (EOF or reset, after any answer it sends);
// false when conn is still open at the deadline.
func closedByServer(conn net.Conn, deadline time.Time) bool {
	_ = conn.SetReadDeadline(deadline)
	_, err := io.Copy(io.Discard, conn)
	var ne net.Error
	return !(errors.As(err, &ne) && ne.Timeout())
}

// TestHardeningSlowClientsAreDropped: clients sending their headers or their body one byte per
// second are disconnected after HTTP_READ_HEADER_TIMEOUT / HTTP_READ_TIMEOUT (without them they
// hold a connection as long as they like), nothing is written, and the service serves on.
func TestHardeningSlowClientsAreDropped(t *testing.T) {
	t.Parallel()
	p := startSvc(t, "serve", map[string]string{"HTTP_READ_HEADER_TIMEOUT": "1s", "HTTP_READ_TIMEOUT": "2s"})
	const slowBodies, slowHeaders = 300, 50
	const trickle = 60 // bytes each client would send, one a second: a minute, far past the timeouts
	stop := make(chan struct{})
	defer close(stop)
	var closed, open atomic.Int64
	var wg sync.WaitGroup
	for i := range slowBodies + slowHeaders {
		conn, err := net.Dial("tcp", p.addr())
		require.NoError(t, err)
		t.Cleanup(func() { _ = conn.Close() })
		// With a valid token, so the handler gets as far as reading the body.
		head := fmt.Sprintf("POST /checkins HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n{", testToken(1), trickle+1)
		if i >= slowBodies {
			head = "POST /checkins HTTP/1.1\r\nHost: x\r\nX-Slow: "
		}
		_, err = io.WriteString(conn, head)
		require.NoError(t, err)
		go func() {
			for range trickle {
				select {
				case <-stop:
					return
				case <-time.After(time.Second):
				}
				if _, err := conn.Write([]byte("a")); err != nil {
					return
				}
			}
		}()
		wg.Add(1)
		go func() {
			defer wg.Done()
			// Generous: the clients would go on for a minute; the server cuts them off after 1-2 s.
			if closedByServer(conn, time.Now().Add(40*time.Second)) {
				closed.Add(1)
			} else {
				open.Add(1)
			}
		}()
	}
	wg.Wait()
	assert.Equal(t, int64(slowBodies+slowHeaders), closed.Load(), "slow connections closed by the server (%d still open)", open.Load())
	code, body := faultGet(t, p.base+"/checkins/latest")
	assert.Equal(t, http.StatusNotFound, code, "nothing was written by a slow client: %s", body)
	code, _ = faultGet(t, p.base+"/healthz")
	assert.Equal(t, http.StatusOK, code)
}

// TestHardeningIdleKeepAliveConnectionsAreClosed: 2,000 keep-alive connections that made one
// request and then idle are closed by the server after HTTP_IDLE_TIMEOUT. HTTP_READ_TIMEOUT is
// long, so net/http's fallback (idle timeout = read timeout) cannot be what closes them.
func TestHardeningIdleKeepAliveConnectionsAreClosed(t *testing.T) {
	t.Parallel()
	p := startSvc(t, "serve", map[string]string{"HTTP_IDLE_TIMEOUT": "1s", "HTTP_READ_TIMEOUT": "2m",
		"HTTP_READ_HEADER_TIMEOUT": "2m", "HTTP_WRITE_TIMEOUT": "3m"})
	const conns = 2000
	var answered, closed atomic.Int64
	var wg sync.WaitGroup
	dials := make(chan struct{}, 64) // connections being set up at once
	for range conns {
		wg.Add(1)
		dials <- struct{}{}
		go func() {
			defer wg.Done()
			conn, err := net.Dial("tcp", p.addr())
			if err != nil {
				<-dials
				return
			}
			defer conn.Close()
			_, err = io.WriteString(conn, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
			var resp *http.Response
			if err == nil {
				_ = conn.SetReadDeadline(time.Now().Add(30 * time.Second))
				br := bufio.NewReader(conn)
				if resp, err = http.ReadResponse(br, nil); err == nil {
					_, _ = io.Copy(io.Discard, resp.Body)
					_ = resp.Body.Close()
					if resp.StatusCode == http.StatusOK && !resp.Close {
						answered.Add(1)
					}
				}
			}
			<-dials
			if err == nil && closedByServer(conn, time.Now().Add(30*time.Second)) {
				closed.Add(1)
			}
		}()
	}
	wg.Wait()
	if !p.running() {
		t.Logf("the service exited; its output:\n%s", p.logs.String())
	}
	assert.Equal(t, int64(conns), answered.Load(), "keep-alive answers")
	assert.Equal(t, int64(conns), closed.Load(), "idle connections closed by the server")
	assert.True(t, p.running())
}

// TestHardeningMoreConnectionsThanDescriptors: under a descriptor limit of 512, 600 held
// connections would exhaust the process (accept: too many open files, and no descriptor left
// for Redis). With HTTP_MAX_CONNS=100 the connections past the cap wait in the kernel's queue:
// the process keeps its descriptors, a request on an accepted connection is served (Redis
// included), a request on a new connection waits and is served once connections free up.
func TestHardeningMoreConnectionsThanDescriptors(t *testing.T) {
	t.Parallel()
	redis := redistest.Start(t, redistest.Options{})
	p := startSvcLimited(t, 512, "api", map[string]string{"REDIS_URL": redis.URL(), "HTTP_MAX_CONNS": "100", "OPS_ADDR": "localhost:0", // another address than HTTP_ADDR: a listener of its own

		// Held connections send nothing: they must stay held for the length of the test.
		"HTTP_READ_HEADER_TIMEOUT": "2m", "HTTP_READ_TIMEOUT": "2m", "HTTP_WRITE_TIMEOUT": "3m", "HTTP_IDLE_TIMEOUT": "2m"})
	const held = 600
	conns := make([]net.Conn, 0, held)
	closeAll := func() {
		for _, c := range conns {
			_ = c.Close()
		}
		conns = conns[:0]
	}
	t.Cleanup(closeAll)
	for range held {
		c, err := net.Dial("tcp", p.addr())
		require.NoError(t, err)
		conns = append(conns, c)
	}

	// The first connection was accepted (the queue is first in, first out): a check-in on it
	// needs the process's Redis connections, which would find no descriptor without the cap.
	body := `{"userId":1,"locationId":1,"starRating":5}`
	_, err := fmt.Fprintf(conns[0], "POST /checkins HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", testToken(1), len(body), body)
	require.NoError(t, err)
	require.NoError(t, conns[0].SetReadDeadline(time.Now().Add(30*time.Second)))
	resp, err := http.ReadResponse(bufio.NewReader(conns[0]), nil)
	require.NoError(t, err)
	_ = resp.Body.Close()
	assert.Equal(t, http.StatusAccepted, resp.StatusCode)

	// A new client now waits in the queue...
	waiting := make(chan int, 1)
	go func() {
		client := &http.Client{Timeout: time.Minute}
		r, err := client.Get(p.base + "/healthz")
		if err != nil {
			waiting <- 0
			return
		}
		_ = r.Body.Close()
		waiting <- r.StatusCode
	}()
	select {
	case code := <-waiting:
		t.Fatalf("a request past the cap was answered (%d) while %d connections are held", code, held)
	case <-time.After(500 * time.Millisecond):
	}
	assert.True(t, p.running(), "the process survives more connections than descriptors")
	// The ops listener has limits of its own: health, readiness and metrics still answer.
	opsAddr, ok := p.logs.field("ops listening", "addr")
	require.True(t, ok, "an ops listener of its own; stderr:\n%s", p.logs)
	for _, path := range []string{"/healthz", "/readyz"} {
		code, _ := faultGet(t, "http://"+opsAddr+path)
		assert.Equal(t, http.StatusOK, code, "%s on the ops listener while the public one is saturated", path)
	}

	// ...and is served once the held connections close.
	closeAll()
	select {
	case code := <-waiting:
		assert.Equal(t, http.StatusOK, code)
	case <-time.After(time.Minute):
		t.Fatal("the waiting request was not served after the connections closed")
	}
	code, _ := faultGet(t, p.base+"/healthz")
	assert.Equal(t, http.StatusOK, code)
	assert.NotContains(t, p.logs.String(), "too many open files")
}

func TestHardeningMaxConnsAboveTheDescriptorLimitStopsTheStart(t *testing.T) {
	t.Parallel()
	cmd := exec.Command("sh", "-c", `ulimit -n 512 && exec "$0" "$@"`, checkinsBinary(t), "serve")
	cmd.Env = cliEnv(map[string]string{"HTTP_MAX_CONNS": "1000", "HTTP_ADDR": "127.0.0.1:0"})
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	require.ErrorAs(t, err, &ee, "output: %s", out)
	assert.Equal(t, 1, ee.ExitCode())
	assert.Contains(t, string(out), "invalid HTTP_MAX_CONNS")
	assert.Contains(t, string(out), "RLIMIT_NOFILE")
	assert.Contains(t, string(out), "of 512")
	assert.Contains(t, string(out), fmt.Sprintf("at most %d", 512-reservedDescriptors(runtime.GOMAXPROCS(0))))
	assert.NotContains(t, string(out), "http listening")
}

func TestMaxConnsFitsTheDescriptorLimit(t *testing.T) {
	t.Parallel()
	reserve := reservedDescriptors(2)
	for _, tc := range []struct {
		name     string
		setting  int
		limit    uint64
		want     int
		errorHas string
	}{
		{"auto, large limit", 0, 1 << 20, defaultMaxConns, ""},
		{"auto, small limit", 0, 1024, 1024 - reserve, ""},
		{"auto, limit below the reserve", 0, uint64(reserve), 0, "too low"},
		{"explicit that fits", 3000, 4096, 3000, ""},
		{"explicit at the edge", 4096 - reserve, 4096, 4096 - reserve, ""},
		{"explicit above", 4096 - reserve + 1, 4096, 0, fmt.Sprintf("at most %d", 4096-reserve)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := httpConfig{MaxConns: tc.setting}.maxConns(tc.limit, 2)
			if tc.errorHas != "" {
				require.Error(t, err)
				assert.Contains(t, err.Error(), tc.errorHas)
				assert.Contains(t, err.Error(), "RLIMIT_NOFILE")
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.want, got)
		})
	}
}

// writeSelfSigned writes a certificate for 127.0.0.1 and its key; it returns their paths and a
// pool that trusts the certificate.
func writeSelfSigned(t *testing.T) (certFile, keyFile string, pool *x509.CertPool) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "checkins test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	require.NoError(t, err)
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	require.NoError(t, err)
	dir := t.TempDir()
	certFile, keyFile = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	require.NoError(t, os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600))
	require.NoError(t, os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}), 0o600))
	cert, err := x509.ParseCertificate(der)
	require.NoError(t, err)
	pool = x509.NewCertPool()
	pool.AddCert(cert)
	return certFile, keyFile, pool
}

// TestHardeningTLS: with TLS_CERT_FILE and TLS_KEY_FILE the listener speaks HTTPS, TLS 1.2 and
// 1.3, and refuses TLS 1.0 and 1.1. On Go 1.26, GODEBUG=tls10server=1 makes Go's own default
// accept them again, so only the service's explicit minimum refuses them; Go 1.27 removed that
// setting (TLS 1.2 is then the floor of every default) and refuses to start with it.
func TestHardeningTLS(t *testing.T) {
	t.Parallel()
	certFile, keyFile, pool := writeSelfSigned(t)
	env := map[string]string{"TLS_CERT_FILE": certFile, "TLS_KEY_FILE": keyFile}
	if strings.HasPrefix(runtime.Version(), "go1.26") { // the binary is built by this toolchain
		env["GODEBUG"] = "tls10server=1"
	}
	p := startSvc(t, "serve", env)
	assert.Contains(t, p.logs.String(), `"tls":true`)
	base := "https://" + p.addr()

	for _, v := range []uint16{tls.VersionTLS12, tls.VersionTLS13} {
		client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
			TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: v, MaxVersion: v}}}
		resp, err := client.Get(base + "/healthz")
		require.NoError(t, err, "TLS version %s", tls.VersionName(v))
		_ = resp.Body.Close()
		assert.Equal(t, http.StatusOK, resp.StatusCode)
		assert.Equal(t, v, resp.TLS.Version)
		assert.Equal(t, "nosniff", resp.Header.Get("X-Content-Type-Options"))
		// Over HTTPS browsers are told to keep to it (the dashboard's cookie, the tokens).
		assert.Equal(t, "max-age=31536000", resp.Header.Get("Strict-Transport-Security"))
	}

	for _, v := range []uint16{tls.VersionTLS10, tls.VersionTLS11} {
		conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 10 * time.Second}, "tcp", p.addr(),
			&tls.Config{RootCAs: pool, MinVersion: v, MaxVersion: v}) // #nosec G402 -- the old version is the point
		if err == nil {
			_ = conn.Close()
		}
		require.Error(t, err, "a %s client must be refused", tls.VersionName(v))
		assert.Contains(t, err.Error(), "protocol version")
	}

	// Plain HTTP on the HTTPS port gets no API answer.
	resp, err := (&http.Client{Timeout: 10 * time.Second}).Get("http://" + p.addr() + "/healthz")
	require.NoError(t, err)
	_ = resp.Body.Close()
	assert.Equal(t, http.StatusBadRequest, resp.StatusCode)
}

// TestHardeningInvalidSettingsStopTheStart: each bad value stops the process with exit 1 and a
// message naming the variable, before anything listens.
func TestHardeningInvalidSettingsStopTheStart(t *testing.T) {
	t.Parallel()
	certFile, keyFile, _ := writeSelfSigned(t)
	for _, tc := range []struct {
		name string
		env  map[string]string
		want []string
	}{
		{"cert without key", map[string]string{"TLS_CERT_FILE": certFile}, []string{"TLS_CERT_FILE", "without TLS_KEY_FILE"}},
		{"key without cert", map[string]string{"TLS_KEY_FILE": keyFile}, []string{"TLS_KEY_FILE", "without TLS_CERT_FILE"}},
		{"missing cert file", map[string]string{"TLS_CERT_FILE": certFile + ".nope", "TLS_KEY_FILE": keyFile}, []string{"TLS_CERT_FILE", "cert.pem.nope"}},
		{"key of another file", map[string]string{"TLS_CERT_FILE": certFile, "TLS_KEY_FILE": certFile}, []string{"TLS_KEY_FILE"}},
		{"write timeout not above request timeout", map[string]string{"HTTP_WRITE_TIMEOUT": "5s", "REQUEST_TIMEOUT": "5s"}, []string{"HTTP_WRITE_TIMEOUT", "REQUEST_TIMEOUT"}},
		{"read timeout below header timeout", map[string]string{"HTTP_READ_TIMEOUT": "1s", "HTTP_READ_HEADER_TIMEOUT": "2s"}, []string{"HTTP_READ_TIMEOUT", "HTTP_READ_HEADER_TIMEOUT"}},
		{"idle timeout", map[string]string{"HTTP_IDLE_TIMEOUT": "soon"}, []string{"HTTP_IDLE_TIMEOUT", "soon"}},
		{"max conns zero", map[string]string{"HTTP_MAX_CONNS": "0"}, []string{"HTTP_MAX_CONNS", "auto or a number"}},
		{"max conns word", map[string]string{"HTTP_MAX_CONNS": "many"}, []string{"HTTP_MAX_CONNS", "many"}},
		{"max header bytes", map[string]string{"HTTP_MAX_HEADER_BYTES": "10"}, []string{"HTTP_MAX_HEADER_BYTES", "1024"}},
		{"CORS wildcard", map[string]string{"CORS_ALLOWED_ORIGINS": "*"}, []string{"CORS_ALLOWED_ORIGINS", `"*"`}},
		{"CORS path", map[string]string{"CORS_ALLOWED_ORIGINS": "https://a.example.com,https://b.example.com/app"}, []string{"CORS_ALLOWED_ORIGINS", "https://b.example.com/app"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			env := map[string]string{"HTTP_ADDR": "127.0.0.1:0"}
			for k, v := range tc.env {
				env[k] = v
			}
			code, _, stderr := runCLI(t, env, "serve")
			assert.Equal(t, 1, code, "stderr: %s", stderr)
			for _, w := range tc.want {
				assert.Contains(t, stderr, w)
			}
			assert.NotContains(t, stderr, "http listening")
		})
	}
}

// TestHardeningSlowBodyWithTheUserLimitIs408: a body that arrives slower than HTTP_READ_TIMEOUT
// is answered 408 (as the contract says) with the per-user limit on and REQUEST_TIMEOUT below
// the read timeout, as by default: counting the refused request against the user's limit must
// not turn it into a 503 once the request's own deadline has passed.
func TestHardeningSlowBodyWithTheUserLimitIs408(t *testing.T) {
	t.Parallel()
	rdb := redistest.Open(t)
	svc := startInProcess(t, map[string]string{"REDIS_URL": rdb.URL, "KEY_PREFIX": rdb.Prefix,
		"RATE_LIMIT_USER": "10/s,burst=20", "REQUEST_TIMEOUT": "1s", "HTTP_READ_HEADER_TIMEOUT": "1s", "HTTP_READ_TIMEOUT": "2s", "HTTP_WRITE_TIMEOUT": "5s"},
		Mode{API: true})
	conn, err := net.Dial("tcp", strings.TrimPrefix(svc.base, "http://"))
	require.NoError(t, err)
	defer conn.Close()
	body := `{"locationId":1,"starRating":1}`
	_, err = fmt.Fprintf(conn, "POST /checkins HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s",
		testToken(42), len(body), body[:3])
	require.NoError(t, err)
	require.NoError(t, conn.SetReadDeadline(time.Now().Add(30*time.Second)))
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	assert.Equal(t, http.StatusRequestTimeout, resp.StatusCode, "%s", b)
	assert.Contains(t, string(b), "request_timeout")
	assert.NotEmpty(t, resp.Header.Get("RateLimit"), "it still counted against the user's limit")
}
