package main

import (
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/checkins/checkins/ports"
)

// devKeyFile is dev mode's HS256 key, in STATE_DIR.
const devKeyFile = "dev-hs256.key"

// devKey returns dev mode's key from dir, creating a random one on first use. Two processes
// starting at once agree on one key: it is written to a temporary file and linked into place,
// which fails if another got there first.
func devKey(dir string) (key []byte, path string, created bool, err error) {
	if dir == "" {
		return nil, "", false, errors.New("dev mode needs a state directory for its key: set STATE_DIR (or HOME / XDG_STATE_HOME)")
	}
	path = filepath.Join(dir, devKeyFile)
	if key, err := readDevKey(path); err == nil || !errors.Is(err, fs.ErrNotExist) {
		return key, path, false, err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, path, false, fmt.Errorf("STATE_DIR: %w", err)
	}
	var raw [32]byte
	if _, err := rand.Read(raw[:]); err != nil {
		return nil, path, false, fmt.Errorf("dev key: %w", err)
	}
	tmp, err := os.CreateTemp(dir, devKeyFile+".*")
	if err != nil {
		return nil, path, false, fmt.Errorf("STATE_DIR: %w", err)
	}
	defer os.Remove(tmp.Name())
	_, werr := tmp.WriteString(base64.RawURLEncoding.EncodeToString(raw[:]) + "\n")
	if cerr := tmp.Close(); werr == nil {
		werr = cerr
	}
	if werr != nil {
		return nil, path, false, fmt.Errorf("STATE_DIR: %w", werr)
	}
	if err := os.Link(tmp.Name(), path); err != nil && !errors.Is(err, fs.ErrExist) {
		return nil, path, false, fmt.Errorf("STATE_DIR: %w", err)
	} else if err == nil {
		created = true
	}
	key, err = readDevKey(path)
	return key, path, created, err
}

func readDevKey(path string) ([]byte, error) {
	// Whoever could write the key could mint ops tokens: a key this user does not own, or that
	// others may read or write (a shared STATE_DIR), is refused, not trusted.
	info, err := os.Lstat(path)
	if err != nil {
		return nil, err
	}
	if !info.Mode().IsRegular() || info.Mode().Perm()&0o077 != 0 || !ownedByMe(info) {
		return nil, fmt.Errorf("dev key %s must be a file of this user's that no one else may read or write (mode 0600), found %s: anyone who can write it can mint ops tokens; delete it to make a new one", path, info.Mode())
	}
	b, err := os.ReadFile(path) // #nosec G304 -- the dev key file in STATE_DIR, chosen by the operator
	if err != nil {
		return nil, err
	}
	key, err := base64.RawURLEncoding.DecodeString(strings.TrimSpace(string(b)))
	if err != nil || len(key) < ports.MinHS256SecretBytes {
		return nil, fmt.Errorf("dev key %s is damaged (delete it to make a new one; tokens minted with it stop working)", path)
	}
	return key, nil
}

// signingKey is the HS256 key of hs256 and dev modes (nil for jwks and off).
func (c Config) signingKey() ([]byte, error) {
	switch c.AuthMode {
	case AuthHS256:
		return c.HS256Secret, nil
	case AuthDev:
		key, _, _, err := devKey(c.StateDir)
		return key, err
	}
	return nil, nil
}
