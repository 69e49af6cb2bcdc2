package adapters

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// RedisMode says whether REDIS_URL names one Redis server or a Redis Cluster.
type RedisMode string

// Modes. Auto takes a URL with several addresses for a cluster's seeds, and asks a single
// address (INFO cluster) whether it belongs to a cluster, so one seed is enough.
const (
	RedisModeAuto       RedisMode = "auto"
	RedisModeStandalone RedisMode = "standalone"
	RedisModeCluster    RedisMode = "cluster"
)

// ParseRedisMode reads a mode ("" is auto).
func ParseRedisMode(s string) (RedisMode, error) {
	switch m := RedisMode(strings.ToLower(strings.TrimSpace(s))); m {
	case "", RedisModeAuto:
		return RedisModeAuto, nil
	case RedisModeStandalone, RedisModeCluster:
		return m, nil
	}
	return "", fmt.Errorf("redis mode must be auto, standalone or cluster, got %q", s)
}

// ClusterStateReloadInterval is how often the cluster client reads the slot map again without
// being told to. go-redis reloads on MOVED, but a killed master answers nothing, so without a
// MOVED the client kept sending a dead master's slots to it: measured here, writes to a killed
// master's slots failed for about 55 s with go-redis's default (60 s), and about 3 s with 1 s
// (the failover itself takes about 2 s with cluster-node-timeout 1000 ms).
const ClusterStateReloadInterval = time.Second

// NewUniversalRedisClient builds a client for one server or a cluster (see RedisMode; o.Mode ""
// is auto). A cluster's seeds are given in go-redis's cluster URL form:
// redis://[user:password@]host:port?addr=host2:port2&addr=host3:port3 (rediss:// for TLS), and
// every seed may be left out but one. Auto mode with one address asks that server, so it needs
// Redis to answer within ctx.
func NewUniversalRedisClient(ctx context.Context, o ClientOptions) (redis.UniversalClient, error) {
	mode, err := DetectRedisMode(ctx, o)
	if err != nil {
		return nil, err
	}
	if mode == RedisModeStandalone {
		return NewRedisClient(o)
	}
	u, err := url.Parse(o.URL)
	if err != nil {
		return nil, fmt.Errorf("REDIS_URL: %w", err)
	}
	return newClusterClient(o, u)
}

// ErrRedisModeUndetected: auto mode asked the one address of REDIS_URL whether it is a cluster
// node, and it did not answer.
var ErrRedisModeUndetected = errors.New("redis mode not detected")

// DetectRedisMode resolves o.Mode to standalone or cluster (see NewUniversalRedisClient). Only
// auto mode with a single address talks to Redis; when that server does not answer within ctx
// the error wraps ErrRedisModeUndetected.
func DetectRedisMode(ctx context.Context, o ClientOptions) (RedisMode, error) {
	mode := o.Mode
	if mode == "" {
		mode = RedisModeAuto
	}
	u, err := url.Parse(o.URL)
	if err != nil {
		return "", fmt.Errorf("REDIS_URL: %w", err)
	}
	seeds := len(u.Query()["addr"])
	switch {
	case mode == RedisModeStandalone && seeds > 0:
		return "", fmt.Errorf("REDIS_URL lists %d more addresses (addr=), which only a cluster takes, but the redis mode is standalone", seeds)
	case mode == RedisModeStandalone:
		return RedisModeStandalone, nil
	case mode == RedisModeCluster || seeds > 0:
		return RedisModeCluster, nil
	}
	// Auto with one address: ask it.
	single, err := NewRedisClient(o)
	if err != nil {
		return "", err
	}
	defer func() { _ = single.Close() }()
	info, err := single.Info(ctx, "cluster").Result()
	if err != nil {
		return "", fmt.Errorf("REDIS_URL: ask %s whether it is a cluster node (or set the redis mode to standalone or cluster): %w: %w", u.Host, ErrRedisModeUndetected, err)
	}
	if strings.Contains(info, "cluster_enabled:1") {
		return RedisModeCluster, nil
	}
	return RedisModeStandalone, nil
}

// ErrRedisModeMismatch: REDIS_MODE says standalone or cluster, and the server REDIS_URL names
// says otherwise (CheckRedisMode).
var ErrRedisModeMismatch = errors.New("the redis mode does not match the server")

// CheckRedisMode asks the first address of o.URL whether it is a cluster node, for a mode given
// as standalone or cluster (auto asks already, DetectRedisMode): a standalone client of a
// cluster node has every write of a key in another node's slot refused (MOVED, CROSSSLOT),
// and a cluster client of one server every command ("cluster support disabled"). The error
// wraps ErrRedisModeMismatch when the server answered otherwise, ErrRedisModeUndetected when it
// did not answer.
func CheckRedisMode(ctx context.Context, o ClientOptions, mode RedisMode) error {
	u, err := url.Parse(o.URL)
	if err != nil {
		return fmt.Errorf("REDIS_URL: %w", err)
	}
	first := *u
	first.RawQuery = "" // the seeds (addr=) are the cluster client's; one address is asked
	o.URL = first.String()
	single, err := NewRedisClient(o)
	if err != nil {
		return err
	}
	defer func() { _ = single.Close() }()
	info, err := single.Info(ctx, "cluster").Result()
	if err != nil {
		return fmt.Errorf("ask %s whether it is a cluster node: %w: %w", u.Host, ErrRedisModeUndetected, err)
	}
	switch node := strings.Contains(info, "cluster_enabled:1"); {
	case node && mode == RedisModeStandalone:
		return fmt.Errorf("%w: REDIS_MODE is standalone, and %s is a Redis Cluster node (set REDIS_MODE=cluster, or auto)", ErrRedisModeMismatch, u.Host)
	case !node && mode == RedisModeCluster:
		return fmt.Errorf("%w: REDIS_MODE is cluster, and %s is a server without cluster support (set REDIS_MODE=standalone, or auto)", ErrRedisModeMismatch, u.Host)
	}
	return nil
}

func newClusterClient(o ClientOptions, u *url.URL) (*redis.ClusterClient, error) {
	return newClusterClientWith(o, u, ClusterStateReloadInterval, true)
}

// newClusterClientWith lets a test take the two remedies apart.
func newClusterClientWith(o ClientOptions, u *url.URL, reload time.Duration, reloadOnErrors bool) (*redis.ClusterClient, error) {
	if db := strings.Trim(u.Path, "/"); db != "" && db != "0" {
		return nil, fmt.Errorf("REDIS_URL: a Redis Cluster has database 0 only, got /%s", db)
	}
	u.Path = ""
	opt, err := redis.ParseClusterURL(u.String())
	if err != nil {
		return nil, fmt.Errorf("REDIS_URL: %w", err)
	}
	for _, a := range opt.Addrs {
		if h, p, err := net.SplitHostPort(a); err != nil || h == "" || p == "" {
			return nil, fmt.Errorf("REDIS_URL: cluster seed %q is not host:port", a)
		}
	}
	if o.DialTimeout > 0 {
		opt.DialTimeout = o.DialTimeout
	}
	if o.ReadTimeout > 0 {
		opt.ReadTimeout = o.ReadTimeout
	}
	if o.WriteTimeout > 0 {
		opt.WriteTimeout = o.WriteTimeout
	}
	if o.PoolSize > 0 {
		opt.PoolSize = o.PoolSize // per node
	}
	opt.ContextTimeoutEnabled = true
	opt.Protocol = 2 // as NewRedisClient: no push messages, no peeks for them
	opt.ClusterStateReloadInterval = reload
	if o.TLS != nil {
		// go-redis gives every node the seed's TLS configuration, the seed's host name included.
		// With REDIS_TLS_* files (a private CA, whose certificates name each node) each node is
		// verified by the host it is reached at instead (the address it announces; go-redis puts
		// the seed's host in place of a loopback one), unless REDIS_TLS_SERVER_NAME fixes one name
		// for all. A plain rediss:// URL keeps go-redis's behaviour: a certificate that names the
		// seed (or a wildcard) holds for every node.
		seed, err := o.tlsFor(opt.TLSConfig, opt.Addrs[0])
		if err != nil {
			return nil, err
		}
		parsed := opt.TLSConfig
		opt.TLSConfig = seed
		opt.NewClient = func(no *redis.Options) *redis.Client {
			no.TLSConfig = seed
			if c, err := o.tlsFor(parsed, no.Addr); err == nil {
				no.TLSConfig = c
			}
			return redis.NewClient(no)
		}
	}
	c := redis.NewClusterClient(opt)
	if !reloadOnErrors {
		return c, nil
	}
	// On every node client, so each failed attempt (not only the last, after go-redis's own
	// retries) and each failed dial asks for a new slot map.
	c.OnNewNode(func(n *redis.Client) { n.AddHook(reloadOnConnError{c}) })
	return c, nil
}

// reloadOnConnError reloads the slot map when a node cannot be reached. go-redis reloads on
// MOVED and READONLY, but a dead master answers nothing: until the next periodic reload the
// client would keep sending the master's slots to it, after its replica took over. Reloads
// are asynchronous and coalesced by go-redis (at most one every 200 ms), so a burst of errors
// costs one reload.
type reloadOnConnError struct{ c *redis.ClusterClient }

func (h reloadOnConnError) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		conn, err := next(ctx, network, addr)
		if err != nil {
			h.c.ReloadState(ctx)
		}
		return conn, err
	}
}

func (h reloadOnConnError) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if needsReload(err) {
			h.c.ReloadState(ctx)
		}
		return err
	}
}

func (h reloadOnConnError) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		if needsReload(err) {
			h.c.ReloadState(ctx)
		} else {
			for _, c := range cmds {
				if needsReload(c.Err()) {
					h.c.ReloadState(ctx)
					break
				}
			}
		}
		return err
	}
}

// needsReload: the node did not answer, or the cluster says its map changed under us.
func needsReload(err error) bool {
	if err == nil || err == redis.Nil {
		return false
	}
	for _, p := range []string{"CLUSTERDOWN", "TRYAGAIN", "MASTERDOWN"} {
		if redis.HasErrorPrefix(err, p) {
			return true
		}
	}
	reason, ok := TransientReason(err)
	return ok && (reason == "redis unreachable" || reason == "redis did not answer in time")
}
