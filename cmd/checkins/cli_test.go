package main

// CLI tests run the real binary, built once for the package in TestMain. Other tests of this
// package that need the binary should call checkinsBinary(t) rather than declare their own
// TestMain (a package has only one).

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/checkins/checkins/adapters/redistest"
)

// builtBinary is the path of the checkins binary TestMain built ("" if the build failed).
var builtBinary string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "checkins-cli-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "cli_test: temp dir:", err)
		os.Exit(1)
	}
	bin := filepath.Join(dir, "checkins")
	testStateDir = filepath.Join(dir, "state")
	// Built from this directory: the package under test is ".".
	cmd := exec.Command("go", "build", "-o", bin, ".")
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "cli_test: go build of the checkins binary failed:", err)
	} else {
		builtBinary = bin
	}
	code := m.Run()
	redistest.CloseClusters()
	if err := contract.Err(); err != nil { // also the mismatches a test's retry loop swallowed
		fmt.Fprintln(os.Stderr, "FAIL: responses that openapi.yml does not describe:", err)
		code = 1
	}
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

// checkinsBinary is the path of the real binary built by TestMain.
func checkinsBinary(t *testing.T) string {
	t.Helper()
	if builtBinary == "" {
		t.Fatal("the checkins binary could not be built (see the go build output above)")
	}
	return builtBinary
}

// cliEnv is the test process's environment without any of the service's settings (a REDIS_URL
// exported for the test run must not leak into the binary), plus extra.
func cliEnv(extra map[string]string) []string {
	ours := map[string]bool{}
	for _, s := range settings() {
		ours[s.env] = true
	}
	var env []string
	for _, kv := range os.Environ() {
		if k, _, _ := strings.Cut(kv, "="); !ours[k] {
			env = append(env, kv)
		}
	}
	if _, ok := extra["STATE_DIR"]; !ok {
		env = append(env, "STATE_DIR="+testStateDir)
	}
	for k, v := range extra {
		env = append(env, k+"="+v)
	}
	return env
}

// runCLI runs the binary to completion; it returns the exit code, stdout and stderr.
func runCLI(t *testing.T, env map[string]string, args ...string) (int, string, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, checkinsBinary(t), args...)
	cmd.Env = cliEnv(env)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	require.NoError(t, ctx.Err(), "checkins %v did not finish within a minute; stderr:\n%s", args, stderr.String())
	code := 0
	if err != nil {
		exitErr, ok := err.(*exec.ExitError)
		require.True(t, ok, "checkins %v: %v", args, err)
		code = exitErr.ExitCode()
	}
	return code, stdout.String(), stderr.String()
}

func TestCLIHelp(t *testing.T) {
	t.Parallel()
	t.Run("top level", func(t *testing.T) {
		t.Parallel()
		for _, arg := range []string{"--help", "-h", "help"} {
			code, stdout, stderr := runCLI(t, nil, arg)
			assert.Equal(t, 0, code, "checkins %s; stderr: %s", arg, stderr)
			for _, sub := range []string{"serve", "api", "project"} {
				assert.Regexp(t, `checkins \[?`+sub+`\b`, stdout, "checkins %s lists the %s command", arg, sub)
			}
		}
	})
	for _, sub := range []string{"serve", "api", "project"} {
		t.Run(sub, func(t *testing.T) {
			t.Parallel()
			code, stdout, stderr := runCLI(t, nil, sub, "--help")
			require.Equal(t, 0, code, "checkins %s --help; stderr: %s", sub, stderr)
			out := stdout + stderr
			for _, s := range settings() {
				assert.Contains(t, out, "-"+s.flag, "checkins %s --help lists --%s", sub, s.flag)
				assert.Contains(t, out, "env "+s.env, "checkins %s --help names the variable %s", sub, s.env)
			}
		})
	}
}

// TestCLIInvalidConfigFailsAtStart: a bad setting stops the process at once with exit 1 and a
// message naming the variable, before anything is started.
func TestCLIInvalidConfigFailsAtStart(t *testing.T) {
	t.Parallel()
	// Nothing listens on port 1: a command that got past its configuration would not hang on it.
	const unreachable = "redis://127.0.0.1:1/0"
	for _, tc := range []struct {
		name string
		args []string
		env  map[string]string
		want []string // all in stderr
	}{
		{"REDIS_URL not redis", []string{"serve"}, map[string]string{"REDIS_URL": "http://x"}, []string{"REDIS_URL", "redis://"}},
		{"REDIS_URL bad db", []string{"api"}, map[string]string{"REDIS_URL": "redis://localhost:6379/zero"}, []string{"REDIS_URL", "database"}},
		{"LOG_LEVEL", []string{"serve"}, map[string]string{"LOG_LEVEL": "loud"}, []string{"LOG_LEVEL", "loud"}},
		{"HTTP_ADDR", []string{"api"}, map[string]string{"HTTP_ADDR": "nope", "REDIS_URL": unreachable}, []string{"HTTP_ADDR", "nope"}},
		{"REDIS_MODE", []string{"serve"}, map[string]string{"REDIS_MODE": "sentinel", "REDIS_URL": unreachable}, []string{"REDIS_MODE", "auto, standalone or cluster", "sentinel"}},
		{"REDIS_MODE standalone with seeds", []string{"api"}, map[string]string{"REDIS_MODE": "standalone", "REDIS_URL": "redis://127.0.0.1:1?addr=127.0.0.1:2"}, []string{"REDIS_URL", "only a cluster takes"}},
		{"REDIS_URL cluster with a database", []string{"status"}, map[string]string{"REDIS_URL": "redis://127.0.0.1:1/3?addr=127.0.0.1:2"}, []string{"REDIS_URL", "database 0 only"}},
		{"PROJECTIONS", []string{"project"}, map[string]string{"PROJECTIONS": "nope", "REDIS_URL": unreachable}, []string{"PROJECTIONS", "nope"}},
		{"RETRY_MAX_ATTEMPTS", []string{"project"}, map[string]string{"RETRY_MAX_ATTEMPTS": "0", "REDIS_URL": unreachable}, []string{"RETRY_MAX_ATTEMPTS", "at least 1"}},
		{"BATCH_SIZE", []string{"project"}, map[string]string{"BATCH_SIZE": "lots", "REDIS_URL": unreachable}, []string{"BATCH_SIZE", "lots"}},
		{"flag names its variable", []string{"serve", "--log-level", "loud"}, nil, []string{"--log-level", "LOG_LEVEL"}},
		{"api needs REDIS_URL", []string{"api"}, nil, []string{"REDIS_URL"}},
		{"project needs REDIS_URL", []string{"project"}, nil, []string{"REDIS_URL"}},
		{"stray argument", []string{"serve", "extra"}, nil, []string{"extra"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			code, _, stderr := runCLI(t, tc.env, tc.args...)
			assert.Equal(t, 1, code, "stderr: %s", stderr)
			for _, w := range tc.want {
				assert.Contains(t, stderr, w)
			}
		})
	}
	t.Run("unknown command", func(t *testing.T) {
		t.Parallel()
		code, _, stderr := runCLI(t, nil, "frobnicate")
		assert.Equal(t, 2, code)
		assert.Contains(t, stderr, `unknown command "frobnicate"`)
	})
}

// cliLogLines collects a process's JSON log lines as they arrive.
type cliLogLines struct {
	mu    sync.Mutex
	lines []map[string]any
	raw   strings.Builder
}

func (l *cliLogLines) scan(sc *bufio.Scanner) {
	for sc.Scan() {
		line := sc.Text()
		var m map[string]any
		_ = json.Unmarshal([]byte(line), &m)
		l.mu.Lock()
		l.raw.WriteString(line + "\n")
		if m != nil {
			l.lines = append(l.lines, m)
		}
		l.mu.Unlock()
	}
}

// find returns the first line whose msg contains msg.
func (l *cliLogLines) find(msg string) (map[string]any, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, m := range l.lines {
		if s, _ := m["msg"].(string); strings.Contains(s, msg) {
			return m, true
		}
	}
	return nil, false
}

// apiBase waits for a service's "http listening" log and returns its base URL.
func apiBase(t *testing.T, logs *cliLogLines) string {
	t.Helper()
	var base string
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		m, ok := logs.find("http listening")
		if assert.True(c, ok, "no 'http listening' log yet") {
			addr, _ := m["addr"].(string)
			if assert.NotEmpty(c, addr, "addr of %v", m) {
				base = "http://" + addr
			}
		}
	}, 30*time.Second, 20*time.Millisecond, "stderr so far:\n%s", logs)
	return base
}

func (l *cliLogLines) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.raw.String()
}

// TestCLIServeEmbeddedRedis: `checkins serve` with nothing configured (the quick start) runs on
// the embedded Redis, says so loudly, runs in dev mode (a key made in STATE_DIR, a user token, an
// ops token and curl lines printed that work as printed), accepts a check-in with a token from
// `checkins token`, projects it, stays ready while idle, and exits 0 on SIGTERM.
func TestCLIServeEmbeddedRedis(t *testing.T) {
	t.Parallel()
	cmd := exec.Command(checkinsBinary(t), "serve")
	state := t.TempDir()
	// A short STALL_AFTER: an idle service must stay ready on the embedded Redis too.
	env := map[string]string{"HTTP_ADDR": "127.0.0.1:0", "OPS_ADDR": "localhost:0", "LOG_LEVEL": "info", "STALL_AFTER": "200ms", "STATE_DIR": state,
		"RETENTION": "1", "RETENTION_INTERVAL": "100ms"}
	cmd.Env = cliEnv(env)
	stderr, err := cmd.StderrPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	exited := make(chan error, 1)
	var logs cliLogLines
	go func() {
		logs.scan(bufio.NewScanner(stderr))
		exited <- cmd.Wait()
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
	})

	base := apiBase(t, &logs)

	warn, ok := logs.find("EMBEDDED IN-MEMORY Redis")
	require.True(t, ok, "the embedded-Redis warning is logged; stderr:\n%s", &logs)
	assert.Equal(t, "WARN", warn["level"])

	dev, ok := logs.find("dev mode: ready-made tokens")
	require.True(t, ok, "dev mode logs its tokens; stderr:\n%s", &logs)
	for _, k := range []string{"user_token", "ops_token", "curl", "ops_curl"} {
		require.NotEmpty(t, dev[k], "dev mode log field %s", k)
	}
	assert.FileExists(t, filepath.Join(state, devKeyFile), "the dev key is kept in STATE_DIR")
	assert.Contains(t, logs.String(), "checkins dev mode: tokens signed with the dev key", "and prints them plainly for a person")
	if _, err := exec.LookPath("curl"); err == nil {
		out, err := exec.Command("bash", "-c", dev["curl"].(string)+" -s -o /dev/null -w '%{http_code}'").CombinedOutput()
		require.NoError(t, err, "%s", out)
		assert.Equal(t, "202", string(out), "the printed check-in curl line works as printed")
		out, err = exec.Command("bash", "-c", dev["ops_curl"].(string)+" -o /dev/null -w '%{http_code}'").CombinedOutput()
		require.NoError(t, err, "%s", out)
		assert.Equal(t, "200", string(out), "the printed ops curl line works as printed")
	} else {
		t.Log("no curl on PATH: the printed curl lines were not run")
	}
	code, tok, stderrOut := runCLI(t, env, "token", "--user", "7")
	require.Equal(t, 0, code, stderrOut)
	auth := map[string]string{"Authorization": "Bearer " + strings.TrimSpace(tok)}
	status, _, err := testPostCheckin(base, `{"userId":7,"locationId":9,"starRating":5}`, map[string]string{"Authorization": "Bearer " + dev["user_token"].(string)})
	require.NoError(t, err)
	require.Equal(t, http.StatusForbidden, status, "the dev user token is user 42's, not user 7's")

	status, body, err := testPostCheckin(base, `{"userId":7,"locationId":9,"starRating":5,"timestamp":1700000000000}`, auth)
	require.NoError(t, err)
	require.Equal(t, http.StatusAccepted, status, "%v; stderr:\n%s", body, &logs)
	require.NotEmpty(t, body["checkinId"])

	require.EventuallyWithT(t, func(c *assert.CollectT) {
		status, got, err := testGetStats(base, "/users/7")
		if assert.NoError(c, err) && assert.Equal(c, http.StatusOK, status) {
			assert.Equal(c, map[string]int64{"userId": 7, "numCheckins": 1, "lastCheckin": 1700000000000, "lastSeenAt": 9}, got)
		}
		status, got, err = testGetStats(base, "/locations/9")
		if assert.NoError(c, err) && assert.Equal(c, http.StatusOK, status) {
			assert.Equal(c, map[string]int64{"locationId": 9, "numCheckins": 1, "numStars": 5, "averageStars": 5}, got)
		}
	}, 30*time.Second, 100*time.Millisecond, "stderr so far:\n%s", &logs)

	// A first start of every projection on an empty stream needs no backfill (miniredis names a
	// group that delivered nothing "0", where Redis says "0-0"): the live group alone feeds them,
	// and with RETENTION=1 the stream is trimmed to its last entry once that is projected.
	assert.NotContains(t, logs.String(), `"backfill":"running"`, "every projection joined the live group with nothing to backfill")
	opsURL := regexp.MustCompile(`http://\S+/ops/status`).FindString(dev["ops_curl"].(string))
	require.NotEmpty(t, opsURL, dev["ops_curl"])
	status, _, err = testPostCheckin(base, `{"userId":7,"locationId":9,"starRating":4,"timestamp":1700000000001}`, auth)
	require.NoError(t, err)
	require.Equal(t, http.StatusAccepted, status)
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		req, err := http.NewRequest(http.MethodGet, opsURL, nil)
		require.NoError(t, err)
		req.Header.Set("Authorization", "Bearer "+dev["ops_token"].(string))
		resp, err := testHTTPClient.Do(req)
		if !assert.NoError(c, err) {
			return
		}
		defer resp.Body.Close()
		var st struct {
			StreamLength int64 `json:"streamLength"`
			Projections  []struct {
				Group       string `json:"group"`
				GroupExists bool   `json:"groupExists"`
			} `json:"projections"`
		}
		if !assert.NoError(c, json.NewDecoder(resp.Body).Decode(&st)) {
			return
		}
		var groups []string
		for _, p := range st.Projections {
			if p.GroupExists {
				groups = append(groups, p.Group)
			}
		}
		assert.Equal(c, []string{"live"}, groups, "no backfill group on a first start")
		assert.EqualValues(c, 1, st.StreamLength, "RETENTION=1 trims the stream")
	}, 30*time.Second, 100*time.Millisecond, "stderr so far:\n%s", &logs)

	// miniredis reports a group's lag as the stream's length; the service must not take that for
	// a stalled projection once everything is delivered.
	require.Never(t, func() bool {
		resp, err := testHTTPClient.Get(base + "/readyz")
		if err != nil {
			return true
		}
		_ = resp.Body.Close()
		return resp.StatusCode != http.StatusOK
	}, 1500*time.Millisecond, 100*time.Millisecond, "/readyz must stay 200 while idle and caught up")
	// miniredis names a group that has delivered nothing "0", not "0-0": no warning for that.
	_, warned := logs.find("cannot record the projections' progress, will retry")
	assert.False(t, warned, "a fresh start records its progress without a warning; stderr:\n%s", &logs)

	require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
	select {
	case err := <-exited:
		exited <- err // for the cleanup
		require.NoError(t, err, "exit 0 on SIGTERM; stderr:\n%s", &logs)
	case <-time.After(time.Minute):
		t.Fatalf("no exit within a minute of SIGTERM; stderr:\n%s", &logs)
	}
	_, ok = logs.find("stopped")
	assert.True(t, ok, "logs that it stopped")
}
