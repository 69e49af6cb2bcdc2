package ports_test

import (
	"testing"

	"github.com/checkins/checkins/ports"
)

// BenchmarkDecodeCheckinJSON is the decoder's cost per request body, on the hot path of ingest.
func BenchmarkDecodeCheckinJSON(b *testing.B) {
	for _, bc := range []struct{ name, body string }{
		{"full", `{"userId": 42, "locationId": 7, "starRating": 4, "timestamp": 1609602085397, "checkinId": "c-0001"}`},
		{"minimal", `{"userId":42,"locationId":7,"starRating":4}`},
	} {
		b.Run(bc.name, func(b *testing.B) {
			body := []byte(bc.body)
			b.ReportAllocs()
			b.SetBytes(int64(len(body)))
			for b.Loop() {
				if _, err := ports.DecodeCheckinJSON(body); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
