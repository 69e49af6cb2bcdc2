package adapters

import (
	"context"
	"fmt"
	"strings"
	"sync"

	"github.com/redis/go-redis/v9"

	"github.com/checkins/checkins/app/ops"
)

// ProjectionKeys removes what a projection version or a consumer group left in Redis
// (ops.ProjectionKeys): SCAN for the keys under a prefix, UNLINK them in batches, on every
// master of a cluster.
type ProjectionKeys struct {
	client redis.UniversalClient
	keys   KeySpace
}

var _ ops.ProjectionKeys = (*ProjectionKeys)(nil)

// NewProjectionKeys removes keys of keys' prefix.
func NewProjectionKeys(client redis.UniversalClient, keys KeySpace) *ProjectionKeys {
	return &ProjectionKeys{client: client, keys: keys}
}

// RemoveVersion unlinks every key of a projection version.
func (p *ProjectionKeys) RemoveVersion(ctx context.Context, name string, version int) (int64, error) {
	return p.unlinkMatching(ctx, escapeGlob(p.keys.ProjectionPrefix(name, version))+"*")
}

// RemoveMarkers unlinks a consumer group's dedupe markers.
func (p *ProjectionKeys) RemoveMarkers(ctx context.Context, group string) (int64, error) {
	// Exactly group's: its prefix then a slot's hash tag. With "*" alone the markers of live
	// matched those of every live:<a>,<b> group too.
	return p.unlinkMatching(ctx, escapeGlob(p.keys.MarkerPrefix(group))+"{*}")
}

// RemoveLegacyDedupe unlinks a version's dedupe sets of the earlier layout ({<slot>}:seen).
func (p *ProjectionKeys) RemoveLegacyDedupe(ctx context.Context, name string, version int) (int64, error) {
	return p.unlinkMatching(ctx, escapeGlob(p.keys.ProjectionPrefix(name, version))+"{*}:"+legacyKeyName)
}

// unlinkMatching unlinks, in batches, every key matching pattern; it returns how many went.
func (p *ProjectionKeys) unlinkMatching(ctx context.Context, pattern string) (int64, error) {
	var (
		removed int64
		mu      sync.Mutex
	)
	_, cluster := p.client.(*redis.ClusterClient)
	scan := func(ctx context.Context, c redis.UniversalClient) error {
		iter := c.Scan(ctx, 0, pattern, 1000).Iterator()
		batch := make([]string, 0, 500)
		flush := func() error {
			if len(batch) == 0 {
				return nil
			}
			n, err := unlinkBatch(ctx, c, batch, cluster)
			mu.Lock()
			removed += n
			mu.Unlock()
			batch = batch[:0]
			return err
		}
		for iter.Next(ctx) {
			batch = append(batch, iter.Val())
			if len(batch) == cap(batch) {
				if err := flush(); err != nil {
					return err
				}
			}
		}
		if err := iter.Err(); err != nil {
			return err
		}
		return flush()
	}
	var err error
	if cc, ok := p.client.(*redis.ClusterClient); ok {
		err = cc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error { return scan(ctx, c) })
	} else {
		err = scan(ctx, p.client)
	}
	if err != nil {
		return removed, fmt.Errorf("remove keys %s: %w", pattern, err)
	}
	return removed, nil
}

// unlinkBatch unlinks keys found on one node. A node of a cluster holds many slots, and one
// UNLINK of keys in several slots is refused (CROSSSLOT) even there: on a cluster the keys go
// one UNLINK per slot, in one pipeline. Atomicity across the keys is not needed: each key is
// garbage of a retired version or group, removed once and never written again.
func unlinkBatch(ctx context.Context, c redis.UniversalClient, keys []string, cluster bool) (int64, error) {
	if !cluster {
		return c.Unlink(ctx, keys...).Result()
	}
	bySlot := map[int][]string{}
	for _, k := range keys {
		bySlot[KeySlot(k)] = append(bySlot[KeySlot(k)], k)
	}
	pipe := c.Pipeline()
	cmds := make([]*redis.IntCmd, 0, len(bySlot))
	for _, ks := range bySlot {
		cmds = append(cmds, pipe.Unlink(ctx, ks...))
	}
	_, err := pipe.Exec(ctx)
	var n int64
	for _, cmd := range cmds {
		n += cmd.Val()
	}
	return n, err
}

func escapeGlob(s string) string {
	var b strings.Builder
	for _, r := range s {
		if strings.ContainsRune(`*?[]\`, r) {
			b.WriteByte('\\')
		}
		b.WriteRune(r)
	}
	return b.String()
}
