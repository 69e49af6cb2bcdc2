package main

import (
	"context"

	"github.com/redis/go-redis/v9"

	"github.com/checkins/checkins/adapters"
)

// streamPartitions is P as configured: STREAM_PARTITIONS, or by default 1 on a single server
// and adapters.DefaultClusterPartitions on a cluster.
func streamPartitions(cfg Config, cluster bool) int {
	switch {
	case cfg.StreamPartitions > 0:
		return cfg.StreamPartitions
	case cluster:
		return adapters.DefaultClusterPartitions
	}
	return 1
}

// checkedPartitions is withPartitions that records nothing: a count recorded other than p fails;
// none recorded passes.
func checkedPartitions(ctx context.Context, client redis.UniversalClient, keys adapters.KeySpace, p int) (adapters.KeySpace, error) {
	if err := adapters.CheckPartitions(ctx, client, keys, p); err != nil {
		return adapters.KeySpace{}, err
	}
	return keys.WithPartitions(p)
}

// withPartitions checks P against the one recorded for the stream (a start with another P is
// refused, naming the migration) and returns keys with the partitions. A single server with
// P = 1 records nothing, so its keys stay exactly those of a service without partitions (a
// stream written there counts as P = 1 anyway); every other setup records P when the stream is
// first set up.
func withPartitions(ctx context.Context, client redis.UniversalClient, keys adapters.KeySpace, p int) (adapters.KeySpace, error) {
	check := adapters.EnsurePartitions
	if p == 1 && !keys.Cluster {
		check = adapters.CheckPartitions
	}
	if err := check(ctx, client, keys, p); err != nil {
		return adapters.KeySpace{}, err
	}
	return keys.WithPartitions(p)
}
