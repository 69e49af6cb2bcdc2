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

// HLen implements projection.Reader.
func (r *ProjectionReader) HLen(ctx context.Context, slot, key string) (int64, error) {
	k, err := r.key(ctx, slot, key)
	if err != nil {
		return 0, err
	}
	return r.client.HLen(ctx, k).Result()
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

// readSlotScript reads KEYS[1]'s fields ARGV[2..1+ARGV[1]] and, with KEYS[2], the scores of the
// members after them: one script, so at one moment of the slot both keys are in.
const readSlotScript = `
local nf = tonumber(ARGV[1])
local fields, scores = {}, {}
if nf > 0 then fields = redis.call('HMGET', KEYS[1], unpack(ARGV, 2, 1 + nf)) end
if #ARGV > 1 + nf then scores = redis.call('ZMSCORE', KEYS[2], unpack(ARGV, 2 + nf, #ARGV)) end
return {fields, scores}
`

// ReadSlots implements projection.Reader: one script call per read, pipelined (one round trip;
// on a cluster one per master, in parallel), against the version serving when it starts. A
// script runs at one moment of its slot: a MULTI/EXEC would do on one server, but a cluster
// client's transaction is of one slot only.
func (r *ProjectionReader) ReadSlots(ctx context.Context, reads []projection.SlotRead) ([]projection.SlotValues, error) {
	if len(reads) == 0 {
		return nil, nil
	}
	v, err := r.versions.Current(ctx, r.name)
	if err != nil {
		return nil, err
	}
	pipe := r.client.Pipeline()
	cmds := make([]*redis.Cmd, len(reads))
	for i, rd := range reads {
		keys := []string{r.keys.ProjectionKey(r.name, v, rd.Slot, rd.Hash)}
		if len(rd.Members) > 0 {
			keys = append(keys, r.keys.ProjectionKey(r.name, v, rd.Slot, rd.SortedSet))
		}
		args := make([]any, 0, 1+len(rd.Fields)+len(rd.Members))
		args = append(args, len(rd.Fields))
		for _, f := range rd.Fields {
			args = append(args, f)
		}
		for _, m := range rd.Members {
			args = append(args, m)
		}
		cmds[i] = pipe.Eval(ctx, readSlotScript, keys, args...)
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return nil, err
	}
	out := make([]projection.SlotValues, len(reads))
	for i, c := range cmds {
		both, err := c.Slice()
		if err != nil {
			return nil, err
		}
		if len(both) != 2 {
			return nil, fmt.Errorf("read of slot %s: %d parts in the answer, want 2", reads[i].Slot, len(both))
		}
		fields, _ := both[0].([]any)
		scores, _ := both[1].([]any)
		if len(fields) != len(reads[i].Fields) || len(scores) != len(reads[i].Members) {
			return nil, fmt.Errorf("read of slot %s: %d fields and %d scores in the answer, want %d and %d",
				reads[i].Slot, len(fields), len(scores), len(reads[i].Fields), len(reads[i].Members))
		}
		out[i].Fields = make([]string, len(fields))
		for j, f := range fields {
			out[i].Fields[j], _ = f.(string) // nil: missing
		}
		out[i].Scores = make([]float64, len(scores))
		for j, sc := range scores {
			str, ok := sc.(string)
			if !ok {
				continue // nil: not a member
			}
			if out[i].Scores[j], err = strconv.ParseFloat(str, 64); err != nil {
				return nil, fmt.Errorf("read of slot %s: score %q of %s: %w", reads[i].Slot, str, reads[i].Members[j], err)
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
