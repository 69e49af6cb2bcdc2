package adapters

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
)

// RedisMemoryCollector reports Redis's memory at scrape time: used_memory, maxmemory (0: no
// limit) and the eviction policy, what to watch to scale before Redis refuses writes; and the
// keys of the service's database, and how many of them expire, which at a steady rate are
// mostly the idempotency records and set what every command's lookups cost.
type RedisMemoryCollector struct {
	client  redis.UniversalClient
	timeout time.Duration

	used, max, ratio, policy, keys, expiring *prometheus.Desc
}

// NewRedisMemoryCollector reads client's INFO memory within timeout per scrape.
func NewRedisMemoryCollector(client redis.UniversalClient, timeout time.Duration) *RedisMemoryCollector {
	return &RedisMemoryCollector{client: client, timeout: timeout,
		used: prometheus.NewDesc("checkins_redis_used_memory_bytes", "Redis used_memory (INFO memory; summed over the masters of a cluster).", nil, nil),
		max:  prometheus.NewDesc("checkins_redis_maxmemory_bytes", "Redis maxmemory; 0: no limit (writes fail with OOM at the limit under noeviction).", nil, nil),
		ratio: prometheus.NewDesc("checkins_redis_memory_used_ratio",
			"used_memory / maxmemory of the Redis server nearest its limit (on a cluster, the fullest master: at 1 it refuses the writes of its slots); absent when no server has a limit.", nil, nil),
		policy: prometheus.NewDesc("checkins_redis_maxmemory_policy", "1 for Redis's maxmemory-policy (anything but noeviction may delete data).", []string{"policy"}, nil),
		keys:   prometheus.NewDesc("checkins_redis_keys", "Keys in the service's Redis database (INFO keyspace; summed over the masters of a cluster).", nil, nil),
		expiring: prometheus.NewDesc("checkins_redis_expiring_keys",
			"Of checkins_redis_keys, those with a TTL: mostly the idempotency records of the last IDEMPOTENCY_TTL (about rate x IDEMPOTENCY_TTL).", nil, nil),
	}
}

// Describe implements prometheus.Collector.
func (c *RedisMemoryCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.used
	ch <- c.max
	ch <- c.ratio
	ch <- c.policy
	ch <- c.keys
	ch <- c.expiring
}

// Collect implements prometheus.Collector; nothing when Redis does not answer or tell.
func (c *RedisMemoryCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), c.timeout)
	defer cancel()
	m, err := ReadMemoryInfo(ctx, c.client)
	if err != nil {
		return
	}
	if m.Reported {
		ch <- prometheus.MustNewConstMetric(c.used, prometheus.GaugeValue, float64(m.Used))
		ch <- prometheus.MustNewConstMetric(c.max, prometheus.GaugeValue, float64(m.Max))
		if m.Fullest > 0 {
			ch <- prometheus.MustNewConstMetric(c.ratio, prometheus.GaugeValue, m.Fullest)
		}
	}
	if m.Policy != "" {
		ch <- prometheus.MustNewConstMetric(c.policy, prometheus.GaugeValue, 1, m.Policy)
	}
	if k, err := ReadKeyspaceInfo(ctx, c.client); err == nil && k.Reported {
		ch <- prometheus.MustNewConstMetric(c.keys, prometheus.GaugeValue, float64(k.Keys))
		ch <- prometheus.MustNewConstMetric(c.expiring, prometheus.GaugeValue, float64(k.Expiring))
	}
}
