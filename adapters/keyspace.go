// Package adapters implements the app's ports with real technology: Redis read models and Lua
// scripts, the Watermill publisher and marshaller, the event-stream reader.
package adapters

import (
	"fmt"
	"strconv"
	"strings"
)

// KeySpace names every Redis key the service uses, under one prefix (default "checkins").
//
// On a Redis Cluster (Cluster true) a script or multi-key command may only touch keys of one
// hash slot. Every key that a script uses together with the event stream carries the stream's
// name as its hash tag, so that it lands in the stream's slot: "<prefix>:projections{<prefix>:events}"
// hashes like the untagged "<prefix>:events". With stream partitions (P > 1), such state is per
// partition and takes its partition's tag (Partitions.Registry). On a single server (Cluster false) every
// key keeps the name it always had.
type KeySpace struct {
	Prefix  string
	Cluster bool
	// parts is the event stream's partitions (WithPartitions); nil: one stream.
	parts *Partitions
	// userSlotRecords keeps the idempotency records and limit state in the users' slots on a
	// cluster with partitions too (WithRecordsInUserSlots).
	userSlotRecords bool
}

// WithRecordsInUserSlots is k with the users' idempotency records and rate-limit state in the
// users' slots (IdemLayoutUser) even on a cluster with stream partitions: what INGEST_MIN_REPLICAS
// needs. Its XADD is followed by WAIT and the API answers 503 when no replica confirms; the entry
// may still be read and projected before a failover loses it. A record in another slot (another
// master) survives that failover, so a retry takes it over and publishes the original check-in;
// in the partition's slot it would be lost with the entry, and a retry whose body leaves the
// timestamp to the server would be recorded anew, with another timestamp than the one the read
// models took (TestClusterProjectionMinReplicas).
func (k KeySpace) WithRecordsInUserSlots() KeySpace {
	k.userSlotRecords = true
	return k
}

// WithPartitions is k with the event stream split into p partitions (adapters/partitions.go):
// the event log, the publisher, the live groups, the stream admin and the projector backend
// made from it work on every partition. p = 1 is k as it was.
func (k KeySpace) WithPartitions(p int) (KeySpace, error) {
	k.parts = nil
	if p == 1 {
		return k, nil
	}
	parts, err := NewPartitions(k, p)
	if err != nil {
		return KeySpace{}, err
	}
	k.parts = &parts
	return k, nil
}

// Partitions is the event stream's partitions: one, the stream itself, unless WithPartitions
// said more.
func (k KeySpace) Partitions() Partitions {
	if k.parts != nil {
		return *k.parts
	}
	return Partitions{streams: []string{k.Stream()}, registries: []string{k.Projections()}}
}

// NewKeySpace checks prefix for the deployment: a brace in it would become every key's hash tag
// on a cluster (all keys in one slot, and the service's own tags ignored).
func NewKeySpace(prefix string, cluster bool) (KeySpace, error) {
	if prefix == "" {
		return KeySpace{}, fmt.Errorf("key prefix must not be empty")
	}
	if cluster && strings.ContainsAny(prefix, "{}") {
		return KeySpace{}, fmt.Errorf("key prefix %q contains a brace: on a Redis Cluster the braces would become every key's hash tag, putting every key in one slot; choose a prefix without { or }", prefix)
	}
	return KeySpace{Prefix: prefix, Cluster: cluster}, nil
}

// withStreamTag gives key the event stream's slot on a cluster (unchanged on a single server).
func (k KeySpace) withStreamTag(key string) string {
	if !k.Cluster {
		return key
	}
	return key + "{" + k.Stream() + "}"
}

// Stream is the event stream: the system of record.
func (k KeySpace) Stream() string { return k.Prefix + ":events" }

// PoisonStream holds events a projection could not handle, with the reason.
func (k KeySpace) PoisonStream() string { return k.Stream() + ":poison" }

// PoisonParked is the hash of the parked units whose entries are not acknowledged yet
// (PoisonQueue.Park, SweepParked): a projector that takes over such an entry leaves the unit to
// the poison queue. It is tagged with the
// poison stream's name, so that on a cluster it is in the stream's slot (the park and the delete
// are one script), whichever way the key space was made.
func (k KeySpace) PoisonParked() string {
	return k.PoisonStream() + ":parked{" + k.PoisonStream() + "}"
}

// Idempotency is the record of a checkinId accepted by the API for a user. Keys are scoped by
// the user, so one user can neither replay nor block another user's checkinId. Their slot is the
// one of the user's rate-limit state (IdempotencyLayout): on a cluster with stream partitions, the
// slot of the user's partition, so that the limit, the reservation and the XADD are one script
// (ReservingPublisher).
func (k KeySpace) Idempotency(userID int64, checkinID string) string {
	return k.idemKey(k.recordsTag(userID), userID, checkinID)
}

// recordsTag is the partition tag a user's records and limit state carry, "" when they are in
// the user's slot (IdemLayoutUser).
func (k KeySpace) recordsTag(userID int64) string {
	if k.partitionedRecords() {
		return k.parts.tagOf(userID)
	}
	return ""
}

// partitionedRecords: the records are in the partitions' slots (layout "p<P>").
func (k KeySpace) partitionedRecords() bool { return k.Cluster && k.parts != nil && !k.userSlotRecords }

// idemKey is a user's record of checkinID under partitionTag ("": in the user's slot).
func (k KeySpace) idemKey(partitionTag string, userID int64, checkinID string) string {
	uid := strconv.FormatInt(userID, 10)
	if partitionTag == "" {
		return k.IdempotencyPrefix() + "{user:" + uid + "}:" + checkinID
	}
	return k.IdempotencyPrefix() + "{" + partitionTag + "}:" + uid + ":" + checkinID
}

// Idempotency layouts (IdempotencyLayout): where a user's record and limit state live.
const (
	// IdemLayoutUser: in the user's slot, <prefix>:idem:{user:<id>}:<checkinId> (a single
	// server, or a cluster with one stream; every version before 2026-12-03).
	IdemLayoutUser = "user"
	// idemLayoutPartitions + P: in the slot of the user's partition among P,
	// <prefix>:idem:{<tag>}:<userId>:<checkinId>.
	idemLayoutPartitions = "p"
)

// IdempotencyLayout is the layout this keyspace writes: IdemLayoutUser, or "p<P>" on a cluster
// with P > 1 stream partitions. A partition migration on a cluster changes it (records of the
// old one are still looked up for IDEMPOTENCY_TTL, see IdempotencyStore).
func (k KeySpace) IdempotencyLayout() string {
	if k.partitionedRecords() {
		return idemLayoutPartitions + strconv.Itoa(k.parts.Count())
	}
	return IdemLayoutUser
}

// IdempotencyIn is the key of a user's record of checkinID in layout.
func (k KeySpace) IdempotencyIn(layout string, userID int64, checkinID string) (string, error) {
	if layout == IdemLayoutUser {
		return k.idemKey("", userID, checkinID), nil
	}
	tag, err := k.partitionTagIn(layout, userID)
	if err != nil {
		return "", err
	}
	return k.idemKey(tag, userID, checkinID), nil
}

// partitionTagIn is the tag of the user's partition in a "p<P>" layout.
func (k KeySpace) partitionTagIn(layout string, userID int64) (string, error) {
	n, err := strconv.Atoi(strings.TrimPrefix(layout, idemLayoutPartitions))
	if err != nil || !strings.HasPrefix(layout, idemLayoutPartitions) || n < 2 || n > MaxPartitions {
		return "", fmt.Errorf("unknown idempotency layout %q", layout)
	}
	if k.parts != nil && k.parts.Count() == n {
		return k.parts.tagOf(userID), nil
	}
	return PartitionTags(n)[PartitionOf(userID, n)], nil
}

// IngestInOneSlot tells whether a user's rate-limit state, idempotency records and stream
// partition share a slot (or a server), as ReservingPublisher's one script needs.
func (k KeySpace) IngestInOneSlot() bool {
	return !k.Cluster || k.partitionedRecords()
}

// IdempotencyPrefix starts every idempotency key, scoped or legacy.
func (k KeySpace) IdempotencyPrefix() string { return k.Prefix + ":idem:" }

// LegacyIdempotency is the key of a checkinId accepted before keys were scoped by user (a
// checkinId never contains "{", so the two layouts cannot collide).
func (k KeySpace) LegacyIdempotency(checkinID string) string {
	return k.IdempotencyPrefix() + checkinID
}

// IdempotencyScopedSince holds when (ms since epoch) this keyspace first ran with user-scoped
// idempotency keys; "0" when it had no event stream then, so no legacy key can exist.
func (k KeySpace) IdempotencyScopedSince() string { return k.Prefix + ":idem-scoped-since" }

// RateLimitUser is the per-user rate-limit state, in the slot of the user's idempotency
// records. (Until the limiter was our own script, go-redis/redis_rate put "rate:" in front,
// outside KEY_PREFIX, where a Redis ACL limited to the prefix refused it; a budget lives at most
// its window, so a move, as also a partition migration on a cluster, costs one window's state.)
func (k KeySpace) RateLimitUser(userID int64) string {
	uid := strconv.FormatInt(userID, 10)
	if tag := k.recordsTag(userID); tag != "" {
		return k.Prefix + ":ratelimit:{" + tag + "}:" + uid
	}
	return k.Prefix + ":ratelimit:{user:" + uid + "}"
}

// Projections is the hash of projection name -> version serving reads (and rebuild state), live
// groups' membership and acknowledged positions. Joining a live group reads and creates the
// stream's consumer groups in the same script (LiveGroups.Join), so on a cluster the hash is in
// the stream's slot.
func (k KeySpace) Projections() string { return k.withStreamTag(k.Prefix + ":projections") }

// RebuildStartLock is held while a rebuild of projection name starts (RebuildProjection.Start).
func (k KeySpace) RebuildStartLock(name string) string {
	return k.withStreamTag(k.Prefix + ":rebuild-start:" + name)
}

// ProjectionPrefix is the common prefix of every key of one projection version.
func (k KeySpace) ProjectionPrefix(name string, version int) string {
	return fmt.Sprintf("%s:p:%s:v%d:", k.Prefix, name, version)
}

// ProjectionKey is one key of a projection version. The slot is the hash tag, so an update's
// keys and its dedupe set live in one Redis Cluster slot.
func (k KeySpace) ProjectionKey(name string, version int, slot, key string) string {
	return k.ProjectionPrefix(name, version) + "{" + slot + "}:" + key
}

// Group is the consumer group of a projection version.
func (k KeySpace) Group(name string, version int) string {
	return name + ".v" + strconv.Itoa(version)
}
