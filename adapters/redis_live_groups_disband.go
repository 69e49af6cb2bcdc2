package adapters

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/checkins/checkins/app/ops"
)

// movedField records, in a partition's registry, a projection version a disband took out of its
// live group (ops.Moved, as JSON) until a projector joins it to another: its own group then
// feeds it from the position recorded, and the join removes the field.
const movedField = "moved:"

// disbandLua: KEYS[1] registry, KEYS[2] stream; ARGV[1] live group, ARGV[2] now (ms),
// ARGV[3] the least idle time (ms) every consumer of the group must have, ARGV[4] '1' to do it
// ('0': only check). Replies {state, position, members...}: state 'gone' (no such live group on
// this partition), 'checked' or 'done'.
//
// Each member gets an own group at the position P the live group has delivered through (with
// the live group's entries-read, so that Redis tells its lag), or at its join where that is
// later, a checkpoint there, and a moved:<member> record;
// then the live group, its membership and its checkpoint go. It refuses, changing nothing, while
// a member still backfills (its own group has entries up to its join to deliver, and the live
// group has delivered past it), while entries are pending (P would skip them, and redelivering
// them to another group would count those already applied again), and while a consumer has read
// within ARGV[3] or a projector of the group checkpointed within it (one still runs the group: it
// would recreate it), and while a member's finished backfill's own group is still there.
var disbandLua = redis.NewScript(`
local field = 'live:' .. ARGV[1]
local raw = redis.call('HGET', KEYS[1], field)
if not raw then
  -- Disbanded already, and what it left (its markers) not yet all removed: the command was cut
  -- short; run again, it finishes.
  if redis.call('HEXISTS', KEYS[1], 'disbanding:' .. ARGV[1]) == 1 then return {'unfinished', ''} end
  return {'gone', ''}
end
local m = cjson.decode(raw)
local names = {}
for name, rec in pairs(m) do
  if rec.own ~= 'done' then return redis.error_reply('BACKFILLING ' .. name) end
  -- Its finished backfill's group is gone, what it left is being removed (all of its markers:
  -- a group of that name made now would lose its own).
  if rec.removing then return redis.error_reply('LEFTOVER ' .. name) end
  names[#names + 1] = name
end
table.sort(names)
-- A projector of the group checkpoints every 250 ms (checkpointLua): the one sign of a running
-- one that every Redis version gives (XINFO CONSUMERS's idle time, before 7.2, does not move
-- for reads that return nothing).
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local seen = tonumber(redis.call('HGET', KEYS[1], 'seen:' .. ARGV[1]) or '')
if seen and now - seen < tonumber(ARGV[3]) then
  return redis.error_reply('CHECKPOINTED ' .. string.format('%d', now - seen))
end
local pos, entriesRead, found, held = '0-0', nil, false, 0
if redis.call('EXISTS', KEYS[2]) == 1 then
  for _, g in ipairs(redis.call('XINFO', 'GROUPS', KEYS[2])) do
    local name, ld, pending, er
    for x = 1, #g, 2 do
      if g[x] == 'name' then name = g[x+1] elseif g[x] == 'last-delivered-id' then ld = g[x+1]
      elseif g[x] == 'pending' then pending = g[x+1] elseif g[x] == 'entries-read' then er = g[x+1] end
    end
    if name == ARGV[1] then
      found = true
      if ld == '0' then ld = '0-0' end
      pos, held = ld, tonumber(pending)
      if type(er) == 'number' then entriesRead = er end
    elseif m[name] then
      -- A finished backfill's group, removed PROJECTION_RETIRE_GRACE after it finished by a
      -- running projector, with its markers: replacing it here could race that removal.
      return redis.error_reply('LEFTOVER ' .. name)
    end
  end
  if not found then return redis.error_reply('NOGROUP') end
  for _, c in ipairs(redis.call('XINFO', 'CONSUMERS', KEYS[2], ARGV[1])) do
    local cname, idle
    for x = 1, #c, 2 do
      if c[x] == 'name' then cname = c[x+1] elseif c[x] == 'idle' then idle = c[x+1] end
    end
    if tonumber(idle) < tonumber(ARGV[3]) then
      return redis.error_reply('ACTIVE ' .. cname .. ' ' .. idle)
    end
  end
  if held > 0 then return redis.error_reply('PENDING ' .. held) end
end
local reply = {'checked', pos}
for _, name in ipairs(names) do reply[#reply + 1] = name end
if ARGV[4] ~= '1' then return reply end
local function after(a, b)
  local am, as = string.match(a, '^(%d+)-(%d+)$')
  local bm, bs = string.match(b, '^(%d+)-(%d+)$')
  am, as, bm, bs = tonumber(am), tonumber(as), tonumber(bm), tonumber(bs)
  return am > bm or (am == bm and as > bs)
end
for _, name in ipairs(names) do
  local rec = m[name]
  -- Where its own group starts: what the live group delivered, or its join where that is later
  -- (a live group behind a join: the version's backfill delivered up to the join already).
  local start, args = pos, {'XGROUP', 'CREATE', KEYS[2], name, pos, 'MKSTREAM'}
  if rec.join and after(rec.join, start) then
    start = rec.join
    args[5] = start
  elseif entriesRead then
    -- How many entries it has read, as the live group had: Redis can then tell how many its
    -- backfill has to go (XINFO GROUPS lag) before it reaches the stream's end.
    args[#args + 1] = 'ENTRIESREAD'
    args[#args + 1] = string.format('%d', entriesRead)
  end
  redis.call(unpack(args))
  -- Where a group lost before its first checkpoint is made again (not at the start).
  redis.call('HSET', KEYS[1], 'acked:' .. name, start)
  -- An upgrade's earlier layout (legacy) goes along: its sets are removed after the next backfill.
  redis.call('HSET', KEYS[1], 'moved:' .. name, cjson.encode({from = ARGV[1], at = ARGV[2], pos = start, legacy = rec.legacy}))
end
if found then redis.call('XGROUP', 'DESTROY', KEYS[2], ARGV[1]) end
redis.call('HDEL', KEYS[1], field, 'acked:' .. ARGV[1], 'seen:' .. ARGV[1])
-- Until its markers are gone (EndDisband), no projector joins a group of that name: a projector
-- of the old set started meanwhile would write markers the removal then takes.
redis.call('HSET', KEYS[1], 'disbanding:' .. ARGV[1], ARGV[2])
reply[1] = 'done'
return reply
`)

// Disband takes every member of live group out of it, on every partition (ops.LiveGroups).
// It checks every partition first and changes nothing when one refuses; a partition where the
// group is already gone (a disband cut short, run again) is skipped.
func (l *LiveGroups) Disband(ctx context.Context, group string, minIdle time.Duration, apply bool) (ops.DisbandReport, error) {
	rep := ops.DisbandReport{Group: group, Positions: map[string]string{}}
	now := strconv.FormatInt(time.Now().UnixMilli(), 10)
	idle := strconv.FormatInt(minIdle.Milliseconds(), 10)
	pass := func(doIt bool) (int, error) {
		found := 0
		flag := "0"
		if doIt {
			flag = "1"
		}
		for i := range l.parts.Count() {
			stream := l.parts.Stream(i)
			res, err := disbandLua.Run(ctx, l.client, []string{l.parts.Registry(i), stream}, group, now, idle, flag).StringSlice()
			if err != nil {
				return found, disbandError(group, stream, l.parts.Count() > 1, err)
			}
			if len(res) < 2 {
				return found, fmt.Errorf("disband %s on %s: unexpected reply %v", group, stream, res)
			}
			if res[0] == "unfinished" {
				rep.Unfinished = true
				continue
			}
			if res[0] == "gone" {
				continue
			}
			found++
			rep.Positions[stream] = res[1]
			for _, m := range res[2:] {
				if !slices.Contains(rep.Members, m) {
					rep.Members = append(rep.Members, m)
				}
			}
		}
		return found, nil
	}
	found, err := pass(false)
	if err == nil && found == 0 {
		// Gone everywhere: disbanded already (run again), while its versions have not all
		// joined another group, or no such group.
		return l.disbanded(ctx, rep)
	}
	if err != nil || !apply {
		slices.Sort(rep.Members)
		return rep, err
	}
	if _, err := pass(true); err != nil {
		slices.Sort(rep.Members)
		return rep, err
	}
	slices.Sort(rep.Members)
	rep.Done = true
	return rep, nil
}

// EndDisband removes group's disbanding marks on every partition (ops.LiveGroups), the last
// first (clearFields).
func (l *LiveGroups) EndDisband(ctx context.Context, group string) error {
	return l.clearFields(ctx, "finish disbanding "+group, disbandingField+group)
}

// disbandingField marks, in a partition's registry, a live group a disband removed whose applied
// markers are not all removed yet (the time of the disband, ms): joins into a group of that name
// are refused meanwhile.
const disbandingField = "disbanding:"

// disbanded reports, for a live group found on no partition, the versions a disband took out of
// it that have not joined another group yet (Done; nothing when there are none).
func (l *LiveGroups) disbanded(ctx context.Context, rep ops.DisbandReport) (ops.DisbandReport, error) {
	moved, err := l.ReadMoved(ctx)
	if err != nil {
		return rep, err
	}
	for stream, ms := range moved {
		for name, mv := range ms {
			if mv.From != rep.Group {
				continue
			}
			if !slices.Contains(rep.Members, name) {
				rep.Members = append(rep.Members, name)
			}
			if p, ok := rep.Positions[stream]; !ok || ops.CompareEntryIDs(mv.Pos, p) < 0 {
				rep.Positions[stream] = mv.Pos
			}
		}
	}
	slices.Sort(rep.Members)
	rep.Done = len(rep.Members) > 0
	return rep, nil
}

// disbandError turns the script's refusals into ops.ErrDisbandRefused with what to do.
func disbandError(group, stream string, parts bool, err error) error {
	where := ""
	if parts {
		where = " on " + stream
	}
	msg := err.Error()
	switch {
	case redis.HasErrorPrefix(err, "BACKFILLING"):
		return fmt.Errorf("%w %q: %s is still backfilling%s through its own group: start one projector with the group's PROJECTIONS, wait until `checkins projections list` shows it caught up, stop it (SIGTERM), and run this again",
			ops.ErrDisbandRefused, group, strings.TrimSpace(strings.TrimPrefix(msg, "BACKFILLING")), where)
	case redis.HasErrorPrefix(err, "PENDING"):
		return fmt.Errorf("%w %q: %s entries are pending%s (a projector of it stopped without finishing them): start one projector with its PROJECTIONS, wait CLAIM_IDLE for it to take them over, stop it (SIGTERM), and run this again",
			ops.ErrDisbandRefused, group, strings.TrimSpace(strings.TrimPrefix(msg, "PENDING")), where)
	case redis.HasErrorPrefix(err, "ACTIVE"):
		f := strings.Fields(strings.TrimPrefix(msg, "ACTIVE"))
		who, ago := "a consumer", ""
		if len(f) == 2 {
			who = "consumer " + f[0]
			if ms, perr := strconv.ParseInt(f[1], 10, 64); perr == nil {
				ago = " " + (time.Duration(ms) * time.Millisecond).String() + " ago"
			}
		}
		return fmt.Errorf("%w %q: %s read from it%s%s: stop every projector that runs it (they would recreate it) and run this again once CLAIM_IDLE has passed",
			ops.ErrDisbandRefused, group, who, ago, where)
	case redis.HasErrorPrefix(err, "CHECKPOINTED"):
		ago := ""
		if ms, perr := strconv.ParseInt(strings.TrimSpace(strings.TrimPrefix(msg, "CHECKPOINTED")), 10, 64); perr == nil {
			ago = " " + (time.Duration(ms) * time.Millisecond).String() + " ago"
		}
		return fmt.Errorf("%w %q: a projector of it recorded its progress%s%s: stop every projector that runs it (they would recreate it) and run this again once CLAIM_IDLE has passed",
			ops.ErrDisbandRefused, group, ago, where)
	case redis.HasErrorPrefix(err, "LEFTOVER"):
		return fmt.Errorf("%w %q: the own group of %s, through which it backfilled, is still there or being removed%s (a running projector removes it PROJECTION_RETIRE_GRACE after the backfill finished): start one projector with the group's PROJECTIONS, wait that long, stop it (SIGTERM), and run this again",
			ops.ErrDisbandRefused, group, strings.TrimSpace(strings.TrimPrefix(msg, "LEFTOVER")), where)
	case redis.HasErrorPrefix(err, "NOGROUP"):
		return fmt.Errorf("%w %q: its consumer group is missing from the stream%s (Redis lost it): start one projector with its PROJECTIONS to recreate it, stop it, and run this again",
			ops.ErrDisbandRefused, group, where)
	}
	return fmt.Errorf("disband live group %s%s: %w", group, where, err)
}

// destroyFinishedLua: KEYS[1] registry, KEYS[2] stream; ARGV[1] live group, ARGV[2] member,
// ARGV[3] this run's token, ARGV[4] how long (ms) another run's mark holds. If the member is in
// the live group with its backfill done, and no other run has held its removal for less than
// ARGV[4]: marks it removing by this run ("<token> <now ms>"), drops its checkpoint and destroys
// its own group; returns 1 (0 otherwise: a disband took it out since it was read, or another run
// removes it).
var destroyFinishedLua = redis.NewScript(`
local field = 'live:' .. ARGV[1]
local raw = redis.call('HGET', KEYS[1], field)
if not raw then return 0 end
local m = cjson.decode(raw)
local rec = m[ARGV[2]]
if not rec or rec.own ~= 'done' then return 0 end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if type(rec.removing) == 'string' then
  local token, since = string.match(rec.removing, '^(%S+) (%d+)$')
  if token and token ~= ARGV[3] and now - tonumber(since) < tonumber(ARGV[4]) then return 0 end
end -- any other mark (true, written by a build of 2026-12-07) is held by none
rec.removing = ARGV[3] .. ' ' .. string.format('%d', now)
redis.call('HSET', KEYS[1], field, cjson.encode(m))
redis.call('HDEL', KEYS[1], 'acked:' .. ARGV[2], 'seen:' .. ARGV[2])
if redis.call('EXISTS', KEYS[2]) == 1 then
  for _, g in ipairs(redis.call('XINFO', 'GROUPS', KEYS[2])) do
    for x = 1, #g, 2 do
      if g[x] == 'name' and g[x+1] == ARGV[2] then redis.call('XGROUP', 'DESTROY', KEYS[2], ARGV[2]) end
    end
  end
end
return 1
`)

// endRemovalLua: KEYS[1] registry; ARGV[1] live group, ARGV[2] member, ARGV[3] token, ARGV[4]
// '1' done. If this token holds the member's removing mark: clears it (done), or keeps it held by
// no run (since 0), for the next run to take up at once.
var endRemovalLua = redis.NewScript(`
local field = 'live:' .. ARGV[1]
local raw = redis.call('HGET', KEYS[1], field)
if not raw then return 0 end
local m = cjson.decode(raw)
local rec = m[ARGV[2]]
if not rec or type(rec.removing) ~= 'string' or string.match(rec.removing, '^(%S+)') ~= ARGV[3] then return 0 end
if ARGV[4] == '1' then rec.removing = nil else rec.removing = ARGV[3] .. ' 0' end
redis.call('HSET', KEYS[1], field, cjson.encode(m))
return 1
`)

// renewRemovalLua: KEYS[1] registry; ARGV[1] live group, ARGV[2] member, ARGV[3] token. Stamps
// the member's removing mark with the time now if this token holds it: 1; 0 if another run
// holds it (taken over) or it is gone; -1 if the member is not in the live group's finished
// backfills here (nothing to hold on this partition).
var renewRemovalLua = redis.NewScript(`
local field = 'live:' .. ARGV[1]
local raw = redis.call('HGET', KEYS[1], field)
if not raw then return -1 end
local m = cjson.decode(raw)
local rec = m[ARGV[2]]
if not rec then return -1 end
if type(rec.removing) ~= 'string' or string.match(rec.removing, '^(%S+)') ~= ARGV[3] then return 0 end
local t = redis.call('TIME')
rec.removing = ARGV[3] .. ' ' .. string.format('%d', tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000))
redis.call('HSET', KEYS[1], field, cjson.encode(m))
return 1
`)

// RenewRemoval stamps token's marks on member's removal with the time now, on every partition
// where member is in live group (ops.LiveGroups); false when another run took one over, or it
// went.
func (l *LiveGroups) RenewRemoval(ctx context.Context, group, member, token string) (bool, error) {
	held := true
	for i := range l.parts.Count() {
		n, err := renewRemovalLua.Run(ctx, l.client, []string{l.parts.Registry(i)}, group, member, token).Int()
		if err != nil {
			return false, fmt.Errorf("renew the removal of the finished backfill's group %s on %s: %w", member, l.parts.Stream(i), err)
		}
		held = held && n != 0
	}
	return held, nil
}

// DestroyFinishedOwnGroup destroys member's own group, with its checkpoint, on every partition
// where member is still in live group with its backfill done and no other run holds its
// removal, and marks it removing by token there (ops.LiveGroups).
func (l *LiveGroups) DestroyFinishedOwnGroup(ctx context.Context, group, member, token string, hold time.Duration) (bool, error) {
	held := false
	for i := range l.parts.Count() {
		n, err := destroyFinishedLua.Run(ctx, l.client, []string{l.parts.Registry(i), l.parts.Stream(i)}, group, member, token,
			strconv.FormatInt(hold.Milliseconds(), 10)).Int()
		if err != nil {
			return held, fmt.Errorf("destroy the finished backfill's group %s on %s: %w", member, l.parts.Stream(i), err)
		}
		held = held || n == 1
	}
	return held, nil
}

// EndRemoval ends token's hold on member's removal in live group on every partition where it
// holds it (ops.LiveGroups).
func (l *LiveGroups) EndRemoval(ctx context.Context, group, member, token string, done bool) error {
	flag := "0"
	if done {
		flag = "1"
	}
	for i := range l.parts.Count() {
		if err := endRemovalLua.Run(ctx, l.client, []string{l.parts.Registry(i)}, group, member, token, flag).Err(); err != nil {
			return fmt.Errorf("finish removing the finished backfill's group %s on %s: %w", member, l.parts.Stream(i), err)
		}
	}
	return nil
}

// ReadMoved is, per partition's stream, the versions a disband took out of a live group that
// have not joined another yet (by member name).
func (l *LiveGroups) ReadMoved(ctx context.Context) (map[string]map[string]ops.Moved, error) {
	regs, err := l.registries(ctx)
	if err != nil {
		return nil, err
	}
	return l.moved(regs)
}

// moved is ReadMoved of the registries read.
func (l *LiveGroups) moved(regs []map[string]string) (map[string]map[string]ops.Moved, error) {
	out := map[string]map[string]ops.Moved{}
	for i, reg := range regs {
		for f, v := range reg {
			name, ok := strings.CutPrefix(f, movedField)
			if !ok {
				continue
			}
			var m ops.Moved
			if err := json.Unmarshal([]byte(v), &m); err != nil {
				return nil, fmt.Errorf("registry %s: %s is not JSON: %w", l.parts.Registry(i), f, err)
			}
			stream := l.parts.Stream(i)
			if out[stream] == nil {
				out[stream] = map[string]ops.Moved{}
			}
			out[stream][name] = m
		}
	}
	return out, nil
}
