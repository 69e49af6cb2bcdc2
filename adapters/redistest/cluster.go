package redistest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// ClusterEnv is what a test needs to talk to a Redis Cluster without stepping on other tests.
type ClusterEnv struct {
	URL    string // go-redis cluster URL: redis://seed?addr=seed2&addr=seed3
	Prefix string // key prefix unique to this test, without braces
	// Cluster is the shared local cluster, nil when REDIS_CLUSTER_URL names an external one. Tests
	// that kill nodes start a private one instead (StartCluster): the shared one is everyone's.
	Cluster *Cluster
}

// OpenCluster returns REDIS_CLUSTER_URL (with a per-test key prefix) or the package's shared
// local cluster of 3 masters, started by the first test that asks. One cluster per test binary
// keeps the cost of cluster tests to one startup: tests keep apart by prefix, as they do on the
// shared REDIS_URL. Its processes die with the test binary (see spawner); CloseClusters, called
// from TestMain, also removes their data.
func OpenCluster(t testing.TB) ClusterEnv {
	t.Helper()
	prefix := fmt.Sprintf("c%d-%d", os.Getpid(), seq.Add(1))
	if u := os.Getenv("REDIS_CLUSTER_URL"); u != "" {
		return ClusterEnv{URL: u, Prefix: prefix}
	}
	shared.mu.Lock()
	defer shared.mu.Unlock()
	if shared.err != nil {
		t.Fatalf("redistest: shared cluster: %v", shared.err)
	}
	if shared.c == nil {
		c, err := newCluster(ClusterOptions{})
		if err != nil {
			shared.err = err
			t.Fatalf("redistest: shared cluster: %v", err)
		}
		shared.c = c
	}
	return ClusterEnv{URL: shared.c.URL(), Prefix: prefix, Cluster: shared.c}
}

var shared struct {
	mu  sync.Mutex
	c   *Cluster
	err error
}

// CloseClusters kills the shared cluster and removes its data. Call it from TestMain after
// m.Run; without it the processes still die with the test binary, and only the data stays.
func CloseClusters() {
	shared.mu.Lock()
	defer shared.mu.Unlock()
	if shared.c != nil {
		shared.c.close()
		shared.c = nil
	}
}

// ClusterClient returns a go-redis cluster client for a cluster URL, closed when the test ends.
// It reloads the slot map every second, as the service's client does, so a test that kills a
// master sees the promoted replica in seconds.
func ClusterClient(t testing.TB, clusterURL string) *redis.ClusterClient {
	t.Helper()
	opt, err := redis.ParseClusterURL(clusterURL)
	if err != nil {
		t.Fatalf("redistest: parse cluster URL %q: %v", clusterURL, err)
	}
	opt.ClusterStateReloadInterval = time.Second
	c := redis.NewClusterClient(opt)
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// ClusterOptions configure a private cluster.
type ClusterOptions struct {
	Masters    int      // default 3
	Replicas   int      // replicas per master (0 or more); the nodes after the masters
	AppendOnly bool     // AOF on with appendfsync everysec (default off, like Options)
	Args       []string // more redis-server arguments for every node
	// Password, when set, is every node's requirepass and masterauth; the helper's own clients,
	// redis-cli and URL use it.
	Password string
	// TLS, when set, makes every node speak TLS only, its cluster bus and replication included
	// (URL is rediss://); the helper's clients and redis-cli use the files' client certificate.
	TLS *TLSFiles
}

// Cluster is a local Redis Cluster of redis-server processes on free loopback ports.
type Cluster struct {
	opts  ClusterOptions
	root  string // one directory, a subdirectory per node
	mu    sync.Mutex
	nodes []*clusterNode
}

type clusterNode struct {
	port int
	bus  int // cluster bus port, chosen too: port+10000 may be taken or beyond 65535
	dir  string
	cmd  *exec.Cmd
	done chan struct{} // closed when the process has exited
}

// StartCluster starts a private cluster for one test: it is killed when the test ends, and
// KillNode/RestartNode hurt nobody else.
func StartCluster(t testing.TB, opts ClusterOptions) *Cluster {
	t.Helper()
	c, err := newCluster(opts)
	if err != nil {
		t.Fatalf("redistest: %v", err)
	}
	t.Cleanup(c.close)
	return c
}

func newCluster(opts ClusterOptions) (*Cluster, error) {
	if !Available() {
		return nil, errors.New("redis-server not found in PATH; install Redis 7 (apt-get install redis-server) or set REDIS_CLUSTER_URL")
	}
	if _, err := exec.LookPath("redis-cli"); err != nil {
		return nil, errors.New("redis-cli not found in PATH (it creates the cluster); install Redis 7 (apt-get install redis-tools)")
	}
	if opts.Masters == 0 {
		opts.Masters = 3
	}
	if opts.Masters < 3 {
		return nil, fmt.Errorf("a cluster needs at least 3 masters, got %d", opts.Masters)
	}
	root, err := os.MkdirTemp("", "redistest-cluster-")
	if err != nil {
		return nil, err
	}
	c := &Cluster{opts: opts, root: root}
	ok := false
	defer func() {
		if !ok {
			c.close()
		}
	}()
	for i := range opts.Masters * (1 + opts.Replicas) {
		dir := filepath.Join(root, strconv.Itoa(i))
		if err := os.Mkdir(dir, 0o750); err != nil {
			return nil, err
		}
		n := &clusterNode{dir: dir}
		c.nodes = append(c.nodes, n)
		if err := c.startNode(n, true); err != nil {
			return nil, err
		}
	}
	// redis-cli makes the first Masters nodes masters (all on one host, it takes them in the
	// order given) and the rest their replicas, with an even split of the 16384 slots.
	args := append(c.cliAuth(), "--cluster", "create")
	args = append(args, c.Addrs()...)
	args = append(args, "--cluster-replicas", strconv.Itoa(opts.Replicas), "--cluster-yes")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if out, err := exec.CommandContext(ctx, "redis-cli", args...).CombinedOutput(); err != nil { // #nosec G204 -- a test helper: redis-cli with the cluster's own node addresses and password
		return nil, fmt.Errorf("redis-cli --cluster create: %v\n%s", err, out)
	}
	if err := c.waitHealthy(30 * time.Second); err != nil {
		return nil, err
	}
	ok = true
	return c, nil
}

// spawner starts every node process from one OS thread that lives as long as the test binary:
// Pdeathsig fires when the thread that started a child exits, so the nodes are killed with the
// binary however it ends (a panic, a test timeout, SIGKILL), and never while it runs.
var spawner = sync.OnceValue(func() chan func() {
	ch := make(chan func())
	go func() {
		runtime.LockOSThread() // never unlocked: the thread stays for the binary's life
		for f := range ch {
			f()
		}
	}()
	return ch
})

func (c *Cluster) startNode(n *clusterNode, first bool) error {
	for attempt := 0; ; attempt++ {
		if first {
			p, err := freePortErr()
			if err != nil {
				return err
			}
			b, err := freePortErr()
			if err != nil {
				return err
			}
			n.port, n.bus = p, b
		}
		err := c.spawn(n)
		if err == nil {
			return nil
		}
		// Another test may have taken the free port between our probe and the bind; a first
		// start may move to another port, a restart must keep its own.
		if first && attempt < 5 && strings.Contains(err.Error(), "Address already in use") {
			continue
		}
		return err
	}
}

func (c *Cluster) spawn(n *clusterNode) error {
	logPath := filepath.Join(n.dir, "redis.log")
	args := []string{"--port", strconv.Itoa(n.port)}
	if c.opts.TLS != nil {
		args = append(c.opts.TLS.serverArgs(n.port), "--tls-cluster", "yes", "--tls-replication", "yes")
	}
	args = append(args, "--bind", "127.0.0.1", "--dir", n.dir,
		"--daemonize", "no", "--logfile", logPath, "--save", "",
		"--cluster-enabled", "yes", "--cluster-config-file", filepath.Join(n.dir, "nodes.conf"),
		"--cluster-port", strconv.Itoa(n.bus), "--cluster-node-timeout", "1000",
		// What docs/cluster.md recommends: a dead master costs its own slots only.
		"--cluster-require-full-coverage", "no")
	if c.opts.AppendOnly {
		args = append(args, "--appendonly", "yes", "--appendfsync", "everysec")
	} else {
		args = append(args, "--appendonly", "no")
	}
	if c.opts.Password != "" {
		args = append(args, "--requirepass", c.opts.Password, "--masterauth", c.opts.Password)
	}
	args = append(args, c.opts.Args...)
	var cmd *exec.Cmd
	var err error
	started := make(chan struct{})
	spawner() <- func() {
		defer close(started)
		cmd = exec.Command("redis-server", args...) // #nosec G204 -- a test helper: arguments from the test's own options
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
		err = cmd.Start()
	}
	<-started
	if err != nil {
		return fmt.Errorf("start redis-server: %w", err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	n.cmd, n.done = cmd, done
	deadline := time.Now().Add(10 * time.Second)
	for {
		rc := c.nodeClient(n.addr())
		perr := rc.Ping(context.Background()).Err()
		_ = rc.Close()
		if perr == nil {
			return nil
		}
		select {
		case <-done:
			log, _ := os.ReadFile(logPath) // #nosec G304 -- the log file this helper created
			return fmt.Errorf("redis-server on %d exited at start:\n%s", n.port, log)
		default:
		}
		if time.Now().After(deadline) {
			log, _ := os.ReadFile(logPath) // #nosec G304 -- the log file this helper created
			_ = cmd.Process.Kill()
			<-done
			return fmt.Errorf("redis-server on %d did not answer: %v\n%s", n.port, perr, log)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func (n *clusterNode) addr() string { return "127.0.0.1:" + strconv.Itoa(n.port) }

func (n *clusterNode) running() bool {
	if n.cmd == nil {
		return false
	}
	select {
	case <-n.done:
		return false
	default:
		return true
	}
}

func (n *clusterNode) kill() {
	if n.running() {
		_ = n.cmd.Process.Kill()
		<-n.done
	}
	n.cmd = nil
}

func (c *Cluster) close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, n := range c.nodes {
		n.kill()
	}
	_ = os.RemoveAll(c.root)
}

// Addrs are the nodes' host:port, masters first, in the order they were created.
func (c *Cluster) Addrs() []string {
	out := make([]string, len(c.nodes))
	for i, n := range c.nodes {
		out[i] = n.addr()
	}
	return out
}

// URL is the go-redis cluster URL with every node as a seed (and the password, if any).
func (c *Cluster) URL() string {
	addrs := c.Addrs()
	q := url.Values{"addr": addrs[1:]}
	u := url.URL{Scheme: "redis", Host: addrs[0], RawQuery: q.Encode()}
	if c.opts.TLS != nil {
		u.Scheme = "rediss"
	}
	if c.opts.Password != "" {
		u.User = url.UserPassword("", c.opts.Password)
	}
	return u.String()
}

// nodeClient is a plain client of one node, without retries, with the cluster's password.
func (c *Cluster) nodeClient(addr string) *redis.Client {
	return redis.NewClient(&redis.Options{Addr: addr, Password: c.opts.Password, MaxRetries: -1, TLSConfig: c.opts.TLS.clientConfig()})
}

// cliAuth is redis-cli's arguments for the cluster's password and TLS (none without them).
func (c *Cluster) cliAuth() []string {
	var args []string
	if c.opts.TLS != nil {
		args = c.opts.TLS.cliArgs()
	}
	if c.opts.Password == "" {
		return args
	}
	return append(args, "-a", c.opts.Password, "--no-auth-warning")
}

// Len is the number of nodes.
func (c *Cluster) Len() int { return len(c.nodes) }

// NodeClient is a plain client of node i (to read its INFO, or to act on it alone).
func (c *Cluster) NodeClient(t testing.TB, i int) *redis.Client {
	t.Helper()
	rc := c.nodeClient(c.nodes[i].addr())
	t.Cleanup(func() { _ = rc.Close() })
	return rc
}

// KillNode kills node i at once (SIGKILL), like a crash.
func (c *Cluster) KillNode(i int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.nodes[i].kill()
}

// RestartNode starts node i again on its port and directory: it rejoins with its nodes.conf
// (as a replica, if its replica was promoted meanwhile).
func (c *Cluster) RestartNode(t testing.TB, i int) {
	t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.nodes[i].running() {
		t.Fatalf("redistest: node %d is running", i)
	}
	if err := c.startNode(c.nodes[i], false); err != nil {
		t.Fatalf("redistest: restart node %d: %v", i, err)
	}
}

// WaitHealthy waits until every running node reports cluster_state:ok and agrees on who serves
// every slot, and every replica's link to its master is up.
func (c *Cluster) WaitHealthy(t testing.TB, timeout time.Duration) {
	t.Helper()
	if err := c.waitHealthy(timeout); err != nil {
		t.Fatalf("redistest: %v", err)
	}
}

func (c *Cluster) waitHealthy(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		err := c.healthy()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("cluster not healthy after %s: %w", timeout, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (c *Cluster) healthy() error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	var first []string
	for i, n := range c.nodes {
		if !n.running() {
			continue
		}
		rc := c.nodeClient(n.addr())
		info, err := rc.ClusterInfo(ctx).Result()
		var masters []string
		if err == nil {
			masters, err = slotOwners(ctx, rc)
		}
		var repl string
		if err == nil {
			repl, err = rc.Info(ctx, "replication").Result()
		}
		_ = rc.Close()
		if err != nil {
			return fmt.Errorf("node %d: %w", i, err)
		}
		if !strings.Contains(info, "cluster_state:ok") {
			return fmt.Errorf("node %d: not cluster_state:ok", i)
		}
		// A replica that never synced cannot take over: a fault test must not kill its master
		// before the link is up.
		if strings.Contains(repl, "role:slave") && !strings.Contains(repl, "master_link_status:up") {
			return fmt.Errorf("node %d: replica not in sync with its master yet", i)
		}
		if first == nil {
			first = masters
		} else if !slices.Equal(first, masters) {
			return fmt.Errorf("node %d sees other slot owners: %v vs %v", i, masters, first)
		}
	}
	return nil
}

// slotOwners is the master address serving each slot range, as one node sees it.
func slotOwners(ctx context.Context, rc *redis.Client) ([]string, error) {
	slots, err := rc.ClusterSlots(ctx).Result()
	if err != nil {
		return nil, err
	}
	var out []string
	for _, s := range slots {
		if len(s.Nodes) == 0 {
			return nil, fmt.Errorf("slots %d-%d have no node", s.Start, s.End)
		}
		out = append(out, fmt.Sprintf("%d-%d@%s", s.Start, s.End, s.Nodes[0].Addr))
	}
	slices.Sort(out)
	return out, nil
}

// Masters is the index of every running node that is a master now.
func (c *Cluster) Masters(t testing.TB) []int {
	t.Helper()
	var out []int
	for i, n := range c.nodes {
		if !n.running() {
			continue
		}
		rc := c.nodeClient(n.addr())
		role, err := rc.Do(context.Background(), "ROLE").Slice()
		_ = rc.Close()
		if err != nil {
			t.Fatalf("redistest: ROLE of node %d: %v", i, err)
		}
		if len(role) > 0 && role[0] == "master" {
			out = append(out, i)
		}
	}
	return out
}

// MasterOf is the index of the node serving slot now, as the first running node sees it.
func (c *Cluster) MasterOf(t testing.TB, slot int) int {
	t.Helper()
	for _, n := range c.nodes {
		if !n.running() {
			continue
		}
		rc := c.nodeClient(n.addr())
		slots, err := rc.ClusterSlots(context.Background()).Result()
		_ = rc.Close()
		if err != nil {
			t.Fatalf("redistest: CLUSTER SLOTS: %v", err)
		}
		for _, s := range slots {
			if slot >= int(s.Start) && slot <= int(s.End) && len(s.Nodes) > 0 {
				for i, m := range c.nodes {
					if m.addr() == s.Nodes[0].Addr {
						return i
					}
				}
			}
		}
		t.Fatalf("redistest: no node serves slot %d", slot)
	}
	t.Fatalf("redistest: no node is running")
	return -1
}

// SlotMigration is a slot marked as moving from one master to another, its keys not moved yet.
type SlotMigration struct {
	Src, Dst         int // node indexes: the slot's master, and the master it moves to
	SrcID, DstID     string
	SrcNode, DstNode *redis.Client
}

// StartSlotMigration marks slot IMPORTING on another master and MIGRATING on its own, as
// `redis-cli --cluster` does before it moves the slot's keys (with MIGRATE, left to the test).
func (c *Cluster) StartSlotMigration(t testing.TB, slot int) SlotMigration {
	t.Helper()
	ctx := context.Background()
	m := SlotMigration{Src: c.MasterOf(t, slot), Dst: -1}
	for _, i := range c.Masters(t) {
		if i != m.Src {
			m.Dst = i
			break
		}
	}
	if m.Dst < 0 {
		t.Fatalf("redistest: no other master to move slot %d to", slot)
	}
	m.SrcNode, m.DstNode = c.NodeClient(t, m.Src), c.NodeClient(t, m.Dst)
	var err error
	if m.SrcID, err = m.SrcNode.ClusterMyID(ctx).Result(); err != nil {
		t.Fatalf("redistest: CLUSTER MYID: %v", err)
	}
	if m.DstID, err = m.DstNode.ClusterMyID(ctx).Result(); err != nil {
		t.Fatalf("redistest: CLUSTER MYID: %v", err)
	}
	if err := m.DstNode.Do(ctx, "CLUSTER", "SETSLOT", slot, "IMPORTING", m.SrcID).Err(); err != nil {
		t.Fatalf("redistest: CLUSTER SETSLOT %d IMPORTING: %v", slot, err)
	}
	if err := m.SrcNode.Do(ctx, "CLUSTER", "SETSLOT", slot, "MIGRATING", m.DstID).Err(); err != nil {
		t.Fatalf("redistest: CLUSTER SETSLOT %d MIGRATING: %v", slot, err)
	}
	return m
}

func freePortErr() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// SignalNode sends sig to node i: SIGSTOP and SIGCONT make a node hang and go on (a replica
// that lags, without the cluster's links breaking for good).
func (c *Cluster) SignalNode(i int, sig syscall.Signal) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := c.nodes[i]
	if !n.running() {
		return fmt.Errorf("redistest: node %d is not running", i)
	}
	return n.cmd.Process.Signal(sig)
}

// ReplicaOf is the index of a running replica of node m, as ROLE says (-1 when it has none).
func (c *Cluster) ReplicaOf(t testing.TB, m int) int {
	t.Helper()
	for i, n := range c.nodes {
		if i == m || !n.running() {
			continue
		}
		rc := c.nodeClient(n.addr())
		role, err := rc.Do(context.Background(), "ROLE").Slice()
		_ = rc.Close()
		if err != nil {
			t.Fatalf("redistest: ROLE of node %d: %v", i, err)
		}
		if len(role) >= 3 && role[0] == "slave" && fmt.Sprint(role[2]) == strconv.Itoa(c.nodes[m].port) {
			return i
		}
	}
	return -1
}

// AddMaster starts one more node, joins it to the cluster as a master without slots
// (redis-cli --cluster add-node) and waits until every node knows it. It returns its index.
// Move slots to it with Rebalance.
func (c *Cluster) AddMaster(t testing.TB) int {
	t.Helper()
	c.mu.Lock()
	dir := filepath.Join(c.root, strconv.Itoa(len(c.nodes)))
	if err := os.Mkdir(dir, 0o750); err != nil {
		c.mu.Unlock()
		t.Fatalf("redistest: %v", err)
	}
	n := &clusterNode{dir: dir}
	if err := c.startNode(n, true); err != nil {
		c.mu.Unlock()
		t.Fatalf("redistest: add a node: %v", err)
	}
	c.nodes = append(c.nodes, n)
	i := len(c.nodes) - 1
	var seed string
	for _, m := range c.nodes[:i] {
		if m.running() {
			seed = m.addr()
			break
		}
	}
	c.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	// #nosec G204 -- a test helper: addresses of the nodes it started
	if out, err := exec.CommandContext(ctx, "redis-cli", append(c.cliAuth(), "--cluster", "add-node", n.addr(), seed)...).CombinedOutput(); err != nil {
		t.Fatalf("redistest: redis-cli --cluster add-node: %v\n%s", err, out)
	}
	// redis-cli --cluster rebalance refuses to run until every node agrees on the configuration.
	deadline := time.Now().Add(30 * time.Second)
	for {
		err := c.knowEachOther()
		if err == nil {
			err = c.healthy()
		}
		if err == nil {
			return i
		}
		if time.Now().After(deadline) {
			t.Fatalf("redistest: node %d did not join: %v", i, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// knowEachOther is nil when every running node lists every running node in CLUSTER NODES, none
// of them still in handshake.
func (c *Cluster) knowEachOther() error {
	c.mu.Lock()
	var addrs []string
	for _, n := range c.nodes {
		if n.running() {
			addrs = append(addrs, n.addr())
		}
	}
	c.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	for _, a := range addrs {
		rc := c.nodeClient(a)
		nodes, err := rc.ClusterNodes(ctx).Result()
		_ = rc.Close()
		if err != nil {
			return fmt.Errorf("%s: %w", a, err)
		}
		if strings.Contains(nodes, "handshake") || strings.Contains(nodes, "noaddr") {
			return fmt.Errorf("%s: a node is still in handshake", a)
		}
		for _, b := range addrs {
			if !strings.Contains(nodes, b+"@") {
				return fmt.Errorf("%s does not know %s yet", a, b)
			}
		}
	}
	return nil
}

// Rebalance moves slots so that every master, those without slots included, serves an even
// share (redis-cli --cluster rebalance --cluster-use-empty-masters): the keys of each moved slot
// are migrated with MIGRATE while the cluster serves, as an operator's reshard does. It returns
// redis-cli's output and how long the move took.
func (c *Cluster) Rebalance(t testing.TB) (string, time.Duration) {
	t.Helper()
	c.mu.Lock()
	var seed string
	for _, n := range c.nodes {
		if n.running() {
			seed = n.addr()
			break
		}
	}
	c.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	start := time.Now()
	// #nosec G204 -- a test helper: an address of a node it started
	out, err := exec.CommandContext(ctx, "redis-cli", append(c.cliAuth(), "--cluster", "rebalance", seed, "--cluster-use-empty-masters")...).CombinedOutput()
	took := time.Since(start)
	if err != nil || strings.Contains(string(out), "[ERR]") {
		t.Fatalf("redistest: redis-cli --cluster rebalance: %v\n%s", err, out)
	}
	return string(out), took
}
