package ports

import (
	"context"
	"sync"

	"github.com/ThreeDotsLabs/watermill/message"
)

// The router's side of a subscription: cmd hands in a subscriber per consumer group
// (ProjectionRouterConfig.NewSubscriber: adapters/batchsub, or the stock watermill-redisstream
// one behind adapters.DrainingSubscriber); the router wraps it to batch its messages
// (projection_batch.go) and to notice when its subscription ends.

// watchedSubscriber tells when its subscription's channel closed, i.e. the handler stopped
// consuming. Watermill's Handler.Stopped() cannot be used for that: RunHandlers assigns the
// channel after closing Started(), without synchronisation (a data race under -race).
type watchedSubscriber struct {
	message.Subscriber
	ended chan struct{}
	once  sync.Once
}

func watchSubscription(s message.Subscriber) message.Subscriber {
	return &watchedSubscriber{Subscriber: s, ended: make(chan struct{})}
}

// Subscribe forwards the inner subscription and closes ended after it closed.
func (w *watchedSubscriber) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	in, err := w.Subscriber.Subscribe(ctx, topic)
	if err != nil {
		return nil, err
	}
	out := make(chan *message.Message)
	go func() {
		defer w.once.Do(func() { close(w.ended) })
		defer close(out)
		for m := range in {
			out <- m
		}
	}()
	return out, nil
}

// subscriptionEnded is closed when s's subscription ended; never for other subscribers.
func subscriptionEnded(s message.Subscriber) <-chan struct{} {
	if w, ok := s.(*watchedSubscriber); ok {
		return w.ended
	}
	return nil
}
