// Package adapters implements the app's ports with real technology: Redis read models and Lua
// scripts, the Watermill publisher and marshaller, the event-stream reader.
package adapters

import (
	"fmt"
	"strconv"
)

// KeySpace names every Redis key the service uses, under one prefix (default "checkins").
type KeySpace struct {
	Prefix string
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

// RateLimitUser is the per-user rate-limit state (the limiter library adds its own "rate:").
func (k KeySpace) RateLimitUser(userID int64) string {
	return k.Prefix + ":ratelimit:{user:" + strconv.FormatInt(userID, 10) + "}"
}

// Projections is the hash of projection name -> version serving reads (and rebuild state).
func (k KeySpace) Projections() string { return k.Prefix + ":projections" }

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
