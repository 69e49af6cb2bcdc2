package adapters

import (
	"context"

	"github.com/redis/go-redis/v9"

	"github.com/checkins/checkins/app/ops"
)

// ProgressObservations keep what every consumer group looked like and since when
// (ops.Observations), in the hash <prefix>:projections:progress, so that every process and the
// CLI judge stalls from the same observations.
type ProgressObservations struct {
	client redis.UniversalClient
	key    string
}

var _ ops.Observations = (*ProgressObservations)(nil)

// NewProgressObservations works on keys' progress hash.
func NewProgressObservations(client redis.UniversalClient, keys KeySpace) *ProgressObservations {
	return &ProgressObservations{client: client, key: keys.Progress()}
}

// Progress is the hash of the stall check's observations, by consumer group. Only ever used
// alone, so it keeps its name on a cluster too.
func (k KeySpace) Progress() string { return k.Prefix + ":projections:progress" }

// Observed is HMGET of groups ("" for a group never observed).
func (o *ProgressObservations) Observed(ctx context.Context, groups []string) ([]string, error) {
	vals, err := o.client.HMGet(ctx, o.key, groups...).Result()
	if err != nil {
		return nil, err
	}
	out := make([]string, len(vals))
	for i, v := range vals {
		out[i], _ = v.(string)
	}
	return out, nil
}

// Observe stores group's observation.
func (o *ProgressObservations) Observe(ctx context.Context, group, observation string) error {
	return o.client.HSet(ctx, o.key, group, observation).Err()
}

// Forget drops group's observation.
func (o *ProgressObservations) Forget(ctx context.Context, group string) error {
	return o.client.HDel(ctx, o.key, group).Err()
}
