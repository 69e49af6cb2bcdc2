package ports

import (
	"context"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/checkins/checkins/app/ops"
	"github.com/checkins/checkins/app/projection"
)

// What the projection router needs from outside, handed in by cmd (adapters implement it with
// Redis): the subscribers that read the stream (ProjectionRouterConfig.NewSubscriber), the
// applier of the projections' updates, and the backend that keeps the router's own state.

// ProjectionApplier applies the projections' updates exactly once per check-in
// (adapters.ProjectionApplier). The router calls Apply once per batch.
type ProjectionApplier interface {
	// Apply applies works (one event's updates of one projection version each) and tells what
	// happened to each; prune lets it drop markers a group will not need again.
	Apply(ctx context.Context, works []projection.Work, prune projection.Prune) ([]projection.Outcome, error)
	// Decide is the dedupe decision for events about to be parked (true: this copy counts).
	Decide(ctx context.Context, events []projection.EventRef) ([]bool, error)
	// Sweep lets go of group's markers below before (a quiet group).
	Sweep(ctx context.Context, group, before string) (int, error)
	// SetRegistryFloors says every group has acknowledged everything up to ids[i] on partition
	// i of the stream.
	SetRegistryFloors(ids []string) error
	// HoldRegistryFloors forgets the floors until the next SetRegistryFloors (no registry is
	// pruned meanwhile): a backfill is about to register identities far below them.
	HoldRegistryFloors()
	// FloorsGeneration counts the holds; SetRegistryFloorsAt sets floors unless a hold came
	// after the generation its caller read before computing them.
	FloorsGeneration() uint64
	SetRegistryFloorsAt(gen uint64, ids []string) error
	// SweepRegistries lets go of what the dedupe registries written since its last call hold
	// below the window before the floors (every group quiet).
	SweepRegistries(ctx context.Context) (int, error)
	// Window is the dedupe window.
	Window() time.Duration
}

// ProjectorBackend keeps what the router shares with other projectors and the ops use cases
// (adapters.ProjectorBackend).
type ProjectorBackend interface {
	// Stream is the event stream the router consumes (its topic).
	Stream() string
	// Streams are its partitions (Stream() alone when it has one): each has its own consumer
	// groups, join positions and checkpoints, and messages name theirs (EntryStream).
	Streams() []string

	// Live groups: which projection versions each feeds, from which position.
	Read(ctx context.Context, group string) (ops.Membership, error)
	ReadAll(ctx context.Context) (map[string]ops.Membership, map[string]string, error)
	Join(ctx context.Context, group, member string) (ops.Membership, error)
	FinishBackfill(ctx context.Context, group, member string, at time.Time) (bool, error)
	// FinishBackfillOn is FinishBackfill on one partition.
	FinishBackfillOn(ctx context.Context, stream, group, member string, at time.Time) (bool, error)
	// CurrentMembership is Read made cheap enough for every batch.
	CurrentMembership(ctx context.Context, group string) (ops.Membership, error)

	// Consumer groups: where each acknowledged through (checkpoints), where each is now.
	// Checkpoints records group's positions on several partitions (stream -> acked through) at
	// once.
	Checkpoints(ctx context.Context, group string, acked map[string]string) error
	Acked(ctx context.Context, stream, group string) (string, error)
	// Positions are summed over partitions, each partition's in GroupPosition.Parts.
	Positions(ctx context.Context) (map[string]ops.GroupPosition, error)
	CreateGroup(ctx context.Context, stream, group, start string) error
	// DedupeFloors is, per partition in partition order, the position below which no group
	// will decide an event of that partition again.
	// It reads the live groups' memberships itself, with the moved versions, in one view.
	DedupeFloors(ctx context.Context, progress map[string]ops.GroupPosition, idleLimit time.Duration, now time.Time) ([]string, bool, error)

	// The poison queue: the entry a message came from, parked with the reason.
	PoisonEntryOf(ctx context.Context, msg *message.Message) (entry ops.PoisonEntry, correlationID string)
	Park(ctx context.Context, e ops.PoisonEntry) (string, error)
	// Parked says which of units were parked and their entries not acknowledged since;
	// SweepParked drops, a page from cursor at a time, the records of those whose entries acked
	// says are acknowledged, and returns the next page's cursor (0: done).
	Parked(ctx context.Context, units []ops.UnitRef) ([]bool, error)
	SweepParked(ctx context.Context, cursor uint64, acked func(ops.UnitRef) bool) (uint64, error)

	// DecodeEntries decodes a batch of the subscribers' messages (once per batch).
	DecodeEntries(msgs []*message.Message, out []projection.Entry)
	// LeaseOf is the smallest lease of the subscriber's messages msgs: the Redis time (ms) from
	// which another consumer of the group may have taken one of their entries over, and what
	// is written for them must not land (projection.WithLease). ok is false when none has one.
	LeaseOf(msgs []*message.Message) (until int64, ok bool)

	// TransientReason classifies the backend's failures (ops.Failures).
	TransientReason(err error) (reason string, ok bool)
}
