package ports_test

import (
	"context"
	"errors"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/checkins/checkins/adapters"
	"github.com/checkins/checkins/adapters/redistest"
	"github.com/checkins/checkins/app/projection"
	"github.com/checkins/checkins/ports"
)

// freezer stands a process's subscriber connections still while frozen: every command waits
// (the keep that renews its entries, its reads, its XACKs), as in a process under SIGSTOP.
type freezer struct {
	mu     sync.Mutex
	frozen chan struct{} // nil: running; else closed when thawed
}

func (f *freezer) freeze() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.frozen == nil {
		f.frozen = make(chan struct{})
	}
}

func (f *freezer) thaw() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.frozen != nil {
		close(f.frozen)
		f.frozen = nil
	}
}

func (f *freezer) wait(ctx context.Context) {
	f.mu.Lock()
	ch := f.frozen
	f.mu.Unlock()
	if ch != nil {
		select {
		case <-ch:
		case <-ctx.Done():
		}
	}
}

func (f *freezer) DialHook(next redis.DialHook) redis.DialHook { return next }
func (f *freezer) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		f.wait(ctx)
		return next(ctx, cmd)
	}
}
func (f *freezer) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		f.wait(ctx)
		return next(ctx, cmds)
	}
}

// stallingApplier freezes its process at its first Apply with works, before anything is sent
// (or, with afterApply, right after the first Apply landed, before its entries are acked),
// until resume: the process stood still in the middle of a batch.
type stallingApplier struct {
	*adapters.ProjectionApplier
	f          *freezer
	afterApply bool
	armed      atomic.Bool
	stalled    chan struct{} // closed when it stands still
	resume     chan struct{} // closed to go on
	refused    atomic.Int32  // Apply calls refused for the lease
}

func newStallingApplier(real *adapters.ProjectionApplier, f *freezer, afterApply bool) *stallingApplier {
	a := &stallingApplier{ProjectionApplier: real, f: f, afterApply: afterApply, stalled: make(chan struct{}), resume: make(chan struct{})}
	a.armed.Store(true)
	return a
}

func (a *stallingApplier) Apply(ctx context.Context, works []projection.Work, prune projection.Prune) ([]projection.Outcome, error) {
	stall := len(works) > 0 && a.armed.CompareAndSwap(true, false)
	if stall && !a.afterApply {
		a.standStill()
	}
	out, err := a.ProjectionApplier.Apply(ctx, works, prune)
	if errors.Is(err, projection.ErrLeaseExpired) {
		a.refused.Add(1)
	}
	if stall && a.afterApply {
		a.standStill()
	}
	return out, err
}

func (a *stallingApplier) standStill() {
	a.f.freeze()
	close(a.stalled)
	<-a.resume
}

// fencingRun is one stall scenario: process a stands still holding entry "held" longer than
// CLAIM_IDLE, process b takes it over, and a moves again.
type fencingRun struct {
	*takeoverRun
	a         *stallingApplier
	f         *freezer
	heldID    string
	counted   *faultyProjection
	claimIdle time.Duration
	seen      *transientSeen
}

const fencingClaimIdle = time.Second

func newFencingRun(t *testing.T, afterApply bool, claimIdle time.Duration) *fencingRun {
	env := redistest.Open(t)
	keys := adapters.KeySpace{Prefix: env.Prefix}
	counted := newFaulty("counted", nil)
	r := &fencingRun{
		takeoverRun: &takeoverRun{t: t, ctx: context.Background(), env: env, keys: keys, client: redistest.Client(t, env.URL),
			log: slog.New(slog.DiscardHandler), kind: adapters.SubscriberBatched, projs: []projection.Projection{counted}},
		f: &freezer{}, counted: counted,
	}
	real, err := adapters.NewProjectionApplier(r.client, keys, 0)
	require.NoError(t, err)
	r.a = newStallingApplier(real.PruneEvery(1), r.f, afterApply)
	t.Cleanup(r.f.thaw)
	t.Cleanup(func() {
		select {
		case <-r.a.resume:
		default:
			close(r.a.resume)
		}
	})
	r.claimIdle = claimIdle
	r.seen = &transientSeen{}
	r.observer = r.seen // every router of the run
	t.Cleanup(r.startWith("a", r.a, claimIdle, func(c *redis.Client) { c.AddHook(r.f) }))
	r.h = &harness{t: t, keys: keys, client: r.client, proj: counted}
	r.heldID = r.h.add("held", 4)
	select {
	case <-r.a.stalled:
	case <-time.After(15 * time.Second):
		t.Fatal("process a never got to apply the entry")
	}
	return r
}

// takeOver starts process b (the same CLAIM_IDLE) and waits until it took the held entry over,
// applied it and acknowledged it, and then until its later batches pruned the held entry's
// marker, as a live group does once it has acknowledged past an entry: from then on only the
// registry's decision is left, and it counts the copy that was counted when it comes again.
func (r *fencingRun) takeOver(b ports.ProjectionApplier) {
	t := r.t
	t.Cleanup(r.start("b", b, r.claimIdle))
	require.Eventually(t, func() bool {
		p, err := r.client.XPending(r.ctx, r.keys.Stream(), ports.LiveGroupName(nil, true)).Result()
		return err == nil && p.Count == 0 && r.countOf("counted") == 1
	}, 20*time.Second, 20*time.Millisecond, "b takes the held entry over, applies it and acknowledges it")
	held, ok := adapters.ScoreOfEntry(r.heldID)
	require.True(t, ok)
	marker := r.keys.MarkerKey(ports.LiveGroupName(nil, true), "user:1")
	for i := 0; ; i++ {
		n, err := r.client.ZCount(r.ctx, marker, "-inf", strconv.FormatInt(held+1023, 10)).Result()
		require.NoError(t, err)
		if n == 0 {
			break
		}
		require.Less(t, i, 100, "b's batches prune the held entry's marker")
		r.h.add("later-"+strconv.Itoa(i), 3)
		want := int64(i + 2)
		require.Eventually(t, func() bool { return r.countOf("counted") == want }, 10*time.Second, 10*time.Millisecond)
		time.Sleep(2 * ports.DefaultCheckpointInterval)
	}
}

// resumeA lets process a move again: its connections first, then the Apply it stood still in.
func (r *fencingRun) resumeA() {
	r.f.thaw()
	close(r.a.resume)
}

// TestStalledProjectorWritesNothingForEntriesTakenOver: a projector stood still (SIGSTOP, a
// paused VM) longer than CLAIM_IDLE after it read an entry and before its script call went out.
// Another projector took the entry over, applied it and acknowledged it, and pruned its marker.
// When the first moved again its call landed: the registry said the copy was the counted one,
// no marker said it was applied, so the check-in was counted twice. Now every message carries
// the lease its subscriber holds on the entry, and the apply script refuses to write once
// Redis's clock has passed it; the subscriber then finds the entry is another's and lets it go.
func TestStalledProjectorWritesNothingForEntriesTakenOver(t *testing.T) {
	t.Parallel()
	r := newFencingRun(t, false, fencingClaimIdle)
	r.takeOver(testApplierPruning(t, r.client, r.keys))
	want := r.countOf("counted")

	r.resumeA()
	require.Eventually(t, func() bool { return r.a.refused.Load() > 0 || r.countOf("counted") != want }, 10*time.Second, 10*time.Millisecond,
		"a's apply goes out")
	require.Equal(t, want, r.countOf("counted"), "the check-in a stood still on is counted once")
	assert.Never(t, func() bool { return r.countOf("counted") != want }, 3*time.Second, 50*time.Millisecond,
		"the check-in a stood still on is counted once")
	assert.Equal(t, 1, int(r.a.refused.Load()), "a's apply is refused, and a lets the entry go: it does not try it again and again")
	assert.Contains(t, r.seen.reasons(), "live: "+ports.ReasonLeaseExpired, "a's refusal is counted (checkins_projection_transient_failures_total)")
	p, err := r.client.XPending(r.ctx, r.keys.Stream(), ports.LiveGroupName(nil, true)).Result()
	require.NoError(t, err)
	assert.Zero(t, p.Count, "nothing is left pending")

	// a is alive and well afterwards: it applies what it reads.
	r.h.add("after", 5)
	require.Eventually(t, func() bool { return r.countOf("counted") == want+1 }, 10*time.Second, 10*time.Millisecond)
}

// TestStalledProjectorThatKeptItsEntriesAppliesThem: a projector stood still longer than
// CLAIM_IDLE, and no other projector was there to take its entry over. Its first call after is
// refused (the lease ran out), but the entry is still its own: the subscriber renews the lease
// and the entry is applied, once, without waiting for a takeover.
func TestStalledProjectorThatKeptItsEntriesAppliesThem(t *testing.T) {
	t.Parallel()
	r := newFencingRun(t, false, fencingClaimIdle)
	time.Sleep(fencingClaimIdle + 200*time.Millisecond)
	r.resumeA()
	require.Eventually(t, func() bool { return r.countOf("counted") == 1 }, 10*time.Second, 10*time.Millisecond,
		"the entry is applied after its lease is renewed")
	assert.Equal(t, 1, int(r.a.refused.Load()), "the call made past the lease is refused")
	require.Eventually(t, func() bool {
		p, err := r.client.XPending(r.ctx, r.keys.Stream(), ports.LiveGroupName(nil, true)).Result()
		return err == nil && p.Count == 0
	}, 10*time.Second, 10*time.Millisecond, "and acknowledged")
	assert.Never(t, func() bool { return r.countOf("counted") != 1 }, time.Second, 50*time.Millisecond)
}

// TestStalledProjectorDoesNotAcknowledgeEntriesTakenOver: a projector applied an entry and stood
// still before its XACK went out, longer than CLAIM_IDLE. Another took the entry over, and its
// apply was slow (within its lease). The first moved again and its XACK landed: the entry was
// no longer pending, the group's markers were pruned past it, and the second's apply counted it
// again. Now an XACK past the lease acknowledges only the entries still pending to the consumer
// that sends it.
func TestStalledProjectorDoesNotAcknowledgeEntriesTakenOver(t *testing.T) {
	t.Parallel()
	const claimIdle = 3 * time.Second // b's lease outlasts what happens while its apply waits
	r := newFencingRun(t, true, claimIdle)
	require.Equal(t, int64(1), r.countOf("counted"), "a applied the entry before it stood still")

	// c will apply later check-ins and prune the markers as far as the group has acknowledged.
	t.Cleanup(r.start("c", testApplierPruning(t, r.client, r.keys), time.Hour))
	// b takes the entry over and waits in its apply, its lease in hand (b's process runs on).
	realB, err := adapters.NewProjectionApplier(r.client, r.keys, 0)
	require.NoError(t, err)
	b := newStallingApplier(realB.PruneEvery(1), &freezer{}, false)
	t.Cleanup(func() {
		select {
		case <-b.resume:
		default:
			close(b.resume)
		}
	})
	t.Cleanup(r.start("b", b, claimIdle))
	select {
	case <-b.stalled:
	case <-time.After(20 * time.Second):
		t.Fatal("b never took the entry over")
	}

	// a moves again: its XACK goes out, past its lease. The group goes on.
	r.resumeA()
	r.h.add("later-1", 3)
	require.Eventually(t, func() bool { return r.countOf("counted") == 2 }, 5*time.Second, 10*time.Millisecond)
	time.Sleep(2 * ports.DefaultCheckpointInterval)
	r.h.add("later-2", 3)
	require.Eventually(t, func() bool { return r.countOf("counted") == 3 }, 5*time.Second, 10*time.Millisecond)
	p, err := r.client.XPendingExt(r.ctx, &redis.XPendingExtArgs{Stream: r.keys.Stream(), Group: ports.LiveGroupName(nil, true),
		Start: "-", End: "+", Count: 10}).Result()
	require.NoError(t, err)
	pendingTo := ""
	for _, e := range p {
		if e.ID == r.heldID {
			pendingTo = e.Consumer
		}
	}
	require.NotEmpty(t, pendingTo, "the held entry is still pending (%v)", p)
	assert.NotEqual(t, "a", pendingTo, "to b")

	// b's apply goes on: the marker a wrote is still there.
	close(b.resume)
	require.Eventually(t, func() bool {
		p, err := r.client.XPending(r.ctx, r.keys.Stream(), ports.LiveGroupName(nil, true)).Result()
		return err == nil && p.Count == 0
	}, 10*time.Second, 10*time.Millisecond, "b acknowledges it")
	assert.Zero(t, b.refused.Load(), "b applied within its lease")
	assert.Never(t, func() bool { return r.countOf("counted") != 3 }, time.Second, 50*time.Millisecond,
		"every check-in counted once")
}

// transientSeen records ProjectionObserver.Transient calls as "group: reason".
type transientSeen struct {
	mu   sync.Mutex
	seen []string
}

func (o *transientSeen) Handled(string, string, int, time.Duration) {}
func (o *transientSeen) Transient(group, reason string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.seen = append(o.seen, group+": "+reason)
}
func (o *transientSeen) reasons() []string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return append([]string(nil), o.seen...)
}

// testApplierPruning is a test applier that prunes the markers in every call.
func testApplierPruning(t *testing.T, client redis.UniversalClient, keys adapters.KeySpace) *adapters.ProjectionApplier {
	return testApplier(t, client, keys).PruneEvery(1)
}

// stallBeforeParking runs the park scenario: projection "faulty" fails an entry on every attempt
// of process a, which stands still (frozen) in its last attempt, before it parks, longer than
// CLAIM_IDLE; process b takes the entry over, where the failure is gone, and counts it. a runs
// applierA (made on the run's client); the returned resume lets a move again.
func stallBeforeParking(t *testing.T, applierA func(redis.UniversalClient, adapters.KeySpace) ports.ProjectionApplier) (r *takeoverRun, resume func()) {
	env := redistest.Open(t)
	keys := adapters.KeySpace{Prefix: env.Prefix}
	f := &freezer{}
	stalled, moveOn := make(chan struct{}), make(chan struct{})
	var once sync.Once
	resume = func() {
		once.Do(func() {
			f.thaw()
			close(moveOn)
		})
	}
	t.Cleanup(resume)
	faulty := newFaulty("faulty", func(_ context.Context, _ string, attempt int) error {
		if attempt > takeoverRetries {
			return nil // the failure is gone by the time another projector takes the entry
		}
		if attempt == takeoverRetries { // a's last attempt: it stands still before it parks
			f.freeze()
			close(stalled)
			<-moveOn
		}
		return errors.New("intermittent failure in the projection")
	})
	r = &takeoverRun{t: t, ctx: context.Background(), env: env, keys: keys, client: redistest.Client(t, env.URL),
		log: slog.New(slog.DiscardHandler), kind: adapters.SubscriberBatched, projs: []projection.Projection{faulty}}
	r.h = &harness{t: t, keys: keys, client: r.client, proj: faulty}
	t.Cleanup(r.startWith("a", applierA(r.client, keys), fencingClaimIdle, func(c *redis.Client) { c.AddHook(f) }))
	r.h.add("held", 4)
	select {
	case <-stalled:
	case <-time.After(15 * time.Second):
		t.Fatal("a never got to its last attempt")
	}
	t.Cleanup(r.start("b", testApplier(t, r.client, keys), fencingClaimIdle))
	require.Eventually(t, func() bool {
		p, err := r.client.XPending(r.ctx, keys.Stream(), ports.LiveGroupName(nil, true)).Result()
		return err == nil && p.Count == 0 && r.countOf("faulty") == 1
	}, 20*time.Second, 20*time.Millisecond, "b takes the entry over and counts it")
	return r, resume
}

// TestStalledProjectorParksNothingForEntriesTakenOver: a projector's handler failed an entry on
// every attempt, and the process stood still before parking it, longer than CLAIM_IDLE. Another
// projector took the entry over, where the failure was gone, and counted it. When the first
// moved again it parked the entry: the poison queue held a check-in that was counted, and its
// replay would count it again. Now the park is fenced like the apply.
func TestStalledProjectorParksNothingForEntriesTakenOver(t *testing.T) {
	t.Parallel()
	r, resume := stallBeforeParking(t, func(c redis.UniversalClient, keys adapters.KeySpace) ports.ProjectionApplier {
		return testApplier(t, c, keys)
	})
	resume()
	assert.Never(t, func() bool { return len(r.h.poison()) > 0 }, 3*time.Second, 50*time.Millisecond,
		"a parks nothing: the entry was b's, and counted")
	assert.Equal(t, int64(1), r.countOf("faulty"))
}

// decideRecorder records whether each Decide call carried a lease.
type decideRecorder struct {
	*adapters.ProjectionApplier
	mu       sync.Mutex
	unleased int
}

func (d *decideRecorder) Decide(ctx context.Context, es []projection.EventRef) ([]bool, error) {
	if _, ok := projection.LeaseOf(ctx); !ok {
		d.mu.Lock()
		d.unleased++
		d.mu.Unlock()
	}
	return d.ProjectionApplier.Decide(ctx, es)
}

// TestStalledProjectorDecidesNothingBeforeParking: the decide step is fenced so that a projector
// past its lease does not write the registry (or prune it with floors read before it stood
// still), but the poison path (ProjectionRouter.decision, before Park) called Applier.Decide
// without the lease: a stalled projector about to park still ran the decide script unfenced,
// after the entry was taken over (Park itself was then refused). Now the decision is made under
// the lease the park is. (Found by a review helper.)
func TestStalledProjectorDecidesNothingBeforeParking(t *testing.T) {
	t.Parallel()
	var rec *decideRecorder
	r, resume := stallBeforeParking(t, func(c redis.UniversalClient, keys adapters.KeySpace) ports.ProjectionApplier {
		rec = &decideRecorder{ProjectionApplier: testApplier(t, c, keys)}
		return rec
	})
	resume()
	time.Sleep(3 * time.Second)
	assert.Empty(t, r.h.poison())
	rec.mu.Lock()
	defer rec.mu.Unlock()
	assert.Zero(t, rec.unleased, "Decide calls a made without the entry's lease (the decide script runs unfenced past it)")
}
