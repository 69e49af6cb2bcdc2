package adapters_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/checkins/checkins/adapters"
	"github.com/checkins/checkins/domain"
)

// FuzzDecodeRecord: whatever a record's key holds, reading it returns a record or an error
// naming the checkinId, never a panic; a compact record that reads is one encodeCompact writes
// again, byte for byte up to the varints' form, and reads back the same.
func FuzzDecodeRecord(f *testing.F) {
	for _, rec := range []struct {
		u, l, s, t, r int64
	}{{42, 7, 4, 0, 1700000000123}, {1, 1, 0, 1609602085397, 1700000000123}, {1 << 62, 1 << 40, 5, domain.MaxTimestamp, 1}} {
		b, ok := adapters.EncodeCompact(publishedRecord("c", rec.u, rec.l, rec.s, rec.t, rec.r))
		require.True(f, ok)
		f.Add(string(b))
		js, err := adapters.EncodeRecord('P', publishedRecord("c", rec.u, rec.l, rec.s, rec.t, rec.r))
		require.NoError(f, err)
		f.Add(string(js))
	}
	f.Add("R\x01\x00\x01\x01\x01\x00")
	f.Add("P\x01")
	f.Fuzz(func(t *testing.T, v string) {
		rec, err := adapters.DecodeRecord("c", v)
		if err != nil {
			require.Contains(t, err.Error(), `idempotency record for "c" is corrupt`)
			return
		}
		if len(v) < 2 || v[1] != 1 {
			return // JSON
		}
		b, ok := adapters.EncodeCompact(*rec)
		require.True(t, ok, "a compact record that reads is one the encoder writes: %+v", *rec)
		again, err := adapters.DecodeRecord("c", string(b))
		require.NoError(t, err)
		require.Equal(t, *rec, *again)
	})
}
