package adapters

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/checkins/checkins/adapters/batchsub"
)

// PartitionedSubscriber makes one Watermill subscription of the P partitions of a partitioned
// event stream: a projection stays one router handler, fed by one channel. Subscribe(topic)
// subscribes the inner subscriber (the same consumer group on every partition) to each
// partition's stream and merges what they deliver. Each message keeps its partition's stream in
// MetaStream and is acked through its own partition's subscription.
//
// A run of messages that the inner subscriber delivered as ready together (MetaQueued: how many
// more follow right behind) is passed on without another partition's messages in between, and
// the runs of several partitions that are ready at the same moment are joined into one
// (MetaQueued rewritten to count the joined run), so the batching in front of the router sees
// the runs it can batch, across partitions. A partition's entries keep their order.
type PartitionedSubscriber struct {
	inner message.Subscriber
	parts Partitions
	base  string // the topic that stands for every partition (KeySpace.Stream())
	// linger: see WithLinger.
	linger      time.Duration
	lingerBelow int
}

// WithLinger makes a joined run of fewer than below messages wait up to d for other partitions'
// runs before it goes out. Each partition's share of a busy stream is small (about one entry per
// read at 2,400 check-ins/s over 24 partitions): without it the runs ready at the very same
// moment were a few entries, and each such batch cost the projections a pipeline of script calls
// per master, a decode and a router call. d is READ_LINGER, below a quarter of BATCH_SIZE, as
// each partition's reads linger. 0 joins only what is ready.
func (s *PartitionedSubscriber) WithLinger(d time.Duration, below int) *PartitionedSubscriber {
	s.linger, s.lingerBelow = d, below
	return s
}

// NewPartitionedSubscriber subscribes inner to every stream of parts when asked for base, the
// event log's topic (KeySpace.Stream()).
func NewPartitionedSubscriber(inner message.Subscriber, parts Partitions, base string) *PartitionedSubscriber {
	return &PartitionedSubscriber{inner: inner, parts: parts, base: base}
}

// Subscribe implements message.Subscriber. Another topic than the event log's (the poison queue,
// say) passes through to the inner subscriber.
func (s *PartitionedSubscriber) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	if topic != s.base || s.parts.Count() == 1 {
		return s.inner.Subscribe(ctx, s.topicOf(topic))
	}
	ins := make([]<-chan *message.Message, s.parts.Count())
	pctx, cancel := context.WithCancel(ctx)
	for i, stream := range s.parts.Streams() {
		in, err := s.inner.Subscribe(pctx, stream)
		if err != nil {
			// The partitions subscribed so far end now, with what they read handed back: nobody
			// reads them, and they held their entries (which no other consumer may take while
			// held) and their topics (a new Subscribe was refused) until the drain's timeout.
			cancel()
			for _, in := range ins[:i] {
				go func() {
					for m := range in {
						m.Nack()
					}
				}()
			}
			return nil, fmt.Errorf("subscribe partition %d (%s): %w", i, stream, err)
		}
		ins[i] = in
	}
	// One goroutine per partition gathers each run it is given; the runs that are ready at the
	// same time, of any partitions, go out as one run. With many partitions each one's runs are
	// short (at 2,000 check-ins/s over 24 partitions, about one entry per read), and a batch of
	// one entry is a router call, a decode and a few script calls for one event.
	runs := make(chan []*message.Message, len(ins))
	var wg sync.WaitGroup
	for _, in := range ins {
		wg.Go(func() {
			for first := range in {
				run := []*message.Message{first}
				// The rest of the run is ready in this partition's channel: no wait for new reads.
				for more := queuedAfter(first); more > 0; {
					m, ok := <-in
					if !ok {
						break
					}
					run = append(run, m)
					more = queuedAfter(m)
				}
				runs <- run
			}
		})
	}
	go func() {
		wg.Wait()
		close(runs)
	}()
	out := make(chan *message.Message)
	go func() {
		defer cancel()
		defer close(out)
		var timer *time.Timer
		for run := range runs {
			var expired <-chan time.Time // set once the run has to wait for more
		join:
			for len(run) < maxJoinedRun {
				select {
				case more, ok := <-runs:
					if !ok {
						break join
					}
					run = append(run, more...)
					continue
				default:
				}
				if s.linger <= 0 || len(run) >= s.lingerBelow {
					break
				}
				if expired == nil {
					if timer == nil {
						timer = time.NewTimer(s.linger)
					} else {
						timer.Reset(s.linger)
					}
					expired = timer.C
				}
				select {
				case more, ok := <-runs:
					if !ok {
						break join
					}
					run = append(run, more...)
				case <-expired:
					break join
				case <-ctx.Done():
					break join
				}
			}
			if expired != nil && !timer.Stop() {
				select { // drained, for the next Reset (a fired timer's value may be pending)
				case <-timer.C:
				default:
				}
			}
			for i, m := range run {
				m.Metadata.Set(batchsub.MetaQueued, strconv.Itoa(len(run)-1-i))
				out <- m
			}
		}
	}()
	return out, nil
}

// maxJoinedRun caps the runs of several partitions joined into one (the batching in front of
// the router cuts them into batches of BATCH_SIZE anyway).
const maxJoinedRun = 4096

// topicOf maps the event log's topic to its stream when P = 1 (the same name).
func (s *PartitionedSubscriber) topicOf(topic string) string {
	if topic == s.base && s.parts.Count() == 1 {
		return s.parts.Stream(0)
	}
	return topic
}

// Close implements message.Subscriber: the inner subscriber drains and closes every partition's
// subscription, which ends the merged channel.
func (s *PartitionedSubscriber) Close() error { return s.inner.Close() }

func queuedAfter(m *message.Message) int {
	n, err := strconv.Atoi(m.Metadata.Get(batchsub.MetaQueued))
	if err != nil || n < 0 {
		return 0
	}
	return n
}
