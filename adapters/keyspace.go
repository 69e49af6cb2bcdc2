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

// Idempotency is the record of a checkinId accepted by the API for a user. Keys are scoped by
// the user, so one user can neither replay nor block another user's checkinId; the hash tag is
// the one of the user's dedupe registry.
func (k KeySpace) Idempotency(userID int64, checkinID string) string {
	return k.IdempotencyPrefix() + "{user:" + strconv.FormatInt(userID, 10) + "}:" + checkinID
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

// RateLimitUser is the per-user rate-limit state. (Until the limiter was our own script,
// go-redis/redis_rate put "rate:" in front, outside KEY_PREFIX, where a Redis ACL limited to the
// prefix refused it; a budget lives at most its window, so the move costs one window's state.)
func (k KeySpace) RateLimitUser(userID int64) string {
	return k.Prefix + ":ratelimit:{user:" + strconv.FormatInt(userID, 10) + "}"
}

// Projections is the hash of projection name -> version serving reads (and rebuild state), live
// groups' membership and acknowledged positions. Joining a live group reads and creates the
// stream's consumer groups in the same script (LiveGroups.Join), so on a cluster the hash is in
// the stream's slot.
func (k KeySpace) Projections() string { return k.withStreamTag(k.Prefix + ":projections") }

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
