package adapters

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"

	"github.com/redis/go-redis/v9"

	"github.com/checkins/checkins/app/projection"
)

// applyScript is the one script every projection update runs: it records the event in the slot's
// dedupe set and applies the ops only if the event was new, atomically. All keys share the
// slot's hash tag. Ops are validated before any write, because Redis does not roll a script back.
//
// It walks ARGV in place rather than building tables per op: the script runs twice per event,
// and Redis's single thread is what bounds the drain rate.
//
// KEYS[1] = dedupe set, KEYS[2..] = keys used by ops.
// ARGV[1] = event id, ARGV[2] = op count, then per op: kind, nkeys, nargs, key indexes, args.
const applyScript = `
local n = tonumber(ARGV[2])
local i = 3
for _ = 1, n do
  local kind = ARGV[i]
  if kind ~= 'hincrby' and kind ~= 'hset' and kind ~= 'hmaxby' and kind ~= 'hround' and kind ~= 'zadd'
    and kind ~= 'zincrby' and kind ~= 'zkeeptop' and kind ~= 'zratioatmin' then
    return redis.error_reply('unknown op ' .. tostring(kind))
  end
  i = i + 3 + tonumber(ARGV[i+1]) + tonumber(ARGV[i+2])
end
if redis.call('SADD', KEYS[1], ARGV[1]) == 0 then return 0 end
i = 3
for _ = 1, n do
  local kind, nk, na = ARGV[i], tonumber(ARGV[i+1]), tonumber(ARGV[i+2])
  local k = KEYS[tonumber(ARGV[i+3])]
  local a = i + 3 + nk
  if kind == 'hincrby' then
    redis.call('HINCRBY', k, ARGV[a], ARGV[a+1])
  elseif kind == 'hset' then
    redis.call('HSET', k, ARGV[a], ARGV[a+1])
  elseif kind == 'hmaxby' then
    local cur = redis.call('HMGET', k, ARGV[a], ARGV[a+2])
    local v, c = tonumber(ARGV[a+1]), tonumber(cur[1])
    if c == nil or v > c or (v == c and (not cur[2] or ARGV[a+3] > cur[2])) then
      redis.call('HSET', k, unpack(ARGV, a, a + na - 1))
    end
  elseif kind == 'hround' then
    local cur = redis.call('HMGET', k, ARGV[a+1], ARGV[a+2])
    local num, den = tonumber(cur[1]) or 0, tonumber(cur[2]) or 0
    if den > 0 then redis.call('HSET', k, ARGV[a], math.floor(num / den + 0.5)) end
  elseif kind == 'zadd' then
    redis.call('ZADD', k, ARGV[a], ARGV[a+1])
  elseif kind == 'zincrby' then
    redis.call('ZINCRBY', k, ARGV[a], ARGV[a+1])
  elseif kind == 'zkeeptop' then
    redis.call('ZREMRANGEBYRANK', k, 0, -(tonumber(ARGV[a]) + 1))
  elseif kind == 'zratioatmin' then
    local cur = redis.call('HMGET', KEYS[tonumber(ARGV[i+4])], ARGV[a+1], ARGV[a+2])
    local num, den = tonumber(cur[1]) or 0, tonumber(cur[2]) or 0
    if den > 0 and den >= tonumber(ARGV[a+3]) then redis.call('ZADD', k, num / den, ARGV[a]) end
  end
  i = a + na
end
return 1
`

// ApplyScript is shared by every projection store so EVALSHA is loaded once per server.
var applyLua = redis.NewScript(applyScript)

// ProjectionStore applies one projection version's updates with applyScript.
type ProjectionStore struct {
	pipeline *AutoPipeline // nil: one round trip per Apply
	client   redis.UniversalClient
	prefix   string // keys.ProjectionPrefix(name, version)
	keys     KeySpace
	name     string
	version  int
}

// NewProjectionStore is the store of projection name at version.
func NewProjectionStore(client redis.UniversalClient, keys KeySpace, name string, version int) (*ProjectionStore, error) {
	if client == nil || name == "" || version < 1 {
		return nil, errors.New("adapters: ProjectionStore needs a client, a projection name and a version >= 1")
	}
	return &ProjectionStore{client: client, keys: keys, name: name, version: version,
		prefix: keys.ProjectionPrefix(name, version)}, nil
}

// WithAutoPipeline sends Apply calls through p, batching concurrent ones into pipelines.
func (s *ProjectionStore) WithAutoPipeline(p *AutoPipeline) *ProjectionStore {
	s.pipeline = p
	return s
}

// Apply implements projection.Store.
func (s *ProjectionStore) Apply(ctx context.Context, u *projection.Update) (bool, error) {
	keys, args, err := s.encode(u)
	if err != nil {
		return false, err
	}
	var n int64
	if s.pipeline != nil {
		var v any
		if v, err = s.pipeline.Run(ctx, applyLua, keys, args...); err == nil {
			n, _ = v.(int64)
		}
	} else {
		n, err = applyLua.Run(ctx, s.client, keys, args...).Int64()
	}
	if err != nil {
		return false, fmt.Errorf("projection %s v%d apply %s to %s: %w", s.name, s.version, u.EventID, u.Slot, err)
	}
	return n == 1, nil
}

// ApplyBatch runs many updates in one pipeline (one round trip); used by bulk paths.
func (s *ProjectionStore) ApplyBatch(ctx context.Context, us []*projection.Update) error {
	if len(us) == 0 {
		return nil
	}
	pipe := s.client.Pipeline()
	cmds := make([]*redis.Cmd, len(us))
	for i, u := range us {
		keys, args, err := s.encode(u)
		if err != nil {
			return err
		}
		cmds[i] = applyLua.EvalSha(ctx, pipe, keys, args...)
	}
	_, err := pipe.Exec(ctx)
	if err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
		if err := applyLua.Load(ctx, s.client).Err(); err != nil {
			return fmt.Errorf("projection %s: load script: %w", s.name, err)
		}
		return s.ApplyBatch(ctx, us)
	}
	if err != nil {
		return fmt.Errorf("projection %s v%d apply batch of %d: %w", s.name, s.version, len(us), err)
	}
	return nil
}

var knownOps = map[projection.OpKind]bool{
	projection.OpHIncrBy: true, projection.OpHSet: true, projection.OpHMaxBy: true, projection.OpHRound: true,
	projection.OpZAdd: true, projection.OpZIncrBy: true, projection.OpZKeepTop: true, projection.OpZRatioAtMin: true,
}

func (s *ProjectionStore) encode(u *projection.Update) ([]string, []any, error) {
	if u.Slot == "" || u.EventID == "" {
		return nil, nil, fmt.Errorf("projection %s: update needs a slot and an event ID (got slot %q, event %q)", s.name, u.Slot, u.EventID)
	}
	// Built by hand on the hot path: this runs once per event and projection.
	slotPrefix := s.prefix + "{" + u.Slot + "}:"
	keys := make([]string, 1, 4)
	keys[0] = slotPrefix + "seen"
	names := make([]string, 1, 4) // names[i] is the logical name of keys[i]
	names[0] = "seen"
	args := make([]any, 2, 2+8*len(u.Ops))
	args[0], args[1] = u.EventID, len(u.Ops)
	for _, op := range u.Ops {
		// The script refuses unknown kinds too, but only per update: checking here keeps a
		// batch from applying the updates before a bad one.
		if !knownOps[op.Kind] {
			return nil, nil, fmt.Errorf("projection %s: unknown op %q", s.name, op.Kind)
		}
		args = append(args, string(op.Kind), len(op.Keys), len(op.Args))
		for _, k := range op.Keys {
			if k == "" || k == "seen" {
				return nil, nil, fmt.Errorf("projection %s: key name %q is reserved or empty", s.name, k)
			}
			idx := slices.Index(names, k) + 1 // Lua indexes from 1
			if idx == 0 {
				names = append(names, k)
				keys = append(keys, slotPrefix+k)
				idx = len(keys)
			}
			args = append(args, idx)
		}
		for _, a := range op.Args {
			args = append(args, a)
		}
	}
	return keys, args, nil
}

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
