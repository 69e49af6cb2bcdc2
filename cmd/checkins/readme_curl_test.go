package main

import (
	"bufio"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// readmeShellLines are the commands of the README's sh blocks, continuation lines joined.
func readmeShellLines(t *testing.T) []string {
	t.Helper()
	readme, err := os.ReadFile("../../README.md")
	require.NoError(t, err)
	var out []string
	in, cont := false, ""
	for _, line := range strings.Split(string(readme), "\n") {
		switch {
		case strings.HasPrefix(line, "```sh"):
			in = true
			continue
		case strings.HasPrefix(line, "```"):
			in = false
			continue
		case !in:
			continue
		}
		if strings.HasSuffix(line, "\\") {
			cont += strings.TrimSuffix(line, "\\")
			continue
		}
		out = append(out, cont+line)
		cont = ""
	}
	return out
}

// TestReadmeCurlExamplesWorkInDevMode runs every curl example of the README, as written, against
// the quick start (`checkins serve` with nothing configured: dev mode, embedded Redis), with the
// tokens the README's own commands mint. Only the ports are changed to the test's. None may be
// refused for want of a token or scope, or miss its route; the check-in is accepted.
func TestReadmeCurlExamplesWorkInDevMode(t *testing.T) {
	t.Parallel()
	if _, err := exec.LookPath("curl"); err != nil {
		t.Skip("no curl on PATH")
	}
	state := t.TempDir()
	env := map[string]string{"HTTP_ADDR": "127.0.0.1:0", "OPS_ADDR": "localhost:0", "LOG_LEVEL": "info", "STATE_DIR": state}
	cmd := exec.Command(checkinsBinary(t), "serve")
	cmd.Env = cliEnv(env)
	stderr, err := cmd.StderrPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	var logs cliLogLines
	exited := make(chan struct{})
	go func() {
		logs.scan(bufio.NewScanner(stderr))
		_ = cmd.Wait()
		close(exited)
	}()
	t.Cleanup(func() { _ = cmd.Process.Kill(); <-exited })
	var api, ops string
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		m, ok := logs.find("http listening")
		if assert.True(c, ok) {
			api, _ = m["addr"].(string)
			ops, _ = m["ops_addr"].(string)
		}
	}, 30*time.Second, 50*time.Millisecond, "%s", &logs)

	// The README's `go run ./cmd/checkins` is this binary, with the test's STATE_DIR.
	run := "STATE_DIR=" + state + " " + checkinsBinary(t)
	var script strings.Builder
	script.WriteString("set -u\n")
	n := 0
	comment := regexp.MustCompile(`\s+# .*$`) // comments start with " # " in the README
	for _, line := range readmeShellLines(t) {
		line = strings.ReplaceAll(line, "go run ./cmd/checkins", run)
		line = strings.ReplaceAll(line, "localhost:8080", api)
		line = strings.ReplaceAll(line, "localhost:8081", ops)
		switch {
		case strings.HasPrefix(line, "TOKEN=$("), strings.HasPrefix(line, "OPS_TOKEN=$("):
			script.WriteString(comment.ReplaceAllString(line, "") + "\n")
		case strings.HasPrefix(line, "curl "):
			line = strings.TrimSuffix(comment.ReplaceAllString(line, ""), " | jq")
			script.WriteString("printf '%s\\n' \"$(" + line + " -s -o /dev/null -w '%{http_code} %{url_effective}')\"\n")
			n++
		}
	}
	require.GreaterOrEqual(t, n, 20, "the README's curl examples")
	out, err := exec.Command("bash", "-c", script.String()).CombinedOutput()
	require.NoError(t, err, "%s\nscript:\n%s", out, script.String())
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	require.Len(t, lines, n, "%s", out)
	for _, l := range lines {
		code, url, _ := strings.Cut(l, " ")
		assert.NotContains(t, []string{"000", "401", "403", "405"}, code, "curl %s answered %s", url, code)
		if url == "http://"+api+"/checkins" {
			assert.Equal(t, "202", code, "the README's check-in")
		}
	}
	t.Logf("README curl examples:\n%s", out)
}
