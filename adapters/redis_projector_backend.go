package adapters

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"

	"github.com/checkins/checkins/adapters/batchsub"
	"github.com/checkins/checkins/app/ops"
)

// ProjectorBackend is Redis behind the projection router (ports.ProjectorBackend): live-group
// membership and checkpoints, consumer groups' positions, parking in the poison queue, the
// stream entries' format (FlatMarshaller) and Redis's failures.
type ProjectorBackend struct {
	*LiveGroups
	FlatMarshaller
	RedisErrors
	client redis.UniversalClient
	keys   KeySpace
	queue  *PoisonQueue

	msMu    sync.Mutex
	msCache map[string]ops.Membership
}

// NewProjectorBackend works on the keys of keys.
func NewProjectorBackend(client redis.UniversalClient, keys KeySpace) *ProjectorBackend {
	return &ProjectorBackend{LiveGroups: NewLiveGroups(client, keys), client: client, keys: keys,
		queue: NewPoisonQueue(client, keys), msCache: map[string]ops.Membership{}}
}

// LeaseOf is the smallest lease of msgs (batchsub.LeaseUntil): the Redis time from which
// another consumer may have taken one of their entries over. ok is false when none has one (the
// stock subscriber tells none: its writes are not fenced).
func (p *ProjectorBackend) LeaseOf(msgs []*message.Message) (until int64, ok bool) {
	for _, m := range msgs {
		if u, has := batchsub.LeaseUntil(m.Context()); has && (!ok || u < until) {
			until, ok = u, true
		}
	}
	return until, ok
}

// Stream is the event stream's key (the router's topic; with partitions, the subscriber
// subscribes every partition for it: PartitionedSubscriber).
func (p *ProjectorBackend) Stream() string { return p.keys.Stream() }

// Streams are the event stream's partitions (Stream() alone with one).
func (p *ProjectorBackend) Streams() []string { return p.keys.Partitions().Streams() }

// CurrentMembership is group's membership as the registry says now (one HGET per partition),
// parsed again only when it changed: the router reads it once per batch, so that a version
// joining is seen by every batch delivered after its join position.
func (p *ProjectorBackend) CurrentMembership(ctx context.Context, group string) (ops.Membership, error) {
	raws, joins, err := p.hgetEachWithJoins(ctx, liveField+group)
	if err != nil {
		return ops.Membership{}, fmt.Errorf("read the live group's membership: %w", err)
	}
	if len(raws) == 1 && raws[0] == "" {
		raws[0] = "{}"
	}
	key := strings.Join(raws, "\n")
	p.msMu.Lock()
	defer p.msMu.Unlock()
	if ms, ok := p.msCache[group]; ok && ms.Raw == key {
		ms.Joins = joins
		return ms, nil
	}
	ms, err := p.sumMemberships(group, raws)
	if err != nil {
		return ops.Membership{}, err
	}
	ms.Raw = key
	p.msCache[group] = ms
	ms.Joins = joins
	return ms, nil
}

// Positions reads how far every consumer group of the stream got (summed over partitions,
// each partition's in Parts).
func (p *ProjectorBackend) Positions(ctx context.Context) (map[string]ops.GroupPosition, error) {
	return ReadPartitionsProgress(ctx, p.client, p.keys.Partitions())
}

// CreateGroup creates group at start on partition stream unless it exists (a group Redis lost).
func (p *ProjectorBackend) CreateGroup(ctx context.Context, stream, group, start string) error {
	return (&StreamAdmin{client: p.client, stream: stream}).CreateGroup(ctx, group, start)
}

// DedupeFloors: see the function of that name; in partition order. The memberships and the
// moved records are read together: read one after the other, a moved version's join between the
// reads left it in neither, and its own group out of the floors.
func (p *ProjectorBackend) DedupeFloors(ctx context.Context, progress map[string]ops.GroupPosition,
	idleLimit time.Duration, now time.Time) ([]string, bool, error) {
	lives, moved, err := p.ReadLivesAndMoved(ctx)
	if err != nil {
		return nil, false, err
	}
	return DedupeFloors(ctx, p.client, p.Streams(), lives, moved, progress, idleLimit, now)
}

// PoisonEntryOf is the poison entry of the message msg, as far as the message tells: the stream
// and entry it came from, with the entry's exact fields (read back from the stream, or rebuilt
// from the message when that fails), and its correlation ID.
func (p *ProjectorBackend) PoisonEntryOf(ctx context.Context, msg *message.Message) (ops.PoisonEntry, string) {
	e := ops.PoisonEntry{Stream: msg.Metadata.Get(MetaStream), EntryID: msg.Metadata.Get(MetaEntryID)}
	if e.Stream == "" {
		e.Stream = p.keys.Stream()
	}
	fields, err := EntryFields(ctx, p.client, e.Stream, e.EntryID)
	if err != nil {
		fields = messageFields(msg)
	}
	e.Fields = fields
	return e, msg.Metadata.Get(MetaCorrelationID)
}

// Park adds e to the poison queue.
func (p *ProjectorBackend) Park(ctx context.Context, e ops.PoisonEntry) (string, error) {
	return p.queue.Park(ctx, e)
}

// Parked says which of units were parked and their entries not acknowledged since.
func (p *ProjectorBackend) Parked(ctx context.Context, units []ops.UnitRef) ([]bool, error) {
	return p.queue.Parked(ctx, units)
}

// SweepParked drops the records of parked units whose entries are acknowledged
// (PoisonQueue.SweepParked).
func (p *ProjectorBackend) SweepParked(ctx context.Context, cursor uint64, acked func(ops.UnitRef) bool) (uint64, error) {
	return p.queue.SweepParked(ctx, cursor, acked)
}
