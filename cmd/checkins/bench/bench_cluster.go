package bench

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/checkins/checkins/adapters"
)

// privateClusterMasters is the size of the cluster --cluster starts.
const privateClusterMasters = 3

// startPrivateCluster starts privateClusterMasters redis-server processes with cluster mode on
// free loopback ports, without persistence (like the private server), and joins them with
// redis-cli --cluster create (an even split of the slots). r.url becomes the cluster URL.
func (r *benchRedis) startPrivateCluster(ctx context.Context, runID string) error {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return fmt.Errorf("--cluster needs redis-server in PATH: install Redis 7 (apt-get install redis-server)")
	}
	cli, err := exec.LookPath("redis-cli")
	if err != nil {
		return fmt.Errorf("--cluster needs redis-cli in PATH to create the cluster: install Redis 7 (apt-get install redis-tools)")
	}
	if r.dir, err = os.MkdirTemp("", runID+"-cluster-"); err != nil {
		return fmt.Errorf("private cluster: %w", err)
	}
	r.private, r.cluster = true, true
	var addrs []string
	for i := range privateClusterMasters {
		port, err := freePort()
		if err != nil {
			r.close(nil)
			return err
		}
		bus, err := freePort()
		if err != nil {
			r.close(nil)
			return err
		}
		dir := filepath.Join(r.dir, strconv.Itoa(i))
		if err := os.Mkdir(dir, 0o750); err != nil {
			r.close(nil)
			return fmt.Errorf("private cluster: %w", err)
		}
		// #nosec G204 -- redis-server from PATH, with arguments this bench builds
		cmd := exec.Command(bin, "--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--dir", dir,
			"--save", "", "--appendonly", "no", "--daemonize", "no", "--logfile", filepath.Join(dir, "redis.log"),
			"--cluster-enabled", "yes", "--cluster-config-file", filepath.Join(dir, "nodes.conf"),
			"--cluster-port", strconv.Itoa(bus), "--cluster-node-timeout", "5000", "--cluster-require-full-coverage", "no")
		cmd.SysProcAttr = childProcAttr()
		if err := cmd.Start(); err != nil {
			r.close(nil)
			return fmt.Errorf("start redis-server: %w", err)
		}
		waited := make(chan struct{})
		go func() { _ = cmd.Wait(); close(waited) }()
		r.nodes = append(r.nodes, benchNode{cmd: cmd, waited: waited})
		addr := "127.0.0.1:" + strconv.Itoa(port)
		addrs = append(addrs, addr)
		if err := waitPing(ctx, addr, waited, filepath.Join(dir, "redis.log")); err != nil {
			r.close(nil)
			return err
		}
	}
	cctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	args := append([]string{"--cluster", "create"}, addrs...)
	args = append(args, "--cluster-replicas", "0", "--cluster-yes")
	// #nosec G204 -- redis-cli from PATH, with the addresses of the servers this bench started
	if out, err := exec.CommandContext(cctx, cli, args...).CombinedOutput(); err != nil {
		r.close(nil)
		return fmt.Errorf("redis-cli --cluster create: %v: %s", err, strings.TrimSpace(string(out)))
	}
	r.url = "redis://" + addrs[0] + "?" + url.Values{"addr": addrs[1:]}.Encode()
	deadline := time.Now().Add(30 * time.Second)
	for _, a := range addrs {
		for {
			c := redis.NewClient(&redis.Options{Addr: a, MaxRetries: -1})
			info, err := c.ClusterInfo(ctx).Result()
			_ = c.Close()
			if err == nil && strings.Contains(info, "cluster_state:ok") {
				break
			}
			if time.Now().After(deadline) {
				r.close(nil)
				return fmt.Errorf("private cluster not ok within 30s (node %s: %v)", a, err)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	return nil
}

// waitPing waits until the server at addr answers PING.
func waitPing(ctx context.Context, addr string, waited <-chan struct{}, logPath string) error {
	c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1})
	defer c.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		err := c.Ping(ctx).Err()
		if err == nil {
			return nil
		}
		select {
		case <-waited:
			logText, _ := os.ReadFile(logPath) // #nosec G304 -- the log file of a server this bench started
			return fmt.Errorf("private redis-server %s exited at start: %s", addr, strings.TrimSpace(string(logText)))
		default:
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("private redis-server %s did not answer within 10s: %w", addr, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// eachNode runs fn on every master of a cluster (at once), or on the one server.
func eachNode(ctx context.Context, c redis.UniversalClient, fn func(ctx context.Context, c *redis.Client) error) error {
	switch x := c.(type) {
	case *redis.ClusterClient:
		return x.ForEachMaster(ctx, fn)
	case *redis.Client:
		return fn(ctx, x)
	}
	return fmt.Errorf("unsupported redis client %T", c)
}

// sumNodes adds up fn over every master (or the one server).
func sumNodes(ctx context.Context, c redis.UniversalClient, fn func(ctx context.Context, c *redis.Client) (int64, error)) (int64, error) {
	var mu sync.Mutex
	var sum int64
	err := eachNode(ctx, c, func(ctx context.Context, c *redis.Client) error {
		n, err := fn(ctx, c)
		mu.Lock()
		sum += n
		mu.Unlock()
		return err
	})
	return sum, err
}

// keys is the KeySpace of a service of this run under prefix: on a cluster with the stream
// partitions the in-process services use.
func (b *bencher) keys(prefix string) adapters.KeySpace {
	k := adapters.KeySpace{Prefix: prefix, Cluster: b.redis.cluster}
	if p := b.partitions(); p > 1 {
		var err error
		if k, err = k.WithPartitions(p); err != nil {
			panic(err) // the prefix is the bench's own and P was checked by the configuration
		}
	}
	return k
}

// partitions is P of the in-process services: STREAM_PARTITIONS, or its default (1 on one
// server, adapters.DefaultClusterPartitions on a cluster).
func (b *bencher) partitions() int { return partitionsFor(b.cfg, b.redis.cluster) }

// partitionsFor is P of a stream under cfg: STREAM_PARTITIONS when set, else the cluster
// default on a cluster and 1 on one server, as the service decides it.
func partitionsFor(cfg Config, cluster bool) int {
	if cfg.StreamPartitions > 0 {
		return cfg.StreamPartitions
	}
	if cluster {
		return adapters.DefaultClusterPartitions
	}
	return 1
}

// lastEntryIDs is the last entry ID of every partition ("" for an empty one).
func (b *bencher) lastEntryIDs(ctx context.Context, keys adapters.KeySpace) (map[string]string, error) {
	out := map[string]string{}
	for _, s := range keys.Partitions().Streams() {
		id, err := lastEntryID(ctx, b.admin, s)
		if err != nil {
			return nil, err
		}
		out[s] = id
	}
	return out, nil
}

// redisMode is the mode of the Redis the bench runs on, for the clients it makes itself.
func (b *bencher) redisMode() adapters.RedisMode {
	if b.redis.cluster {
		return adapters.RedisModeCluster
	}
	return adapters.RedisModeStandalone
}

// nodeClients are the clients of every master of a cluster, or the one server's client, to
// walk them one after the other (SCAN sees one node's keys).
func nodeClients(ctx context.Context, uc redis.UniversalClient) ([]*redis.Client, error) {
	var mu sync.Mutex
	var out []*redis.Client
	err := eachNode(ctx, uc, func(_ context.Context, c *redis.Client) error {
		mu.Lock()
		defer mu.Unlock()
		out = append(out, c)
		return nil
	})
	return out, err
}
