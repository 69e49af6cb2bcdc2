package adapters_test

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/checkins/checkins/adapters"
	"github.com/checkins/checkins/adapters/redistest"
)

func TestParseRedisMode(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]adapters.RedisMode{"": adapters.RedisModeAuto, "auto": adapters.RedisModeAuto,
		"Cluster": adapters.RedisModeCluster, " standalone ": adapters.RedisModeStandalone} {
		got, err := adapters.ParseRedisMode(in)
		require.NoError(t, err, in)
		assert.Equal(t, want, got, in)
	}
	_, err := adapters.ParseRedisMode("sentinel")
	assert.ErrorContains(t, err, `auto, standalone or cluster, got "sentinel"`)
}

// TestNewUniversalRedisClient: which client each REDIS_URL and mode makes, and the clear errors
// of those that cannot work.
func TestNewUniversalRedisClient(t *testing.T) {
	t.Parallel()
	standalone := redistest.Start(t, redistest.Options{})
	cl := redistest.OpenCluster(t)
	if cl.Cluster == nil {
		t.Skip("needs the local cluster: REDIS_CLUSTER_URL names an external one")
	}
	addrs := cl.Cluster.Addrs()
	oneSeed := "redis://" + addrs[1] + "/0"
	ctx := context.Background()
	tests := []struct {
		name, url string
		mode      adapters.RedisMode
		cluster   bool
		err       string
	}{
		{name: "standalone, auto", url: standalone.URL(), cluster: false},
		{name: "standalone, forced", url: standalone.URL(), mode: adapters.RedisModeStandalone, cluster: false},
		{name: "one cluster seed, auto: INFO cluster tells", url: oneSeed, cluster: true},
		{name: "seeds in the go-redis cluster URL form", url: cl.URL, cluster: true},
		{name: "one seed, forced", url: "redis://" + addrs[2], mode: adapters.RedisModeCluster, cluster: true},
		{name: "seeds but forced standalone", url: cl.URL, mode: adapters.RedisModeStandalone, err: "only a cluster takes, but the redis mode is standalone"},
		{name: "cluster with a database", url: "redis://" + addrs[0] + "/3", mode: adapters.RedisModeCluster, err: "database 0 only, got /3"},
		{name: "bad seed", url: cl.URL + "&addr=nohost", err: "addr"},
		{name: "unknown option", url: cl.URL + "&bogus=1", err: "bogus"},
		{name: "nothing answers, auto", url: "redis://127.0.0.1:1", err: "whether it is a cluster node (or set the redis mode to standalone or cluster)"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c, err := adapters.NewUniversalRedisClient(ctx, adapters.ClientOptions{URL: tc.url, Mode: tc.mode, DialTimeout: time.Second})
			if tc.err != "" {
				require.ErrorContains(t, err, tc.err)
				return
			}
			require.NoError(t, err)
			t.Cleanup(func() { _ = c.Close() })
			cc, isCluster := c.(*redis.ClusterClient)
			require.Equal(t, tc.cluster, isCluster, "%T", c)
			if !isCluster {
				require.NoError(t, c.Set(ctx, cl.Prefix+":one", 1, 0).Err())
				return
			}
			assert.Equal(t, adapters.ClusterStateReloadInterval, cc.Options().ClusterStateReloadInterval)
			// Every master is reached from whatever seeds were given.
			masters := map[string]bool{}
			for i := range 40 {
				k := cl.Prefix + ":" + strings.ReplaceAll(tc.name, " ", "") + strconv.Itoa(i)
				require.NoError(t, c.Set(ctx, k, i, time.Minute).Err())
				n, err := cc.MasterForKey(ctx, k)
				require.NoError(t, err)
				masters[n.Options().Addr] = true
			}
			assert.Len(t, masters, 3)
		})
	}
}

// TestClusterWithPassword: a private cluster whose nodes require a password (requirepass and
// masterauth) is reached with the password in REDIS_URL, in go-redis's cluster URL form or as one
// seed (auto mode asks that node, with the password, whether it is a cluster node); every master
// is reached. Without the password, or with a wrong one, the error names the authentication.
func TestClusterWithPassword(t *testing.T) {
	t.Parallel()
	cl := redistest.StartCluster(t, redistest.ClusterOptions{Password: "s3cret-pass"})
	addrs := cl.Addrs()
	ctx := context.Background()
	for name, url := range map[string]string{
		"seeds":                 cl.URL(),
		"one seed, auto mode":   "redis://:s3cret-pass@" + addrs[1],
		"a user and a password": "redis://default:s3cret-pass@" + addrs[2] + "?addr=" + addrs[0],
	} {
		t.Run(name, func(t *testing.T) {
			c, err := adapters.NewUniversalRedisClient(ctx, adapters.ClientOptions{URL: url, DialTimeout: time.Second})
			require.NoError(t, err)
			t.Cleanup(func() { _ = c.Close() })
			cc, ok := c.(*redis.ClusterClient)
			require.True(t, ok, "%T", c)
			masters := map[string]bool{}
			for i := range 40 {
				k := "pw:" + strconv.Itoa(i)
				require.NoError(t, c.Set(ctx, k, i, time.Minute).Err())
				n, err := cc.MasterForKey(ctx, k)
				require.NoError(t, err)
				masters[n.Options().Addr] = true
			}
			assert.Len(t, masters, 3, "every master answers with the password")
		})
	}
	for name, url := range map[string]string{
		"no password, auto mode":  "redis://" + addrs[0],
		"a wrong password, seeds": "redis://:wrong@" + addrs[0] + "?addr=" + addrs[1],
	} {
		t.Run(name, func(t *testing.T) {
			c, err := adapters.NewUniversalRedisClient(ctx, adapters.ClientOptions{URL: url, DialTimeout: time.Second})
			if err == nil {
				t.Cleanup(func() { _ = c.Close() })
				err = c.Set(ctx, "pw:x", 1, time.Minute).Err()
			}
			require.Error(t, err)
			t.Logf("%s: %v", name, err)
			assert.Regexp(t, `NOAUTH|WRONGPASS|invalid password|Authentication required`, err.Error())
		})
	}
}

// TestClusterClientHealsAFailoverInSeconds kills a master of a 3+3 cluster while a client
// writes to its slots, for each remedy alone: the slot map reloaded every second, or reloaded on
// connection errors (with the periodic reload an hour away). go-redis alone keeps sending the
// dead master's slots to it until its periodic reload (60 s by default): a killed master sends
// no MOVED. Writes must succeed again once the replica is promoted, well before that.
func TestClusterClientHealsAFailoverInSeconds(t *testing.T) {
	t.Parallel()
	cl := redistest.StartCluster(t, redistest.ClusterOptions{Replicas: 1})
	ctx := context.Background()
	remedies := []struct {
		name           string
		reload         time.Duration
		reloadOnErrors bool
	}{
		{"reload every second", time.Second, false},
		{"reload on connection errors", time.Hour, true},
	}
	victims := []string{"{a}", "{b}"} // slots 15495 and 3300: masters 2 and 0
	for i, r := range remedies {
		c, err := adapters.NewClusterClientWith(adapters.ClientOptions{URL: cl.URL(), DialTimeout: 200 * time.Millisecond,
			ReadTimeout: 500 * time.Millisecond, WriteTimeout: 500 * time.Millisecond}, r.reload, r.reloadOnErrors)
		require.NoError(t, err)
		t.Cleanup(func() { _ = c.Close() })
		key := "heal:" + victims[i]
		require.NoError(t, c.Set(ctx, key, "before", 0).Err())
		victim := cl.MasterOf(t, int(c.ClusterKeySlot(ctx, key).Val()))
		// Every node's slot map is loaded before the crash, as in a running service.
		for j := range 3 {
			require.NoError(t, c.Set(ctx, "warm:{"+strconv.Itoa(j)+"}", 1, time.Minute).Err())
		}
		cl.KillNode(victim)
		killed := time.Now()
		var healed time.Duration
		deadline := killed.Add(30 * time.Second)
		for time.Now().Before(deadline) {
			wctx, cancel := context.WithTimeout(ctx, time.Second)
			err := c.Set(wctx, key, "after", 0).Err()
			cancel()
			if err == nil {
				healed = time.Since(killed)
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		require.NotZero(t, healed, "%s: writes to the dead master's slots still fail after 30 s", r.name)
		t.Logf("%s: writes to the killed master's slots failed for %s", r.name, healed.Round(100*time.Millisecond))
		assert.Equal(t, "after", c.Get(ctx, key).Val())
		cl.RestartNode(t, victim)
		cl.WaitHealthy(t, 20*time.Second)
	}
}
