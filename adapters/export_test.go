package adapters

import (
	"encoding/json"
	"net/url"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/checkins/checkins/app/command"
)

// NewClusterClientWith builds the service's cluster client with one remedy for a failover or the
// other: a slot map reloaded every reload, and/or reloaded on connection errors.
func NewClusterClientWith(o ClientOptions, reload time.Duration, reloadOnErrors bool) (*redis.ClusterClient, error) {
	u, err := url.Parse(o.URL)
	if err != nil {
		return nil, err
	}
	return newClusterClientWith(o, u, reload, reloadOnErrors)
}

// EncodeRecord is encodeRecord.
var EncodeRecord = encodeRecord

// EncodeRecordJSON is the record as encoding/json writes idemRecord: what encodeRecord must give.
func EncodeRecordJSON(state byte, rec command.IdempotencyRecord) ([]byte, error) {
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

// WithClock makes the store read the time from now.
func (s *IdempotencyStore) WithClock(now func() time.Time) *IdempotencyStore {
	s.now = now
	return s
}

// WithLayoutRefresh makes the store read the layouts again after d.
func (s *IdempotencyStore) WithLayoutRefresh(d time.Duration) *IdempotencyStore {
	s.refresh = d
	return s
}

// PackNumbers is ARGV[1] of an applyScript call whose numbers are vs.
func PackNumbers(vs []int) any {
	sa := newScriptArgs(0)
	var b []byte
	for _, v := range vs {
		b = sa.put(b, v)
	}
	return sa.finish(b)[0]
}

// UnpackNumbersLua is unpackNumbersLua: applyScript's decoder of its numbers without cmsgpack.
const UnpackNumbersLua = unpackNumbersLua

// RatioScaleLua is the scale applyScript multiplies a zscaledratioatmin ratio by.
const RatioScaleLua = ratioScaleLua

// EncodeCompact is encodeCompact.
var EncodeCompact = encodeCompact

// DecodeRecord is decodeRecord.
var DecodeRecord = decodeRecord
