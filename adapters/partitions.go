package adapters

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/checkins/checkins/app/projection"
)

// How the event stream is split into partitions:
//
//   - P = 1 is one stream, <prefix>:events, exactly the key of a service without partitions (the
//     default on a single Redis server).
//   - P > 1: partition i is <prefix>:events:<i>:{<tag i>}. The hash tag, the key's first {...},
//     decides the slot, and so the master. Tags are chosen so the P partitions fall on evenly
//     spaced slots: partition i aims at the middle of the i-th P-th of the slot space,
//     target(i) = floor((2i+1) * 16384 / (2P)), and takes the tag of the slot nearest to it
//     (the lower one on a tie) among the tags not taken by a partition before it. A slot's tag
//     is its first string in shortlex order over [0-9a-z] (one to three characters: they reach
//     16299 of the 16384 slots, always within a few slots of a target). A cluster whose M masters
//     split the slots evenly (as redis-cli --cluster create and rebalance do) then holds P/M
//     partitions on every master when M divides P, where the naive {p00}..{p23} put 6/8/10 on 3
//     masters. 24 (DefaultClusterPartitions) divides by 1, 2, 3, 4, 6, 8, 12 and 24 masters.
//   - A check-in goes to partition PartitionOf(userId, P): FNV-1a (64 bits) of the userId in
//     decimal, mod P. Stable across processes, versions and languages, so one user's check-ins
//     stay in one partition, in order.
//   - P is recorded in <prefix>:meta (field "partitions") when the stream is first created, and a
//     process configured with another P refuses to start (EnsurePartitions).

// Partition counts.
const (
	DefaultClusterPartitions = 24
	MaxPartitions            = 1024
	slotCount                = projection.SlotCount
)

// Partitions names the P streams of the event log.
type Partitions struct {
	streams []string
	// registries hold each partition's live groups and acknowledged positions, in the
	// partition's slot: <prefix>:projections with one stream (the projections registry itself),
	// <prefix>:projections:<i>:{<tag i>} with more.
	registries []string
	tags       []string // the partitions' hash tags (nil with one stream)
}

// NewPartitions lays out p partitions under keys' prefix.
func NewPartitions(keys KeySpace, p int) (Partitions, error) {
	if p < 1 || p > MaxPartitions {
		return Partitions{}, fmt.Errorf("partitions must be between 1 and %d, got %d", MaxPartitions, p)
	}
	if keys.Prefix == "" || strings.ContainsAny(keys.Prefix, "{}") {
		return Partitions{}, fmt.Errorf("key prefix %q must be non-empty and without braces: a brace would make it the hash tag of every key", keys.Prefix)
	}
	if p == 1 {
		return Partitions{streams: []string{keys.Stream()}, registries: []string{keys.Projections()}}, nil
	}
	tags := PartitionTags(p)
	streams, registries := make([]string, p), make([]string, p)
	for i, tag := range tags {
		streams[i] = keys.Stream() + ":" + strconv.Itoa(i) + ":{" + tag + "}"
		registries[i] = keys.Prefix + ":projections:" + strconv.Itoa(i) + ":{" + tag + "}"
	}
	return Partitions{streams: streams, registries: registries, tags: tags}, nil
}

// Registry is the hash of partition i's live groups and acknowledged positions, in the slot of
// partition i's stream (so that joining reads the registry and creates the partition's groups
// in one script).
func (p Partitions) Registry(i int) string { return p.registries[i] }

// Index is the partition of stream (-1 when it is none of them).
func (p Partitions) Index(stream string) int {
	for i, s := range p.streams {
		if s == stream {
			return i
		}
	}
	return -1
}

// base is the event stream's key that the partitions are named after (the router's topic).
func (p Partitions) base() string {
	if len(p.streams) == 1 {
		return p.streams[0]
	}
	s, _, _ := strings.Cut(p.streams[0], ":0:{")
	return s
}

// Count is P.
func (p Partitions) Count() int { return len(p.streams) }

// Stream is partition i's stream key.
func (p Partitions) Stream(i int) string { return p.streams[i] }

// Streams are every partition's stream key, in partition order.
func (p Partitions) Streams() []string { return append([]string(nil), p.streams...) }

// StreamOf is the stream of a user's check-ins.
func (p Partitions) StreamOf(userID int64) string {
	return p.streams[PartitionOf(userID, len(p.streams))]
}

// tagOf is the hash tag of a user's partition ("" with one stream).
func (p Partitions) tagOf(userID int64) string {
	if len(p.tags) == 0 {
		return ""
	}
	return p.tags[PartitionOf(userID, len(p.tags))]
}

// PartitionOf is the partition of a user's check-ins among p: FNV-1a 64 of the decimal userId,
// mod p.
func PartitionOf(userID int64, p int) int {
	if p <= 1 {
		return 0
	}
	var buf [20]byte
	h := uint64(14695981039346656037)
	for _, c := range strconv.AppendInt(buf[:0], userID, 10) {
		h ^= uint64(c)
		h *= 1099511628211
	}
	return int(h % uint64(p)) // #nosec G115 -- below p, an int
}

// PartitionTarget is the slot partition i of p aims at: the middle of the i-th P-th of the slots.
func PartitionTarget(i, p int) int { return projection.SpreadTarget(i, p) }

// PartitionTags are the hash tags of p partitions (see the rule above, projection.SpreadTags);
// p = 1 needs none but has one, for completeness.
func PartitionTags(p int) []string { return projection.SpreadTags(p) }

// Meta is the small hash of facts about the event stream fixed when it was created (P).
func (k KeySpace) Meta() string { return k.Prefix + ":meta" }

// MigrateLock is held by the one `checkins partitions migrate` that runs (PartitionMigrator.Lock).
func (k KeySpace) MigrateLock() string { return k.Prefix + ":migrate-lock" }

const metaPartitions = "partitions"

// PartitionMismatchError: the stream was created with another P than the one configured.
type PartitionMismatchError struct {
	Prefix               string
	Recorded, Configured int
}

func (e *PartitionMismatchError) Error() string {
	return fmt.Sprintf("the event stream %s has %d partitions (recorded in %s:meta) but %d are configured: "+
		"configure %d, or move the stream with `checkins partitions migrate --to %d` first",
		e.Prefix, e.Recorded, e.Prefix, e.Configured, e.Recorded, e.Configured)
}

// ErrPartitionMismatch matches every PartitionMismatchError (errors.Is).
var ErrPartitionMismatch = errors.New("partition count differs from the recorded one")

// Is makes errors.Is(err, ErrPartitionMismatch) true.
func (e *PartitionMismatchError) Is(target error) bool { return target == ErrPartitionMismatch }

// EnsurePartitions records p as the stream's partition count if none is recorded yet (HSETNX:
// the first process to start wins), and returns a *PartitionMismatchError if the recorded count
// is another. A stream written before partitions existed (<prefix>:events, no meta) has 1.
func EnsurePartitions(ctx context.Context, client redis.UniversalClient, keys KeySpace, p int) error {
	if _, err := NewPartitions(keys, p); err != nil {
		return err
	}
	meta := keys.Meta()
	cur, err := client.HGet(ctx, meta, metaPartitions).Result()
	if errors.Is(err, redis.Nil) {
		first := p
		// The key of P = 1 in another slot than the meta on a cluster: not atomic with the
		// HSETNX, which is fine as long as nothing writes partitions before this guard passes.
		n, xerr := client.Exists(ctx, keys.Stream()).Result()
		if xerr != nil {
			return fmt.Errorf("read the event stream's partitions: %w", xerr)
		}
		if n > 0 {
			first = 1
		}
		if err := client.HSetNX(ctx, meta, metaPartitions, first).Err(); err != nil {
			return fmt.Errorf("record the event stream's partitions: %w", err)
		}
		cur, err = client.HGet(ctx, meta, metaPartitions).Result()
	}
	if err != nil {
		return fmt.Errorf("read the event stream's partitions: %w", err)
	}
	recorded, err := strconv.Atoi(cur)
	if err != nil || recorded < 1 {
		return fmt.Errorf("%s field %s is %q, not a partition count", meta, metaPartitions, cur)
	}
	if recorded != p {
		return &PartitionMismatchError{Prefix: keys.Prefix, Recorded: recorded, Configured: p}
	}
	return nil
}

// CheckPartitions is EnsurePartitions without recording anything: it fails only when another
// partition count than p is recorded. A single server with one stream uses it, so that its keys
// stay exactly those of a service without partitions (a new keyspace's <prefix>:meta holds only
// the idempotency records' format and the API's longest REQUEST_TIMEOUT).
//
// With no count recorded, a plain <prefix>:events stream counts as 1 partition, as for
// EnsurePartitions (a single server with one stream records nothing): the ops verbs with another
// STREAM_PARTITIONS than the service's read empty partitions there and reported "0 entries".
func CheckPartitions(ctx context.Context, client redis.UniversalClient, keys KeySpace, p int) error {
	cur, err := client.HGet(ctx, keys.Meta(), metaPartitions).Result()
	if errors.Is(err, redis.Nil) {
		if p == 1 {
			return nil
		}
		n, xerr := client.Exists(ctx, keys.Stream()).Result()
		if xerr != nil {
			return fmt.Errorf("read the event stream's partitions: %w", xerr)
		}
		if n > 0 {
			return &PartitionMismatchError{Prefix: keys.Prefix, Recorded: 1, Configured: p}
		}
		return nil
	}
	if err != nil {
		return fmt.Errorf("read the event stream's partitions: %w", err)
	}
	recorded, err := strconv.Atoi(cur)
	if err != nil || recorded < 1 {
		return fmt.Errorf("%s field %s is %q, not a partition count", keys.Meta(), metaPartitions, cur)
	}
	if recorded != p {
		return &PartitionMismatchError{Prefix: keys.Prefix, Recorded: recorded, Configured: p}
	}
	return nil
}
