package main

import (
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestDevModeCurlLinesOverTLS: the README promises dev mode prints "curl lines that work
// as printed". With TLS_CERT_FILE/TLS_KEY_FILE the listeners speak HTTPS only, yet the printed
// lines name http:// URLs: even given the CA, they get 400 "Client sent an HTTP request to an
// HTTPS server" instead of the 202 and 200 they promise.
func TestDevModeCurlLinesOverTLS(t *testing.T) {
	t.Parallel()
	if _, err := exec.LookPath("curl"); err != nil {
		t.Skip("no curl")
	}
	certFile, keyFile, _ := writeSelfSigned(t)
	logs := startBinary(t, map[string]string{"HTTP_ADDR": "127.0.0.1:0", "OPS_ADDR": "127.0.0.1:0", "STATE_DIR": t.TempDir(),
		"TLS_CERT_FILE": certFile, "TLS_KEY_FILE": keyFile}, "serve")
	var dev map[string]any
	require.Eventually(t, func() bool {
		var ok bool
		dev, ok = logs.find("dev mode: ready-made tokens")
		_, listening := logs.find("http listening")
		return ok && listening
	}, 30*time.Second, 20*time.Millisecond, "stderr:\n%s", logs)
	time.Sleep(500 * time.Millisecond)

	curl, _ := dev["curl"].(string)
	opsCurl, _ := dev["ops_curl"].(string)
	t.Logf("printed: %s\nprinted: %s", curl, opsCurl)
	assert.Contains(t, curl, "https://", "the check-in line names the HTTPS listener")
	assert.Contains(t, opsCurl, "https://", "the ops line names the HTTPS listener")
	run := func(line string) string {
		out, _ := exec.Command("bash", "-c", line+" -s -o /dev/null -w '%{http_code}'").CombinedOutput()
		return strings.TrimSpace(string(out))
	}
	assert.Equal(t, "202", run(curl), "the printed check-in curl line works as printed")
	assert.Equal(t, "200", run(strings.Replace(opsCurl, "curl -s", "curl", 1)), "the printed ops curl line works as printed")
}
