package adapters_test

import (
	"context"
	"encoding/json"
	"strconv"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/checkins/checkins/adapters"
	"github.com/checkins/checkins/adapters/redistest"
	"github.com/checkins/checkins/app/projection"
	"github.com/checkins/checkins/domain"
)

func BenchmarkParseEvent(b *testing.B) {
	f := sampleFields()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := domain.ParseEvent(f); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkMarshal(b *testing.B) {
	msg, err := adapters.NewEventMessage(sampleFields(), "corr-1")
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := (adapters.FlatMarshaller{}).Marshal("events", msg); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkUnmarshal(b *testing.B) {
	msg, err := adapters.NewEventMessage(sampleFields(), "corr-1")
	if err != nil {
		b.Fatal(err)
	}
	values, err := adapters.FlatMarshaller{}.Marshal("events", msg)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	var out *message.Message
	for b.Loop() {
		if out, err = (adapters.FlatMarshaller{}).Unmarshal(values); err != nil {
			b.Fatal(err)
		}
	}
	_ = out
}

// BenchmarkDecodeCheckinJSON is the API's per-request CPU work: decode the body, validate it.
func BenchmarkDecodeCheckinJSON(b *testing.B) {
	body := []byte(`{"checkinId":"ck-123","userId":42,"locationId":7,"starRating":4,"timestamp":1700000000000}`)
	now := time.UnixMilli(1_700_000_000_000)
	newID := func() string { return "generated" }
	b.ReportAllocs()
	b.SetBytes(int64(len(body)))
	for b.Loop() {
		var req struct {
			CheckinID  *string `json:"checkinId"`
			UserID     *int64  `json:"userId"`
			LocationID *int64  `json:"locationId"`
			StarRating *int64  `json:"starRating"`
			Timestamp  *int64  `json:"timestamp"`
		}
		if err := json.Unmarshal(body, &req); err != nil {
			b.Fatal(err)
		}
		if _, err := domain.NewCheckin(domain.CheckinInput{CheckinID: req.CheckinID, UserID: req.UserID,
			LocationID: req.LocationID, StarRating: req.StarRating, Timestamp: req.Timestamp}, now, newID); err != nil {
			b.Fatal(err)
		}
	}
}

func benchStores(b *testing.B) (*adapters.ProjectionStore, *adapters.ProjectionStore) {
	b.Helper()
	srv := redistest.Start(b, redistest.Options{})
	c := redistest.Client(b, srv.URL())
	keys := adapters.KeySpace{Prefix: "bench"}
	users, err := adapters.NewProjectionStore(c, keys, "users", 1)
	if err != nil {
		b.Fatal(err)
	}
	locations, err := adapters.NewProjectionStore(c, keys, "locations", 1)
	if err != nil {
		b.Fatal(err)
	}
	return users, locations
}

func benchEvent(i int) domain.CheckinRecorded {
	return recorded("ck-"+strconv.Itoa(i), int64(i%1000+1), int64(i%997+1), i%6, 1_700_000_000_000+int64(i))
}

// BenchmarkProjectionApply applies each check-in to users and locations, one round trip each.
func BenchmarkProjectionApply(b *testing.B) {
	users, locations := benchStores(b)
	ctx := context.Background()
	i := 0
	for b.Loop() {
		ev := benchEvent(i)
		i++
		if err := (projection.UserStats{}).OnCheckinRecorded(ctx, ev, users); err != nil {
			b.Fatal(err)
		}
		if err := (projection.LocationStats{}).OnCheckinRecorded(ctx, ev, locations); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(i)/b.Elapsed().Seconds(), "checkins/s")
}

// BenchmarkProjectionApplyBatch applies the same updates 500 per pipeline, per projection.
func BenchmarkProjectionApplyBatch(b *testing.B) {
	const batch = 500
	users, locations := benchStores(b)
	ctx := context.Background()
	var pending [2]captureStore
	flush := func() {
		for j, s := range []*adapters.ProjectionStore{users, locations} {
			if err := s.ApplyBatch(ctx, pending[j].updates); err != nil {
				b.Fatal(err)
			}
			pending[j].updates = pending[j].updates[:0]
		}
	}
	i := 0
	for b.Loop() {
		ev := benchEvent(i)
		i++
		if err := (projection.UserStats{}).OnCheckinRecorded(ctx, ev, &pending[0]); err != nil {
			b.Fatal(err)
		}
		if err := (projection.LocationStats{}).OnCheckinRecorded(ctx, ev, &pending[1]); err != nil {
			b.Fatal(err)
		}
		if len(pending[0].updates) == batch {
			flush()
		}
	}
	flush()
	b.ReportMetric(float64(i)/b.Elapsed().Seconds(), "checkins/s")
}
