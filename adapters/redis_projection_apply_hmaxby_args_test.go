package adapters_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/checkins/checkins/adapters"
	"github.com/checkins/checkins/app/projection"
)

// TestOpArgsBeyondTheirShapeAreRefused: an hmaxby op with an odd number of args beyond its four
// passed Validate (which checked "at least 4"), and the call sent every arg while the script
// read 4+2*((len-4)/2) of them: every number after it in the call was read one place off. The
// item's marker landed with its next op lost for good, and another user's check-in later in the
// same call failed (found by a review). Now Validate refuses it, and Apply with it, before
// anything is sent; so does it an op with args beyond its arity, which were dropped unseen.
func TestOpArgsBeyondTheirShapeAreRefused(t *testing.T) {
	t.Parallel()
	env := newProjEnv(t)
	a := env.applier(t, env.client)
	ctx := context.Background()

	odd := projection.NewUpdate("user:1")
	odd.Ops = append(odd.Ops,
		projection.Op{Kind: projection.OpHMaxBy, Keys: []string{"m"}, Args: []string{"v", "5", "tie", "a", "stray"}},
		projection.Op{Kind: projection.OpHIncrBy, Keys: []string{"c"}, Args: []string{"n", "1"}})
	require.ErrorContains(t, adapters.Validate("odd", odd), "hmaxby of m takes field-value pairs after its first four args, got 5 args")
	extra := projection.NewUpdate("user:1").HIncrBy("c", "n", 1)
	extra.Ops[0].Args = append(extra.Ops[0].Args, "stray")
	require.ErrorContains(t, adapters.Validate("extra", extra), "op hincrby of c takes 2 args, got 3")
	pairs := projection.NewUpdate("user:1").HMaxBy("m", "v", 5, "tie", "a", "other", "b")
	require.NoError(t, adapters.Validate("pairs", pairs), "hmaxby with whole pairs")

	ev1 := recorded("ck-odd-1", 1, 1, 1, 1_700_000_000_000)
	ev2 := recorded("ck-odd-2", 2, 1, 1, 1_700_000_000_001)
	works := []projection.Work{
		{Group: "g", Projection: "odd", Version: 1, Event: projection.RefOf(ev1, entry(1_700_000_000_000)), Updates: []*projection.Update{odd}},
		userWork(t, "g", ev2, entry(1_700_000_000_001)),
	}
	_, err := a.Apply(ctx, works, nil)
	require.ErrorContains(t, err, "hmaxby of m takes field-value pairs")
	assert.Empty(t, keysOf(t, env.client, env.keys.Prefix+":*"), "nothing was written")

	// The same call without the bad update applies both.
	works[0].Updates = []*projection.Update{pairs}
	out, err := a.Apply(ctx, works, nil)
	require.NoError(t, err)
	assert.Equal(t, []projection.Outcome{projection.Applied, projection.Applied}, out)
	assert.Equal(t, map[string]string{"v": "5", "tie": "a", "other": "b"}, env.client.HGetAll(ctx, env.keys.ProjectionKey("odd", 1, "user:1", "m")).Val())
	assert.Equal(t, "1", env.client.HGet(ctx, env.keys.ProjectionKey("users", 1, "user:2", "stats"), "numCheckins").Val())
}
