package adapters

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

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
	pub    *redisstream.Publisher
	stream string
}

// NewEventPublisher owns client: Watermill's Publisher.Close closes it, so give it its own.
// The stream is never trimmed here: MAXLEN ignores consumer groups and could delete events no
// projection has processed yet.
func NewEventPublisher(client redis.UniversalClient, keys KeySpace, logger watermill.LoggerAdapter) (*EventPublisher, error) {
	pub, err := redisstream.NewPublisher(redisstream.PublisherConfig{
		Client:     client,
		Marshaller: FlatMarshaller{},
	}, logger)
	if err != nil {
		return nil, fmt.Errorf("watermill publisher: %w", err)
	}
	return &EventPublisher{pub: pub, stream: keys.Stream()}, nil
}

// PublishCheckinRecorded implements command.EventPublisher; it returns after XADD succeeded.
// Only errors raised before the XADD was handed to Redis count as command.ErrNotPublished: once
// sent, even an error reply proves nothing, since go-redis may have retried after a first
// attempt whose reply was lost.
func (p *EventPublisher) PublishCheckinRecorded(ctx context.Context, e domain.CheckinRecorded, correlationID string) error {
	msg, err := NewEventMessage(e.Fields(), correlationID)
	if err != nil {
		return fmt.Errorf("%w: %w", command.ErrNotPublished, err)
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("%w: %w", command.ErrNotPublished, err)
	}
	msg.SetContext(ctx)
	err = p.pub.Publish(p.stream, msg)
	if errors.Is(err, ErrPipelineClosed) {
		return fmt.Errorf("%w: %w", command.ErrNotPublished, err)
	}
	return err
}

// Close closes the publisher and its client.
func (p *EventPublisher) Close() error { return p.pub.Close() }

// NewEventMessage wraps flat event fields in a Watermill message.
func NewEventMessage(fields map[string]string, correlationID string) (*message.Message, error) {
	payload, err := json.Marshal(fields)
	if err != nil {
		return nil, fmt.Errorf("encode event: %w", err)
	}
	msg := message.NewMessage(watermill.NewUUID(), payload)
	if correlationID != "" {
		msg.Metadata.Set(MetaCorrelationID, correlationID)
	}
	return msg, nil
}
