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
}

// Evicts reports whether the policy lets Redis delete keys under memory pressure (anything but
// noeviction): events, pending entries, dedupe state and idempotency keys could then vanish
// without an error.
func (m MemoryInfo) Evicts() bool { return m.Policy != "" && m.Policy != "noeviction" }

// ReadMemoryInfo reads INFO memory, and CONFIG GET maxmemory-policy when INFO does not name the
// policy. Both are reads: they work when Redis is out of memory.
func ReadMemoryInfo(ctx context.Context, client redis.UniversalClient) (MemoryInfo, error) {
	if cc, ok := client.(*redis.ClusterClient); ok {
		var (
			mu  sync.Mutex
			sum MemoryInfo
		)
		err := cc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error {
			m, err := readNodeMemory(ctx, c)
			if err != nil {
				return err
			}
			mu.Lock()
			defer mu.Unlock()
			sum.Reported = sum.Reported || m.Reported
			sum.Used += m.Used
			sum.Max += m.Max
			if sum.Policy == "" || (m.Evicts() && !sum.Evicts()) {
				sum.Policy = m.Policy
			}
			return nil
		})
		return sum, err
	}
	return readNodeMemory(ctx, client)
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
