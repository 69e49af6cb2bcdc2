package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/checkins/checkins/adapters"
	"github.com/checkins/checkins/app"
	"github.com/checkins/checkins/app/command"
	"github.com/checkins/checkins/app/projection"
	"github.com/checkins/checkins/ports"
)

// opsCommands are the operational verbs: ports parse their flags, drive the use cases and print;
// cmd reads the settings and connects.
func opsCommands() map[string]subcommand {
	return map[string]subcommand{
		"poison": {"inspect, replay and purge the poison queue", cliVerb(ports.PoisonCommand)},
		"status": {"consumer groups, consumers, pending, lag, poison counts", cliVerb(ports.StatusCommand)},
		"idempotency": {"how the idempotency records are written (idempotency format [compact|json])",
			cliVerb(ports.IdempotencyCommand)},
		"partitions": {"move the event stream to another number of partitions (partitions migrate --to N)",
			func(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
				return ports.PartitionsCommand(ctx, args, stdout, stderr, connectMigrate(getenv, stderr))
			}},
	}
}

// projectionCommands are the projection verbs (projections list|rebuild).
func projectionCommands() map[string]subcommand {
	return map[string]subcommand{
		"projections": {"list projection versions; rebuild a projection without downtime; disband a live group to regroup its projections", cliVerb(ports.ProjectionsCommand)},
	}
}

type cliRun func(ctx context.Context, args []string, stdout, stderr io.Writer, connect ports.Connect) error

func cliVerb(run cliRun) func(context.Context, []string, func(string) string, io.Writer, io.Writer) error {
	return func(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
		return run(ctx, args, stdout, stderr, connectOps(getenv, stderr))
	}
}

// connectOps reads the service's settings next to the verb's flags and builds the ops use cases
// on a Redis client of their own.
func connectOps(getenv func(string) string, stderr io.Writer) ports.Connect {
	return func(name string, fs *flag.FlagSet, args []string) (*ports.CLISession, error) {
		cfg, rest, client, keys, err := connectRedis(fs, args, getenv, 5*time.Second)
		if err != nil {
			return nil, err
		}
		partsCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		// An ops verb never records the count: run against a mistyped prefix, or from a shell
		// whose STREAM_PARTITIONS is not the service's before its first start, it would create
		// the keyspace or fix a count the service then refuses. It only checks it.
		keys, err = checkedPartitions(partsCtx, client, keys, streamPartitions(cfg, keys.Cluster))
		cancel()
		if err != nil {
			_ = client.Close()
			return nil, err
		}
		level := cfg.LogLevel
		if strings.HasPrefix(name, "projections") {
			// Progress goes to stdout; only trouble to the log.
			level = max(level, slog.LevelWarn)
		}
		var a app.Application
		closeOps, err := addOps(&a, client, keys, cfg, allProjections(cfg), newLogger(stderr, level))
		if err != nil {
			_ = client.Close()
			return nil, err
		}
		return &ports.CLISession{App: a, Args: rest, Poll: cfg.ProjectionPoll, Close: func() { _ = closeOps(); _ = client.Close() }}, nil
	}
}

// connectMigrate connects `checkins partitions migrate`: like connectOps, but the configured
// partition count is not checked (the migration reads the recorded one) and only the migration
// is wired.
func connectMigrate(getenv func(string) string, _ io.Writer) ports.Connect {
	return func(_ string, fs *flag.FlagSet, args []string) (*ports.CLISession, error) {
		cfg, rest, client, keys, err := connectRedis(fs, args, getenv, 10*time.Second)
		if err != nil {
			return nil, err
		}
		mp, err := command.NewMigratePartitions(adapters.NewPartitionMigrator(client, keys))
		if err != nil {
			_ = client.Close()
			return nil, err
		}
		var a app.Application
		a.Commands.MigratePartitions = mp
		return &ports.CLISession{App: a, Args: rest, Poll: 200 * time.Millisecond,
			Settle: adapters.QuiescePoll + cfg.RequestTimeout + time.Second, RequestTimeout: cfg.RequestTimeout,
			MinReplicas: cfg.IngestMinReplicas, ReplicaTimeout: cfg.IngestReplicaTimeout,
			Close: func() { _ = client.Close() }}, nil
	}
}

// connectRedis reads an ops verb's settings and flags and connects to Redis in the mode it
// finds (a cluster or one server), with ioTimeout on reads and writes; keys are laid out for
// that mode, not yet for the partitions.
func connectRedis(fs *flag.FlagSet, args []string, getenv func(string) string, ioTimeout time.Duration) (Config, []string, redis.UniversalClient, adapters.KeySpace, error) {
	cfg, rest, err := parseConfig(fs, args, getenv)
	if err != nil {
		return Config{}, nil, nil, adapters.KeySpace{}, err
	}
	if cfg.RedisURL == "" {
		return Config{}, nil, nil, adapters.KeySpace{}, errors.New("REDIS_URL (or --redis-url) is required")
	}
	opts := adapters.ClientOptions{URL: cfg.RedisURL, TLS: cfg.RedisTLS, Mode: cfg.RedisMode, DialTimeout: 2 * time.Second,
		ReadTimeout: ioTimeout, WriteTimeout: ioTimeout}
	detectCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	redisMode, err := adapters.DetectRedisMode(detectCtx, opts)
	cancel()
	if err != nil {
		return Config{}, nil, nil, adapters.KeySpace{}, err
	}
	opts.Mode = redisMode
	keys, err := adapters.NewKeySpace(cfg.KeyPrefix, redisMode == adapters.RedisModeCluster)
	if err != nil {
		return Config{}, nil, nil, adapters.KeySpace{}, fmt.Errorf("invalid KEY_PREFIX: %w", err)
	}
	client, err := adapters.NewUniversalRedisClient(context.Background(), opts)
	if err != nil {
		return Config{}, nil, nil, adapters.KeySpace{}, err
	}
	return cfg, rest, client, keys, nil
}

// addOps adds the operational commands and queries for projs (every projection the build knows),
// on client, to a. With PROJECTION_MIN_REPLICAS the replays of parked events apply through a
// client of their own, which closeOps closes.
func addOps(a *app.Application, client redis.UniversalClient, keys adapters.KeySpace, cfg Config, projs []projection.Projection, log *slog.Logger) (closeOps func() error, err error) {
	closeOps = func() error { return nil }
	applyClient := client
	if cfg.ProjectionMinReplicas > 0 {
		mode := adapters.RedisModeStandalone
		if keys.Cluster {
			mode = adapters.RedisModeCluster
		}
		if applyClient, err = adapters.NewUniversalRedisClient(context.Background(), adapters.ClientOptions{URL: cfg.RedisURL, TLS: cfg.RedisTLS, Mode: mode,
			DialTimeout: 2 * time.Second, ReadTimeout: 3*time.Second + cfg.ProjectionReplicaTimeout, WriteTimeout: 3 * time.Second}); err != nil {
			return closeOps, err
		}
		closeOps = applyClient.Close
	}
	applier, err := newApplier(applyClient, keys, cfg)
	if err != nil {
		return closeOps, errors.Join(err, closeOps())
	}
	return closeOps, a.AddOps(app.OpsConfig{Backend: adapters.NewOpsBackend(client, keys), Applier: applier, Projections: projs,
		RetireGrace: cfg.RetireGrace, StallAfter: cfg.StallAfter, Retention: cfg.Retention, ClaimIdle: cfg.ClaimIdle, Logger: log})
}

// newApplier is the projections' applier on client (one of its own when PROJECTION_MIN_REPLICAS
// is set: the WAIT hook goes on it before its first command).
func newApplier(client redis.UniversalClient, keys adapters.KeySpace, cfg Config) (*adapters.ProjectionApplier, error) {
	applier, err := adapters.NewProjectionApplier(client, keys, cfg.DedupeWindow)
	if err != nil {
		return nil, err
	}
	if cfg.ProjectionMinReplicas > 0 {
		if err := applier.RequireReplicas(cfg.ProjectionMinReplicas, cfg.ProjectionReplicaTimeout); err != nil {
			return nil, err
		}
	}
	return applier, nil
}
