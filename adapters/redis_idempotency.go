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

// IdempotencyStore keeps one record per accepted checkinId, for ttl.
type IdempotencyStore struct {
	client redis.UniversalClient
	keys   KeySpace
	ttl    time.Duration
}

// NewIdempotencyStore keeps records for ttl (a retry later than that is still counted once by the
// projections, but answers as a new check-in).
func NewIdempotencyStore(client redis.UniversalClient, keys KeySpace, ttl time.Duration) *IdempotencyStore {
	return &IdempotencyStore{client: client, keys: keys, ttl: ttl}
}

type idemRecord struct {
	Fingerprint string `json:"f"`
	ID          string `json:"id"`
	UserID      int64  `json:"u"`
	LocationID  int64  `json:"l"`
	StarRating  int    `json:"s"`
	Timestamp   int64  `json:"t"`
	RecordedAt  int64  `json:"r"`
	Published   bool   `json:"p,omitempty"`
}

// markPublished flips the flag only if the record is still there, keeping its TTL.
var markPublished = redis.NewScript(`
local v = redis.call('GET', KEYS[1])
if not v then return 0 end
local r = cjson.decode(v)
r['p'] = true
redis.call('SET', KEYS[1], cjson.encode(r), 'KEEPTTL')
return 1
`)

// Reserve implements command.IdempotencyStore with one SET NX GET round trip.
func (s *IdempotencyStore) Reserve(ctx context.Context, rec command.IdempotencyRecord) (*command.IdempotencyRecord, error) {
	c := rec.Checkin
	b, err := json.Marshal(idemRecord{Fingerprint: rec.Fingerprint, ID: c.ID, UserID: c.UserID, LocationID: c.LocationID,
		StarRating: c.StarRating, Timestamp: c.Timestamp, RecordedAt: rec.RecordedAt})
	if err != nil {
		return nil, err
	}
	old, err := s.client.SetArgs(ctx, s.keys.Idempotency(c.ID), b, redis.SetArgs{Mode: "NX", Get: true, TTL: s.ttl}).Result()
	if errors.Is(err, redis.Nil) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var r idemRecord
	if err := json.Unmarshal([]byte(old), &r); err != nil {
		return nil, fmt.Errorf("idempotency record for %q is corrupt: %w", c.ID, err)
	}
	return &command.IdempotencyRecord{
		Fingerprint: r.Fingerprint,
		Checkin:     domain.Checkin{ID: r.ID, UserID: r.UserID, LocationID: r.LocationID, StarRating: r.StarRating, Timestamp: r.Timestamp},
		RecordedAt:  r.RecordedAt,
		Published:   r.Published,
	}, nil
}

// MarkPublished implements command.IdempotencyStore.
func (s *IdempotencyStore) MarkPublished(ctx context.Context, checkinID string) error {
	return markPublished.Run(ctx, s.client, []string{s.keys.Idempotency(checkinID)}).Err()
}
