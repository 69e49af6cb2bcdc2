package adapters

import "testing"

// TestPerPartitionShare: MAX_IN_FLIGHT is shared out over the partitions (rounded up, at least
// one), and a batch never exceeds a partition's share.
func TestPerPartitionShare(t *testing.T) {
	for _, c := range []struct {
		inFlight, p int
		batch       int64
		wantIn      int
		wantBatch   int64
	}{
		{1000, 24, 500, 42, 42},
		{1000, 4, 100, 250, 100},
		{0, 24, 0, 42, 42}, // defaults
		{10, 24, 500, 1, 1},
		{1000, 2, 500, 500, 500},
	} {
		in, batch := perPartition(c.inFlight, c.batch, c.p)
		if in != c.wantIn || batch != c.wantBatch {
			t.Errorf("perPartition(%d, %d, %d) = %d, %d; want %d, %d", c.inFlight, c.batch, c.p, in, batch, c.wantIn, c.wantBatch)
		}
	}
}
