package ports_test

import (
	"context"
	"errors"
	"log/slog"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/checkins/checkins/adapters"
	"github.com/checkins/checkins/adapters/redistest"
	"github.com/checkins/checkins/app/ops"
	"github.com/checkins/checkins/app/projection"
	"github.com/checkins/checkins/ports"
)

// joinBarrier lets both projectors read the registry (the conflict check) before either joins.
type joinBarrier struct {
	ports.ProjectorBackend
	wg *sync.WaitGroup
}

func (b joinBarrier) Join(ctx context.Context, group, member string) (ops.Membership, error) {
	b.wg.Done()
	b.wg.Wait()
	return b.ProjectorBackend.Join(ctx, group, member)
}

// TestLiveGroupConflictIsCheckedInTheJoin: two projectors whose PROJECTIONS share "users" (say
// serve with every projection, "live", and project --projections users, "live:users") start at
// once on a new deployment. join() read every membership (ReadAll), found users.v1 in no other
// group, then joined (joinLua); the check and the join were two steps, so both passed the check
// and users.v1 became a member of both live groups, fed twice (each group has its own applied
// markers, and the registry's decision is the same for the same copy): every check-in counted
// twice. Now the join's script checks the other groups too: one of the two is refused with
// ErrLiveGroupConflict. (The barrier holds both joins until both have read the registry.)
func TestLiveGroupConflictIsCheckedInTheJoin(t *testing.T) {
	t.Parallel()
	env := redistest.Open(t)
	keys := adapters.KeySpace{Prefix: env.Prefix}
	client := redistest.Client(t, env.URL)
	ctx := context.Background()
	p := newFaulty("users", nil)
	var wg sync.WaitGroup
	wg.Add(2)
	logs := &syncBuffer{}
	log := slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
	errs := make(chan error, 2)
	var routers []*ports.ProjectionRouter
	for i, group := range []string{"live", "live:users"} {
		newSub := adapters.Subscribers{Kind: "batched", NewClient: func() (redis.UniversalClient, error) { return redistest.Client(t, env.URL), nil },
			Consumer: "c" + strconv.Itoa(i), BatchSize: 50, MaxInFlight: 100, BlockTime: 50 * time.Millisecond, NackDelay: 100 * time.Millisecond,
			ClaimInterval: time.Second, ClaimIdle: 5 * time.Second, DrainTimeout: 5 * time.Second, Logger: watermill.NewSlogLogger(log)}.New
		r, err := ports.NewProjectionRouter(ports.ProjectionRouterConfig{
			Projections: []projection.Projection{p}, LiveGroup: group,
			Backend: joinBarrier{adapters.NewProjectorBackend(client, keys), &wg}, Applier: testApplier(t, client, keys), NewSubscriber: newSub,
			Retry:          ports.RetryPolicy{InitialInterval: 10 * time.Millisecond, Multiplier: 2, MaxInterval: 50 * time.Millisecond, MaxAttempts: 3},
			HandlerTimeout: 10 * time.Second, CloseTimeout: 10 * time.Second, Logger: log,
		})
		require.NoError(t, err)
		routers = append(routers, r)
	}
	for _, r := range routers {
		go func() {
			_, _, err := r.SetTargets(ctx, []ops.ProjectionTarget{{Projection: p, Version: 1}})
			errs <- err
		}()
	}
	var conflicts int
	for range 2 {
		if err := <-errs; errors.Is(err, ports.ErrLiveGroupConflict) {
			conflicts++
		} else {
			require.NoError(t, err)
		}
	}
	all, _, err := adapters.NewLiveGroups(client, keys).ReadAll(ctx)
	require.NoError(t, err)
	var in []string
	for g, ms := range all {
		if _, ok := ms.Members["users.v1"]; ok {
			in = append(in, g)
		}
	}
	assert.Equal(t, 1, conflicts, "one of the two projectors is refused with ErrLiveGroupConflict")
	assert.Len(t, in, 1, "users.v1 is fed by one live group only; it is a member of %v", in)
}
