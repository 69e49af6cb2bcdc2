package adapters

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-redisstream/pkg/redisstream"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"
)

// drainRescanDelay is longer than a stock subscriber's blocking read takes to return once its
// subscription is closed.
const drainRescanDelay = 300 * time.Millisecond

// DrainingSubscriberConfig configures NewDrainingSubscriber.
type DrainingSubscriberConfig struct {
	// Inner is the stock watermill-redisstream subscriber for ConsumerGroup and Consumer.
	Inner message.Subscriber
	// Client reads and acks the drained entries. Not the inner subscriber's client: its Close
	// closes that one. Not closed here.
	Client        redis.UniversalClient
	ConsumerGroup string
	Consumer      string
	Unmarshaller  redisstream.Unmarshaller
	// DrainTimeout bounds the drain at the end of a subscription.
	DrainTimeout time.Duration
	Logger       watermill.LoggerAdapter
}

// DrainingSubscriber makes the stock watermill-redisstream subscriber usable by the projections.
//
// It tells each message's stream entry ID (metadata MetaEntryID), which the stock subscriber
// does not: it looks the message up among this consumer's pending entries (the stock subscriber
// reads one entry at a time and waits for its ack, so there are only a few), by its Watermill
// UUID, or by its content for an entry written without one. That is one round trip more per
// message.
//
// And it shuts down clean. On Close
// (or when the subscription's context ends) the stock subscriber drops the entries it had read
// ahead and cancels the messages in flight, which leaves them pending in the group until another
// consumer claims them after its idle time. When the inner subscription has ended, this one hands
// this consumer's pending entries to the handler once more, before closing its own channel (the
// router keeps handling messages until then), and acks those that succeed. Entries that fail, or
// that the drain has no time for, stay pending: delayed, never lost. Handlers must be idempotent
// (an entry in flight at Close may be delivered twice), which every projection is.
type DrainingSubscriber struct {
	cfg DrainingSubscriberConfig
	wg  sync.WaitGroup
}

// NewDrainingSubscriber wraps cfg.Inner.
func NewDrainingSubscriber(cfg DrainingSubscriberConfig) (*DrainingSubscriber, error) {
	if cfg.Inner == nil || cfg.Client == nil || cfg.ConsumerGroup == "" || cfg.Consumer == "" || cfg.Unmarshaller == nil {
		return nil, errors.New("adapters: DrainingSubscriber needs Inner, Client, ConsumerGroup, Consumer and Unmarshaller")
	}
	if cfg.DrainTimeout <= 0 {
		cfg.DrainTimeout = 30 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = watermill.NopLogger{}
	}
	return &DrainingSubscriber{cfg: cfg}, nil
}

// Subscribe forwards the inner subscription, then drains this consumer's pending entries.
func (s *DrainingSubscriber) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	in, err := s.cfg.Inner.Subscribe(ctx, topic)
	if err != nil {
		return nil, err
	}
	out := make(chan *message.Message)
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		defer close(out)
		for m := range in {
			m.Metadata.Set(MetaStream, topic)
			if m.Metadata.Get(MetaEntryID) != "" {
				out <- m // a redelivery after a nack: found already
				continue
			}
			id, err := s.entryID(ctx, topic, m)
			switch {
			case err != nil:
				// Redis is not reachable: hand it on without an ID, the projections nack it, and
				// the stock subscriber delivers it again after its nack delay.
				s.cfg.Logger.Error("Could not find the entry ID of a message; it is retried", err, watermill.LogFields{"topic": topic})
			case id == "":
				// Pending for no consumer: acknowledged, or (after Redis restarted) not
				// delivered any more, and then delivered again. Its processing is not this
				// message's to do, and the stock subscriber's XACK of it changes nothing.
				s.cfg.Logger.Info("Skipped a message whose entry is no longer pending for this consumer",
					watermill.LogFields{"topic": topic, "message_uuid": m.UUID})
				m.Ack()
				continue
			default:
				m.Metadata.Set(MetaEntryID, id)
			}
			out <- m
		}
		s.drain(ctx, topic, out)
	}()
	return out, nil
}

// entryID finds m among this consumer's pending entries (a few: the stock subscriber waits for
// each message's ack; after an outage it may also hold many it claimed), page by page. It looks
// three times, then among every consumer's: an entry the stock subscriber read ahead may have
// been taken over by another consumer meanwhile, and it is handled here all the same (the
// projections dedupe it) because its ack is the group's XACK: acking it unhandled would take it
// from the other consumer, which may crash before handling it. "": pending for no one.
func (s *DrainingSubscriber) entryID(ctx context.Context, topic string, m *message.Message) (string, error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	for _, wait := range []time.Duration{0, 50 * time.Millisecond, 250 * time.Millisecond} {
		select {
		case <-time.After(wait):
		case <-ctx.Done():
			return "", ctx.Err()
		}
		id, err := s.findPending(ctx, topic, s.cfg.Consumer, m)
		if err != nil || id != "" {
			return id, err
		}
	}
	return s.findPending(ctx, topic, "", m)
}

// findPending finds m among consumer's pending entries (every consumer's for "").
func (s *DrainingSubscriber) findPending(ctx context.Context, topic, consumer string, m *message.Message) (string, error) {
	start := "-"
	for {
		ps, err := s.cfg.Client.XPendingExt(ctx, &redis.XPendingExtArgs{Stream: topic, Group: s.cfg.ConsumerGroup,
			Consumer: consumer, Start: start, End: "+", Count: 100}).Result()
		if err != nil || len(ps) == 0 {
			return "", err
		}
		ids := make([]string, len(ps))
		for i, p := range ps {
			ids[i] = p.ID
		}
		id, err := matchEntry(ctx, s.cfg.Client, topic, ids, func(values map[string]any) bool {
			return SameMessage(m, values, s.cfg.Unmarshaller)
		})
		if err != nil || id != "" || len(ps) < 100 {
			return id, err
		}
		start = "(" + ps[len(ps)-1].ID
	}
}

// Close closes the inner subscriber and waits for the drains to finish.
func (s *DrainingSubscriber) Close() error {
	err := s.cfg.Inner.Close()
	s.wg.Wait()
	return err
}

func (s *DrainingSubscriber) drain(ctx context.Context, topic string, out chan<- *message.Message) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.cfg.DrainTimeout)
	defer cancel()
	fields := watermill.LogFields{"topic": topic, "consumer_group": s.cfg.ConsumerGroup, "consumer": s.cfg.Consumer}
	handed, acked := 0, 0
	defer func() {
		if handed > 0 {
			s.cfg.Logger.Info("Drained pending entries at shutdown", fields.Add(watermill.LogFields{"handed": handed, "acked": acked}))
		}
	}()
	last, rescanned := "0", false
	for ctx.Err() == nil {
		// ID "0" and up reads this consumer's own pending entries, with their fields.
		res, err := s.cfg.Client.XReadGroup(ctx, &redis.XReadGroupArgs{Group: s.cfg.ConsumerGroup, Consumer: s.cfg.Consumer,
			Streams: []string{topic, last}, Count: 100}).Result()
		if err != nil {
			if !errors.Is(err, redis.Nil) {
				s.cfg.Logger.Error("Could not drain pending entries at shutdown; they stay pending for another consumer", err, fields)
			}
			return
		}
		if len(res) == 0 || len(res[0].Messages) == 0 {
			if rescanned {
				return
			}
			// A read the stock subscriber had in flight when it closed may still land in this
			// consumer's PEL after the first scan: look once more after its block time.
			rescanned, last = true, "0"
			select {
			case <-time.After(drainRescanDelay):
			case <-ctx.Done():
			}
			continue
		}
		for _, xm := range res[0].Messages {
			last = xm.ID
			ok, err := s.redeliver(ctx, topic, xm, out)
			if err != nil {
				s.cfg.Logger.Info("Stopped draining at shutdown; the rest stays pending", fields.Add(watermill.LogFields{"reason": err.Error()}))
				return
			}
			handed++
			if ok {
				acked++
			}
		}
	}
}

// redeliver hands one pending entry to the handler and acks it when the handler did.
func (s *DrainingSubscriber) redeliver(ctx context.Context, topic string, xm redis.XMessage, out chan<- *message.Message) (bool, error) {
	if len(xm.Values) == 0 {
		// Deleted from the stream: nothing to process, nothing to keep.
		return true, s.cfg.Client.XAck(ctx, topic, s.cfg.ConsumerGroup, xm.ID).Err()
	}
	msg, err := s.cfg.Unmarshaller.Unmarshal(xm.Values)
	if err != nil {
		return false, nil // left pending for a consumer that can park it
	}
	msg.Metadata.Set(MetaStream, topic)
	msg.Metadata.Set(MetaEntryID, xm.ID)
	msg.SetContext(ctx)
	select {
	case out <- msg:
	case <-ctx.Done():
		return false, fmt.Errorf("drain timeout: %w", ctx.Err())
	}
	select {
	case <-msg.Acked():
		if err := s.cfg.Client.XAck(ctx, topic, s.cfg.ConsumerGroup, xm.ID).Err(); err != nil {
			return false, fmt.Errorf("xack %s: %w", xm.ID, err)
		}
		return true, nil
	case <-msg.Nacked():
		return false, nil
	case <-ctx.Done():
		return false, fmt.Errorf("drain timeout: %w", ctx.Err())
	}
}
