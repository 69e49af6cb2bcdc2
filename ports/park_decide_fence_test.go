package ports_test

import (
	"context"
	"errors"
	"log/slog"
	"sync"
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
	env := redistest.Open(t)
	keys := adapters.KeySpace{Prefix: env.Prefix}
	f := &freezer{}
	stalled, resume := make(chan struct{}), make(chan struct{})
	t.Cleanup(f.thaw)
	t.Cleanup(func() {
		select {
		case <-resume:
		default:
			close(resume)
		}
	})
	faulty := newFaulty("faulty", func(_ context.Context, _ string, attempt int) error {
		if attempt > takeoverRetries {
			return nil
		}
		if attempt == takeoverRetries {
			f.freeze()
			close(stalled)
			<-resume
		}
		return errors.New("intermittent failure in the projection")
	})
	r := &takeoverRun{t: t, ctx: context.Background(), env: env, keys: keys, client: redistest.Client(t, env.URL),
		log: slog.New(slog.DiscardHandler), kind: adapters.SubscriberBatched, projs: []projection.Projection{faulty}}
	r.h = &harness{t: t, keys: keys, client: r.client, proj: faulty}
	rec := &decideRecorder{ProjectionApplier: testApplier(t, r.client, keys)}
	t.Cleanup(r.startWith("a", rec, fencingClaimIdle, func(c *redis.Client) { c.AddHook(f) }))
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
	f.thaw()
	close(resume)
	time.Sleep(3 * time.Second)
	assert.Empty(t, r.h.poison())
	rec.mu.Lock()
	defer rec.mu.Unlock()
	assert.Zero(t, rec.unleased, "Decide calls a made without the entry's lease (the decide script runs unfenced past it)")
}
