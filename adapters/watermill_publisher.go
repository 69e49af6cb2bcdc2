package adapters

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-redisstream/pkg/redisstream"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"

	"github.com/checkins/checkins/app/command"
	"github.com/checkins/checkins/domain"
)

// MetaCorrelationID carries the HTTP request's correlation ID into the event and back into logs.
const MetaCorrelationID = "correlation_id"

// EventPublisher records events on the event stream through Watermill's Redis Streams publisher.
type EventPublisher struct {
	pub      *redisstream.Publisher
	parts    Partitions
	pipeline *AutoPipeline // the hook its client sends XADDs through (NewPipelinedEventPublisher)
	clocks   streamClocks  // for the fenced XADD
}

// NewEventPublisher owns client: Watermill's Publisher.Close closes it, so give it its own.
// The stream is never trimmed here: MAXLEN ignores consumer groups and could delete events no
// projection has processed yet.
func NewEventPublisher(client redis.UniversalClient, keys KeySpace, logger watermill.LoggerAdapter) (*EventPublisher, error) {
	client.AddHook(fieldOrderHook{})
	return newEventPublisher(client, keys, logger)
}

func newEventPublisher(client redis.UniversalClient, keys KeySpace, logger watermill.LoggerAdapter) (*EventPublisher, error) {
	pub, err := redisstream.NewPublisher(redisstream.PublisherConfig{
		Client:     client,
		Marshaller: FlatMarshaller{},
	}, logger)
	if err != nil {
		return nil, fmt.Errorf("watermill publisher: %w", err)
	}
	// Each check-in to its user's partition of keys (one stream unless keys.WithPartitions).
	return &EventPublisher{pub: pub, parts: keys.Partitions()}, nil
}

// NewPipelinedEventPublisher is NewEventPublisher on a client whose commands it routes through
// p (AutoPipeline.Hook): the XADDs of concurrent check-ins share round trips, and a
// ReservingPublisher can run them inside its script.
func NewPipelinedEventPublisher(client redis.UniversalClient, p *AutoPipeline, keys KeySpace, logger watermill.LoggerAdapter) (*EventPublisher, error) {
	client.AddHook(fieldOrderHook{}) // first: the pipeline's hook sends the XADD itself
	client.AddHook(p.Hook())
	pub, err := newEventPublisher(client, keys, logger)
	if err != nil {
		return nil, err
	}
	pub.pipeline = p
	return pub, nil
}

// WithPartitions publishes each check-in to its user's partition of parts (Partitions.StreamOf),
// so one user's check-ins keep their order in one stream.
func (p *EventPublisher) WithPartitions(parts Partitions) *EventPublisher {
	p.parts = parts
	return p
}

// PublishCheckinRecorded implements command.EventPublisher; it returns after XADD succeeded.
// Only errors raised before the XADD was handed to Redis count as command.ErrNotPublished: once
// sent, even an error reply proves nothing, since go-redis may have retried after a first
// attempt whose reply was lost.
func (p *EventPublisher) PublishCheckinRecorded(ctx context.Context, e domain.CheckinRecorded, correlationID string) error {
	msg := NewCheckinRecordedMessage(e, correlationID)
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("%w: %w", command.ErrNotPublished, err)
	}
	msg.SetContext(ctx)
	err := p.pub.Publish(p.parts.StreamOf(e.UserID), msg)
	if errors.Is(err, ErrPipelineClosed) || errors.Is(err, ErrNotSent) {
		return fmt.Errorf("%w: %w", command.ErrNotPublished, err)
	}
	return err
}

// PublishCheckinRecordedWithin implements command.FencedPublisher: through the auto-pipeline's
// hook, Watermill's XADD runs inside fencedXAddScript, which adds the entry only while the
// stream's server clock (TIME) reads before now + within, now turned into that server's time
// with the offset measured between the two clocks (streamClocks). A publisher without an
// auto-pipeline (NewEventPublisher) publishes without the fence.
func (p *EventPublisher) PublishCheckinRecordedWithin(ctx context.Context, e domain.CheckinRecorded, correlationID string, within time.Duration) error {
	if p.pipeline == nil {
		return p.PublishCheckinRecorded(ctx, e, correlationID)
	}
	if within <= 0 {
		return fmt.Errorf("%w: %w (%s late, not sent)", command.ErrNotPublished, command.ErrPublishTooLate, -within)
	}
	stream := p.parts.StreamOf(e.UserID)
	offset := p.clocks.offset(ctx, p.pipeline, stream)
	deadline := time.Now().Add(within + offset)
	x := &xaddScript{script: fencedXAddScript, args: []any{strconv.FormatInt(deadline.UnixMilli(), 10)}}
	err := p.PublishCheckinRecorded(context.WithValue(ctx, xaddScriptKey{}, x), e, correlationID)
	if err != nil && x.reply != nil && errors.Is(err, errXAddNotRun) {
		// The script ran and refused: certainly not on the stream.
		return fmt.Errorf("%w: %w (the stream's deadline %s)", command.ErrNotPublished, command.ErrPublishTooLate, deadline.UTC().Format(time.RFC3339Nano))
	}
	return err
}

// streamClocks is how far each stream's server clock is ahead of this process's (Redis TIME
// minus the local time halfway through the round trip that read it), measured once a
// clockRefresh per stream: the fence's deadline is of the server's clock, the takeover age of
// the processes'. Unmeasured (the read failed), the offset is 0: the clocks are taken to agree.
type streamClocks struct {
	mu   sync.Mutex
	seen map[string]clockOffset
}

type clockOffset struct {
	offset time.Duration
	at     time.Time
}

const clockRefresh = time.Minute

// timeScript answers its server's TIME; KEYS[1] routes it to the stream's node on a cluster.
var timeScript = redis.NewScript(`return redis.call('TIME')`)

func (c *streamClocks) offset(ctx context.Context, p *AutoPipeline, stream string) time.Duration {
	now := time.Now()
	c.mu.Lock()
	o, ok := c.seen[stream]
	c.mu.Unlock()
	if ok && now.Sub(o.at) < clockRefresh {
		return o.offset
	}
	v, err := p.Run(ctx, timeScript, []string{stream})
	after := time.Now()
	t, ok := v.([]any)
	if err != nil || !ok || len(t) != 2 {
		return o.offset // the last one measured, or 0
	}
	sec, err1 := strconv.ParseInt(fmt.Sprint(t[0]), 10, 64)
	usec, err2 := strconv.ParseInt(fmt.Sprint(t[1]), 10, 64)
	if err1 != nil || err2 != nil {
		return o.offset
	}
	server := time.Unix(sec, usec*1000)
	o = clockOffset{offset: server.Sub(now.Add(after.Sub(now) / 2)), at: after}
	c.mu.Lock()
	if c.seen == nil {
		c.seen = map[string]clockOffset{}
	}
	c.seen[stream] = o
	c.mu.Unlock()
	return o.offset
}

// fencedXAddScript runs the XADD of ARGV[2..] on KEYS[1] only while the server's clock is
// before ARGV[1] (ms since the epoch); its reply is a table whose one element is the entry's ID,
// or false when it refused. An XADD error is the script's error. Redis replicates the XADD's
// effect, not the script, so TIME does not make it nondeterministic.
var fencedXAddScript = redis.NewScript(`
local t = redis.call('TIME')
if tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) >= tonumber(ARGV[1]) then return {false} end
local id = redis.pcall('XADD', KEYS[1], unpack(ARGV, 2))
if type(id) == 'table' and id.err then return id end
return {id}
`)

// isFencedXAdd: c is fencedXAddScript's call (an XADD, for INGEST_MIN_REPLICAS's WAIT).
func isFencedXAdd(c redis.Cmder) bool {
	a := c.Args()
	return len(a) > 1 && strings.EqualFold(c.Name(), "evalsha") && a[1] == fencedXAddScript.Hash()
}

// Close closes the publisher and its client.
func (p *EventPublisher) Close() error { return p.pub.Close() }

// NewEventMessage wraps flat event fields in a Watermill message; the payload is the JSON
// object of the fields, keys sorted (as encoding/json writes a map).
func NewEventMessage(fields map[string]string, correlationID string) (*message.Message, error) {
	payload := appendFlatObject(make([]byte, 0, 256), slices.Sorted(maps.Keys(fields)), func(k string) string { return fields[k] })
	return newMessage(payload, correlationID), nil
}

// NewCheckinRecordedMessage is NewEventMessage(e.Fields(), correlationID), written straight from
// the event: it runs once per check-in on the API's hot path, where the map and its encoding
// were a fifth of the publish's allocations.
func NewCheckinRecordedMessage(e domain.CheckinRecorded, correlationID string) *message.Message {
	b := make([]byte, 0, 256)
	str := func(key, v string, comma bool) {
		if comma {
			b = append(b, ',')
		}
		b = append(b, '"')
		b = append(b, key...)
		b = append(b, `":`...)
		b = appendJSONString(b, v)
	}
	num := func(key string, v int64) {
		b = append(b, `,"`...)
		b = append(b, key...)
		b = append(b, `":"`...)
		b = strconv.AppendInt(b, v, 10)
		b = append(b, '"')
	}
	// Keys in sorted order, as NewEventMessage writes them (TestCheckinRecordedMessage).
	b = append(b, '{')
	str(domain.FieldCheckinID, e.ID, false)
	if e.Fingerprint != "" {
		str(domain.FieldFingerprint, e.Fingerprint, true)
	}
	num(domain.FieldLocationID, e.LocationID)
	num(domain.FieldRecordedAt, e.RecordedAt)
	num(domain.FieldStarRating, int64(e.StarRating))
	num(domain.FieldTimestamp, e.Timestamp)
	str(domain.FieldType, domain.EventCheckinRecorded, true)
	num(domain.FieldUserID, e.UserID)
	return newMessage(append(b, '}'), correlationID)
}

func newMessage(payload []byte, correlationID string) *message.Message {
	msg := message.NewMessage(watermill.NewUUID(), payload)
	if correlationID != "" {
		msg.Metadata.Set(MetaCorrelationID, correlationID)
	}
	return msg
}
