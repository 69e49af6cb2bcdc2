package bench

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/checkins/checkins/adapters"
	"github.com/checkins/checkins/app/ops"
	"github.com/checkins/checkins/app/projection"
	"github.com/checkins/checkins/domain"
)

// drainData is the preloaded stream and what the read models must say once it is consumed,
// computed here from the generated events, independently of the projections.
type drainData struct {
	source adapters.KeySpace // whose stream partitions hold the preloaded entries; each drain run copies them
	// lastIDs is each source partition's last entry ID, by partition ("" for an empty one).
	lastIDs []string
	entries int
	want    *expectedModel
}

// preload writes N entries exactly as the publisher does (FlatMarshaller over the event's
// Fields), pipelined. One entry in a hundred republishes a recent check-in, as a retried publish
// would, so the counts also prove dedupe. Timestamps are distinct and shuffled: events arrive out
// of order, and no tie-break decides a user's latest check-in.
func (b *bencher) preload(ctx context.Context) (*drainData, error) {
	start := time.Now()
	n := b.opts.Events
	keys := b.keys(b.prefix("source"))
	parts := keys.Partitions()
	d := &drainData{source: keys, entries: n, want: newExpectedModel(), lastIDs: make([]string, parts.Count())}
	numUsers, numLocs := int64(max(n/10, 1)), int64(min(max(n/200, 1), 1000))
	rng := rand.New(rand.NewPCG(7, 11)) // #nosec G404 -- reproducible bench data, not a secret
	now := time.Now().UnixMilli()
	order := rng.Perm(n)
	recent := make([]domain.CheckinRecorded, 0, 1000)
	const batch = 1000
	for lo := 0; lo < n; lo += batch {
		pipe := b.admin.Pipeline()
		last := map[int]*redis.StringCmd{}
		for i := lo; i < min(lo+batch, n); i++ {
			var ev domain.CheckinRecorded
			if i%100 == 99 && len(recent) > 0 {
				ev = recent[rng.IntN(len(recent))]
			} else {
				ev = domain.CheckinRecorded{Checkin: domain.Checkin{
					ID: b.runID + "-e" + strconv.Itoa(i), UserID: 1 + rng.Int64N(numUsers), LocationID: 1 + rng.Int64N(numLocs),
					StarRating: rng.IntN(domain.MaxStarRating + 1), Timestamp: now - 60_000 - int64(order[i]),
				}, RecordedAt: now}
				if len(recent) < cap(recent) {
					recent = append(recent, ev)
				} else {
					recent[rng.IntN(len(recent))] = ev
				}
			}
			d.want.addEvent(ev)
			msg, err := adapters.NewEventMessage(ev.Fields(), b.runID+"-preload")
			if err != nil {
				return nil, err
			}
			pi := adapters.PartitionOf(ev.UserID, parts.Count())
			values, err := adapters.FlatMarshaller{}.Marshal(parts.Stream(pi), msg)
			if err != nil {
				return nil, err
			}
			last[pi] = pipe.XAdd(ctx, &redis.XAddArgs{Stream: parts.Stream(pi), Values: adapters.SortedXAddValues(values)})
		}
		if _, err := pipe.Exec(ctx); err != nil {
			return nil, fmt.Errorf("XADD to %s: %w", keys.Stream(), err)
		}
		for pi, cmd := range last {
			d.lastIDs[pi] = cmd.Val()
		}
	}
	b.progress("preloaded %d events (%d users, %d locations, 1%% republished) in %.1fs", n, len(d.want.users), len(d.want.locs), time.Since(start).Seconds())
	return d, nil
}

// PhaseDrain copies the preloaded stream under a fresh prefix, starts k consumers per
// projection (our projector instances, or raw go-redis readers for the baseline), and measures
// until every consumer group has read the last entry and has nothing pending.
func (b *bencher) PhaseDrain(ctx context.Context, data *drainData, k int, baseline bool) (PhaseResult, error) {
	phase, tag := PhaseDrain, "drain"
	if baseline {
		phase, tag = PhaseDrainBaseline, "drain-baseline"
	}
	keys := b.keys(b.prefix(fmt.Sprintf("%s-k%d", tag, k)))
	// COPY is server-side: every run starts from identical entries without paying the preload.
	// Partition i of every prefix has the same hash tag, so source and copy share a slot.
	lastIDs := map[string]string{}
	for i, src := range data.source.Partitions().Streams() {
		dst := keys.Partitions().Stream(i)
		lastIDs[dst] = data.lastIDs[i]
		if data.lastIDs[i] == "" {
			continue
		}
		if err := b.admin.Copy(ctx, src, dst, 0, false).Err(); err != nil {
			return PhaseResult{}, fmt.Errorf("COPY %s %s (needs Redis >= 6.2): %w", src, dst, err)
		}
	}
	defer func() {
		if _, err := deleteKeys(context.WithoutCancel(ctx), b.admin, keys.Prefix+":*"); err != nil {
			b.log.Warn("bench: could not delete drain keys", "prefix", keys.Prefix, "error", err)
		}
	}()
	// The groups that must catch up: those the consumers feed (so a group not created yet is
	// waited for), and whatever else XINFO GROUPS shows on the stream.
	var groups []string

	// The meter and the clock start once everything is built, just before consuming starts.
	var (
		m    *meter
		t0   time.Time
		stop func() error
		fail = make(chan error, 2*k*len(b.opts.Projections)+k)
	)
	if baseline {
		groups = append(groups, baselineGroup)
		m, t0 = b.startMeter(ctx), time.Now()
		stop = b.startBaselineConsumers(ctx, keys, k, fail)
	} else {
		services := make([]*runningService, 0, k)
		stop = func() error {
			var errs []error
			for _, s := range services {
				if err := s.stop(); err != nil {
					errs = append(errs, err)
				}
			}
			return errors.Join(errs...)
		}
		for i := range k {
			s, err := b.newService(ctx, keys.Prefix, Mode{Projections: true}, fmt.Sprintf("%s-k%d-%d", b.runID, k, i))
			if err != nil {
				_ = stop()
				return PhaseResult{}, err
			}
			services = append(services, s)
			groups = append(groups, s.groups()...)
		}
		slices.Sort(groups)
		groups = slices.Compact(groups)
		m, t0 = b.startMeter(ctx), time.Now()
		for _, s := range services {
			s.start(ctx)
			s.watch("projector", fail)
		}
	}
	elapsed, waitErr := b.waitDrained(ctx, lastIDs, groups, t0, fail)
	use := m.Stop()
	stopErr := stop()
	if waitErr != nil {
		return PhaseResult{}, waitErr
	}
	r := PhaseResult{Phase: phase, Consumers: k, Count: int64(data.entries), Seconds: elapsed.Seconds(), Unit: "events/s",
		Throughput: float64(data.entries) / elapsed.Seconds()}
	use.fill(&r)
	if err := b.checkReadModels(ctx, &r, keys, data.want, "the consumers", stopErr); err != nil {
		return PhaseResult{}, err
	}
	return r, nil
}

// waitDrained polls XINFO GROUPS on every partition in lastIDs (stream -> its last entry ID, ""
// for an empty one) until every group there, and at least those of want, has delivered the
// partition's last entry and has nothing pending. It gives up when nothing moved for 30s or a
// consumer failed.
func (b *bencher) waitDrained(ctx context.Context, lastIDs map[string]string, want []string, t0 time.Time, fail <-chan error) (time.Duration, error) {
	return b.waitGroups(ctx, lastIDs, want, false, t0, fail)
}

// waitGroups is waitDrained; with onlyWant it waits for the groups of want alone (a service the
// bench did not start may have others no process reads), and a group of want that is gone (a
// backfill's group, removed once it caught up) has nothing left to deliver.
func (b *bencher) waitGroups(ctx context.Context, lastIDs map[string]string, want []string, onlyWant bool, t0 time.Time, fail <-chan error) (time.Duration, error) {
	const stallAfter = 30 * time.Second
	var state string
	changed := time.Now()
	streams := slices.Sorted(maps.Keys(lastIDs))
	for {
		done := true
		var sb strings.Builder
		for _, stream := range streams {
			lastID := lastIDs[stream]
			infos, err := b.admin.XInfoGroups(ctx, stream).Result()
			if err != nil && !(lastID == "" && adapters.IsNoSuchKey(err)) {
				return 0, fmt.Errorf("XINFO GROUPS %s: %w", stream, err)
			}
			if lastID == "" {
				lastID = "0-0" // an empty partition: delivered nothing, owes nothing
			}
			if !onlyWant {
				if len(lastIDs) == 1 && len(infos) == 0 {
					done = false
				}
				for _, name := range want {
					if !slices.ContainsFunc(infos, func(g redis.XInfoGroup) bool { return g.Name == name }) {
						done = false
						fmt.Fprintf(&sb, "%s: %s not created yet; ", stream, name)
					}
				}
			}
			for _, g := range infos {
				if onlyWant && !slices.Contains(want, g.Name) {
					continue
				}
				// At or past the last entry: a target may have had other writers since.
				if ops.CompareEntryIDs(g.LastDeliveredID, lastID) < 0 || g.Pending != 0 {
					done = false
				}
				fmt.Fprintf(&sb, "%s: %s last-delivered %s pending %d; ", stream, g.Name, g.LastDeliveredID, g.Pending)
			}
		}
		at := time.Since(t0)
		if done {
			return at, nil
		}
		if s := sb.String(); s != state {
			state, changed = s, time.Now()
		} else if time.Since(changed) > stallAfter {
			return 0, fmt.Errorf("%w for %s (last entries %v): %s", errStalled, stallAfter, lastIDs, state)
		}
		select {
		case err := <-fail:
			return 0, err
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// anyEntry says whether some partition in lastIDs has an entry.
func anyEntry(lastIDs map[string]string) bool {
	for _, id := range lastIDs {
		if id != "" {
			return true
		}
	}
	return false
}

// lastEntryID is the ID of the stream's last entry, "" when it has none.
func lastEntryID(ctx context.Context, c redis.UniversalClient, stream string) (string, error) {
	ms, err := c.XRevRangeN(ctx, stream, "+", "-", 1).Result()
	if err != nil && !errors.Is(err, redis.Nil) {
		return "", fmt.Errorf("XREVRANGE %s: %w", stream, err)
	}
	if len(ms) == 0 {
		return "", nil
	}
	return ms[0].ID, nil
}

// startBaselineConsumers runs k raw readers of one consumer group feeding every projection;
// stop ends them.
func (b *bencher) startBaselineConsumers(ctx context.Context, keys adapters.KeySpace, k int, fail chan<- error) (stop func() error) {
	client, err := adapters.NewUniversalRedisClient(ctx, adapters.ClientOptions{URL: b.redis.url, TLS: b.redis.tls, DialTimeout: 2 * time.Second,
		ReadTimeout: 3 * time.Second, WriteTimeout: 3 * time.Second, PoolSize: 2*k + 4, Mode: b.redisMode()})
	if err != nil {
		fail <- err
		return func() error { return nil }
	}
	cfg := b.cfg
	cfg.Projections = b.opts.Projections
	projs, err := b.host.SelectProjections(cfg)
	if err != nil {
		fail <- err
		return client.Close
	}
	applier, err := adapters.NewProjectionApplier(client, keys, cfg.DedupeWindow)
	if err != nil {
		fail <- err
		return client.Close
	}
	rctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for i := range k {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := baselineConsumer{client: client, applier: applier, streams: keys.Partitions().Streams(), consumer: fmt.Sprintf("baseline-%d", i), projs: projs}
			if err := c.run(rctx, keys); err != nil {
				fail <- fmt.Errorf("baseline consumer %s: %w", c.consumer, err)
			}
		}()
	}
	return func() error {
		cancel()
		wg.Wait()
		return client.Close()
	}
}

// baselineGroup is the consumer group the baseline readers share.
const baselineGroup = "baseline"

// baselineConsumer is the raw limit: XREADGROUP COUNT 500 on one group, every projection's
// updates applied the way the service applies them (ProjectionApplier.Apply: a few script calls
// per batch), one XACK per batch; no Watermill, no middleware, no batching subscriber. With
// several stream partitions it reads them in turn, without blocking, and sleeps 1 ms after a
// round that found nothing.
type baselineConsumer struct {
	client   redis.UniversalClient
	applier  *adapters.ProjectionApplier
	streams  []string
	consumer string
	projs    []projection.Projection
}

func (c baselineConsumer) run(ctx context.Context, keys adapters.KeySpace) error {
	versions := adapters.NewProjectionVersions(c.client, keys)
	vs := make([]int, len(c.projs))
	for i, p := range c.projs {
		v, err := versions.Current(ctx, p.Name())
		if err != nil {
			return err
		}
		vs[i] = v
	}
	for _, stream := range c.streams {
		if err := c.client.XGroupCreateMkStream(ctx, stream, baselineGroup, "0").Err(); err != nil && !strings.HasPrefix(err.Error(), "BUSYGROUP") {
			return fmt.Errorf("XGROUP CREATE: %w", err)
		}
	}
	fields := map[string]string{}
	var ids []string
	var works []projection.Work
	block, empty := 100*time.Millisecond, 0
	if len(c.streams) > 1 {
		block = -1 // no BLOCK: the next partition may have entries
	}
	for turn := 0; ; turn++ {
		stream := c.streams[turn%len(c.streams)]
		if turn%len(c.streams) == 0 {
			if empty == len(c.streams) && len(c.streams) > 1 {
				time.Sleep(time.Millisecond)
			}
			empty = 0
		}
		res, err := c.client.XReadGroup(ctx, &redis.XReadGroupArgs{Group: baselineGroup, Consumer: c.consumer,
			Streams: []string{stream, ">"}, Count: 500, Block: block}).Result()
		if ctx.Err() != nil {
			return nil
		}
		if errors.Is(err, redis.Nil) || (err == nil && len(res) > 0 && len(res[0].Messages) == 0) {
			empty++
			continue
		}
		if err != nil {
			return fmt.Errorf("XREADGROUP: %w", err)
		}
		works, ids = works[:0], ids[:0]
		for _, s := range res {
			for _, m := range s.Messages {
				ids = append(ids, m.ID)
				clear(fields)
				for k, v := range m.Values {
					if s, ok := v.(string); ok {
						fields[k] = s
					}
				}
				ev, err := domain.ParseEvent(m.ID, fields)
				if err != nil {
					continue // never in the preloaded data; a real consumer would park it
				}
				e, ok := ev.(domain.CheckinRecorded)
				if !ok {
					continue
				}
				for i, p := range c.projs {
					us, err := projection.Updates(ctx, p, e)
					if err != nil {
						return err
					}
					if len(us) > 0 {
						works = append(works, projection.Work{Group: baselineGroup, Projection: p.Name(), Version: vs[i],
							Event: projection.RefOf(e, m.ID), Updates: us})
					}
				}
			}
		}
		if _, err := c.applier.Apply(ctx, works, nil); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		if len(ids) > 0 {
			if err := c.client.XAck(ctx, stream, baselineGroup, ids...).Err(); err != nil {
				if ctx.Err() != nil {
					return nil
				}
				return fmt.Errorf("XACK: %w", err)
			}
		}
	}
}

// checkReadModels sets r's check from the read models under keys against want, and from how
// stopping who (the consumers, the projector) went.
func (b *bencher) checkReadModels(ctx context.Context, r *PhaseResult, keys adapters.KeySpace, want *expectedModel, who string, stopErr error) error {
	ok, detail, err := b.verifyReadModels(ctx, keys, want)
	if err != nil {
		return fmt.Errorf("verify read models: %w", err)
	}
	if stopErr != nil {
		ok, detail = false, strings.TrimPrefix(detail+"; ", "; ")+"stopping "+who+" failed: "+stopErr.Error()
	}
	r.Check, r.CheckDetail = CheckOK, detail
	if !ok {
		r.Check = CheckMismatch
	}
	return nil
}
