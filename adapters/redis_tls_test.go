package adapters_test

import (
	"cmp"
	"context"
	"crypto/tls"
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

// tlsFrom loads the test CA and client certificate as REDIS_TLS_* would.
func tlsFrom(t *testing.T, f *redistest.TLSFiles, serverName string, client bool) *tls.Config {
	t.Helper()
	files := adapters.RedisTLSFiles{CAFile: f.CACert, ServerName: serverName}
	if client {
		files.CertFile, files.KeyFile = f.ClientCert, f.ClientKey
	}
	c, err := adapters.LoadRedisTLS(files)
	require.NoError(t, err)
	return c
}

// TestRedisOverTLS: a Redis that speaks TLS only and asks for client certificates
// (tls-auth-clients yes, its default) is reached through rediss:// with the CA and the client
// certificate of REDIS_TLS_*, in auto mode too (the INFO cluster question goes over TLS); without
// them the connection is refused with the reason.
func TestRedisOverTLS(t *testing.T) {
	t.Parallel()
	files := redistest.NewTLS(t)
	srv := redistest.Start(t, redistest.Options{TLS: files})
	require.True(t, strings.HasPrefix(srv.URL(), "rediss://"), srv.URL())
	ctx := context.Background()
	c, err := adapters.NewUniversalRedisClient(ctx, adapters.ClientOptions{URL: srv.URL(), DialTimeout: time.Second, TLS: tlsFrom(t, files, "", true)})
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	_, single := c.(*redis.Client)
	require.True(t, single, "auto mode found one server over TLS: %T", c)
	require.NoError(t, c.Set(ctx, "tls:k", "v", time.Minute).Err())
	assert.Equal(t, "v", c.Get(ctx, "tls:k").Val())

	for name, tc := range map[string]struct {
		url  string
		tls  *tls.Config
		want string
	}{
		"the system's CAs":          {srv.URL(), nil, "certificate signed by unknown authority"},
		"no client certificate":     {srv.URL(), tlsFrom(t, files, "", false), ""},
		"another name":              {srv.URL(), tlsFrom(t, files, "redis.example.com", true), "not redis.example.com"},
		"plain TCP to the TLS port": {"redis://" + srv.Addr(), nil, ""},
	} {
		t.Run(name, func(t *testing.T) {
			c, err := adapters.NewRedisClient(adapters.ClientOptions{URL: tc.url, DialTimeout: time.Second, ReadTimeout: time.Second, TLS: tc.tls})
			require.NoError(t, err)
			t.Cleanup(func() { _ = c.Close() })
			err = c.Ping(ctx).Err()
			require.Error(t, err)
			t.Logf("%s: %v", name, err)
			assert.Contains(t, err.Error(), tc.want)
		})
	}
	_, err = adapters.NewRedisClient(adapters.ClientOptions{URL: "redis://" + srv.Addr(), TLS: tlsFrom(t, files, "", true)})
	require.ErrorIs(t, err, adapters.ErrTLSWithoutRediss, "TLS settings with a plain redis:// URL are a mistake, not ignored")
}

// TestClusterOverTLS: a cluster whose nodes speak TLS only, on their bus and replication links
// too, is reached from one rediss:// seed; every master takes writes, and replication over TLS
// confirms them (WAIT, what INGEST_MIN_REPLICAS relies on). Each node is verified by the host it
// announces, or by REDIS_TLS_SERVER_NAME when set.
func TestClusterOverTLS(t *testing.T) {
	t.Parallel()
	files := redistest.NewTLS(t)
	cl := redistest.StartCluster(t, redistest.ClusterOptions{Replicas: 1, TLS: files})
	seed := "rediss://" + cl.Addrs()[1]
	ctx := context.Background()
	for name, serverName := range map[string]string{"each node's host": "", "a fixed name": "localhost"} {
		t.Run(name, func(t *testing.T) {
			c, err := adapters.NewUniversalRedisClient(ctx, adapters.ClientOptions{URL: seed, DialTimeout: time.Second, TLS: tlsFrom(t, files, serverName, true)})
			require.NoError(t, err)
			t.Cleanup(func() { _ = c.Close() })
			cc, ok := c.(*redis.ClusterClient)
			require.True(t, ok, "auto mode found a cluster over TLS: %T", c)
			// The nodes here announce 127.0.0.1, which every certificate of the test CA names:
			// what a node announcing another address is verified by is read off the client
			// built for it.
			want := cmp.Or(serverName, "10.1.2.3")
			probe := cc.Options().NewClient(&redis.Options{Addr: "10.1.2.3:7000"})
			assert.Equal(t, want, probe.Options().TLSConfig.ServerName, "a node at 10.1.2.3 is verified by that name")
			_ = probe.Close()
			masters := map[string]bool{}
			for i := range 40 {
				k := "tls:{" + strconv.Itoa(i) + "}"
				require.NoError(t, c.Set(ctx, k, i, time.Minute).Err())
				n, err := cc.MasterForKey(ctx, k)
				require.NoError(t, err)
				masters[n.Options().Addr] = true
				if i < 3 {
					acked, err := n.Wait(ctx, 1, 5*time.Second).Result()
					require.NoError(t, err)
					assert.Equal(t, int64(1), acked, "the replica has the write, over TLS")
				}
			}
			assert.Len(t, masters, 3, "every master answers over TLS")
		})
	}
	t.Run("a name no node's certificate carries", func(t *testing.T) {
		c, err := adapters.NewUniversalRedisClient(ctx, adapters.ClientOptions{URL: seed, Mode: adapters.RedisModeCluster, DialTimeout: time.Second,
			TLS: tlsFrom(t, files, "redis.example.com", true)})
		require.NoError(t, err)
		t.Cleanup(func() { _ = c.Close() })
		err = c.Set(ctx, "tls:x", 1, time.Minute).Err()
		require.Error(t, err)
		assert.Contains(t, err.Error(), "redis.example.com")
	})
}
