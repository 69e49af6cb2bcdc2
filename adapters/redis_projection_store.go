package adapters

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/redis/go-redis/v9"

	"github.com/checkins/checkins/app/projection"
)

// ProjectionReader reads the keys of the projection version that serves reads.
type ProjectionReader struct {
	client   redis.UniversalClient
	keys     KeySpace
	name     string
	versions *ProjectionVersions
}

// NewProjectionReader reads projection name at whatever version is current.
func NewProjectionReader(client redis.UniversalClient, keys KeySpace, name string) *ProjectionReader {
	return &ProjectionReader{client: client, keys: keys, name: name, versions: NewProjectionVersions(client, keys)}
}

func (r *ProjectionReader) key(ctx context.Context, slot, key string) (string, error) {
	v, err := r.versions.Current(ctx, r.name)
	if err != nil {
		return "", err
	}
	return r.keys.ProjectionKey(r.name, v, slot, key), nil
}

// HGetAll implements projection.Reader.
func (r *ProjectionReader) HGetAll(ctx context.Context, slot, key string) (map[string]string, error) {
	k, err := r.key(ctx, slot, key)
	if err != nil {
		return nil, err
	}
	return r.client.HGetAll(ctx, k).Result()
}

// HMGet implements projection.Reader.
func (r *ProjectionReader) HMGet(ctx context.Context, slot, key string, fields ...string) ([]string, error) {
	k, err := r.key(ctx, slot, key)
	if err != nil {
		return nil, err
	}
	vals, err := r.client.HMGet(ctx, k, fields...).Result()
	if err != nil {
		return nil, err
	}
	out := make([]string, len(vals))
	for i, v := range vals {
		if s, ok := v.(string); ok {
			out[i] = s
		}
	}
	return out, nil
}

// ZRevRange implements projection.Reader.
func (r *ProjectionReader) ZRevRange(ctx context.Context, slot, key string, start, stop int64) ([]projection.Scored, error) {
	k, err := r.key(ctx, slot, key)
	if err != nil {
		return nil, err
	}
	zs, err := r.client.ZRevRangeWithScores(ctx, k, start, stop).Result()
	if err != nil {
		return nil, err
	}
	out := make([]projection.Scored, len(zs))
	for i, z := range zs {
		out[i] = projection.Scored{Member: fmt.Sprint(z.Member), Score: z.Score}
	}
	return out, nil
}

// ZRevRanges implements projection.Reader: one pipeline, against the version serving when it
// starts. A cluster client splits it by master and sends those in parallel.
func (r *ProjectionReader) ZRevRanges(ctx context.Context, reads []projection.RangeRead) ([][]projection.Scored, error) {
	if len(reads) == 0 {
		return nil, nil
	}
	v, err := r.versions.Current(ctx, r.name)
	if err != nil {
		return nil, err
	}
	pipe := r.client.Pipeline()
	cmds := make([]*redis.ZSliceCmd, len(reads))
	for i, rd := range reads {
		cmds[i] = pipe.ZRevRangeWithScores(ctx, r.keys.ProjectionKey(r.name, v, rd.Slot, rd.Key), rd.Start, rd.Stop)
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return nil, err
	}
	out := make([][]projection.Scored, len(reads))
	for i, c := range cmds {
		zs := c.Val()
		out[i] = make([]projection.Scored, len(zs))
		for j, z := range zs {
			m, ok := z.Member.(string) // what go-redis parses a member into
			if !ok {
				m = fmt.Sprint(z.Member)
			}
			out[i][j] = projection.Scored{Member: m, Score: z.Score}
		}
	}
	return out, nil
}

// ZScores implements projection.Reader: one pipeline of ZMSCOREs, against the version serving
// when it starts.
func (r *ProjectionReader) ZScores(ctx context.Context, reads []projection.MembersRead) ([][]float64, error) {
	if len(reads) == 0 {
		return nil, nil
	}
	v, err := r.versions.Current(ctx, r.name)
	if err != nil {
		return nil, err
	}
	pipe := r.client.Pipeline()
	cmds := make([]*redis.FloatSliceCmd, len(reads))
	for i, rd := range reads {
		cmds[i] = pipe.ZMScore(ctx, r.keys.ProjectionKey(r.name, v, rd.Slot, rd.Key), rd.Members...)
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return nil, err
	}
	out := make([][]float64, len(reads))
	for i, c := range cmds {
		out[i] = c.Val() // go-redis reads a missing member's nil as 0
	}
	return out, nil
}

// HMGets implements projection.Reader: one pipeline, against the version serving when it starts.
func (r *ProjectionReader) HMGets(ctx context.Context, reads []projection.FieldsRead) ([][]string, error) {
	if len(reads) == 0 {
		return nil, nil
	}
	v, err := r.versions.Current(ctx, r.name)
	if err != nil {
		return nil, err
	}
	pipe := r.client.Pipeline()
	cmds := make([]*redis.SliceCmd, len(reads))
	for i, rd := range reads {
		cmds[i] = pipe.HMGet(ctx, r.keys.ProjectionKey(r.name, v, rd.Slot, rd.Key), rd.Fields...)
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return nil, err
	}
	out := make([][]string, len(reads))
	for i, c := range cmds {
		vals := c.Val()
		out[i] = make([]string, len(vals))
		for j, v := range vals {
			if s, ok := v.(string); ok {
				out[i][j] = s
			}
		}
	}
	return out, nil
}

// ProjectionVersions tracks which version of each projection serves reads.
type ProjectionVersions struct {
	client redis.UniversalClient
	keys   KeySpace
}

// NewProjectionVersions reads and writes the projections registry hash.
func NewProjectionVersions(client redis.UniversalClient, keys KeySpace) *ProjectionVersions {
	return &ProjectionVersions{client: client, keys: keys}
}

// Current is the version serving reads; 1 when the projection was never rebuilt.
func (v *ProjectionVersions) Current(ctx context.Context, name string) (int, error) {
	s, err := v.client.HGet(ctx, v.keys.Projections(), name+".version").Result()
	if errors.Is(err, redis.Nil) {
		return 1, nil
	}
	if err != nil {
		return 0, err
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 {
		return 0, fmt.Errorf("projection %s: stored version %q is not a positive integer", name, s)
	}
	return n, nil
}
