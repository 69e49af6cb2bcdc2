package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const osvEcho = `{"schema_version":"1.3.1","id":"GO-2026-0001","modified":"0001-01-01T00:00:00Z","aliases":["CVE-2026-1"],
 "summary":"s1","affected":[{"package":{"name":"example.com/a","ecosystem":"Go"},
 "ranges":[{"type":"SEMVER","events":[{"introduced":"0"},{"fixed":"1.2.0"},{"introduced":"1.3.0"},{"fixed":"1.4.1"}]}]}]}`

const osvReintroduced = `{"schema_version":"1.3.1","id":"GO-2026-0002","modified":"2026-01-02T03:04:05Z",
 "summary":"s2","affected":[
  {"package":{"name":"example.com/a","ecosystem":"Go"},"ranges":[{"type":"SEMVER","events":[{"introduced":"0"},{"fixed":"1.0.0"},{"introduced":"2.0.0"}]}]},
  {"package":{"name":"stdlib","ecosystem":"Go"},"ranges":[{"type":"SEMVER","events":[{"introduced":"0"},{"fixed":"1.26.9"}]}]}]}`

func writeOSV(t *testing.T, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for name, body := range files {
		require.NoError(t, os.WriteFile(filepath.Join(dir, name), []byte(body), 0o600))
	}
	return dir
}

func TestBuildDBWritesTheV1Layout(t *testing.T) {
	t.Parallel()
	src := writeOSV(t, map[string]string{"GO-2026-0001.json": osvEcho, "GO-2026-0002.json": osvReintroduced, "README.md": "not an entry"})
	out := filepath.Join(t.TempDir(), "db")
	snapshot := time.Date(2026, 11, 5, 23, 49, 57, 0, time.UTC)
	n, err := buildDB(src, out, snapshot)
	require.NoError(t, err)
	assert.Equal(t, 2, n)

	var meta dbMeta
	readJSON(t, filepath.Join(out, "index", "db.json"), &meta)
	assert.Equal(t, snapshot, meta.Modified, "the newest modified time; unset ones are the snapshot's")

	var mods []moduleMeta
	readJSON(t, filepath.Join(out, "index", "modules.json"), &mods)
	require.Len(t, mods, 2)
	assert.Equal(t, "example.com/a", mods[0].Path, "sorted by path")
	assert.Equal(t, []moduleVuln{
		{ID: "GO-2026-0001", Modified: snapshot, Fixed: "1.4.1"},
		{ID: "GO-2026-0002", Modified: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)}, // introduced again: no fix
	}, mods[0].Vulns)
	assert.Equal(t, "stdlib", mods[1].Path)
	assert.Equal(t, "1.26.9", mods[1].Vulns[0].Fixed)

	var vulns []vulnMeta
	readJSON(t, filepath.Join(out, "index", "vulns.json"), &vulns)
	require.Len(t, vulns, 2)
	assert.Equal(t, []string{"CVE-2026-1"}, vulns[0].Aliases)

	var e map[string]any
	readJSON(t, filepath.Join(out, "ID", "GO-2026-0001.json"), &e)
	assert.Equal(t, "2026-11-05T23:49:57Z", e["modified"], "the entry carries the time the index has")
	assert.Equal(t, "s1", e["summary"], "other fields as they were")
}

func TestBuildDBRefusesBadEntries(t *testing.T) {
	t.Parallel()
	for name, files := range map[string]map[string]string{
		"no entries":         {"README.md": "x"},
		"file named wrongly": {"GO-2026-9999.json": osvEcho},
		"ID with a path":     {"x.json": strings.Replace(osvEcho, "GO-2026-0001", "../../etc/x", 1)},
		"not JSON":           {"GO-2026-0001.json": "{"},
	} {
		_, err := buildDB(writeOSV(t, files), filepath.Join(t.TempDir(), "db"), time.Time{})
		assert.Error(t, err, name)
	}
}

func readJSON(t *testing.T, path string, v any) {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(b, v), "%s", path)
}

// Messages as govulncheck -format json writes them.
const (
	cfgMsg      = `{"config":{"go_version":"go1.27.3","db":"file:///db","db_last_modified":"2026-11-05T23:49:57Z"}}`
	osvMsg      = `{"osv":{"id":"GO-2026-0001","summary":"bad thing"}}`
	calledMsg   = `{"finding":{"osv":"GO-2026-0001","fixed_version":"v1.4.1","trace":[{"module":"example.com/a","version":"v1.0.0","package":"example.com/a","function":"Vulnerable"},{"module":"example.com/me","package":"example.com/me","function":"main","position":{"filename":"/x/main.go","line":7}}]}}`
	importedMsg = `{"finding":{"osv":"GO-2026-0002","trace":[{"module":"example.com/b","version":"v1.0.0","package":"example.com/b"}]}}`
)

func TestCheckFailsOnAReachableFindingNotAllowed(t *testing.T) {
	t.Parallel()
	var out bytes.Buffer
	err := check(strings.NewReader(cfgMsg+osvMsg+calledMsg+importedMsg), map[string]string{}, &out)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "GO-2026-0001")
	assert.NotContains(t, err.Error(), "GO-2026-0002", "only imported: reported, not failed")
	assert.Contains(t, out.String(), "bad thing")
	assert.Contains(t, out.String(), "example.com/me.main (main.go:7)")
	assert.Contains(t, out.String(), "1 more advisories")
	assert.Contains(t, out.String(), "(not failed): GO-2026-0002")
}

func TestCheckPassesWhenEveryReachableFindingIsAllowed(t *testing.T) {
	t.Parallel()
	var out bytes.Buffer
	// The module-level finding of the same advisory is not counted again as imported only.
	moduleLevel := `{"finding":{"osv":"GO-2026-0001","trace":[{"module":"example.com/a","version":"v1.0.0"}]}}`
	err := check(strings.NewReader(cfgMsg+osvMsg+moduleLevel+calledMsg), map[string]string{"GO-2026-0001": "we never call it with user input", "GO-2026-0003": "gone"}, &out)
	require.NoError(t, err)
	assert.NotContains(t, out.String(), "more advisories")
	assert.Contains(t, out.String(), "allowed: we never call it with user input")
	assert.Contains(t, out.String(), "no longer found, remove them from the allow file: GO-2026-0003")
}

func TestCheckNeedsGovulncheckOutput(t *testing.T) {
	t.Parallel()
	assert.Error(t, check(strings.NewReader(""), nil, &bytes.Buffer{}), "empty output is no pass")
	assert.Error(t, check(strings.NewReader("not json"), nil, &bytes.Buffer{}))
}

func TestReadAllow(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	write := func(body string) string {
		p := filepath.Join(dir, "allow.txt")
		require.NoError(t, os.WriteFile(p, []byte(body), 0o600))
		return p
	}
	got, err := readAllow(write("# comment\n\nGO-2026-0001  the reason\n"))
	require.NoError(t, err)
	assert.Equal(t, map[string]string{"GO-2026-0001": "the reason"}, got)
	for name, body := range map[string]string{
		"no reason": "GO-2026-0001\n",
		"not an ID": "CVE-2026-1 a reason\n",
		"twice":     "GO-2026-0001 a\nGO-2026-0001 b\n",
	} {
		_, err := readAllow(write(body))
		assert.Error(t, err, name)
	}
	// The project's own allow file is valid.
	_, err = readAllow("../../.ci/vuln-allow.txt")
	assert.NoError(t, err)
}
