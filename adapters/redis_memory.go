package adapters

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"

	"github.com/redis/go-redis/v9"
)

// MemoryInfo is what Redis says about its memory (on a cluster: the masters', summed, and the
// first policy that evicts, if any).
type MemoryInfo struct {
	// Reported: INFO memory answered, and Used and Max are known (a managed Redis may refuse INFO
	// to the application's user).
	Reported bool
	Used     int64 // used_memory, bytes
	Max      int64 // maxmemory, bytes; 0: no limit
	// Policy is maxmemory-policy ("noeviction", "allkeys-lru", ...); "" when Redis does not tell
	// (INFO without the field, CONFIG disabled or renamed, as managed services do).
	Policy string
	// Fullest is used_memory / maxmemory of the server nearest its limit: on a cluster one master
	// at its limit refuses the writes of its slots however much room the others have, which
	// the sums hide. 0 when no server has a limit.
	Fullest float64
}

// Evicts reports whether the policy lets Redis delete keys under memory pressure (anything but
// noeviction): events, pending entries, dedupe state and idempotency keys could then vanish
// without an error.
func (m MemoryInfo) Evicts() bool { return m.Policy != "" && m.Policy != "noeviction" }

// ReadMemoryInfo reads INFO memory, and CONFIG GET maxmemory-policy when INFO does not name the
// policy. Both are reads: they work when Redis is out of memory.
func ReadMemoryInfo(ctx context.Context, client redis.UniversalClient) (MemoryInfo, error) {
	if cc, ok := client.(*redis.ClusterClient); ok {
		return mergeMasters(ctx, cc, readNodeMemory, func(sum *MemoryInfo, m MemoryInfo) {
			sum.Reported = sum.Reported || m.Reported
			sum.Used += m.Used
			sum.Max += m.Max
			sum.Fullest = max(sum.Fullest, m.Fullest)
			if sum.Policy == "" || (m.Evicts() && !sum.Evicts()) {
				sum.Policy = m.Policy
			}
		})
	}
	return readNodeMemory(ctx, client)
}

// mergeMasters reads every master of a cluster with read and merges what each answered into
// one value, one master at a time; the first error is returned with what the others answered.
func mergeMasters[T any](ctx context.Context, cc *redis.ClusterClient, read func(context.Context, redis.UniversalClient) (T, error), merge func(sum *T, one T)) (T, error) {
	var (
		mu  sync.Mutex
		sum T
	)
	err := cc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error {
		one, err := read(ctx, c)
		if err != nil {
			return err
		}
		mu.Lock()
		defer mu.Unlock()
		merge(&sum, one)
		return nil
	})
	return sum, err
}

func readNodeMemory(ctx context.Context, c redis.UniversalClient) (MemoryInfo, error) {
	raw, err := c.Info(ctx, "memory").Result()
	if err != nil && !isUnknownCommand(err) {
		return MemoryInfo{}, fmt.Errorf("INFO memory: %w", err)
	}
	m := MemoryInfo{Reported: err == nil}
	for _, line := range strings.Split(raw, "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok {
			continue
		}
		switch k {
		case "used_memory":
			m.Used, _ = strconv.ParseInt(v, 10, 64)
		case "maxmemory":
			m.Max, _ = strconv.ParseInt(v, 10, 64)
		case "maxmemory_policy":
			m.Policy = v
		}
	}
	if m.Max > 0 {
		m.Fullest = float64(m.Used) / float64(m.Max)
	}
	if m.Policy == "" {
		vals, err := c.ConfigGet(ctx, "maxmemory-policy").Result()
		switch {
		case err == nil:
			m.Policy = vals["maxmemory-policy"]
		case isUnknownCommand(err):
			// CONFIG is disabled or renamed: the policy stays unknown.
		default:
			return m, fmt.Errorf("CONFIG GET maxmemory-policy: %w", err)
		}
	}
	return m, nil
}

// isUnknownCommand: the server does not offer the command (disabled, renamed, or refused by an
// ACL).
func isUnknownCommand(err error) bool {
	var rErr redis.Error
	if !errors.As(err, &rErr) {
		return false
	}
	msg := strings.ToLower(rErr.Error())
	return strings.Contains(msg, "unknown command") || strings.HasPrefix(msg, "noperm") ||
		strings.Contains(msg, "unknown subcommand")
}

// KeyspaceInfo is what INFO keyspace says of the database the client uses (on a cluster:
// database 0 of every master, summed).
type KeyspaceInfo struct {
	// Reported: INFO keyspace answered (a managed Redis may refuse INFO to the application's user).
	Reported bool
	Keys     int64 // keys in the database
	// Expiring are those with a TTL: mostly the idempotency records of the last IDEMPOTENCY_TTL
	// and the rate limit's state. Every command's lookups go through tables that hold them.
	Expiring int64
}

// ReadKeyspaceInfo reads INFO keyspace; a database INFO does not list is empty.
func ReadKeyspaceInfo(ctx context.Context, client redis.UniversalClient) (KeyspaceInfo, error) {
	switch c := client.(type) {
	case *redis.ClusterClient:
		db0 := func(ctx context.Context, n redis.UniversalClient) (KeyspaceInfo, error) {
			return readNodeKeyspace(ctx, n, 0)
		}
		return mergeMasters(ctx, c, db0, func(sum *KeyspaceInfo, k KeyspaceInfo) {
			sum.Reported = sum.Reported || k.Reported
			sum.Keys += k.Keys
			sum.Expiring += k.Expiring
		})
	case *redis.Client:
		return readNodeKeyspace(ctx, c, c.Options().DB)
	}
	return readNodeKeyspace(ctx, client, 0)
}

func readNodeKeyspace(ctx context.Context, c redis.UniversalClient, db int) (KeyspaceInfo, error) {
	raw, err := c.Info(ctx, "keyspace").Result()
	if isUnknownCommand(err) {
		return KeyspaceInfo{}, nil
	}
	if err != nil {
		return KeyspaceInfo{}, fmt.Errorf("INFO keyspace: %w", err)
	}
	k := KeyspaceInfo{Reported: true}
	want := "db" + strconv.Itoa(db)
	for _, line := range strings.Split(raw, "\n") {
		name, fields, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || name != want {
			continue
		}
		// db0:keys=12,expires=3,avg_ttl=86312000
		for _, f := range strings.Split(fields, ",") {
			key, v, _ := strings.Cut(f, "=")
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				continue
			}
			switch key {
			case "keys":
				k.Keys = n
			case "expires":
				k.Expiring = n
			}
		}
	}
	return k, nil
}
