package adapters

import (
	"context"
	"errors"

	"github.com/redis/go-redis/v9"

	"github.com/checkins/checkins/app/ops"
)

// NewOpsBackend is Redis behind the ops use cases: the event stream, the projections registry,
// live groups, the poison queue, projection keys and the stall check's observations under keys.
func NewOpsBackend(client redis.UniversalClient, keys KeySpace) ops.Backend {
	return ops.Backend{
		Stream:       NewStreamAdmin(client, keys),
		Registry:     NewProjectionVersions(client, keys),
		Live:         NewLiveGroups(client, keys),
		Poison:       NewPoisonQueue(client, keys),
		Keys:         NewProjectionKeys(client, keys),
		Observations: NewProgressObservations(client, keys),
		Failures:     RedisErrors{},
		Migration:    migrationFlag{client: client, keys: keys},
		Records:      NewIdempotencyRecords(client, keys),
	}
}

// migrationFlag reads the quiesce flag a partition migration sets in <prefix>:meta.
type migrationFlag struct {
	client redis.UniversalClient
	keys   KeySpace
}

func (m migrationFlag) Running(ctx context.Context) (string, error) {
	v, err := m.client.HGet(ctx, m.keys.Meta(), metaQuiesce).Result()
	if errors.Is(err, redis.Nil) {
		return "", nil
	}
	return v, err
}
