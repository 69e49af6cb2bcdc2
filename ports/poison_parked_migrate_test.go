package ports_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/checkins/checkins/adapters"
	"github.com/checkins/checkins/app/command"
	"github.com/checkins/checkins/ports"
)

// TestParkedUnitCarriedOverAMigrationWithForce: process a parks faulty's unit and dies with the
// entry pending; `partitions migrate --to 2 --force` goes on with it pending, and the entry is
// delivered again on its new partition, where b runs. The poison queue's record of the parked
// unit named the old stream, and the entry came again as a first delivery, which is not asked
// about: b applied faulty's unit, and the replay counted it again. The record now goes with the
// entry, which is pending again on its new partition, taken over as the redelivery it is.
func TestParkedUnitCarriedOverAMigrationWithForce(t *testing.T) {
	t.Parallel()
	for _, kind := range []string{adapters.SubscriberBatched, adapters.SubscriberWatermill} {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			r := newTakeover(t, kind)
			mp, err := command.NewMigratePartitions(adapters.NewPartitionMigrator(r.client, r.keys))
			require.NoError(t, err)
			_, err = mp.Handle(r.ctx, command.MigrateRequest{To: 2, Force: true, Wait: 100 * time.Millisecond})
			require.NoError(t, err)
			k2, err := r.keys.WithPartitions(2)
			require.NoError(t, err)
			r.keys = k2

			t.Cleanup(r.start("b", testApplier(t, r.client, r.keys), 300*time.Millisecond))
			require.Eventually(t, func() bool {
				for _, s := range r.keys.Partitions().Streams() {
					p, err := r.client.XPending(r.ctx, s, ports.LiveGroupName(nil, true)).Result()
					if err != nil || p.Count > 0 { // the migration made the group on every partition
						return false
					}
				}
				return r.countOf("other") == 1
			}, 15*time.Second, 20*time.Millisecond, "b takes the entry over on its new partition and applies its other unit")
			assert.Zero(t, r.countOf("faulty"), "the parked unit is left to the replay")

			res := r.replay()
			assert.True(t, res.Applied, "%+v", res)
			assert.Equal(t, int64(1), r.countOf("faulty"), "counted once, by the replay")
			assert.Equal(t, int64(1), r.countOf("other"))
		})
	}
}
