package adapters

import (
	"context"
	"errors"
	"fmt"

	"github.com/redis/go-redis/v9"

	"github.com/checkins/checkins/app/command"
	"github.com/checkins/checkins/domain"
)

// ReservingPublisher records a check-in in one script call: it counts the request against its
// user's limit, reserves the checkinId and, when both let it, runs Watermill's XADD of the event
// and stores the record as published, all in one step (command.ReservingPublisher). The two
// round trips in a row of the other path (the limit and the reservation, then the XADD) and
// the mark after the answer are one command; the XADD is the one Watermill's publisher makes,
// sent inside the script by the auto-pipeline's hook (xaddScript).
//
// The reservation's key and the stream must be on one server, and on a cluster in one slot: so
// it runs on a single Redis, and on a cluster with stream partitions, where a user's records and
// limit state live in the slot of the user's partition (KeySpace.IngestInOneSlot); not with one
// stream on a cluster. And not with INGEST_MIN_REPLICAS, whose WAIT follows a plain XADD (a
// record stored as published before the replicas confirm would answer a retry as recorded while
// the entry may still be lost in a failover).
type ReservingPublisher struct {
	pub     *EventPublisher
	idem    *IdempotencyStore
	limiter *RedisRateLimiter // nil: no per-user limit
}

// NewReservingPublisher publishes through pub, which must send its XADDs through p's hook
// (NewPipelinedEventPublisher), and reserves in idem; limiter (nil: none) is the per-user limit
// the handler counts requests against, whose key and policy the script uses.
func NewReservingPublisher(pub *EventPublisher, p *AutoPipeline, idem *IdempotencyStore, limiter *RedisRateLimiter) (*ReservingPublisher, error) {
	switch {
	case pub == nil || idem == nil || p == nil:
		return nil, errors.New("adapters: ReservingPublisher needs a publisher, an auto-pipeline and an idempotency store")
	case pub.pipeline != p:
		return nil, errors.New("adapters: ReservingPublisher: the publisher does not send its XADDs through this auto-pipeline (NewPipelinedEventPublisher)")
	}
	if _, cluster := p.client.(*redis.ClusterClient); cluster && !idem.keys.IngestInOneSlot() {
		return nil, errors.New("adapters: ReservingPublisher: on this cluster keyspace (one stream) the reservation and the stream are in different slots")
	}
	return &ReservingPublisher{pub: pub, idem: idem, limiter: limiter}, nil
}

// ingestLua: KEYS are the user's rate key when ARGV[1] is '1' (then ARGV[2..4]: burst, rate,
// period), the reservation's key, and the stream; after the limit's arguments come the record
// (stored as published) and its PX, then the XADD's arguments after the stream. It counts the
// request (a refused one writes nothing and returns gcra's four values, false, false), then SET NX GET the
// record: a taken key returns the limit's values and what it holds. Otherwise it adds the
// entry and returns the limit's values, false and the entry's ID. Should the XADD fail, the
// record is deleted again and the error is the reply: the checkinId stays free.
var ingestLua = redis.NewScript(gcraLua + `
local allowed, remaining, retry, reset = 1, -1, '-1', '-1'
local k, i = 1, 2
if ARGV[1] == '1' then
  allowed, remaining, retry, reset = gcra(KEYS[1], tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4]))
  if allowed == 0 then return {allowed, remaining, retry, reset, false, false} end
  k, i = 2, 5
end
local old = redis.call('SET', KEYS[k], ARGV[i], 'NX', 'GET', 'PX', ARGV[i+1])
if old then return {allowed, remaining, retry, reset, old, false} end
local id = redis.pcall('XADD', KEYS[k+1], unpack(ARGV, i+2))
if type(id) == 'table' and id.err then
  redis.call('DEL', KEYS[k])
  return id
end
return {allowed, remaining, retry, reset, false, id}
`)

// ReserveAndPublish implements command.ReservingPublisher. It declines (ok false) while legacy
// idempotency records may exist (their lookup is a round trip of its own), and when asked to
// limit without a limiter.
func (r *ReservingPublisher) ReserveAndPublish(ctx context.Context, rec command.IdempotencyRecord, correlationID string, limit bool) (command.RateDecision, *command.IdempotencyRecord, bool, error) {
	none := command.RateDecision{Allowed: true, Remaining: -1, RetryAfter: -1, ResetAfter: -1}
	if (limit && r.limiter == nil) || r.idem.legacyLookups(ctx) {
		return none, nil, false, nil
	}
	b, err := encodeRecord(statePublished, rec)
	if err != nil {
		return none, nil, true, err
	}
	c := rec.Checkin
	x := &xaddScript{script: ingestLua}
	if limit {
		key, args := r.limiter.gcraArgs(c.UserID)
		x.keys = append(x.keys, key)
		x.args = append(append(x.args, "1"), args...)
	} else {
		x.args = append(x.args, "0")
	}
	x.keys = append(x.keys, r.idem.key(c))
	x.args = append(x.args, b, r.idem.ttl.Milliseconds())
	ev := domain.CheckinRecorded{Checkin: c, RecordedAt: rec.RecordedAt, Fingerprint: rec.Fingerprint}
	perr := r.pub.PublishCheckinRecorded(context.WithValue(ctx, xaddScriptKey{}, x), ev, correlationID)
	if x.reply == nil {
		// The script's outcome is unknown (or it never ran): both or neither of the record and
		// the entry are stored, so a retry finds out which.
		if perr == nil {
			perr = errors.New("the XADD did not go through the ingest script")
		}
		return none, nil, true, perr
	}
	d, old, err := decisionOf(c.UserID, x.reply) // without the limit: none, as the script answers
	if err != nil {
		return none, nil, true, err
	}
	if !d.Allowed {
		return d, nil, true, nil
	}
	if old != nil {
		existing, err := decodeRecord(c.ID, old)
		return d, existing, true, err
	}
	if perr != nil {
		return d, nil, true, fmt.Errorf("publish %s %q: %w", domain.EventCheckinRecorded, c.ID, perr)
	}
	return d, nil, true, nil
}
