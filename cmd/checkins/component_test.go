package main

// Component tests: the whole service wired by NewService, in process, over a real HTTP listener
// and a real Redis. `package main` because a command's package cannot be imported by a _test
// package; the tests still only use what main itself uses (parseConfig, NewService, Run) and talk
// to the service over HTTP and to Redis over the wire.

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/checkins/checkins/adapters"
	"github.com/checkins/checkins/adapters/redistest"
	"github.com/checkins/checkins/app/projection"
)

// inProcessService is a service started by startInProcess.
type inProcessService struct {
	svc    *Service
	base   string // http://127.0.0.1:port
	ops    string // the ops listener's http://host:port (base when they share a port)
	cancel context.CancelFunc
	done   chan error // Run's result
}

// startInProcess builds the service from env the way main does and runs it until stop or the end
// of the test.
func startInProcess(t *testing.T, env map[string]string, mode Mode) *inProcessService {
	t.Helper()
	env["HTTP_ADDR"] = "127.0.0.1:0"
	withTestAuth(env)
	if env["LOG_LEVEL"] == "" {
		env["LOG_LEVEL"] = "warn"
	}
	cfg, rest, err := parseConfig(flag.NewFlagSet("component", flag.ContinueOnError), nil, func(k string) string { return env[k] })
	require.NoError(t, err)
	require.Empty(t, rest)
	// Not t.Output(): the service may still log while the test's cleanup stops it.
	log := newLogger(os.Stderr, cfg.LogLevel)

	ctx, cancel := context.WithCancel(context.Background())
	svc, err := NewService(ctx, cfg, mode, log)
	if err != nil {
		cancel()
		require.NoError(t, err)
	}
	addr, err := svc.Listen()
	if err != nil {
		cancel()
		require.NoError(t, err)
	}
	p := &inProcessService{svc: svc, base: "http://" + addr.String(), ops: "http://" + svc.OpsAddr().String(), cancel: cancel, done: make(chan error, 1)}
	go func() { p.done <- svc.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-p.done:
		case <-time.After(time.Minute):
			t.Errorf("service did not stop within a minute of its context ending")
		}
	})
	return p
}

// stop cancels the service's context and returns what Run returned.
func (p *inProcessService) stop(t *testing.T) error {
	t.Helper()
	p.cancel()
	select {
	case err := <-p.done:
		p.done <- err // for the cleanup
		return err
	case <-time.After(time.Minute):
		t.Fatal("Run did not return within a minute of its context ending")
		return nil
	}
}

// testHTTPClient sends a test token with every request that has none (auth_harness_test.go).
var testHTTPClient = authedClient(10 * time.Second)

// testPostCheckin posts body to /checkins; it returns the status and the decoded JSON body. It
// returns errors rather than failing the test because workers call it off the test goroutine.
func testPostCheckin(base, body string, header map[string]string) (int, map[string]any, error) {
	req, err := http.NewRequest(http.MethodPost, base+"/checkins", bytes.NewBufferString(body))
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := testHTTPClient.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, nil, err
	}
	var out map[string]any
	if err := json.Unmarshal(raw, &out); err != nil {
		return resp.StatusCode, nil, fmt.Errorf("response body %q: %w", raw, err)
	}
	return resp.StatusCode, out, nil
}

// testGetStats reads /users/{id} or /locations/{id}; status and numeric fields.
func testGetStats(base, path string) (int, map[string]int64, error) {
	resp, err := testHTTPClient.Get(base + path)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	var out map[string]int64
	if resp.StatusCode == http.StatusOK {
		if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
			return resp.StatusCode, nil, err
		}
	}
	return resp.StatusCode, out, nil
}

// componentRequest is one POST /checkins the test sends, and what it must get.
type componentRequest struct {
	body   string
	header map[string]string
	want   int    // status
	field  string // for 400: the field the error must name
	sent   componentSent
}

// componentSent is what the client asked for, to compare with the 202 response.
type componentSent struct {
	id                    string // "" when the server generates it
	user, location, stars int64
	timestamp             int64 // 0 when the server sets it
}

// componentAccepted is a check-in as the API echoed it back in a 202.
type componentAccepted struct {
	CheckinID  string `json:"checkinId"`
	UserID     int64  `json:"userId"`
	LocationID int64  `json:"locationId"`
	StarRating int64  `json:"starRating"`
	Timestamp  int64  `json:"timestamp"`
}

func componentCheckinBody(s componentSent) string {
	m := map[string]any{"userId": s.user, "locationId": s.location, "starRating": s.stars}
	if s.id != "" {
		m["checkinId"] = s.id
	}
	if s.timestamp != 0 {
		m["timestamp"] = s.timestamp
	}
	b, _ := json.Marshal(m)
	return string(b)
}

// TestComponentProjectionsMatchAcceptedCheckins posts a few hundred check-ins (with retried
// duplicates, out-of-order timestamps, conflicting reuses of an ID and invalid ones) to the API of
// a service running every projection, publishes some events a second time, waits until every
// user and location read model equals a computation over the check-ins the API accepted (each
// counted once), and then stops the service: Run must return nil and leave no event pending in
// any consumer group. Once per subscriber implementation.
// The same on the shared local cluster of 3 masters, with its default 24 stream partitions.
func TestComponentProjectionsMatchAcceptedCheckins(t *testing.T) {
	t.Parallel()
	for _, subscriber := range []string{"batched", "watermill"} {
		t.Run("SUBSCRIBER="+subscriber, func(t *testing.T) {
			t.Parallel()
			rdb := redistest.Open(t)
			testProjectionsMatchAcceptedCheckins(t, subscriber, rdb.URL, adapters.KeySpace{Prefix: rdb.Prefix}, redistest.Client(t, rdb.URL))
		})
		t.Run("cluster/SUBSCRIBER="+subscriber, func(t *testing.T) {
			t.Parallel()
			cl := redistest.OpenCluster(t)
			keys, err := adapters.NewKeySpace(cl.Prefix, true)
			require.NoError(t, err)
			keys, err = keys.WithPartitions(adapters.DefaultClusterPartitions)
			require.NoError(t, err)
			testProjectionsMatchAcceptedCheckins(t, subscriber, cl.URL, keys, redistest.ClusterClient(t, cl.URL))
		})
	}
}

func testProjectionsMatchAcceptedCheckins(t *testing.T, subscriber, url string, keys adapters.KeySpace, client redis.UniversalClient) {
	svc := startInProcess(t, map[string]string{
		"REDIS_URL": url, "KEY_PREFIX": keys.Prefix, "DRAIN_TIMEOUT": "20s", "SUBSCRIBER": subscriber,
	}, Mode{API: true, Projections: true})

	const (
		nValid     = 300
		nUsers     = 25
		nLocations = 20
	)
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 1))
	now := time.Now().UnixMilli()
	// Distinct timestamps within the last 30 days, posted in random order: most arrive out of
	// order for their user. Distinct so that "the latest check-in" has one answer.
	order := rng.Perm(nValid)
	var reqs, conflicts []componentRequest
	for i := range nValid {
		s := componentSent{
			user: 1 + rng.Int64N(nUsers), location: 1 + rng.Int64N(nLocations), stars: rng.Int64N(6),
			timestamp: now - 30*24*3600*1000 + int64(order[i])*1000 + 1 + rng.Int64N(999),
		}
		r := componentRequest{want: http.StatusAccepted}
		switch i % 6 {
		case 0: // the server generates the ID
		case 1: // the ID in the Idempotency-Key header
			r.header = map[string]string{"Idempotency-Key": fmt.Sprintf("hdr-%d", i)}
			s.id = fmt.Sprintf("hdr-%d", i)
		case 2: // no timestamp: the server uses its clock
			s.id = fmt.Sprintf("now-%d", i)
			s.timestamp = 0
		default:
			s.id = fmt.Sprintf("c-%d", i)
		}
		r.sent = s
		if r.header == nil {
			r.body = componentCheckinBody(s)
		} else {
			noID := s
			noID.id = ""
			r.body = componentCheckinBody(noID)
		}
		reqs = append(reqs, r)
		// A client retrying the same request (timeout, lost response): same ID, same content.
		if s.id != "" && i%5 == 0 {
			reqs = append(reqs, r)
		}
		// Someone reusing an ID for a different check-in: 409, never counted. Sent after all
		// the others, so which of the two is the original is known.
		if s.id != "" && i%23 == 0 {
			other := s
			other.stars = (s.stars + 1) % 6
			conflicts = append(conflicts, componentRequest{body: componentCheckinBody(other), want: http.StatusConflict, field: "checkinId"})
		}
	}
	future := now + int64(time.Hour/time.Millisecond)
	for _, bad := range []struct{ body, field string }{
		{`{"userId":1,"locationId":1,"starRating":6}`, "starRating"},
		{`{"userId":1,"locationId":1,"starRating":-1}`, "starRating"},
		{`{"userId":0,"locationId":1,"starRating":3}`, "userId"},
		{`{"userId":1,"starRating":3}`, "locationId"},
		{`{"userId":1,"locationId":1}`, "starRating"},
		{`{"userId":"7","locationId":1,"starRating":3}`, "userId"},
		{`{"userId":1,"locationId":1,"starRating":3,"timestamp":` + strconv.FormatInt(future, 10) + `}`, "timestamp"},
		{`{"userId":1,"locationId":1,"starRating":3,"checkinId":"has space"}`, "checkinId"},
		{`{"userId":1,"locationId":1,"starRating":3,"colour":"red"}`, "colour"},
		{`{"userId":1,`, ""},
	} {
		reqs = append(reqs, componentRequest{body: bad.body, want: http.StatusBadRequest, field: bad.field})
	}
	t.Logf("sending %d requests (%d distinct valid check-ins, the rest retries and invalid), then %d conflicting reuses of an ID",
		len(reqs), nValid, len(conflicts))
	// Shuffle so a retry may run concurrently with its original.
	rng.Shuffle(len(reqs), func(i, j int) { reqs[i], reqs[j] = reqs[j], reqs[i] })

	var (
		mu           sync.Mutex
		acceptedByID = map[string]componentAccepted{}
	)
	send := func(reqs []componentRequest) {
		jobs := make(chan componentRequest)
		var wg sync.WaitGroup
		for range 8 {
			wg.Go(func() {
				for r := range jobs {
					status, body, err := testPostCheckin(svc.base, r.body, r.header)
					if !assert.NoError(t, err) || !assert.Equal(t, r.want, status, "POST %s -> %v", r.body, body) {
						continue
					}
					if status != http.StatusAccepted {
						errBody, _ := body["error"].(map[string]any)
						assert.NotEmpty(t, errBody["message"], "error body %v", body)
						if r.field != "" {
							assert.Equal(t, r.field, errBody["field"], "error body %v", body)
						}
						continue
					}
					var got componentAccepted
					b, _ := json.Marshal(body)
					assert.NoError(t, json.Unmarshal(b, &got))
					mu.Lock()
					prev, seen := acceptedByID[got.CheckinID]
					acceptedByID[got.CheckinID] = got
					mu.Unlock()
					if seen {
						assert.Equal(t, prev, got, "a retry must return the check-in first accepted")
					}
					if r.sent.id != "" {
						assert.Equal(t, r.sent.id, got.CheckinID)
					}
					assert.Equal(t, r.sent.user, got.UserID)
					assert.Equal(t, r.sent.location, got.LocationID)
					assert.Equal(t, r.sent.stars, got.StarRating)
					if r.sent.timestamp != 0 {
						assert.Equal(t, r.sent.timestamp, got.Timestamp)
					} else {
						assert.Greater(t, got.Timestamp, now-60_000)
					}
				}
			})
		}
		for _, r := range reqs {
			jobs <- r
		}
		close(jobs)
		wg.Wait()
	}
	send(reqs)
	send(conflicts)
	require.False(t, t.Failed(), "requests did not get the expected answers")
	require.Len(t, acceptedByID, nValid)

	// A publisher retry after a lost reply writes the same event twice: copy some entries, as
	// they are, to the end of their stream (partition). They must not be counted again.
	ctx := context.Background()
	copied := 0
	for _, stream := range keys.Partitions().Streams() {
		entries, err := client.XRangeN(ctx, stream, "-", "+", 40).Result()
		require.NoError(t, err)
		for i := 0; i < len(entries); i += 4 {
			require.NoError(t, client.XAdd(ctx, &redis.XAddArgs{Stream: stream, Values: entries[i].Values}).Err())
			copied++
		}
	}
	require.Positive(t, copied)

	type userWant struct{ num, last, lastLoc int64 }
	type locWant struct{ num, stars int64 }
	users := map[int64]userWant{}
	locations := map[int64]locWant{}
	latestID := map[int64]string{}
	for _, c := range acceptedByID {
		u := users[c.UserID]
		u.num++
		// The latest check-in wins; on equal timestamps the greater tie (the read model's
		// deterministic tie-break, RecentCheckin.Tie).
		tie := projection.RecentCheckin{CheckinID: c.CheckinID, LocationID: c.LocationID, StarRating: int(c.StarRating), Timestamp: c.Timestamp}.Tie()
		if c.Timestamp > u.last || (c.Timestamp == u.last && tie > latestID[c.UserID]) {
			u.last, u.lastLoc = c.Timestamp, c.LocationID
			latestID[c.UserID] = tie
		}
		users[c.UserID] = u
		l := locations[c.LocationID]
		l.num++
		l.stars += c.StarRating
		locations[c.LocationID] = l
	}

	require.EventuallyWithT(t, func(c *assert.CollectT) {
		for id, w := range users {
			status, got, err := testGetStats(svc.base, fmt.Sprintf("/users/%d", id))
			if !assert.NoError(c, err) || !assert.Equal(c, http.StatusOK, status, "user %d", id) {
				return
			}
			assert.Equal(c, map[string]int64{"userId": id, "numCheckins": w.num, "lastCheckin": w.last, "lastSeenAt": w.lastLoc}, got, "user %d", id)
		}
		for id, w := range locations {
			status, got, err := testGetStats(svc.base, fmt.Sprintf("/locations/%d", id))
			if !assert.NoError(c, err) || !assert.Equal(c, http.StatusOK, status, "location %d", id) {
				return
			}
			avg := int64(float64(w.stars)/float64(w.num) + 0.5)
			assert.Equal(c, map[string]int64{"locationId": id, "numCheckins": w.num, "numStars": w.stars, "averageStars": avg}, got, "location %d", id)
		}
	}, 90*time.Second, 200*time.Millisecond, "read models must equal the accepted check-ins, each counted once")

	// Nobody checked in there: 404, not zeros.
	status, _, err := testGetStats(svc.base, fmt.Sprintf("/users/%d", nUsers+1))
	require.NoError(t, err)
	assert.Equal(t, http.StatusNotFound, status)

	require.NoError(t, svc.stop(t), "a graceful stop returns nil")
	for _, stream := range keys.Partitions().Streams() {
		groups, err := client.XInfoGroups(ctx, stream).Result()
		require.NoError(t, err)
		require.Len(t, groups, 1, "one consumer group, the live group, feeds every projection (%s)", stream)
		assert.Equal(t, "live", groups[0].Name)
		for _, g := range groups {
			assert.Zero(t, g.Pending, "group %s on %s: a clean shutdown acks everything it handled", g.Name, stream)
		}
	}
}

// TestComponentProjectionsSelectsGroups runs the service with PROJECTIONS=users: its live group,
// named after that set, is the only consumer group, and the locations read model is never written.
func TestComponentProjectionsSelectsGroups(t *testing.T) {
	t.Parallel()
	rdb := redistest.Open(t)
	svc := startInProcess(t, map[string]string{
		"REDIS_URL": rdb.URL, "KEY_PREFIX": rdb.Prefix, "PROJECTIONS": "users",
	}, Mode{API: true, Projections: true})

	status, body, err := testPostCheckin(svc.base, `{"checkinId":"only-users-1","userId":41,"locationId":42,"starRating":4}`, nil)
	require.NoError(t, err)
	require.Equal(t, http.StatusAccepted, status, "%v", body)
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		status, got, err := testGetStats(svc.base, "/users/41")
		if assert.NoError(c, err) && assert.Equal(c, http.StatusOK, status) {
			assert.Equal(c, int64(1), got["numCheckins"])
		}
	}, 30*time.Second, 100*time.Millisecond)

	keys := adapters.KeySpace{Prefix: rdb.Prefix}
	groups, err := redistest.Client(t, rdb.URL).XInfoGroups(context.Background(), keys.Stream()).Result()
	require.NoError(t, err)
	var names []string
	for _, g := range groups {
		names = append(names, g.Name)
	}
	assert.Equal(t, []string{"live:users"}, names)

	status, _, err = testGetStats(svc.base, "/locations/42")
	require.NoError(t, err)
	assert.Equal(t, http.StatusNotFound, status, "the locations projection must not run")

	require.NoError(t, svc.stop(t))
}
