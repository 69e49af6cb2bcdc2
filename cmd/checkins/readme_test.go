package main

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/checkins/checkins/adapters/redistest"
)

// The README is part of the product: these checks keep it true as settings and commands change.
func TestReadmeListsEverySettingWithItsDefault(t *testing.T) {
	t.Parallel()
	readme, err := os.ReadFile("../../README.md")
	require.NoError(t, err)
	for _, s := range settings() {
		def := ""
		if s.def != "" {
			def = "`" + s.def + "`"
		}
		row := fmt.Sprintf("| `%s` | `--%s` | %s |", s.env, s.flag, def)
		assert.Contains(t, string(readme), row, "README configuration table row for %s", s.env)
	}
}

func TestReadmeCommandsExist(t *testing.T) {
	t.Parallel()
	readme, err := os.ReadFile("../../README.md")
	require.NoError(t, err)
	cmds := commands()
	for _, m := range regexp.MustCompile("`checkins ([a-z]+)").FindAllStringSubmatch(string(readme), -1) {
		_, ok := cmds[m[1]]
		assert.True(t, ok, "README mentions `checkins %s`, which is not a command", m[1])
	}
	ci, err := os.ReadFile("../../.ci/run")
	require.NoError(t, err)
	assert.Contains(t, string(readme), "go tool task test", "README's test command")
	assert.Contains(t, string(ci), "go tool task test", ".ci/run runs the README's test command")
	assert.True(t, strings.Contains(string(readme), "go run ./cmd/checkins"), "README's run command")
}

// readmeExamples are paths the README names that are not in the tree on purpose.
var readmeExamples = map[string]string{
	"app/projection/ratings_histogram.go": "the file the README's walkthrough asks you to write; cmd/checkins/extension_test.go holds its copy",
}

// TestReadmePathsExist: every file or folder the README names (in backticks or as a link) is in
// the tree: a path from the module root exactly, a shorter one (`command/record_checkin.go`,
// `batchsub/`) as the end of some path.
func TestReadmePathsExist(t *testing.T) {
	t.Parallel()
	readme, err := os.ReadFile("../../README.md")
	require.NoError(t, err)
	var tree []string
	require.NoError(t, filepath.WalkDir("../..", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && d.Name() == ".git" {
			return filepath.SkipDir
		}
		rel, _ := filepath.Rel("../..", p)
		if d.IsDir() {
			rel += "/"
		}
		tree = append(tree, filepath.ToSlash(rel))
		return nil
	}))
	roots := []string{"adapters/", "app/", "cmd/", "docs/", "domain/", "ports/", ".ci/"}
	var named []string
	for _, m := range regexp.MustCompile("`([A-Za-z0-9_.][A-Za-z0-9_./-]*)`").FindAllStringSubmatch(string(readme), -1) {
		named = append(named, m[1])
	}
	for _, m := range regexp.MustCompile(`\]\(([A-Za-z0-9_.][A-Za-z0-9_./-]*)\)`).FindAllStringSubmatch(string(readme), -1) {
		named = append(named, m[1])
	}
	checked := 0
	for _, p := range named {
		if _, ok := readmeExamples[p]; ok {
			continue
		}
		rooted := slices.ContainsFunc(roots, func(r string) bool { return strings.HasPrefix(p, r) })
		looksLikePath := strings.HasSuffix(p, ".go") || strings.HasSuffix(p, ".md") || (strings.HasSuffix(p, "/") && strings.Count(p, "/") == 1)
		switch {
		case rooted:
			checked++
			_, err := os.Stat(filepath.Join("../..", p))
			assert.NoError(t, err, "README names %s, which is not in the tree", p)
		case looksLikePath && strings.Contains(p, "/") || strings.HasSuffix(p, ".go"):
			checked++
			found := slices.ContainsFunc(tree, func(f string) bool { return f == p || strings.HasSuffix(f, "/"+p) })
			assert.True(t, found, "README names %s, which no path in the tree ends with", p)
		}
	}
	assert.Greater(t, checked, 20, "the README names paths; the pattern must find them")
}

// TestReadmeMetricsAreExported: every metric the README and docs name (`checkins_...`, and the
// short names of the README's list "all prefixed `checkins_`") is registered by serve; the README
// once named checkins_projection_handler_duration_seconds, which never existed.
func TestReadmeMetricsAreExported(t *testing.T) {
	t.Parallel()
	rdb := redistest.Open(t)
	svc := startInProcess(t, map[string]string{"REDIS_URL": rdb.URL, "KEY_PREFIX": rdb.Prefix}, Mode{API: true, Projections: true})
	descs := make(chan *prometheus.Desc, 256)
	svc.svc.proj.registry.Describe(descs)
	close(descs)
	registered := map[string]bool{}
	fq := regexp.MustCompile(`fqName: "([^"]+)"`)
	for d := range descs {
		if m := fq.FindStringSubmatch(d.String()); m != nil {
			registered[m[1]] = true
		}
	}
	require.Contains(t, registered, "checkins_projection_lag", "the registry's names are read")

	named := map[string]string{} // metric -> where
	files := []string{"../../README.md"}
	docs, err := filepath.Glob("../../docs/*.md")
	require.NoError(t, err)
	for _, f := range append(files, docs...) {
		b, err := os.ReadFile(f)
		require.NoError(t, err)
		for _, m := range regexp.MustCompile(`\bcheckins_[a-z][a-z_]*[a-z]`).FindAllString(string(b), -1) {
			named[m] = filepath.Base(f)
		}
		if _, list, ok := strings.Cut(string(b), "Metrics (all prefixed `checkins_`):"); ok {
			list, _, _ = strings.Cut(list, "\n\n")
			// Metric names have an underscore; the labels in the list (`projection`) have none.
			for _, m := range regexp.MustCompile("`([a-z]+_[a-z_]*[a-z])(\\{[^`]*\\})?`").FindAllStringSubmatch(list, -1) {
				named["checkins_"+m[1]] = filepath.Base(f) + "'s metrics list"
			}
		}
	}
	require.Contains(t, named, "checkins_projection_batch_duration_seconds", "the docs' names are read")
	for name, where := range named {
		assert.True(t, registered[name], "%s names %s, which serve does not export", where, name)
	}
}
