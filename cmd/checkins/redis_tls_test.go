package main

import (
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/checkins/checkins/adapters/redistest"
)

// TestServeOnTLSRedis: serve runs on a Redis that speaks TLS only and requires client
// certificates, one server or a cluster (its bus and replication over TLS too), given the CA and
// the client certificate in REDIS_TLS_*: check-ins are taken and projected, INGEST_MIN_REPLICAS's
// WAIT is answered over TLS on the cluster, and the operations verbs (status) connect the same way.
func TestServeOnTLSRedis(t *testing.T) {
	t.Parallel()
	files := redistest.NewTLS(t)
	tlsEnv := map[string]string{"REDIS_TLS_CA_FILE": files.CACert, "REDIS_TLS_CERT_FILE": files.ClientCert, "REDIS_TLS_KEY_FILE": files.ClientKey}
	for _, tc := range []struct {
		name string
		url  func(t *testing.T) string
		env  map[string]string
	}{
		{"one server", func(t *testing.T) string { return redistest.Start(t, redistest.Options{TLS: files}).URL() }, nil},
		{"cluster", func(t *testing.T) string {
			cl := redistest.StartCluster(t, redistest.ClusterOptions{Replicas: 1, TLS: files})
			return "rediss://" + cl.Addrs()[0] // one seed: auto mode asks it over TLS
		}, map[string]string{"INGEST_MIN_REPLICAS": "1"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			env := map[string]string{"REDIS_URL": tc.url(t), "KEY_PREFIX": "tls"}
			for k, v := range tlsEnv {
				env[k] = v
			}
			for k, v := range tc.env {
				env[k] = v
			}
			p := startSvc(t, "serve", env)
			for i := range 20 {
				status, body, err := testPostCheckin(p.base, fmt.Sprintf(`{"userId": %d, "locationId": 7, "starRating": 4}`, 1+i%4), nil)
				require.NoError(t, err)
				require.Equal(t, http.StatusAccepted, status, "%v", body)
			}
			require.Eventually(t, func() bool {
				for u := 1; u <= 4; u++ {
					status, stats, err := testGetStats(p.base, fmt.Sprintf("/users/%d", u))
					if err != nil || status != http.StatusOK || stats["numCheckins"] != 5 {
						return false
					}
				}
				status, stats, err := testGetStats(p.base, "/locations/7")
				return err == nil && status == http.StatusOK && stats["numCheckins"] == 20
			}, 30*time.Second, 50*time.Millisecond, "projected over TLS; logs:\n%s", p.logs)
			code, stdout, stderr := runCLI(t, env, "status")
			require.Equal(t, 0, code, "stderr: %s", stderr)
			assert.Contains(t, stdout, "20 entries")
			assert.Contains(t, stdout, "users.v1")
		})
	}
}

// TestRedisTLSSettingsStopTheStart: REDIS_TLS_* that cannot work stop the start with a message
// naming the setting, before anything listens: TLS files for a plain redis:// URL (or for serve's
// embedded Redis), a client certificate without its key, a CA file that is missing or holds no
// certificate. A CA that did not sign the server's certificate is named in the error too.
func TestRedisTLSSettingsStopTheStart(t *testing.T) {
	t.Parallel()
	files := redistest.NewTLS(t)
	notPEM := filepath.Join(t.TempDir(), "ca.txt")
	require.NoError(t, os.WriteFile(notPEM, []byte("not a certificate\n"), 0o600))
	for _, tc := range []struct {
		name string
		env  map[string]string
		want []string
	}{
		{"TLS files with redis://", map[string]string{"REDIS_URL": "redis://127.0.0.1:1/0", "REDIS_TLS_CA_FILE": files.CACert}, []string{"REDIS_TLS_", "plain TCP", "rediss://"}},
		{"TLS files with the embedded Redis", map[string]string{"REDIS_TLS_CA_FILE": files.CACert}, []string{"REDIS_TLS_", "REDIS_URL is not set"}},
		{"cert without key", map[string]string{"REDIS_URL": "rediss://127.0.0.1:1/0", "REDIS_TLS_CERT_FILE": files.ClientCert}, []string{"REDIS_TLS_CERT_FILE", "without REDIS_TLS_KEY_FILE"}},
		{"key without cert", map[string]string{"REDIS_URL": "rediss://127.0.0.1:1/0", "REDIS_TLS_KEY_FILE": files.ClientKey}, []string{"REDIS_TLS_KEY_FILE", "without REDIS_TLS_CERT_FILE"}},
		{"missing CA file", map[string]string{"REDIS_URL": "rediss://127.0.0.1:1/0", "REDIS_TLS_CA_FILE": files.CACert + ".nope"}, []string{"REDIS_TLS_CA_FILE", "ca.crt.nope"}},
		{"CA file without a certificate", map[string]string{"REDIS_URL": "rediss://127.0.0.1:1/0", "REDIS_TLS_CA_FILE": notPEM}, []string{"REDIS_TLS_CA_FILE", "no PEM certificate"}},
		{"key of another pair", map[string]string{"REDIS_URL": "rediss://127.0.0.1:1/0", "REDIS_TLS_CERT_FILE": files.ClientCert, "REDIS_TLS_KEY_FILE": files.ServerKey}, []string{"REDIS_TLS_CERT_FILE/REDIS_TLS_KEY_FILE"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			code, _, stderr := runCLI(t, tc.env, "serve")
			assert.Equal(t, 1, code, "stderr: %s", stderr)
			for _, w := range tc.want {
				assert.Contains(t, stderr, w)
			}
			assert.NotContains(t, stderr, "http listening")
		})
	}
	t.Run("a CA that did not sign the server's certificate", func(t *testing.T) {
		t.Parallel()
		srv := redistest.Start(t, redistest.Options{TLS: files})
		other := redistest.NewTLS(t)
		code, _, stderr := runCLI(t, map[string]string{"REDIS_URL": srv.URL(), "REDIS_TLS_CA_FILE": other.CACert,
			"REDIS_TLS_CERT_FILE": other.ClientCert, "REDIS_TLS_KEY_FILE": other.ClientKey}, "status")
		assert.NotEqual(t, 0, code)
		assert.Contains(t, stderr, "certificate signed by unknown authority", "the reason is named")
	})
}
