package main

import (
	"context"
	"net"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"

	"github.com/checkins/checkins/adapters"
)

type composeFile struct {
	Services map[string]struct {
		Command     any               `yaml:"command"`
		Entrypoint  any               `yaml:"entrypoint"`
		Environment map[string]string `yaml:"environment"`
		Deploy      struct {
			Replicas int `yaml:"replicas"`
		} `yaml:"deploy"`
		Networks any `yaml:"networks"` // a list of names, or a map of name to settings
	} `yaml:"services"`
	Networks map[string]struct {
		IPAM struct {
			Config []struct {
				Subnet string `yaml:"subnet"`
			} `yaml:"config"`
		} `yaml:"ipam"`
	} `yaml:"networks"`
}

func words(v any) string {
	switch x := v.(type) {
	case string:
		return x
	case []any:
		var out []string
		for _, e := range x {
			out = append(out, words(e))
		}
		return strings.Join(out, " ")
	}
	return ""
}

// TestComposeFiles: both compose files are valid for the compose client when one is installed
// (`docker compose` or `docker-compose` config -q; no engine needed), and the cluster file holds
// what the README promises: six cluster nodes with the documented server settings, a one-shot
// `redis-cli --cluster create` with a replica per master, and the service as an API plus
// several projectors whose settings the service knows and whose REDIS_URL is a cluster's.
func TestComposeFiles(t *testing.T) {
	t.Parallel()
	for _, f := range []string{"../../docker-compose.yml", "../../docker-compose.cluster.yml"} {
		var client []string
		switch {
		case exec.Command("docker", "compose", "version").Run() == nil:
			client = []string{"docker", "compose"}
		case exec.Command("docker-compose", "version").Run() == nil:
			client = []string{"docker-compose"}
		}
		if client == nil {
			t.Logf("no compose client installed: %s is only checked by this test's own reading", f)
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		out, err := exec.CommandContext(ctx, client[0], append(client[1:], "-f", f, "config", "-q")...).CombinedOutput() // #nosec G204 -- fixed arguments
		cancel()
		assert.NoError(t, err, "%s config -q %s:\n%s", strings.Join(client, " "), f, out)
	}

	raw, err := os.ReadFile("../../docker-compose.cluster.yml")
	require.NoError(t, err)
	var c composeFile
	require.NoError(t, yaml.Unmarshal(raw, &c))
	known := map[string]bool{}
	for _, s := range settings() {
		known[s.env] = true
	}
	nodes := 0
	for name, s := range c.Services {
		cmd := words(s.Command)
		if strings.HasPrefix(name, "redis-") && name != "redis-cluster-init" {
			nodes++
			for _, want := range []string{"--cluster-enabled yes", "--cluster-require-full-coverage no", "--appendonly yes", "--cluster-node-timeout"} {
				assert.Contains(t, cmd, want, "%s", name)
			}
		}
	}
	assert.Equal(t, 6, nodes, "3 masters + 3 replicas")

	// Each node keeps the others' addresses in its nodes.conf: the addresses must be the same
	// after a `down` and `up`, so each node has a fixed one on the cluster network, and every
	// service that talks to the cluster is on that network.
	cfg := c.Networks["cluster"].IPAM.Config
	require.Len(t, cfg, 1, "the cluster network has one subnet")
	subnet := strings.ReplaceAll(cfg[0].Subnet, "${CLUSTER_NET:-172.30.7}", "172.30.7")
	_, ipnet, err := net.ParseCIDR(subnet)
	require.NoError(t, err, "%s", cfg[0].Subnet)
	addrs := map[string]string{}
	for name, s := range c.Services {
		if !strings.HasPrefix(name, "redis-") || name == "redis-cluster-init" {
			continue
		}
		m, ok := s.Networks.(map[string]any)
		require.True(t, ok, "%s has its networks' settings", name)
		cl, _ := m["cluster"].(map[string]any)
		a, _ := cl["ipv4_address"].(string)
		a = strings.ReplaceAll(a, "${CLUSTER_NET:-172.30.7}", "172.30.7")
		ip := net.ParseIP(a)
		require.NotNil(t, ip, "%s has a fixed address on the cluster network, got %q", name, a)
		assert.True(t, ipnet.Contains(ip), "%s's %s is in %s", name, a, subnet)
		assert.NotContains(t, addrs, a, "%s and %s share an address", name, addrs[a])
		addrs[a] = name
	}
	for _, name := range []string{"redis-cluster-init", "api", "projector"} {
		assert.Equal(t, "cluster", words(c.Services[name].Networks), "%s is on the cluster network", name)
	}
	init := c.Services["redis-cluster-init"]
	assert.Contains(t, words(init.Command), "redis-cli --cluster create")
	assert.Contains(t, words(init.Command), "--cluster-replicas 1 --cluster-yes")
	// With cluster-require-full-coverage no, a node says cluster_state:ok while a master is gone:
	// the init waits for every slot served, and no read of a stalled node holds it.
	assert.Contains(t, words(init.Command), "cluster_slots_ok:16384")
	assert.Contains(t, words(init.Command), "timeout 3 redis-cli")
	for _, name := range []string{"api", "projector"} {
		s, ok := c.Services[name]
		require.True(t, ok, "service %s", name)
		for k := range s.Environment {
			assert.True(t, known[k], "%s sets %s, which is no setting of the service", name, k)
		}
		mode, err := adapters.ParseRedisMode(s.Environment["REDIS_MODE"])
		require.NoError(t, err)
		got, err := adapters.DetectRedisMode(context.Background(), adapters.ClientOptions{URL: s.Environment["REDIS_URL"], Mode: mode})
		require.NoError(t, err)
		assert.Equal(t, adapters.RedisModeCluster, got, "%s's REDIS_URL", name)
	}
	assert.Equal(t, "api", words(c.Services["api"].Command))
	assert.Equal(t, "project", words(c.Services["projector"].Command))
	assert.GreaterOrEqual(t, c.Services["projector"].Deploy.Replicas, 2, "several projectors")
}
