package adapters

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/checkins/checkins/app/ops"
)

// droppingField marks, in a partition's registry, a moved version whose drop has begun
// (command.DropMovedVersion): its own group and moved record are gone, its read model is being
// removed. A join refuses it until the drop is finished, which removes the field.
const droppingField = "dropping:"

// dropMovedLua: KEYS[1] registry, KEYS[2] stream; ARGV[1] member, ARGV[2] the least idle time
// (ms) every consumer of its own group must have, ARGV[3] '1' to do it ('0': only check).
// Replies {state, position}: 'none' (not moved on this partition), 'dropping' (a drop begun
// before), 'moved' (checked) or 'dropped' (its own group destroyed, its moved record, checkpoint
// and progress time removed, and the dropping mark set, in one step).
//
// It refuses while the member is in a live group on this partition (JOINED: a projector joined
// it since the disband, so it is run again) and while its own group has a consumer that read
// within ARGV[2] or entries pending (ACTIVE, PENDING: a projector of an earlier build reads it).
var dropMovedLua = redis.NewScript(`
local member = ARGV[1]
for _, f in ipairs(redis.call('HKEYS', KEYS[1])) do
  if string.sub(f, 1, 5) == 'live:' then
    local raw = redis.call('HGET', KEYS[1], f)
    if raw and raw ~= '{}' and cjson.decode(raw)[member] then
      return redis.error_reply('JOINED ' .. string.sub(f, 6))
    end
  end
end
local moved = redis.call('HGET', KEYS[1], 'moved:' .. member)
if not moved then
  local dropping = redis.call('HGET', KEYS[1], 'dropping:' .. member)
  if dropping then return {'dropping', cjson.decode(dropping).pos or ''} end
  return {'none', ''}
end
local mv = cjson.decode(moved)
local found = false
if redis.call('EXISTS', KEYS[2]) == 1 then
  for _, g in ipairs(redis.call('XINFO', 'GROUPS', KEYS[2])) do
    local name, pending
    for x = 1, #g, 2 do
      if g[x] == 'name' then name = g[x+1] elseif g[x] == 'pending' then pending = g[x+1] end
    end
    if name == member then
      found = true
      for _, c in ipairs(redis.call('XINFO', 'CONSUMERS', KEYS[2], member)) do
        local cname, idle
        for x = 1, #c, 2 do
          if c[x] == 'name' then cname = c[x+1] elseif c[x] == 'idle' then idle = c[x+1] end
        end
        if tonumber(idle) < tonumber(ARGV[2]) then
          return redis.error_reply('ACTIVE ' .. cname .. ' ' .. idle)
        end
      end
      if tonumber(pending) > 0 then return redis.error_reply('PENDING ' .. pending) end
    end
  end
end
if ARGV[3] ~= '1' then return {'moved', mv.pos or ''} end
if found then redis.call('XGROUP', 'DESTROY', KEYS[2], member) end
redis.call('HSET', KEYS[1], 'dropping:' .. member, moved)
redis.call('HDEL', KEYS[1], 'moved:' .. member, 'acked:' .. member, 'seen:' .. member)
return {'dropped', mv.pos or ''}
`)

// DropMoved drops member, a version a disband took out of its live group, on every partition
// (ops.LiveGroups): it checks every partition first and changes nothing when one refuses; then
// it destroys the version's own group and replaces its moved record by a dropping mark, which
// EndDrop removes once the caller has removed the version's keys.
func (l *LiveGroups) DropMoved(ctx context.Context, member string, minIdle time.Duration, apply bool) (ops.DropReport, error) {
	rep := ops.DropReport{Member: member, Positions: map[string]string{}}
	idle := strconv.FormatInt(minIdle.Milliseconds(), 10)
	pass := func(doIt bool) error {
		flag := "0"
		if doIt {
			flag = "1"
		}
		for i := range l.parts.Count() {
			stream := l.parts.Stream(i)
			res, err := dropMovedLua.Run(ctx, l.client, []string{l.parts.Registry(i), stream}, member, idle, flag).StringSlice()
			if err != nil {
				return dropError(member, stream, l.parts.Count() > 1, err)
			}
			if len(res) != 2 {
				return fmt.Errorf("drop %s on %s: unexpected reply %v", member, stream, res)
			}
			switch res[0] {
			case "none":
				continue
			case "dropping":
				rep.Resumed = true
			}
			rep.Positions[stream] = res[1]
		}
		return nil
	}
	if err := pass(false); err != nil || !apply || len(rep.Positions) == 0 {
		return rep, err
	}
	if err := pass(true); err != nil {
		return rep, err
	}
	rep.Done = true
	return rep, nil
}

// EndDrop removes member's dropping marks on every partition (ops.LiveGroups), the last first.
func (l *LiveGroups) EndDrop(ctx context.Context, member string) error {
	return l.clearFields(ctx, "finish dropping "+member, droppingField+member)
}

// ForgetMoved removes member's moved record and dropping mark on every partition
// (ops.LiveGroups): the version is removed for good.
func (l *LiveGroups) ForgetMoved(ctx context.Context, member string) error {
	return l.clearFields(ctx, "forget that "+member+" was moved", movedField+member, droppingField+member)
}

// clearFields removes fields from every partition's registry, the last partition first: a join
// walks them from the first, so a clear cut short leaves the marks of the first partitions, which
// refuse the next join before it joins anything (cleared from the first, a join went through on
// the cleared partitions and stopped at the rest, half joined). what names it in an error.
func (l *LiveGroups) clearFields(ctx context.Context, what string, fields ...string) error {
	for i := l.parts.Count() - 1; i >= 0; i-- {
		if err := l.client.HDel(ctx, l.parts.Registry(i), fields...).Err(); err != nil {
			return fmt.Errorf("%s on %s: %w", what, l.parts.Stream(i), err)
		}
	}
	return nil
}

// dropError turns the script's refusals into ops.ErrDropRefused with what to do.
func dropError(member, stream string, parts bool, err error) error {
	where := ""
	if parts {
		where = " on " + stream
	}
	msg := err.Error()
	switch {
	case redis.HasErrorPrefix(err, "JOINED"):
		return fmt.Errorf("%w %s: it is in live group %s%s, which feeds it again (a projector that runs it joined it since the disband); to stop running it, disband that group",
			ops.ErrDropRefused, member, strings.TrimSpace(strings.TrimPrefix(msg, "JOINED")), where)
	case redis.HasErrorPrefix(err, "ACTIVE"):
		return fmt.Errorf("%w %s: a consumer read from its own group within CLAIM_IDLE%s (%s): stop the process that reads it and run this again once CLAIM_IDLE has passed",
			ops.ErrDropRefused, member, where, strings.TrimSpace(strings.TrimPrefix(msg, "ACTIVE")))
	case redis.HasErrorPrefix(err, "PENDING"):
		return fmt.Errorf("%w %s: %s entries are pending in its own group%s: stop the process that reads it and run this again",
			ops.ErrDropRefused, member, strings.TrimSpace(strings.TrimPrefix(msg, "PENDING")), where)
	}
	return fmt.Errorf("drop %s%s: %w", member, where, err)
}
