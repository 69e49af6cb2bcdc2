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
// ('R' reserved, 'P' published) followed by the first accepted check-in as JSON.
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
}

func encodeRecord(state byte, rec command.IdempotencyRecord) ([]byte, error) {
	c := rec.Checkin
	b, err := json.Marshal(idemRecord{Fingerprint: rec.Fingerprint, ID: c.ID, UserID: c.UserID, LocationID: c.LocationID,
		StarRating: c.StarRating, Timestamp: c.Timestamp, RecordedAt: rec.RecordedAt})
	if err != nil {
		return nil, err
	}
	return append([]byte{state}, b...), nil
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
	old, ok := v.(string)
	if !ok || len(old) < 2 || (old[0] != stateReserved && old[0] != statePublished) {
		return nil, fmt.Errorf("idempotency record for %q is corrupt: %q", id, v)
	}
	var r idemRecord
	if err := json.Unmarshal([]byte(old[1:]), &r); err != nil {
		return nil, fmt.Errorf("idempotency record for %q is corrupt: %w", id, err)
	}
	return &command.IdempotencyRecord{
		Fingerprint: r.Fingerprint,
		Checkin:     domain.Checkin{ID: r.ID, UserID: r.UserID, LocationID: r.LocationID, StarRating: r.StarRating, Timestamp: r.Timestamp},
		RecordedAt:  r.RecordedAt,
		Published:   old[0] == statePublished,
	}, nil
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
