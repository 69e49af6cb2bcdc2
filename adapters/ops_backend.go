package adapters

import (
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
	}
}
