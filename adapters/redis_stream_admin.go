package adapters

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill-redisstream/pkg/redisstream"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"

	"github.com/checkins/checkins/app/ops"
)

// ReadStreamInfo reads the stream's length and every group's state. A missing stream is not an
// error: Exists is false. A group destroyed between the reads (a rebuild drops its own group when
// its backfill ends, and retires the old version's) is left out: the answer is the groups that
// are there; so is a stream deleted between them (a partition migration deletes the old
// partitions): its groups are left out, or it reads as missing.
func ReadStreamInfo(ctx context.Context, client redis.UniversalClient, stream string) (ops.StreamInfo, error) {
	info := ops.StreamInfo{Stream: stream}
	xs, err := client.XInfoStream(ctx, stream).Result()
	if isNoSuchKey(err) {
		return info, nil
	}
	if err != nil {
		return info, fmt.Errorf("XINFO STREAM %s: %w", stream, err)
	}
	info.Exists, info.Length, info.LastEntryID, info.EntriesAdded = true, xs.Length, xs.LastGeneratedID, xs.EntriesAdded
	groups, err := client.XInfoGroups(ctx, stream).Result()
	if isNoSuchKey(err) { // deleted meanwhile (a partition migration's cleanup)
		return ops.StreamInfo{Stream: stream}, nil
	}
	if err != nil {
		return info, fmt.Errorf("XINFO GROUPS %s: %w", stream, err)
	}
	for _, g := range groups {
		gi := ops.GroupInfo{Name: g.Name, LastDeliveredID: fullEntryID(g.LastDeliveredID), EntriesRead: g.EntriesRead, Lag: g.Lag,
			Counted: g.Lag >= 0, Pending: g.Pending}
		if g.LastDeliveredID == xs.LastGeneratedID {
			// Delivered up to the last entry: no lag, whatever the server says. miniredis (the
			// embedded Redis of `serve`) reports the stream length as every group's lag, which
			// would make an idle service look stalled.
			gi.Lag = 0
		}
		cs, err := client.XInfoConsumers(ctx, stream, g.Name).Result()
		if isNoGroup(err) || isNoSuchKey(err) {
			continue
		}
		if err != nil {
			return info, fmt.Errorf("XINFO CONSUMERS %s %s: %w", stream, g.Name, err)
		}
		for _, c := range cs {
			gi.Consumers = append(gi.Consumers, ops.ConsumerInfo{Name: c.Name, Pending: c.Pending, Idle: c.Idle})
		}
		if g.Pending > 0 {
			// The summary gives the lowest pending ID; the extended form gives its idle time.
			sum, err := client.XPending(ctx, stream, g.Name).Result()
			if isNoGroup(err) || isNoSuchKey(err) {
				continue
			}
			if err != nil {
				return info, fmt.Errorf("XPENDING %s %s: %w", stream, g.Name, err)
			}
			gi.Pending = sum.Count
			if sum.Count > 0 {
				ext, err := client.XPendingExt(ctx, &redis.XPendingExtArgs{Stream: stream, Group: g.Name, Start: sum.Lower, End: sum.Lower, Count: 1}).Result()
				if isNoGroup(err) || isNoSuchKey(err) {
					continue
				}
				if err != nil {
					return info, fmt.Errorf("XPENDING %s %s %s: %w", stream, g.Name, sum.Lower, err)
				}
				gi.OldestPendingID = sum.Lower
				if len(ext) == 1 {
					gi.OldestPendingIdle, gi.OldestPendingDeliveries, gi.OldestPendingConsumer = ext[0].Idle, ext[0].RetryCount, ext[0].Consumer
				}
			}
		}
		info.Groups = append(info.Groups, gi)
	}
	return info, nil
}

// fullEntryID is id with its sequence number: miniredis (the embedded Redis of `serve`) names
// the last entry a group created at "0" delivered "0", where Redis says "0-0".
func fullEntryID(id string) string {
	if id != "" && !strings.Contains(id, "-") {
		return id + "-0"
	}
	return id
}

// EntryFields reads one stream entry's fields exactly as they were written.
func EntryFields(ctx context.Context, client redis.UniversalClient, stream, id string) (map[string]string, error) {
	xs, err := client.XRangeN(ctx, stream, id, id, 1).Result()
	if err != nil {
		return nil, fmt.Errorf("read entry %s of %s: %w", id, stream, err)
	}
	if len(xs) == 0 {
		return nil, fmt.Errorf("entry %s of %s is not in the stream", id, stream)
	}
	return stringFields(xs[0].Values), nil
}

// matchEntry reads the entries ids of stream and returns the ID of the first one match accepts
// ("" when none does).
func matchEntry(ctx context.Context, client redis.UniversalClient, stream string, ids []string, match func(values map[string]any) bool) (string, error) {
	cmds, err := client.Pipelined(ctx, func(p redis.Pipeliner) error {
		for _, id := range ids {
			p.XRangeN(ctx, stream, id, id, 1)
		}
		return nil
	})
	if err != nil {
		return "", fmt.Errorf("read pending entries of %s: %w", stream, err)
	}
	for _, c := range cmds {
		xs, _ := c.(*redis.XMessageSliceCmd).Result()
		if len(xs) == 1 && match(xs[0].Values) {
			return xs[0].ID, nil
		}
	}
	return "", nil
}

func stringFields(values map[string]any) map[string]string {
	out := make(map[string]string, len(values))
	for k, v := range values {
		out[k] = fmt.Sprint(v)
	}
	return out
}

// isNoGroup reports Redis's answer for a consumer group that does not exist (XINFO CONSUMERS,
// XPENDING, XREADGROUP).
func isNoGroup(err error) bool {
	return err != nil && strings.HasPrefix(err.Error(), "NOGROUP")
}

// IsNoSuchKey reports Redis's answer for a key that does not exist (XINFO STREAM, XINFO GROUPS).
func IsNoSuchKey(err error) bool { return isNoSuchKey(err) }

func isNoSuchKey(err error) bool {
	// XINFO says "no such key"; XGROUP DESTROY (and the other XGROUP subcommands) "requires the
	// key to exist": a new partition none of the stream's users map to has no stream, and a
	// migration positioning its groups there failed on it at every run (found by a review).
	return err != nil && !errors.Is(err, redis.Nil) &&
		(strings.Contains(err.Error(), "no such key") || strings.Contains(err.Error(), "requires the key to exist"))
}

// SameMessage reports whether a stream entry's values decode (with u) to msg: the same Watermill
// UUID when the entry has one, and the same payload and metadata.
func SameMessage(msg *message.Message, values map[string]any, u redisstream.Unmarshaller) bool {
	if id, ok := values[redisstream.UUIDHeaderKey].(string); ok && id != msg.UUID {
		return false
	}
	m, err := u.Unmarshal(values)
	if err != nil || !bytes.Equal(m.Payload, msg.Payload) {
		return false
	}
	for k, v := range m.Metadata {
		if msg.Metadata.Get(k) != v {
			return false
		}
	}
	return true
}

// StreamAdmin is the event stream as the ops use cases see it (ops.Stream): XINFO, XRANGE
// counts, consumer groups created and destroyed, XTRIM MINID.
//
// With stream partitions (KeySpace.WithPartitions) it stands for all of them, summed up: the
// length is the sum, a group's lag and pending the sums, its oldest pending entry the oldest
// (lowest ID) of any partition (GroupInfo.Parts has each partition's); groups are created and
// destroyed on every partition; Parts gives each partition's own StreamAdmin (retention trims
// each partition by itself).
type StreamAdmin struct {
	client redis.UniversalClient
	stream string
	parts  []*StreamAdmin // with more than one partition
}

var _ ops.Stream = (*StreamAdmin)(nil)

// NewStreamAdmin works on keys' partitions (keys.Stream() unless keys.WithPartitions).
func NewStreamAdmin(client redis.UniversalClient, keys KeySpace) *StreamAdmin {
	s := &StreamAdmin{client: client, stream: keys.Stream()}
	if ps := keys.Partitions(); ps.Count() > 1 {
		for _, p := range ps.Streams() {
			s.parts = append(s.parts, &StreamAdmin{client: client, stream: p})
		}
	}
	return s
}

// Name is the stream's key (with partitions, the key they are named after, and their count).
func (s *StreamAdmin) Name() string {
	if len(s.parts) > 0 {
		return fmt.Sprintf("%s (%d partitions)", s.stream, len(s.parts))
	}
	return s.stream
}

// Parts are the partitions' own admins (s itself with one stream).
func (s *StreamAdmin) Parts() []ops.Stream {
	if len(s.parts) == 0 {
		return []ops.Stream{s}
	}
	out := make([]ops.Stream, len(s.parts))
	for i, p := range s.parts {
		out[i] = p
	}
	return out
}

// Info implements ops.Stream.
func (s *StreamAdmin) Info(ctx context.Context) (ops.StreamInfo, error) {
	if len(s.parts) == 0 {
		return ReadStreamInfo(ctx, s.client, s.stream)
	}
	sum := ops.StreamInfo{Stream: s.Name()}
	type part struct {
		admin *StreamAdmin
		info  ops.StreamInfo
	}
	parts := make([]part, len(s.parts))
	names := []string{}
	seen := map[string]bool{}
	for i, p := range s.parts {
		info, err := ReadStreamInfo(ctx, p.client, p.stream)
		if err != nil {
			return sum, err
		}
		parts[i] = part{p, info}
		if !info.Exists {
			continue
		}
		sum.Exists = true
		sum.Length += info.Length
		sum.EntriesAdded += info.EntriesAdded
		if sum.LastEntryID == "" || ops.CompareEntryIDs(info.LastEntryID, sum.LastEntryID) > 0 {
			sum.LastEntryID = info.LastEntryID
		}
		for _, g := range info.Groups {
			if !seen[g.Name] {
				seen[g.Name] = true
				names = append(names, g.Name)
			}
		}
	}
	for _, name := range names {
		g := ops.GroupInfo{Name: name, Parts: map[string]ops.GroupInfo{}, Counted: true}
		consumers := map[string]int{}
		behind := ""
		for _, p := range parts {
			pg := p.info.Group(name)
			if pg == nil {
				if p.info.Exists {
					// The group is missing on this partition (a master that came back empty):
					// all of it is undelivered, as with one stream whose group is missing.
					g.Parts[p.info.Stream] = ops.GroupInfo{Name: name, LastDeliveredID: "0-0", Lag: p.info.Length, Missing: true}
					g.Lag += p.info.Length
					g.Counted = false
					if p.info.Length > 0 {
						behind = "0-0"
					}
				}
				continue
			}
			lag, err := ops.GroupLag(ctx, p.admin, p.info, pg)
			if err != nil {
				return sum, err
			}
			pg.Lag = lag
			g.Parts[p.info.Stream] = *pg
			g.Lag += lag
			g.Counted = g.Counted && pg.Counted
			g.Pending += pg.Pending
			g.EntriesRead += pg.EntriesRead
			if lag > 0 && (behind == "" || ops.CompareEntryIDs(pg.LastDeliveredID, behind) < 0) {
				behind = pg.LastDeliveredID
			}
			if pg.OldestPendingID != "" && (g.OldestPendingID == "" || ops.CompareEntryIDs(pg.OldestPendingID, g.OldestPendingID) < 0) {
				g.OldestPendingID, g.OldestPendingIdle = pg.OldestPendingID, pg.OldestPendingIdle
				g.OldestPendingDeliveries, g.OldestPendingConsumer = pg.OldestPendingDeliveries, pg.OldestPendingConsumer
			}
			for _, c := range pg.Consumers {
				if j, ok := consumers[c.Name]; ok {
					g.Consumers[j].Pending += c.Pending
					g.Consumers[j].Idle = min(g.Consumers[j].Idle, c.Idle)
					continue
				}
				consumers[c.Name] = len(g.Consumers)
				g.Consumers = append(g.Consumers, c)
			}
		}
		// Delivered up to the newest entry of the stream when no partition lags; otherwise where
		// the partition furthest behind is.
		g.LastDeliveredID = sum.LastEntryID
		if behind != "" {
			g.LastDeliveredID = behind
		}
		sum.Groups = append(sum.Groups, g)
	}
	return sum, nil
}

// CountAfter counts the entries after id (XRANGE), up to max (on every partition, summed).
func (s *StreamAdmin) CountAfter(ctx context.Context, id string, max int64) (int64, error) {
	if len(s.parts) > 0 {
		var n int64
		for _, p := range s.parts {
			c, err := p.CountAfter(ctx, id, max-n)
			if err != nil {
				return n, err
			}
			if n += c; n >= max {
				break
			}
		}
		return n, nil
	}
	xs, err := s.client.XRangeN(ctx, s.stream, "("+id, "+", max).Result()
	if err != nil {
		return 0, err
	}
	return int64(len(xs)), nil
}

// CreateGroup creates group at start (and the stream if missing) unless the group exists; on
// every partition.
func (s *StreamAdmin) CreateGroup(ctx context.Context, group, start string) error {
	for _, p := range s.parts {
		if err := p.CreateGroup(ctx, group, start); err != nil {
			return err
		}
	}
	if len(s.parts) > 0 {
		return nil
	}
	err := s.client.XGroupCreateMkStream(ctx, s.stream, group, start).Err()
	if err != nil && !strings.Contains(err.Error(), "BUSYGROUP") {
		return fmt.Errorf("create group %s: %w", group, err)
	}
	return nil
}

// DestroyGroup destroys group; a missing stream is not an error (nor a missing group: Redis
// answers 0 for it). Redis 7 says "requires the key to exist" for a missing stream, miniredis
// "no such key".
func (s *StreamAdmin) DestroyGroup(ctx context.Context, group string) error {
	for _, p := range s.parts {
		if err := p.DestroyGroup(ctx, group); err != nil {
			return err
		}
	}
	if len(s.parts) > 0 {
		return nil
	}
	err := s.client.XGroupDestroy(ctx, s.stream, group).Err()
	if err != nil && !strings.Contains(err.Error(), "no such key") && !strings.Contains(err.Error(), "requires the key to exist") {
		return fmt.Errorf("destroy group %s: %w", group, err)
	}
	return nil
}

// OldestIDs returns the IDs of up to n oldest entries (of all partitions, merged by ID).
// Starts is, per stream (each partition), the first ID a group created at "0" now would read.
func (s *StreamAdmin) Starts(ctx context.Context) (map[string]string, error) {
	admins := s.parts
	if len(admins) == 0 {
		admins = []*StreamAdmin{s}
	}
	out := make(map[string]string, len(admins))
	for _, a := range admins {
		info, err := a.client.XInfoStream(ctx, a.stream).Result()
		switch {
		case err != nil && strings.Contains(err.Error(), "no such key"):
			out[a.stream] = "0-1" // never written: every entry it will hold
		case err != nil:
			return nil, fmt.Errorf("XINFO STREAM %s: %w", a.stream, err)
		case info.Length > 0:
			out[a.stream] = info.FirstEntry.ID
		default:
			out[a.stream] = nextEntryID(info.LastGeneratedID)
		}
	}
	return out, nil
}

// nextEntryID is the least ID above id ("ms-seq").
func nextEntryID(id string) string {
	ms, seq, _ := strings.Cut(id, "-")
	n, err := strconv.ParseUint(seq, 10, 64)
	if err != nil {
		return id
	}
	return ms + "-" + strconv.FormatUint(n+1, 10)
}

func (s *StreamAdmin) OldestIDs(ctx context.Context, n int64) ([]string, error) {
	if len(s.parts) > 0 {
		var all []string
		for _, p := range s.parts {
			ids, err := p.OldestIDs(ctx, n)
			if err != nil {
				return nil, err
			}
			all = append(all, ids...)
		}
		slices.SortFunc(all, ops.CompareEntryIDs)
		return all[:min(int64(len(all)), n)], nil
	}
	xs, err := s.client.XRangeN(ctx, s.stream, "-", "+", n).Result()
	if err != nil {
		return nil, err
	}
	ids := make([]string, len(xs))
	for i, x := range xs {
		ids[i] = x.ID
	}
	return ids, nil
}

// TrimBelow is XTRIM MINID, at minID or below it where a consumer group needs more: the
// groups are read in the same script as the trim, so a group created (at "0", by a rebuild or a
// new projection's backfill) or one that got entries back pending since the caller read them
// holds the cut where it needs it. Without groups it trims nothing. It returns how many entries
// went and the cut it used (the highest of the partitions').
func (s *StreamAdmin) TrimBelow(ctx context.Context, minID string, maxAge time.Duration) (int64, string, error) {
	if len(s.parts) > 0 {
		var n int64
		var cut string
		for _, p := range s.parts {
			c, pc, err := p.TrimBelow(ctx, minID, maxAge)
			n += c
			if pc != "" && (cut == "" || ops.CompareEntryIDs(pc, cut) > 0) {
				cut = pc
			}
			if err != nil {
				return n, cut, err
			}
		}
		return n, cut, nil
	}
	if _, err := ops.ParseEntryID(minID); err != nil {
		return 0, "", fmt.Errorf("trim %s below %q: %w", s.stream, minID, err)
	}
	args := []any{minID}
	if maxAge > 0 {
		args = append(args, maxAge.Milliseconds())
	}
	res, err := trimBelowLua.Run(ctx, s.client, []string{s.stream}, args...).Slice()
	if err != nil {
		return 0, "", fmt.Errorf("XTRIM %s MINID %s: %w", s.stream, minID, err)
	}
	if len(res) != 2 {
		return 0, "", fmt.Errorf("XTRIM %s MINID %s: unexpected reply %v", s.stream, minID, res)
	}
	n, _ := res[0].(int64)
	cut, _ := res[1].(string)
	return n, cut, nil
}

// trimBelowLua trims KEYS[1] below ARGV[1] or below the lowest entry a group still needs: the
// one after its last-delivered entry, or its oldest pending one (TrimFloor's rule). IDs are
// compared as decimal strings, so no sequence number loses precision.
var trimBelowLua = redis.NewScript(`
local function lt(a, b)
  local am, as = string.match(a, '^(%d+)-(%d+)$')
  local bm, bs = string.match(b, '^(%d+)-(%d+)$')
  if #am ~= #bm then return #am < #bm end
  if am ~= bm then return am < bm end
  if #as ~= #bs then return #as < #bs end
  return as < bs
end
local function after(id)
  if not string.find(id, '-', 1, true) then return id .. '-1' end -- miniredis: "0" for 0-0
  local ms, seq = string.match(id, '^(%d+)-(%d+)$')
  if #seq > 15 then return id end -- one entry kept too many, never one too few
  return ms .. '-' .. string.format('%d', tonumber(seq) + 1)
end
if redis.call('EXISTS', KEYS[1]) == 0 then return {0, ''} end
local groups = redis.call('XINFO', 'GROUPS', KEYS[1])
if #groups == 0 then return {0, ''} end
local cut = ARGV[1]
if ARGV[2] then -- an age (ms): by this server's clock, which numbered the entries
  local t = redis.call('TIME')
  local ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) - tonumber(ARGV[2])
  local byAge = string.format('%d', math.max(ms, 0)) .. '-0'
  if lt(byAge, cut) then cut = byAge end
end
for _, g in ipairs(groups) do
  local name, last, pending
  for i = 1, #g, 2 do
    local k = g[i]
    if k == 'name' then name = g[i + 1]
    elseif k == 'last-delivered-id' then last = g[i + 1]
    elseif k == 'pending' then pending = tonumber(g[i + 1]) end
  end
  local need = after(last)
  if pending and pending > 0 then
    local p = redis.call('XPENDING', KEYS[1], name)
    if type(p[2]) == 'string' and lt(p[2], need) then need = p[2] end
  end
  if lt(need, cut) then cut = need end
end
return {redis.call('XTRIM', KEYS[1], 'MINID', cut), cut}
`)
