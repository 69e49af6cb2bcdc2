package adapters_test

import (
	"context"
	"fmt"
	"hash/fnv"
	"math"
	"strconv"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/checkins/checkins/adapters"
	"github.com/checkins/checkins/adapters/redistest"
)

// crc16Table is CRC-16/XMODEM built from its definition (polynomial 0x1021, initial value 0, no
// reflection), table-driven: another implementation than adapters' bitwise one.
var crc16Table = func() (t [256]uint16) {
	for i := range 256 {
		c := uint16(i) << 8
		for range 8 {
			if c&0x8000 != 0 {
				c = c<<1 ^ 0x1021
			} else {
				c <<= 1
			}
		}
		t[i] = c
	}
	return t
}()

func refSlot(key string) int {
	if i := strings.IndexByte(key, '{'); i >= 0 {
		if j := strings.IndexByte(key[i+1:], '}'); j > 0 {
			key = key[i+1 : i+1+j]
		}
	}
	var crc uint16
	for i := 0; i < len(key); i++ {
		crc = crc<<8 ^ crc16Table[byte(crc>>8)^key[i]]
	}
	return int(crc % 16384)
}

// evenSplit is how redis-cli --cluster create splits the 16384 slots over m masters: master j
// serves up to last(j) = lround(j*16384/m + 16384/m - 1), the last master to 16383.
func evenSplit(m int) []int {
	per := 16384 / float64(m)
	lasts := make([]int, m)
	cursor := 0.0
	for j := range m {
		last := int(math.Round(cursor + per - 1))
		if j == m-1 {
			last = 16383
		}
		lasts[j] = last
		cursor += per
	}
	return lasts
}

func masterOfSlot(lasts []int, slot int) int {
	for j, last := range lasts {
		if slot <= last {
			return j
		}
	}
	return -1
}

func TestPartitionTagsSpreadEvenly(t *testing.T) {
	t.Parallel()
	require.Equal(t, 0x31C3%16384, refSlot("123456789"), "the CRC-16/XMODEM check value")
	require.Equal(t, 12182, refSlot("foo"), "Redis's documented example")
	keys := adapters.KeySpace{Prefix: "checkins"}
	counts := []int{1, 2, 3, 4, 6, 8, 12, 24}
	for _, p := range counts {
		parts, err := adapters.NewPartitions(keys, p)
		require.NoError(t, err)
		require.Equal(t, p, parts.Count())
		if p == 1 {
			assert.Equal(t, []string{"checkins:events"}, parts.Streams(), "P = 1 is today's key, no tag")
		}
		seen := map[string]bool{}
		slots := make([]int, p)
		for i, s := range parts.Streams() {
			require.False(t, seen[s], "P=%d: stream %s twice", p, s)
			seen[s] = true
			slots[i] = refSlot(s)
			assert.Equal(t, slots[i], adapters.KeySlot(s), s)
			if p > 1 {
				// The partition's tag is the key's first {...}, and its slot is in the partition's
				// own P-th of the slot space, near its middle.
				assert.Equal(t, fmt.Sprintf("checkins:events:%d:{%s}", i, adapters.PartitionTags(p)[i]), s)
				lo, hi := i*16384/p, (i+1)*16384/p
				assert.True(t, slots[i] >= lo && slots[i] < hi, "P=%d partition %d at slot %d, outside [%d,%d)", p, i, slots[i], lo, hi)
				assert.LessOrEqual(t, abs(slots[i]-adapters.PartitionTarget(i, p)), 8, "P=%d partition %d: slot %d, target %d", p, i, slots[i], adapters.PartitionTarget(i, p))
			}
		}
		for _, m := range counts {
			per := make([]int, m)
			lasts := evenSplit(m)
			for _, s := range slots {
				per[masterOfSlot(lasts, s)]++
			}
			for j, n := range per {
				if p%m == 0 {
					assert.Equal(t, p/m, n, "P=%d over M=%d masters: master %d holds %v", p, m, j, per)
				} else {
					assert.True(t, n == p/m || n == p/m+1, "P=%d over M=%d masters: master %d holds %v", p, m, j, per)
				}
			}
		}
	}
	// The naive tags do not spread: what this layout is for.
	naive := make([]int, 3)
	for i := range 24 {
		naive[masterOfSlot(evenSplit(3), refSlot(fmt.Sprintf("{p%02d}", i)))]++
	}
	assert.NotEqual(t, []int{8, 8, 8}, naive, "{p00}..{p23} over 3 masters: %v", naive)
	assert.Equal(t, adapters.PartitionTags(24), adapters.PartitionTags(24), "deterministic")
	assert.Equal(t, adapters.DefaultClusterPartitions, 24)
}

func abs(x int) int {
	if x < 0 {
		return -x
	}
	return x
}

func TestNewPartitionsRejects(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		prefix string
		p      int
		err    string
	}{
		{"checkins", 0, "between 1 and 1024, got 0"},
		{"checkins", 1025, "between 1 and 1024, got 1025"},
		{"check{ins}", 24, "without braces"},
		{"", 1, "non-empty"},
	} {
		_, err := adapters.NewPartitions(adapters.KeySpace{Prefix: tc.prefix}, tc.p)
		assert.ErrorContains(t, err, tc.err, "%q P=%d", tc.prefix, tc.p)
	}
}

// TestPartitionOfIsStableAndSpreads: a user's partition is FNV-1a of the decimal userId mod P,
// fixed values (so no process, version or language disagrees), and users spread over them.
func TestPartitionOfIsStableAndSpreads(t *testing.T) {
	t.Parallel()
	// FNV-1a 64 of "1" is 0xaf63ac4c86019afc; of "42", 0x07ee7e07b4b19223.
	assert.Equal(t, int(uint64(0xaf63ac4c86019afc)%24), adapters.PartitionOf(1, 24))
	assert.Equal(t, int(uint64(0x07ee7e07b4b19223)%24), adapters.PartitionOf(42, 24))
	assert.Equal(t, 0, adapters.PartitionOf(42, 1))
	for u := int64(1); u < 5000; u += 7 {
		h := fnv.New64a()
		_, _ = h.Write([]byte(strconv.FormatInt(u, 10)))
		require.Equal(t, int(h.Sum64()%8), adapters.PartitionOf(u, 8), "user %d", u)
	}
	per := make([]int, 24)
	for u := int64(1); u <= 24_000; u++ {
		per[adapters.PartitionOf(u, 24)]++
	}
	for i, n := range per {
		assert.InDelta(t, 1000, n, 150, "partition %d holds %d of 24,000 users", i, n)
	}
	parts, err := adapters.NewPartitions(adapters.KeySpace{Prefix: "x"}, 8)
	require.NoError(t, err)
	assert.Equal(t, parts.Stream(adapters.PartitionOf(77, 8)), parts.StreamOf(77))
}

// TestPartitionsOnACluster: Redis agrees with the tags' slots (CLUSTER KEYSLOT), each of the 3
// masters serves P/3 partitions, and the guard records P once and refuses another.
func TestPartitionsOnACluster(t *testing.T) {
	t.Parallel()
	env := redistest.OpenCluster(t)
	c := redistest.ClusterClient(t, env.URL)
	ctx := context.Background()
	keys := adapters.KeySpace{Prefix: env.Prefix}
	for _, p := range []int{3, 6, 12, 24} {
		parts, err := adapters.NewPartitions(keys, p)
		require.NoError(t, err)
		per := map[string]int{}
		for _, s := range parts.Streams() {
			slot, err := c.ClusterKeySlot(ctx, s).Result()
			require.NoError(t, err)
			assert.EqualValues(t, adapters.KeySlot(s), slot, s)
			require.NoError(t, c.XAdd(ctx, &redis.XAddArgs{Stream: s, Values: []string{"k", "1"}}).Err())
			node, err := c.MasterForKey(ctx, s)
			require.NoError(t, err)
			per[node.Options().Addr]++
		}
		require.Len(t, per, 3, "P=%d: %v", p, per)
		for addr, n := range per {
			assert.Equal(t, p/3, n, "P=%d: master %s serves %d partitions", p, addr, n)
		}
	}

	fresh := adapters.KeySpace{Prefix: env.Prefix + "-fresh"}
	require.NoError(t, adapters.EnsurePartitions(ctx, c, fresh, 24))
	require.NoError(t, adapters.EnsurePartitions(ctx, c, fresh, 24), "the same P again")
	assert.Equal(t, "24", c.HGet(ctx, fresh.Meta(), "partitions").Val())
	err := adapters.EnsurePartitions(ctx, c, fresh, 8)
	require.ErrorIs(t, err, adapters.ErrPartitionMismatch)
	assert.ErrorContains(t, err, "has 24 partitions")
	assert.ErrorContains(t, err, "`checkins partitions migrate --to 8`")
	assert.Equal(t, "24", c.HGet(ctx, fresh.Meta(), "partitions").Val(), "a refused P records nothing")
}

// TestEnsurePartitionsOnAStreamFromBeforePartitions: a stream written by a service without
// partitions (<prefix>:events, no meta) has 1; a process configured with 24 refuses to start.
func TestEnsurePartitionsOnAStreamFromBeforePartitions(t *testing.T) {
	t.Parallel()
	env := newProjEnv(t)
	ctx := context.Background()
	require.NoError(t, env.client.XAdd(ctx, &redis.XAddArgs{Stream: env.keys.Stream(), Values: []string{"k", "1"}}).Err())
	err := adapters.EnsurePartitions(ctx, env.client, env.keys, 24)
	require.ErrorIs(t, err, adapters.ErrPartitionMismatch)
	assert.ErrorContains(t, err, "has 1 partitions")
	require.NoError(t, adapters.EnsurePartitions(ctx, env.client, env.keys, 1))
	assert.Equal(t, "1", env.client.HGet(ctx, env.keys.Meta(), "partitions").Val())

	// A corrupt record is named, not taken for a count.
	other := env.with("corrupt")
	require.NoError(t, env.client.HSet(ctx, other.keys.Meta(), "partitions", "many").Err())
	assert.ErrorContains(t, adapters.EnsurePartitions(ctx, env.client, other.keys, 1), `partitions is "many", not a partition count`)
	assert.ErrorContains(t, adapters.EnsurePartitions(ctx, env.client, other.keys, 0), "between 1 and 1024")
}
