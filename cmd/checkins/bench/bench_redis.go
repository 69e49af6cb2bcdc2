package bench

import (
	"bufio"
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/checkins/checkins/adapters"
)

// benchRedis is the Redis the bench runs against: REDIS_URL, or a private server it owns.
type benchRedis struct {
	url     string
	tls     *tls.Config // REDIS_TLS_* for REDIS_URL; nil for the private servers
	version string
	private bool
	cluster bool // a Redis Cluster: REDIS_URL of one, or the private one of --cluster
	cmd     *exec.Cmd
	waited  chan struct{}
	dir     string
	// partitions is P of the services' stream (for describe).
	partitions int
	nodes      []benchNode // the private cluster's servers
}

// benchNode is one redis-server of the private cluster.
type benchNode struct {
	cmd    *exec.Cmd
	waited chan struct{}
}

// openBenchRedis uses redisURL when set (one server or a cluster, as REDIS_MODE says);
// otherwise it starts a private redis-server without persistence, or with cluster a private
// cluster of 3 masters, so nothing on disk slows the figures down and nothing is left behind.
func openBenchRedis(ctx context.Context, redisURL string, tlsConfig *tls.Config, mode adapters.RedisMode, cluster bool, runID string, log *slog.Logger, redact func(string) string) (*benchRedis, error) {
	r := &benchRedis{url: redisURL, tls: tlsConfig}
	switch {
	case redisURL != "" && cluster:
		return nil, fmt.Errorf("--cluster starts a private cluster: unset REDIS_URL, or leave --cluster out to use the cluster REDIS_URL names")
	case cluster:
		if err := r.startPrivateCluster(ctx, runID); err != nil {
			return nil, err
		}
		mode = adapters.RedisModeCluster
	case redisURL == "":
		if err := r.startPrivate(ctx, runID); err != nil {
			return nil, err
		}
		mode = adapters.RedisModeStandalone
	}
	detected, err := adapters.DetectRedisMode(ctx, adapters.ClientOptions{URL: r.url, TLS: r.tls, Mode: mode})
	if err != nil {
		r.close(log)
		return nil, err
	}
	r.cluster = detected == adapters.RedisModeCluster
	c, err := adapters.NewUniversalRedisClient(ctx, adapters.ClientOptions{URL: r.url, TLS: r.tls, Mode: detected})
	if err != nil {
		r.close(log)
		return nil, err
	}
	defer c.Close()
	info, err := c.Info(ctx, "server").Result()
	if err != nil {
		r.close(log)
		return nil, fmt.Errorf("redis at %s does not answer INFO: %w", redact(r.url), err)
	}
	r.version = InfoField(info, "redis_version")
	return r, nil
}

func (r *benchRedis) startPrivate(ctx context.Context, runID string) error {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return fmt.Errorf("REDIS_URL is not set and redis-server is not in PATH: install Redis 7 (apt-get install redis-server) or set REDIS_URL")
	}
	port, err := freePort()
	if err != nil {
		return err
	}
	if r.dir, err = os.MkdirTemp("", runID+"-redis-"); err != nil {
		return fmt.Errorf("private redis-server: %w", err)
	}
	// #nosec G204 -- redis-server from PATH, with arguments this bench builds
	r.cmd = exec.Command(bin, "--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--dir", r.dir,
		"--save", "", "--appendonly", "no", "--daemonize", "no", "--logfile", filepath.Join(r.dir, "redis.log"))
	r.cmd.SysProcAttr = childProcAttr()
	if err := r.cmd.Start(); err != nil {
		_ = os.RemoveAll(r.dir)
		return fmt.Errorf("start redis-server: %w", err)
	}
	r.private = true
	r.waited = make(chan struct{})
	go func() { _ = r.cmd.Wait(); close(r.waited) }()
	r.url = fmt.Sprintf("redis://127.0.0.1:%d/0", port)
	if err := waitPing(ctx, net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), r.waited, filepath.Join(r.dir, "redis.log")); err != nil {
		r.close(nil)
		return err
	}
	return nil
}

// close kills the private server (it holds nothing worth keeping) and removes its directory.
func (r *benchRedis) close(log *slog.Logger) {
	if r.private && r.cluster {
		for _, n := range r.nodes {
			_ = n.cmd.Process.Kill()
			select {
			case <-n.waited:
			case <-time.After(10 * time.Second):
				if log != nil {
					log.Warn("bench: private redis-server did not exit after SIGKILL", "pid", n.cmd.Process.Pid)
				}
			}
		}
		r.nodes = nil
		_ = os.RemoveAll(r.dir) // #nosec G703 -- the directory os.MkdirTemp made for this cluster
		return
	}
	if !r.private || r.cmd == nil || r.cmd.Process == nil {
		return
	}
	_ = r.cmd.Process.Kill()
	select {
	case <-r.waited:
	case <-time.After(10 * time.Second):
		if log != nil {
			log.Warn("bench: private redis-server did not exit after SIGKILL", "pid", r.cmd.Process.Pid)
		}
	}
	_ = os.RemoveAll(r.dir) // #nosec G703 -- the directory os.MkdirTemp made for this server
	r.cmd = nil
}

func (r *benchRedis) describe() string {
	if r.private && r.cluster {
		return fmt.Sprintf("private cluster of %d masters, no persistence, %d stream partitions", len(r.nodes), r.partitions)
	}
	if r.private {
		return "private redis-server, no persistence"
	}
	u, err := url.Parse(r.url)
	if err != nil {
		return "REDIS_URL"
	}
	if r.cluster {
		return fmt.Sprintf("REDIS_URL cluster %s://%s, %d stream partitions", u.Scheme, u.Host, r.partitions)
	}
	return "REDIS_URL " + u.Scheme + "://" + u.Host
}

func InfoField(info, name string) string {
	sc := bufio.NewScanner(strings.NewReader(info))
	for sc.Scan() {
		if v, ok := strings.CutPrefix(strings.TrimSpace(sc.Text()), name+":"); ok {
			return v
		}
	}
	return "unknown"
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("find a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
