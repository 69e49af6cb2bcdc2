package main

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
)

// TestConfigEmptySecretFileIsNotDevMode: README (AUTH_MODE row) says that with AUTH_MODE
// empty "setting a secret means hs256". AUTH_HS256_SECRET_FILE naming an empty file (a secret
// mount whose key is missing, a file truncated by a failed write) is read as no secret at all,
// so finishAccess picks dev mode without a word: the service starts with a random key of its own,
// refuses every token of the real issuer, and prints ready-made ops tokens in its log.
// The same file with AUTH_MODE=hs256 is refused, but with a message naming AUTH_HS256_SECRET.
func TestConfigEmptySecretFileIsNotDevMode(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	for name, content := range map[string]string{"empty": "", "newline only": "\n"} {
		file := filepath.Join(dir, name)
		if err := os.WriteFile(file, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		cfg, err := parseEnv(map[string]string{"AUTH_HS256_SECRET_FILE": file, "HOME": "/home/u"})
		if assert.Error(t, err, "%s AUTH_HS256_SECRET_FILE accepted: AUTH_MODE resolved to %q", name, cfg.AuthMode) {
			assert.Contains(t, err.Error(), "AUTH_HS256_SECRET_FILE")
		}

		// The CLI: `checkins token` mints a dev-mode token (creating a dev key in STATE_DIR).
		state := t.TempDir()
		code, stdout, stderr := runCLI(t, map[string]string{"AUTH_HS256_SECRET_FILE": file, "STATE_DIR": state}, "token", "--user", "1")
		assert.Equal(t, 1, code, "%s secret file: checkins token exit code; stdout %q stderr %q", name, stdout, stderr)
		_, keyErr := os.Stat(filepath.Join(state, devKeyFile))
		assert.True(t, os.IsNotExist(keyErr), "%s secret file: checkins token created a dev key in STATE_DIR", name)
	}
}

// TestConfigSecretFileErrorsNameTheFile: with only AUTH_HS256_SECRET_FILE set, the refusals
// of finishAccess for AUTH_MODE dev, off and jwks name AUTH_HS256_SECRET, a variable the operator
// never set (the file's contents were copied into HS256Secret before the check).
func TestConfigSecretFileErrorsNameTheFile(t *testing.T) {
	t.Parallel()
	file := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(file, []byte("0123456789abcdef0123456789abcdef\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, mode := range []string{"dev", "off", "jwks"} {
		env := map[string]string{"AUTH_MODE": mode, "AUTH_HS256_SECRET_FILE": file, "HOME": "/home/u"}
		if mode == "jwks" {
			env["AUTH_JWKS_URL"], env["AUTH_ISSUER"] = "https://idp.example/jwks", "https://idp.example"
		}
		_, err := parseEnv(env)
		if assert.Error(t, err, mode) {
			assert.Contains(t, err.Error(), "AUTH_HS256_SECRET_FILE", "AUTH_MODE=%s: %v", mode, err)
		}
	}
}
