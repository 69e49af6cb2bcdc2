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

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
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
