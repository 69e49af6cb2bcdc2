package main

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/checkins/checkins/adapters"
	"github.com/checkins/checkins/app/projection"
)

// readKey is a projection key as the projection's read path names it: its slot and key.
type readKey struct{ slot, key string }

// recordingReader learns which key a projection's Get reads (and pretends it is empty), so the
// checks find the read models without copying the projections' key layout.
type recordingReader struct{ last readKey }

func (r *recordingReader) HGetAll(_ context.Context, slot, key string) (map[string]string, error) {
	r.last = readKey{slot, key}
	return map[string]string{}, nil
}

func (r *recordingReader) HMGet(_ context.Context, slot, key string, fields ...string) ([]string, error) {
	r.last = readKey{slot, key}
	return make([]string, len(fields)), nil
}

func (r *recordingReader) ZRevRange(_ context.Context, slot, key string, _, _ int64) ([]projection.Scored, error) {
	r.last = readKey{slot, key}
	return nil, nil
}

// prefetchedReader serves a projection's Get from hashes read in one pipeline.
type prefetchedReader map[readKey]map[string]string

func (p prefetchedReader) HGetAll(_ context.Context, slot, key string) (map[string]string, error) {
	return p[readKey{slot, key}], nil
}

func (p prefetchedReader) HMGet(_ context.Context, slot, key string, fields ...string) ([]string, error) {
	h := p[readKey{slot, key}]
	out := make([]string, len(fields))
	for i, f := range fields {
		out[i] = h[f]
	}
	return out, nil
}

func (p prefetchedReader) ZRevRange(context.Context, string, string, int64, int64) ([]projection.Scored, error) {
	return nil, fmt.Errorf("bench: sorted sets are not prefetched")
}

// viewGetter reads one entity's view through a projection's own Get.
type viewGetter func(ctx context.Context, r projection.Reader, id int64) error

// prefetch reads, pipelined, the hash that get reads for each id, from the projection's current
// version under keys.
func (b *bencher) prefetch(ctx context.Context, keys adapters.KeySpace, name string, ids []int64, get viewGetter) (prefetchedReader, map[string]bool, error) {
	version, err := adapters.NewProjectionVersions(b.admin, keys).Current(ctx, name)
	if err != nil {
		return nil, nil, err
	}
	out := prefetchedReader{}
	slots := map[string]bool{}
	rec := &recordingReader{}
	const chunk = 1000
	for lo := 0; lo < len(ids); lo += chunk {
		part := ids[lo:min(lo+chunk, len(ids))]
		rks := make([]readKey, len(part))
		hs := make([]*redis.MapStringStringCmd, len(part))
		pipe := b.admin.Pipeline()
		for i, id := range part {
			_ = get(ctx, rec, id) // "not found" from the empty recording reader
			rks[i] = rec.last
			slots[rec.last.slot] = true
			hs[i] = pipe.HGetAll(ctx, keys.ProjectionKey(name, version, rec.last.slot, rec.last.key))
		}
		if _, err := pipe.Exec(ctx); err != nil {
			return nil, nil, fmt.Errorf("read %s read model: %w", name, err)
		}
		for i, h := range hs {
			out[rks[i]] = h.Val()
		}
	}
	return out, slots, nil
}

// extraSlots lists the slots of projection name that hold keys but were not expected, e.g. a
// user the events never mentioned.
func (b *bencher) extraSlots(ctx context.Context, keys adapters.KeySpace, name string, want map[string]bool) ([]string, error) {
	version, err := adapters.NewProjectionVersions(b.admin, keys).Current(ctx, name)
	if err != nil {
		return nil, err
	}
	prefix := keys.ProjectionPrefix(name, version)
	var extra []string
	var cursor uint64
	for {
		ks, next, err := b.admin.Scan(ctx, cursor, prefix+"*", 2000).Result()
		if err != nil {
			return nil, fmt.Errorf("scan %s*: %w", prefix, err)
		}
		for _, k := range ks {
			rest := strings.TrimPrefix(k, prefix)
			if i, j := strings.Index(rest, "{"), strings.Index(rest, "}"); i == 0 && j > 0 {
				if slot := rest[1:j]; !want[slot] {
					extra = append(extra, slot)
				}
			}
		}
		if cursor = next; cursor == 0 {
			break
		}
	}
	slices.Sort(extra)
	return slices.Compact(extra), nil
}

// verifyReadModels compares every user's and location's view, read through the projections'
// own Get, with the independent computation; it also refuses entities nobody checked in at.
func (b *bencher) verifyReadModels(ctx context.Context, keys adapters.KeySpace, data *drainData) (bool, string, error) {
	var problems []string
	total := 0
	report := func(format string, args ...any) {
		total++
		if len(problems) < 5 {
			problems = append(problems, fmt.Sprintf(format, args...))
		}
	}

	users := projection.UserStats{}
	userIDs := sortedKeys(data.users)
	pre, slots, err := b.prefetch(ctx, keys, users.Name(), userIDs, func(ctx context.Context, r projection.Reader, id int64) error {
		_, err := users.Get(ctx, r, id)
		return err
	})
	if err != nil {
		return false, "", err
	}
	for _, id := range userIDs {
		want := data.users[id]
		got, err := users.Get(ctx, pre, id)
		switch {
		case err != nil:
			report("user %d: %v", id, err)
		case got.NumCheckins != want.num || got.LastCheckin != want.last || got.LastSeenAt != want.seenAt:
			report("user %d: numCheckins/lastCheckin/lastSeenAt %d/%d/%d, want %d/%d/%d", id,
				got.NumCheckins, got.LastCheckin, got.LastSeenAt, want.num, want.last, want.seenAt)
		}
	}
	extra, err := b.extraSlots(ctx, keys, users.Name(), slots)
	if err != nil {
		return false, "", err
	}
	for _, s := range extra {
		report("unexpected users entity %s", s)
	}

	locs := projection.LocationStats{}
	locIDs := sortedKeys(data.locs)
	pre, slots, err = b.prefetch(ctx, keys, locs.Name(), locIDs, func(ctx context.Context, r projection.Reader, id int64) error {
		_, err := locs.Get(ctx, r, id)
		return err
	})
	if err != nil {
		return false, "", err
	}
	for _, id := range locIDs {
		want := data.locs[id]
		avg := (2*want.stars + want.num) / (2 * want.num) // floor(stars/num + 0.5), exactly
		got, err := locs.Get(ctx, pre, id)
		switch {
		case err != nil:
			report("location %d: %v", id, err)
		case got.NumCheckins != want.num || got.NumStars != want.stars || got.AverageStars != avg:
			report("location %d: numCheckins/numStars/averageStars %d/%d/%d, want %d/%d/%d", id,
				got.NumCheckins, got.NumStars, got.AverageStars, want.num, want.stars, avg)
		}
	}
	if extra, err = b.extraSlots(ctx, keys, locs.Name(), slots); err != nil {
		return false, "", err
	}
	for _, s := range extra {
		report("unexpected locations entity %s", s)
	}

	if total == 0 {
		return true, "", nil
	}
	return false, fmt.Sprintf("%d differences from the independent count, first: %s", total, strings.Join(problems, "; ")), nil
}

func sortedKeys[V any](m map[int64]V) []int64 {
	out := make([]int64, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}
