package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestDevKeyOthersCanWriteIsRefused: dev mode trusts its key only when no one else may read or
// write it; one planted in a shared STATE_DIR (mode 0666) let anyone mint ops tokens.
func TestDevKeyOthersCanWriteIsRefused(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	key, path, created, err := devKey(dir)
	require.NoError(t, err)
	require.True(t, created)
	info, err := os.Stat(path)
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o600), info.Mode().Perm(), "made for this user alone")
	again, _, _, err := devKey(dir)
	require.NoError(t, err)
	assert.Equal(t, key, again)

	planted := filepath.Join(t.TempDir(), devKeyFile)
	require.NoError(t, os.WriteFile(planted, []byte(strings.Repeat("QUFB", 11)+"\n"), 0o600))
	require.NoError(t, os.Chmod(planted, 0o666))
	_, _, _, err = devKey(filepath.Dir(planted))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "no one else may read or write")
	require.NoError(t, os.Chmod(planted, 0o600))
	_, _, _, err = devKey(filepath.Dir(planted))
	assert.NoError(t, err)
}
