package adapters

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"

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
