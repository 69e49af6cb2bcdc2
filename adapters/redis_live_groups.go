package adapters

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/checkins/checkins/app/ops"
	"github.com/checkins/checkins/domain"
)

// Processing groups ("live groups"): the projection versions a projector runs together consume
// the stream through one consumer group, so each entry is read, decoded and acknowledged once
// for all of them. A version joins its live group at a stream position J: entries after J reach
// it through the live group; entries up to J through its own group, <name>.v<N>, which starts at
// the beginning of the stream (a backfill, a rebuild) or where the service's earlier layout left
// it (an upgrade), and is removed once it has delivered and acknowledged everything up to J.
//
// The membership lives in the projections registry (KeySpace.Projections), field
// live:<group>, as JSON; the position every group has acknowledged through, in acked:<group>.

const (
	liveField  = "live:"
	ackedField = "acked:"
	seenField  = "seen:" // when a projector of the group last checkpointed (checkpointLua)
)

// LiveGroups reads and changes live-group membership and acknowledged positions (ops.LiveGroups).
//
// With stream partitions (KeySpace.WithPartitions) every partition has its own live groups,
// consumer groups and registry (Partitions.Registry, in the partition's slot): a version joins
// each partition at a position of that partition, and backfills each partition up to it. The
// methods without a stream sum the partitions up (ops.SumMembers, the least acknowledged
// position); those named ...On work on one partition.
type LiveGroups struct {
	client redis.UniversalClient
	keys   KeySpace
	parts  Partitions
}

// NewLiveGroups works on the registries of keys' partitions.
func NewLiveGroups(client redis.UniversalClient, keys KeySpace) *LiveGroups {
	return &LiveGroups{client: client, keys: keys, parts: keys.Partitions()}
}

// registryOf is the registry of partition stream.
func (l *LiveGroups) registryOf(stream string) (string, error) {
	i := l.parts.Index(stream)
	if i < 0 {
		return "", fmt.Errorf("%q is not a partition of the event stream %s", stream, l.keys.Stream())
	}
	return l.parts.Registry(i), nil
}

// Read is one live group's membership (empty when nobody joined yet).
func (l *LiveGroups) Read(ctx context.Context, group string) (ops.Membership, error) {
	raws, err := l.hgetEach(ctx, liveField+group)
	if err != nil {
		return ops.Membership{}, err
	}
	return l.sumMemberships(group, raws)
}

// hgetEachWithJoins is hgetEach, and each partition's joinsField, joined by commas.
func (l *LiveGroups) hgetEachWithJoins(ctx context.Context, field string) ([]string, string, error) {
	cmds := make([]*redis.SliceCmd, l.parts.Count())
	_, err := l.client.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i := range cmds {
			cmds[i] = p.HMGet(ctx, l.parts.Registry(i), field, joinsField)
		}
		return nil
	})
	if err != nil {
		return nil, "", err
	}
	out := make([]string, len(cmds))
	joins := make([]string, len(cmds))
	for i, c := range cmds {
		vs := c.Val()
		if len(vs) != 2 {
			return nil, "", fmt.Errorf("HMGET %s: unexpected reply %v", l.parts.Registry(i), vs)
		}
		out[i], _ = vs[0].(string)
		joins[i], _ = vs[1].(string)
	}
	return out, strings.Join(joins, ","), nil
}

// hgetEach reads field from every partition's registry ("" where it is missing).
func (l *LiveGroups) hgetEach(ctx context.Context, field string) ([]string, error) {
	if l.parts.Count() == 1 {
		raw, err := l.client.HGet(ctx, l.parts.Registry(0), field).Result()
		if errors.Is(err, redis.Nil) {
			return []string{""}, nil
		}
		return []string{raw}, err
	}
	cmds := make([]*redis.StringCmd, l.parts.Count())
	_, err := l.client.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i := range cmds {
			cmds[i] = p.HGet(ctx, l.parts.Registry(i), field)
		}
		return nil
	})
	if err != nil && !errors.Is(err, redis.Nil) {
		return nil, err
	}
	out := make([]string, len(cmds))
	for i, c := range cmds {
		v, err := c.Result()
		if err != nil && !errors.Is(err, redis.Nil) {
			return nil, err
		}
		out[i] = v
	}
	return out, nil
}

// sumMemberships parses each partition's membership value ("": none) and sums them up.
func (l *LiveGroups) sumMemberships(group string, raws []string) (ops.Membership, error) {
	if len(raws) == 1 {
		if raws[0] == "" {
			return ops.Membership{Members: map[string]ops.LiveMember{}}, nil
		}
		return ParseMembership(group, raws[0])
	}
	parts := map[string]map[string]ops.LiveMember{} // member -> stream -> membership
	for i, raw := range raws {
		if raw == "" {
			continue
		}
		m, err := ParseMembership(group, raw)
		if err != nil {
			return ops.Membership{}, fmt.Errorf("partition %d: %w", i, err)
		}
		for name, lm := range m.Members {
			if parts[name] == nil {
				parts[name] = map[string]ops.LiveMember{}
			}
			parts[name][l.parts.Stream(i)] = lm
		}
	}
	out := ops.Membership{Raw: strings.Join(raws, "\n"), Members: map[string]ops.LiveMember{}}
	for name, ps := range parts {
		m := ops.SumMembers(ps)
		if m.Missing = l.parts.Count() - len(ps); m.Missing > 0 {
			m.Own, m.DoneAt = ops.BackfillRunning, ""
		}
		out.Members[name] = m
	}
	return out, nil
}

// ParseMembership decodes a registry value.
func ParseMembership(group, raw string) (ops.Membership, error) {
	m := ops.Membership{Raw: raw, Members: map[string]ops.LiveMember{}}
	if err := json.Unmarshal([]byte(raw), &m.Members); err != nil {
		return ops.Membership{}, fmt.Errorf("live group %s: registry membership %q is not JSON: %w", group, raw, err)
	}
	return m, nil
}

// ReadAll is every live group's membership and every group's acknowledged position.
//
// With partitions, a group's acknowledged position is the least of its partitions' (everything
// up to it is acknowledged on every partition), and only a group recorded on every partition
// has one.
func (l *LiveGroups) ReadAll(ctx context.Context) (map[string]ops.Membership, map[string]string, error) {
	regs, err := l.registries(ctx)
	if err != nil {
		return nil, nil, err
	}
	return l.lives(regs)
}

// registries reads every partition's registry, in one pipeline: each as one view.
func (l *LiveGroups) registries(ctx context.Context) ([]map[string]string, error) {
	cmds := make([]*redis.MapStringStringCmd, l.parts.Count())
	if _, err := l.client.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i := range cmds {
			cmds[i] = p.HGetAll(ctx, l.parts.Registry(i))
		}
		return nil
	}); err != nil {
		return nil, err
	}
	regs := make([]map[string]string, len(cmds))
	for i, c := range cmds {
		regs[i] = c.Val()
	}
	return regs, nil
}

// lives is ReadAll of the registries read.
func (l *LiveGroups) lives(regs []map[string]string) (map[string]ops.Membership, map[string]string, error) {
	n := len(regs)
	raws := map[string][]string{}
	ackedBy := map[string][]string{}
	for i, reg := range regs {
		for f, v := range reg {
			if g, ok := strings.CutPrefix(f, liveField); ok {
				if raws[g] == nil {
					raws[g] = make([]string, n)
				}
				raws[g][i] = v
			} else if g, ok := strings.CutPrefix(f, ackedField); ok {
				ackedBy[g] = append(ackedBy[g], v)
			}
		}
	}
	groups, acked := map[string]ops.Membership{}, map[string]string{}
	for g, rs := range raws {
		m, err := l.sumMemberships(g, rs)
		if err != nil {
			return nil, nil, err
		}
		if n == 1 {
			m.Raw = rs[0]
		}
		groups[g] = m
	}
	for g, as := range ackedBy {
		if len(as) < n {
			continue
		}
		least := as[0]
		for _, a := range as[1:] {
			if ops.CompareEntryIDs(a, least) < 0 {
				least = a
			}
		}
		acked[g] = least
	}
	return groups, acked, nil
}

// ReadLivesAndMoved is ReadAll's memberships and ReadMoved's records from one read of each
// registry: a moved version's join (which removes its record and adds its membership in one
// step) is in one of the two, never in neither.
func (l *LiveGroups) ReadLivesAndMoved(ctx context.Context) (map[string]ops.Membership, map[string]map[string]ops.Moved, error) {
	regs, err := l.registries(ctx)
	if err != nil {
		return nil, nil, err
	}
	lives, _, err := l.lives(regs)
	if err != nil {
		return nil, nil, err
	}
	moved, err := l.moved(regs)
	return lives, moved, err
}

// joinLua: KEYS[1] registry, KEYS[2] stream; ARGV[1] live group, ARGV[2] member (= its own
// group's name), ARGV[3] now (ms). Joins once; later calls return the membership.
//
// A member with nothing behind it (its own group missing or never read from) joining a live
// group that has not delivered anything yet (a first start, every projection at once) joins at
// the start: the live group alone feeds it the whole stream. Otherwise it joins at the stream's
// last entry J, creating the live group there if it is new, and its own group backfills the
// entries up to J: from the start (created here, unless a rebuild created it), or from where the
// service's earlier layout left it (an upgrade, whose entries up to that point are also looked
// up in that layout's dedupe sets), or where the live group it was disbanded from had delivered
// through (a moved:<member> record, which the join removes). It refuses (DROPPING) a member whose
// drop was begun and not finished (DROPPING), and a live group whose disband has not finished
// removing its markers (DISBANDING).
var joinLua = redis.NewScript(`
local field = 'live:' .. ARGV[1]
local raw = redis.call('HGET', KEYS[1], field)
local m = {}
if raw then m = cjson.decode(raw) end
-- A group of that name was disbanded and its markers are still being removed: joined now, its
-- markers would go with them.
if redis.call('HEXISTS', KEYS[1], 'disbanding:' .. ARGV[1]) == 1 then return redis.error_reply('DISBANDING') end
if m[ARGV[2]] then return raw end
-- A partition migration runs: it translates the memberships as they were once its projectors
-- stood still.
local migrating = redis.call('HGET', KEYS[1], '` + migratingField + `')
if migrating then return redis.error_reply('MIGRATING ' .. migrating) end
-- A version being dropped (checkins projections drop, cut short): its read model is half
-- removed, and a first start now would build on what is left.
if redis.call('HEXISTS', KEYS[1], 'dropping:' .. ARGV[2]) == 1 then return redis.error_reply('DROPPING') end
for _, f in ipairs(redis.call('HKEYS', KEYS[1])) do
  if f ~= field and string.sub(f, 1, 5) == 'live:' then
    local other = redis.call('HGET', KEYS[1], f)
    if other and other ~= '{}' and cjson.decode(other)[ARGV[2]] then
      return redis.error_reply('LIVEGROUPCONFLICT ' .. string.sub(f, 6))
    end
  end
end
local live, own = nil, nil
if redis.call('EXISTS', KEYS[2]) == 1 then
  for _, g in ipairs(redis.call('XINFO', 'GROUPS', KEYS[2])) do
    local name, ld
    for x = 1, #g, 2 do
      if g[x] == 'name' then name = g[x+1] elseif g[x] == 'last-delivered-id' then ld = g[x+1] end
    end
    if ld == '0' then ld = '0-0' end -- miniredis (the embedded quick start) says '0'
    if name == ARGV[1] then live = ld elseif name == ARGV[2] then own = ld end
  end
end
-- A version a disband took out of another live group: its own group stands where that group
-- had delivered through, and backfills from there (no earlier layout's sets to look in).
local moved = redis.call('HGET', KEYS[1], 'moved:' .. ARGV[2])
if moved and own == nil then
  -- Its own group was lost since the disband: it stands where the disband put it, not at the
  -- start (a first start would be fed the whole history again).
  local mv = cjson.decode(moved)
  redis.call('XGROUP', 'CREATE', KEYS[2], ARGV[2], mv.pos, 'MKSTREAM')
  own = mv.pos
end
local rec
if (live == nil or live == '0-0') and (own == nil or own == '0-0') then
  rec = {join = '0-0', own = 'done', doneAt = ARGV[3]}
  if live == nil then redis.call('XGROUP', 'CREATE', KEYS[2], ARGV[1], '0', 'MKSTREAM') end
else
  local last = redis.call('XREVRANGE', KEYS[2], '+', '-', 'COUNT', 1)
  local j = '0-0'
  if #last > 0 then j = last[1][1] end
  rec = {join = j, own = 'running'}
  -- How many entries the stream had ever taken at the join (Redis 7): the backfill's own group
  -- has read all it has to once its entries-read reaches it (what the status says is to go).
  local info = redis.pcall('XINFO', 'STREAM', KEYS[2])
  if type(info) == 'table' and not info.err then
    for x = 1, #info, 2 do
      if info[x] == 'entries-added' and type(info[x+1]) == 'number' then rec.added = string.format('%d', info[x+1]) end
    end
  end
  if live == nil then redis.call('XGROUP', 'CREATE', KEYS[2], ARGV[1], j, 'MKSTREAM') end
  if own == nil then
    redis.call('XGROUP', 'CREATE', KEYS[2], ARGV[2], '0')
  elseif own ~= '0-0' and not moved then
    rec.legacy = own
  end
end
if moved then
  local mv = cjson.decode(moved)
  if type(mv.legacy) == 'string' and mv.legacy ~= '' then rec.legacy = mv.legacy end
  redis.call('HDEL', KEYS[1], 'moved:' .. ARGV[2])
end
m[ARGV[2]] = rec
local enc = cjson.encode(m)
redis.call('HSET', KEYS[1], field, enc)
redis.call('HINCRBY', KEYS[1], '` + joinsField + `', 1)
return enc
`)

// joinsField counts, in each partition's registry, the joins into any of its live groups: read
// with a group's own membership on every batch, it tells a projector of another group that a
// version joined (its backfill registers identities its registry floors do not yet account for).
const joinsField = "live_joins"

// notRetired fails with ops.ErrVersionRetired when member is a version below the one its
// projection serves: a rebuild retired it (or is retiring it), and joined again it would be fed
// for good, its keys rebuilt from the start of the stream by an own group that holds back
// retention and the dedupe floors, with nothing left to retire it (a projector that read its
// targets before the switch and joined them after the retire did that; found by a review). The
// check and the join are two steps; a retire comes PROJECTION_RETIRE_GRACE after the switch,
// far longer than the step between them.
func (l *LiveGroups) notRetired(ctx context.Context, member string) error {
	name, version, ok := ops.ParseMemberName(member)
	if !ok {
		return nil
	}
	v, err := l.client.HGet(ctx, l.keys.Projections(), name+".version").Result()
	if errors.Is(err, redis.Nil) {
		return nil // never rebuilt: version 1 serves
	}
	if err != nil {
		return err
	}
	if serving, err := strconv.Atoi(v); err == nil && version < serving {
		return fmt.Errorf("%w: %s (reads come from v%d)", ops.ErrVersionRetired, member, serving)
	}
	return nil
}

// Join makes member (MemberName) part of live group, once: later calls return the membership.
// With partitions it joins on each partition in turn, at that partition's position: until it
// has joined a partition, the live group's entries there are not for it (they are at or below
// the position it joins at, so its backfill delivers them).
func (l *LiveGroups) Join(ctx context.Context, group, member string) (ops.Membership, error) {
	if err := l.notRetired(ctx, member); err != nil {
		return ops.Membership{}, err
	}
	now := strconv.FormatInt(time.Now().UnixMilli(), 10)
	raws := make([]string, l.parts.Count())
	for i := range raws {
		raw, err := joinLua.Run(ctx, l.client, []string{l.parts.Registry(i), l.parts.Stream(i)}, group, member, now).Text()
		if err != nil && redis.HasErrorPrefix(err, "LIVEGROUPCONFLICT") {
			_, other, _ := strings.Cut(err.Error(), "LIVEGROUPCONFLICT ")
			return ops.Membership{}, &ops.InAnotherLiveGroupError{Group: other}
		}
		if err != nil && redis.HasErrorPrefix(err, "DISBANDING") {
			return ops.Membership{}, fmt.Errorf("%w: live group %s was disbanded and its applied markers are still being removed: wait for `checkins projections disband %s` to finish, or run it again if it was cut short",
				ops.ErrDisbandUnfinished, group, group)
		}
		if err != nil && redis.HasErrorPrefix(err, "MIGRATING") {
			_, why, _ := strings.Cut(err.Error(), "MIGRATING ")
			return ops.Membership{}, fmt.Errorf("%w (%s): %s joins live group %s once it is done; if it stopped, `checkins partitions migrate --to N` resumes it",
				domain.ErrMigrating, why, member, group)
		}
		if err != nil && redis.HasErrorPrefix(err, "DROPPING") {
			return ops.Membership{}, fmt.Errorf("%w: %s is being dropped (checkins projections drop was cut short): run `checkins projections drop %s` again to finish, then this process runs it from the start of the stream",
				ops.ErrDropUnfinished, member, member)
		}
		if err != nil {
			if l.parts.Count() > 1 {
				return ops.Membership{}, fmt.Errorf("join %s to live group %s on partition %d: %w", member, group, i, err)
			}
			return ops.Membership{}, fmt.Errorf("join %s to live group %s: %w", member, group, err)
		}
		raws[i] = raw
	}
	return l.sumMemberships(group, raws)
}

var updateMemberLua = redis.NewScript(`
local field = 'live:' .. ARGV[1]
local raw = redis.call('HGET', KEYS[1], field)
if not raw then return 0 end
local m = cjson.decode(raw)
local rec = m[ARGV[2]]
if not rec then return 0 end
if ARGV[3] == 'leave' then
  m[ARGV[2]] = nil
elseif ARGV[3] == 'done' then
  if rec.own == 'done' then return 0 end
  rec.own, rec.doneAt = 'done', ARGV[4]
end
if next(m) == nil then redis.call('HSET', KEYS[1], field, '{}') else redis.call('HSET', KEYS[1], field, cjson.encode(m)) end
return 1
`)

// FinishBackfill records that member's own group has delivered and acknowledged everything up
// to its join position. It reports whether this call changed it.
// With partitions: on every partition (the caller found each one's backfill finished).
func (l *LiveGroups) FinishBackfill(ctx context.Context, group, member string, at time.Time) (bool, error) {
	changed := false
	for _, stream := range l.parts.Streams() {
		c, err := l.FinishBackfillOn(ctx, stream, group, member, at)
		if err != nil {
			return changed, err
		}
		changed = changed || c
	}
	return changed, nil
}

// FinishBackfillOn is FinishBackfill on one partition.
func (l *LiveGroups) FinishBackfillOn(ctx context.Context, stream, group, member string, at time.Time) (bool, error) {
	reg, err := l.registryOf(stream)
	if err != nil {
		return false, err
	}
	n, err := updateMemberLua.Run(ctx, l.client, []string{reg}, group, member, "done",
		strconv.FormatInt(at.UnixMilli(), 10)).Int()
	return n == 1, err
}

// Leave removes member from group (a retired version), on every partition.
func (l *LiveGroups) Leave(ctx context.Context, group, member string) error {
	for i := range l.parts.Count() {
		if err := updateMemberLua.Run(ctx, l.client, []string{l.parts.Registry(i)}, group, member, "leave", "").Err(); err != nil {
			return err
		}
	}
	return nil
}

// checkpointLua: KEYS[1] registry; ARGV[1] acked:<group>, ARGV[2] the position, ARGV[3]
// seen:<group>. Records the position unless it would move back, and in any case when (Redis's
// clock, ms) a projector of the group last checkpointed: what tells a disband that one still runs
// it (XINFO CONSUMERS's idle time, before Redis 7.2, does not move for reads that return nothing).
var checkpointLua = redis.NewScript(`
local t = redis.call('TIME')
redis.call('HSET', KEYS[1], ARGV[3], string.format('%d', tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)))
local function parse(id)
  local ms, seq = string.match(id, '^(%d+)-(%d+)$')
  return tonumber(ms), tonumber(seq)
end
local cur = redis.call('HGET', KEYS[1], ARGV[1])
if cur then
  local cm, cs = parse(cur)
  local nm, ns = parse(ARGV[2])
  if cm and (nm < cm or (nm == cm and ns <= cs)) then return 0 end
end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
return 1
`)

// Checkpoint records that group has acknowledged every entry up to acked (never moving back):
// markers of the group below it are no longer needed, and a group lost with its data is
// recreated there.
// stream is the partition (keys.Stream() with one).
func (l *LiveGroups) Checkpoint(ctx context.Context, stream, group, acked string) error {
	return l.Checkpoints(ctx, group, map[string]string{stream: acked})
}

// Checkpoints is Checkpoint on several partitions (stream -> acked) in one round trip: the
// projector records every partition's position every CheckpointInterval, and a round trip per
// partition made that checkpoint, and the dedupe floors read after it, lag by seconds during a
// drain of 24 partitions.
func (l *LiveGroups) Checkpoints(ctx context.Context, group string, acked map[string]string) error {
	type call struct {
		reg, acked string
		cmd        *redis.Cmd
	}
	calls := make([]call, 0, len(acked))
	for stream, a := range acked {
		if _, ok := ScoreOfEntry(a); !ok || !strings.Contains(a, "-") {
			return fmt.Errorf("checkpoint of %s: %q is not a stream entry ID", group, a)
		}
		reg, err := l.registryOf(stream)
		if err != nil {
			return err
		}
		calls = append(calls, call{reg: reg, acked: a})
	}
	if len(calls) == 0 {
		return nil
	}
	pipe := l.client.Pipeline()
	for i, c := range calls {
		calls[i].cmd = checkpointLua.EvalSha(ctx, pipe, []string{c.reg}, ackedField+group, c.acked, seenField+group)
	}
	_, _ = pipe.Exec(ctx) // each call's own error is looked at below
	var retry redis.Pipeliner
	for i, c := range calls {
		if redis.HasErrorPrefix(c.cmd.Err(), "NOSCRIPT") { // a restart or SCRIPT FLUSH: EVAL loads it
			if retry == nil {
				retry = l.client.Pipeline()
			}
			calls[i].cmd = checkpointLua.Eval(ctx, retry, []string{c.reg}, ackedField+group, c.acked, seenField+group)
		}
	}
	if retry != nil {
		_, _ = retry.Exec(ctx)
	}
	for _, c := range calls {
		if err := c.cmd.Err(); err != nil {
			return fmt.Errorf("checkpoint of %s in %s: %w", group, c.reg, err)
		}
	}
	return nil
}

// Acked is the position group has acknowledged through on partition stream ("" when never
// recorded).
func (l *LiveGroups) Acked(ctx context.Context, stream, group string) (string, error) {
	reg, err := l.registryOf(stream)
	if err != nil {
		return "", err
	}
	s, err := l.client.HGet(ctx, reg, ackedField+group).Result()
	if errors.Is(err, redis.Nil) {
		return "", nil
	}
	return s, err
}

// ForgetAcked drops a removed group's acknowledged position, on every partition.
func (l *LiveGroups) ForgetAcked(ctx context.Context, group string) error {
	for i := range l.parts.Count() {
		if err := l.client.HDel(ctx, l.parts.Registry(i), ackedField+group, seenField+group).Err(); err != nil {
			return err
		}
	}
	return nil
}

// ReadPartitionsProgress reads every consumer group of every partition of parts, summed up
// (ops.SumPositions) with more than one.
func ReadPartitionsProgress(ctx context.Context, client redis.UniversalClient, parts Partitions) (map[string]ops.GroupPosition, error) {
	each, err := readStreamsProgress(ctx, client, parts.Streams())
	if err != nil {
		return nil, err
	}
	if parts.Count() == 1 {
		return each[0], nil
	}
	by := map[string]map[string]ops.GroupPosition{}
	for i, ps := range each {
		for g, p := range ps {
			if by[g] == nil {
				by[g] = map[string]ops.GroupPosition{}
			}
			by[g][parts.Stream(i)] = p
		}
	}
	out := make(map[string]ops.GroupPosition, len(by))
	for g, ps := range by {
		out[g] = ops.SumPositions(ps)
	}
	return out, nil
}

// ReadGroupsProgress reads every consumer group of stream (none when the stream is missing).
func ReadGroupsProgress(ctx context.Context, client redis.UniversalClient, stream string) (map[string]ops.GroupPosition, error) {
	each, err := readStreamsProgress(ctx, client, []string{stream})
	if err != nil {
		return nil, err
	}
	return each[0], nil
}

// readStreamsProgress reads every consumer group of each stream in two round trips whatever
// the number of streams (XINFO GROUPS of all, then XPENDING of the groups with entries pending):
// the projector's checkpoint reads them every CheckpointInterval, and the dedupe floors come
// from it. One round trip per partition and command took a checkpoint of 24 partitions 0.6 s
// of the 2 s it needed during a drain (each round trip waits behind the projection scripts), so
// the registries were pruned by floors a whole drain old.
func readStreamsProgress(ctx context.Context, client redis.UniversalClient, streams []string) ([]map[string]ops.GroupPosition, error) {
	infos := make([]*redis.XInfoGroupsCmd, len(streams))
	pipe := client.Pipeline()
	for i, stream := range streams {
		infos[i] = pipe.XInfoGroups(ctx, stream)
	}
	_, _ = pipe.Exec(ctx) // each command's own error is looked at below
	out := make([]map[string]ops.GroupPosition, len(streams))
	type pending struct {
		stream int
		group  string
		cmd    *redis.XPendingCmd
	}
	var pend []pending
	pipe = client.Pipeline()
	for i, stream := range streams {
		gs, err := infos[i].Result()
		if isNoSuchKey(err) {
			out[i] = map[string]ops.GroupPosition{}
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("XINFO GROUPS %s: %w", stream, err)
		}
		out[i] = make(map[string]ops.GroupPosition, len(gs))
		for _, g := range gs {
			last := fullEntryID(g.LastDeliveredID) // the embedded Redis says "0" for 0-0
			out[i][g.Name] = ops.GroupPosition{LastDeliveredID: last, Pending: g.Pending, AckedThrough: last}
			if g.Pending > 0 {
				pend = append(pend, pending{i, g.Name, pipe.XPending(ctx, stream, g.Name)})
			}
		}
	}
	if len(pend) == 0 {
		return out, nil
	}
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return nil, fmt.Errorf("XPENDING: %w", err)
	}
	for _, pe := range pend {
		p, err := pe.cmd.Result()
		if err != nil || p.Count == 0 {
			continue
		}
		gp := out[pe.stream][pe.group]
		gp.Pending = p.Count
		prev, ok := ops.PrevEntryID(p.Lower)
		if !ok {
			return nil, fmt.Errorf("group %s: pending entry ID %q is not ms-seq", pe.group, p.Lower)
		}
		gp.AckedThrough = prev
		out[pe.stream][pe.group] = gp
	}
	return out, nil
}

// DedupeFloor is the stream position below which no consumer group that feeds projections will
// decide an event again (ProjectionApplier.SetRegistryFloor): the least AckedThrough of every
// live group and of the own groups of members still backfilling. ok is false while one of them
// is missing from progress (being created).
//
// A group that has fallen more than idleLimit behind now and whose consumers have all been idle
// for longer than idleLimit (nobody has read from it for the whole dedupe window: abandoned, or
// every process of it down that long) does not hold the floor back, so a forgotten group cannot
// make the registry grow forever. Such a group, if it comes back, may count a copy that falls in
// the window of one it decided before it stopped.
//
// The own groups of versions a disband took out of their live group (moved, by stream, as
// LiveGroups.ReadMoved reads them) hold it too until they join another, for at most idleLimit
// after the disband: a version that was moved and then run by no projector is abandoned alike.
//
// With partitions (lives and progress summed up, their Parts set) it is the least of the
// partitions' floors (DedupeFloors), each from that partition's groups.
func DedupeFloor(ctx context.Context, client redis.UniversalClient, streams []string, lives map[string]ops.Membership,
	moved map[string]map[string]ops.Moved, progress map[string]ops.GroupPosition, idleLimit time.Duration, now time.Time) (string, bool, error) {
	floors, ok, err := DedupeFloors(ctx, client, streams, lives, moved, progress, idleLimit, now)
	if err != nil || !ok {
		return "", false, err
	}
	floor := floors[0]
	for _, f := range floors[1:] {
		if ops.CompareEntryIDs(f, floor) < 0 {
			floor = f
		}
	}
	return floor, true, nil
}

// DedupeFloors is each partition's floor (see DedupeFloor), in the order of streams; ok is
// false while one of them is unknown. The consumers of the groups that may be abandoned are
// looked at in one round trip, whatever the number of partitions: the projector computes the
// floors every CheckpointInterval, and a drain of history is exactly when every group looks
// abandoned by its position (far behind now).
func DedupeFloors(ctx context.Context, client redis.UniversalClient, streams []string, lives map[string]ops.Membership,
	moved map[string]map[string]ops.Moved, progress map[string]ops.GroupPosition, idleLimit time.Duration, now time.Time) ([]string, bool, error) {
	type candidate struct {
		stream, group, acked string
		idle                 *redis.XInfoConsumersCmd // nil: not behind by the window, it counts
	}
	each := make([][]candidate, len(streams))
	stale := now.Add(-idleLimit).UnixMilli()
	var pipe redis.Pipeliner
	for i, stream := range streams {
		for _, g := range floorGroupsOn(stream, lives) {
			sum, ok := progress[g]
			if !ok {
				return nil, false, nil
			}
			p, ok := sum.On(stream)
			if !ok {
				return nil, false, nil
			}
			c := candidate{stream: stream, group: g, acked: p.AckedThrough}
			if ms, ok := ScoreOfEntry(p.AckedThrough); ok && ms/scorePerMs < stale {
				if pipe == nil {
					pipe = client.Pipeline()
				}
				c.idle = pipe.XInfoConsumers(ctx, stream, g)
			}
			each[i] = append(each[i], c)
		}
		for member, mv := range moved[stream] {
			at, err := strconv.ParseInt(mv.At, 10, 64)
			if err != nil || at < stale {
				continue // moved longer ago than the window and still not run: abandoned
			}
			// Not among the positions: read before a disband that made it (or destroyed by
			// hand): no floor until it is known, as for any group being created.
			sum, ok := progress[member]
			if !ok {
				return nil, false, nil
			}
			p, ok := sum.On(stream)
			if !ok {
				return nil, false, nil
			}
			each[i] = append(each[i], candidate{stream: stream, group: member, acked: p.AckedThrough})
		}
	}
	if pipe != nil {
		_, _ = pipe.Exec(ctx) // each command's own error is looked at below
	}
	floors := make([]string, len(streams))
	for i, cs := range each {
		floor := ""
		for _, c := range cs {
			if c.idle != nil {
				idle, err := consumersIdle(c.idle)
				if err != nil {
					return nil, false, fmt.Errorf("XINFO CONSUMERS %s %s: %w", c.stream, c.group, err)
				}
				if idle > idleLimit {
					continue
				}
			}
			if floor == "" || ops.CompareEntryIDs(c.acked, floor) < 0 {
				floor = c.acked
			}
		}
		if floor == "" {
			return nil, false, nil
		}
		floors[i] = floor
	}
	return floors, len(floors) > 0, nil
}

// floorGroupsOn are the groups that decide events of partition stream: every live group, and
// the own groups of members still backfilling there.
func floorGroupsOn(stream string, lives map[string]ops.Membership) []string {
	var groups []string
	for live, ms := range lives {
		groups = append(groups, live)
		for name, m := range ms.Members {
			if pm, ok := m.On(stream); ok && pm.Own == ops.BackfillRunning {
				groups = append(groups, name)
			}
		}
	}
	return groups
}

// consumersIdle is how long the most recently active consumer of a group has been idle (0 when
// the group has no consumers yet: a group just created is about to be read).
func consumersIdle(c *redis.XInfoConsumersCmd) (time.Duration, error) {
	cs, err := c.Result()
	if err != nil {
		return 0, err
	}
	if len(cs) == 0 {
		return 0, nil
	}
	idle := cs[0].Idle
	for _, c := range cs[1:] {
		idle = min(idle, c.Idle)
	}
	return idle, nil
}

var _ ops.LiveGroups = (*LiveGroups)(nil)
