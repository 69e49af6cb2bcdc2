package bench

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/checkins/checkins/adapters"
	"github.com/checkins/checkins/app/projection"
	"github.com/checkins/checkins/domain"
)

// bookkeepingKeyNames are the last segments of projection keys that hold no read model (dedupe
// and similar state). The "no other entity" check skips them, since their slots need not be
// entities, and the memory breakdown labels them. Extend it when the store keeps more.
func bookkeepingKeyNames() []string { return []string{"seen"} }

func isBookkeepingKey(key string) bool {
	return slices.Contains(bookkeepingKeyNames(), key[strings.LastIndexByte(key, ':')+1:])
}

// expectedModel is what the read models must say about a set of check-ins, computed here from
// the check-ins themselves, independently of the projections. A check-in seen twice (a
// republished event has the same content) counts once.
type expectedModel struct {
	ids          map[int64]bool // identities counted
	users        map[int64]*userExpect
	locs         map[int64]*locExpect
	minTs, maxTs int64
}

type userExpect struct {
	num, last, seenAt int64
	lastTie           string
	checkins          []projection.RecentCheckin
}

type locExpect struct {
	num, stars int64
	daily      map[string]int64 // UTC day -> check-ins
}

func newExpectedModel() *expectedModel {
	return &expectedModel{ids: map[int64]bool{}, users: map[int64]*userExpect{}, locs: map[int64]*locExpect{}}
}

func (m *expectedModel) distinct() int { return len(m.ids) }

// add counts c unless a check-in of the same identity (checkinId and content) was counted: a
// checkinId that comes back with another body is another check-in.
func (m *expectedModel) add(c domain.Checkin) { m.addIdentified(c, c.Identity()) }

// addEvent counts e as the projections identify it (with the fingerprint of the request that
// recorded it, when it carries one).
func (m *expectedModel) addEvent(e domain.CheckinRecorded) { m.addIdentified(e.Checkin, e.Identity()) }

func (m *expectedModel) addIdentified(c domain.Checkin, identity int64) {
	if m.ids[identity] {
		return
	}
	m.ids[identity] = true
	m.count(c, true)
}

// addCopy counts e even when a copy of it was counted before: the caller judged it another
// check-in (beyond the dedupe window). RecentCheckins keeps one member for all of them, since
// the member is the content.
func (m *expectedModel) addCopy(e domain.CheckinRecorded) {
	identity := e.Identity()
	first := !m.ids[identity]
	m.ids[identity] = true
	m.count(e.Checkin, first)
}

func (m *expectedModel) count(c domain.Checkin, recent bool) {
	if len(m.ids) == 1 || c.Timestamp < m.minTs {
		m.minTs = c.Timestamp
	}
	if len(m.ids) == 1 || c.Timestamp > m.maxTs {
		m.maxTs = c.Timestamp
	}
	u := m.users[c.UserID]
	if u == nil {
		u = &userExpect{}
		m.users[c.UserID] = u
	}
	u.num++
	// The latest check-in wins; an equal timestamp is settled by the greater tie in byte order
	// ("<locationId> <starRating> <checkinId>"), as the projection does.
	rc := projection.RecentCheckin{CheckinID: c.ID, LocationID: c.LocationID, StarRating: c.StarRating, Timestamp: c.Timestamp}
	if tie := rc.Tie(); u.num == 1 || c.Timestamp > u.last || (c.Timestamp == u.last && tie > u.lastTie) {
		u.last, u.lastTie, u.seenAt = c.Timestamp, tie, c.LocationID
	}
	if recent {
		u.checkins = append(u.checkins, rc)
	}
	l := m.locs[c.LocationID]
	if l == nil {
		l = &locExpect{daily: map[string]int64{}}
		m.locs[c.LocationID] = l
	}
	l.num++
	l.stars += int64(c.StarRating)
	l.daily[utcDay(c.Timestamp)]++
}

func utcDay(ms int64) string { return time.UnixMilli(ms).UTC().Format(projection.DayLayout) }

// latest is what RecentCheckins keeps of a user in layout and how it lists them: the newest by
// timestamp, ties broken by the sorted-set member's bytes (the layout's encoding) for which are
// kept; listed newest first, equal timestamps the greater tie first (as users takes the
// latest).
func (u *userExpect) latest(layout int) []projection.RecentCheckin {
	s := slices.Clone(u.checkins)
	member := func(c projection.RecentCheckin) string { m, _ := c.Member(layout); return m }
	slices.SortFunc(s, func(a, b projection.RecentCheckin) int {
		if c := cmp.Compare(b.Timestamp, a.Timestamp); c != 0 {
			return c
		}
		return strings.Compare(member(b), member(a))
	})
	s = s[:min(len(s), projection.RecentCheckinsKept)]
	slices.SortStableFunc(s, func(a, b projection.RecentCheckin) int {
		if c := cmp.Compare(b.Timestamp, a.Timestamp); c != 0 {
			return c
		}
		return strings.Compare(b.Tie(), a.Tie())
	})
	return s
}

// problems collects the differences of one projection from concurrent checks: how many, and
// the first few.
type problems struct {
	mu    sync.Mutex
	n     int
	first []string
}

func (p *problems) add(format string, args ...any) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.n++
	if len(p.first) < 3 {
		p.first = append(p.first, fmt.Sprintf(format, args...))
	}
}

// slotRecorder passes reads on and remembers which slots and keys they touched: the entities
// the checks looked at, and their keys, for the "no other entity, no other key" check.
type slotRecorder struct {
	projection.Reader
	mu    sync.Mutex
	slots map[string]bool
	keys  map[string]bool // "<slot>}:<key>", as the key's name ends
}

func (r *slotRecorder) note(slot string, keys ...string) {
	r.mu.Lock()
	r.slots[slot] = true
	if r.keys == nil {
		r.keys = map[string]bool{}
	}
	for _, k := range keys {
		if k != "" {
			r.keys[slot+"}:"+k] = true
		}
	}
	r.mu.Unlock()
}

func (r *slotRecorder) HGetAll(ctx context.Context, slot, key string) (map[string]string, error) {
	r.note(slot, key)
	return r.Reader.HGetAll(ctx, slot, key)
}

func (r *slotRecorder) HMGet(ctx context.Context, slot, key string, fields ...string) ([]string, error) {
	r.note(slot, key)
	return r.Reader.HMGet(ctx, slot, key, fields...)
}

func (r *slotRecorder) HLen(ctx context.Context, slot, key string) (int64, error) {
	r.note(slot, key)
	return r.Reader.HLen(ctx, slot, key)
}

func (r *slotRecorder) ZRevRange(ctx context.Context, slot, key string, start, stop int64) ([]projection.Scored, error) {
	r.note(slot, key)
	return r.Reader.ZRevRange(ctx, slot, key, start, stop)
}

func (r *slotRecorder) ZRevRanges(ctx context.Context, reads []projection.RangeRead) ([][]projection.Scored, error) {
	for _, rd := range reads {
		r.note(rd.Slot, rd.Key)
	}
	return r.Reader.ZRevRanges(ctx, reads)
}

func (r *slotRecorder) ReadSlots(ctx context.Context, reads []projection.SlotRead) ([]projection.SlotValues, error) {
	for _, rd := range reads {
		r.note(rd.Slot, rd.Hash, rd.SortedSet)
	}
	return r.Reader.ReadSlots(ctx, reads)
}

// verifyWorkers is how many reads the checks keep in flight; b.reads pipelines them.
const verifyWorkers = 64

// parallel runs fn(0..n-1) on up to workers goroutines.
func parallel(n, workers int, fn func(i int)) {
	var next atomic.Int64
	var wg sync.WaitGroup
	for range min(workers, n) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := int(next.Add(1) - 1); i < n; i = int(next.Add(1) - 1) {
				fn(i)
			}
		}()
	}
	wg.Wait()
}

// verifyReadModels compares every selected projection's read model under keys, read through the
// projection's own queries and adapters.ProjectionReader (never the raw keys, whose layout is
// the store's business), with the independent computation; it also refuses entities no
// check-in mentioned.
func (b *bencher) verifyReadModels(ctx context.Context, keys adapters.KeySpace, want *expectedModel) (bool, string, error) {
	start := time.Now()
	defer func() {
		b.progress("checked the read models of %s against %d check-ins in %.1fs", keys.Prefix, want.distinct(), time.Since(start).Seconds())
	}()
	found := map[string]*problems{}
	seen := map[string]*slotRecorder{}
	var unchecked []string
	shipped := b.host.Projections(b.cfg)
	for _, name := range b.opts.Projections {
		i := slices.IndexFunc(shipped, func(p projection.Projection) bool { return p.Name() == name })
		rd := &slotRecorder{Reader: adapters.NewProjectionReader(b.reads, keys, name), slots: map[string]bool{}}
		pr := &problems{}
		found[name] = pr
		switch p := shipped[i].(type) {
		case projection.UserStats:
			checkUsers(ctx, p, rd, want, pr)
		case projection.LocationStats:
			checkLocations(ctx, p, rd, want, pr)
		case projection.Leaderboards:
			checkLeaderboards(ctx, p, rd, want, pr)
		case projection.RecentCheckins:
			checkRecent(ctx, p, rd, want, pr)
		case projection.DailyCheckins:
			checkDaily(ctx, p, rd, want, pr)
		default:
			unchecked = append(unchecked, name)
			continue
		}
		seen[name] = rd
	}
	if err := ctx.Err(); err != nil {
		return false, "", err
	}
	extra, err := b.extraSlots(ctx, keys, seen)
	if err != nil {
		return false, "", err
	}
	total := 0
	var parts []string
	for _, name := range b.opts.Projections {
		for _, s := range extra[name] {
			found[name].add("unexpected %s %s", name, s)
		}
		if pr := found[name]; pr.n > 0 {
			total += pr.n
			parts = append(parts, fmt.Sprintf("%s %d (%s)", name, pr.n, strings.Join(pr.first, "; ")))
		}
	}
	var detail string
	if len(unchecked) > 0 {
		detail = fmt.Sprintf("not checked (the bench has no independent computation for them): %s", strings.Join(unchecked, ", "))
	}
	if total == 0 {
		return true, detail, nil
	}
	d := fmt.Sprintf("%d differences from the independent computation over %d check-ins: %s", total, want.distinct(), strings.Join(parts, "; "))
	return false, strings.TrimPrefix(detail+"; "+d, "; "), nil
}

func checkUsers(ctx context.Context, p projection.UserStats, r projection.Reader, want *expectedModel, pr *problems) {
	ids := sortedKeys(want.users)
	parallel(len(ids), verifyWorkers, func(i int) {
		id, w := ids[i], want.users[ids[i]]
		got, err := p.Get(ctx, r, id)
		switch {
		case err != nil:
			pr.add("user %d: %v", id, err)
		case got.NumCheckins != w.num || got.LastCheckin != w.last || got.LastSeenAt != w.seenAt:
			pr.add("user %d: numCheckins/lastCheckin/lastSeenAt %d/%d/%d, want %d/%d/%d", id,
				got.NumCheckins, got.LastCheckin, got.LastSeenAt, w.num, w.last, w.seenAt)
		}
	})
}

func checkLocations(ctx context.Context, p projection.LocationStats, r projection.Reader, want *expectedModel, pr *problems) {
	ids := sortedKeys(want.locs)
	parallel(len(ids), verifyWorkers, func(i int) {
		id, w := ids[i], want.locs[ids[i]]
		avg := (2*w.stars + w.num) / (2 * w.num) // floor(stars/num + 0.5), exactly
		got, err := p.Get(ctx, r, id)
		switch {
		case err != nil:
			pr.add("location %d: %v", id, err)
		case got.NumCheckins != w.num || got.NumStars != w.stars || got.AverageStars != avg:
			pr.add("location %d: numCheckins/numStars/averageStars %d/%d/%d, want %d/%d/%d", id,
				got.NumCheckins, got.NumStars, got.AverageStars, w.num, w.stars, avg)
		}
	})
}

func checkRecent(ctx context.Context, p projection.RecentCheckins, r projection.Reader, want *expectedModel, pr *problems) {
	ids := sortedKeys(want.users)
	parallel(len(ids), verifyWorkers, func(i int) {
		id := ids[i]
		got, err := p.All(ctx, r, id) // all the set holds: more than it keeps is a difference too
		if err != nil {
			pr.add("recent check-ins of user %d: %v", id, err)
			return
		}
		exp := want.users[id].latest(got.Layout)
		if slices.Equal(got.Checkins, exp) {
			return
		}
		j := 0
		for j < min(len(got.Checkins), len(exp)) && got.Checkins[j] == exp[j] {
			j++
		}
		switch {
		case j < min(len(got.Checkins), len(exp)):
			pr.add("recent check-ins of user %d: #%d is %+v, want %+v", id, j+1, got.Checkins[j], exp[j])
		default:
			pr.add("recent check-ins of user %d: %d kept, want %d", id, len(got.Checkins), len(exp))
		}
	})
}

func checkDaily(ctx context.Context, p projection.DailyCheckins, r projection.Reader, want *expectedModel, pr *problems) {
	first := time.UnixMilli(want.minTs).UTC().Truncate(24 * time.Hour)
	last := time.UnixMilli(want.maxTs).UTC().Truncate(24 * time.Hour)
	// The days the check-ins cover, in ranges of at most what one read may ask for.
	var ranges [][2]string
	for f := first; !f.After(last); f = f.AddDate(0, 0, projection.MaxDailyRangeDays) {
		t := f.AddDate(0, 0, projection.MaxDailyRangeDays-1)
		if t.After(last) {
			t = last
		}
		ranges = append(ranges, [2]string{f.Format(projection.DayLayout), t.Format(projection.DayLayout)})
	}
	ids := sortedKeys(want.locs)
	parallel(len(ids), verifyWorkers, func(i int) {
		id, w := ids[i], want.locs[ids[i]]
		var total int64
		for _, rg := range ranges {
			got, err := p.Get(ctx, r, id, rg[0], rg[1])
			if err != nil {
				pr.add("daily check-ins of location %d: %v", id, err)
				return
			}
			for _, d := range got.Days {
				if d.Checkins != w.daily[d.Date] {
					pr.add("daily check-ins of location %d on %s: %d, want %d", id, d.Date, d.Checkins, w.daily[d.Date])
				}
			}
			total += got.Total
		}
		if total != w.num {
			pr.add("daily check-ins of location %d from %s to %s: %d in all, want %d", id, ranges[0][0], ranges[len(ranges)-1][1], total, w.num)
		}
		// Every day the read model holds, the days outside the check-ins' too.
		all, err := p.History(ctx, r, id)
		if err != nil {
			pr.add("daily check-ins of location %d: %v", id, err)
			return
		}
		for _, day := range slices.Sorted(maps.Keys(all)) {
			if n := all[day]; n != w.daily[day] {
				pr.add("daily check-ins of location %d on %s: %d, want %d", id, day, n, w.daily[day])
			}
		}
		for day, n := range w.daily {
			if _, ok := all[day]; !ok {
				pr.add("daily check-ins of location %d on %s: none, want %d", id, day, n)
			}
		}
	})
}

// checkLeaderboards reads each board at its largest size. Members of equal score may come in
// any order, so the values are compared rank by rank and each member against its own expected
// value.
func checkLeaderboards(ctx context.Context, p projection.Leaderboards, r projection.Reader, want *expectedModel, pr *problems) {
	limit := projection.MaxLeaderboardLimit
	type counted struct {
		id, n, stars int64
	}
	var locs, qualified, users []counted
	for id, l := range want.locs {
		locs = append(locs, counted{id, l.num, l.stars})
		if l.num >= max(p.MinCheckins, 1) {
			qualified = append(qualified, counted{id, l.num, l.stars})
		}
	}
	for id, u := range want.users {
		users = append(users, counted{id: id, n: u.num})
	}
	avg := func(c counted) float64 { return float64(c.stars) / float64(c.n) }
	slices.SortFunc(locs, func(a, b counted) int { return cmp.Compare(b.n, a.n) })
	slices.SortFunc(qualified, func(a, b counted) int { return cmp.Compare(avg(b), avg(a)) })
	slices.SortFunc(users, func(a, b counted) int { return cmp.Compare(b.n, a.n) })

	checkLocationBoard := func(by string, exp []counted, value func(projection.LeaderboardLocation) float64, expValue func(counted) float64) {
		rows, err := p.TopLocations(ctx, r, by, limit)
		if err != nil {
			pr.add("leaderboard of locations by %s: %v", by, err)
			return
		}
		exp = exp[:min(len(exp), limit)]
		if len(rows) != len(exp) {
			pr.add("leaderboard of locations by %s: %d rows, want %d", by, len(rows), len(exp))
		}
		dup := map[int64]bool{}
		for i, row := range rows {
			if i < len(exp) && value(row) != expValue(exp[i]) {
				pr.add("leaderboard of locations by %s: rank %d has %g, want %g", by, i+1, value(row), expValue(exp[i]))
			}
			l, ok := want.locs[row.LocationID]
			switch {
			case dup[row.LocationID]:
				pr.add("leaderboard of locations by %s: location %d listed twice", by, row.LocationID)
			case !ok:
				pr.add("leaderboard of locations by %s: location %d has no check-in", by, row.LocationID)
			case by == projection.ByRating && l.num < max(p.MinCheckins, 1):
				pr.add("leaderboard of locations by rating: location %d has %d check-ins, below the %d needed", row.LocationID, l.num, p.MinCheckins)
			case row.NumCheckins != l.num || row.AverageRating != float64(l.stars)/float64(l.num):
				pr.add("leaderboard of locations by %s: location %d has %d check-ins averaging %g, want %d averaging %g", by,
					row.LocationID, row.NumCheckins, row.AverageRating, l.num, float64(l.stars)/float64(l.num))
			}
			dup[row.LocationID] = true
		}
	}
	checkLocationBoard(projection.ByCheckins, locs, func(r projection.LeaderboardLocation) float64 { return float64(r.NumCheckins) },
		func(c counted) float64 { return float64(c.n) })
	checkLocationBoard(projection.ByRating, qualified, func(r projection.LeaderboardLocation) float64 { return r.AverageRating }, avg)

	rows, err := p.TopUsers(ctx, r, limit)
	if err != nil {
		pr.add("leaderboard of users: %v", err)
		return
	}
	users = users[:min(len(users), limit)]
	if len(rows) != len(users) {
		pr.add("leaderboard of users: %d rows, want %d", len(rows), len(users))
	}
	dup := map[int64]bool{}
	for i, row := range rows {
		if i < len(users) && row.NumCheckins != users[i].n {
			pr.add("leaderboard of users: rank %d has %d check-ins, want %d", i+1, row.NumCheckins, users[i].n)
		}
		u, ok := want.users[row.UserID]
		switch {
		case dup[row.UserID]:
			pr.add("leaderboard of users: user %d listed twice", row.UserID)
		case !ok:
			pr.add("leaderboard of users: user %d has no check-in", row.UserID)
		case row.NumCheckins != u.num:
			pr.add("leaderboard of users: user %d has %d check-ins, want %d", row.UserID, row.NumCheckins, u.num)
		}
		dup[row.UserID] = true
	}

	// Below the top 100 rows: every member of every board, against the expected ones.
	whole := func(board string, want map[int64]float64, exact bool) {
		zs, err := p.Board(ctx, r, board)
		if err != nil {
			pr.add("leaderboard %s: %v", board, err)
			return
		}
		seen := map[int64]bool{}
		prev := math.Inf(1)
		for _, z := range zs {
			id, err := strconv.ParseInt(z.Member, 10, 64)
			if err != nil {
				pr.add("leaderboard %s: member %q is not an ID", board, z.Member)
				continue
			}
			w, ok := want[id]
			switch {
			case seen[id]:
				pr.add("leaderboard %s: %d listed twice", board, id)
			case !ok:
				pr.add("leaderboard %s: %d is on it, and should not be", board, id)
			case exact && z.Score != w:
				pr.add("leaderboard %s: %d has %g, want %g", board, id, z.Score, w)
			case !exact && w > prev:
				pr.add("leaderboard %s: %d (average %g) is below one whose average is %g", board, id, w, prev)
			}
			seen[id] = true
			if ok {
				prev = w
			}
		}
		if len(seen) != len(want) {
			for id := range want {
				if !seen[id] {
					pr.add("leaderboard %s: %d is missing", board, id)
					break
				}
			}
			pr.add("leaderboard %s: %d members, want %d", board, len(seen), len(want))
		}
	}
	byCheckins, byRating, byUser := map[int64]float64{}, map[int64]float64{}, map[int64]float64{}
	for _, c := range locs {
		byCheckins[c.id] = float64(c.n)
	}
	for _, c := range qualified {
		byRating[c.id] = avg(c)
	}
	for id, u := range want.users {
		byUser[id] = float64(u.num)
	}
	whole(projection.ByCheckins, byCheckins, true)
	whole(projection.ByRating, byRating, false) // its score is the scaled average: the order is checked
	whole(projection.BoardUsers, byUser, true)
	// Every location's counts (its stars are what its rating is computed from), not only the top's.
	ids := sortedKeys(want.locs)
	got, err := p.Locations(ctx, r, ids)
	if err != nil {
		pr.add("leaderboard counts of the locations: %v", err)
	} else {
		for i, row := range got {
			if l := want.locs[ids[i]]; row.NumCheckins != l.num || row.AverageRating != float64(l.stars)/float64(l.num) {
				pr.add("leaderboard counts of location %d: %d check-ins averaging %g, want %d averaging %g", ids[i],
					row.NumCheckins, row.AverageRating, l.num, float64(l.stars)/float64(l.num))
			}
		}
	}
}

// extraSlots lists, per checked projection, the slots that hold read-model keys but were not
// read by the checks (e.g. a user no check-in mentioned: "entity user:9"), and the keys of the
// slots read that the checks did not read (one no projection writes: "key {user:1}:stats2").
// It walks the keys once; bookkeeping keys (bookkeepingKeyNames) are skipped.
func (b *bencher) extraSlots(ctx context.Context, keys adapters.KeySpace, read map[string]*slotRecorder) (map[string][]string, error) {
	prefixes := map[string]string{} // projection key prefix -> name
	versions := adapters.NewProjectionVersions(b.admin, keys)
	for name := range read {
		v, err := versions.Current(ctx, name)
		if err != nil {
			return nil, err
		}
		prefixes[keys.ProjectionPrefix(name, v)] = name
	}
	extra := map[string][]string{}
	err := scanKeys(ctx, b, keys.Prefix+":*", func(ks []string) error {
		for _, k := range ks {
			if isBookkeepingKey(k) {
				continue
			}
			for prefix, name := range prefixes {
				rest, ok := strings.CutPrefix(k, prefix)
				if !ok {
					continue
				}
				i, j := strings.Index(rest, "{"), strings.Index(rest, "}")
				if i != 0 || j < 0 {
					continue
				}
				switch slot, rd := rest[1:j], read[name]; {
				case !rd.slots[slot]:
					extra[name] = append(extra[name], "entity "+slot)
				case !rd.keys[rest[1:]]:
					extra[name] = append(extra[name], "key "+rest)
				}
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	for name, s := range extra {
		slices.Sort(s)
		extra[name] = slices.Compact(s)
	}
	return extra, nil
}

// scanKeys calls fn with every batch of keys matching pattern.
// On a cluster it scans every master, one after the other.
func scanKeys(ctx context.Context, b *bencher, pattern string, fn func([]string) error) error {
	nodes, err := nodeClients(ctx, b.admin)
	if err != nil {
		return err
	}
	for _, c := range nodes {
		var cursor uint64
		for {
			ks, next, err := c.Scan(ctx, cursor, pattern, 2000).Result()
			if err != nil {
				return fmt.Errorf("scan %s: %w", pattern, err)
			}
			if err := fn(ks); err != nil {
				return err
			}
			if cursor = next; cursor == 0 {
				break
			}
		}
	}
	return nil
}

func sortedKeys[V any](m map[int64]V) []int64 {
	out := make([]int64, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}
