// Package batchsub is a high-throughput Watermill message.Subscriber over Redis Streams
// consumer groups.
//
// The stock watermill-redisstream subscriber reads one entry at a time, keeps one message in
// flight and XACKs each one separately. This one reads in batches (XREADGROUP COUNT BatchSize),
// hands out up to MaxInFlight messages without waiting for their acks (Watermill's router runs
// each received message in its own goroutine, so that is where the concurrency comes from) and
// batches the XACKs. It keeps the at-least-once guarantees of a consumer group:
//
//   - an entry is XACKed only after its message was acked;
//   - a nacked message is redelivered in-process after NackDelay;
//   - entries that a crashed consumer left pending are taken over (XAUTOCLAIM) after ClaimMinIdle;
//   - Close (or the end of Subscribe's ctx) drains: no new reads, entries already read are still
//     delivered and their acks awaited and flushed (DrainTimeout). A message nacked during the
//     drain is not retried in-process; it stays in this consumer's PEL for XAUTOCLAIM;
//   - Redis outages are ridden out with backoff, and a consumer group lost with the data
//     (restart without persistence) is recreated.
//
// Fencing. A consumer that stands still longer than ClaimMinIdle (SIGSTOP, a paused VM) while
// it holds entries may find, when it moves again, that another consumer took them over,
// applied them and acknowledged them. What it writes then for them must not land. So every
// message carries a lease (LeaseUntil): the Redis time from which another consumer may have
// taken its entry over, ClaimMinIdle (less a margin for the clocks of a cluster's nodes) after
// a Redis time read before the entry was last delivered here or had its idle time reset. A
// handler hands it to the scripts that write for the entry, which refuse to write from then on
// by Redis's own clock (TIME), whatever the process's clock says. The XACKs are fenced alike:
// past the lease of an entry being acknowledged, only the entries still pending to this
// consumer are (XPENDING ... consumer). An entry another consumer holds now is let go here at
// its next turn: never redelivered, nor acknowledged, by this one.
//
// Every message's context carries the values of Subscribe's ctx and is cancelled only when a
// drain times out, not when the message is acked (see TestMessageContext).
//
// Because several messages are in flight at once, handlers observe them concurrently and must be
// idempotent; the output channel itself yields entries in stream order (redeliveries and
// taken-over entries come later).
//
// One Subscriber subscribes a given topic at most once at a time (ErrAlreadySubscribed): all its
// subscriptions share one consumer name, and two concurrent subscriptions of the same stream
// would redeliver each other's pending entries.
//
// Each subscription keeps one pooled connection busy in a blocking XREADGROUP; size the client's
// pool for the number of topics plus a few.
package batchsub

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-redisstream/pkg/redisstream"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"
)

// Metadata keys set on every delivered message.
const (
	MetaStream       = "_stream"          // stream the entry came from
	MetaEntryID      = "_entry_id"        // Redis stream entry ID (e.g. "1700000000000-0")
	MetaDeliveries   = "_deliveries"      // delivery count as Redis reports it (XPENDING/XAUTOCLAIM), "1" for a first read
	MetaQueued       = "_queued"          // messages ready to be handed out right after this one
	MetaUnmarshalErr = "_unmarshal_error" // set when the Unmarshaller failed; the raw fields follow under MetaRawPrefix
	// MetaRawPrefix prefixes the raw fields of an entry that could not be unmarshalled
	// ("_raw.payload", ...), so a downstream middleware can park the entry in a poison queue.
	MetaRawPrefix = "_raw."
)

// Defaults applied by NewSubscriber to zero Config fields.
const (
	DefaultOldestID                 = "0"
	DefaultBatchSize          int64 = 500
	DefaultMaxInFlight              = 1000
	DefaultBlockTime                = 100 * time.Millisecond
	DefaultClaimInterval            = 5 * time.Second
	DefaultClaimMinIdle             = 30 * time.Second
	DefaultHoldMax                  = 10 * time.Minute
	DefaultNackDelay                = time.Second
	DefaultAckFlushInterval         = 2 * time.Millisecond
	DefaultConsumerIdleRemove       = 10 * time.Minute
	DefaultDrainTimeout             = 30 * time.Second
)

// Sentinel errors.
var (
	// ErrClosed is returned by Subscribe after Close.
	ErrClosed = errors.New("batchsub: subscriber closed")
	// ErrAlreadySubscribed is returned when the topic already has a live subscription on this
	// Subscriber (see the package comment).
	ErrAlreadySubscribed = errors.New("batchsub: topic already subscribed by this subscriber")
	// ErrUnflushedAcks is returned by Close when acks could not be written to Redis in time. The
	// entries stay pending in the group and will be redelivered to some consumer.
	ErrUnflushedAcks = errors.New("batchsub: acks could not be flushed to redis")
)

// Config configures a Subscriber. Zero values take the defaults above.
type Config struct {
	Client        redis.UniversalClient    // NOT closed by Close (unlike the stock subscriber) - caller owns it
	ConsumerGroup string                   // required
	Consumer      string                   // default: hostname-pid-shortrandom, must be unique per process
	Unmarshaller  redisstream.Unmarshaller // default redisstream.DefaultMarshallerUnmarshaller{}
	OldestID      string                   // where a new group starts; default "0" (whole history)
	// StartID, when set, replaces OldestID: it is asked each time the group has to be created
	// (first subscription, or a group Redis lost) and may say where processing really stands
	// (an error leaves the group missing and is retried with the next read).
	StartID   func(ctx context.Context, topic string) (string, error)
	BatchSize int64 // XREADGROUP / XAUTOCLAIM COUNT, default 500
	// MaxInFlight bounds the entries read from Redis and not yet acked: queued for delivery,
	// handed out, or nacked and waiting for their redelivery (a nacked message keeps its slot, so
	// a stream of failing messages cannot pull in unbounded work). Reading stops while full.
	// Acked entries waiting for their XACK flush are not counted, except that reading also stops
	// when more than MaxInFlight of them pile up (XACKs failing). Default 1000.
	MaxInFlight int
	BlockTime   time.Duration // XREADGROUP BLOCK, default 100ms
	// ReadLinger: after a read that returned entries but less than a quarter of BatchSize, the
	// next read waits this long, so that a busy stream is read (and handed out) in batches of
	// many entries instead of a few per round trip: Kafka's fetch.max.wait.ms. The first entry
	// after a quiet spell is still delivered at once; what arrives right behind it waits at most
	// this long. Default 0: no wait.
	ReadLinger    time.Duration
	ClaimInterval time.Duration // how often to look for idle pending entries of other consumers, default 5s
	ClaimMinIdle  time.Duration // an entry pending this long in another consumer is taken over (XAUTOCLAIM), default 30s
	// HoldMax: while this consumer holds an entry (read, not yet XACKed), it keeps the entry's
	// idle time below ClaimMinIdle (XCLAIM JUSTID to itself, every ClaimMinIdle/3), so that no
	// other consumer takes over an entry a live but slow consumer is still working on (a batch
	// retried through a slow Redis can take longer than ClaimMinIdle) and applies it beside it.
	// It stops keeping an entry held longer than HoldMax (a handler that hangs), which is then
	// taken over as a crashed consumer's would be; an entry nacked after its lease ran out (see
	// Fencing) is still kept once, so that its writes are not refused for ever. Default 10m;
	// negative: never keep but those.
	HoldMax   time.Duration
	NackDelay time.Duration // a Nacked message is redelivered in-process after this delay, default 1s
	// AckFlushInterval is the XACK batching window, default 2ms; acks also flush when BatchSize
	// are queued.
	AckFlushInterval time.Duration
	// ConsumerIdleRemove: consumers of the group idle longer than this with 0 pending are deleted
	// (XGROUP DELCONSUMER), default 10m; 0 keeps the default, negative disables.
	ConsumerIdleRemove time.Duration
	// DrainTimeout: on Close (or when Subscribe's ctx ends), how long to keep delivering
	// already-read entries and waiting for their acks, default 30s.
	DrainTimeout time.Duration
	// Paused, when set, is asked before every read of new entries: while it is true the
	// subscription reads nothing new (it looks again every BlockTime); what it holds, its own
	// pending entries and the idle ones it claims are still delivered and acked, so the group
	// ends up with nothing pending.
	Paused func() bool
	Logger watermill.LoggerAdapter
}

func (c *Config) setDefaults() {
	if c.Consumer == "" {
		c.Consumer = defaultConsumerName()
	}
	if c.Unmarshaller == nil {
		c.Unmarshaller = redisstream.DefaultMarshallerUnmarshaller{}
	}
	if c.OldestID == "" {
		c.OldestID = DefaultOldestID
	}
	if c.BatchSize == 0 {
		c.BatchSize = DefaultBatchSize
	}
	if c.MaxInFlight == 0 {
		c.MaxInFlight = DefaultMaxInFlight
	}
	if c.BlockTime == 0 {
		c.BlockTime = DefaultBlockTime
	}
	if c.ClaimInterval == 0 {
		c.ClaimInterval = DefaultClaimInterval
	}
	if c.ClaimMinIdle == 0 {
		c.ClaimMinIdle = DefaultClaimMinIdle
	}
	if c.HoldMax == 0 {
		c.HoldMax = DefaultHoldMax
	}
	if c.NackDelay == 0 {
		c.NackDelay = DefaultNackDelay
	}
	if c.AckFlushInterval == 0 {
		c.AckFlushInterval = DefaultAckFlushInterval
	}
	if c.ConsumerIdleRemove == 0 {
		c.ConsumerIdleRemove = DefaultConsumerIdleRemove
	}
	if c.DrainTimeout == 0 {
		c.DrainTimeout = DefaultDrainTimeout
	}
	if c.Logger == nil {
		c.Logger = watermill.NopLogger{}
	}
}

func (c *Config) validate() error {
	var errs []error
	if c.Client == nil {
		errs = append(errs, errors.New("Client is required"))
	}
	if c.ConsumerGroup == "" {
		errs = append(errs, errors.New("ConsumerGroup is required"))
	}
	if c.BatchSize < 0 {
		errs = append(errs, fmt.Errorf("BatchSize must not be negative, got %d", c.BatchSize))
	}
	if c.MaxInFlight < 0 {
		errs = append(errs, fmt.Errorf("MaxInFlight must not be negative, got %d", c.MaxInFlight))
	}
	// A negative delay would mean "no delay"; NackDelay in particular must never allow a hot
	// redelivery loop, so negatives are rejected rather than interpreted.
	for _, d := range []struct {
		name string
		d    time.Duration
	}{
		{"BlockTime", c.BlockTime}, {"ClaimInterval", c.ClaimInterval}, {"ClaimMinIdle", c.ClaimMinIdle},
		{"NackDelay", c.NackDelay}, {"AckFlushInterval", c.AckFlushInterval}, {"DrainTimeout", c.DrainTimeout},
		{"ReadLinger", c.ReadLinger},
	} {
		if d.d < 0 {
			errs = append(errs, fmt.Errorf("%s must not be negative, got %s", d.name, d.d))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("batchsub: invalid config: %w", err)
	}
	return nil
}

func defaultConsumerName() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "unknown"
	}
	// The random suffix keeps two subscribers of one process (or a restarted process that got
	// the same pid) from sharing a PEL.
	return fmt.Sprintf("%s-%d-%s", host, os.Getpid(), watermill.NewShortUUID()[:8])
}

// Subscriber implements message.Subscriber over Redis Streams consumer groups.
type Subscriber struct {
	cfg    Config
	logger watermill.LoggerAdapter
	// delIfIdle deletes a consumer only if it has nothing pending, atomically, so a consumer
	// that picked up entries since XINFO CONSUMERS never loses them from the PEL.
	delIfIdle *redis.Script
	// keep resets the idle time of the entries this consumer still holds (keepScript).
	keep *redis.Script
	// ack acknowledges entries, fenced (ackScript).
	ack *redis.Script

	mu        sync.Mutex
	closed    bool
	closing   chan struct{}       // closed when Close starts: every subscription drains
	closeDone chan struct{}       // closed when Close has finished
	topics    map[string]struct{} // topics with a live subscription
	errs      []error             // errors of finished subscriptions, returned by Close
	wg        sync.WaitGroup      // live subscriptions
}

// delIfIdleScript: KEYS[1] stream, ARGV[1] group, ARGV[2] consumer. Returns -1 when the
// consumer still has pending entries, else the XGROUP DELCONSUMER reply.
const delIfIdleScript = `
local p = redis.call('XPENDING', KEYS[1], ARGV[1], '-', '+', 1, ARGV[2])
if #p > 0 then return -1 end
return redis.call('XGROUP', 'DELCONSUMER', KEYS[1], ARGV[1], ARGV[2])
`

// keepScript: KEYS[1] stream, ARGV[1] group, ARGV[2] consumer, ARGV[3] how many of the entry
// IDs that follow to keep, ARGV[4...] entry IDs. Each of the first ARGV[3] still pending to the
// consumer gets its idle time reset (XCLAIM JUSTID, which leaves its delivery count alone); the
// others are only looked at. The reply is Redis's time (ms) before any reset; the number of IDs
// that follow that are no longer the consumer's; those IDs; then the IDs whose lease starts
// again at that time.
//
// No longer the consumer's: an entry pending to another consumer (taken over while this one
// stood still), or pending to none while the stream still has it (acknowledged since, here or
// by a consumer that took it over; or, if the group's state went back, to be delivered again),
// or at or below the stream's max-deleted-entry-id (trimmed or deleted since). Still its own:
// those it keeps, and those pending to none that the stream lost above that ID. The group's state went back
// there with the entry (a failover to a replica that never had it, its XADD unconfirmed): no
// other consumer can take it over or be delivered it, and only this one can finish applying it
// (a cluster's other slots may have its updates already).
const keepScript = `
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local n = tonumber(ARGV[3])
local deleted, first
local function upTo(a, b) -- stream IDs: a <= b
  local am, as = string.match(a, '^(%d+)-(%d+)$')
  local bm, bs = string.match(b, '^(%d+)-(%d+)$')
  if not am or not bm then return true end
  am, as, bm, bs = tonumber(am), tonumber(as), tonumber(bm), tonumber(bs)
  return am < bm or (am == bm and as <= bs)
end
local mine, gone, lost = {}, {}, {}
for i = 4, #ARGV do
  local id = ARGV[i]
  if #redis.call('XPENDING', KEYS[1], ARGV[1], id, id, 1, ARGV[2]) > 0 then
    if i < 4 + n then mine[#mine + 1] = id end
  elseif #redis.call('XPENDING', KEYS[1], ARGV[1], id, id, 1) > 0 or #redis.call('XRANGE', KEYS[1], id, id) > 0 then
    gone[#gone + 1] = id
  else
    if deleted == nil then
      -- The highest ID trimmed or deleted from the stream (Redis 7); without it (an older
      -- server, miniredis) every ID below the first entry is taken for trimmed.
      deleted = false
      local info = redis.call('XINFO', 'STREAM', KEYS[1])
      for j = 1, #info, 2 do
        if info[j] == 'max-deleted-entry-id' then deleted = info[j + 1] end
      end
      if not deleted then
        local f = redis.call('XRANGE', KEYS[1], '-', '+', 'COUNT', 1)
        first = (#f > 0 and f[1][1]) or false
      end
    end
    local trimmed
    if deleted then trimmed = upTo(id, deleted) else trimmed = not (first and upTo(first, id)) end
    if trimmed then gone[#gone + 1] = id else lost[#lost + 1] = id end
  end
end
for i = 1, #mine, 500 do
  local args = {KEYS[1], ARGV[1], ARGV[2], '0'}
  for j = i, math.min(i + 499, #mine) do args[#args + 1] = mine[j] end
  args[#args + 1] = 'JUSTID'
  redis.call('XCLAIM', unpack(args))
end
local out = {now, #gone}
for _, id in ipairs(gone) do out[#out + 1] = id end
for _, id in ipairs(mine) do out[#out + 1] = id end
for _, id in ipairs(lost) do out[#out + 1] = id end
return out
`

// keepScriptSHA is keepScript's SHA1 (StartsLease).
var keepScriptSHA = redis.NewScript(keepScript).Hash()

// StartsLease reports whether c is a command of this subscriber that starts the leases of the
// entries it returns: XREADGROUP and XAUTOCLAIM deliver them (and XCLAIM), and the keep script
// resets their idle time. A deployment that needs the leases to outlive a failover has these
// confirmed by replicas before they count (a WAIT on the same connection; see
// adapters.RequireDeliveryReplicas): a delivery a promoted replica never saw would let another
// consumer read the entry within the lease of the one that holds it.
func StartsLease(c redis.Cmder) bool {
	args := c.Args()
	if len(args) == 0 {
		return false
	}
	name, _ := args[0].(string)
	switch strings.ToLower(name) {
	case "xreadgroup", "xautoclaim", "xclaim":
		return true
	case "evalsha", "evalsha_ro":
		sha, _ := argAt(args, 1).(string)
		return strings.EqualFold(sha, keepScriptSHA)
	case "eval", "eval_ro":
		body, _ := argAt(args, 1).(string)
		return body == keepScript
	}
	return false
}

func argAt(args []any, i int) any {
	if i < len(args) {
		return args[i]
	}
	return nil
}

// AckScriptSHA is the SHA1 of the script this subscriber acknowledges entries with (EVALSHA; EVAL
// of AckScript in a pipeline): what to look for in SLOWLOG or MONITOR output, or in a go-redis
// hook, instead of XACK.
var AckScriptSHA = redis.NewScript(ackScript).Hash()

// AckScript is the text of that script.
const AckScript = ackScript

// ackScript: KEYS[1] stream, ARGV[1] group, ARGV[2] consumer, ARGV[3] the lease (Redis ms; 0:
// none) of the entries, ARGV[4...] entry IDs. Before the lease every entry is acknowledged
// (XACK); from it on only those still pending to the consumer, since another consumer may have
// taken the others over and be applying them (its markers must stay until it acknowledges
// them). Returns the number acknowledged.
const ackScript = `
local lease = tonumber(ARGV[3])
if lease > 0 then
  local t = redis.call('TIME')
  if tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) >= lease then
    local mine = {}
    for i = 4, #ARGV do
      if #redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[i], ARGV[i], 1, ARGV[2]) > 0 then
        mine[#mine + 1] = ARGV[i]
      end
    end
    if #mine == 0 then return 0 end
    return redis.call('XACK', KEYS[1], ARGV[1], unpack(mine))
  end
end
return redis.call('XACK', KEYS[1], ARGV[1], unpack(ARGV, 4))
`

// NewSubscriber validates cfg and fills in defaults.
func NewSubscriber(cfg Config) (*Subscriber, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	cfg.setDefaults()
	return &Subscriber{
		cfg:       cfg,
		logger:    cfg.Logger,
		delIfIdle: redis.NewScript(delIfIdleScript),
		keep:      redis.NewScript(keepScript),
		ack:       redis.NewScript(ackScript),
		closing:   make(chan struct{}),
		closeDone: make(chan struct{}),
		topics:    make(map[string]struct{}),
	}, nil
}

// ConsumerName is the consumer name this subscriber uses in its group.
func (s *Subscriber) ConsumerName() string { return s.cfg.Consumer }

// Subscribe creates the consumer group if it is missing and starts consuming topic. The
// returned channel is closed after the subscription has drained, which happens when ctx is done
// or Close is called.
func (s *Subscriber) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	if topic == "" {
		return nil, errors.New("batchsub: empty topic")
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil, ErrClosed
	}
	if _, busy := s.topics[topic]; busy {
		s.mu.Unlock()
		return nil, fmt.Errorf("%w: %q", ErrAlreadySubscribed, topic)
	}
	s.topics[topic] = struct{}{}
	s.wg.Add(1) // under mu with closed == false, so Close's Wait cannot have started
	s.mu.Unlock()

	if _, err := s.createGroup(ctx, topic); err != nil {
		s.unregister(topic, nil)
		s.wg.Done()
		return nil, fmt.Errorf("batchsub: subscribe %q: %w", topic, err)
	}

	sub := newSubscription(ctx, s, topic)
	s.logger.Info("Subscribed to redis stream", sub.fields)
	go sub.run(ctx)
	return sub.out, nil
}

// Close drains every subscription (see Config.DrainTimeout), flushes the pending XACKs and
// closes the output channels. It is idempotent and safe to call concurrently with Subscribe.
// The redis client is not closed.
func (s *Subscriber) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		<-s.closeDone
		return nil
	}
	s.closed = true
	close(s.closing)
	s.mu.Unlock()

	s.wg.Wait()

	s.mu.Lock()
	err := errors.Join(s.errs...)
	s.errs = nil
	s.mu.Unlock()
	close(s.closeDone)
	s.logger.Debug("Redis stream subscriber closed", watermill.LogFields{"consumer": s.cfg.Consumer})
	return err
}

// unregister frees topic for a new subscription and records the error of the finished one
// for Close. The caller still owes s.wg.Done.
func (s *Subscriber) unregister(topic string, err error) {
	s.mu.Lock()
	delete(s.topics, topic)
	if err != nil {
		s.errs = append(s.errs, err)
	}
	s.mu.Unlock()
}

// createGroup creates the consumer group (and the stream) unless it exists, and reports
// whether it had to create it.
func (s *Subscriber) createGroup(ctx context.Context, topic string) (bool, error) {
	start := s.cfg.OldestID
	if s.cfg.StartID != nil {
		// The group usually exists: ask for a start only when it does not.
		if gs, err := s.cfg.Client.XInfoGroups(ctx, topic).Result(); err == nil {
			for _, g := range gs {
				if g.Name == s.cfg.ConsumerGroup {
					return false, nil
				}
			}
		}
		id, err := s.cfg.StartID(ctx, topic)
		if err != nil {
			return false, fmt.Errorf("start of consumer group %q: %w", s.cfg.ConsumerGroup, err)
		}
		start = id
	}
	err := s.cfg.Client.XGroupCreateMkStream(ctx, topic, s.cfg.ConsumerGroup, start).Err()
	switch {
	case err == nil:
		return true, nil
	case strings.HasPrefix(err.Error(), "BUSYGROUP"):
		return false, nil
	default:
		return false, fmt.Errorf("create consumer group %q: %w", s.cfg.ConsumerGroup, err)
	}
}

func isNoGroup(err error) bool {
	return err != nil && strings.HasPrefix(err.Error(), "NOGROUP")
}
