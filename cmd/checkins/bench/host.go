package bench

import (
	"context"
	"crypto/tls"
	"flag"
	"io"
	"log/slog"
	"net"
	"time"

	"github.com/checkins/checkins/adapters"
	"github.com/checkins/checkins/app/command"
	"github.com/checkins/checkins/app/projection"
	"github.com/checkins/checkins/ports"
)

// Host is what the bench needs from the binary it is part of (cmd/checkins/wire_bench.go): the
// service's settings, as `checkins serve` reads them, and in-process services built on them.
type Host struct {
	// ParseConfig reads the service's settings from flags (fs already holds the bench's own)
	// and the environment, and returns what is left of args.
	ParseConfig func(fs *flag.FlagSet, args []string, getenv func(string) string) (Config, []string, error)
	// NewService builds, without running it, a service of mode on cfg.
	NewService func(ctx context.Context, cfg Config, mode Mode, log *slog.Logger) (Service, error)
	// Projections are the projections the binary ships, configured by cfg;
	// SelectProjections those cfg.Projections selects (all when it is empty).
	Projections       func(cfg Config) []projection.Projection
	SelectProjections func(cfg Config) ([]projection.Projection, error)
	NewLogger         func(w io.Writer, level slog.Level) *slog.Logger
	// Redact hides the password of a Redis URL.
	Redact func(string) string
	// TokenIssuer mints the load generator's tokens with the service's key (nil: AUTH_MODE off,
	// no tokens sent).
	TokenIssuer func(cfg Config) (*ports.TokenIssuer, error)
}

// Config is the service configuration as the bench reads and adjusts it. Service carries the
// binary's own configuration these fields were read from; NewService applies them over it.
type Config struct {
	RedisURL  string
	RedisMode adapters.RedisMode
	RedisTLS  *tls.Config // REDIS_TLS_*, for a rediss:// RedisURL
	// StreamPartitions is STREAM_PARTITIONS (0: the default, 1 on one server, 24 on a cluster).
	StreamPartitions int
	KeyPrefix        string
	HTTPAddr         string
	ConsumerName     string
	LogLevel         slog.Level
	Projections      []string // empty: all
	Subscriber       string
	BatchSize        int
	MaxInFlight      int
	DedupeWindow     time.Duration
	// IdempotencyTTL is IDEMPOTENCY_TTL, which --preload-records spreads its records' ages over
	// (read only: the services keep their own).
	IdempotencyTTL time.Duration
	Retention      command.RetentionPolicy
	// Access: AUTH_MODE (shown with the figures), the ops listener, the rate limits.
	AuthMode      string
	OpsAddr       string
	RateLimitUser command.RateLimit
	RateLimitIP   command.RateLimit
	Service       any
}

// Mode selects what an in-process service runs.
type Mode struct {
	API, Projections bool
}

// Service is an in-process service.
type Service interface {
	// Listen binds the HTTP address (before Run, so the bench learns the port).
	Listen() (net.Addr, error)
	// Run serves until ctx ends, then shuts down gracefully.
	Run(ctx context.Context) error
	// Ready fails while the service cannot serve (Redis, projections).
	Ready(ctx context.Context) error
	// Groups are the consumer groups the service's projections consume (none in an API).
	Groups() []string
	// Close releases what a service that never ran holds.
	Close()
}
