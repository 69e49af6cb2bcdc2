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
// It can also be retired before the router started it (retire).
type watchedSubscriber struct {
	message.Subscriber
	ended chan struct{}
	once  sync.Once

	mu      sync.Mutex
	retired bool
	cancel  context.CancelFunc // of the subscription, once it was asked for

	closeOnce sync.Once
	closeErr  error
}

// Close closes the inner subscriber once: the router closes a stopped handler's, a retired one
// closes itself when it ends, and Watermill closes whatever it still holds when it closes.
func (w *watchedSubscriber) Close() error {
	w.closeOnce.Do(func() { w.closeErr = w.Subscriber.Close() })
	return w.closeErr
}

func watchSubscription(s message.Subscriber) message.Subscriber {
	return &watchedSubscriber{Subscriber: s, ended: make(chan struct{})}
}

// Subscribe forwards the inner subscription and closes ended after it closed. Once retired it
// gives a closed channel: the handler the router starts with it ends at once.
func (w *watchedSubscriber) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	w.mu.Lock()
	if w.retired {
		w.mu.Unlock()
		w.once.Do(func() { close(w.ended) })
		_ = w.Close() // nothing else will: Watermill closes only what it holds when it closes
		out := make(chan *message.Message)
		close(out)
		return out, nil
	}
	ctx, w.cancel = context.WithCancel(ctx)
	w.mu.Unlock()
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
		w.mu.Lock()
		retired := w.retired
		w.mu.Unlock()
		if retired { // retired while it subscribed: it ends here, and nothing else closes it
			_ = w.Close()
		}
	}()
	return out, nil
}

// retire makes sure the subscription of a handler that is being retired before it started never
// consumes: the router may be subscribing it right now (its start) or may do so at its next
// RunHandlers (its subscription had failed), and Watermill stops no handler before it started.
func (w *watchedSubscriber) retire() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.retired = true
	if w.cancel != nil {
		w.cancel()
	}
}

// subscriptionEnded is closed when s's subscription ended; never for other subscribers.
func subscriptionEnded(s message.Subscriber) <-chan struct{} {
	if w, ok := s.(*watchedSubscriber); ok {
		return w.ended
	}
	return nil
}
