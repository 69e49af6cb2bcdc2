package main

import (
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/checkins/checkins/adapters"
	"github.com/checkins/checkins/app/command"
)

// Config is read and validated once, here; nothing else reads the environment.
type Config struct {
	RedisURL  string
	RedisMode adapters.RedisMode // auto | standalone | cluster
	// RedisTLSFiles are REDIS_TLS_*; RedisTLS is what they load (nil: none given).
	RedisTLSFiles adapters.RedisTLSFiles
	RedisTLS      *tls.Config
	// StreamPartitions is P, the event stream's partitions; 0 (auto): 1 on a single server,
	// adapters.DefaultClusterPartitions on a cluster.
	StreamPartitions int
	HTTPAddr         string
	LogLevel         slog.Level
	KeyPrefix        string
	RequestTimeout   time.Duration
	DrainTimeout     time.Duration
	Projections      []string // empty: all
	Subscriber       string   // batched | watermill
	ConsumerName     string
	ClaimIdle        time.Duration
	ClaimInterval    time.Duration
	NackDelay        time.Duration
	BatchSize        int
	ReadLinger       time.Duration
	MaxInFlight      int
	HandlerTimeout   time.Duration
	RetryInitial     time.Duration
	RetryMultiplier  float64
	RetryMax         time.Duration
	RetryAttempts    int
	IdempotencyTTL   time.Duration
	// IngestMinReplicas > 0: a check-in is acknowledged only once that many replicas have its
	// XADD (WAIT), within IngestReplicaTimeout.
	IngestMinReplicas    int
	IngestReplicaTimeout time.Duration
	// ProjectionMinReplicas > 0: a batch of projection updates counts as applied (and its
	// entries are acknowledged) only once that many replicas have it (WAIT), within
	// ProjectionReplicaTimeout.
	ProjectionMinReplicas    int
	ProjectionReplicaTimeout time.Duration
	DedupeWindow             time.Duration

	// AllowEvictingRedis runs on a Redis whose maxmemory-policy evicts keys (warned about).
	AllowEvictingRedis bool
	RedisCheckInterval time.Duration
	embeddedRedis      bool // serve's in-memory Redis: nothing to check

	// ConsumerIdleRemove: consumers idle this long with nothing pending leave their group.
	ConsumerIdleRemove time.Duration

	// Projections as an extension point: leaderboards, rebuilds, retention, stall detection.
	LeaderboardMinCheckins int64
	ProjectionPoll         time.Duration
	RetireGrace            time.Duration
	StallAfter             time.Duration
	Retention              command.RetentionPolicy
	RetentionInterval      time.Duration

	// Authentication, the ops listener, rate limits (config_access.go).
	AccessConfig
	HTTP httpConfig // timeouts, connection cap, CORS, TLS (config_http.go)
	UI   uiConfig   // the dashboard's event streams (config_ui.go)
}

// setting is one configuration value: an environment variable and a flag of the same meaning.
type setting struct {
	env, flag, def, usage string
	set                   func(c *Config, v string) error
}

func settings() []setting {
	dur := func(dst func(*Config) *time.Duration, min time.Duration) func(*Config, string) error {
		return func(c *Config, v string) error {
			d, err := time.ParseDuration(v)
			if err != nil {
				return fmt.Errorf("not a duration like 500ms or 30s: %q", v)
			}
			if d < min {
				return fmt.Errorf("must be at least %s, got %s", min, d)
			}
			*dst(c) = d
			return nil
		}
	}
	integer := func(dst func(*Config) *int, min int) func(*Config, string) error {
		return func(c *Config, v string) error {
			n, err := strconv.Atoi(v)
			if err != nil {
				return fmt.Errorf("not an integer: %q", v)
			}
			if n < min {
				return fmt.Errorf("must be at least %d, got %d", min, n)
			}
			*dst(c) = n
			return nil
		}
	}
	return append([]setting{
		{"REDIS_URL", "redis-url", "", "Redis URL, redis://[:password@]host:port/db or rediss:// for TLS; a cluster: redis://[:password@]host:port?addr=host2:port2&addr=host3:port3 (one seed is enough); empty with serve: embedded in-memory Redis", func(c *Config, v string) error {
			if v == "" {
				c.RedisURL = ""
				return nil
			}
			u, err := url.Parse(v)
			// An '@' the URL's user info does not account for is a password with an unescaped
			// '/', '#' or '?' (or '@'), which ended the host early: the rest is not a host, a
			// database or a fragment, and must not be echoed as one.
			stray := strings.Contains(v, "@") && (err != nil || u.User == nil || strings.ContainsAny(u.Host+u.Path+u.RawQuery+u.Fragment, "@"))
			if err != nil || stray || (u.Scheme != "redis" && u.Scheme != "rediss") || u.Host == "" {
				return fmt.Errorf("must look like redis://[:password@]host:port/db (or rediss://; a password's %%, #, ?, / and @ percent-encoded), got %q", redact(v))
			}
			if db := strings.Trim(u.Path, "/"); db != "" {
				if _, err := strconv.Atoi(db); err != nil {
					return fmt.Errorf("database must be a number, got %q", db)
				}
			}
			// Every address, the seeds' (addr=) too: a port no server can listen on is never
			// dialled, and the process would wait for it for good, answering 503.
			addrs := append([]string{u.Host}, u.Query()["addr"]...)
			for _, a := range addrs {
				if err := checkRedisAddr(a); err != nil {
					return err
				}
			}
			c.RedisURL = v
			return nil
		}},
		{"REDIS_MODE", "redis-mode", "auto", "auto (a REDIS_URL with addr= seeds is a cluster; one address is asked INFO cluster at start), standalone or cluster", func(c *Config, v string) error {
			m, err := adapters.ParseRedisMode(v)
			if err != nil {
				return err
			}
			c.RedisMode = m
			return nil
		}},
		{"REDIS_TLS_CA_FILE", "redis-tls-ca-file", "", "with a rediss:// REDIS_URL: PEM file of the CA (bundle) that signed the Redis servers' certificates (empty: the system's CAs)", func(c *Config, v string) error {
			c.RedisTLSFiles.CAFile = v
			return nil
		}},
		{"REDIS_TLS_CERT_FILE", "redis-tls-cert-file", "", "with a rediss:// REDIS_URL: PEM client certificate (chain) for servers that ask for one (tls-auth-clients, Redis's default), with REDIS_TLS_KEY_FILE", func(c *Config, v string) error {
			c.RedisTLSFiles.CertFile = v
			return nil
		}},
		{"REDIS_TLS_KEY_FILE", "redis-tls-key-file", "", "PEM private key of REDIS_TLS_CERT_FILE", func(c *Config, v string) error {
			c.RedisTLSFiles.KeyFile = v
			return nil
		}},
		{"REDIS_TLS_SERVER_NAME", "redis-tls-server-name", "", "with a rediss:// REDIS_URL: the name every Redis server's certificate must carry (empty: each server is verified by the host it is reached at; on a cluster with REDIS_TLS_CA_FILE or a client certificate, the address each node announces, else the seed's)", func(c *Config, v string) error {
			c.RedisTLSFiles.ServerName = v
			return nil
		}},
		{"STREAM_PARTITIONS", "stream-partitions", "auto", fmt.Sprintf("partitions of the event stream, fixed when it is created (a start with another count is refused): auto is 1 on a single server (the one key <prefix>:events) and %d on a cluster; 1 to %d", adapters.DefaultClusterPartitions, adapters.MaxPartitions), func(c *Config, v string) error {
			if v == "auto" {
				c.StreamPartitions = 0
				return nil
			}
			n, err := strconv.Atoi(v)
			if err != nil || n < 1 || n > adapters.MaxPartitions {
				return fmt.Errorf("must be auto or a number from 1 to %d, got %q", adapters.MaxPartitions, v)
			}
			c.StreamPartitions = n
			return nil
		}},
		{"HTTP_ADDR", "http-addr", ":8080", "listen address of the public API (check-ins, reads, health)", func(c *Config, v string) error {
			if err := checkListenAddr(v); err != nil {
				return err
			}
			c.HTTPAddr = v
			return nil
		}},
		{"LOG_LEVEL", "log-level", "info", "debug, info, warn or error", func(c *Config, v string) error {
			return c.LogLevel.UnmarshalText([]byte(v))
		}},
		{"KEY_PREFIX", "key-prefix", "checkins", "prefix of every Redis key (stream: <prefix>:events)", func(c *Config, v string) error {
			if v == "" || strings.ContainsAny(v, " {}") {
				return fmt.Errorf("must be non-empty without spaces or braces, got %q", v)
			}
			c.KeyPrefix = v
			return nil
		}},
		{"REQUEST_TIMEOUT", "request-timeout", "5s", "longest an HTTP request may take (503 beyond it when Redis does not answer)", dur(func(c *Config) *time.Duration { return &c.RequestTimeout }, time.Millisecond)},
		{"DRAIN_TIMEOUT", "drain-timeout", "30s", "on SIGTERM/SIGINT: how long in-flight requests and handlers may take to finish (at least 1s)", dur(func(c *Config) *time.Duration { return &c.DrainTimeout }, time.Second)},
		{"PROJECTIONS", "projections", "", "comma-separated projections to run (default: all)", func(c *Config, v string) error {
			// Checked here, before anything starts (every command, api's too): a list with a
			// name this build does not ship, an empty item or a name twice is a mistake, not
			// the default set.
			c.Projections = nil
			if strings.TrimSpace(v) == "" {
				return nil
			}
			var known []string
			for _, p := range allProjections(Config{}) {
				known = append(known, p.Name())
			}
			for _, p := range strings.Split(v, ",") {
				switch p = strings.TrimSpace(p); {
				case p == "":
					return fmt.Errorf("an empty item in %q: names separated by single commas (empty for all)", v)
				case !slices.Contains(known, p):
					return fmt.Errorf("unknown projection %q (known: %s)", p, strings.Join(known, ", "))
				case slices.Contains(c.Projections, p):
					return fmt.Errorf("projection %q listed twice", p)
				}
				c.Projections = append(c.Projections, p)
			}
			return nil
		}},
		{"SUBSCRIBER", "subscriber", "batched", "stream subscriber: batched (reads and acks in batches) or watermill (stock watermill-redisstream)", func(c *Config, v string) error {
			if v != "batched" && v != "watermill" {
				return fmt.Errorf("must be batched or watermill, got %q", v)
			}
			c.Subscriber = v
			return nil
		}},
		{"CONSUMER_NAME", "consumer-name", "", "consumer name in the groups (default: hostname-pid-random; must be unique per process)", func(c *Config, v string) error {
			c.ConsumerName = v
			return nil
		}},
		{"CLAIM_IDLE", "claim-idle", "30s", "a pending event idle this long in another (crashed) consumer is taken over, and a projector writes nothing for an event whose hold it could not renew this long (less a margin); the same in every projector (at least 100ms: below, a projector's hold of a batch runs out before it can apply it)", dur(func(c *Config) *time.Duration { return &c.ClaimIdle }, 100*time.Millisecond)},
		{"CLAIM_INTERVAL", "claim-interval", "5s", "how often to look for such events", dur(func(c *Config) *time.Duration { return &c.ClaimInterval }, time.Millisecond)},
		{"CONSUMER_IDLE_REMOVE", "consumer-idle-remove", "10m", "a consumer idle this long with nothing pending (a dead process) is removed from its group", dur(func(c *Config) *time.Duration { return &c.ConsumerIdleRemove }, time.Millisecond)},
		{"NACK_DELAY", "nack-delay", "1s", "wait before an event whose handling failed transiently is delivered again", dur(func(c *Config) *time.Duration { return &c.NackDelay }, time.Millisecond)},
		{"BATCH_SIZE", "batch-size", "500", "entries read (XREADGROUP COUNT) per round trip, and at most handed to the projections as one batch", integer(func(c *Config) *int { return &c.BatchSize }, 1)},
		{"READ_LINGER", "read-linger", "5ms", "after a read of fewer than BATCH_SIZE/4 events, wait this long before the next one, so a busy stream is projected in batches (0: read again at once)", dur(func(c *Config) *time.Duration { return &c.ReadLinger }, 0)},
		{"ALLOW_EVICTING_REDIS", "allow-evicting-redis", "false", "run although Redis's maxmemory-policy lets it evict keys (which deletes events and dedupe state without an error); otherwise serve, api and project refuse to start", func(c *Config, v string) error {
			b, err := strconv.ParseBool(v)
			if err != nil {
				return fmt.Errorf("must be true or false, got %q", v)
			}
			c.AllowEvictingRedis = b
			return nil
		}},
		{"REDIS_CHECK_INTERVAL", "redis-check-interval", "1m", "how often a running service reads Redis's maxmemory-policy again", dur(func(c *Config) *time.Duration { return &c.RedisCheckInterval }, time.Millisecond)},
		{"MAX_IN_FLIGHT", "max-in-flight", "1000", "entries read and not yet acknowledged, per consumer group", integer(func(c *Config) *int { return &c.MaxInFlight }, 1)},
		{"HANDLER_TIMEOUT", "handler-timeout", "10s", "longest one attempt at a batch may take (the projections' handlers and applying their updates)", dur(func(c *Config) *time.Duration { return &c.HandlerTimeout }, time.Millisecond)},
		{"RETRY_INITIAL_INTERVAL", "retry-initial-interval", "100ms", "first wait between handler attempts", dur(func(c *Config) *time.Duration { return &c.RetryInitial }, time.Millisecond)},
		{"RETRY_MULTIPLIER", "retry-multiplier", "2", "each wait is the previous times this (with jitter)", func(c *Config, v string) error {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil || math.IsNaN(f) || math.IsInf(f, 0) || f < 1 {
				return fmt.Errorf("must be a finite number >= 1, got %q", v)
			}
			c.RetryMultiplier = f
			return nil
		}},
		{"RETRY_MAX_INTERVAL", "retry-max-interval", "5s", "longest wait between attempts", dur(func(c *Config) *time.Duration { return &c.RetryMax }, time.Millisecond)},
		{"RETRY_MAX_ATTEMPTS", "retry-max-attempts", "5", "attempts before an event is parked in the poison queue", integer(func(c *Config) *int { return &c.RetryAttempts }, 1)},
		{"INGEST_MIN_REPLICAS", "ingest-min-replicas", "0", "a check-in is acknowledged only once this many Redis replicas have it (WAIT after the XADD, same round trip); fewer within INGEST_REPLICA_TIMEOUT: 503 not_replicated. 0: as soon as the master has it", integer(func(c *Config) *int { return &c.IngestMinReplicas }, 0)},
		{"INGEST_REPLICA_TIMEOUT", "ingest-replica-timeout", "500ms", "with INGEST_MIN_REPLICAS: how long a check-in waits for its replicas (below REQUEST_TIMEOUT)", dur(func(c *Config) *time.Duration { return &c.IngestReplicaTimeout }, time.Millisecond)},
		{"PROJECTION_MIN_REPLICAS", "projection-min-replicas", "0", "projection updates count as applied, and their events are acknowledged, only once this many Redis replicas have them (WAIT after each batch's script calls, same round trip); fewer within PROJECTION_REPLICA_TIMEOUT: the batch is delivered again. With the batched subscriber (the default) a projector's reads and the renewals of its hold on events wait the same way before they count. 0: as soon as the master has them", integer(func(c *Config) *int { return &c.ProjectionMinReplicas }, 0)},
		{"PROJECTION_REPLICA_TIMEOUT", "projection-replica-timeout", "1s", "with PROJECTION_MIN_REPLICAS: how long a batch waits for its replicas (below HANDLER_TIMEOUT)", dur(func(c *Config) *time.Duration { return &c.ProjectionReplicaTimeout }, time.Millisecond)},
		{"IDEMPOTENCY_TTL", "idempotency-ttl", "24h", "how long a checkinId is remembered for safe retries and 409 on reuse; above REQUEST_TIMEOUT", dur(func(c *Config) *time.Duration { return &c.IdempotencyTTL }, time.Second)},
		{"DEDUPE_WINDOW", "dedupe-window", "24h", "projections count another copy of a check-in (same checkinId and content) recorded this close to the counted one as a duplicate; at least IDEMPOTENCY_TTL (unset: IDEMPOTENCY_TTL when that is longer)", dur(func(c *Config) *time.Duration { return &c.DedupeWindow }, time.Second)},
		{"LEADERBOARD_MIN_CHECKINS", "leaderboard-min-checkins", "5", "check-ins a location needs to enter the rating leaderboard (changing it takes a rebuild of leaderboards)", func(c *Config, v string) error {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil || n < 1 {
				return fmt.Errorf("must be an integer >= 1, got %q", v)
			}
			c.LeaderboardMinCheckins = n
			return nil
		}},
		{"PROJECTION_POLL_INTERVAL", "projection-poll-interval", "2s", "how often projectors read the projections registry to start a rebuilt version and stop a retired one", dur(func(c *Config) *time.Duration { return &c.ProjectionPoll }, 10*time.Millisecond)},
		{"PROJECTION_RETIRE_GRACE", "projection-retire-grace", "10s", "after a rebuild switched reads, wait this long before removing the old version: keep it above PROJECTION_POLL_INTERVAL plus the time in-flight handlers take to finish", dur(func(c *Config) *time.Duration { return &c.RetireGrace }, 0)},
		{"STALL_AFTER", "stall-after", "60s", "a projection behind the stream that makes no progress this long is reported stalled (/readyz 503)", dur(func(c *Config) *time.Duration { return &c.StallAfter }, 10*time.Millisecond)},
		{"RETENTION", "retention", "off", "trim the event stream: off, a number of entries (1000000) or an age (720h, 30d); never below what a consumer group still needs", func(c *Config, v string) error {
			p, err := command.ParseRetention(v)
			if err != nil {
				return err
			}
			c.Retention = p
			return nil
		}},
		{"RETENTION_INTERVAL", "retention-interval", "1m", "how often the projector trims the stream when RETENTION is set", dur(func(c *Config) *time.Duration { return &c.RetentionInterval }, 10*time.Millisecond)},
	}, append(append(accessSettings(), httpSettings(dur)...), uiSettings(dur, integer)...)...)
}

// parseQuietly parses args on fs. -h prints the usage with every flag; a bad flag only says
// what is wrong and where the flags are listed, instead of burying the error under the
// seventy-odd settings' usage.
func parseQuietly(fs *flag.FlagSet, args []string) error {
	out, usage := fs.Output(), fs.Usage
	if usage == nil {
		usage = func() {
			fmt.Fprintf(out, "Usage of %s:\n", fs.Name())
			fs.PrintDefaults()
		}
	}
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	err := fs.Parse(args)
	fs.SetOutput(out)
	fs.Usage = usage
	switch {
	case errors.Is(err, flag.ErrHelp):
		usage()
		return err
	case err != nil:
		return fmt.Errorf("%w (%q lists the flags)", err, fs.Name()+" --help")
	}
	return nil
}

// parseConfig fills Config from defaults, then the environment, then flags; the first invalid
// value fails with a message naming the variable.
func parseConfig(fs *flag.FlagSet, args []string, getenv func(string) string) (Config, []string, error) {
	var c Config
	ss := settings()
	flagVals := map[string]*string{}
	for _, s := range ss {
		if err := s.set(&c, s.def); err != nil {
			return Config{}, nil, fmt.Errorf("default of %s: %w", s.env, err)
		}
		usage := fmt.Sprintf("%s (env %s)", s.usage, s.env)
		if s.def != "" {
			usage = fmt.Sprintf("%s (env %s, default %s)", s.usage, s.env, s.def)
		}
		flagVals[s.flag] = fs.String(s.flag, "", usage)
	}
	if err := parseQuietly(fs, args); err != nil {
		return Config{}, nil, err
	}
	explicit := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { explicit[f.Name] = true })
	// A flag wins over its variable, and only the value that wins is read: a bad value in the
	// environment does not stop the flag that overrides it.
	for _, s := range ss {
		if explicit[s.flag] {
			if err := s.set(&c, *flagVals[s.flag]); err != nil {
				return Config{}, nil, fmt.Errorf("invalid --%s (%s): %w", s.flag, s.env, err)
			}
		} else if v, ok := lookup(getenv, s.env); ok {
			if err := s.set(&c, v); err != nil {
				return Config{}, nil, fmt.Errorf("invalid %s: %w", s.env, err)
			}
		}
	}
	if err := c.loadRedisTLS(); err != nil {
		return Config{}, nil, err
	}
	if c.UI.MaxStreams > opsMaxConns-uiReservedOpsConns {
		return Config{}, nil, fmt.Errorf("invalid UI_MAX_STREAMS: %d leaves too few of the ops listener's %d connections for health checks, /metrics and the ops API (each stream holds one); at most %d",
			c.UI.MaxStreams, opsMaxConns, opsMaxConns-uiReservedOpsConns)
	}
	if c.RetireGrace <= c.ProjectionPoll {
		return Config{}, nil, fmt.Errorf("invalid PROJECTION_RETIRE_GRACE: %s must be above PROJECTION_POLL_INTERVAL %s, or projectors may still write to a version being removed", c.RetireGrace, c.ProjectionPoll)
	}
	if _, set := lookup(getenv, "DEDUPE_WINDOW"); !set && !explicit["dedupe-window"] && c.DedupeWindow < c.IdempotencyTTL {
		c.DedupeWindow = c.IdempotencyTTL // the default follows a longer IDEMPOTENCY_TTL
	}
	if c.DedupeWindow < c.IdempotencyTTL {
		return Config{}, nil, fmt.Errorf("invalid DEDUPE_WINDOW: %s is below IDEMPOTENCY_TTL %s: a copy of a check-in that reaches the stream within IDEMPOTENCY_TTL of the first (a retry the API did not recognise, a producer's copy) must still count once", c.DedupeWindow, c.IdempotencyTTL)
	}
	if c.IdempotencyTTL <= c.RequestTimeout {
		return Config{}, nil, fmt.Errorf("invalid IDEMPOTENCY_TTL: %s must be above REQUEST_TIMEOUT %s: a checkinId's reservation must outlive the request that holds it, or a retry could take it while that request is still recording, and record the check-in twice", c.IdempotencyTTL, c.RequestTimeout)
	}
	if c.IngestMinReplicas > 0 && c.IngestReplicaTimeout >= c.RequestTimeout {
		return Config{}, nil, fmt.Errorf("invalid INGEST_REPLICA_TIMEOUT: %s must be below REQUEST_TIMEOUT %s, or a request could end before its replicas answer", c.IngestReplicaTimeout, c.RequestTimeout)
	}
	if c.ProjectionMinReplicas > 0 && c.ProjectionReplicaTimeout >= c.HandlerTimeout {
		return Config{}, nil, fmt.Errorf("invalid PROJECTION_REPLICA_TIMEOUT: %s must be below HANDLER_TIMEOUT %s, or a batch could time out before its replicas answer", c.ProjectionReplicaTimeout, c.HandlerTimeout)
	}
	if c.RetryMax < c.RetryInitial {
		return Config{}, nil, fmt.Errorf("invalid RETRY_MAX_INTERVAL: %s is below RETRY_INITIAL_INTERVAL %s", c.RetryMax, c.RetryInitial)
	}
	if err := c.finishAccess(getenv); err != nil {
		return Config{}, nil, err
	}
	if err := c.HTTP.validate(c.RequestTimeout); err != nil {
		return Config{}, nil, err
	}
	if c.ConsumerName == "" {
		host, _ := os.Hostname()
		c.ConsumerName = fmt.Sprintf("%s-%d-%d", host, os.Getpid(), time.Now().UnixNano()%100000)
	}
	return c, fs.Args(), nil
}

// loadRedisTLS reads REDIS_TLS_*'s files once, so a missing or wrong file stops the start with
// the setting's name; they only make sense with a rediss:// REDIS_URL.
func (c *Config) loadRedisTLS() error {
	if !c.RedisTLSFiles.Set() {
		return nil
	}
	if u, err := url.Parse(c.RedisURL); c.RedisURL == "" || err != nil || u.Scheme != "rediss" {
		what := "REDIS_URL is not set (the embedded Redis speaks no TLS)"
		if c.RedisURL != "" {
			what = "REDIS_URL is " + redact(c.RedisURL) + ", plain TCP"
		}
		return fmt.Errorf("invalid REDIS_TLS_*: TLS settings are given but %s; use rediss://host:port for TLS", what)
	}
	var err error
	c.RedisTLS, err = adapters.LoadRedisTLS(c.RedisTLSFiles)
	return err
}

func lookup(getenv func(string) string, key string) (string, bool) {
	v := getenv(key)
	return v, v != ""
}

// redact hides a password in a URL for messages and logs. A URL that does not parse, or that
// parses without its user info (an unescaped '#', '?' or '/' in the password ends the host
// early), still has everything between "://" and its last '@' masked: that is where a
// password would be.
func redact(raw string) string {
	u, err := url.Parse(raw)
	if err == nil && u.User != nil {
		if _, ok := u.User.Password(); ok {
			u.User = url.UserPassword(u.User.Username(), "xxxxx")
		}
		return u.String()
	}
	rest := raw
	scheme, after, found := strings.Cut(raw, "://")
	if found {
		rest = after
	}
	at := strings.LastIndex(rest, "@")
	if at < 0 {
		return raw
	}
	if found {
		return scheme + "://xxxxx" + rest[at:]
	}
	return "xxxxx" + rest[at:]
}

// checkRedisAddr refuses an address of REDIS_URL whose port is not 1-65535 (none: Redis's 6379).
func checkRedisAddr(a string) error {
	_, port, err := net.SplitHostPort(a)
	if err != nil {
		if strings.Contains(err.Error(), "missing port") {
			return nil
		}
		return fmt.Errorf("address %q: %v", a, err)
	}
	if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
		return fmt.Errorf("port must be 1-65535, got %q in %q", port, a)
	}
	return nil
}
