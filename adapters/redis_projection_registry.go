package adapters

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/checkins/checkins/app/ops"
)

var _ ops.Registry = (*ProjectionVersions)(nil)

// The projections registry (KeySpace.Projections) beyond the serving version that
// ProjectionVersions.Current reads: the state of rebuilds, changed only by small scripts so
// that concurrent rebuild drivers agree.

// Registry fields of projection <name> besides <name>.version (the version serving reads):
// <name>.building is the version being rebuilt, <name>.retiring the version replaced by the last
// switch whose keys and group are still to be removed (with <name>.switched_at, ms), and
// <name>.rebuild the last rebuild's progress as JSON, for status output; <name>.layout and
// <name>.building_layout the layouts (projection.Layouts) the serving and the building version
// are written in (none: layout 1, what releases before layouts wrote; only layouts above 1 are
// recorded by a rebuild, so the registry of a projection without layouts does not change).
const (
	registryBuilding       = ".building"
	registryRetiring       = ".retiring"
	registrySwitchedAt     = ".switched_at"
	registryRebuild        = ".rebuild"
	registryLayout         = ".layout"
	registryBuildingLayout = ".building_layout"
)

// State reads one projection's registry entry.
func (v *ProjectionVersions) State(ctx context.Context, name string) (ops.VersionState, error) {
	vals, err := v.client.HMGet(ctx, v.keys.Projections(), name+".version", name+registryBuilding,
		name+registryRetiring, name+registrySwitchedAt, name+registryRebuild, name+registryLayout, name+registryBuildingLayout).Result()
	if err != nil {
		return ops.VersionState{}, err
	}
	str := func(i int) string { s, _ := vals[i].(string); return s }
	st := ops.VersionState{Serving: 1, Rebuild: str(4)}
	for _, f := range []struct {
		i   int
		dst *int
	}{{0, &st.Serving}, {1, &st.Building}, {2, &st.Retiring}, {5, &st.ServingLayout}, {6, &st.BuildingLayout}} {
		if s := str(f.i); s != "" {
			n, err := strconv.Atoi(s)
			if err != nil || n < 1 {
				return ops.VersionState{}, fmt.Errorf("projection %s: registry field %d holds %q, not a positive integer", name, f.i, s)
			}
			*f.dst = n
		}
	}
	st.SwitchedAt, _ = strconv.ParseInt(str(3), 10, 64)
	return st, nil
}

var beginBuildLua = redis.NewScript(`
local cur = tonumber(redis.call('HGET', KEYS[1], ARGV[1] .. '.version') or '1')
local b = redis.call('HGET', KEYS[1], ARGV[1] .. '.building')
if b then return {cur, tonumber(b), 0} end
if redis.call('HEXISTS', KEYS[1], ARGV[1] .. '.retiring') == 1 then return {cur, 0, 2} end
redis.call('HSET', KEYS[1], ARGV[1] .. '.building', cur + 1)
if ARGV[2] ~= '1' then redis.call('HSET', KEYS[1], ARGV[1] .. '.building_layout', ARGV[2]) end
return {cur, cur + 1, 1}
`)

// BeginBuild atomically marks version serving+1 as building in layout, unless a build is
// already in progress (then it returns that one with started false, so a rebuild can be
// resumed).
func (v *ProjectionVersions) BeginBuild(ctx context.Context, name string, layout int) (serving, building int, started bool, err error) {
	if layout < 1 {
		return 0, 0, false, fmt.Errorf("projection %s: begin rebuild: layout %d is not a positive integer", name, layout)
	}
	res, err := beginBuildLua.Run(ctx, v.client, []string{v.keys.Projections()}, name, layout).Int64Slice()
	if err != nil {
		return 0, 0, false, fmt.Errorf("projection %s: begin rebuild: %w", name, err)
	}
	if res[2] == 2 {
		return int(res[0]), 0, false, fmt.Errorf("projection %s: %w", name, ops.ErrRetiring)
	}
	return int(res[0]), int(res[1]), res[2] == 1, nil
}

// LockStart holds name's rebuild start (<prefix>:rebuild-start:<name>, a token with a TTL): it
// extends the TTL every ttl/3 until release, which deletes the key if it still holds this call's
// token. Should the process die, the key expires after ttl.
func (v *ProjectionVersions) LockStart(ctx context.Context, name string, ttl time.Duration) (func(context.Context) error, bool, error) {
	l, ok, err := acquireLease(ctx, v.client, v.keys.RebuildStartLock(name), ttl)
	if err != nil {
		return nil, false, fmt.Errorf("projection %s: lock the rebuild's start: %w", name, err)
	}
	if !ok {
		return nil, false, nil
	}
	return func(ctx context.Context) error {
		if err := l.release(ctx); err != nil {
			return fmt.Errorf("projection %s: the rebuild's start: %w", name, err)
		}
		return nil
	}, true, nil
}

// serverTimeLua is TIME in milliseconds, run on the node of its key (the poison queue's).
var serverTimeLua = redis.NewScript(`
local t = redis.call('TIME')
return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
`)

// ServerTime implements ops.Registry: the time of the server that holds the poison queue, whose
// entry IDs are its parked entries' times (on a cluster, the queue's node, not any node). A
// replay compares a build's start with them; the clock of the process that started the rebuild
// (an operator's machine) was seconds off, and a build's own parked entry then looked older
// than the build and was deleted uncounted.
func (v *ProjectionVersions) ServerTime(ctx context.Context) (int64, error) {
	ms, err := serverTimeLua.Run(ctx, v.client, []string{v.keys.PoisonStream()}).Int64()
	if err != nil {
		return 0, fmt.Errorf("read the server's time: %w", err)
	}
	return ms, nil
}

// SetBuildStart records where version's build began, as <name>.v<version>.build_start (JSON).
func (v *ProjectionVersions) SetBuildStart(ctx context.Context, name string, version int, b ops.BuildStart) error {
	raw, err := json.Marshal(b)
	if err != nil {
		return err
	}
	if err := v.client.HSet(ctx, v.keys.Projections(), buildStartField(name, version), raw).Err(); err != nil {
		return fmt.Errorf("projection %s: record where v%d's build began: %w", name, version, err)
	}
	return nil
}

// BuildStart reads what SetBuildStart recorded.
func (v *ProjectionVersions) BuildStart(ctx context.Context, name string, version int) (ops.BuildStart, bool, error) {
	raw, err := v.client.HGet(ctx, v.keys.Projections(), buildStartField(name, version)).Bytes()
	if errors.Is(err, redis.Nil) {
		return ops.BuildStart{}, false, nil
	}
	if err != nil {
		return ops.BuildStart{}, false, fmt.Errorf("projection %s: read where v%d's build began: %w", name, version, err)
	}
	var b ops.BuildStart
	if err := json.Unmarshal(raw, &b); err != nil {
		return ops.BuildStart{}, false, fmt.Errorf("projection %s: where v%d's build began: %w", name, version, err)
	}
	return b, true, nil
}

func buildStartField(name string, version int) string {
	return name + ".v" + strconv.Itoa(version) + ".build_start"
}

var promoteLua = redis.NewScript(`
if (redis.call('HGET', KEYS[1], ARGV[1] .. '.version') or '1') ~= ARGV[2] then return 0 end
if redis.call('HGET', KEYS[1], ARGV[1] .. '.building') ~= ARGV[3] then return 0 end
local layout = redis.call('HGET', KEYS[1], ARGV[1] .. '.building_layout')
redis.call('HSET', KEYS[1], ARGV[1] .. '.version', ARGV[3], ARGV[1] .. '.retiring', ARGV[2], ARGV[1] .. '.switched_at', ARGV[4])
if layout then redis.call('HSET', KEYS[1], ARGV[1] .. '.layout', layout) else redis.call('HDEL', KEYS[1], ARGV[1] .. '.layout') end
redis.call('HDEL', KEYS[1], ARGV[1] .. '.building', ARGV[1] .. '.building_layout')
return 1
`)

// Promote switches reads from version from to version to in one step, if the registry still
// says from serves and to is building (so concurrent drivers switch once).
func (v *ProjectionVersions) Promote(ctx context.Context, name string, from, to int, at time.Time) (bool, error) {
	n, err := promoteLua.Run(ctx, v.client, []string{v.keys.Projections()}, name, strconv.Itoa(from), strconv.Itoa(to),
		strconv.FormatInt(at.UnixMilli(), 10)).Int()
	if err != nil {
		return false, fmt.Errorf("projection %s: switch v%d -> v%d: %w", name, from, to, err)
	}
	return n == 1, nil
}

var retiredLua = redis.NewScript(`
if redis.call('HGET', KEYS[1], ARGV[1] .. '.retiring') ~= ARGV[2] then return 0 end
redis.call('HDEL', KEYS[1], ARGV[1] .. '.retiring')
return 1
`)

// Retired records that version's keys and group are gone.
func (v *ProjectionVersions) Retired(ctx context.Context, name string, version int) error {
	return retiredLua.Run(ctx, v.client, []string{v.keys.Projections()}, name, strconv.Itoa(version)).Err()
}

// DecideLayout records layout as the serving version's (HSETNX: the first to decide wins) and
// returns the layout recorded.
func (v *ProjectionVersions) DecideLayout(ctx context.Context, name string, layout int) (int, error) {
	if layout < 1 {
		return 0, fmt.Errorf("projection %s: layout %d is not a positive integer", name, layout)
	}
	k := v.keys.Projections()
	if err := v.client.HSetNX(ctx, k, name+registryLayout, layout).Err(); err != nil {
		return 0, fmt.Errorf("projection %s: record layout: %w", name, err)
	}
	s, err := v.client.HGet(ctx, k, name+registryLayout).Result()
	if err != nil {
		return 0, fmt.Errorf("projection %s: read layout: %w", name, err)
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 {
		return 0, fmt.Errorf("projection %s: registry field %s%s holds %q, not a positive integer", name, name, registryLayout, s)
	}
	return n, nil
}

// SetRebuildStatus stores the last rebuild's progress (JSON) for status output.
func (v *ProjectionVersions) SetRebuildStatus(ctx context.Context, name, status string) error {
	return v.client.HSet(ctx, v.keys.Projections(), name+registryRebuild, status).Err()
}
