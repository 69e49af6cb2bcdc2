package main

// Fault-injection tests: the real binary (built by TestMain in cli_test.go), real redis-server
// processes, real signals. Each test breaks the running system one way and then compares every
// projection with an independent count of the check-ins that got a 2xx.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/checkins/checkins/adapters"
	"github.com/checkins/checkins/adapters/redistest"
	"github.com/checkins/checkins/app/ops"
	"github.com/checkins/checkins/domain"
)

// Fault tests use few users and locations so that every read model is checked.
const (
	faultUsers     = 20
	faultLocations = 10
)

// faultLogs keeps a process's stderr (JSON log lines).
type faultLogs struct {
	mu  sync.Mutex
	buf strings.Builder
}

func (l *faultLogs) scan(r io.Reader) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		l.mu.Lock()
		l.buf.WriteString(sc.Text() + "\n")
		l.mu.Unlock()
	}
}

func (l *faultLogs) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

// count is how many log lines contain s.
func (l *faultLogs) count(s string) int { return strings.Count(l.String(), s) }

// field returns the value of key in the first log line whose msg is msg.
func (l *faultLogs) field(msg, key string) (string, bool) {
	for _, line := range strings.Split(l.String(), "\n") {
		var m map[string]any
		if json.Unmarshal([]byte(line), &m) == nil && m["msg"] == msg {
			s, _ := m[key].(string)
			return s, true
		}
	}
	return "", false
}

// svcProc is one checkins process (serve, api or project).
type svcProc struct {
	cmd    *exec.Cmd
	logs   *faultLogs
	done   chan struct{}
	err    error // after done
	base   string
	waited sync.Once
}

// startSvc runs `checkins <mode>` with env and waits until it listens.
func startSvc(t *testing.T, mode string, env map[string]string) *svcProc {
	t.Helper()
	return startSvcLimited(t, 0, mode, env)
}

// startSvcLimited is startSvc under a descriptor limit of nofile (0: none), soft and hard (the Go
// runtime raises the soft limit to the hard one at start).
func startSvcLimited(t *testing.T, nofile int, mode string, env map[string]string) *svcProc {
	t.Helper()
	full := map[string]string{"HTTP_ADDR": "127.0.0.1:0", "LOG_LEVEL": "info"}
	for k, v := range env {
		full[k] = v
	}
	withTestAuth(full)
	cmd := exec.Command(checkinsBinary(t), mode)
	if nofile > 0 {
		cmd = exec.Command("sh", "-c", fmt.Sprintf(`ulimit -n %d && exec "$0" "$@"`, nofile), checkinsBinary(t), mode)
	}
	cmd.Env = cliEnv(full)
	stderr, err := cmd.StderrPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	p := &svcProc{cmd: cmd, logs: &faultLogs{}, done: make(chan struct{})}
	go func() {
		p.logs.scan(stderr)
		p.err = cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-p.done
	})
	require.Eventually(t, func() bool {
		addr, ok := p.logs.field("http listening", "addr")
		p.base = "http://" + addr
		return ok
	}, 30*time.Second, 20*time.Millisecond, "%s did not start; stderr:\n%s", mode, p.logs)
	return p
}

// exit signals the process and returns its exit code.
func (p *svcProc) exit(t *testing.T, sig syscall.Signal) int {
	t.Helper()
	require.NoError(t, p.cmd.Process.Signal(sig))
	select {
	case <-p.done:
	case <-time.After(45 * time.Second):
		t.Fatalf("no exit within 45s of %v; stderr:\n%s", sig, p.logs)
	}
	var ee *exec.ExitError
	switch {
	case p.err == nil:
		return 0
	case errors.As(p.err, &ee):
		return ee.ExitCode()
	}
	t.Fatalf("wait: %v", p.err)
	return -1
}

// sent is a check-in the test posted.
type sent struct {
	user, location, stars int64
}

// ledger is the independent record of what the API answered.
type ledger struct {
	mu       sync.Mutex
	ok       map[string]sent           // got a 2xx
	accepted map[string]domain.Checkin // the check-in each 2xx answered with
	unknown  map[string]sent           // anything else: may or may not be recorded; retried with the same ID
	codes    map[int]int
	errs     int // no HTTP answer (connection refused while the process is down, ...)
	timeouts int // no answer within the client timeout: a hang
	last503  []byte
	// When the first and the last answer other than 2xx (or none) came.
	firstBad, lastBad time.Time
	codes503          map[string]int // 503s by their error code
	users503          map[int64]int  // 503s by the check-in's user
	slowest           time.Duration  // the longest a request took to get its answer (or none)
}

func newLedger() *ledger {
	return &ledger{ok: map[string]sent{}, accepted: map[string]domain.Checkin{}, unknown: map[string]sent{}, codes: map[int]int{},
		codes503: map[string]int{}, users503: map[int64]int{}}
}

func (l *ledger) stats() (ok int, codes map[int]int, errs, timeouts int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	c := map[int]int{}
	for k, v := range l.codes {
		c[k] = v
	}
	return len(l.ok), c, l.errs, l.timeouts
}

// post sends one check-in and records the outcome.
func (l *ledger) post(client *http.Client, base, id string, s sent) {
	body := fmt.Sprintf(`{"checkinId":%q,"userId":%d,"locationId":%d,"starRating":%d}`, id, s.user, s.location, s.stars)
	req, _ := http.NewRequest(http.MethodPost, base+"/checkins", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	start := time.Now()
	resp, err := client.Do(req)
	took := time.Since(start)
	var raw []byte
	if err == nil {
		raw, _ = io.ReadAll(resp.Body)
		_ = resp.Body.Close()
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.slowest = max(l.slowest, took)
	if err != nil || resp.StatusCode < 200 || resp.StatusCode >= 300 {
		if l.firstBad.IsZero() {
			l.firstBad = time.Now()
		}
		l.lastBad = time.Now()
	}
	switch {
	case err != nil:
		var ne interface{ Timeout() bool }
		if errors.As(err, &ne) && ne.Timeout() {
			l.timeouts++
		}
		l.errs++
		l.unknown[id] = s
	case resp.StatusCode >= 200 && resp.StatusCode < 300:
		l.codes[resp.StatusCode]++
		l.ok[id] = s
		var c struct {
			ID         string `json:"checkinId"`
			UserID     int64  `json:"userId"`
			LocationID int64  `json:"locationId"`
			StarRating int    `json:"starRating"`
			Timestamp  int64  `json:"timestamp"`
		}
		if json.Unmarshal(raw, &c) == nil {
			l.accepted[id] = domain.Checkin{ID: c.ID, UserID: c.UserID, LocationID: c.LocationID, StarRating: c.StarRating, Timestamp: c.Timestamp}
		}
		delete(l.unknown, id)
	default:
		l.codes[resp.StatusCode]++
		if resp.StatusCode == http.StatusServiceUnavailable {
			l.last503 = raw
			var e struct {
				Error struct {
					Code string `json:"code"`
				} `json:"error"`
			}
			_ = json.Unmarshal(raw, &e)
			l.codes503[e.Error.Code]++
			l.users503[s.user]++
		}
		l.unknown[id] = s
	}
}

// load posts check-ins from workers until ctx ends; base() gives the API address.
func (l *ledger) load(ctx context.Context, workers int, prefix string, base func() string, timeout time.Duration) (wait func()) {
	client := authedClient(timeout)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ctx.Err() == nil; i++ {
				s := sent{user: 1 + rand.Int64N(faultUsers), location: 1 + rand.Int64N(faultLocations), stars: rand.Int64N(6)}
				l.post(client, base(), fmt.Sprintf("%s-%d-%d", prefix, w, i), s)
				// A steady load, not a benchmark: the machine is shared.
				select {
				case <-ctx.Done():
				case <-time.After(2 * time.Millisecond):
				}
			}
		}()
	}
	return wg.Wait
}

// resolve retries every check-in whose outcome is unknown, with the same checkinId, until it
// gets a 2xx: what a careful client does, and what makes the expected counts exact. Check-ins
// that already got a 2xx are never sent again, so a lost one cannot be papered over.
func (l *ledger) resolve(t *testing.T, base string) {
	t.Helper()
	client := authedClient(10 * time.Second)
	l.mu.Lock()
	n := len(l.unknown)
	l.mu.Unlock()
	// Thousands may be unknown after a long fault: they are retried eight at a time, and the
	// wait grows with their number, so a loaded machine is not mistaken for a lost check-in.
	deadline := time.Now().Add(30*time.Second + time.Duration(n)*10*time.Millisecond)
	for {
		l.mu.Lock()
		todo := make(chan string, len(l.unknown))
		pending := make(map[string]sent, len(l.unknown))
		for id, s := range l.unknown {
			pending[id] = s
			todo <- id
		}
		l.mu.Unlock()
		close(todo)
		if len(pending) == 0 {
			return
		}
		if time.Now().After(deadline) {
			require.Failf(t, "some check-ins never got a 2xx", "%d still unknown", len(pending))
		}
		var wg sync.WaitGroup
		for range 8 {
			wg.Go(func() {
				for id := range todo {
					l.post(client, base, id, pending[id])
				}
			})
		}
		wg.Wait()
		time.Sleep(100 * time.Millisecond)
	}
}

// verify waits until every user and location read model equals the count over l.ok.
func (l *ledger) verify(t *testing.T, base string) {
	t.Helper()
	l.mu.Lock()
	users, locs, stars := map[int64]int64{}, map[int64]int64{}, map[int64]int64{}
	for _, s := range l.ok {
		users[s.user]++
		locs[s.location]++
		stars[s.location] += s.stars
	}
	total := len(l.ok)
	l.mu.Unlock()
	client := authedClient(10 * time.Second)
	get := func(path string) (int, map[string]int64) {
		resp, err := client.Get(base + path)
		if err != nil {
			return 0, nil
		}
		defer resp.Body.Close()
		var m map[string]int64
		_ = json.NewDecoder(resp.Body).Decode(&m)
		return resp.StatusCode, m
	}
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		for u := int64(1); u <= faultUsers; u++ {
			code, m := get("/users/" + strconv.FormatInt(u, 10))
			if users[u] == 0 {
				assert.Equal(c, http.StatusNotFound, code, "user %d", u)
				continue
			}
			assert.Equal(c, users[u], m["numCheckins"], "user %d numCheckins", u)
		}
		for loc := int64(1); loc <= faultLocations; loc++ {
			code, m := get("/locations/" + strconv.FormatInt(loc, 10))
			if locs[loc] == 0 {
				assert.Equal(c, http.StatusNotFound, code, "location %d", loc)
				continue
			}
			assert.Equal(c, locs[loc], m["numCheckins"], "location %d numCheckins", loc)
			assert.Equal(c, stars[loc], m["numStars"], "location %d numStars", loc)
		}
	}, 30*time.Second, 200*time.Millisecond, "projections differ from the %d check-ins that got a 2xx", total)
	t.Logf("projections match the %d check-ins that got a 2xx", total)
}

// inStream asserts every check-in that got a 2xx is in the event stream.
func (l *ledger) inStream(t *testing.T, rdb redis.UniversalClient, keys adapters.KeySpace) {
	t.Helper()
	missing, total := l.missingFromStream(t, rdb, keys)
	assert.Zero(t, missing, "check-ins that got a 2xx but are not in the stream (of %d)", total)
}

// missingFromStream counts the check-ins that got a 2xx and are not in the event stream (any of
// its partitions).
func (l *ledger) missingFromStream(t *testing.T, rdb redis.UniversalClient, keys adapters.KeySpace) (missing, total int) {
	t.Helper()
	seen := map[string]bool{}
	for _, stream := range keys.Partitions().Streams() {
		start := "-"
		for {
			xs, err := rdb.XRangeN(context.Background(), stream, start, "+", 5000).Result()
			require.NoError(t, err)
			for _, x := range xs {
				if id, ok := x.Values[domain.FieldCheckinID].(string); ok {
					seen[id] = true
				}
			}
			if len(xs) < 5000 {
				break
			}
			start = "(" + xs[len(xs)-1].ID
		}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	for id := range l.ok {
		if !seen[id] {
			missing++
		}
	}
	return missing, len(l.ok)
}

// groupsPending is the pending count of every consumer group on the stream.
func groupsPending(t *testing.T, rdb redis.UniversalClient, keys adapters.KeySpace) map[string]int64 {
	t.Helper()
	out := map[string]int64{}
	for _, stream := range keys.Partitions().Streams() { // summed over partitions
		gs, err := rdb.XInfoGroups(context.Background(), stream).Result()
		require.NoError(t, err)
		for _, g := range gs {
			out[g.Name] += g.Pending
		}
	}
	return out
}

func requireNothingPending(t *testing.T, rdb redis.UniversalClient, keys adapters.KeySpace) {
	t.Helper()
	require.Eventually(t, func() bool {
		for _, n := range groupsPending(t, rdb, keys) {
			if n != 0 {
				return false
			}
		}
		return true
	}, 30*time.Second, 50*time.Millisecond, "pending entries left: %v", groupsPending(t, rdb, keys))
}

// requireCaughtUp waits until every consumer group of every partition has read its stream to
// the end and acknowledged all it read: no entry is pending, and none is left to deliver.
func requireCaughtUp(t *testing.T, rdb redis.UniversalClient, keys adapters.KeySpace) {
	t.Helper()
	ctx := context.Background()
	behind := func() []string {
		var out []string
		for _, stream := range keys.Partitions().Streams() {
			info, err := rdb.XInfoStream(ctx, stream).Result()
			if err != nil && strings.Contains(err.Error(), "no such key") {
				continue // a partition no entry went to
			}
			require.NoError(t, err)
			gs, err := rdb.XInfoGroups(ctx, stream).Result()
			require.NoError(t, err)
			for _, g := range gs {
				if g.Pending != 0 || g.LastDeliveredID != info.LastGeneratedID {
					out = append(out, fmt.Sprintf("%s %s: %d pending, delivered up to %s of %s", stream, g.Name, g.Pending, g.LastDeliveredID, info.LastGeneratedID))
				}
			}
		}
		return out
	}
	require.Eventually(t, func() bool { return len(behind()) == 0 }, 30*time.Second, 50*time.Millisecond, "groups behind: %v", behind())
}

// waitFor waits until the ledger has more than n 2xx answers.
func (l *ledger) waitFor(t *testing.T, n int) {
	t.Helper()
	require.Eventually(t, func() bool { ok, _, _, _ := l.stats(); return ok > n }, 30*time.Second, 10*time.Millisecond)
}

// consumerPending is the pending count of consumer name in every group.
func consumerPending(t *testing.T, rdb redis.UniversalClient, keys adapters.KeySpace, name string) (total int64, present bool) {
	t.Helper()
	ctx := context.Background()
	for g := range groupsPending(t, rdb, keys) {
		for _, stream := range keys.Partitions().Streams() { // summed over partitions
			cs, err := rdb.XInfoConsumers(ctx, stream, g).Result()
			require.NoError(t, err)
			for _, c := range cs {
				if c.Name == name {
					total += c.Pending
					present = true
				}
			}
		}
	}
	return total, present
}

// stopWhileHolding SIGSTOPs victim (consumer "victim") at a moment it holds events: read, not yet
// acknowledged. Stopped, it can acknowledge nothing between the look and what the test does
// next; the pause after the stop lets Redis execute what the process had already written to
// its sockets (an XACK on its way would otherwise land after the look and leave nothing pending).
func stopWhileHolding(t *testing.T, victim *svcProc, client redis.UniversalClient, keys adapters.KeySpace) {
	t.Helper()
	require.Eventually(t, func() bool {
		require.NoError(t, victim.cmd.Process.Signal(syscall.SIGSTOP))
		time.Sleep(100 * time.Millisecond)
		if n, _ := consumerPending(t, client, keys, "victim"); n > 0 {
			return true
		}
		require.NoError(t, victim.cmd.Process.Signal(syscall.SIGCONT))
		time.Sleep(time.Duration(rand.IntN(3000)) * time.Microsecond)
		return false
	}, 20*time.Second, time.Millisecond, "the projector never held pending events")
}

// TestFaultProjectorStoppedMidStreamCountsOnce: a projector SIGSTOPped while it holds events, for
// longer than CLAIM_IDLE, beside a second one that takes them over, applies them and goes on
// (pruning its markers as it acknowledges past them); then SIGCONTed under load. Whatever it was
// about to write for the events it held does not land (its lease ran out: the scripts refuse),
// it lets them go, and every read model is exact. Where the stop lands is chance (often after
// its writes, with only the XACK to go), so this is the real processes' check; the interleavings
// are pinned down, each failing without its fence, in ports/fencing_test.go.
func TestFaultProjectorStoppedMidStreamCountsOnce(t *testing.T) {
	t.Parallel()
	rdb := redistest.Open(t)
	client := redistest.Client(t, rdb.URL)
	keys := adapters.KeySpace{Prefix: rdb.Prefix}
	env := func(consumer string) map[string]string {
		return map[string]string{"REDIS_URL": rdb.URL, "KEY_PREFIX": rdb.Prefix, "CLAIM_IDLE": "1s", "CLAIM_INTERVAL": "100ms",
			"CONSUMER_NAME": consumer, "RATE_LIMIT_USER": "off"}
	}
	api := startSvc(t, "api", env(""))
	victim := startSvc(t, "project", env("victim"))
	startSvc(t, "project", env("heir"))

	l := newLedger()
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	wait := l.load(ctx, 4, "stop", func() string { return api.base }, 10*time.Second)
	l.waitFor(t, 300)
	stopWhileHolding(t, victim, client, keys)
	held, _ := consumerPending(t, client, keys, "victim")
	t.Logf("SIGSTOPped projector held %d pending events", held)
	// The heir takes them over (after CLAIM_IDLE) and goes on, past them.
	require.Eventually(t, func() bool { n, _ := consumerPending(t, client, keys, "victim"); return n == 0 },
		20*time.Second, 20*time.Millisecond, "the heir takes the stopped projector's events over")
	from, _, _, _ := l.stats()
	l.waitFor(t, from+300)
	require.NoError(t, victim.cmd.Process.Signal(syscall.SIGCONT))
	from, _, _, _ = l.stats()
	l.waitFor(t, from+300)
	stop()
	wait()
	l.resolve(t, api.base)
	l.verifyAll(t, rdb.URL, keys)
	requireNothingPending(t, client, keys)
	t.Logf("the stopped projector, moving again: %v", logHistogram(victim.logs.String()))
}

// TestFaultProjectorKilledMidStreamIsTakenOver: a projector SIGKILLed while it holds events;
// a second projector takes them over after CLAIM_IDLE, every check-in is counted exactly once,
// and the dead consumer, once it holds nothing, is removed from every group. With one stream,
// and with 4 partitions (its entries are taken over on each partition).
func TestFaultProjectorKilledMidStreamIsTakenOver(t *testing.T) {
	t.Parallel()
	for _, p := range []int{1, 4} {
		t.Run(fmt.Sprintf("P=%d", p), func(t *testing.T) {
			t.Parallel()
			projectorKilledMidStreamIsTakenOver(t, p)
		})
	}
}

func projectorKilledMidStreamIsTakenOver(t *testing.T, partitions int) {
	rdb := redistest.Open(t)
	client := redistest.Client(t, rdb.URL)
	keys, err := adapters.KeySpace{Prefix: rdb.Prefix}.WithPartitions(partitions)
	require.NoError(t, err)
	common := map[string]string{"REDIS_URL": rdb.URL, "KEY_PREFIX": rdb.Prefix, "CLAIM_IDLE": "2s", "CLAIM_INTERVAL": "200ms",
		"CONSUMER_IDLE_REMOVE": "1s", "STREAM_PARTITIONS": strconv.Itoa(partitions)}
	with := func(extra map[string]string) map[string]string {
		m := map[string]string{}
		for k, v := range common {
			m[k] = v
		}
		for k, v := range extra {
			m[k] = v
		}
		return m
	}
	api := startSvc(t, "api", with(nil))
	victim := startSvc(t, "project", with(map[string]string{"CONSUMER_NAME": "victim"}))

	l := newLedger()
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	wait := l.load(ctx, 4, "kill", func() string { return api.base }, 10*time.Second)
	l.waitFor(t, 300)
	// A consumer that died holding nothing: clutter to be removed.
	for g := range groupsPending(t, client, keys) {
		for _, stream := range keys.Partitions().Streams() {
			require.NoError(t, client.XGroupCreateConsumer(context.Background(), stream, g, "ghost").Err())
		}
	}
	// Kill it at a moment it holds events (stopped first, see stopWhileHolding).
	stopWhileHolding(t, victim, client, keys)
	require.NoError(t, victim.cmd.Process.Kill())
	<-victim.done
	held, _ := consumerPending(t, client, keys, "victim")
	t.Logf("SIGKILLed projector held %d pending events", held)
	require.Positive(t, held, "the kill must leave events pending")

	heir := startSvc(t, "project", with(map[string]string{"CONSUMER_NAME": "heir"}))
	l.waitFor(t, func() int { ok, _, _, _ := l.stats(); return ok + 300 }())
	stop()
	wait()
	l.resolve(t, api.base)
	l.verify(t, api.base)
	requireNothingPending(t, client, keys)
	require.Eventually(t, func() bool {
		_, victimThere := consumerPending(t, client, keys, "victim")
		_, ghostThere := consumerPending(t, client, keys, "ghost")
		return !victimThere && !ghostThere
	}, 20*time.Second, 100*time.Millisecond, "dead consumers are removed from every group once they hold nothing")
	_, heirThere := consumerPending(t, client, keys, "heir")
	assert.True(t, heirThere, "the live consumer stays")
	assert.Equal(t, int64(0), poisonLen(t, client, keys), "nothing was parked")
	_ = heir
}

func poisonLen(t *testing.T, rdb redis.UniversalClient, keys adapters.KeySpace) int64 {
	t.Helper()
	n, err := rdb.XLen(context.Background(), keys.PoisonStream()).Result()
	require.NoError(t, err)
	return n
}

// TestFaultSIGTERMDuringLoadLosesNothing: SIGTERM while check-ins pour in: exit 0, nothing left
// pending in any group, and a restarted service continues to exact counts.
func TestFaultSIGTERMDuringLoadLosesNothing(t *testing.T) {
	t.Parallel()
	withEachSubscriber(t, testSIGTERMDuringLoad)
}

func testSIGTERMDuringLoad(t *testing.T, sub string) {
	rdb := redistest.Open(t)
	client := redistest.Client(t, rdb.URL)
	keys := adapters.KeySpace{Prefix: rdb.Prefix}
	env := map[string]string{"REDIS_URL": rdb.URL, "KEY_PREFIX": rdb.Prefix, "DRAIN_TIMEOUT": "15s", "SUBSCRIBER": sub,
		"CLAIM_IDLE": "2s", "CLAIM_INTERVAL": "200ms"}
	svc := startSvc(t, "serve", env)

	l := newLedger()
	var mu sync.Mutex
	base := svc.base
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	wait := l.load(ctx, 4, "term", func() string { mu.Lock(); defer mu.Unlock(); return base }, 10*time.Second)
	l.waitFor(t, 500)
	code := svc.exit(t, syscall.SIGTERM)
	require.Equal(t, 0, code, "exit 0 on SIGTERM; stderr:\n%s", svc.logs)
	// The stock subscriber drops what it read ahead on Close; the service drains it.
	for g, n := range groupsPending(t, client, keys) {
		assert.Zero(t, n, "group %s has pending entries after a clean shutdown", g)
	}
	stop()
	wait()
	ok, codes, errs, _ := l.stats()
	t.Logf("before SIGTERM: %d accepted, statuses %v, %d without an answer", ok, codes, errs)

	again := startSvc(t, "serve", env)
	mu.Lock()
	base = again.base
	mu.Unlock()
	l.resolve(t, again.base)
	l.inStream(t, client, keys)
	l.verify(t, again.base)
	requireNothingPending(t, client, keys)
}

// TestFaultRedisOutageDuringLoad: redis-server killed and restarted (AOF, appendfsync always)
// under HTTP load: 503 JSON while it is down, never a hang, /readyz 503; afterwards everything
// resumes without a restart of the service, and every check-in that got a 2xx is counted once.
func TestFaultRedisOutageDuringLoad(t *testing.T) {
	t.Parallel()
	withEachSubscriber(t, testRedisOutageDuringLoad)
}

func testRedisOutageDuringLoad(t *testing.T, sub string) {
	srv := redistest.Start(t, redistest.Options{AppendOnly: true, FSync: "always"})
	client := redistest.Client(t, srv.URL())
	keys := adapters.KeySpace{Prefix: "outage"}
	const requestTimeout = time.Second
	// A read whose reply the crash cut off leaves its entries pending in the reader's own PEL,
	// where only the takeover after CLAIM_IDLE finds them: a short CLAIM_IDLE keeps the test short.
	svc := startSvc(t, "serve", map[string]string{"REDIS_URL": srv.URL(), "KEY_PREFIX": keys.Prefix,
		"REQUEST_TIMEOUT": requestTimeout.String(), "NACK_DELAY": "200ms", "SUBSCRIBER": sub,
		"CLAIM_IDLE": "3s", "CLAIM_INTERVAL": "500ms"})

	l := newLedger()
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	// A request that takes longer than REQUEST_TIMEOUT plus slack counts as a hang.
	wait := l.load(ctx, 4, "outage", func() string { return svc.base }, requestTimeout+3*time.Second)
	l.waitFor(t, 300)

	srv.Kill()
	require.Eventually(t, func() bool { _, c, _, _ := l.stats(); return c[http.StatusServiceUnavailable] >= 20 }, 20*time.Second, 10*time.Millisecond,
		"POST /checkins answers 503 while Redis is down")
	code, body := faultGet(t, svc.base+"/readyz")
	assert.Equal(t, http.StatusServiceUnavailable, code, "readyz while Redis is down: %s", body)
	l.mu.Lock()
	var e struct {
		Error struct{ Code, Message string } `json:"error"`
	}
	require.NoError(t, json.Unmarshal(l.last503, &e), "503 body is JSON: %s", l.last503)
	l.mu.Unlock()
	assert.Equal(t, domain.CodeUnavailable, e.Error.Code)
	okDown, _, _, _ := l.stats()

	srv.Restart()
	l.waitFor(t, okDown+300) // resumes by itself
	require.Eventually(t, func() bool { c, _ := faultGet(t, svc.base+"/readyz"); return c == http.StatusOK }, 20*time.Second, 50*time.Millisecond)
	stop()
	wait()
	ok, codes, errs, timeouts := l.stats()
	t.Logf("outage run: %d accepted, statuses %v, %d without an answer, %d hangs", ok, codes, errs, timeouts)
	assert.Zero(t, timeouts, "no request may hang beyond REQUEST_TIMEOUT")

	l.inStream(t, client, keys) // no 2xx lost across the crash: AOF with appendfsync always
	l.resolve(t, svc.base)
	l.verify(t, svc.base)
	requireNothingPending(t, client, keys)
	assert.Equal(t, int64(0), poisonLen(t, client, keys), "an outage parks nothing: transient failures are retried, not poisoned")
	assert.NotContains(t, svc.logs.String(), `"msg":"Handler returned error"`, "nacks are not logged one by one")
	t.Logf("log lines by message: %v", logHistogram(svc.logs.String()))
}

// TestFaultRedisComesBackEmpty: under load, a redis-server without persistence is killed and
// restarted, empty: the events, the read models and the projections' registry are gone together.
// The API takes check-ins again by itself, and so do the projections: the running projector
// finds the live group's membership gone, joins again as at a start, and all five read models
// come out exact for the check-ins accepted since the server came back, without a restart of
// the service; a restart afterwards counts nothing twice.
func TestFaultRedisComesBackEmpty(t *testing.T) {
	t.Parallel()
	withEachSubscriber(t, testRedisComesBackEmpty)
}

func testRedisComesBackEmpty(t *testing.T, sub string) {
	srv := redistest.Start(t, redistest.Options{})
	client := redistest.Client(t, srv.URL())
	keys := adapters.KeySpace{Prefix: "checkins"}
	env := map[string]string{"REDIS_URL": srv.URL(), "STALL_AFTER": "1s", "REQUEST_TIMEOUT": "1s", "SUBSCRIBER": sub,
		"PROJECTION_POLL_INTERVAL": "200ms", "PROJECTION_RETIRE_GRACE": "1s"}
	svc := startSvc(t, "serve", env)
	base := func() string { return svc.base }
	// users serves v2 when Redis is lost, in a process started after the rebuild (it never
	// joined users.v1), and the registry that comes back empty says v1: the projector must still
	// see that the membership of the others is gone when users.v1 joins.
	code, out, errOut := runOps(t, env, "projections", "rebuild", "users")
	require.Equal(t, 0, code, "%s\n%s", out, errOut)
	require.Equal(t, 0, svc.exit(t, syscall.SIGTERM))
	svc = startSvc(t, "serve", env)

	lost := newLedger()
	ctx, stopLost := context.WithCancel(context.Background())
	defer stopLost()
	wait := lost.load(ctx, 2, "lost", base, 5*time.Second)
	lost.waitFor(t, 100)
	require.Eventually(t, func() bool { c, _ := faultGet(t, svc.base+"/readyz"); return c == http.StatusOK }, 20*time.Second, 50*time.Millisecond)
	// At rest when the server dies: a request or a batch in flight then may still land after it
	// came back (the README's "A Redis that comes back empty"), which no ledger can tell. Nothing
	// pending is not enough: a group that has not read the last entries yet may read them just
	// before the kill and apply them, within its lease, to the server that came back.
	stopLost()
	wait()
	requireCaughtUp(t, client, keys)
	srv.Kill()
	srv.Restart()
	n, err := client.XLen(context.Background(), keys.Stream()).Result()
	require.NoError(t, err)
	require.Zero(t, n, "the server came back empty (the service may have written its registry again)")

	l := newLedger()
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	wait = l.load(ctx, 4, "after", base, 5*time.Second)
	l.waitFor(t, 300)
	require.Eventually(t, func() bool {
		return strings.Contains(svc.logs.String(), "the live group's membership is gone from Redis")
	},
		30*time.Second, 50*time.Millisecond, "the projector notices: %s", svc.logs)
	require.Eventually(t, func() bool { c, _ := faultGet(t, svc.base+"/readyz"); return c == http.StatusOK }, 30*time.Second, 50*time.Millisecond)
	ok, _, _, _ := l.stats()
	l.waitFor(t, ok+200)
	stop()
	wait()
	l.resolve(t, svc.base)
	l.verifyAll(t, srv.URL(), keys)
	l.inStream(t, client, keys)
	requireNothingPending(t, client, keys)

	require.Equal(t, 0, svc.exit(t, syscall.SIGTERM))
	svc = startSvc(t, "serve", env)
	ctx, stop = context.WithCancel(context.Background())
	defer stop()
	wait = l.load(ctx, 2, "restarted", base, 5*time.Second)
	ok, _, _, _ = l.stats()
	l.waitFor(t, ok+100)
	stop()
	wait()
	l.resolve(t, svc.base)
	l.verifyAll(t, srv.URL(), keys) // a restart counts nothing twice
	requireNothingPending(t, client, keys)
	assert.Zero(t, poisonLen(t, client, keys), "nothing parked")
}

// withEachSubscriber runs test as parallel subtests, once per subscriber (SUBSCRIBER).
func withEachSubscriber(t *testing.T, test func(t *testing.T, sub string)) {
	for _, sub := range []string{"batched", "watermill"} {
		t.Run(sub, func(t *testing.T) {
			t.Parallel()
			test(t, sub)
		})
	}
}

func faultGet(t *testing.T, url string) (int, string) {
	t.Helper()
	c := authedClient(10 * time.Second)
	resp, err := c.Get(url)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// runOps runs an ops verb of the binary against env.
func runOps(t *testing.T, env map[string]string, args ...string) (int, string, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, checkinsBinary(t), args...)
	cmd.Env = cliEnv(env)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return 0, stdout.String(), stderr.String()
	case errors.As(err, &ee):
		return ee.ExitCode(), stdout.String(), stderr.String()
	}
	t.Fatalf("checkins %v: %v", args, err)
	return -1, "", ""
}

type poisonListJSON struct {
	Entries []ops.PoisonEntry `json:"entries"`
	Next    string            `json:"next"`
}

// TestFaultMalformedEntriesAreParked: garbage XADDed straight into the stream is parked with a
// reason by every projection and consumption goes on, for both subscribers; the CLI shows it,
// refuses to replay it, and purges it.
func TestFaultMalformedEntriesAreParked(t *testing.T) {
	t.Parallel()
	for _, sub := range []string{"batched", "watermill"} {
		t.Run(sub, func(t *testing.T) {
			t.Parallel()
			rdb := redistest.Open(t)
			client := redistest.Client(t, rdb.URL)
			keys := adapters.KeySpace{Prefix: rdb.Prefix}
			env := map[string]string{"REDIS_URL": rdb.URL, "KEY_PREFIX": rdb.Prefix, "SUBSCRIBER": sub, "NACK_DELAY": "100ms"}
			svc := startSvc(t, "serve", env)
			l := newLedger()
			httpc := authedClient(10 * time.Second)
			for i := range 30 {
				l.post(httpc, svc.base, fmt.Sprintf("m-%d", i), sent{user: 1 + int64(i)%faultUsers, location: 1 + int64(i)%faultLocations, stars: int64(i % 6)})
			}
			ctx := context.Background()
			garbage := map[string]bool{}
			for _, values := range []map[string]any{
				{"hello": "world"},
				{"type": domain.EventCheckinRecorded, "checkinId": "g", "userId": "-5", "locationId": "1", "starRating": "1", "timestamp": "1"},
			} {
				id, err := client.XAdd(ctx, &redis.XAddArgs{Stream: keys.Stream(), Values: values}).Result()
				require.NoError(t, err)
				garbage[id] = true
			}
			for i := 30; i < 60; i++ {
				l.post(httpc, svc.base, fmt.Sprintf("m-%d", i), sent{user: 1 + int64(i)%faultUsers, location: 1 + int64(i)%faultLocations, stars: int64(i % 6)})
			}
			l.verify(t, svc.base)
			requireNothingPending(t, client, keys)
			groups := len(groupsPending(t, client, keys))

			var page poisonListJSON
			require.Eventually(t, func() bool {
				code, out, _ := runOps(t, env, "poison", "list", "--json", "--limit", "1000")
				return code == 0 && json.Unmarshal([]byte(out), &page) == nil && len(page.Entries) == 2*groups
			}, 20*time.Second, 100*time.Millisecond, "each projection parks each malformed entry")
			for _, e := range page.Entries {
				assert.True(t, garbage[e.EntryID], "names the original entry")
				assert.NotEmpty(t, e.Error)
				assert.Equal(t, keys.Stream(), e.Stream)
			}

			code, out, stderr := runOps(t, env, "poison", "replay", page.Entries[0].ID, "--json")
			assert.Equal(t, 1, code, "stdout %s", out)
			assert.Contains(t, stderr, "not a valid event")
			assert.Contains(t, out, `"status": "not_replayable"`, "flags may follow the ID")
			code, out, _ = runOps(t, env, "poison", "show", page.Entries[0].ID)
			require.Equal(t, 0, code, "kept after the failed replay")
			assert.Contains(t, out, page.Entries[0].EntryID)

			code, out, stderr = runOps(t, env, "status", "--json")
			require.Equal(t, 0, code, stderr)
			var st struct {
				Poisoned    int64 `json:"poisoned"`
				Projections []struct {
					Group     string `json:"group"`
					Pending   int64  `json:"pending"`
					Lag       *int64 `json:"lag"`
					Poisoned  int64  `json:"poisoned"`
					Consumers []struct {
						Name string `json:"name"`
					} `json:"consumers"`
				} `json:"projections"`
			}
			require.NoError(t, json.Unmarshal([]byte(out), &st), out)
			assert.Equal(t, int64(2*groups), st.Poisoned)
			for _, p := range st.Projections {
				assert.Zero(t, p.Pending, p.Group)
				if assert.NotNil(t, p.Lag, p.Group) {
					assert.Zero(t, *p.Lag, p.Group)
				}
				assert.Equal(t, int64(2), p.Poisoned, p.Group)
				assert.Len(t, p.Consumers, 1, p.Group)
			}

			code, out, stderr = runOps(t, env, "poison", "purge", "--all")
			require.Equal(t, 0, code, stderr)
			assert.Contains(t, out, fmt.Sprintf("purged %d entries", 2*groups))
			assert.Equal(t, int64(0), poisonLen(t, client, keys))
		})
	}
}

// TestFaultReplayFromTheCLIAndHTTP: events a projection gave up on are replayed into that
// projection only, counted once (also when it had counted them already), and removed.
func TestFaultReplayFromTheCLIAndHTTP(t *testing.T) {
	t.Parallel()
	rdb := redistest.Open(t)
	client := redistest.Client(t, rdb.URL)
	keys := adapters.KeySpace{Prefix: rdb.Prefix}
	env := map[string]string{"REDIS_URL": rdb.URL, "KEY_PREFIX": rdb.Prefix}
	svc := startSvc(t, "serve", env)
	l := newLedger()
	httpc := authedClient(10 * time.Second)
	for i := range 10 {
		l.post(httpc, svc.base, fmt.Sprintf("r-%d", i), sent{user: 1 + int64(i)%3, location: 1, stars: 4})
	}
	l.verify(t, svc.base)

	// The users projection gave up on a check-in of user 99 (the others counted it), and the same
	// check-in was parked a second time (its batch was nacked after the parking, say).
	ctx := context.Background()
	q := adapters.NewPoisonQueue(client, keys)
	park := func(id string, user int64) string {
		ev := domain.CheckinRecorded{Checkin: domain.Checkin{ID: id, UserID: user, LocationID: 1, StarRating: 4, Timestamp: 1_700_000_000_000}, RecordedAt: 1_700_000_000_000}
		pid, err := q.Park(ctx, ops.PoisonEntry{Stream: keys.Stream(), EntryID: "1-1", Projection: "users", Group: "users.v1",
			Error: "handler bug", Attempts: 5, FailedAt: time.Now(), Fields: ev.Fields()})
		require.NoError(t, err)
		return pid
	}
	fresh := park("r-new", 99)
	dup := park("r-new", 99)

	code, out, stderr := runOps(t, env, "poison", "replay", fresh)
	require.Equal(t, 0, code, "stdout %s stderr %s", out, stderr)
	assert.Contains(t, out, "applied: true")
	code, out, stderr = runOps(t, env, "poison", "replay", fresh)
	assert.Equal(t, 1, code, "a replayed entry is gone: %s", out)
	assert.Contains(t, stderr, "not found")

	// The same through HTTP.
	req, _ := http.NewRequest(http.MethodPost, svc.base+"/ops/poison/"+dup+"/replay", nil)
	resp, err := httpc.Do(req)
	require.NoError(t, err)
	var rr struct {
		Status  string `json:"status"`
		Applied bool   `json:"applied"`
	}
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&rr))
	_ = resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Equal(t, "replayed", rr.Status)
	assert.False(t, rr.Applied, "counted by the first replay: nothing changes")

	// A bulk replay of one projection.
	for i := range 3 {
		park(fmt.Sprintf("r-bulk-%d", i), 98)
	}
	code, out, stderr = runOps(t, env, "poison", "replay", "--all", "--projection", "users")
	require.Equal(t, 0, code, "stdout %s stderr %s", out, stderr)
	assert.Contains(t, out, "replayed 3, failed 0")
	c, body := faultGet(t, svc.base+"/users/98")
	require.Equal(t, http.StatusOK, c, body)
	assert.Contains(t, body, `"numCheckins":3`)

	c, body = faultGet(t, svc.base+"/users/99")
	require.Equal(t, http.StatusOK, c, body)
	assert.Contains(t, body, `"numCheckins":1`)
	l.verify(t, svc.base) // users 1..3 and location 1 unchanged: counted once, only in users
	c, body = faultGet(t, svc.base+"/ops/poison")
	assert.Equal(t, http.StatusOK, c)
	assert.JSONEq(t, `{"entries":[]}`, body)
	c, body = faultGet(t, svc.base+"/ops/poison/"+fresh)
	assert.Equal(t, http.StatusNotFound, c)
	assert.Contains(t, body, `"code":"not_found"`)
}

// logHistogram counts log lines by level and message.
func logHistogram(logs string) map[string]int {
	out := map[string]int{}
	for _, line := range strings.Split(logs, "\n") {
		var m map[string]any
		if json.Unmarshal([]byte(line), &m) == nil {
			out[fmt.Sprint(m["level"], " ", m["msg"])]++
		}
	}
	return out
}
