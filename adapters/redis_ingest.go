package adapters

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

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
	script  *redis.Script     // ingestScript of limiter's policy and idem's TTL
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
	var l *command.RateLimit
	if limiter != nil {
		l = &limiter.limit
	}
	return &ReservingPublisher{pub: pub, idem: idem, limiter: limiter, script: ingestScript(l, idem.ttl)}, nil
}

// ingestScript is the script of one ReservingPublisher: the rate policy (l, nil: none) and the
// reservation's PX are in its text. KEYS are the user's rate key when ARGV[1] is '1', the
// reservation's key, and the stream; ARGV[2] is the record (stored as published), then come
// the XADD's: '1' and the values of ingestEntryFields (the entry the API publishes: the script
// holds its field names), or '0' and the XADD's arguments after the stream. It counts the
// request (a refused one writes nothing and returns gcra's four values, false, false), then
// SET NX GET the record: a taken key returns the limit's values and what it holds. Otherwise it
// adds the entry and returns the limit's values, false and the entry's ID. Should the XADD
// fail, the record is deleted again and the error is the reply: the checkinId stays free.
//
// What a request sends is what varies: the policy, the PX and the ten field names were 15 of
// its 30 arguments, and each argument costs Redis about 1,500 instructions (read, made a Redis
// string, then a Lua string, then a Redis string again for the XADD).
func ingestScript(l *command.RateLimit, px time.Duration) *redis.Script {
	var b strings.Builder
	b.WriteString(gcraLua)
	b.WriteString("local allowed, remaining, retry, reset = 1, -1, -1, -1\nlocal k = 1\n")
	if l != nil {
		fmt.Fprintf(&b, "if ARGV[1] == '1' then\n  allowed, remaining, retry, reset = gcra(KEYS[1], %d, %d, %s, '%d')\n",
			l.Burst, l.Rate, strconv.FormatFloat(l.Period.Seconds(), 'g', -1, 64), gcraTTL(*l))
		b.WriteString("  if allowed == 0 then return {allowed, remaining, retry, reset, false, false} end\n  k = 2\nend\n")
	}
	fmt.Fprintf(&b, "local old = redis.call('SET', KEYS[k], ARGV[2], 'NX', 'GET', 'PX', '%d')\n", px.Milliseconds())
	b.WriteString("if old then return {allowed, remaining, retry, reset, old, false} end\nlocal id\nif ARGV[3] == '1' then\n  id = redis.pcall('XADD', KEYS[k+1], '*'")
	for j, f := range ingestEntryFields {
		fmt.Fprintf(&b, ", '%s', ARGV[%d]", f, 4+j)
	}
	b.WriteString(`)
else
  id = redis.pcall('XADD', KEYS[k+1], unpack(ARGV, 4))
end
if type(id) == 'table' and id.err then
  redis.call('DEL', KEYS[k])
  return id
end
return {allowed, remaining, retry, reset, false, id}
`)
	return redis.NewScript(b.String())
}

// ingestEntryFields are the fields of the entry the API publishes for a check-in (the event's
// own, with its fingerprint, the correlation ID and Watermill's UUID), in the stream's order:
// what FlatMarshaller writes for NewCheckinRecordedMessage.
var ingestEntryFields = func() []string {
	ev := domain.CheckinRecorded{Checkin: domain.Checkin{ID: "c", UserID: 1, LocationID: 1, Timestamp: 1},
		RecordedAt: 1, Fingerprint: "f"}
	values, err := FlatMarshaller{}.Marshal("", NewCheckinRecordedMessage(ev, "correlation"))
	if err != nil {
		panic(err)
	}
	fields := slices.Sorted(maps.Keys(values))
	for _, f := range fields {
		if strings.ContainsFunc(f, func(r rune) bool { return r == '\'' || r == '\\' || r < ' ' }) {
			panic("adapters: entry field " + strconv.Quote(f) + " cannot be a Lua literal")
		}
	}
	return fields
}()

// ReserveAndPublish implements command.ReservingPublisher. It declines (ok false) while legacy
// idempotency records may exist (their lookup is a round trip of its own), and when asked to
// limit without a limiter.
func (r *ReservingPublisher) ReserveAndPublish(ctx context.Context, rec command.IdempotencyRecord, correlationID string, limit bool) (command.RateDecision, *command.IdempotencyRecord, bool, error) {
	none := command.RateDecision{Allowed: true, Remaining: -1, RetryAfter: -1, ResetAfter: -1}
	if (limit && r.limiter == nil) || r.idem.legacyLookups(ctx) {
		return none, nil, false, nil
	}
	b, err := r.idem.encodePublished(rec)
	if err != nil {
		return none, nil, true, err
	}
	c := rec.Checkin
	// Room for what xaddInScript appends (the stream; the flag and the entry's values), so the
	// script call's keys and arguments are built in these two slices.
	x := &xaddScript{script: r.script, fields: ingestEntryFields,
		keys: make([]string, 0, 3), args: make([]any, 0, 3+len(ingestEntryFields))}
	if limit {
		x.keys = append(x.keys, r.limiter.keys.RateLimitUser(c.UserID))
		x.args = append(x.args, "1")
	} else {
		x.args = append(x.args, "0")
	}
	x.keys = append(x.keys, r.idem.key(c))
	x.args = append(x.args, b)
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
