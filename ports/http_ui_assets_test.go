package ports_test

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"io/fs"
	"path"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/checkins/checkins/ports"
)

// TestUIVendoredFilesMatchTheirSHA256 checks every embedded vendored file against
// ui/vendor/SHA256SUMS (written when the files were copied out of their npm packages), that the
// list names nothing that is missing, and that each library ships with its licence.
func TestUIVendoredFilesMatchTheirSHA256(t *testing.T) {
	t.Parallel()
	assets := ports.UIAssets()
	sums, err := fs.ReadFile(assets, "ui/vendor/SHA256SUMS")
	require.NoError(t, err)
	want := map[string]string{}
	sc := bufio.NewScanner(strings.NewReader(string(sums)))
	for sc.Scan() {
		sum, name, ok := strings.Cut(sc.Text(), "  ")
		require.True(t, ok, "SHA256SUMS line %q", sc.Text())
		want[name] = sum
	}
	require.NotEmpty(t, want)
	got := map[string]string{}
	libs := map[string]bool{}
	require.NoError(t, fs.WalkDir(assets, "ui/vendor", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || path.Base(p) == "SHA256SUMS" {
			return err
		}
		b, err := fs.ReadFile(assets, p)
		if err != nil {
			return err
		}
		h := sha256.Sum256(b)
		rel := strings.TrimPrefix(p, "ui/vendor/")
		got[rel] = hex.EncodeToString(h[:])
		libs[path.Dir(rel)] = true
		return nil
	}))
	assert.Equal(t, want, got, "embedded vendored files and SHA256SUMS differ")
	for lib := range libs {
		assert.Contains(t, got, lib+"/LICENSE", "%s is vendored without its licence", lib)
	}
	for _, f := range []string{"htmx/htmx.min.js", "htmx-ext-sse/sse.min.js", "uplot/uPlot.iife.min.js", "uplot/uPlot.min.css"} {
		assert.Contains(t, got, f)
	}
}
