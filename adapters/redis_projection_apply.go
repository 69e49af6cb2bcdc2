package adapters

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"math"
	"math/rand/v2"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/checkins/checkins/app/projection"
	"github.com/checkins/checkins/domain"
)

// How projection updates are applied exactly once, with memory that does not grow with history:
//
//  1. Decide (once per event, shared by every projection). The dedupe registry of the event's
//     user, <prefix>:dedupe:{user:<id>}, is a sorted set of check-in identities
//     (domain.Checkin.Identity: checkinId plus content) scored by the stream position of the
//     copy that was counted. The first copy of an identity to get there is counted; another copy
//     within DEDUPE_WINDOW of it (measured on stream entry times, so a rebuild decides the same)
//     is a duplicate for every projection alike; identities older than the window are pruned.
//     Deciding is idempotent: the counted copy, delivered again, is still the counted copy.
//  2. Apply (per consumer group; per slot on a cluster). The updates every projection version of
//     a group made for one event run in one script with one marker: <prefix>:applied:<group>:
//     {<slot>} holds the identities that group applied there, scored by stream position (on a
//     single server one script applies an event's updates in every slot, with one marker in the
//     user's slot, and decides step 1 in the same call; on a cluster, one script per slot). A
//     marker already present means the updates landed before (a redelivery, a retry after a
//     timeout, a reclaim from a crashed consumer): nothing is applied again. A group delivers an
//     entry again only while it is pending, so the caller prunes a group's markers below its
//     oldest pending entry (Prune; from the start of that entry's millisecond, markerBound):
//     they stay as few as the entries in flight.
//
// Positions are scores: ms*1024 + seq (seq capped at 1023), exact in a float64 until the year
// 2248. Two copies of one identity recorded in the same millisecond with seq >= 1023 would look
// like one copy to step 1; the markers of step 2 still catch them while they live.
//
// A partition migration that merges partitions gives an entry whose ID another old partition
// holds too the next free ID, in the same millisecond (ms-seq+1): it moves the entry's score in
// its user's registry with it (PartitionMigrator.Copy), and a marker is stale only below the
// start of the millisecond of its group's oldest pending entry (markerBound), so the marker a
// group wrote at the old ID still stands for the entry redelivered at the new one. A marker more
// than the window older than a copy being applied is another copy's: stale too (a rebuild that
// meets two copies counted apart, beyond the window, within one checkpoint applies both). The
// marker stands for the newest copy a group applied; an older copy applied beyond the window
// from it has a marker of its own, <identity>:<its millisecond>, so each copy is applied once
// in whichever order a group meets them (a replay of parked copies, concurrent consumers, a
// retry of the older after the newer landed).

// ScoreOfEntry is the score of a stream entry ID ("ms-seq") in the registry and marker sets.
func ScoreOfEntry(id string) (int64, bool) {
	ms, seq, ok := strings.Cut(id, "-")
	m, err := strconv.ParseInt(ms, 10, 64)
	if err != nil || m < 0 || m > maxScoreMs {
		return 0, false
	}
	var q uint64
	if ok {
		if q, err = strconv.ParseUint(seq, 10, 64); err != nil {
			return 0, false
		}
	}
	return m*scorePerMs + int64(min(q, scorePerMs-1)), true
}

// markerBound is the score below which a group's markers may go when its oldest pending entry
// (or the next it will read) is id: the start of id's millisecond, since positions are judged
// on the millisecond (see above).
func markerBound(id string) (int64, bool) {
	s, ok := ScoreOfEntry(id)
	return s - s%scorePerMs, ok
}

// ScoreOfTime is the score of the first entry a stream can hold at t.
func ScoreOfTime(t time.Time) int64 { return t.UnixMilli() * scorePerMs }

const (
	scorePerMs = 1024 // the scripts divide by it too, as a literal
	maxScoreMs = (1<<53)/scorePerMs - 1
)

// decideScript is step 1. KEYS: registry keys; the first ARGV[2] are pruned below ARGV[3].
// ARGV[1]: window (score units); ARGV[4]: the fence (0, or the Redis time in ms from which the
// call must write nothing, as in applyScript); then per event: key index, identity, score.
// Returns 1 (count it) or 0 (a duplicate) per event. Pruning is only about memory (the window is judged on
// scores), so a call prunes some keys, not all: each prune is a command of its own.
//
// It prunes last, as applyScript does (see there why).
const decideScript = leaseLua + `
local w, np = tonumber(ARGV[1]), tonumber(ARGV[2])
if pastLease(ARGV[4]) then return leaseRefused() end
local out = {}
local e, i = 0, 5
while i <= #ARGV do
  local k, id, s = tonumber(ARGV[i]), ARGV[i+1], ARGV[i+2]
  local key, sn = KEYS[k], tonumber(s)
  e, i = e + 1, i + 3
  local count = 1
  if redis.call('ZADD', key, 'NX', s, id) == 0 then
    local cur = tonumber(redis.call('ZSCORE', key, id))
    if cur ~= sn then
      if math.abs(sn - cur) <= w then
        count = 0
      elseif sn > cur then
        redis.call('ZADD', key, s, id) -- beyond the window: counted again, and remembered anew
      end
    end
  end
  out[e] = count
end
for k = 1, np do redis.call('ZREMRANGEBYSCORE', KEYS[k], '-inf', '(' .. ARGV[3]) end
return out
`

// applyScript is step 2, and on a single server step 1 as well. KEYS: registry, marker and op
// keys. ARGV[1] holds the call's numbers (see scriptArgs: key indexes, counts, op kinds, and
// the ARGV index of every string); ARGV[2...] are the call's strings, each once. In that order:
// the window (score units, a string); the fence (0, or a string: the Redis time in ms from which
// the call must write nothing, projection.WithLease); the number of bounds, then per bound: key index, the score
// below which the set's members are no longer needed (a string; for a marker set: entries its
// group will not deliver again), 1 to prune them in this call, last (else 0); then the number of
// items, and per item (the updates one group made for one event, in one slot on a cluster):
// registry key index (0: decided already), marker key index, identity, score, update count; per
// update: legacy key index (0: none) and, if not 0, the legacy member; op count; per op its kind
// (opKindCode), its key indexes, for hmaxby the number of extra field/value pairs, and its args.
// Returns per item 1 (applied), 0 (had been applied: a marker says so) or 2 (a duplicate:
// another copy was counted).
//
// The sets are pruned last, after everything else the script does. A prune can empty a set,
// which deletes its key, and on a cluster a script that then touches a key that does not exist,
// in a slot that is migrating to another node, fails half-way with "Script attempted to access
// a non local key": Redis checks each command of a script as it checks a client's, and the key
// may have moved already. That error is about the script, not a transient one, so the event was
// parked and its updates in that slot were missing from the read models (a `redis-cli --cluster
// rebalance` under load lost a user's count that way). A set pruned last is not touched again.
//
// A stale marker counts as absent, so a copy the registry counts again (beyond the window) is
// applied whether or not its marker was pruned yet: pruning is only about memory, and a call
// prunes only some sets (each prune is a command of its own).
//
// Why the numbers are packed: Redis's single thread running these scripts is what bounds the
// drain rate, and each argument of a script call costs it about 850 instructions (read, made a
// Redis string, then a Lua string, then freed), as much as a tenth of a redis.call. An event of
// the five shipped projections was about 70 arguments, most of them small numbers and names
// repeated in every event; packed and shared it is about ten. The numbers are one MessagePack
// array that cmsgpack decodes in C, read inline as Q[q]: reading each through a Lua function
// (a varint decoder) cost Redis about 580 instructions a number, some 76 numbers an event,
// and a table read costs about 65 (callgrind; 270k -> 240k instructions per check-in of
// BenchmarkProjectionApply/batch=500).
const applyScript = leaseLua + unpackNumbersLua + `
local function before(a, b)
  -- Byte order, whatever locale redis-server runs in (Lua's < on strings follows strcoll).
  local n = math.min(#a, #b)
  for j = 1, n do
    local x, y = string.byte(a, j), string.byte(b, j)
    if x ~= y then return x < y end
  end
  return #a < #b
end
local S = ARGV
-- Q: the call's numbers, one MessagePack array decoded in C (see scriptArgs); q is the next.
-- They are read inline, Q[q] then q advanced, in the order of the arguments: a Lua function
-- call per number cost Redis about 580 instructions, a table read about 65. A server without
-- cmsgpack (miniredis, behind the embedded quick start) decodes the array in Lua.
local Q
local hasmp, mp = pcall(function() return cmsgpack end)
if hasmp and mp then Q = mp.unpack(ARGV[1]) else Q = unpackNumbers(ARGV[1]) end
-- Memoized conversions of the strings that repeat (trim ranks, as strings again; minimums).
local N = setmetatable({}, {__index = function(t, s) local v = tonumber(s); rawset(t, s, v); return v end})
local T = setmetatable({}, {__index = function(t, s) local v = tostring(-(tonumber(s) + 1)); rawset(t, s, v); return v end})
local w = tonumber(S[Q[1]])
-- The fence: Q[2], when not 0, is the string of the Redis time (ms) from which another consumer
-- may have taken the entries over. Checked before anything is written, by Redis's clock, so a
-- consumer that stood still between deciding to apply and this call running applies nothing.
if Q[2] > 0 and pastLease(S[Q[2]]) then return leaseRefused() end
local stale, prune = {}, {}
local q = 4 -- Q[1], Q[2] and Q[3]: the window's string, the fence's and the number of bounds
for _ = 1, Q[3] do
  local k, b, now = Q[q], S[Q[q+1]], Q[q+2]
  q = q + 3
  stale[k] = tonumber(b)
  if now == 1 then prune[#prune + 1] = k; prune[#prune + 1] = b end
end
-- An item is all or nothing. Redis takes nothing back when a command of a script fails (a key
-- of another type, a slot that moved on a cluster): the item's markers would say "applied"
-- with its updates half done, and a retry would skip it for good. So what an item writes that
-- a retry would not write again alike is noted as it goes: its markers (U) and its increments
-- (I); should a command fail, the item's are taken back and the error returned. The items
-- before it are whole (their markers stand); the others were not started. Its other ops set
-- values (zadd, hset, hmaxby, ratios, trims): applied again, they come out the same.
local U, nU = {}, 0 -- marker writes: key index, member, the score before (false: it was new)
local I, nI = {}, 0 -- increments: where each op is in Q
local function neg(d)
  if d == '0' then return d end
  if string.sub(d, 1, 1) == '-' then return string.sub(d, 2) end
  return '-' .. d
end
local function undo()
  -- An increment taken back to 0 removes its field (which reads as 0 all the same) or member.
  for j = nI, 1, -1 do
    local p = I[j]
    local kind, k, a, b = Q[p], KEYS[Q[p+1]], S[Q[p+2]], S[Q[p+3]]
    if kind == 1 or kind == 2 then -- hincrby key field delta
      if redis.call('HINCRBY', k, a, neg(b)) == 0 then redis.call('HDEL', k, a) end
    elseif tonumber(redis.call('ZINCRBY', k, neg(a), b)) == 0 then -- zincrby key delta member
      redis.call('ZREM', k, b)
    end
  end
  for j = nU - 2, 1, -3 do
    local ki, m, before = U[j], U[j+1], U[j+2]
    if before then redis.call('ZADD', KEYS[ki], before, m) else redis.call('ZREM', KEYS[ki], m) end
  end
end
local out = {}
local atIt, atU = 0, 0 -- the item being applied, and its update (0: its markers), for the error
-- applyItems applies the ni items from q on, each one's state in out.
local function applyItems(q, ni)
  local Q, S = Q, S
  for it = 1, ni do
    atIt, atU, nU, nI = it, 0, 0, 0
    local rk, mki, id, s, nu = Q[q], Q[q+1], S[Q[q+2]], S[Q[q+3]], Q[q+4]
    q = q + 5
    local state = 1
    if rk > 0 then
      if redis.call('ZADD', KEYS[rk], 'NX', s, id) == 0 then
        local cur = redis.call('ZSCORE', KEYS[rk], id)
        local cn, sn = tonumber(cur), tonumber(s)
        if cn ~= sn then
          if math.abs(sn - cn) <= w then
            state = 2
          elseif sn > cn then
            redis.call('ZADD', KEYS[rk], s, id) -- beyond the window: counted again, and remembered anew
            U[nU+1], U[nU+2], U[nU+3] = rk, id, cur
            nU = nU + 3
          end
        end
      else
        U[nU+1], U[nU+2], U[nU+3] = rk, id, false
        nU = nU + 3
      end
    end
    if state == 1 then
      if redis.call('ZADD', KEYS[mki], 'NX', s, id) == 0 then
        local cur = redis.call('ZSCORE', KEYS[mki], id)
        local ms, sn = tonumber(cur), tonumber(s)
        if stale[mki] and ms < stale[mki] then
          redis.call('ZADD', KEYS[mki], s, id)
          U[nU+1], U[nU+2], U[nU+3] = mki, id, cur
          nU = nU + 3
        elseif math.abs(sn - ms) <= w then
          state = 0
        elseif sn > ms then
          -- Another copy, counted beyond the window: the marker moves to the newer copy, and the
          -- older one keeps a marker of its own (identity:millisecond), should it come again.
          local old = id .. ':' .. string.format('%d', math.floor(ms / 1024))
          if redis.call('ZADD', KEYS[mki], cur, old) == 1 then
            U[nU+1], U[nU+2], U[nU+3] = mki, old, false
            nU = nU + 3
          end
          redis.call('ZADD', KEYS[mki], s, id)
          U[nU+1], U[nU+2], U[nU+3] = mki, id, cur
          nU = nU + 3
        else
          local older = id .. ':' .. string.format('%d', math.floor(sn / 1024))
          if redis.call('ZADD', KEYS[mki], 'NX', s, older) == 0 then
            state = 0 -- an older copy, applied before
          else
            U[nU+1], U[nU+2], U[nU+3] = mki, older, false
            nU = nU + 3
          end
        end
      else
        U[nU+1], U[nU+2], U[nU+3] = mki, id, false
        nU = nU + 3
      end
    end
    for u = 1, nu do
      atU = u
      local apply = state == 1
      local lk = Q[q]
      q = q + 1
      if lk > 0 then
        local lm = S[Q[q]]
        q = q + 1
        if apply and redis.call('SISMEMBER', KEYS[lk], lm) == 1 then
          apply = false -- applied before this version of the service, under its dedupe set
        end
      end
      local incr -- the results of the increments a later op of this update reads, per key
      local no = Q[q]
      q = q + 1
      for _ = 1, no do
        local kind, ki = Q[q], Q[q+1]
        q = q + 2
        if kind == 1 then -- hincrby key field delta
          local f, d = S[Q[q]], S[Q[q+1]]
          q = q + 2
          if apply then
            redis.call('HINCRBY', KEYS[ki], f, d)
            nI = nI + 1
            I[nI] = q - 4
          end
        elseif kind == 2 or kind == 11 then
          -- 2: hincrby key field delta, 11: zincrby key delta member; a ratio reads the result,
          -- kept under the field or the member
          local a, b = S[Q[q]], S[Q[q+1]]
          q = q + 2
          if apply then
            incr = incr or {}
            incr[ki] = incr[ki] or {}
            if kind == 2 then
              incr[ki][a] = redis.call('HINCRBY', KEYS[ki], a, b)
            else
              incr[ki][b] = tonumber(redis.call('ZINCRBY', KEYS[ki], a, b))
            end
            nI = nI + 1
            I[nI] = q - 4
          end
        elseif kind == 3 then -- zincrby key delta member
          local d, m = S[Q[q]], S[Q[q+1]]
          q = q + 2
          if apply then
            redis.call('ZINCRBY', KEYS[ki], d, m)
            nI = nI + 1
            I[nI] = q - 4
          end
        elseif kind == 4 then -- zadd key score member
          local sc, m = S[Q[q]], S[Q[q+1]]
          q = q + 2
          if apply then redis.call('ZADD', KEYS[ki], sc, m) end
        elseif kind == 5 then -- zkeeptop key n
          local r = T[S[Q[q]]]
          q = q + 1
          if apply then redis.call('ZREMRANGEBYRANK', KEYS[ki], '0', r) end -- strings: a number argument is printed by Redis
        elseif kind == 6 then -- hset key field value
          local f, v = S[Q[q]], S[Q[q+1]]
          q = q + 2
          if apply then redis.call('HSET', KEYS[ki], f, v) end
        elseif kind == 7 then -- hmaxby key field value tiefield tie [field value]...
          local na = 4 + 2 * Q[q]
          local a = {}
          for j = 1, na do a[j] = S[Q[q + j]] end
          q = q + na + 1
          if apply then
            local k = KEYS[ki]
            local cur = redis.call('HMGET', k, a[1], a[3])
            local v, c = tonumber(a[2]), tonumber(cur[1])
            if c == nil or v > c or (v == c and (not cur[2] or before(cur[2], a[4]))) then
              redis.call('HSET', k, unpack(a, 1, na))
            end
          end
        elseif kind == 8 or kind == 9 then
          -- 8: hround key dst num den; 9: zratioatmin zkey hkey member num den min
          local hki = ki
          if kind == 9 then
            hki = Q[q]
            q = q + 1
          end
          local dst, nf, df = S[Q[q]], S[Q[q+1]], S[Q[q+2]]
          q = q + 3
          local mn
          if kind == 9 then
            mn = N[S[Q[q]]]
            q = q + 1
          end
          if apply then
            local nv, dv
            if incr and incr[hki] then nv, dv = incr[hki][nf], incr[hki][df] end
            if nv == nil or dv == nil then
              local cur = redis.call('HMGET', KEYS[hki], nf, df)
              nv, dv = tonumber(cur[1]) or 0, tonumber(cur[2]) or 0
            end
            if kind == 8 then
              if dv > 0 then redis.call('HSET', KEYS[ki], dst, math.floor(nv / dv + 0.5)) end
            elseif dv > 0 and dv >= mn then
              redis.call('ZADD', KEYS[ki], nv / dv, dst)
            end
          end
        elseif kind == 10 then -- zscaledratioatmin zkey hkey dkey member num den min
          local hki, dki = Q[q], Q[q+1]
          local dst, nf, dm, mn = S[Q[q+2]], S[Q[q+3]], S[Q[q+4]], N[S[Q[q+5]]]
          q = q + 6
          if apply then
            local nv, dv
            if incr then
              nv = incr[hki] and incr[hki][nf]
              dv = incr[dki] and incr[dki][dm]
            end
            if nv == nil then nv = tonumber(redis.call('HGET', KEYS[hki], nf)) or 0 end
            if dv == nil then dv = tonumber(redis.call('ZSCORE', KEYS[dki], dm)) or 0 end
            if dv > 0 and dv >= mn then
              -- An integer below 2^52 (RatioScale): Redis prints it as one and a small sorted set
              -- keeps it as one, where a fraction is text parsed with strtod on every scan.
              redis.call('ZADD', KEYS[ki], math.floor(nv / dv * ` + ratioScaleLua + `), dst)
            end
          end
        else
          error('unknown op ' .. tostring(kind))
        end
      end
    end
    out[it] = state
  end
end
local ok, err = pcall(applyItems, q + 1, Q[q])
if not ok then
  undo()
  local msg = tostring(err)
  if type(err) == 'table' and err.err then msg = err.err end
  return redis.error_reply(msg .. ' (apply item ' .. atIt .. ' update ' .. atU .. ')')
end
for j = 1, #prune, 2 do redis.call('ZREMRANGEBYSCORE', KEYS[prune[j]], '-inf', '(' .. prune[j+1]) end
return out
`

// ratioScaleLua is projection.RatioScale as applyScript writes it (a test holds them equal).
const ratioScaleLua = "562949953421312"

// opKindCode is each op's kind in applyScript's packed numbers. After it come the op's key
// indexes, for hmaxby the number of extra field/value pairs, and its args as projection.Update
// holds them (opArity's count, hmaxby's all).
var opKindCode = map[projection.OpKind]int{
	projection.OpHIncrBy: 1, projection.OpZIncrBy: 3, projection.OpZAdd: 4, projection.OpZKeepTop: 5,
	projection.OpHSet: 6, projection.OpHMaxBy: 7, projection.OpHRound: 8, projection.OpZRatioAtMin: 9,
	projection.OpZScaledRatioAtMin: 10,
}

// incrKept and zincrKept are the codes of an increment (hincrby, zincrby) whose result a later
// op of its update reads (hround, zratioatmin, zscaledratioatmin): only those results are kept,
// which saves the script a table entry per increment.
const (
	incrKept  = 2
	zincrKept = 11
)

// unpackNumbersLua defines unpackNumbers(P): the array of numbers scriptArgs writes, decoded in
// Lua, for a server whose Lua has no cmsgpack (miniredis). It knows what put and finish write:
// positive fixints, uint8, uint16 and uint32 under a fixarray, array 16 or array 32 header.
const unpackNumbersLua = `
local function unpackNumbers(P)
  local out, n = {}, 0
  local h = string.byte(P, 1)
  local i = 2
  if h == 0xdc then i = 4 elseif h == 0xdd then i = 6 end
  while i <= #P do
    local b = string.byte(P, i)
    n = n + 1
    if b < 128 then
      out[n] = b
      i = i + 1
    elseif b == 0xcc then
      out[n] = string.byte(P, i + 1)
      i = i + 2
    elseif b == 0xcd then
      local x, y = string.byte(P, i + 1, i + 2)
      out[n] = x * 256 + y
      i = i + 3
    else
      local w, x, y, z = string.byte(P, i + 1, i + 4)
      out[n] = ((w * 256 + x) * 256 + y) * 256 + z
      i = i + 5
    end
  end
  return out
end
`

// scriptArgs are the arguments of one applyScript call: the numbers in ARGV[1], one MessagePack
// array of unsigned integers (the script decodes it with cmsgpack, in C, and reads it inline),
// and the strings each once in ARGV[2...], named by their ARGV index.
type scriptArgs struct {
	args []any          // args[0] is ARGV[1], set by finish
	at   map[string]int // string -> its ARGV index
	n    uint32         // the numbers put so far: the array's length
}

func newScriptArgs(n int) *scriptArgs {
	return &scriptArgs{args: make([]any, 1, 1+n), at: make(map[string]int, n)}
}

// ref is the ARGV index of s, added on its first use.
func (s *scriptArgs) ref(v string) int {
	if i, ok := s.at[v]; ok {
		return i
	}
	s.args = append(s.args, v)
	s.at[v] = len(s.args)
	return len(s.args)
}

// put appends v (never negative) to the numbers b, MessagePack-encoded: a positive fixint below
// 128, else uint8, uint16 or uint32. Every number put goes into the array finish is given.
func (s *scriptArgs) put(b []byte, v int) []byte {
	s.n++
	u := uint32(v) // #nosec G115 -- key and string indexes and counts: never negative, far below 2^32
	switch {
	case u < 128:
		return append(b, uint8(u))
	case u <= math.MaxUint8:
		return append(b, 0xcc, uint8(u))
	case u <= math.MaxUint16:
		return binary.BigEndian.AppendUint16(append(b, 0xcd), uint16(u))
	}
	return binary.BigEndian.AppendUint32(append(b, 0xce), u)
}

// finish sets ARGV[1] to the numbers b, under their array's header, and returns the call's ARGV.
func (s *scriptArgs) finish(b []byte) []any {
	n := s.n
	var h []byte
	switch {
	case n < 16:
		h = []byte{0x90 + uint8(n)}
	case n <= math.MaxUint16:
		h = binary.BigEndian.AppendUint16([]byte{0xdc}, uint16(n))
	default:
		h = binary.BigEndian.AppendUint32([]byte{0xdd}, n)
	}
	s.args[0] = append(h, b...)
	return s.args
}

// readByRatios is the hash fields and sorted-set members (key name, field or member) the ratio
// ops of u read, nil when it has none.
func readByRatios(u *projection.Update) [][2]string {
	var read [][2]string
	for _, op := range u.Ops {
		switch op.Kind {
		case projection.OpHRound: // key dst num den
			read = append(read, [2]string{op.Keys[0], op.Args[1]}, [2]string{op.Keys[0], op.Args[2]})
		case projection.OpZRatioAtMin: // zkey hkey; member num den min
			read = append(read, [2]string{op.Keys[1], op.Args[1]}, [2]string{op.Keys[1], op.Args[2]})
		case projection.OpZScaledRatioAtMin: // zkey hkey dkey; member num den min
			read = append(read, [2]string{op.Keys[1], op.Args[1]}, [2]string{op.Keys[2], op.Args[2]})
		}
	}
	return read
}

var (
	decideLua = redis.NewScript(decideScript)
	applyLua  = redis.NewScript(applyScript)
)

// DefaultDedupeWindow is how long (in stream time) another copy of a counted check-in is still
// recognised as a duplicate: IDEMPOTENCY_TTL's default, so a copy the API may let through (a
// producer's, a retry the API did not recognise) counts once, and the registries hold a day of
// check-ins.
const DefaultDedupeWindow = 24 * time.Hour

// scoreOf is e's position as a score.
func scoreOf(e projection.EventRef) (int64, error) {
	if e.EntryID != "" {
		s, ok := ScoreOfEntry(e.EntryID)
		if !ok {
			return 0, fmt.Errorf("stream entry ID %q is not ms-seq", e.EntryID)
		}
		return s, nil
	}
	if e.RecordedAt <= 0 || e.RecordedAt > maxScoreMs {
		return 0, fmt.Errorf("event has neither a stream entry ID nor a usable recordedAt (%d)", e.RecordedAt)
	}
	return e.RecordedAt * scorePerMs, nil
}

// ProjectionApplier applies projection updates in batches, each exactly once per check-in.
type ProjectionApplier struct {
	client  redis.UniversalClient
	keys    KeySpace
	window  int64 // score units
	chunk   int   // Redis commands per script call, about
	cluster bool
	// pruneEvery: see PruneEvery.
	pruneEvery int
	// floors: per partition of the stream, the score every consumer group has passed there
	// (SetRegistryFloors); nil: unknown, and the registries are not pruned.
	floors atomic.Pointer[[]int64]
	// floorsGen counts HoldRegistryFloors calls; floorsMu orders them with SetRegistryFloorsAt.
	floorsGen atomic.Uint64
	floorsMu  sync.Mutex

	// touched are the marker keys applied to since the last Sweep, per group; decided, the
	// users whose registries were written since the last SweepRegistries.
	mu      sync.Mutex
	touched map[string]map[string]struct{}
	decided map[int64]struct{}
	// pruned: the bound each user's registry was last pruned below by this applier (see
	// prunesRegistry).
	pruned map[int64]int64
}

// registryPruneStep is how far (a fraction of the window) a user's registry bound must have
// moved since this applier last pruned the registry before a call prunes it again. Pruning on
// every call cost a ZREMRANGEBYSCORE per event in a live service, where a user's bound moves a
// few milliseconds between two check-ins and finds nothing to remove; with the step a registry
// holds at most a sixteenth of the window more, and a drain of history, whose bound moves fast,
// still prunes nearly every call.
const registryPruneStep = 16

// prunesRegistry reports whether a call should prune user's registry below bound, and if so
// records it. What it forgets (past maxSweepKeys users) is pruned again, which is only a command.
func (a *ProjectionApplier) prunesRegistry(user, bound int64) bool {
	if a.pruneEvery == 1 {
		return true
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if last, ok := a.pruned[user]; ok && bound >= last && bound-last < a.window/registryPruneStep {
		return false
	}
	if len(a.pruned) >= maxSweepKeys {
		clear(a.pruned)
	}
	a.pruned[user] = bound
	return true
}

// DefaultPruneEvery: a marker set is pruned in one of this many calls that touch it; pruning is
// a command per set, and the sets stay as small as what a few calls add, never depending on
// history. A registry is pruned by the calls that decide one of its user's check-ins, whenever
// its bound moved a step (registryPruneStep): left to chance, a busy drain grows one past
// Redis's compact encoding (zset-max-listpack-entries), which it never returns to. Measured with
// the bench's memory phase (a month of 200 users): the dedupe registries took 296 KiB after 100k
// events and 1.6 MiB after 200k when pruned by chance, so the projections' memory grew 53% from
// N to 2N; pruned every time, 9%, for no measurable Redis CPU per event (36.4 vs 36.7 us,
// medians of three drains of 100k events).
const DefaultPruneEvery = 4

// PruneEvery sets how often a marker set is pruned (1: in every call, and every registry too,
// however little its bound moved; 0: never, registries neither, which only tests want:
// correctness never depends on pruning).
func (a *ProjectionApplier) PruneEvery(n int) *ProjectionApplier {
	a.pruneEvery = n
	return a
}

// SetRegistryFloor says that every consumer group reading the stream has acknowledged every
// entry up to id: no event before it will be decided again, except parked ones, which carry
// their decision. The registry then lets go of copies older than the window before id, which no
// later copy can be a duplicate of. Until it is called the registry is not pruned: pruning by
// the position of the group at hand alone would let a group that is further ahead (the live
// one) drop a copy that a backfill, deciding its way through older entries, still needs.
func (a *ProjectionApplier) SetRegistryFloor(id string) error {
	return a.SetRegistryFloors([]string{id})
}

// SetRegistryFloors is SetRegistryFloor per partition of the stream, in partition order. A
// user's check-ins are all in the user's partition (Partitions.StreamOf), so the user's registry
// follows that partition's floor alone: the least over the partitions would hold every registry
// back to the slowest partition, and during a drain of many partitions that kept about 35 times
// the window's identities (4.8 MiB instead of 132 KiB for 200 users in the bench's memory phase).
// One floor stands for every partition.
func (a *ProjectionApplier) SetRegistryFloors(ids []string) error {
	if len(ids) == 0 {
		return errors.New("registry floors: none given")
	}
	fs := make([]int64, len(ids))
	for i, id := range ids {
		s, ok := ScoreOfEntry(id)
		if !ok {
			return fmt.Errorf("registry floor of partition %d: %q is not a stream entry ID", i, id)
		}
		fs[i] = s
	}
	a.floors.Store(&fs)
	return nil
}

// HoldRegistryFloors forgets the floors until the next SetRegistryFloors: no registry is pruned
// meanwhile. A backfill about to start (a rebuild) registers identities far below the floors
// every group had passed, and a prune with those floors would drop them before the backfill
// meets their later copies, which it would then count again.
func (a *ProjectionApplier) HoldRegistryFloors() {
	a.floorsMu.Lock()
	defer a.floorsMu.Unlock()
	a.floorsGen.Add(1)
	a.floors.Store(nil)
}

// FloorsGeneration is the number of HoldRegistryFloors calls so far: floors computed from what
// was read after it may be set with SetRegistryFloorsAt.
func (a *ProjectionApplier) FloorsGeneration() uint64 { return a.floorsGen.Load() }

// SetRegistryFloorsAt is SetRegistryFloors unless HoldRegistryFloors was called since gen
// (FloorsGeneration) was read: floors computed before a backfill started are above what it
// registers, and are dropped.
func (a *ProjectionApplier) SetRegistryFloorsAt(gen uint64, ids []string) error {
	a.floorsMu.Lock()
	defer a.floorsMu.Unlock()
	if a.floorsGen.Load() != gen {
		return nil
	}
	return a.SetRegistryFloors(ids)
}

// Window is the dedupe window.
func (a *ProjectionApplier) Window() time.Duration {
	return time.Duration(a.window/scorePerMs) * time.Millisecond
}

// registryBound is the score below which user's registry may be pruned (ok false: not yet):
// the window before the floor of the user's partition.
func (a *ProjectionApplier) registryBound(user int64) (int64, bool) {
	fs := a.floors.Load()
	if fs == nil {
		return 0, false
	}
	f := (*fs)[0]
	if len(*fs) > 1 {
		f = (*fs)[PartitionOf(user, len(*fs))]
	}
	if f <= a.window {
		return 0, false
	}
	return f - a.window, true
}

func (a *ProjectionApplier) pruneNow() bool {
	return a.pruneEvery > 0 && (a.pruneEvery == 1 || rand.IntN(a.pruneEvery) == 0) // #nosec G404 -- sampling when to prune, not a secret
}

// NewProjectionApplier applies with the given dedupe window (0: DefaultDedupeWindow).
func NewProjectionApplier(client redis.UniversalClient, keys KeySpace, window time.Duration) (*ProjectionApplier, error) {
	if client == nil || keys.Prefix == "" {
		return nil, errors.New("adapters: ProjectionApplier needs a client and a key prefix")
	}
	if window == 0 {
		window = DefaultDedupeWindow
	}
	if window < time.Millisecond {
		return nil, fmt.Errorf("adapters: dedupe window must be at least 1ms, got %s", window)
	}
	_, cluster := client.(*redis.ClusterClient)
	return &ProjectionApplier{client: client, keys: keys, window: window.Milliseconds() * scorePerMs, chunk: defaultChunk, cluster: cluster, pruneEvery: DefaultPruneEvery,
		touched: map[string]map[string]struct{}{}, decided: map[int64]struct{}{}, pruned: map[int64]int64{}}, nil
}

// RequireReplicas makes the applier's updates count only once n replicas have them: each
// pipeline of its script calls gets `WAIT n <timeout>` appended, on the same connection (see
// RequireReplicas), and when fewer replicas confirm in time the calls fail with an error
// wrapping domain.ErrNotReplicated, a transient failure: the projector does not acknowledge the
// entries and delivers them again, to find them applied once the replicas answer, or to apply
// them on the replica promoted in its master's place. A call delivered again that finds its
// work done (its markers, or its decision, in place) writes nothing, and its WAIT still covers
// what the failed call wrote: Redis takes a connection's replication offset for WAIT after each
// of its commands, reads included, as the master's whole offset. Without it a master that dies with a
// lagging replica takes updates of entries already acknowledged with it, and the read models
// fall short for good. Call it before the applier's first command, on a client of its own: it
// hooks the client.
func (a *ProjectionApplier) RequireReplicas(n int, timeout time.Duration) error {
	applySHA, decideSHA := applyLua.Hash(), decideLua.Hash()
	match := func(c redis.Cmder) bool {
		args := c.Args()
		if len(args) < 2 {
			return false
		}
		switch strings.ToLower(c.Name()) {
		case "evalsha":
			return args[1] == applySHA || args[1] == decideSHA
		case "eval": // a call sent again with the source (NOSCRIPT)
			return args[1] == applyScript || args[1] == decideScript
		}
		return false
	}
	return requireReplicas(a.client, n, timeout, match, "ProjectionApplier.RequireReplicas")
}

// Registry is the dedupe registry key of a user.
func (k KeySpace) Registry(userID int64) string {
	return k.Prefix + ":dedupe:{user:" + strconv.FormatInt(userID, 10) + "}"
}

// MarkerKey is the marker set of one consumer group in one slot.
func (k KeySpace) MarkerKey(group, slot string) string {
	return k.MarkerPrefix(group) + "{" + slot + "}"
}

// MarkerPrefix is what every marker key of group starts with.
func (k KeySpace) MarkerPrefix(group string) string { return k.Prefix + ":applied:" + group + ":" }

// legacyKeyName is the per-slot dedupe set of the service's earlier layout, read while the
// entries a projector had in flight at the upgrade are finished, then removed.
const legacyKeyName = "seen"

// IsBookkeeping reports whether a key name inside a projection's slot belongs to the machinery
// rather than to the projection's read model: names projections may not use.
func IsBookkeeping(key string) bool { return key == legacyKeyName || key == "applied" }

var knownOps = map[projection.OpKind]bool{
	projection.OpHIncrBy: true, projection.OpHSet: true, projection.OpHMaxBy: true, projection.OpHRound: true,
	projection.OpZAdd: true, projection.OpZIncrBy: true, projection.OpZKeepTop: true, projection.OpZRatioAtMin: true,
	projection.OpZScaledRatioAtMin: true,
}

// Validate checks what Apply would refuse, so a bad update is caught before anything is sent.
func Validate(name string, u *projection.Update) error {
	if u == nil || u.Slot == "" {
		return fmt.Errorf("projection %s: update needs a slot", name)
	}
	if strings.ContainsAny(u.Slot, "{}") {
		return fmt.Errorf("projection %s: slot %q must not contain braces", name, u.Slot)
	}
	if len(u.Ops) == 0 {
		return fmt.Errorf("projection %s: update of %s has no ops", name, u.Slot)
	}
	for _, op := range u.Ops {
		if !knownOps[op.Kind] {
			return fmt.Errorf("projection %s: unknown op %q", name, op.Kind)
		}
		for _, k := range op.Keys {
			if k == "" || IsBookkeeping(k) {
				return fmt.Errorf("projection %s: key name %q is reserved or empty", name, k)
			}
		}
		if want := opArity[op.Kind]; len(op.Keys) != want[0] || len(op.Args) < want[1] {
			return fmt.Errorf("projection %s: op %s needs %d keys and at least %d args, got %d and %d", name, op.Kind,
				want[0], want[1], len(op.Keys), len(op.Args))
		}
		// hmaxby's args beyond its first four are field-value pairs, sent as a count of pairs:
		// an odd one out would put every later number of the script call one place off (the
		// rest of the item half applied under its marker, the next items failing). Any other
		// op's args beyond its arity would be dropped unseen.
		if op.Kind == projection.OpHMaxBy && (len(op.Args)-4)%2 != 0 {
			return fmt.Errorf("projection %s: hmaxby of %s takes field-value pairs after its first four args, got %d args", name, op.Keys[0], len(op.Args))
		}
		if want := opArity[op.Kind][1]; op.Kind != projection.OpHMaxBy && len(op.Args) != want {
			return fmt.Errorf("projection %s: op %s of %s takes %d args, got %d", name, op.Kind, op.Keys[0], want, len(op.Args))
		}
		// Keeping no member would delete the set, and a later op of the same script on it would
		// fail in a slot that is migrating (see applyScript).
		if op.Kind == projection.OpZKeepTop {
			if n, err := strconv.Atoi(op.Args[0]); err != nil || n < 1 {
				return fmt.Errorf("projection %s: zkeeptop of %s needs a count of at least 1, got %q", name, op.Keys[0], op.Args[0])
			}
		}
	}
	return nil
}

var opArity = map[projection.OpKind][2]int{
	projection.OpHIncrBy: {1, 2}, projection.OpHSet: {1, 2}, projection.OpHMaxBy: {1, 4}, projection.OpHRound: {1, 3},
	projection.OpZAdd: {1, 2}, projection.OpZIncrBy: {1, 2}, projection.OpZKeepTop: {1, 1}, projection.OpZRatioAtMin: {2, 4},
	projection.OpZScaledRatioAtMin: {3, 4},
}

// Apply applies works: it decides which events count (step 1), then applies their updates with
// markers (step 2), pruning markers as prune allows. On a single server both steps run in one
// script call per chunk, and one marker covers an event's updates in every slot; on a cluster
// a script may touch one slot only: both steps run for the updates in the user's slot (the
// registry's), then step 2 for the other slots (applyInUserSlots). Outcomes are
// per work, in order. An error means some updates may have been applied and others not:
// calling Apply again with the same works is safe and completes them.
func (a *ProjectionApplier) Apply(ctx context.Context, works []projection.Work, prune projection.Prune) ([]projection.Outcome, error) {
	out := make([]projection.Outcome, len(works))
	if len(works) == 0 {
		return out, nil
	}
	scores := make([]int64, len(works))
	for i, w := range works {
		for _, u := range w.Updates {
			if err := Validate(w.Projection, u); err != nil {
				return nil, err
			}
		}
		s, err := scoreOf(w.Event)
		if err != nil {
			return nil, fmt.Errorf("projection %s: %w", w.Projection, err)
		}
		scores[i] = s
	}
	counted := make([]bool, len(works))
	decided := make([]bool, len(works)) // step 1 is done: the registry is not asked in step 2
	var ask []int
	for i, w := range works {
		switch w.Event.Decision {
		case projection.DecidedCounted:
			counted[i], decided[i] = true, true
		case projection.DecidedDuplicate:
			decided[i] = true
		default:
			if a.cluster {
				ask = append(ask, i)
			} else {
				counted[i] = true // decided in the same call as the updates
			}
		}
	}
	var first []int                      // states of the first step on a cluster (nil: none)
	var rest func(work, update int) bool // the updates the first step left
	if len(ask) > 0 {
		var err error
		if first, rest, ask, err = a.applyInUserSlots(ctx, works, scores, counted, decided, ask, prune); err != nil {
			return nil, err
		}
	}
	if len(ask) > 0 {
		sub, subScores := make([]projection.Work, len(ask)), make([]int64, len(ask))
		for k, i := range ask {
			sub[k], subScores[k] = works[i], scores[i]
		}
		res, err := a.decide(ctx, sub, subScores)
		if err != nil {
			return nil, err
		}
		for k, i := range ask {
			counted[i], decided[i] = res[k], true
		}
	}
	states, err := a.apply(ctx, works, scores, counted, decided, prune, rest)
	if err != nil {
		// On a cluster the updates in the users' slots went through in the first step: a work
		// (or, when none is named, an event) that had some there is applied in part.
		var wf *projection.WorkFailure
		switch {
		case rest == nil:
		case errors.As(err, &wf):
			if slices.ContainsFunc(works[wf.Work].Updates, func(u *projection.Update) bool {
				return !rest(wf.Work, slices.Index(works[wf.Work].Updates, u))
			}) {
				return nil, fmt.Errorf("%w: %w", projection.ErrAppliedInPart, wf.Err)
			}
		case failedAt.MatchString(err.Error()):
			return nil, fmt.Errorf("%w: %w", projection.ErrAppliedInPart, err)
		}
		return nil, err
	}
	for i, st := range first {
		if st == itemApplied || (st == itemDuplicate && states[i] != itemApplied) {
			states[i] = st
		}
	}
	for i := range works {
		switch {
		case !counted[i] || states[i] == itemDuplicate:
			out[i] = projection.Duplicate
		case states[i] == itemApplied:
			out[i] = projection.Applied
		default:
			out[i] = projection.AlreadyApplied
		}
	}
	return out, nil
}

// States of an item, as applyScript returns them.
const (
	itemAlready   = 0
	itemApplied   = 1
	itemDuplicate = 2
)

// applyInUserSlots is the first step on a cluster: the updates of the works in ask (not decided
// yet) that are in their event's user slot, the slot of its dedupe registry, are applied in the
// same calls that decide the events there, as one server decides in the call that applies. Every
// work of an event decided so is marked decided and counted (or not) for the second step, which
// applies the rest (left: the updates not applied here); undecided are the works of events with
// no update in their user's slot (a selection of projections without users or
// recent_checkins), decided by a call of their own. states are this step's, per work.
func (a *ProjectionApplier) applyInUserSlots(ctx context.Context, works []projection.Work, scores []int64, counted, decided []bool, ask []int, prune projection.Prune) (states []int, left func(work, update int) bool, undecided []int, err error) {
	userSlot := make([]string, len(works))
	inUserSlot := func(i, j int) bool { return userSlot[i] != "" && works[i].Updates[j].Slot == userSlot[i] }
	some := false
	for _, i := range ask {
		userSlot[i] = "user:" + strconv.FormatInt(works[i].Event.UserID, 10)
		counted[i] = true // decided in the call, which answers 2 for a duplicate
		if slices.ContainsFunc(works[i].Updates, func(u *projection.Update) bool { return u.Slot == userSlot[i] }) {
			some = true
		}
	}
	if !some {
		return nil, nil, ask, nil
	}
	if states, err = a.apply(ctx, works, scores, counted, decided, prune, inUserSlot); err != nil {
		return nil, nil, nil, err
	}
	left = func(i, j int) bool { return !inUserSlot(i, j) }
	decisions := map[decideKey]bool{} // event -> counted
	for _, i := range ask {
		if slices.ContainsFunc(works[i].Updates, func(u *projection.Update) bool { return u.Slot == userSlot[i] }) {
			decisions[decideKey{works[i].Event.Identity, scores[i]}] = states[i] != itemDuplicate
		}
	}
	for _, i := range ask {
		c, ok := decisions[decideKey{works[i].Event.Identity, scores[i]}]
		if !ok {
			counted[i] = false
			undecided = append(undecided, i)
			continue
		}
		counted[i], decided[i] = c, true
	}
	return states, left, undecided, nil
}

// decideKey identifies one event in a batch: the same event appears once per projection.
type decideKey struct {
	identity, score int64
}

// Decide runs step 1 for events without applying anything: true for the copy to count. It is
// idempotent (the counted copy asked again is still the counted copy), so the projector asks it
// for an event it parks, and the parked event keeps the answer (projection.EventRef.Decision).
func (a *ProjectionApplier) Decide(ctx context.Context, events []projection.EventRef) ([]bool, error) {
	works, scores := make([]projection.Work, len(events)), make([]int64, len(events))
	for i, e := range events {
		s, err := scoreOf(e)
		if err != nil {
			return nil, err
		}
		works[i], scores[i] = projection.Work{Event: e}, s
	}
	return a.decide(ctx, works, scores)
}

// decide runs step 1 once per distinct event of works.
func (a *ProjectionApplier) decide(ctx context.Context, works []projection.Work, scores []int64) ([]bool, error) {
	type event struct {
		user     int64
		identity int64
		score    int64
	}
	index := map[decideKey]int{}
	var events []event
	of := make([]int, len(works))
	for i, w := range works {
		k := decideKey{w.Event.Identity, scores[i]}
		j, ok := index[k]
		if !ok {
			j = len(events)
			index[k] = j
			events = append(events, event{w.Event.UserID, w.Event.Identity, scores[i]})
		}
		of[i] = j
	}
	results := make([]bool, len(events))
	decided := make([]int64, len(events))
	for j, e := range events {
		decided[j] = e.user
	}
	a.touchDecided(decided)
	calls := a.group(len(events), func(j int) string { return a.keys.Registry(events[j].user) }, func(int) int { return 2 })
	pipe := a.client.Pipeline()
	cmds := make([]*redis.Cmd, len(calls))
	for c, idx := range calls {
		// The keys to prune in this call come first in KEYS.
		var keys, rest []string
		// One bound per call: the least of its users' (each user's own partition floor).
		bound, prune := int64(0), true
		for _, j := range idx {
			b, ok := a.registryBound(events[j].user)
			if !ok {
				prune = false
				break
			}
			if bound == 0 || b < bound {
				bound = b
			}
		}
		for _, j := range idx {
			k := a.keys.Registry(events[j].user)
			if !slices.Contains(keys, k) && !slices.Contains(rest, k) {
				if prune && a.pruneEvery > 0 {
					keys = append(keys, k)
				} else {
					rest = append(rest, k)
				}
			}
		}
		np := len(keys)
		keys = append(keys, rest...)
		keyAt := make(map[string]int, len(keys))
		for i, k := range keys {
			keyAt[k] = i + 1
		}
		args := make([]any, 4, 4+3*len(idx))
		args[0], args[1], args[2] = a.window, np, bound
		args[3], _ = projection.LeaseOf(ctx)
		for _, j := range idx {
			args = append(args, keyAt[a.keys.Registry(events[j].user)], events[j].identity, events[j].score)
		}
		cmds[c] = decideLua.EvalSha(ctx, pipe, keys, args...)
	}
	if err := a.exec(ctx, pipe, cmds, decideLua, "decide"); err != nil {
		for _, c := range cmds {
			if isLeaseExpired(c.Err()) {
				return nil, fmt.Errorf("dedupe registry: %w", projection.ErrLeaseExpired)
			}
		}
		return nil, err
	}
	for c, idx := range calls {
		vals, err := cmds[c].Int64Slice()
		if err != nil || len(vals) != len(idx) {
			return nil, fmt.Errorf("dedupe registry: unexpected reply %v: %w", cmds[c].Val(), err)
		}
		for n, j := range idx {
			results[j] = vals[n] == 1
		}
	}
	counted := make([]bool, len(works))
	for i := range works {
		counted[i] = results[of[i]]
	}
	return counted, nil
}

// item is what one marker covers: the updates one group made for one event (in one slot, on a
// cluster).
type item struct {
	group, slot string // slot: the marker's slot (the event's user on a single server)
	work        int    // the first work of the item, for the event and its score
	decide      bool   // the registry is asked in the same call
	refs        []updateRef
}

type updateRef struct{ work, update int }

// apply runs step 2 (with step 1 for works not decided yet: on a single server in the call of
// the user's slot, which holds every update; on a cluster only for the updates in that slot, see
// applyInUserSlots) for the updates of counted works (those only matches, when not nil); it
// returns each work's item state (the best of its items: applied anywhere counts as applied).
func (a *ProjectionApplier) apply(ctx context.Context, works []projection.Work, scores []int64, counted, decided []bool, prune projection.Prune, only func(work, update int) bool) ([]int, error) {
	type itemKey struct {
		group, slot string
		event       decideKey
	}
	index := make(map[itemKey]int, len(works))
	items := make([]item, 0, len(works))
	// The same projection version given the same event twice in one batch (a caller delivering
	// one entry twice) applies it once. Works of one event are chained (last: the latest work of
	// each event; prev: the one before it), so finding the first is a walk of a few works, not a
	// map keyed by strings.
	last := make(map[decideKey]int, len(works))
	prev := make([]int, len(works))
	again := map[int]int{} // a work given again in the batch -> its first
	states := make([]int, len(works))
	for i := range states {
		states[i] = itemAlready
	}
	userSlots := map[int64]string{} // single server: the marker's slot of each user
	// Each update's item, in batch order; the items' refs are cut from one array after the loop
	// (appending to each item's own grew it from nil: four allocations per event).
	type placed struct {
		n int
		r updateRef
	}
	placements := make([]placed, 0, 2*len(works))
	for i, w := range works {
		if !counted[i] {
			continue
		}
		ev := decideKey{w.Event.Identity, scores[i]}
		head, seenEvent := last[ev]
		first := -1
		for p := head; seenEvent && p >= 0; p = prev[p] {
			if o := works[p]; o.Group == w.Group && o.Projection == w.Projection && o.Version == w.Version {
				first = p
			}
		}
		if first >= 0 {
			again[i] = first
			continue
		}
		prev[i] = -1
		if seenEvent {
			prev[i] = head
		}
		last[ev] = i
		var userSlot string
		if !a.cluster {
			var ok bool
			if userSlot, ok = userSlots[w.Event.UserID]; !ok {
				userSlot = "user:" + strconv.FormatInt(w.Event.UserID, 10)
				userSlots[w.Event.UserID] = userSlot
			}
		}
		for j, u := range w.Updates {
			if only != nil && !only(i, j) {
				continue
			}
			slot := u.Slot
			if !a.cluster {
				slot = userSlot
			}
			k := itemKey{w.Group, slot, ev}
			n, ok := index[k]
			if !ok {
				n = len(items)
				index[k] = n
				items = append(items, item{group: w.Group, slot: slot, work: i, decide: !decided[i]})
			}
			placements = append(placements, placed{n, updateRef{i, j}})
		}
	}
	if len(items) == 0 {
		return states, nil
	}
	refCount := make([]int, len(items))
	for _, p := range placements {
		refCount[p.n]++
	}
	refs := make([]updateRef, len(placements))
	for n, off := 0, 0; n < len(items); n++ {
		items[n].refs, off = refs[off:off:off+refCount[n]], off+refCount[n]
	}
	for _, p := range placements {
		items[p.n].refs = append(items[p.n].refs, p.r)
	}
	// Items of one slot go together (a cluster needs it; a single server shares the markers'
	// pruning); the order within a slot stays the batch's.
	slices.SortStableFunc(items, func(x, y item) int { return strings.Compare(x.slot, y.slot) })
	tags := make([]string, len(items))
	for n := range items {
		if n > 0 && items[n].slot == items[n-1].slot {
			tags[n] = tags[n-1]
		} else {
			tags[n] = "{" + items[n].slot + "}"
		}
	}
	calls := a.group(len(items), func(n int) string { return tags[n] }, func(n int) int {
		w := 2 // the registry and the marker
		for _, r := range items[n].refs {
			w += len(works[r.work].Updates[r.update].Ops)
		}
		return w
	})
	floors := map[string]string{} // group -> prune before, asked once per batch
	type versionOf struct {
		projection string
		version    int
	}
	prefixes := map[versionOf]string{} // each projection version's key prefix, made once
	type markerOf struct{ group, slot string }
	markers := make([]string, len(items)) // each item's marker key
	windowArg := strconv.FormatInt(a.window, 10)
	leaseArg := ""
	if until, ok := projection.LeaseOf(ctx); ok {
		leaseArg = strconv.FormatInt(until, 10)
	}
	leaseRef := func(sa *scriptArgs) int {
		if leaseArg == "" {
			return 0
		}
		return sa.ref(leaseArg)
	}
	pipe := a.client.Pipeline()
	cmds := make([]*redis.Cmd, len(calls))
	for c, idx := range calls {
		// KEYS, each once: the three kinds of key below cannot share a name (registries and
		// markers have prefixes of their own), so each kind is looked up by what it is made of
		// rather than by the joined name.
		keys := make([]string, 0, 10*len(idx))
		addKey := func(k string) int {
			keys = append(keys, k)
			return len(keys)
		}
		// Keys of updates: per projection version and slot, the few key names its ops use, each
		// joined with the prefix and the slot once per call.
		type slotOf struct {
			versionOf
			slot string
		}
		type slotKeys struct {
			n     int
			names [4]string
			at    [4]int
		}
		nrefs := 0 // the call's updates: at most that many projection version and slot pairs
		for _, n := range idx {
			nrefs += len(items[n].refs)
		}
		slotted := make(map[slotOf]*slotKeys, nrefs)
		slotKeysOf := make([]slotKeys, 0, nrefs) // slotted's values: never more than nrefs, so never moved
		nameIndex := func(sk *slotKeys, so slotOf, name string) int {
			for i, n := range sk.names[:sk.n] {
				if n == name {
					return sk.at[i]
				}
			}
			prefix, ok := prefixes[so.versionOf]
			if !ok {
				prefix = a.keys.ProjectionPrefix(so.projection, so.version)
				prefixes[so.versionOf] = prefix
			}
			if sk.n == len(sk.names) { // a slot with many key names: they are joined each time
				return addKey(prefix + "{" + so.slot + "}:" + name)
			}
			ki := addKey(prefix + "{" + so.slot + "}:" + name)
			sk.names[sk.n], sk.at[sk.n] = name, ki
			sk.n++
			return ki
		}
		markerAt := make(map[markerOf]int, len(idx))
		markerIndex := func(n int) int {
			it := items[n]
			mo := markerOf{it.group, it.slot}
			ki, ok := markerAt[mo]
			if !ok {
				ki = addKey(a.keys.MarkerKey(it.group, it.slot))
				markerAt[mo] = ki
			}
			markers[n] = keys[ki-1]
			return ki
		}
		registryAt := make(map[int64]int, len(idx))
		registryIndex := func(u int64) int {
			ki, ok := registryAt[u]
			if !ok {
				ki = addKey(a.keys.Registry(u))
				registryAt[u] = ki
			}
			return ki
		}
		sa := newScriptArgs(8 * len(idx))
		// Bounds first (registries, then markers), then the items; their counts precede them.
		var bnd []byte
		bounds := 0
		// Registries: copies older than the window before the floor may go.
		users := make(map[int64]bool, len(idx))
		for _, n := range idx {
			if it := items[n]; it.decide {
				users[works[it.work].Event.UserID] = true
			}
		}
		decided := slices.Sorted(maps.Keys(users))
		a.touchDecided(decided)
		for _, u := range decided {
			if bound, ok := a.registryBound(u); ok && a.pruneEvery > 0 && a.prunesRegistry(u, bound) {
				bnd = sa.put(bnd, registryIndex(u))
				bnd = sa.put(bnd, sa.ref(strconv.FormatInt(bound, 10)))
				bnd = sa.put(bnd, 1)
				bounds++
			}
		}
		if prune != nil {
			done := map[int]bool{}
			for _, n := range idx {
				it := items[n]
				mk := markerIndex(n)
				if done[mk] {
					continue
				}
				done[mk] = true
				before, ok := floors[it.group]
				if !ok {
					before, _ = prune(it.group)
					floors[it.group] = before
				}
				if sc, ok := markerBound(before); ok && before != "" {
					now := 0
					if a.pruneNow() {
						now = 1
					}
					bnd = sa.put(bnd, mk)
					bnd = sa.put(bnd, sa.ref(strconv.FormatInt(sc, 10)))
					bnd = sa.put(bnd, now)
					bounds++
				}
			}
		}
		packed := make([]byte, 0, 8+len(bnd)+48*len(idx))
		packed = sa.put(packed, sa.ref(windowArg))
		packed = sa.put(packed, leaseRef(sa))
		packed = sa.put(packed, bounds)
		packed = append(packed, bnd...)
		packed = sa.put(packed, len(idx))
		for _, n := range idx {
			it := items[n]
			w := works[it.work]
			rk := 0
			if it.decide {
				rk = registryIndex(w.Event.UserID)
			}
			packed = sa.put(packed, rk)
			packed = sa.put(packed, markerIndex(n))
			packed = sa.put(packed, sa.ref(strconv.FormatInt(w.Event.Identity, 10)))
			packed = sa.put(packed, sa.ref(strconv.FormatInt(scores[it.work], 10)))
			packed = sa.put(packed, len(it.refs))
			for _, r := range it.refs {
				w, u := works[r.work], works[r.work].Updates[r.update]
				so := slotOf{versionOf{w.Projection, w.Version}, u.Slot}
				sk := slotted[so]
				if sk == nil {
					slotKeysOf = append(slotKeysOf, slotKeys{})
					sk = &slotKeysOf[len(slotKeysOf)-1]
					slotted[so] = sk
				}
				if w.Event.LegacyID != "" {
					packed = sa.put(packed, nameIndex(sk, so, legacyKeyName))
					packed = sa.put(packed, sa.ref(w.Event.LegacyID))
				} else {
					packed = sa.put(packed, 0)
				}
				packed = sa.put(packed, len(u.Ops))
				read := readByRatios(u)
				for _, op := range u.Ops {
					code := opKindCode[op.Kind]
					switch {
					case read == nil:
					case op.Kind == projection.OpHIncrBy && slices.Contains(read, [2]string{op.Keys[0], op.Args[0]}):
						code = incrKept
					case op.Kind == projection.OpZIncrBy && slices.Contains(read, [2]string{op.Keys[0], op.Args[1]}):
						code = zincrKept
					}
					packed = sa.put(packed, code)
					for _, k := range op.Keys {
						packed = sa.put(packed, nameIndex(sk, so, k))
					}
					opArgs := op.Args
					if op.Kind == projection.OpHMaxBy {
						packed = sa.put(packed, (len(op.Args)-4)/2)
					} else {
						opArgs = opArgs[:opArity[op.Kind][1]]
					}
					for _, s := range opArgs {
						packed = sa.put(packed, sa.ref(s))
					}
				}
			}
		}
		cmds[c] = applyLua.EvalSha(ctx, pipe, keys, sa.finish(packed)...)
	}
	a.touch(items, markers)
	if err := a.exec(ctx, pipe, cmds, applyLua, "apply"); err != nil {
		for _, c := range cmds {
			if isLeaseExpired(c.Err()) {
				return nil, fmt.Errorf("apply projection updates: %w", projection.ErrLeaseExpired)
			}
		}
		return nil, culprit(err, works, cmds, calls, items)
	}
	for c, idx := range calls {
		vals, err := cmds[c].Int64Slice()
		if err != nil || len(vals) != len(idx) {
			return nil, fmt.Errorf("apply projection updates: unexpected reply %v: %w", cmds[c].Val(), err)
		}
		for m, n := range idx {
			st := int(vals[m])
			for _, r := range items[n].refs {
				switch {
				case st == itemApplied:
					states[r.work] = itemApplied
				case st == itemDuplicate && states[r.work] != itemApplied:
					states[r.work] = itemDuplicate
				}
			}
		}
	}
	// A copy given again answers as its first: a duplicate again is a duplicate (on a cluster
	// step 1 says so before any update; on a single server it is found in the same call).
	for i, first := range again {
		if states[first] == itemDuplicate {
			states[i] = itemDuplicate
		}
	}
	return states, nil
}

// leaseLua defines what the fenced scripts (applyScript, decideScript, parkLua) share:
// pastLease(lease), true when lease (a string, Redis ms; "0": none) is not 0 and Redis's clock
// has reached it (projection.WithLease), and leaseRefused(), the error they then return, before
// writing anything (isLeaseExpired).
const leaseLua = `
local function pastLease(lease)
  local l = tonumber(lease)
  if not l or l <= 0 then return false end
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) >= l
end
local function leaseRefused()
  return redis.error_reply('LEASEEXPIRED the consumer hold on these entries ran out')
end
`

// isLeaseExpired says whether err is a fenced script's refusal to write past the caller's lease.
func isLeaseExpired(err error) bool {
	return err != nil && strings.HasPrefix(err.Error(), "LEASEEXPIRED ")
}

// defaultChunk: script calls of about this many Redis commands (about 20 check-ins with the
// five shipped projections) take about a millisecond of Redis time, so the API's commands
// never wait long behind a batch, while the per-call cost is still shared. (A pipeline of such
// calls does not hold Redis either: it reads about one call at a time and serves other clients
// in between.)
const defaultChunk = 300

// group splits n items into script calls of about a.chunk commands (weight: an item's): in a
// cluster, one slot per call; on a single server, items of one key are not split.
func (a *ProjectionApplier) group(n int, key func(int) string, weight func(int) int) [][]int {
	var calls [][]int
	if !a.cluster {
		var cur []int
		w := 0
		for i := range n {
			if w >= a.chunk && key(i) != key(cur[len(cur)-1]) {
				calls, cur, w = append(calls, cur), nil, 0
			}
			cur = append(cur, i)
			w += weight(i)
		}
		return append(calls, cur)
	}
	type open struct{ call, weight int }
	bySlot := map[int]open{} // slot -> its open call
	for i := range n {
		s := KeySlot(key(i))
		o, ok := bySlot[s]
		if !ok || o.weight >= a.chunk {
			o = open{call: len(calls)}
			calls = append(calls, nil)
		}
		calls[o.call] = append(calls[o.call], i)
		o.weight += weight(i)
		bySlot[s] = o
	}
	return calls
}

// exec runs the pipelined script calls, sending again as EVAL (which loads the script) the
// calls whose server lost it: a restart, SCRIPT FLUSH, or on a cluster a promoted replica (Redis
// replicates a script's effects, not the script). Only those: on a cluster the other nodes'
// calls have landed, and running them again would report their works as applied before.
func (a *ProjectionApplier) exec(ctx context.Context, pipe redis.Pipeliner, cmds []*redis.Cmd, script *redis.Script, what string) error {
	_, err := pipe.Exec(ctx)
	if err == nil {
		return nil
	}
	var retry redis.Pipeliner
	for i, c := range cmds {
		if redis.HasErrorPrefix(c.Err(), "NOSCRIPT") {
			if retry == nil {
				retry = a.client.Pipeline()
			}
			// EVALSHA sha numkeys keys... args...: the same call as EVAL of the script's source.
			args := c.Args()
			cmds[i] = retry.Do(ctx, append([]any{"eval", scriptSource(script)}, args[2:]...)...)
		}
	}
	if retry != nil {
		_, _ = retry.Exec(ctx) // each call's own error is looked at below
	}
	for _, c := range cmds {
		if c.Err() != nil {
			return fmt.Errorf("%s projection updates: %w", what, c.Err())
		}
	}
	if retry == nil {
		return fmt.Errorf("%s projection updates: %w", what, err)
	}
	return nil
}

// failedAt is the suffix the apply script gives the error of a command that failed (its item is
// taken back): the item's place in the call and its update's (0: its markers), from 1.
var failedAt = regexp.MustCompile(` \(apply item ([0-9]+) update ([0-9]+)\)$`)

// culprit is err as a projection.WorkFailure naming the work whose update failed, when the
// first call that failed says which and the work has no update in another item. When the other
// items of what failed (on a cluster, other slots' calls) may have gone through, err is
// projection.ErrAppliedInPart: the work's, or the event's when no work is to blame (its marker
// failed). Otherwise err.
func culprit(err error, works []projection.Work, cmds []*redis.Cmd, calls [][]int, items []item) error {
	for c, cmd := range cmds {
		if cmd.Err() == nil {
			continue
		}
		m := failedAt.FindStringSubmatch(cmd.Err().Error())
		if m == nil {
			return err
		}
		it, _ := strconv.Atoi(m[1])
		u, _ := strconv.Atoi(m[2])
		if it < 1 || it > len(calls[c]) {
			return err
		}
		failed := calls[c][it-1]
		elsewhere := func(in func(n int) bool) bool {
			for n := range items {
				if n != failed && in(n) {
					return true
				}
			}
			return false
		}
		if u < 1 || u > len(items[failed].refs) {
			ev, g := works[items[failed].work].Event.EntryID, items[failed].group
			if elsewhere(func(n int) bool { return items[n].group == g && works[items[n].work].Event.EntryID == ev }) {
				return fmt.Errorf("%w: %w", projection.ErrAppliedInPart, err)
			}
			return err
		}
		w := items[failed].refs[u-1].work
		if elsewhere(func(n int) bool {
			return slices.ContainsFunc(items[n].refs, func(r updateRef) bool { return r.work == w })
		}) {
			return fmt.Errorf("%w: %w", projection.ErrAppliedInPart, err)
		}
		return &projection.WorkFailure{Work: w, Err: err}
	}
	return err
}

func scriptSource(s *redis.Script) string {
	switch s {
	case decideLua:
		return decideScript
	case applyLua:
		return applyScript
	}
	panic("adapters: unknown script")
}

// ApplyEvent runs projection p (version) on one event and applies what it made, with group's
// markers: how a parked event is replayed (under a group of its own), and a short way to feed a
// projection in tests. entryID is the event's stream entry ("" uses its recordedAt as the
// clock). It prunes nothing.
func (a *ProjectionApplier) ApplyEvent(ctx context.Context, group string, p projection.Projection, version int, e domain.CheckinRecorded, entryID string) (projection.Outcome, error) {
	return a.ApplyDecided(ctx, group, p, version, e, entryID, projection.Undecided)
}

// ApplyDecided is ApplyEvent for an event whose dedupe decision is known (a parked one): the
// registry is not asked again.
func (a *ProjectionApplier) ApplyDecided(ctx context.Context, group string, p projection.Projection, version int, e domain.CheckinRecorded, entryID string, d projection.Decision) (projection.Outcome, error) {
	updates, err := projection.Updates(ctx, p, e)
	if err != nil {
		return 0, err
	}
	if len(updates) == 0 {
		return projection.Ignored, nil
	}
	ref := projection.RefOf(e, entryID)
	ref.Decision = d
	out, err := a.Apply(ctx, []projection.Work{{Group: group, Projection: p.Name(), Version: version, Event: ref, Updates: updates}}, nil)
	if err != nil {
		return 0, err
	}
	return out[0], nil
}

// touch records the marker keys items were applied under (markers[n] is items[n]'s), for Sweep.
func (a *ProjectionApplier) touch(items []item, markers []string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for n, it := range items {
		ks, ok := a.touched[it.group]
		if !ok {
			ks = map[string]struct{}{}
			a.touched[it.group] = ks
		}
		if len(ks) < maxSweepKeys {
			ks[markers[n]] = struct{}{}
		}
	}
}

// touchDecided records users whose registries a call wrote, for SweepRegistries.
func (a *ProjectionApplier) touchDecided(users []int64) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, u := range users {
		if len(a.decided) >= maxSweepKeys {
			return
		}
		a.decided[u] = struct{}{}
	}
}

// maxSweepKeys bounds what the applier remembers for its sweeps (per group for markers, in all
// for registries): a service under load with no quiet moment would otherwise remember every
// user and location it ever touched. A set it does not remember keeps, until its next write
// prunes it, what the prunes in line let stay: markers of a few calls, a registry's window plus
// a checkpoint interval.
const maxSweepKeys = 1 << 16

// sweepScript prunes one marker set (or dedupe registry) below ARGV[1] and, if what is left is
// at most ARGV[2] members in Redis's large encoding, writes it again compact (ZRANGESTORE of the
// set onto itself: a new set, in the compact encoding when it is small enough). A set that once
// grew past zset-max-listpack-entries stays a skiplist, which Redis never converts back: on a
// cluster, where a group's markers are pruned below its slowest partition, the few markers a
// drain left in a location's or a leaderboard shard's set kept about 7 KiB each, against about
// 160 B compact (the bench's memory phase, 24 partitions on 3 masters). OBJECT ENCODING goes
// through pcall: a server without it (miniredis, behind the embedded quick start) only prunes.
//
// No command touches the set once a prune may have emptied it (and so deleted it): in a slot
// that is migrating, that fails half-way (see applyScript). The script used to delete the set
// and add its members again, which in such a slot deleted the set and failed at the first add,
// losing what the set held.
const sweepScript = `
local n = redis.call('ZCARD', KEYS[1]) - redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ARGV[1])
if n > 0 and n <= tonumber(ARGV[2]) and redis.pcall('OBJECT', 'ENCODING', KEYS[1]) == 'skiplist' then
  redis.call('ZRANGESTORE', KEYS[1], KEYS[1], 0, -1)
end
return n
`

// sweepCompactUpTo: half of zset-max-listpack-entries' default (128), so that a set written
// again stays compact while a few more markers arrive.
const sweepCompactUpTo = 64

// Sweep prunes, below before, the markers of group this applier wrote since the last sweep.
// Calls prune the sets they touch as they go; a quiet group needs this to let go of the markers
// of its last batches (the projector calls it once the group has caught up).
func (a *ProjectionApplier) Sweep(ctx context.Context, group, before string) (int, error) {
	score, ok := markerBound(before)
	if !ok {
		return 0, fmt.Errorf("sweep markers of %s: %q is not a stream entry ID", group, before)
	}
	a.mu.Lock()
	ks := a.touched[group]
	delete(a.touched, group)
	a.mu.Unlock()
	if len(ks) == 0 {
		return 0, nil
	}
	sets := make([]sweepSet, 0, len(ks))
	for k := range ks {
		sets = append(sets, sweepSet{k, score})
	}
	n, err := a.sweepSets(ctx, sets, sweepCompactUpTo)
	if err != nil {
		a.requeue(group, ks)
	}
	return n, err
}

// sweepSet is a set to prune below a score (exclusive).
type sweepSet struct {
	key   string
	below int64
}

// sweepSets runs sweepScript on sets, writing those left with at most compactUpTo members
// compact again, in pipelines of 500 calls; n is the calls sent. Sweeping is idempotent, so a
// caller that meets an error sweeps every set again next time.
func (a *ProjectionApplier) sweepSets(ctx context.Context, sets []sweepSet, compactUpTo int) (int, error) {
	n := 0
	for chunk := range slices.Chunk(sets, 500) {
		pipe := a.client.Pipeline()
		for _, s := range chunk {
			pipe.Eval(ctx, sweepScript, []string{s.key}, "("+strconv.FormatInt(s.below, 10), compactUpTo)
		}
		n += len(chunk)
		if _, err := pipe.Exec(ctx); err != nil {
			return n, err
		}
	}
	return n, nil
}

// registryCompactUpTo: zset-max-listpack-entries' default. A registry holds the window's
// identities of its user, which no later call removes while the user is quiet; written again
// compact, it is about a third of its size as a skiplist.
const registryCompactUpTo = 128

// SweepRegistries prunes, below the window before the current floors (SetRegistryFloors), the
// registries written since the last call, and writes those left small in Redis's compact
// encoding again. The calls that decide a user's check-in prune that user's registry, but
// with the floor of that moment, which trails a drain by a checkpoint: a user's registry kept
// what the drain's last checkpoint interval added besides the window, and, grown past the
// compact encoding during the drain, stayed a skiplist (the bench's memory phase at 2N: 562 KiB
// of registries for the window's 13,200 identities). The projector calls it once every group
// is quiet. Users whose floor is not known yet stay for the next call.
func (a *ProjectionApplier) SweepRegistries(ctx context.Context) (int, error) {
	a.mu.Lock()
	users := a.decided
	a.decided = map[int64]struct{}{}
	a.mu.Unlock()
	var later []int64
	sets := make([]sweepSet, 0, len(users))
	for u := range users {
		bound, ok := a.registryBound(u)
		if !ok || a.pruneEvery == 0 {
			later = append(later, u)
			continue
		}
		sets = append(sets, sweepSet{a.keys.Registry(u), bound})
	}
	n, err := a.sweepSets(ctx, sets, registryCompactUpTo)
	if err != nil {
		a.touchDecided(slices.Collect(maps.Keys(users)))
		return n, fmt.Errorf("sweep dedupe registries: %w", err)
	}
	a.touchDecided(later)
	return n, nil
}

func (a *ProjectionApplier) requeue(group string, ks map[string]struct{}) {
	a.mu.Lock()
	defer a.mu.Unlock()
	cur, ok := a.touched[group]
	if !ok {
		a.touched[group] = ks
		return
	}
	for k := range ks {
		cur[k] = struct{}{}
	}
}
