package adapters_test

import (
	"context"
	"encoding/json"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"

	"github.com/checkins/checkins/adapters"
	"github.com/checkins/checkins/adapters/redistest"
	"github.com/checkins/checkins/app/projection"
	"github.com/checkins/checkins/domain"
)

func BenchmarkParseEvent(b *testing.B) {
	f := sampleFields()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := domain.ParseEvent("1-0", f); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkDecodeEntries is the projector's decoding of a batch of 40 entries (about what one
// read carries under sustained load), per entry.
func BenchmarkDecodeEntries(b *testing.B) {
	msgs := make([]*message.Message, 40)
	for i := range msgs {
		m, err := adapters.NewEventMessage(recorded("ck-"+strconv.Itoa(i), int64(1+i), 7, i%6, 1_700_000_000_000+int64(i)).Fields(), "corr-1")
		if err != nil {
			b.Fatal(err)
		}
		m.Metadata.Set(adapters.MetaEntryID, strconv.Itoa(1_700_000_000_000+i)+"-0")
		msgs[i] = m
	}
	out := make([]projection.Entry, len(msgs))
	b.ReportAllocs()
	for b.Loop() {
		adapters.FlatMarshaller{}.DecodeEntries(msgs, out)
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(msgs)), "ns/entry")
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

func benchEvent(i int) domain.CheckinRecorded {
	return recorded("ck-"+strconv.Itoa(i), int64(i%1000+1), int64(i%997+1), i%6, 1_700_000_000_000+int64(i))
}

// BenchmarkProjectionApply applies each check-in to the five shipped projections, in batches
// of 10 (a projector keeping up with the API) and 500 (a projector draining a backlog: its
// BATCH_SIZE), and reports the Redis CPU each check-in costs.
func BenchmarkProjectionApply(b *testing.B) {
	for _, batch := range []int{10, 500} {
		b.Run("batch="+strconv.Itoa(batch), func(b *testing.B) { benchApply(b, batch) })
	}
}

func benchApply(b *testing.B, batch int) {
	env := redistest.Open(b) // REDIS_URL, e.g. a server run under callgrind, or a private one
	c := redistest.Client(b, env.URL)
	a, err := adapters.NewProjectionApplier(c, adapters.KeySpace{Prefix: env.Prefix}, 0)
	if err != nil {
		b.Fatal(err)
	}
	projs := []projection.Projection{projection.UserStats{}, projection.LocationStats{},
		projection.Leaderboards{MinCheckins: 5}, projection.RecentCheckins{}, projection.DailyCheckins{}}
	ctx := context.Background()
	works := make([]projection.Work, 0, batch*len(projs))
	cpu0 := redisCPU(b, c)
	i := 0
	flush := func() {
		if _, err := a.Apply(ctx, works, nil); err != nil {
			b.Fatal(err)
		}
		works = works[:0]
	}
	b.ReportAllocs()
	for b.Loop() {
		ev := benchEvent(i)
		i++
		for _, p := range projs {
			us, err := projection.Updates(ctx, p, ev)
			if err != nil {
				b.Fatal(err)
			}
			works = append(works, projection.Work{Group: "live", Projection: p.Name(), Version: 1, Event: projection.RefOf(ev, entry(1_700_000_000_000+int64(i))), Updates: us})
		}
		if i%batch == 0 {
			flush()
		}
	}
	flush()
	b.ReportMetric(float64(i)/b.Elapsed().Seconds(), "checkins/s")
	b.ReportMetric((redisCPU(b, c)-cpu0)/float64(i)*1e6, "redis-us/checkin")
}

// redisCPU is the CPU seconds redis-server has used (INFO cpu).
func redisCPU(tb testing.TB, c *redis.Client) float64 {
	info, err := c.Info(context.Background(), "cpu").Result()
	if err != nil {
		tb.Fatal(err)
	}
	var sum float64
	for _, l := range strings.Split(info, "\r\n") {
		for _, k := range []string{"used_cpu_sys:", "used_cpu_user:"} {
			if v, ok := strings.CutPrefix(l, k); ok {
				f, _ := strconv.ParseFloat(v, 64)
				sum += f
			}
		}
	}
	return sum
}

// BenchmarkPublishEncoding is the API's work per check-in between the event and the XADD
// arguments: the event's fields, the Watermill message, the marshaller's stream values.
func BenchmarkPublishEncoding(b *testing.B) {
	e := domain.CheckinRecorded{Checkin: domain.Checkin{ID: "0b7c6a53-2f3e-4c1e-9a57-1c9b0a3d7e21", UserID: 4242,
		LocationID: 77, StarRating: 4, Timestamp: 1700000000000}, RecordedAt: 1700000000123, Fingerprint: "f3a9c2"}
	b.ReportAllocs()
	for b.Loop() {
		msg := adapters.NewCheckinRecordedMessage(e, "corr-1")
		if _, err := (adapters.FlatMarshaller{}).Marshal("events", msg); err != nil {
			b.Fatal(err)
		}
	}
}
