package adapters

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/checkins/checkins/app/command"
	"github.com/checkins/checkins/app/ops"
	"github.com/checkins/checkins/domain"
)

// Moving the event stream from P to N partitions (`checkins partitions migrate --to N`), the
// Redis side of command.MigratePartitions:
//
//   - The quiesce flag, <prefix>:meta field "quiesce", tells running processes to stop: the API
//     answers 503 (code migrating), projectors stop reading (QuiesceWatch, read every second).
//   - The progress, field "migrate" (JSON: from, to, phase, last copied entry), makes a rerun
//     carry on where a crashed run stopped.
//   - Copy: the old partitions are read merged in ID order (partition index breaking ties, as
//     the event log orders them) and each entry is XADDed to its new partition with its ID. An
//     entry is copied at most once because every pass starts from the beginning and works out,
//     for each entry, the ID it gets in its new partition: one at or below that partition's last
//     entry is there already. Two old partitions may hold one ID (N > 1 streams number their
//     entries independently); merged into one new partition the later of the two would break
//     the ID order, so it takes the next free ID (counted as renumbered).
//   - Position: every consumer group, live-group membership and acknowledged position of the
//     old partitions is translated to each new one: a group that had delivered everything up to
//     X_k on old partition k is, on new partition j, at the greatest entry of j such that every
//     entry of j up to it had been delivered (for 1 -> N: the greatest ID <= X). Merging
//     partitions where a group stood at different places leaves entries it had delivered after
//     one it had not (holes): the group then stands at the last delivered one, and the entries
//     it had not delivered before that are left pending, idle, for a projector to take over
//     (positionGroup).

// Meta fields of a migration.
const (
	metaQuiesce = "quiesce"
	// metaRequestTimeout is the longest REQUEST_TIMEOUT (ms) of an API process on the stream.
	metaRequestTimeout = "max_request_timeout_ms"
	metaMigrate        = "migrate"
)

// QuiescePoll is how often running processes look at the quiesce flag.
const QuiescePoll = time.Second

// PartitionMigrator is the Redis work of a migration (command.PartitionMigration).
type PartitionMigrator struct {
	client redis.UniversalClient
	keys   KeySpace
}

// NewPartitionMigrator works on keys' stream (its partitions are read from the meta key).
func NewPartitionMigrator(client redis.UniversalClient, keys KeySpace) *PartitionMigrator {
	keys.parts = nil
	return &PartitionMigrator{client: client, keys: keys}
}

var _ command.PartitionMigration = (*PartitionMigrator)(nil)

// Recorded is P as recorded (1 when nothing is: a stream of before partitions).
func (m *PartitionMigrator) Recorded(ctx context.Context) (int, error) {
	cur, err := m.client.HGet(ctx, m.keys.Meta(), metaPartitions).Result()
	if errors.Is(err, redis.Nil) {
		// No count recorded: the one stream of before partitions, if there is one. Without it
		// there is nothing to move, most likely a mistyped KEY_PREFIX, and recording a count
		// would make the next start with another STREAM_PARTITIONS refuse.
		n, err := m.client.Exists(ctx, m.keys.Stream()).Result()
		if err != nil {
			return 0, fmt.Errorf("read the event stream: %w", err)
		}
		if n == 0 {
			return 0, fmt.Errorf("nothing to migrate under KEY_PREFIX %q: no partition count in %s and no stream %s (is KEY_PREFIX right? a new deployment takes its count from STREAM_PARTITIONS at its first start)",
				m.keys.Prefix, m.keys.Meta(), m.keys.Stream())
		}
		return 1, nil
	}
	if err != nil {
		return 0, fmt.Errorf("read the event stream's partitions: %w", err)
	}
	p, err := strconv.Atoi(cur)
	if err != nil || p < 1 {
		return 0, fmt.Errorf("%s field %s is %q, not a partition count", m.keys.Meta(), metaPartitions, cur)
	}
	return p, nil
}

// Progress is the recorded progress (zero: no migration running).
func (m *PartitionMigrator) Progress(ctx context.Context) (command.MigrationProgress, error) {
	raw, err := m.client.HGet(ctx, m.keys.Meta(), metaMigrate).Result()
	if errors.Is(err, redis.Nil) {
		return command.MigrationProgress{}, nil
	}
	if err != nil {
		return command.MigrationProgress{}, fmt.Errorf("read the migration's progress: %w", err)
	}
	var p command.MigrationProgress
	if err := json.Unmarshal([]byte(raw), &p); err != nil {
		return command.MigrationProgress{}, fmt.Errorf("%s field %s is not a migration's progress: %w", m.keys.Meta(), metaMigrate, err)
	}
	return p, nil
}

// SaveProgress records p.
func (m *PartitionMigrator) SaveProgress(ctx context.Context, p command.MigrationProgress) error {
	raw, err := json.Marshal(p)
	if err != nil {
		return err
	}
	return m.client.HSet(ctx, m.keys.Meta(), metaMigrate, raw).Err()
}

// MaxRequestTimeout is the longest REQUEST_TIMEOUT an API process has recorded
// (QuiesceWatch.WithRequestTimeout); 0 when none has.
func (m *PartitionMigrator) MaxRequestTimeout(ctx context.Context) (time.Duration, error) {
	ms, err := m.client.HGet(ctx, m.keys.Meta(), metaRequestTimeout).Int64()
	if errors.Is(err, redis.Nil) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("read %s field %s: %w", m.keys.Meta(), metaRequestTimeout, err)
	}
	return time.Duration(ms) * time.Millisecond, nil
}

// Lock holds the migration (<prefix>:migrate-lock, a token with a TTL extended every ttl/3) for
// one run at a time; lost closes when the lock was taken from this run (it could not extend it
// for ttl). A run whose process died lets go after ttl.
func (m *PartitionMigrator) Lock(ctx context.Context, ttl time.Duration) (lost <-chan struct{}, release func(context.Context) error, ok bool, err error) {
	l, ok, err := acquireLease(ctx, m.client, m.keys.MigrateLock(), ttl)
	if err != nil {
		return nil, nil, false, fmt.Errorf("lock the migration (%s): %w", m.keys.MigrateLock(), err)
	}
	if !ok {
		return nil, nil, false, nil
	}
	return l.lost, l.release, true, nil
}

// migratingField marks the registry of every partition, old and new, while a migration runs
// (from its quiesce until it finishes or is called off): a join refuses it (MIGRATING). The
// migration checks the joins once its projectors stand still and then translates them; the
// quiesce flag stops projectors only as they poll it, and a projector started meanwhile joins at
// start, so a join would otherwise land after that check, or half of it (a join walks the
// partitions), and be translated as it was then. The marks go in the registries themselves, the
// keys a join script reads, so that a join cannot pass them.
const migratingField = "migrating"

// Quiesce sets the quiesce flag (reason is what processes report) and marks the registries of
// the partitions of from and of to as migrating.
func (m *PartitionMigrator) Quiesce(ctx context.Context, reason string, from, to int) error {
	if err := m.client.HSet(ctx, m.keys.Meta(), metaQuiesce, reason).Err(); err != nil {
		return err
	}
	return m.eachRegistry(from, to, func(reg string) error {
		if err := m.client.HSet(ctx, reg, migratingField, reason).Err(); err != nil {
			return fmt.Errorf("mark %s as migrating: %w", reg, err)
		}
		return nil
	})
}

// Finish clears the registries' migrating marks (of the partitions of from and of to), then the
// progress and the quiesce flag: cut short in between, the progress is still there, and the
// migration run again sets the marks again before it finishes.
func (m *PartitionMigrator) Finish(ctx context.Context, from, to int) error {
	err := m.eachRegistry(from, to, func(reg string) error {
		if err := m.client.HDel(ctx, reg, migratingField).Err(); err != nil {
			return fmt.Errorf("clear the migrating mark of %s: %w", reg, err)
		}
		return nil
	})
	if err != nil {
		return err
	}
	return m.client.HDel(ctx, m.keys.Meta(), metaMigrate, metaQuiesce).Err()
}

// eachRegistry runs do on the registry of every partition of from and of to.
func (m *PartitionMigrator) eachRegistry(from, to int, do func(reg string) error) error {
	for _, n := range []int{from, to} {
		parts, err := NewPartitions(m.keys, n)
		if err != nil {
			return err
		}
		for i := range parts.Count() {
			if err := do(parts.Registry(i)); err != nil {
				return err
			}
		}
	}
	return nil
}

// Layouts checks that from and to partitions can be told apart (no key shared by both).
func (m *PartitionMigrator) Layouts(from, to int) error {
	a, err := NewPartitions(m.keys, from)
	if err != nil {
		return err
	}
	b, err := NewPartitions(m.keys, to)
	if err != nil {
		return err
	}
	for _, s := range a.Streams() {
		if b.Index(s) >= 0 {
			return fmt.Errorf("the stream key %s belongs to both %d and %d partitions: migrate through another count first", s, from, to)
		}
	}
	return nil
}

// TargetsEmpty reports the new partitions that hold entries already (before a first copy).
func (m *PartitionMigrator) TargetsEmpty(ctx context.Context, to int) error {
	parts, err := NewPartitions(m.keys, to)
	if err != nil {
		return err
	}
	for _, s := range parts.Streams() {
		n, err := m.client.XLen(ctx, s).Result()
		if err != nil {
			return err
		}
		if n > 0 {
			return fmt.Errorf("the new partition %s holds %d entries already: it is not from this migration; remove it or choose another count", s, n)
		}
	}
	return nil
}

// Pending is every consumer group with pending entries on the partitions of from, as
// "<group> on <stream>: n".
func (m *PartitionMigrator) Pending(ctx context.Context, from int) ([]string, error) {
	parts, err := NewPartitions(m.keys, from)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, s := range parts.Streams() {
		gs, err := m.client.XInfoGroups(ctx, s).Result()
		if isNoSuchKey(err) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("XINFO GROUPS %s: %w", s, err)
		}
		for _, g := range gs {
			if g.Pending > 0 {
				out = append(out, fmt.Sprintf("%s on %s: %d pending", g.Name, s, g.Pending))
			}
		}
	}
	sort.Strings(out)
	return out, nil
}

// BackfillsSplit lists the projection versions still backfilling whose join positions on the
// partitions of from would not translate to to: merged, an entry above one old partition's join
// comes before an entry at or below another's in the same new partition. Position keeps one
// join per new partition, so the entries past that hole would change hands between the
// version's own group and the live group (lost to it, or applied twice). Entries added later
// are above every join, so the answer holds until a version joins or a backfill starts.
func (m *PartitionMigrator) BackfillsSplit(ctx context.Context, from, to int) ([]string, error) {
	src, err := NewPartitions(m.keys, from)
	if err != nil {
		return nil, err
	}
	reg, err := m.readRegistries(ctx, src, from)
	if err != nil {
		return nil, err
	}
	joins := map[string][]string{} // member -> its join on each old partition
	running := map[string]bool{}
	for _, per := range reg.lives {
		for k, ms := range per {
			for name, lm := range ms {
				if joins[name] == nil {
					joins[name] = make([]string, from)
				}
				joins[name][k] = lm.Join
				if lm.Own == ops.BackfillRunning {
					running[name] = true
				}
			}
		}
	}
	vecs := map[string]*vector{}
	var top ops.EntryID // past the highest join no entry is at or below one
	for name := range running {
		v, err := newVector(joins[name], to)
		if err != nil {
			return nil, err
		}
		vecs[name] = v
		for _, at := range v.at {
			if top.Less(at) {
				top = at
			}
		}
	}
	if len(vecs) == 0 || top == (ops.EntryID{}) {
		return nil, nil
	}
	ends := make([]string, from)
	for k := range ends {
		ends[k] = top.String()
	}
	if _, err := m.walk(ctx, from, to, 1000, ends, func(e migrateEntry) error {
		for _, v := range vecs {
			v.see(e)
		}
		return nil
	}); err != nil {
		return nil, err
	}
	var split []string
	for name, v := range vecs {
		if slices.ContainsFunc(v.holes, func(h []string) bool { return len(h) > 0 }) {
			split = append(split, name)
		}
	}
	slices.Sort(split)
	return split, nil
}

// JoinsUnsettled lists why the live groups' memberships on the partitions of from would not
// translate (empty: they would). Position writes each member into every new partition from its
// joins on the old ones, so:
//   - a member missing from some old partition (Redis lost its join there, and the router has
//     not joined it again yet) would become a member of every new one with that partition's
//     entries never applied to it, its backfill done: reads could switch to it without them;
//   - with more than one old partition, a live group that has not delivered up to a member's
//     join on some partition (it lagged when the member joined) would deliver, once the joins
//     are merged into one per new partition, entries the member's own group applied already:
//     counted twice.
//
// Both settle by themselves while the projectors run: the router joins a lost partition again
// within a poll, and the live group catches up.
func (m *PartitionMigrator) JoinsUnsettled(ctx context.Context, from int) ([]string, error) {
	src, err := NewPartitions(m.keys, from)
	if err != nil {
		return nil, err
	}
	reg, err := m.readRegistries(ctx, src, from)
	if err != nil {
		return nil, err
	}
	// A version a disband took out of its live group holds its position in its own group and a
	// moved record of the old partitions, which the copy does not translate: it joins first.
	var moved []string
	for name, group := range reg.moved {
		moved = append(moved, fmt.Sprintf("%s was taken out of live group %s by `checkins projections disband` and has joined no other yet (start a projector that runs it, or drop it: checkins projections drop %s)", name, group, name))
	}
	// Its own group is gone and its read model half removed: the copy would carry the mark of
	// the old partitions no further, and a join would then build on what is left.
	for name := range reg.dropping {
		moved = append(moved, fmt.Sprintf("%s is being dropped and its drop was cut short (run: checkins projections drop %s)", name, name))
	}
	// Its markers would outlive the mark, which the copy does not carry: a group of that name
	// made later would find them.
	for g := range reg.disbanding {
		moved = append(moved, fmt.Sprintf("live group %s was disbanded and removing its markers was cut short (run: checkins projections disband %s)", g, g))
	}
	sort.Strings(moved)
	delivered := make([]map[string]string, from) // per old partition: group -> last delivered
	for k := range from {
		delivered[k] = map[string]string{}
		gs, err := m.client.XInfoGroups(ctx, src.Stream(k)).Result()
		if isNoSuchKey(err) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("XINFO GROUPS %s: %w", src.Stream(k), err)
		}
		for _, g := range gs {
			delivered[k][g.Name] = fullEntryID(g.LastDeliveredID)
		}
	}
	if from <= 1 {
		return moved, nil // one registry: a member whose join was lost there is no member at all
	}
	out := moved
	for group, per := range reg.lives {
		members := map[string]bool{}
		for _, ms := range per {
			for name := range ms {
				members[name] = true
			}
		}
		for name := range members {
			var missing []string
			for k, ms := range per {
				lm, ok := ms[name]
				if !ok {
					missing = append(missing, strconv.Itoa(k))
					continue
				}
				last, ok := delivered[k][group]
				if ok && lm.Join != "" && ops.CompareEntryIDs(last, lm.Join) < 0 {
					out = append(out, fmt.Sprintf("live group %s has delivered up to %s on partition %d, below the join of %s there (%s)",
						group, last, k, name, lm.Join))
				}
			}
			if len(missing) > 0 {
				out = append(out, fmt.Sprintf("%s is not a member of live group %s on partition %s (Redis lost its join there?)",
					name, group, strings.Join(missing, ", ")))
			}
		}
	}
	sort.Strings(out)
	return out, nil
}

// migrateEntry is one entry of the old partitions, with the ID it gets in its new partition.
type migrateEntry struct {
	old   int // old partition
	id    ops.EntryID
	newID ops.EntryID
	to    int // new partition
	msg   redis.XMessage
}

// walk reads the partitions of from merged in ID order (partition index breaking ties) and
// calls f with each entry and its place in the layout of to, batch entries per read.
func (m *PartitionMigrator) walk(ctx context.Context, from, to, batch int, ends []string, f func(migrateEntry) error) (int64, error) {
	parts, err := NewPartitions(m.keys, from)
	if err != nil {
		return 0, err
	}
	type cursor struct {
		buf  []redis.XMessage
		next string // XRANGE start ("(" exclusive)
		done bool
	}
	cur := make([]cursor, from)
	end := make([]string, from) // XRANGE end: ends[i] (inclusive; "": the partition was empty) or the last entry
	for i := range cur {
		cur[i].next, end[i] = "-", "+"
		if ends != nil {
			if end[i] = ends[i]; end[i] == "" {
				cur[i].done = true
			}
		}
	}
	fill := func(i int) error {
		c := &cur[i]
		if len(c.buf) > 0 || c.done {
			return nil
		}
		msgs, err := m.client.XRangeN(ctx, parts.Stream(i), c.next, end[i], int64(batch)).Result()
		if err != nil {
			return fmt.Errorf("read %s: %w", parts.Stream(i), err)
		}
		if len(msgs) == 0 {
			c.done = true
			return nil
		}
		c.buf, c.next = msgs, "("+msgs[len(msgs)-1].ID
		return nil
	}
	last := make([]ops.EntryID, to) // the last ID given in each new partition
	var n int64
	for {
		best, bestID := -1, ops.EntryID{}
		for i := range cur {
			if err := fill(i); err != nil {
				return n, err
			}
			if len(cur[i].buf) == 0 {
				continue
			}
			id, err := ops.ParseEntryID(cur[i].buf[0].ID)
			if err != nil {
				return n, err
			}
			if best < 0 || id.Less(bestID) {
				best, bestID = i, id
			}
		}
		if best < 0 {
			return n, nil
		}
		msg := cur[best].buf[0]
		cur[best].buf = cur[best].buf[1:]
		e := migrateEntry{old: best, id: bestID, newID: bestID, to: newPartitionOf(msg.ID, msg.Values, to), msg: msg}
		if !last[e.to].Less(e.newID) {
			e.newID = last[e.to].Next()
		}
		last[e.to] = e.newID
		n++
		if err := f(e); err != nil {
			return n, err
		}
	}
}

// moveDecisionLua moves identity ARGV[1] in the dedupe registry KEYS[1] from score ARGV[2] to
// ARGV[3] if it is at ARGV[2]: the counted copy was renumbered. 1 when moved.
var moveDecisionLua = redis.NewScript(`
local cur = redis.call('ZSCORE', KEYS[1], ARGV[1])
if cur and tonumber(cur) == tonumber(ARGV[2]) then
  redis.call('ZADD', KEYS[1], 'XX', ARGV[3], ARGV[1])
  return 1
end
return 0
`)

// moveDecision sends, for a renumbered entry e, the move of its dedupe decision to the new ID
// (moveDecisionLua): the registry remembers the counted copy of a check-in by its entry's
// position, so a group that has not applied it yet (a rebuild behind the live group) would take
// it at its new ID for another copy and drop it. An entry that is not a check-in has none.
func (m *PartitionMigrator) moveDecision(ctx context.Context, c redis.Scripter, e migrateEntry) *redis.Cmd {
	c0, ok := checkinOf(e.msg.ID, e.msg.Values)
	if !ok {
		cmd := redis.NewCmd(ctx)
		cmd.SetVal(int64(0))
		return cmd
	}
	from, _ := ScoreOfEntry(e.id.String())
	to, _ := ScoreOfEntry(e.newID.String())
	return moveDecisionLua.Eval(ctx, c, []string{m.keys.Registry(c0.UserID)}, c0.Identity(), from, to) // Eval: it may go in a pipeline
}

// newPartitionOf is the partition of an entry among p: its user's, or 0 for an entry that is
// not a valid check-in.
func newPartitionOf(id string, values map[string]any, p int) int {
	c, ok := checkinOf(id, values)
	if !ok {
		return 0
	}
	return PartitionOf(c.UserID, p)
}

// checkinOf is the check-in a stream entry's values hold (ok false: none, or not valid).
func checkinOf(id string, values map[string]any) (domain.CheckinRecorded, bool) {
	f := make(map[string]string, len(values))
	for k, v := range values {
		s, _ := v.(string)
		f[k] = s
	}
	ev, err := domain.ParseEvent(id, f)
	if err != nil {
		return domain.CheckinRecorded{}, false
	}
	c, ok := ev.(domain.CheckinRecorded)
	return c, ok
}

// Copy copies every entry of the partitions of from into those of to (see above), batch
// entries per round trip; saved is called with the last entry copied after each batch.
func (m *PartitionMigrator) Copy(ctx context.Context, from, to, batch int, pause time.Duration, saved func(last string) error) (command.CopyResult, error) {
	dst, err := NewPartitions(m.keys, to)
	if err != nil {
		return command.CopyResult{}, err
	}
	tops := make([]ops.EntryID, to) // what each new partition holds already
	for j := range tops {
		last, err := m.client.XRevRangeN(ctx, dst.Stream(j), "+", "-", 1).Result()
		if err != nil {
			return command.CopyResult{}, err
		}
		if len(last) > 0 {
			if tops[j], err = ops.ParseEntryID(last[0].ID); err != nil {
				return command.CopyResult{}, err
			}
		}
	}
	var res command.CopyResult
	var pending []migrateEntry
	flush := func() error {
		if len(pending) == 0 {
			return nil
		}
		_, err := m.client.Pipelined(ctx, func(p redis.Pipeliner) error {
			for _, e := range pending {
				p.XAdd(ctx, &redis.XAddArgs{Stream: dst.Stream(e.to), ID: e.newID.String(), Values: SortedXAddValues(e.msg.Values)})
			}
			for _, e := range pending {
				if e.newID != e.id {
					m.moveDecision(ctx, p, e)
				}
			}
			return nil
		})
		if err != nil {
			return fmt.Errorf("copy entries: %w", err)
		}
		last := pending[len(pending)-1]
		pending = pending[:0]
		if err := saved(last.newID.String()); err != nil {
			return err
		}
		if pause > 0 {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(pause):
			}
		}
		return nil
	}
	res.Last = make([]string, from)
	n, err := m.walk(ctx, from, to, batch, nil, func(e migrateEntry) error {
		res.Last[e.old] = e.msg.ID
		if e.newID != e.id {
			res.Renumbered++
		}
		if !tops[e.to].Less(e.newID) {
			res.Skipped++        // copied by an earlier run
			if e.newID != e.id { // which may have stopped before its decision moved
				if err := m.moveDecision(ctx, m.client, e).Err(); err != nil {
					return fmt.Errorf("move the dedupe decision of %s: %w", e.id, err)
				}
			}
			return nil
		}
		res.Copied++
		pending = append(pending, e)
		if len(pending) >= batch {
			return flush()
		}
		return nil
	})
	res.Entries = n
	if err != nil {
		return res, err
	}
	return res, flush()
}

// groupState is one consumer group as the old partitions have it.
type groupState struct {
	delivered []string // per old partition, "" where the group is missing
	// pending entries per old partition (only with force): not acknowledged, so taken as not
	// delivered: they are delivered again on the new partition.
	pending []map[string]bool
}

// registryState is the live-group memberships and acknowledged positions of the old layout.
type registryState struct {
	lives map[string][]map[string]ops.LiveMember // live group -> per old partition -> member
	acked map[string][]string                    // group -> per old partition ("" missing)
	moved map[string]string                      // member -> the live group a disband took it out of
	// dropping: members whose drop (checkins projections drop) was begun and not finished.
	dropping map[string]bool
	// disbanding: live groups whose disband was cut short before their markers were removed.
	disbanding map[string]bool
}

// readRegistries reads the live groups' memberships and the acknowledged positions of the
// registries of the old partitions.
func (m *PartitionMigrator) readRegistries(ctx context.Context, src Partitions, from int) (registryState, error) {
	reg := registryState{lives: map[string][]map[string]ops.LiveMember{}, acked: map[string][]string{}, moved: map[string]string{},
		dropping: map[string]bool{}, disbanding: map[string]bool{}}
	for k := range from {
		h, err := m.client.HGetAll(ctx, src.Registry(k)).Result()
		if err != nil {
			return reg, err
		}
		for f, v := range h {
			if g, ok := strings.CutPrefix(f, liveField); ok {
				ms := map[string]ops.LiveMember{}
				if err := json.Unmarshal([]byte(v), &ms); err != nil {
					return reg, fmt.Errorf("live group %s on %s: %w", g, src.Registry(k), err)
				}
				if reg.lives[g] == nil {
					reg.lives[g] = make([]map[string]ops.LiveMember, from)
				}
				reg.lives[g][k] = ms
			} else if name, ok := strings.CutPrefix(f, movedField); ok {
				var mv ops.Moved
				_ = json.Unmarshal([]byte(v), &mv) // only named in a refusal
				reg.moved[name] = mv.From
			} else if name, ok := strings.CutPrefix(f, droppingField); ok {
				reg.dropping[name] = true
			} else if g, ok := strings.CutPrefix(f, disbandingField); ok {
				reg.disbanding[g] = true
			} else if g, ok := strings.CutPrefix(f, ackedField); ok {
				if reg.acked[g] == nil {
					reg.acked[g] = make([]string, from)
				}
				reg.acked[g][k] = v
			}
		}
	}
	return reg, nil
}

// vector is positions per old partition whose translation to each new partition is wanted.
type vector struct {
	at []ops.EntryID
	// per new partition: the translated position (the last entry of the prefix of delivered
	// entries), the entries up to it, whether an entry not delivered was met, the delivered
	// entries after that one (holes), and the entries pending on the old partitions (again).
	pos     []ops.EntryID
	count   []int64
	closed  []bool
	holes   [][]string
	again   [][]string
	present bool
	pending []map[string]bool // per old partition: entries pending (only with force)
}

func newVector(at []string, to int) (*vector, error) {
	v := &vector{at: make([]ops.EntryID, len(at)), pos: make([]ops.EntryID, to), count: make([]int64, to),
		closed: make([]bool, to), holes: make([][]string, to), again: make([][]string, to)}
	for i, s := range at {
		if s == "" || s == "0" {
			continue
		}
		v.present = true
		id, err := ops.ParseEntryID(s)
		if err != nil {
			return nil, err
		}
		v.at[i] = id
	}
	return v, nil
}

func (v *vector) see(e migrateEntry) {
	pending := v.pending != nil && v.pending[e.old][e.msg.ID]
	delivered := !v.at[e.old].Less(e.id) && !pending
	switch {
	case delivered && !v.closed[e.to]:
		v.pos[e.to], v.count[e.to] = e.newID, v.count[e.to]+1
	case delivered:
		v.holes[e.to] = append(v.holes[e.to], e.newID.String())
	case pending:
		v.closed[e.to] = true
		v.again[e.to] = append(v.again[e.to], e.newID.String())
	default:
		v.closed[e.to] = true
	}
}

// migrateConsumer owns, on a new partition, the entries a group had not delivered yet among
// entries it had (merged from several old partitions): projectors take them over at once.
const migrateConsumer = "partitions-migrate"

// Position translates every consumer group and the live-group registry of the old layout to
// the new one (see above) and reports the groups positioned. With force, groups may have
// entries pending: they are pending again on the new partitions (for migrateConsumer, taken
// over at once, as the redeliveries they are), and the poison queue's records of the units
// parked of them go with them (parkedOn).
//
// seen bounds what it reads of each old partition to what the copy read there (nil: all):
// entries a producer added after the copy are not in the new partitions yet, and the cleanup
// that copies them puts them after everything (copyTail), where no group has read.
func (m *PartitionMigrator) Position(ctx context.Context, from, to, batch int, force bool, seen []string) (command.PositionResult, error) {
	src, err := NewPartitions(m.keys, from)
	if err != nil {
		return command.PositionResult{}, err
	}
	dst, err := NewPartitions(m.keys, to)
	if err != nil {
		return command.PositionResult{}, err
	}
	groups := map[string]*groupState{}
	for k, s := range src.Streams() {
		gs, err := m.client.XInfoGroups(ctx, s).Result()
		if isNoSuchKey(err) {
			continue
		}
		if err != nil {
			return command.PositionResult{}, fmt.Errorf("XINFO GROUPS %s: %w", s, err)
		}
		for _, g := range gs {
			if g.Pending > 0 && !force {
				return command.PositionResult{}, fmt.Errorf("group %s has %d entries pending on %s: they must be acknowledged first", g.Name, g.Pending, s)
			}
			if groups[g.Name] == nil {
				groups[g.Name] = &groupState{delivered: make([]string, from), pending: make([]map[string]bool, from)}
			}
			groups[g.Name].delivered[k] = g.LastDeliveredID
			if g.Pending > 0 {
				pel, err := m.client.XPendingExt(ctx, &redis.XPendingExtArgs{Stream: s, Group: g.Name, Start: "-", End: "+", Count: g.Pending}).Result()
				if err != nil {
					return command.PositionResult{}, fmt.Errorf("XPENDING %s %s: %w", s, g.Name, err)
				}
				groups[g.Name].pending[k] = map[string]bool{}
				for _, pe := range pel {
					groups[g.Name].pending[k][pe.ID] = true
				}
			}
		}
	}
	reg, err := m.readRegistries(ctx, src, from)
	if err != nil {
		return command.PositionResult{}, err
	}
	// An own group missing on a partition where its member's backfill is done had delivered
	// everything up to the join there.
	running := map[string]bool{}  // own groups still backfilling somewhere
	leftover := map[string]bool{} // finished backfills whose group or leftovers were not removed yet
	type memberVecs struct{ join, legacy *vector }
	members := map[string]map[string]*memberVecs{} // live group -> member -> vectors
	var all []*vector
	add := func(at []string) (*vector, error) {
		v, err := newVector(at, to)
		if err == nil {
			all = append(all, v)
		}
		return v, err
	}
	for live, per := range reg.lives {
		members[live] = map[string]*memberVecs{}
		names := map[string]bool{}
		for _, ms := range per {
			for name := range ms {
				names[name] = true
			}
		}
		for name := range names {
			joins, legacies := make([]string, from), make([]string, from)
			for k, ms := range per {
				lm, ok := ms[name]
				if !ok {
					continue
				}
				joins[k], legacies[k] = lm.Join, lm.Legacy
				if lm.Removing != "" {
					leftover[name] = true
				}
				if lm.Own == ops.BackfillRunning {
					running[name] = true
				} else if g := groups[name]; g != nil && g.delivered[k] == "" {
					g.delivered[k] = lm.Join
				}
			}
			jv, err := add(joins)
			if err != nil {
				return command.PositionResult{}, err
			}
			lv, err := add(legacies)
			if err != nil {
				return command.PositionResult{}, err
			}
			members[live][name] = &memberVecs{join: jv, legacy: lv}
		}
	}
	groupVecs := map[string]*vector{}
	for name, g := range groups {
		if _, own := running[name]; !own && isOwnGroup(name, reg) {
			// A finished backfill's group, gone on the other partitions: not needed. What it
			// left (markers, an earlier layout's sets) is removed after the migration, as its
			// group would have been: the member is marked removing (below).
			leftover[name] = true
			continue
		}
		v, err := add(g.delivered)
		if err != nil {
			return command.PositionResult{}, err
		}
		v.pending = g.pending
		groupVecs[name] = v
	}
	ackedVecs := map[string]*vector{}
	for name, at := range reg.acked {
		v, err := add(at)
		if err != nil {
			return command.PositionResult{}, err
		}
		ackedVecs[name] = v
	}
	parked, err := m.parkedOn(ctx, src)
	if err != nil {
		return command.PositionResult{}, err
	}
	moved := map[string]any{} // the parked units' records on the new partitions
	if _, err := m.walk(ctx, from, to, batch, seen, func(e migrateEntry) error {
		for _, v := range all {
			v.see(e)
		}
		for _, r := range parked[src.Stream(e.old)+"\n"+e.id.String()] {
			u := r.unit
			u.Stream, u.Entry = dst.Stream(e.to), e.newID.String()
			moved[parkedField(u)] = r.poisonID
		}
		return nil
	}); err != nil {
		return command.PositionResult{}, err
	}
	// Before any group is positioned: an entry it delivers again on its new partition is one
	// whose units some projections parked, and they must leave those to the replay.
	if len(moved) > 0 {
		if err := m.client.HSet(ctx, m.keys.PoisonParked(), moved).Err(); err != nil {
			return command.PositionResult{}, fmt.Errorf("carry the parked units' records over to the new partitions: %w", err)
		}
	}
	res := command.PositionResult{Groups: len(groupVecs)}
	for _, v := range groupVecs {
		for _, h := range v.holes {
			if len(h) > 0 {
				res.Holes++
			}
		}
	}
	for j := range to {
		stream := dst.Stream(j)
		for name, v := range groupVecs {
			if err := m.positionGroup(ctx, stream, name, v.pos[j], v.count[j], v.holes[j], v.again[j], batch); err != nil {
				return res, fmt.Errorf("position group %s on %s: %w", name, stream, err)
			}
		}
		fields := map[string]any{}
		for live, ms := range members {
			out := map[string]ops.LiveMember{}
			for name, vs := range ms {
				lm := ops.LiveMember{Join: vs.join.pos[j].String(), Own: ops.BackfillDone}
				if running[name] {
					lm.Own = ops.BackfillRunning
				} else {
					lm.DoneAt = strconv.FormatInt(time.Now().UnixMilli(), 10)
				}
				if vs.legacy.present {
					lm.Legacy = vs.legacy.pos[j].String()
				}
				if leftover[name] && !running[name] {
					// Held by no run (since 0): the first run of a projector takes it up.
					lm.Removing = "migration 0"
				}
				out[name] = lm
			}
			raw, err := json.Marshal(out)
			if err != nil {
				return res, err
			}
			fields[liveField+live] = string(raw)
		}
		for name, v := range ackedVecs {
			if v.present {
				fields[ackedField+name] = v.pos[j].String()
			}
		}
		if len(fields) > 0 {
			if err := m.client.HSet(ctx, dst.Registry(j), fields).Err(); err != nil {
				return res, err
			}
		}
	}
	return res, nil
}

// parkedRecord is the record of a parked unit (PoisonQueue.Park): the unit and its poison entry.
type parkedRecord struct {
	unit     ops.UnitRef
	poisonID string
}

// parkedOn reads the records of the parked units of the partitions of src, by "<stream>\n<entry
// ID>". A record names its entry by stream and ID; an entry a group had pending is delivered
// again on its new partition (with --force), so its record is carried over with it (Position):
// without it, a projection that had parked its unit would apply it there, and the unit's
// replay would count it a second time. The old partitions' records go with their streams
// (SweepParked).
func (m *PartitionMigrator) parkedOn(ctx context.Context, src Partitions) (map[string][]parkedRecord, error) {
	streams := map[string]bool{}
	for _, s := range src.Streams() {
		streams[s] = true
	}
	out := map[string][]parkedRecord{}
	var cursor uint64
	for {
		kvs, next, err := m.client.HScan(ctx, m.keys.PoisonParked(), cursor, "", 500).Result()
		if err != nil {
			return nil, fmt.Errorf("read the parked units' records: %w", err)
		}
		for i := 0; i+1 < len(kvs); i += 2 {
			u, ok := parseParkedField(kvs[i])
			if ok && streams[u.Stream] {
				k := u.Stream + "\n" + u.Entry
				out[k] = append(out[k], parkedRecord{unit: u, poisonID: kvs[i+1]})
			}
		}
		if cursor = next; cursor == 0 {
			return out, nil
		}
	}
}

// positionGroup (re)creates group on stream at pos, with count entries up to it. holes are
// entries after pos the group had delivered on the old partitions: the group then stands at the
// last of them, the entries in between that it had not delivered are pending for
// migrateConsumer, idle long enough for a projector to take them over at once, and the holes are
// acknowledged. Every entry is so delivered exactly once over the two layouts. again are
// entries after pos the group had pending on the old partitions (a migration with --force):
// the group stands at least at the last of them, and they are pending for migrateConsumer too,
// so that a projector takes them over as the redeliveries they are: it asks whether a
// projection parked its unit of one (Position carries the records over), where a first
// delivery is not asked about.
func (m *PartitionMigrator) positionGroup(ctx context.Context, stream, group string, pos ops.EntryID, count int64, holes, again []string, batch int) error {
	if err := m.client.XGroupDestroy(ctx, stream, group).Err(); err != nil && !isNoSuchKey(err) {
		return err
	}
	if err := m.client.Do(ctx, "XGROUP", "CREATE", stream, group, pos.String(), "MKSTREAM", "ENTRIESREAD", count).Err(); err != nil {
		return err
	}
	var last ops.EntryID // 0-0: neither
	for _, ids := range [][]string{holes, again} {
		if len(ids) == 0 {
			continue
		}
		id, err := ops.ParseEntryID(ids[len(ids)-1])
		if err != nil {
			return err
		}
		if last.Less(id) {
			last = id
		}
	}
	if last == (ops.EntryID{}) {
		return nil
	}
	delivered := make(map[string]bool, len(holes))
	for _, h := range holes {
		delivered[h] = true
	}
	var acks, waiting []string
	read := count
	for done := false; !done; {
		res, err := m.client.XReadGroup(ctx, &redis.XReadGroupArgs{Group: group, Consumer: migrateConsumer,
			Streams: []string{stream, ">"}, Count: int64(batch), Block: -1}).Result()
		if errors.Is(err, redis.Nil) || err == nil && (len(res) == 0 || len(res[0].Messages) == 0) {
			break
		}
		if err != nil {
			return err
		}
		for _, msg := range res[0].Messages {
			id, err := ops.ParseEntryID(msg.ID)
			if err != nil {
				return err
			}
			switch {
			case last.Less(id): // beyond: to be delivered as any new entry
				acks, done = append(acks, msg.ID), true
			case delivered[msg.ID]:
				acks, read = append(acks, msg.ID), read+1
			default:
				waiting, read = append(waiting, msg.ID), read+1
			}
		}
	}
	for i := 0; i < len(acks); i += 1000 {
		if err := m.client.XAck(ctx, stream, group, acks[i:min(len(acks), i+1000)]...).Err(); err != nil {
			return err
		}
	}
	if err := m.client.Do(ctx, "XGROUP", "SETID", stream, group, last.String(), "ENTRIESREAD", read).Err(); err != nil {
		return err
	}
	for i := 0; i < len(waiting); i += 1000 {
		args := []any{"XCLAIM", stream, group, migrateConsumer, 0}
		for _, id := range waiting[i:min(len(waiting), i+1000)] {
			args = append(args, id)
		}
		args = append(args, "IDLE", int64((24 * time.Hour).Milliseconds()), "JUSTID")
		if err := m.client.Do(ctx, args...).Err(); err != nil {
			return err
		}
	}
	return nil
}

// isOwnGroup: name is a member (a version's own group) of some live group.
func isOwnGroup(name string, reg registryState) bool {
	for _, per := range reg.lives {
		for _, ms := range per {
			if _, ok := ms[name]; ok {
				return true
			}
		}
	}
	return false
}

// WaitReplicas waits until n replicas of the master of every new partition (to) have everything
// written to it so far, within timeout each: the copy goes to new partitions, often on other
// masters than the old ones, and the old ones (replicated long ago) are deleted next. A WAIT
// counts only its own connection's writes, so each is sent right after a write of its own to the
// partition's registry (field migrate-synced), on the partition's master: the master replicates
// in order, so that write is the last of the copy's.
func (m *PartitionMigrator) WaitReplicas(ctx context.Context, to, n int, timeout time.Duration) error {
	dst, err := NewPartitions(m.keys, to)
	if err != nil {
		return err
	}
	for j := range to {
		key := dst.Registry(j)
		node := redis.Cmdable(m.client)
		if cc, ok := m.client.(*redis.ClusterClient); ok {
			master, err := cc.MasterForKey(ctx, key)
			if err != nil {
				return fmt.Errorf("the master of %s: %w", key, err)
			}
			node = master
		}
		var wait *redis.IntCmd
		_, err := node.Pipelined(ctx, func(p redis.Pipeliner) error {
			p.HSet(ctx, key, "migrate-synced", time.Now().UnixMilli())
			wait = redis.NewIntCmd(ctx, "wait", n, timeout.Milliseconds())
			_ = p.Process(ctx, wait)
			return nil
		})
		if err != nil {
			return fmt.Errorf("WAIT %d on %s: %w", n, dst.Stream(j), err)
		}
		if got := wait.Val(); got < int64(n) {
			return fmt.Errorf("%w: %s: %d of %d replicas confirmed within %s", domain.ErrNotReplicated, dst.Stream(j), got, n, timeout)
		}
	}
	return nil
}

// Record records to as the stream's partition count.
func (m *PartitionMigrator) Record(ctx context.Context, to int) error {
	return m.client.HSet(ctx, m.keys.Meta(), metaPartitions, to).Err()
}

// deleteIfLastLua deletes the stream KEYS[1] if its last entry is ARGV[1] ("" for none), in
// one step, so that nothing added after that look is deleted with it; 0 when it is not. A
// stream that is gone already (a cleanup that stopped after deleting it) counts as deleted.
var deleteIfLastLua = redis.NewScript(`
if redis.call('EXISTS', KEYS[1]) == 0 then return 1 end
local last = redis.call('XREVRANGE', KEYS[1], '+', '-', 'COUNT', 1)
local id = ''
if #last > 0 then id = last[1][1] end
if id ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1])
return 1
`)

// tailField is the field of a new partition's registry that says up to which entry of old
// partition k the tail copy (copyTail) has written there.
func tailField(k int) string { return "migrate-tail:" + strconv.Itoa(k) }

// maxTailCopies bounds how often one old partition's tail is copied while entries keep coming.
const maxTailCopies = 5

// Cleanup deletes the old partitions' streams and their registry state (live groups and
// acknowledged positions; with one stream the other fields of the projections registry stay).
// With seen (per old partition, the last entry the copy read; nil: none is looked for), an old
// stream is deleted only if that is still its last entry, in one step; entries after it (the
// API and the projectors stand still, a producer writing to the stream directly does not) are
// first copied to their new partitions (copyTail), and late counts them.
func (m *PartitionMigrator) Cleanup(ctx context.Context, from, to int, seen []string) (int64, error) {
	src, err := NewPartitions(m.keys, from)
	if err != nil {
		return 0, err
	}
	dst, err := NewPartitions(m.keys, to)
	if err != nil {
		return 0, err
	}
	if seen != nil && len(seen) != from {
		return 0, fmt.Errorf("cleanup of %d partitions: the last entries of %d were given", from, len(seen))
	}
	var late int64
	for k := range from {
		if seen == nil {
			if err := m.client.Del(ctx, src.Stream(k)).Err(); err != nil {
				return late, err
			}
		} else {
			after := seen[k]
			for attempt := 0; ; attempt++ {
				deleted, err := deleteIfLastLua.Run(ctx, m.client, []string{src.Stream(k)}, after).Int()
				if err != nil {
					return late, fmt.Errorf("delete %s: %w", src.Stream(k), err)
				}
				if deleted == 1 {
					break
				}
				if attempt == maxTailCopies {
					return late, fmt.Errorf("entries keep arriving in %s after the copy: a producer is writing to the stream directly; stop it and rerun `checkins partitions migrate --to %d` (nothing is lost)", src.Stream(k), to)
				}
				n, last, err := m.copyTail(ctx, src.Stream(k), k, after, dst)
				late += n
				if err != nil {
					return late, err
				}
				after = last
			}
		}
		if from > 1 {
			if err := m.client.Del(ctx, src.Registry(k)).Err(); err != nil {
				return late, err
			}
			continue
		}
		fs, err := m.client.HKeys(ctx, src.Registry(k)).Result()
		if err != nil {
			return late, err
		}
		var drop []string
		for _, f := range fs {
			if strings.HasPrefix(f, liveField) || strings.HasPrefix(f, ackedField) || strings.HasPrefix(f, seenField) {
				drop = append(drop, f)
			}
		}
		if len(drop) > 0 {
			if err := m.client.HDel(ctx, src.Registry(k), drop...).Err(); err != nil {
				return late, err
			}
		}
	}
	if seen != nil {
		fields := make([]string, from)
		for k := range from {
			fields[k] = tailField(k)
		}
		for j := range to {
			if err := m.client.HDel(ctx, dst.Registry(j), fields...).Err(); err != nil {
				return late, err
			}
		}
	}
	return late, nil
}

// copyTailLua adds an entry to a new partition (KEYS[1]) with ID ARGV[1] and the fields from
// ARGV[4] on and, only if that worked, sets field ARGV[2] of its registry (KEYS[2], the same
// slot) to the entry's old ID ARGV[3]. (A MULTI would set the field even when the XADD failed.)
var copyTailLua = redis.NewScript(`
local id = redis.pcall('XADD', KEYS[1], ARGV[1], unpack(ARGV, 4))
if type(id) == 'table' and id.err then return id end
redis.call('HSET', KEYS[2], ARGV[2], ARGV[3])
return id
`)

// copyTail copies the entries of old partition k (stream) after `after` to their new
// partitions, each after what its partition holds (with its ID when that is greater, the next
// free one otherwise). Each XADD sets the new partition registry's tailField(k) in the same
// script (copyTailLua), so a rerun after a crash skips what was written: nothing is copied
// twice. It returns the entries written and the last one read.
func (m *PartitionMigrator) copyTail(ctx context.Context, stream string, k int, after string, dst Partitions) (int64, string, error) {
	tops := map[int]ops.EntryID{}
	done := map[int]ops.EntryID{} // per new partition, the last entry of k copied there
	top := func(j int) (ops.EntryID, ops.EntryID, error) {
		if t, ok := tops[j]; ok {
			return t, done[j], nil
		}
		var t, d ops.EntryID
		last, err := m.client.XRevRangeN(ctx, dst.Stream(j), "+", "-", 1).Result()
		if err != nil {
			return t, d, err
		}
		if len(last) > 0 {
			if t, err = ops.ParseEntryID(last[0].ID); err != nil {
				return t, d, err
			}
		}
		if v, err := m.client.HGet(ctx, dst.Registry(j), tailField(k)).Result(); err == nil {
			if d, err = ops.ParseEntryID(v); err != nil {
				return t, d, fmt.Errorf("%s %s: %w", dst.Registry(j), tailField(k), err)
			}
		} else if !errors.Is(err, redis.Nil) {
			return t, d, err
		}
		tops[j], done[j] = t, d
		return t, d, nil
	}
	start := "-"
	if after != "" {
		start = "(" + after
	}
	var n int64
	last := after
	for {
		msgs, err := m.client.XRangeN(ctx, stream, start, "+", 1000).Result()
		if err != nil {
			return n, last, fmt.Errorf("read %s: %w", stream, err)
		}
		if len(msgs) == 0 {
			return n, last, nil
		}
		for _, msg := range msgs {
			id, err := ops.ParseEntryID(msg.ID)
			if err != nil {
				return n, last, err
			}
			j := newPartitionOf(msg.ID, msg.Values, dst.Count())
			t, d, err := top(j)
			if err != nil {
				return n, last, err
			}
			if !d.Less(id) && d != (ops.EntryID{}) {
				last = msg.ID // copied by an earlier run
				continue
			}
			newID := id
			if !t.Less(id) {
				newID = t.Next()
			}
			args := make([]any, 0, 3+2*len(msg.Values))
			args = append(args, newID.String(), tailField(k), msg.ID)
			for f, v := range msg.Values {
				args = append(args, f, v)
			}
			if err := copyTailLua.Run(ctx, m.client, []string{dst.Stream(j), dst.Registry(j)}, args...).Err(); err != nil {
				return n, last, fmt.Errorf("copy %s %s to %s: %w", stream, msg.ID, dst.Stream(j), err)
			}
			if newID != id {
				if err := m.moveDecision(ctx, m.client, migrateEntry{id: id, newID: newID, msg: msg}).Err(); err != nil {
					return n, last, fmt.Errorf("move the dedupe decision of %s: %w", msg.ID, err)
				}
			}
			tops[j], done[j] = newID, id
			n++
			last = msg.ID
		}
		start = "(" + last
	}
}
