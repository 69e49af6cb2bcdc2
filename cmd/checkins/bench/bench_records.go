package bench

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"
	"golang.org/x/sync/errgroup"

	"github.com/checkins/checkins/adapters"
	"github.com/checkins/checkins/app/command"
	"github.com/checkins/checkins/app/ops"
	"github.com/checkins/checkins/domain"
)

// maxPreloadRecords bounds --preload-records: 100 million records take about 21 GB of Redis.
const maxPreloadRecords = 100_000_000

// The records' population and how they are written.
const (
	preloadUsers     = 10_000
	preloadLocations = 1_000
	preloadBatch     = 2_000 // SETs per pipeline
	preloadWorkers   = 4     // pipelines in flight
	preloadReport    = 1_000_000
)

// RecordsPreload is what --preload-records wrote before the first phase.
type RecordsPreload struct {
	Records int `json:"records"`
	// Keys is how many keys Redis holds more than before (DBSIZE, summed over the masters): the
	// records, unless some expired or other clients wrote meanwhile.
	Keys int64 `json:"keys_added"`
	// UsedMemory is the growth of used_memory, and BytesPerRecord that over Records.
	UsedMemory     int64   `json:"used_memory_bytes"`
	BytesPerRecord float64 `json:"bytes_per_record"`
	TTLSeconds     float64 `json:"ttl_seconds"`
	Seconds        float64 `json:"seconds"`
}

// preloadRecords writes n idempotency records under the run's "records" prefix, as the API
// stores a published check-in in the compact format (adapters.PublishedRecord), under the key
// the service would use (the stream partitions' tags on a cluster). They are the check-ins of
// the last IDEMPOTENCY_TTL at an even rate: record i is (n-i)/n of the TTL old and expires when
// the rest of its TTL runs out, so that Redis holds what a deployment at its steady state holds
// and expires them as it would. The API never reads them: what they cost the phases is the size
// of the key and expires tables every command's lookup goes through.
func (b *bencher) preloadRecords(ctx context.Context, n int) (*RecordsPreload, error) {
	ttl := b.cfg.IdempotencyTTL
	if ttl <= 0 {
		return nil, fmt.Errorf("IDEMPOTENCY_TTL is %s: the records would not expire", ttl)
	}
	keys := b.keys(b.prefix("records"))
	mem0, keys0, err := b.footprint(ctx)
	if err != nil {
		return nil, err
	}
	start := time.Now()
	now := start.UnixMilli()
	ttlMs := ttl.Milliseconds()
	// age(i) = ttlMs x (n-i) / (n+1), exact without the product (which a TTL of years and 100
	// million records would overflow): 0 <= age < ttlMs, so every record has 1 ms or more left.
	q, rem := ttlMs/int64(n+1), ttlMs%int64(n+1)
	var next, done atomic.Int64
	g, gctx := errgroup.WithContext(ctx)
	for range preloadWorkers {
		g.Go(func() error {
			for {
				lo := int(next.Add(preloadBatch)) - preloadBatch
				if lo >= n {
					return nil
				}
				hi := min(lo+preloadBatch, n)
				_, err := b.admin.Pipelined(gctx, func(p redis.Pipeliner) error {
					for i := lo; i < hi; i++ {
						age := q*int64(n-i) + rem*int64(n-i)/int64(n+1)
						rec := preloadRecord(i, now-age)
						v, err := adapters.PublishedRecord(rec, ops.RecordFormatCompact)
						if err != nil {
							return err
						}
						p.Set(gctx, keys.Idempotency(rec.Checkin.UserID, rec.Checkin.ID), v, time.Duration(ttlMs-age)*time.Millisecond)
					}
					return nil
				})
				if err != nil {
					return fmt.Errorf("writing idempotency records: %w", err)
				}
				if d := done.Add(int64(hi - lo)); d/preloadReport != (d-int64(hi-lo))/preloadReport {
					b.progress("preloading idempotency records: %d of %d", d, n)
				}
			}
		})
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}
	r := &RecordsPreload{Records: n, TTLSeconds: ttl.Seconds(), Seconds: time.Since(start).Seconds()}
	mem1, keys1, err := b.footprint(ctx)
	if err != nil {
		return nil, err
	}
	r.UsedMemory, r.Keys = mem1-mem0, keys1-keys0
	r.BytesPerRecord = float64(r.UsedMemory) / float64(n)
	return r, nil
}

// preloadRecord is the i-th preloaded check-in, recorded at recordedAt with a server-made
// checkinId and the client's timestamp a second earlier.
func preloadRecord(i int, recordedAt int64) command.IdempotencyRecord {
	user, location, rating, ts := int64(1+i%preloadUsers), int64(1+(i/7)%preloadLocations), int64(i%6), recordedAt-1000
	in := domain.CheckinInput{UserID: &user, LocationID: &location, StarRating: &rating, Timestamp: &ts}
	return command.IdempotencyRecord{Fingerprint: in.Fingerprint(), RecordedAt: recordedAt, ReservedAt: recordedAt, Published: true,
		Checkin: domain.Checkin{ID: uuid.NewString(), UserID: user, LocationID: location, StarRating: int(rating), Timestamp: ts}}
}

// footprint is used_memory (see usedMemory) and DBSIZE, each summed over the masters of a
// cluster.
func (b *bencher) footprint(ctx context.Context) (mem, keys int64, err error) {
	if mem, err = b.usedMemory(ctx); err != nil {
		return 0, 0, err
	}
	keys, err = sumNodes(ctx, b.admin, func(ctx context.Context, c *redis.Client) (int64, error) {
		n, err := c.DBSize(ctx).Result()
		if err != nil {
			return 0, fmt.Errorf("DBSIZE: %w", err)
		}
		return n, nil
	})
	return mem, keys, err
}

// recordsLine describes the preloaded records for the progress and the table.
func recordsLine(r *RecordsPreload) string {
	return fmt.Sprintf("preloaded %d idempotency records (compact, ages spread over IDEMPOTENCY_TTL=%s) in %.1fs: %d keys added, used_memory %+.1f MiB, %.0f B each",
		r.Records, time.Duration(r.TTLSeconds*float64(time.Second)), r.Seconds, r.Keys, float64(r.UsedMemory)/(1<<20), r.BytesPerRecord)
}
