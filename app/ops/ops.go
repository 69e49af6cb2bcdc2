// Package ops is the operational model that the ops commands (app/command) and queries
// (app/query) share, and the projection router (ports) reads: the event stream and its consumer
// groups, live groups, the projections registry and its rebuilds, and the poison queue, as the
// app sees them. It declares the small interfaces adapters implement for them (Backend); the
// rules that decide (caught up, stalled, where to trim, what a rebuild does next) live with the
// use cases that apply them.
package ops

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/checkins/checkins/domain"
)

// Backend is everything the ops use cases read and change, one small interface per concern;
// adapters.NewOpsBackend fills it with Redis.
type Backend struct {
	Stream       Stream
	Registry     Registry
	Live         LiveGroups
	Poison       PoisonQueue
	Keys         ProjectionKeys
	Observations Observations
	Failures     Failures
	Migration    Migration
	Records      IdempotencyRecords
}

// The formats of the idempotency records that answer retries, as the API writes them once the
// check-in is on the stream.
const (
	// RecordFormatJSON is the state byte and the check-in as JSON (about 140 bytes): what
	// every release reads, and what a deployment that earlier releases served writes until
	// it is switched.
	RecordFormatJSON = "json"
	// RecordFormatCompact is the check-in's fields as varints (about 14 bytes; a record takes
	// about 215 bytes of Redis memory instead of 344), read by releases since 2026-12-06 only.
	RecordFormatCompact = "compact"
)

// CheckRecordFormat is nil for a format of the records, otherwise an error naming both.
func CheckRecordFormat(format string) error {
	if format != RecordFormatCompact && format != RecordFormatJSON {
		return fmt.Errorf("unknown idempotency record format %q: %s or %s", format, RecordFormatCompact, RecordFormatJSON)
	}
	return nil
}

// IdempotencyRecords is how the API processes write their idempotency records.
type IdempotencyRecords interface {
	// Format is the format they write (RecordFormatJSON when none was recorded).
	Format(ctx context.Context) (string, error)
	// SetFormat records the format they write from their next look on (within a minute).
	SetFormat(ctx context.Context, format string) error
}

// Migration tells whether a partition migration (checkins partitions migrate) holds the event
// stream: while it copies entries and moves groups, nothing else may write to the stream, trim it
// or create groups on it, or what it does would be lost with the old streams.
type Migration interface {
	// Running describes the migration that runs, or is "" when none does.
	Running(ctx context.Context) (string, error)
}

// Stream is the event stream and its consumer groups.
type Stream interface {
	// Name is the stream's key, for reports.
	Name() string
	// Info reads the stream's length and every group's state; a missing stream is not an error.
	Info(ctx context.Context) (StreamInfo, error)
	// CountAfter counts entries after id, up to max (for a lag the server cannot tell).
	CountAfter(ctx context.Context, id string, max int64) (int64, error)
	// CreateGroup creates group at start unless it exists.
	CreateGroup(ctx context.Context, group, start string) error
	// DestroyGroup destroys group; a group (or stream) that is not there is not an error.
	DestroyGroup(ctx context.Context, group string) error
	// OldestIDs returns the IDs of up to n oldest entries, oldest first.
	OldestIDs(ctx context.Context, n int64) ([]string, error)
	// TrimBelow removes every entry with an ID below minID that no consumer group still needs,
	// judged atomically with the trim (a group created or moved since the caller looked holds
	// the cut lower), and nothing when the stream has no groups. With maxAge > 0 the cut is no
	// higher than maxAge before the time of the server holding the stream, whose clock numbered
	// its entries. It returns how many went and the cut it used.
	TrimBelow(ctx context.Context, minID string, maxAge time.Duration) (trimmed int64, cut string, err error)
	// Starts is, per stream (each partition), the ID of the first entry a group created at "0"
	// now would read: the first entry's, or past the last ID the stream ever had when it is
	// empty.
	Starts(ctx context.Context) (map[string]string, error)
}

// BuildStart is where a version's build (a rebuild's backfill) began: Streams as Stream.Starts
// read it, At when (Unix milliseconds of the clock parked entries are stamped by,
// Registry.ServerTime: never a client's, which may be an operator's machine seconds off), taken
// before the build's group exists. Every entry at or after
// Streams[s] on s went through the build; anything parked (PoisonEntry.ParkedAt) before At was
// parked by an earlier one.
type BuildStart struct {
	At      int64             `json:"at"`
	Streams map[string]string `json:"streams"`
}

// Registry is the projections registry: per projection, the version serving reads and the
// state of its rebuild, changed atomically so that concurrent rebuild drivers agree.
type Registry interface {
	State(ctx context.Context, name string) (VersionState, error)
	// Current is the version serving reads.
	Current(ctx context.Context, name string) (int, error)
	// BeginBuild marks serving+1 as building, in layout, unless a build is in progress (started
	// false, the build in progress returned) or the previous one still retires (ErrRetiring).
	BeginBuild(ctx context.Context, name string, layout int) (serving, building int, started bool, err error)
	// Promote switches reads from version from to to, if from still serves and to builds; the
	// building version's layout becomes the serving one's.
	Promote(ctx context.Context, name string, from, to int, at time.Time) (bool, error)
	// DecideLayout records layout as the serving version's unless one is recorded already, and
	// returns the one recorded.
	DecideLayout(ctx context.Context, name string, layout int) (int, error)
	// Retired records that version's keys and group are gone.
	Retired(ctx context.Context, name string, version int) error
	// SetRebuildStatus stores the last rebuild's progress (JSON).
	SetRebuildStatus(ctx context.Context, name, status string) error
	// LockStart holds the start of name's rebuild for ttl at most, so that concurrent starts do
	// not take each other's new build for an abandoned one; ok false: another start holds it.
	// release lets go of it (only if it is still this call's).
	LockStart(ctx context.Context, name string, ttl time.Duration) (release func(context.Context) error, ok bool, err error)
	// SetBuildStart records where version's build began; BuildStart reads it (ok false: not
	// recorded, e.g. a version built before releases recorded it, or the first version).
	SetBuildStart(ctx context.Context, name string, version int, b BuildStart) error
	// ServerTime is now in Unix milliseconds of the clock that stamps parked entries (the Redis
	// server holding the poison queue): BuildStart.At is taken from it.
	ServerTime(ctx context.Context) (int64, error)
	BuildStart(ctx context.Context, name string, version int) (BuildStart, bool, error)
}

// LiveGroups reads and changes which projection versions each live group feeds.
type LiveGroups interface {
	// ReadAll is every live group's membership and every group's acknowledged position.
	ReadAll(ctx context.Context) (map[string]Membership, map[string]string, error)
	// FinishBackfill records that member's own group delivered everything up to its join.
	FinishBackfill(ctx context.Context, group, member string, at time.Time) (bool, error)
	// Leave takes member out of group.
	Leave(ctx context.Context, group, member string) error
	// ForgetAcked drops a removed group's acknowledged position.
	ForgetAcked(ctx context.Context, group string) error
	// Disband takes every member out of live group, each with an own group at the position the
	// live group had delivered through, and removes the group (apply false: only checks). It
	// refuses (ErrDisbandRefused) while a consumer of the group read within minIdle, entries are
	// pending, or a member still backfills.
	Disband(ctx context.Context, group string, minIdle time.Duration, apply bool) (DisbandReport, error)
	// DestroyFinishedOwnGroup destroys member's own group, with its checkpoint, where member is
	// still in live group with its backfill done, in one step with reading that (a disband may
	// have replaced the group since the membership was read), and marks the member Removing,
	// held by token, until FinishRemoval. It reports whether this run holds the removal: false
	// when member is no longer that live group's finished backfill, or another run has held its
	// removal for less than hold.
	DestroyFinishedOwnGroup(ctx context.Context, group, member, token string, hold time.Duration) (bool, error)
	// EndRemoval ends token's hold on member's removal in live group: done, the Removing mark is
	// cleared (what its finished backfill's group left besides is removed); not done (the run
	// failed), the mark stays and the next run may take it up at once.
	EndRemoval(ctx context.Context, group, member, token string, done bool) error
	// RenewRemoval stamps token's Removing marks on member with the time now, so that no other
	// run takes the removal over while this one is at it; false when another run took it over
	// (the hold had passed) or the mark went.
	RenewRemoval(ctx context.Context, group, member, token string) (bool, error)
	// DropMoved drops member, a version a disband took out of its live group and that no live
	// group runs: its own group, moved record and checkpoint go, and a dropping mark holds off
	// joins until EndDrop (apply false: only checks). It refuses (ErrDropRefused) while the
	// member is in a live group, or its own group is read. A report with no Positions: member
	// was neither moved nor being dropped.
	DropMoved(ctx context.Context, member string, minIdle time.Duration, apply bool) (DropReport, error)
	// ReadMoved is, per partition's stream, the versions a disband took out of a live group that
	// have not joined another yet, by member name.
	ReadMoved(ctx context.Context) (map[string]map[string]Moved, error)
	// EndDisband removes group's disbanding marks (set by Disband), once its markers are gone:
	// joins into a group of that name are refused until then.
	EndDisband(ctx context.Context, group string) error
	// EndDrop removes member's dropping marks, once its keys are gone.
	EndDrop(ctx context.Context, member string) error
	// ForgetMoved removes member's moved record and dropping marks: the version is removed for
	// good (a rebuild retired it), and nothing will join it again.
	ForgetMoved(ctx context.Context, member string) error
}

// PoisonQueue is the stream of parked events.
type PoisonQueue interface {
	// Stream is the poison stream's key, for reports.
	Stream() string
	// Get returns one entry: a domain.ValidationError for a malformed id, domain.ErrNotFound
	// when it is not there.
	Get(ctx context.Context, id string) (PoisonEntry, error)
	// Range returns up to count entries with after < ID <= until ("" after: from the start;
	// "+" until: to the end), oldest first.
	Range(ctx context.Context, after, until string, count int64) ([]PoisonEntry, error)
	// LastID is the newest entry's ID ("" when the queue is empty).
	LastID(ctx context.Context) (string, error)
	// DeleteIDs removes entries and returns how many were there.
	DeleteIDs(ctx context.Context, ids ...string) (int64, error)
	// Delete removes one entry; errors as Get.
	Delete(ctx context.Context, id string) error
	// Repark replaces entry e.ID by e under a new ID; domain.ErrNotFound when it went meanwhile.
	Repark(ctx context.Context, e PoisonEntry) (string, error)
	// Len is the number of parked entries.
	Len(ctx context.Context) (int64, error)
	// CountByProjection counts parked entries per projection.
	CountByProjection(ctx context.Context) (map[string]int64, error)
}

// ProjectionKeys removes what a projection version or a consumer group left in Redis.
type ProjectionKeys interface {
	// RemoveVersion removes every key of a projection version; it returns how many went.
	RemoveVersion(ctx context.Context, name string, version int) (int64, error)
	// RemoveMarkers removes a consumer group's dedupe markers.
	RemoveMarkers(ctx context.Context, group string) (int64, error)
	// RemoveLegacyDedupe removes a version's dedupe sets of the service's earlier layout.
	RemoveLegacyDedupe(ctx context.Context, name string, version int) (int64, error)
}

// Observations keep, per consumer group, what it looked like and since when, so that every
// process and the CLI judge stalls from the same observations.
type Observations interface {
	// Observed returns the stored observation of each group ("" when none).
	Observed(ctx context.Context, groups []string) ([]string, error)
	// Observe stores group's observation.
	Observe(ctx context.Context, group, observation string) error
	// Forget drops group's observation (a removed group).
	Forget(ctx context.Context, group string) error
}

// Failures classifies errors of the backend.
type Failures interface {
	// TransientReason is ok for a failure that will pass (unreachable, restarting, out of
	// memory, busy), with a short reason.
	TransientReason(err error) (reason string, ok bool)
}

// Unavailable marks a backend failure so that the HTTP port answers 503.
func Unavailable(err error) error {
	if err == nil || errors.Is(err, domain.ErrUnavailable) {
		return err
	}
	return fmt.Errorf("%w: %w", domain.ErrUnavailable, err)
}

// IsClientError reports errors the caller's input caused (a bad ID, an unknown entry).
func IsClientError(err error) bool {
	var ve *domain.ValidationError
	return errors.As(err, &ve) || errors.Is(err, domain.ErrNotFound)
}
