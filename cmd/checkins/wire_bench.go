package main

import (
	"context"
	"errors"
	"flag"
	"io"
	"log/slog"

	"github.com/checkins/checkins/app/projection"
	"github.com/checkins/checkins/cmd/checkins/bench"
	"github.com/checkins/checkins/ports"
)

// benchCommands is the `bench` verb; the bench itself is cmd/checkins/bench.
func benchCommands() map[string]subcommand {
	return map[string]subcommand{
		"bench": {"measure ingest, sustained projected throughput, drain, end-to-end latency and Redis memory against raw-Redis baselines",
			func(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
				return bench.Run(ctx, benchHost(), args, getenv, stdout, stderr)
			}},
	}
}

// benchHost is this binary as the bench sees it: its settings and its services.
func benchHost() bench.Host {
	return bench.Host{
		ParseConfig: func(fs *flag.FlagSet, args []string, getenv func(string) string) (bench.Config, []string, error) {
			cfg, rest, err := parseConfig(fs, args, getenv)
			return benchConfig(cfg), rest, err
		},
		NewService: func(ctx context.Context, bc bench.Config, mode bench.Mode, log *slog.Logger) (bench.Service, error) {
			svc, err := NewService(ctx, serviceConfig(bc), Mode{API: mode.API, Projections: mode.Projections}, log)
			if err != nil {
				return nil, err
			}
			return benchService{svc}, nil
		},
		Projections:       func(bc bench.Config) []projection.Projection { return allProjections(serviceConfig(bc)) },
		SelectProjections: func(bc bench.Config) ([]projection.Projection, error) { return selectProjections(serviceConfig(bc)) },
		NewLogger:         newLogger,
		Redact:            redact,
		TokenIssuer:       benchTokenIssuer,
	}
}

// benchTokenIssuer signs the bench's tokens with the service's key (hs256, or dev mode's key in
// STATE_DIR): the bench measures the service with authentication on, as users run it.
func benchTokenIssuer(bc bench.Config) (*ports.TokenIssuer, error) {
	cfg := serviceConfig(bc)
	switch cfg.AuthMode {
	case AuthOff:
		return nil, nil
	case AuthJWKS:
		return nil, errors.New("the bench mints its own tokens: run it with AUTH_MODE=hs256 (the target's secret) or dev, not jwks")
	}
	key, err := cfg.signingKey()
	if err != nil {
		return nil, err
	}
	return ports.NewTokenIssuer(key, cfg.Issuer, cfg.Audience)
}

func benchConfig(cfg Config) bench.Config {
	return bench.Config{RedisURL: cfg.RedisURL, RedisTLS: cfg.RedisTLS, RedisMode: cfg.RedisMode, StreamPartitions: cfg.StreamPartitions, KeyPrefix: cfg.KeyPrefix, HTTPAddr: cfg.HTTPAddr, ConsumerName: cfg.ConsumerName,
		LogLevel: cfg.LogLevel, Projections: cfg.Projections, Subscriber: cfg.Subscriber, BatchSize: cfg.BatchSize,
		MaxInFlight: cfg.MaxInFlight, DedupeWindow: cfg.DedupeWindow, IdempotencyTTL: cfg.IdempotencyTTL, Retention: cfg.Retention,
		AuthMode: cfg.AuthMode, OpsAddr: cfg.OpsAddr, RateLimitUser: cfg.RateLimitUser, RateLimitIP: cfg.RateLimitIP, Service: cfg}
}

// serviceConfig is the configuration bc came from with the bench's changes applied.
func serviceConfig(bc bench.Config) Config {
	cfg, _ := bc.Service.(Config)
	cfg.RedisURL, cfg.RedisTLS, cfg.KeyPrefix, cfg.HTTPAddr, cfg.ConsumerName = bc.RedisURL, bc.RedisTLS, bc.KeyPrefix, bc.HTTPAddr, bc.ConsumerName
	cfg.LogLevel, cfg.Projections, cfg.Subscriber, cfg.BatchSize = bc.LogLevel, bc.Projections, bc.Subscriber, bc.BatchSize
	cfg.MaxInFlight, cfg.DedupeWindow, cfg.Retention = bc.MaxInFlight, bc.DedupeWindow, bc.Retention
	cfg.AuthMode, cfg.OpsAddr, cfg.RateLimitUser, cfg.RateLimitIP = bc.AuthMode, bc.OpsAddr, bc.RateLimitUser, bc.RateLimitIP
	return cfg
}

// benchService is a Service as the bench drives it.
type benchService struct{ *Service }

func (s benchService) Close() { s.close() }

func (s benchService) Groups() []string {
	if s.router == nil {
		return nil
	}
	return s.router.Groups()
}
