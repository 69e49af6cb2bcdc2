package adapters

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/checkins/checkins/app/command"
	"github.com/checkins/checkins/domain"
)

// IdempotencyStore keeps one record per accepted checkinId, for ttl. A record is a state byte
// ('R' reserved, 'P' published) followed by the first accepted check-in as JSON; a reservation
// also names its owner and when it was taken (fields older records lack: they read as reserved
// at their RecordedAt by no owner in particular).
type IdempotencyStore struct {
	client   redis.UniversalClient
	pipeline *AutoPipeline // nil: one round trip per call
	keys     KeySpace
	ttl      time.Duration
}

// NewIdempotencyStore keeps records for ttl (a retry later than that is still counted once by the
// projections, but answers as a new check-in).
func NewIdempotencyStore(client redis.UniversalClient, keys KeySpace, ttl time.Duration) *IdempotencyStore {
	return &IdempotencyStore{client: client, keys: keys, ttl: ttl}
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

func encodeRecord(state byte, rec command.IdempotencyRecord) ([]byte, error) {
	c := rec.Checkin
	r := idemRecord{Fingerprint: rec.Fingerprint, ID: c.ID, UserID: c.UserID, LocationID: c.LocationID,
		StarRating: c.StarRating, Timestamp: c.Timestamp, RecordedAt: rec.RecordedAt}
	if state == stateReserved {
		r.Owner = rec.Owner
		if rec.ReservedAt != rec.RecordedAt {
			r.ReservedAt = rec.ReservedAt
		}
	}
	b, err := json.Marshal(r)
	if err != nil {
		return nil, err
	}
	return append([]byte{state}, b...), nil
}

func decodeRecord(id string, v any) (*command.IdempotencyRecord, error) {
	old, ok := v.(string)
	if !ok || len(old) < 2 || (old[0] != stateReserved && old[0] != statePublished) {
		return nil, fmt.Errorf("idempotency record for %q is corrupt: %q", id, v)
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

// Reserve implements command.IdempotencyStore with one SET NX GET round trip.
func (s *IdempotencyStore) Reserve(ctx context.Context, rec command.IdempotencyRecord) (*command.IdempotencyRecord, error) {
	b, err := encodeRecord(stateReserved, rec)
	if err != nil {
		return nil, err
	}
	id := rec.Checkin.ID
	v, err := s.do(ctx, "SET", s.keys.Idempotency(id), b, "NX", "GET", "PX", s.ttl.Milliseconds())
	if errors.Is(err, redis.Nil) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return decodeRecord(id, v)
}

// MarkPublished implements command.IdempotencyStore: it rewrites the record with the published
// state only if it still exists (XX) and keeps its TTL; no script, one plain command.
func (s *IdempotencyStore) MarkPublished(ctx context.Context, rec command.IdempotencyRecord) error {
	b, err := encodeRecord(statePublished, rec)
	if err != nil {
		return err
	}
	_, err = s.do(ctx, "SET", s.keys.Idempotency(rec.Checkin.ID), b, "XX", "KEEPTTL")
	if errors.Is(err, redis.Nil) {
		return nil // expired or never reserved: nothing to mark, and nothing must be created
	}
	return err
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
	v, err := s.run(ctx, takeOverLua, s.keys.Idempotency(id), seen.Owner, b)
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
	_, err = s.run(ctx, releaseLua, s.keys.Idempotency(rec.Checkin.ID), b)
	return err
}
