package adapters

import (
	"cmp"
	"context"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-redisstream/pkg/redisstream"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"

	"github.com/checkins/checkins/adapters/batchsub"
)

// Stream subscriber kinds (SUBSCRIBER).
const (
	SubscriberBatched   = "batched"   // adapters/batchsub: batched reads and acks
	SubscriberWatermill = "watermill" // the stock watermill-redisstream subscriber
)

// Subscribers builds the stream subscriber of a consumer group as the projection router asks for
// one (ports.ProjectionRouterConfig.NewSubscriber is Subscribers.New): the batched one, or the
// stock watermill-redisstream one behind a DrainingSubscriber, always with FlatMarshaller.
type Subscribers struct {
	Kind string // SubscriberBatched (default) or SubscriberWatermill
	// Client reads for the batched subscriber and the draining one; nil: NewClient gives each
	// subscriber a client of its own. The stock subscriber always gets its own from NewClient
	// (its Close closes it).
	Client    redis.UniversalClient
	NewClient func() (redis.UniversalClient, error)
	Consumer  string
	// Parts are the event stream's partitions: with more than one, a subscription of the event
	// stream (KeySpace.Stream()) subscribes each and merges them (PartitionedSubscriber).
	Parts Partitions

	BatchSize   int64
	ReadLinger  time.Duration
	MaxInFlight int
	BlockTime   time.Duration // 0: the subscriber's default
	// ClaimInterval and ClaimIdle: how often and after how long a crashed consumer's entries
	// are taken over.
	ClaimInterval, ClaimIdle time.Duration
	NackDelay                time.Duration
	DrainTimeout             time.Duration
	// ConsumerIdleRemove: a consumer idle this long with nothing pending leaves the group (0:
	// the subscriber's default).
	ConsumerIdleRemove time.Duration
	// Paused, when set and true, makes the subscribers stop reading new entries (a partition
	// migration runs): the batched one asks it before each read; the stock one's own client
	// holds back its XREADGROUPs of new entries (pausedReads). Both still deliver and acknowledge
	// what they hold and take over a crashed consumer's entries.
	Paused func() bool

	Logger watermill.LoggerAdapter
	// StockLogger is the stock subscriber's logger (it logs every failed read); default Logger.
	StockLogger watermill.LoggerAdapter
}

// New returns a fresh subscriber for group; start says where the group stands when it has to be
// created (the batched subscriber asks it; the stock one starts at "0").
//
// With P partitions the batched subscriber's MAX_IN_FLIGHT (and so BATCH_SIZE) is shared out, a
// P-th per partition, so that a group holds as many entries read and not yet acknowledged as
// with one stream: 1,000 per partition kept 24 times as much in memory, and let each partition's
// acknowledged position (which the dedupe registries are pruned by) trail what was decided by up
// to 1,000 entries, so that the registries held about 35 times the window's identities after a
// drain of history.
func (s Subscribers) New(group string, start func(ctx context.Context, stream string) (string, error)) (message.Subscriber, error) {
	batch := s.BatchSize
	if p := s.Parts.Count(); p > 1 {
		s.MaxInFlight, s.BatchSize = perPartition(s.MaxInFlight, s.BatchSize, p)
	}
	sub, err := s.newOne(group, start)
	if err != nil || s.Parts.Count() < 2 {
		return sub, err
	}
	ps := NewPartitionedSubscriber(sub, s.Parts, s.Parts.base())
	if s.Kind != "watermill" { // the stock subscriber delivers one entry at a time: nothing to join
		ps = ps.WithLinger(s.ReadLinger, int(max(1, batch/4)))
	}
	return ps, nil
}

// perPartition shares maxInFlight (0: the batched subscriber's default) out over p partitions,
// at least one entry each, and keeps a batch within it.
func perPartition(maxInFlight int, batchSize int64, p int) (int, int64) {
	if maxInFlight <= 0 {
		maxInFlight = batchsub.DefaultMaxInFlight
	}
	each := max(1, (maxInFlight+p-1)/p)
	if batchSize <= 0 || batchSize > int64(each) {
		batchSize = int64(each)
	}
	return each, batchSize
}

func (s Subscribers) newOne(group string, start func(ctx context.Context, stream string) (string, error)) (message.Subscriber, error) {
	client := func() (redis.UniversalClient, error) {
		if s.Client != nil {
			return s.Client, nil
		}
		return s.NewClient()
	}
	if s.Kind == SubscriberWatermill {
		own, err := s.NewClient()
		if err != nil {
			return nil, err
		}
		logger := s.StockLogger
		if logger == nil {
			logger = s.Logger
		}
		cfg := redisstream.SubscriberConfig{
			Client: own, Unmarshaller: FlatMarshaller{}, Consumer: s.Consumer, ConsumerGroup: group,
			OldestId: "0", NackResendSleep: s.NackDelay, ClaimInterval: s.ClaimInterval, MaxIdleTime: s.ClaimIdle,
			BlockTime: s.BlockTime,
			// A first read blocking without end, issued before a pause, would still take what a
			// producer adds during it; with the pause every read ends within BlockTime.
			DisableIndefiniteInitialBlock: s.BlockTime > 0 || s.Paused != nil,
		}
		if s.Paused != nil {
			own.AddHook(pausedReads{paused: s.Paused, wait: cmp.Or(s.BlockTime, redisstream.DefaultBlockTime)})
		}
		if s.ConsumerIdleRemove > 0 {
			cfg.CheckConsumersInterval, cfg.ConsumerTimeout = s.ClaimInterval, s.ConsumerIdleRemove
		}
		stock, err := redisstream.NewSubscriber(cfg, logger)
		if err != nil {
			return nil, err
		}
		reads, err := client()
		if err != nil {
			return nil, err
		}
		// On shutdown it hands back what the stock subscriber read ahead and dropped.
		return NewDrainingSubscriber(DrainingSubscriberConfig{Inner: stock, Client: reads,
			ConsumerGroup: group, Consumer: s.Consumer, Unmarshaller: FlatMarshaller{},
			DrainTimeout: s.DrainTimeout, Logger: s.Logger})
	}
	reads, err := client()
	if err != nil {
		return nil, err
	}
	return batchsub.NewSubscriber(batchsub.Config{
		Client: reads, ConsumerGroup: group, Consumer: s.Consumer, Unmarshaller: FlatMarshaller{},
		StartID: start, BatchSize: s.BatchSize, ReadLinger: s.ReadLinger, MaxInFlight: s.MaxInFlight, BlockTime: s.BlockTime,
		ClaimInterval: s.ClaimInterval, ClaimMinIdle: s.ClaimIdle, NackDelay: s.NackDelay,
		DrainTimeout: s.DrainTimeout, ConsumerIdleRemove: s.ConsumerIdleRemove, Paused: s.Paused, Logger: s.Logger,
	})
}

// pausedReads is a go-redis hook for the stock subscriber's own client, which reads with
// XREADGROUP ... STREAMS <stream> ">" and takes redis.Nil for a BLOCK that timed out: while
// paused() is true such a read of new entries is not sent; after wait (or when ctx ends) it
// answers redis.Nil, so the subscriber reads nothing new and asks again. Its other commands (the
// XPENDING and XCLAIM of the takeover of a crashed consumer's entries, its XACKs) go through.
type pausedReads struct {
	paused func() bool
	wait   time.Duration
}

func (pausedReads) DialHook(next redis.DialHook) redis.DialHook { return next }

func (pausedReads) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

func (h pausedReads) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if !readsNewEntries(cmd) || !h.paused() {
			return next(ctx, cmd)
		}
		t := time.NewTimer(h.wait)
		defer t.Stop()
		select {
		case <-t.C:
		case <-ctx.Done():
		}
		cmd.SetErr(redis.Nil)
		return redis.Nil
	}
}

// readsNewEntries: cmd is an XREADGROUP whose last stream ID is ">" (the stock subscriber reads
// one stream).
func readsNewEntries(cmd redis.Cmder) bool {
	if cmd.Name() != "xreadgroup" {
		return false
	}
	args := cmd.Args()
	last, _ := args[len(args)-1].(string)
	return last == ">"
}
