package bench

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/checkins/checkins/adapters"
	"github.com/checkins/checkins/adapters/redistest"
	"github.com/checkins/checkins/domain"
)

// The ingest baseline on a cluster XADDs each check-in to the partition ingest picks for its
// user (PartitionOf(userId)), so the baseline's XADDs spread over the masters as the API's do.
func TestBaselineIngestPicksThePartitionLikeIngest(t *testing.T) {
	t.Parallel()
	cl := redistest.StartCluster(t, redistest.ClusterOptions{})
	cc := redistest.ClusterClient(t, cl.URL())
	keys, err := adapters.KeySpace{Prefix: "baseline", Cluster: true}.WithPartitions(adapters.DefaultClusterPartitions)
	require.NoError(t, err)
	srv := httptest.NewServer(baselineIngestHandler(cc, keys.Partitions()))
	defer srv.Close()
	const users = 200
	for u := 1; u <= users; u++ {
		body := fmt.Sprintf(`{"checkinId":"c%d","userId":%d,"locationId":1,"starRating":3,"timestamp":1}`, u, u)
		resp, err := http.Post(srv.URL+"/checkins", "application/json", strings.NewReader(body))
		require.NoError(t, err)
		_ = resp.Body.Close()
		require.Equal(t, http.StatusAccepted, resp.StatusCode)
	}
	seen := 0
	for i, s := range keys.Partitions().Streams() {
		xs, err := cc.XRange(t.Context(), s, "-", "+").Result()
		require.NoError(t, err)
		for _, x := range xs {
			var u int64
			_, err := fmt.Sscan(fmt.Sprint(x.Values[domain.FieldUserID]), &u)
			require.NoError(t, err)
			assert.Equal(t, adapters.PartitionOf(u, keys.Partitions().Count()), i, "user %d in partition %d", u, i)
			seen++
		}
	}
	assert.Equal(t, users, seen)
}
