package adapters_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/checkins/checkins/adapters"
	"github.com/checkins/checkins/app/ops"
	"github.com/checkins/checkins/app/projection"
	"github.com/checkins/checkins/domain"
)

// redisNowMs is Redis's clock, as the fenced scripts read it.
func (e projEnv) redisNowMs(t *testing.T) int64 {
	t.Helper()
	now, err := e.client.Time(context.Background()).Result()
	require.NoError(t, err)
	return now.UnixMilli()
}

// TestFencedScriptsWriteNothingPastTheLease: an Apply, a Decide and a Park made with a lease
// Redis's clock has passed (projection.WithLease) are refused with ErrLeaseExpired and leave no
// trace: no read model, no registry entry, no marker, no poison entry. Within the lease they
// write as ever. On a cluster the decide step runs in a script of its own (for every slot), and
// is fenced as well.
func TestFencedScriptsWriteNothingPastTheLease(t *testing.T) {
	eachEnv(t, func(t *testing.T, env projEnv) {
		ctx := context.Background()
		a := env.applier(t, env.client)
		ev := recorded("fenced-1", 7, 9, 4, time.Now().UnixMilli())
		id := entry(ev.RecordedAt)
		works := func() []projection.Work {
			var ws []projection.Work
			for _, p := range []projection.Projection{projection.UserStats{}, projection.LocationStats{}} {
				us, err := projection.Updates(ctx, p, ev)
				require.NoError(t, err)
				ws = append(ws, projection.Work{Group: "g", Projection: p.Name(), Version: 1, Event: projection.RefOf(ev, id), Updates: us})
			}
			return ws
		}

		past := projection.WithLease(ctx, env.redisNowMs(t)-1)
		_, err := a.Apply(past, works(), nil)
		require.ErrorIs(t, err, projection.ErrLeaseExpired)
		_, err = a.Decide(past, []projection.EventRef{projection.RefOf(ev, id)})
		require.ErrorIs(t, err, projection.ErrLeaseExpired)
		q := adapters.NewPoisonQueue(env.client, env.keys)
		_, err = q.Park(past, parkable(ev, id))
		require.ErrorIs(t, err, projection.ErrLeaseExpired)
		assert.Empty(t, keysOf(t, env.client, env.keys.Prefix+"*"), "nothing written past the lease")

		future := projection.WithLease(ctx, env.redisNowMs(t)+time.Minute.Milliseconds())
		out, err := a.Apply(future, works(), nil)
		require.NoError(t, err)
		assert.Equal(t, []projection.Outcome{projection.Applied, projection.Applied}, out)
		assert.Equal(t, int64(1), env.userStats(t, 7).NumCheckins)
		counted, err := a.Decide(future, []projection.EventRef{projection.RefOf(ev, id)})
		require.NoError(t, err)
		assert.Equal(t, []bool{true}, counted, "the counted copy, decided again")
		_, err = q.Park(future, parkable(ev, id))
		require.NoError(t, err)
	})
}

// parkable is ev, read at id, as the poison queue parks it for projection users.
func parkable(ev domain.CheckinRecorded, id string) ops.PoisonEntry {
	return ops.PoisonEntry{Stream: "events", EntryID: id, Fields: ev.Fields(), Projection: "users", Version: 1, Group: "g",
		Error: "failed", Attempts: 1, FailedAt: time.Now()}
}
