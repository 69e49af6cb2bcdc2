package main

import (
	"context"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"
)

// TestUnitTasksNeedNoRedis: the README says `go tool task test:unit` "runs the tests that
// need no Redis", and the Taskfile's description says "Domain and app tests only (no Redis
// needed)". No package it tests may then pull in adapters/redistest, whose Open and Start fail a
// test ("redis-server not found in PATH") on a machine without redis-server and REDIS_URL.
func TestUnitTasksNeedNoRedis(t *testing.T) {
	t.Parallel()
	raw, err := os.ReadFile("../../Taskfile.yml")
	require.NoError(t, err)
	var tf struct {
		Tasks map[string]struct {
			Desc string   `yaml:"desc"`
			Cmds []string `yaml:"cmds"`
		} `yaml:"tasks"`
	}
	require.NoError(t, yaml.Unmarshal(raw, &tf))
	unit, ok := tf.Tasks["test:unit"]
	require.True(t, ok, "Taskfile has test:unit")
	require.Contains(t, unit.Desc, "no Redis needed")
	var pkgs []string
	for _, c := range unit.Cmds {
		for _, f := range strings.Fields(c) {
			if strings.HasPrefix(f, "./") {
				pkgs = append(pkgs, f)
			}
		}
	}
	require.NotEmpty(t, pkgs, "test:unit's package patterns")

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	// For each package test:unit tests: does its test binary import redistest?
	args := append([]string{"list", "-test", "-f", `{{.ImportPath}}: {{join .Deps " "}}`}, pkgs...)
	cmd := exec.CommandContext(ctx, "go", args...) // #nosec G204 -- fixed arguments
	cmd.Dir = "../.."
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
	var needRedis []string
	for _, line := range strings.Split(string(out), "\n") {
		name, deps, found := strings.Cut(line, ": ")
		if !found || !strings.HasSuffix(name, ".test") {
			continue
		}
		if strings.Contains(" "+deps+" ", " github.com/checkins/checkins/adapters/redistest ") {
			needRedis = append(needRedis, strings.TrimSuffix(name, ".test"))
		}
	}
	assert.Empty(t, needRedis, "`go tool task test:unit` (%s) tests packages whose tests start a redis-server (adapters/redistest): on a machine without Redis they fail", strings.Join(pkgs, " "))
}

// TestBuildSourcesCoverEmbeddedFiles: `go tool task build` is skipped as "up to date"
// unless one of its `sources` changed. The binary embeds files that are no Go source (the
// OpenAPI spec, the dashboard's templates and assets, the docs page): a change to any of them
// must rebuild bin/checkins, so each must match one of the build task's sources.
func TestBuildSourcesCoverEmbeddedFiles(t *testing.T) {
	t.Parallel()
	raw, err := os.ReadFile("../../Taskfile.yml")
	require.NoError(t, err)
	var tf struct {
		Tasks map[string]struct {
			Sources []string `yaml:"sources"`
		} `yaml:"tasks"`
	}
	require.NoError(t, yaml.Unmarshal(raw, &tf))
	sources := tf.Tasks["build"].Sources
	require.NotEmpty(t, sources, "the build task lists its sources")

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "go", "list", "-deps", "-f", `{{if .Module}}{{if .Module.Main}}{{.Dir}}|{{join .EmbedFiles ","}}{{end}}{{end}}`, "./cmd/checkins") // #nosec G204 -- fixed arguments
	cmd.Dir = "../.."
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
	root, err := filepath.Abs("../..")
	require.NoError(t, err)
	matches := func(rel string) bool {
		for _, s := range sources {
			if rest, ok := strings.CutPrefix(s, "**/"); ok {
				if m, _ := path.Match(rest, path.Base(rel)); m {
					return true
				}
				continue
			}
			if m, _ := path.Match(s, rel); m {
				return true
			}
		}
		return false
	}
	var embedded, missed []string
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		dir, files, _ := strings.Cut(line, "|")
		if files == "" {
			continue
		}
		for _, f := range strings.Split(files, ",") {
			rel, err := filepath.Rel(root, filepath.Join(dir, f))
			require.NoError(t, err)
			rel = filepath.ToSlash(rel)
			embedded = append(embedded, rel)
			if !matches(rel) {
				missed = append(missed, rel)
			}
		}
	}
	require.NotEmpty(t, embedded, "the binary embeds files")
	assert.Empty(t, missed, "embedded in bin/checkins but not among the build task's sources %v: changing them leaves `go tool task build` \"up to date\" with a stale binary (%d of %d embedded files)", sources, len(missed), len(embedded))
}
