package adapters

import (
	"cmp"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/checkins/checkins/app/command"
	"github.com/checkins/checkins/app/ops"
	"github.com/checkins/checkins/domain"
)

// IdempotencyStore keeps one record per accepted checkinId and user, for ttl. A record is a state
// byte ('R' reserved, 'P' published) followed by the first accepted check-in as JSON; a
// reservation also names its owner and when it was taken (fields older records lack: they read
// as reserved at their RecordedAt by no owner in particular). A published record, the one that
// lives for ttl, is written in the compact format (encodeCompact: about 14 bytes where the JSON
// takes about 140) once <prefix>:meta says every process reads it (recordFormat); both are read.
//
// Keys are scoped by the check-in's user (KeySpace.Idempotency), in the layout of the keyspace
// (KeySpace.IdempotencyLayout: the user's slot, or on a cluster with stream partitions the slot
// of the user's partition). Records written in another layout still answer for their own user
// while they can exist, for IDEMPOTENCY_TTL after the layout was left:
//   - records from before keys were scoped (KeySpace.LegacyIdempotency, one per checkinId), after
//     this keyspace first ran with scoped keys (KeySpace.IdempotencyScopedSince);
//   - records of an earlier layout (the user's slot before a cluster's records moved to the
//     partitions' slots, or another partition count before a `partitions migrate`): the first
//     process of a layout records, in <prefix>:meta, when the one before it was left
//     (idem-retired:<layout>) and which is in use (idem-layout).
//
// A reservation then first looks for such a record of the same checkinId; one of the same user
// is copied to the current key (with its remaining TTL) and decides as before, a retry or a 409;
// a pre-scoped one of another user is ignored, as scoping wants.
type IdempotencyStore struct {
	client   redis.UniversalClient
	pipeline *AutoPipeline // nil: one round trip per call
	keys     KeySpace
	ttl      time.Duration
	now      func() time.Time

	loadMu      sync.Mutex // one load of lookups at a time
	legacyMu    sync.Mutex
	legacyKnown bool         // lookups was read from Redis
	lookups     []idemLookup // where records of other layouts may exist, and until when
	loadedAt    time.Time    // when lookups was read
	refresh     time.Duration
	since       int64 // scopedSince, once sinceKnown (read under loadMu)
	sinceKnown  bool
	// compact: published records are written in the compact format (recordFormat, read with the
	// lookups); served: a release may have taken check-ins in this keyspace before this store's
	// first load (servedBefore, read then, under loadMu).
	compact atomic.Bool
	served  bool
}

// idemLookup: records of layout (a KeySpace.IdempotencyLayout, or "" for the pre-scoped keys of
// LegacyIdempotency) may exist until until (ms since epoch).
type idemLookup struct {
	layout string
	until  int64
}

// NewIdempotencyStore keeps records for ttl (a retry later than that is still counted once by the
// projections, but answers as a new check-in).
func NewIdempotencyStore(client redis.UniversalClient, keys KeySpace, ttl time.Duration) *IdempotencyStore {
	return &IdempotencyStore{client: client, keys: keys, ttl: ttl, now: time.Now, refresh: layoutRefresh}
}

// WithAutoPipeline sends the store's commands through p: under load the reservations and marks
// of concurrent requests share round trips.
func (s *IdempotencyStore) WithAutoPipeline(p *AutoPipeline) *IdempotencyStore {
	s.pipeline = p
	return s
}

const (
	stateReserved  = 'R'
	statePublished = 'P'
)

type idemRecord struct {
	Fingerprint string `json:"f"`
	ID          string `json:"id"`
	UserID      int64  `json:"u"`
	LocationID  int64  `json:"l"`
	StarRating  int    `json:"s"`
	Timestamp   int64  `json:"t"`
	RecordedAt  int64  `json:"r"`
	Owner       string `json:"o,omitempty"`  // reservations only
	ReservedAt  int64  `json:"ra,omitempty"` // reservations only; absent when equal to RecordedAt
}

// encodeRecord writes the state byte and the record's JSON, byte for byte what encoding/json
// makes of idemRecord (TestEncodeRecordIsEncodingJSON), appended by hand: it runs twice per
// check-in (reserve, then mark published), where reflection was a share of the API's CPU.
func encodeRecord(state byte, rec command.IdempotencyRecord) ([]byte, error) {
	c := rec.Checkin
	b := make([]byte, 0, 128+len(rec.Fingerprint)+len(c.ID)+len(rec.Owner))
	b = append(b, state)
	b = append(b, `{"f":`...)
	b = appendMarshalString(b, rec.Fingerprint)
	b = append(b, `,"id":`...)
	b = appendMarshalString(b, c.ID)
	b = append(b, `,"u":`...)
	b = strconv.AppendInt(b, c.UserID, 10)
	b = append(b, `,"l":`...)
	b = strconv.AppendInt(b, c.LocationID, 10)
	b = append(b, `,"s":`...)
	b = strconv.AppendInt(b, int64(c.StarRating), 10)
	b = append(b, `,"t":`...)
	b = strconv.AppendInt(b, c.Timestamp, 10)
	b = append(b, `,"r":`...)
	b = strconv.AppendInt(b, rec.RecordedAt, 10)
	if state == stateReserved {
		if rec.Owner != "" {
			b = append(b, `,"o":`...)
			b = appendMarshalString(b, rec.Owner)
		}
		if rec.ReservedAt != rec.RecordedAt && rec.ReservedAt != 0 {
			b = append(b, `,"ra":`...)
			b = strconv.AppendInt(b, rec.ReservedAt, 10)
		}
	}
	return append(b, '}'), nil
}

// appendMarshalString appends s as json.Marshal writes it, which also escapes < > & (unlike
// appendJSONString, whose output only needs to be valid JSON).
func appendMarshalString(dst []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c == '<' || c == '>' || c == '&' {
			b, _ := json.Marshal(s) // a string always encodes
			return append(dst, b...)
		}
	}
	return appendJSONString(dst, s)
}

// compactMark follows the state byte of a record in the compact format, where JSON has '{'.
const compactMark = 0x01

// Bits of the compact format's flags byte.
const (
	compactRating      = 0x07 // the star rating
	compactNoTimestamp = 0x08 // the request left the timestamp to the server
)

// encodeCompact writes rec as a published record in the compact format, when it can: 'P',
// compactMark, a flags byte (the star rating, and whether the request carried the timestamp),
// then as varints the user, the location, the timestamp and RecordedAt less the timestamp. The
// checkinId is the key's and the fingerprint is computed again from the fields when read, so
// neither is stored: ok is false (write the JSON) unless rec's fingerprint is the one of its
// check-in's body with or without the timestamp, and the fields fit.
func encodeCompact(rec command.IdempotencyRecord) (b []byte, ok bool) {
	c := rec.Checkin
	if c.UserID < 1 || c.LocationID < 1 || c.StarRating < 0 || c.StarRating > compactRating || c.Timestamp < 0 || rec.RecordedAt < 0 {
		return nil, false
	}
	flags := byte(c.StarRating)
	// A timestamp the server set is the millisecond of recording: try that body first.
	for _, noTS := range []bool{c.Timestamp == rec.RecordedAt, c.Timestamp != rec.RecordedAt} {
		if compactFingerprint(c, noTS) == rec.Fingerprint {
			if noTS {
				flags |= compactNoTimestamp
			}
			ok = true
			break
		}
	}
	if !ok {
		return nil, false
	}
	b = make([]byte, 0, 3+4*binary.MaxVarintLen64)
	b = append(b, statePublished, compactMark, flags)
	b = binary.AppendUvarint(b, uint64(c.UserID))
	b = binary.AppendUvarint(b, uint64(c.LocationID))
	b = binary.AppendUvarint(b, uint64(c.Timestamp))
	return binary.AppendVarint(b, rec.RecordedAt-c.Timestamp), true
}

// compactFingerprint is the fingerprint of the request that recorded c, with its timestamp or,
// noTS, without one.
func compactFingerprint(c domain.Checkin, noTS bool) string {
	u, l, s, t := c.UserID, c.LocationID, int64(c.StarRating), c.Timestamp
	in := domain.CheckinInput{UserID: &u, LocationID: &l, StarRating: &s, Timestamp: &t}
	if noTS {
		in.Timestamp = nil
	}
	return in.Fingerprint()
}

// decodeCompact reads a record of encodeCompact's format, of checkinId id.
func decodeCompact(id, v string) (*command.IdempotencyRecord, error) {
	corrupt := fmt.Errorf("idempotency record for %q is corrupt: %q", id, v)
	if len(v) < 3 || v[0] != statePublished || v[2]&^(compactRating|compactNoTimestamp) != 0 {
		return nil, corrupt
	}
	b := []byte(v[3:])
	var fields [3]int64
	for i := range fields {
		n, size := binary.Uvarint(b)
		if size <= 0 || n > math.MaxInt64 {
			return nil, corrupt
		}
		fields[i], b = int64(n), b[size:] // #nosec G115 -- at most math.MaxInt64, checked above
	}
	delta, size := binary.Varint(b)
	if size <= 0 || size != len(b) {
		return nil, corrupt
	}
	c := domain.Checkin{ID: id, UserID: fields[0], LocationID: fields[1], StarRating: int(v[2] & compactRating), Timestamp: fields[2]}
	at := c.Timestamp + delta
	if c.UserID < 1 || c.LocationID < 1 || (delta < 0 && at < 0) || (delta > 0 && at < c.Timestamp) {
		return nil, corrupt // what encodeCompact never writes
	}
	return &command.IdempotencyRecord{Fingerprint: compactFingerprint(c, v[2]&compactNoTimestamp != 0), Checkin: c,
		RecordedAt: at, Published: true, ReservedAt: at}, nil
}

func decodeRecord(id string, v any) (*command.IdempotencyRecord, error) {
	old, ok := v.(string)
	if !ok || len(old) < 2 || (old[0] != stateReserved && old[0] != statePublished) {
		return nil, fmt.Errorf("idempotency record for %q is corrupt: %q", id, v)
	}
	if old[1] == compactMark {
		return decodeCompact(id, old)
	}
	var r idemRecord
	if err := json.Unmarshal([]byte(old[1:]), &r); err != nil {
		return nil, fmt.Errorf("idempotency record for %q is corrupt: %w", id, err)
	}
	rec := &command.IdempotencyRecord{
		Fingerprint: r.Fingerprint,
		Checkin:     domain.Checkin{ID: r.ID, UserID: r.UserID, LocationID: r.LocationID, StarRating: r.StarRating, Timestamp: r.Timestamp},
		RecordedAt:  r.RecordedAt,
		Published:   old[0] == statePublished,
		Owner:       r.Owner,
		ReservedAt:  r.ReservedAt,
	}
	if rec.ReservedAt == 0 {
		rec.ReservedAt = rec.RecordedAt
	}
	return rec, nil
}

func (s *IdempotencyStore) do(ctx context.Context, args ...any) (any, error) {
	if s.pipeline != nil {
		return s.pipeline.Do(ctx, args...)
	}
	return s.client.Do(ctx, args...).Result()
}

func (s *IdempotencyStore) key(c domain.Checkin) string { return s.keys.Idempotency(c.UserID, c.ID) }

// encodePublished is rec as a published record: compact once the keyspace's format is (and rec
// fits it), otherwise JSON.
func (s *IdempotencyStore) encodePublished(rec command.IdempotencyRecord) ([]byte, error) {
	return publishedRecord(rec, s.compact.Load())
}

func publishedRecord(rec command.IdempotencyRecord, compact bool) ([]byte, error) {
	if compact {
		if b, ok := encodeCompact(rec); ok {
			return b, nil
		}
	}
	return encodeRecord(statePublished, rec)
}

// PublishedRecord is rec as the API stores it once its check-in is on the stream, in format
// (ops.RecordFormatCompact, or ops.RecordFormatJSON; a record the compact format cannot hold
// is JSON): what `checkins bench --preload-records` fills a server with.
func PublishedRecord(rec command.IdempotencyRecord, format string) ([]byte, error) {
	if err := ops.CheckRecordFormat(format); err != nil {
		return nil, err
	}
	return publishedRecord(rec, format == ops.RecordFormatCompact)
}

// Reserve implements command.IdempotencyStore with one SET NX GET round trip (two more while
// legacy records may exist, see IdempotencyStore).
func (s *IdempotencyStore) Reserve(ctx context.Context, rec command.IdempotencyRecord) (*command.IdempotencyRecord, error) {
	b, err := encodeRecord(stateReserved, rec)
	if err != nil {
		return nil, err
	}
	id := rec.Checkin.ID
	px, adopted := s.ttl.Milliseconds(), false
	if s.legacyLookups(ctx) {
		old, oldPX, err := s.legacyRecord(ctx, rec.Checkin)
		if err != nil {
			return nil, err
		}
		if old != "" {
			// The legacy record decides, from the scoped key on: a retry or a conflict as before.
			b, px, adopted = []byte(old), oldPX, true
		}
	}
	v, err := s.do(ctx, "SET", s.key(rec.Checkin), b, "NX", "GET", "PX", px)
	if errors.Is(err, redis.Nil) {
		if adopted { // the legacy record is what is stored now, not rec
			return decodeRecord(id, string(b))
		}
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return decodeRecord(id, v)
}

// legacyRecord returns the raw record of c's checkinId in an earlier layout and its remaining
// TTL in ms, when one exists for c's user ("" otherwise), the most recent layout first.
func (s *IdempotencyStore) legacyRecord(ctx context.Context, c domain.Checkin) (string, int64, error) {
	lookups, err := s.loadLookups(ctx)
	if err != nil {
		return "", 0, err
	}
	now := s.now().UnixMilli()
	for _, l := range lookups {
		if now >= l.until {
			continue
		}
		key := s.keys.LegacyIdempotency(c.ID)
		if l.layout != "" {
			if key, err = s.keys.IdempotencyIn(l.layout, c.UserID, c.ID); err != nil {
				continue // a layout a later version wrote: none of its keys is known here
			}
		}
		v, ms, err := s.recordAt(ctx, key, c)
		if v != "" || err != nil {
			return v, ms, err
		}
	}
	return "", 0, nil
}

// recordAt reads the record at key, if it is one of c's user, and its remaining TTL in ms.
func (s *IdempotencyStore) recordAt(ctx context.Context, key string, c domain.Checkin) (string, int64, error) {
	v, err := s.do(ctx, "GET", key)
	if errors.Is(err, redis.Nil) {
		return "", 0, nil
	}
	if err != nil {
		return "", 0, err
	}
	old, err := decodeRecord(c.ID, v)
	if err != nil {
		// As at the current key: ignored, the checkinId was reserved again, a retry recorded
		// again and another body accepted (found by a review).
		return "", 0, err
	}
	if old.Checkin.UserID != c.UserID {
		return "", 0, nil // another user's: scoping ignores it
	}
	ttl, err := s.do(ctx, "PTTL", key)
	if err != nil {
		return "", 0, err
	}
	ms, _ := ttl.(int64)
	switch {
	case ms == -2: // expired meanwhile
		return "", 0, nil
	case ms <= 0: // no TTL: not written so by the service; keep it no longer than a new one
		ms = s.ttl.Milliseconds()
	}
	return v.(string), ms, nil
}

// legacyLookups tells whether records of other layouts may still exist (loadLookups); when
// Redis cannot tell, it looks them up.
func (s *IdempotencyStore) legacyLookups(ctx context.Context) bool {
	lookups, err := s.loadLookups(ctx)
	if err != nil {
		return true
	}
	now := s.now().UnixMilli()
	for _, l := range lookups {
		if now < l.until {
			return true
		}
	}
	return false
}

// layoutRefresh is how often a store reads the layouts again (and records its own as in use when
// another process recorded another): while processes of two layouts run side by side (a rolling
// change of INGEST_MIN_REPLICAS), each records the other's as left again and again, so each keeps
// looking up the other's records.
const layoutRefresh = time.Minute

// loadLookups reads where records of other layouts may still exist, at the first call and then
// every layoutRefresh. Requests that find no layouts read yet wait for one load rather than each
// running their own; while one request refreshes them the others go on with what was read before.
// A failed first load fails the request (and is tried again by the next); a failed refresh keeps
// what was read before.
func (s *IdempotencyStore) loadLookups(ctx context.Context) ([]idemLookup, error) {
	fresh := func() (bool, bool, []idemLookup) {
		s.legacyMu.Lock()
		defer s.legacyMu.Unlock()
		return s.legacyKnown, s.now().Sub(s.loadedAt) < s.refresh, s.lookups
	}
	known, ok, lookups := fresh()
	switch {
	case known && ok:
		return lookups, nil
	case known:
		if !s.loadMu.TryLock() {
			return lookups, nil // another request refreshes them: no request waits for a refresh
		}
	default:
		s.loadMu.Lock()
	}
	defer s.loadMu.Unlock()
	if known, ok, lookups := fresh(); known && ok {
		return lookups, nil
	}
	lookups, err := s.readLookups(ctx)
	s.legacyMu.Lock()
	defer s.legacyMu.Unlock()
	if err != nil {
		if s.legacyKnown {
			return s.lookups, nil
		}
		return nil, err
	}
	s.legacyKnown, s.lookups, s.loadedAt = true, lookups, s.now()
	return lookups, nil
}

// readLookups reads where records of other layouts may still exist, recording this store's
// layout as in use.
func (s *IdempotencyStore) readLookups(ctx context.Context) ([]idemLookup, error) {
	if !s.sinceKnown { // fixed once set: read at the first load only
		served, err := servedBefore(ctx, s.client, s.keys) // before scopedSince marks the keyspace
		if err != nil {
			return nil, err
		}
		s.served = served
		since, err := s.scopedSince(ctx)
		if err != nil {
			return nil, err
		}
		s.since, s.sinceKnown = since, true
	}
	since := s.since
	retired, err := s.recordLayout(ctx)
	if err != nil {
		return nil, err
	}
	compact, err := s.recordFormat(ctx)
	if err != nil {
		return nil, err
	}
	s.compact.Store(compact)
	var lookups []idemLookup
	for layout, at := range retired {
		lookups = append(lookups, idemLookup{layout: layout, until: at + s.ttl.Milliseconds()})
	}
	slices.SortFunc(lookups, func(a, b idemLookup) int { return cmp.Compare(b.until, a.until) })
	if since > 0 {
		lookups = append(lookups, idemLookup{until: since + s.ttl.Milliseconds()})
	}
	return lookups, nil
}

// Fields of <prefix>:meta about the idempotency layouts and records.
const (
	metaIdemLayout  = "idem-layout"   // the layout in use
	metaIdemRetired = "idem-retired:" // + layout: when it was left, ms since epoch
	metaIdemFormat  = "idem-format"   // how published records are written: ops.RecordFormatCompact or ops.RecordFormatJSON
)

// recordFormat tells whether published records are written compact: when <prefix>:meta says so,
// and first of all in a keyspace no release served before this store's first load (served),
// where no earlier release ever ran, so that a new deployment starts compact (recorded in the
// meta, for every process after it). A keyspace that earlier releases served keeps writing
// JSON, which they read, until an operator switches it (`checkins idempotency format compact`,
// IdempotencyRecords) once none of them runs any more.
func (s *IdempotencyStore) recordFormat(ctx context.Context) (bool, error) {
	for range 2 {
		v, err := s.client.HGet(ctx, s.keys.Meta(), metaIdemFormat).Result()
		switch {
		case err == nil:
			return v == ops.RecordFormatCompact, nil
		case !errors.Is(err, redis.Nil):
			return false, fmt.Errorf("HGET %s %s: %w", s.keys.Meta(), metaIdemFormat, err)
		case s.served:
			return false, nil
		}
		set, err := s.client.HSetNX(ctx, s.keys.Meta(), metaIdemFormat, ops.RecordFormatCompact).Result()
		if err != nil {
			return false, fmt.Errorf("HSETNX %s %s: %w", s.keys.Meta(), metaIdemFormat, err)
		}
		if set {
			return true, nil
		}
		// Another process recorded a format meanwhile: read it.
	}
	return false, nil
}

// servedBefore tells whether a release may have taken check-ins in keys' keyspace: a partition of
// its event stream ever held an entry (trimming does not reset that), or a release since
// checkinIds were scoped by user marked the keyspace (idem-scoped-since, which it marks at its
// first check-in even while the stream is empty; a partition migration starts the new
// partitions empty when every entry was trimmed).
func servedBefore(ctx context.Context, client redis.UniversalClient, keys KeySpace) (bool, error) {
	for _, st := range keys.Partitions().Streams() {
		used, err := everUsed(ctx, client, st)
		if used || err != nil {
			return used, err
		}
	}
	n, err := client.Exists(ctx, keys.IdempotencyScopedSince()).Result()
	if err != nil {
		return false, fmt.Errorf("EXISTS %s: %w", keys.IdempotencyScopedSince(), err)
	}
	return n > 0, nil
}

// IdempotencyRecords implements ops.IdempotencyRecords: the format in <prefix>:meta.
type IdempotencyRecords struct {
	client redis.UniversalClient
	keys   KeySpace
}

// NewIdempotencyRecords reads and sets the records' format of keys' keyspace.
func NewIdempotencyRecords(client redis.UniversalClient, keys KeySpace) IdempotencyRecords {
	return IdempotencyRecords{client: client, keys: keys}
}

// Format implements ops.IdempotencyRecords. When none is recorded it is the one the first
// check-in will record: RecordFormatJSON, the format of every release before the compact one,
// where a release served the keyspace; otherwise RecordFormatCompact.
func (r IdempotencyRecords) Format(ctx context.Context) (string, error) {
	v, err := r.client.HGet(ctx, r.keys.Meta(), metaIdemFormat).Result()
	switch {
	case errors.Is(err, redis.Nil):
		served, err := servedBefore(ctx, r.client, r.keys)
		if err != nil || served {
			return ops.RecordFormatJSON, err
		}
		return ops.RecordFormatCompact, nil
	case err != nil:
		return "", fmt.Errorf("HGET %s %s: %w", r.keys.Meta(), metaIdemFormat, err)
	}
	return v, nil
}

// SetFormat implements ops.IdempotencyRecords: the API processes follow within a minute
// (layoutRefresh, when they read the layouts again).
func (r IdempotencyRecords) SetFormat(ctx context.Context, format string) error {
	if err := ops.CheckRecordFormat(format); err != nil {
		return err
	}
	if err := r.client.HSet(ctx, r.keys.Meta(), metaIdemFormat, format).Err(); err != nil {
		return fmt.Errorf("HSET %s %s: %w", r.keys.Meta(), metaIdemFormat, err)
	}
	return nil
}

// recordLayoutLua: KEYS[1] the meta hash; ARGV: this keyspace's layout, now (ms), '1' when no
// layout is recorded and an earlier version may have written records (in ARGV[4]'s layout).
// When the recorded layout is another, it records that one as left now and this one as in use.
// Returns the hash.
var recordLayoutLua = redis.NewScript(`
local cur = redis.call('HGET', KEYS[1], '` + metaIdemLayout + `')
if not cur and ARGV[3] == '1' then cur = ARGV[4] end
if cur and cur ~= ARGV[1] then redis.call('HSET', KEYS[1], '` + metaIdemRetired + `' .. cur, ARGV[2]) end
if cur ~= ARGV[1] then redis.call('HSET', KEYS[1], '` + metaIdemLayout + `', ARGV[1]) end
return redis.call('HGETALL', KEYS[1])
`)

// recordLayout records this keyspace's layout in <prefix>:meta and returns when each other
// layout was left.
func (s *IdempotencyStore) recordLayout(ctx context.Context) (map[string]int64, error) {
	cur := s.keys.IdempotencyLayout()
	earlier := "0"
	_, err := s.client.HGet(ctx, s.keys.Meta(), metaIdemLayout).Result()
	switch {
	case errors.Is(err, redis.Nil) && cur == IdemLayoutUser && !s.keys.Cluster:
		// The layout of every version before layouts were recorded: nothing to look up or to
		// record (a single server's keys stay those of before).
		return nil, nil
	case errors.Is(err, redis.Nil) && cur == IdemLayoutUser:
		// On a cluster it is recorded: a partition migration's first store of the new layout
		// then knows to look the users' slots up. It guessed from the new partitions' streams
		// having held an entry, and after a migration of a stream RETENTION had emptied (none
		// copied) a retry of a check-in of before was recorded again (found by a review).
	case errors.Is(err, redis.Nil):
		// Versions before layouts were recorded wrote IdemLayoutUser; they ran here if a
		// partition of the stream ever held an entry.
		for _, st := range s.keys.Partitions().Streams() {
			used, err := everUsed(ctx, s.client, st)
			if err != nil {
				return nil, err
			}
			if used {
				earlier = "1"
				break
			}
		}
	case err != nil:
		return nil, fmt.Errorf("HGET %s %s: %w", s.keys.Meta(), metaIdemLayout, err)
	}
	v, err := recordLayoutLua.Run(ctx, s.client, []string{s.keys.Meta()}, cur, s.now().UnixMilli(), earlier, IdemLayoutUser).Result()
	if err != nil {
		return nil, fmt.Errorf("recording the idempotency layout in %s: %w", s.keys.Meta(), err)
	}
	fields, _ := v.([]any)
	out := map[string]int64{}
	for i := 0; i+1 < len(fields); i += 2 {
		name, _ := fields[i].(string)
		layout, ok := strings.CutPrefix(name, metaIdemRetired)
		if !ok || layout == cur {
			continue
		}
		val, _ := fields[i+1].(string)
		if at, err := strconv.ParseInt(val, 10, 64); err == nil {
			out[layout] = at
		}
	}
	return out, nil
}

// streamEverUsed tells whether the event stream ever got an entry (its last generated ID is not
// 0-0; trimming does not reset it).
func (s *IdempotencyStore) streamEverUsed(ctx context.Context) (bool, error) {
	return everUsed(ctx, s.client, s.keys.Stream())
}

// everUsed tells whether stream ever got an entry.
func everUsed(ctx context.Context, client redis.UniversalClient, stream string) (bool, error) {
	xs, err := client.XInfoStream(ctx, stream).Result()
	switch {
	case isNoSuchKey(err):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("XINFO STREAM %s: %w", stream, err)
	}
	return xs.LastGeneratedID != "0-0", nil
}

// scopedSince reads (or, first, sets) when this keyspace got scoped keys: now, or 0 when its
// event stream never held an entry, in which case no earlier version ever accepted a check-in
// here. The stream's existence alone does not tell: serve's projectors create it empty (their
// consumer group) before the API takes its first check-in, and every new deployment would then
// look for legacy records, a round trip more per check-in, for IDEMPOTENCY_TTL.
func (s *IdempotencyStore) scopedSince(ctx context.Context) (int64, error) {
	used, err := s.streamEverUsed(ctx)
	if err != nil {
		return 0, err
	}
	mark := "0"
	if used {
		mark = strconv.FormatInt(s.now().UnixMilli(), 10)
	}
	v, err := s.do(ctx, "SET", s.keys.IdempotencyScopedSince(), mark, "NX", "GET")
	switch {
	case errors.Is(err, redis.Nil):
		v = mark
	case err != nil:
		return 0, err
	}
	str, _ := v.(string)
	since, err := strconv.ParseInt(str, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%s holds %q, not a time in ms", s.keys.IdempotencyScopedSince(), v)
	}
	return since, nil
}

// MarkPublished implements command.IdempotencyStore: it rewrites the record with the published
// state only if it still exists (XX) and keeps its TTL; no script, one plain command.
func (s *IdempotencyStore) MarkPublished(ctx context.Context, rec command.IdempotencyRecord) error {
	b, err := s.encodePublished(rec)
	if err != nil {
		return err
	}
	_, err = s.do(ctx, "SET", s.key(rec.Checkin), b, "XX", "KEEPTTL")
	if errors.Is(err, redis.Nil) {
		return nil // expired or never reserved: nothing to mark, and nothing must be created
	}
	return err
}

// MarkPublishedAll implements command.BatchMarker: the MarkPublished commands of recs in one
// pipeline, one round trip.
func (s *IdempotencyStore) MarkPublishedAll(ctx context.Context, recs []command.IdempotencyRecord) []error {
	errs := make([]error, len(recs))
	cmds := make([]*redis.StatusCmd, len(recs))
	pipe := s.client.Pipeline()
	for i, rec := range recs {
		b, err := s.encodePublished(rec)
		if err != nil {
			errs[i] = err
			continue
		}
		cmds[i] = pipe.SetArgs(ctx, s.key(rec.Checkin), b, redis.SetArgs{Mode: "XX", KeepTTL: true})
	}
	_, _ = pipe.Exec(ctx) // each command's own error is read below
	for i, cmd := range cmds {
		if cmd != nil && errs[i] == nil {
			if err := cmd.Err(); err != nil && !errors.Is(err, redis.Nil) {
				errs[i] = err // redis.Nil: expired or never reserved, as MarkPublished
			}
		}
	}
	return errs
}

// takeOverLua replaces an unpublished reservation with ARGV[2] if it is still held by the owner
// the caller saw (ARGV[1]; ” matches records from before owners). It returns 1 when it did,
// otherwise the record stored now (nil: none). Redis 7 has no SET IFEQ, and the owner sits
// inside the JSON, which older records lack: hence a script, on this rare path only.
var takeOverLua = redis.NewScript(`
local v = redis.call('GET', KEYS[1])
if not v then return false end
if string.sub(v, 1, 1) == 'R' then
  local ok, r = pcall(cjson.decode, string.sub(v, 2))
  if ok and type(r) == 'table' and (r.o or '') == ARGV[1] then
    redis.call('SET', KEYS[1], ARGV[2], 'KEEPTTL')
    return 1
  end
end
return v
`)

// releaseLua deletes KEYS[1] only if it still holds exactly ARGV[1].
var releaseLua = redis.NewScript(`
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
`)

func (s *IdempotencyStore) run(ctx context.Context, script *redis.Script, key string, args ...any) (any, error) {
	if s.pipeline != nil {
		return s.pipeline.Run(ctx, script, []string{key}, args...)
	}
	return script.Run(ctx, s.client, []string{key}, args...).Result()
}

// TakeOver implements command.IdempotencyStore with one script call, keeping the record's TTL.
func (s *IdempotencyStore) TakeOver(ctx context.Context, seen, next command.IdempotencyRecord) (bool, *command.IdempotencyRecord, error) {
	b, err := encodeRecord(stateReserved, next)
	if err != nil {
		return false, nil, err
	}
	id := next.Checkin.ID
	v, err := s.run(ctx, takeOverLua, s.key(next.Checkin), seen.Owner, b)
	if errors.Is(err, redis.Nil) {
		return false, nil, nil
	}
	if err != nil {
		return false, nil, err
	}
	if n, ok := v.(int64); ok && n == 1 {
		return true, nil, nil
	}
	cur, err := decodeRecord(id, v)
	return false, cur, err
}

// Release implements command.IdempotencyStore: the record goes only if it is still the
// reservation rec, byte for byte (so neither a taker's reservation nor a published record).
func (s *IdempotencyStore) Release(ctx context.Context, rec command.IdempotencyRecord) error {
	b, err := encodeRecord(stateReserved, rec)
	if err != nil {
		return err
	}
	_, err = s.run(ctx, releaseLua, s.key(rec.Checkin), b)
	return err
}
