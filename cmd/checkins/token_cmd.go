package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/checkins/checkins/ports"
)

// #nosec G101 -- usage text: it names the settings, it holds no credential
const tokenUsage = `Usage:
  checkins token --user N [--scope S] [--ttl D] [--json]

Mints a token for user N, signed with the key of AUTH_MODE hs256 (AUTH_HS256_SECRET or
AUTH_HS256_SECRET_FILE) or dev (the key in STATE_DIR, created if missing), for the configured
AUTH_ISSUER and AUTH_AUDIENCE. It prints the token alone (or, with --json, the token, user,
scopes and expiry). With AUTH_MODE=jwks tokens come from your identity provider instead.

  TOKEN=$(checkins token --user 42)
  curl -H "Authorization: Bearer $TOKEN" ...
`

// maxTokenTTL bounds --ttl: a token cannot be revoked, so none lives longer than this.
const maxTokenTTL = 30 * 24 * time.Hour

// tokenCommands is the token verb.
func tokenCommands() map[string]subcommand {
	return map[string]subcommand{
		"token": {"mint a token for a user (hs256 and dev modes)", tokenCommand},
	}
}

func tokenCommand(_ context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("checkins token", flag.ContinueOnError)
	fs.SetOutput(stderr)
	user := ports.DecimalInt(fs, "user", int64(0), "the user id the token speaks for (its subject), an integer >= 1")
	var scopes []string
	fs.Func("scope", fmt.Sprintf("a scope to grant, repeatable or space/comma-separated: %s", strings.Join(ports.KnownScopes, ", ")), func(v string) error {
		for _, s := range strings.FieldsFunc(v, func(r rune) bool { return r == ',' || r == ' ' }) {
			if !slices.Contains(ports.KnownScopes, s) {
				return fmt.Errorf("unknown scope %q: use %s", s, strings.Join(ports.KnownScopes, " or "))
			}
			if !slices.Contains(scopes, s) {
				scopes = append(scopes, s)
			}
		}
		return nil
	})
	ttl := fs.Duration("ttl", time.Hour, "how long the token is valid (at most 720h)")
	asJSON := fs.Bool("json", false, "print the token, user, scopes and expiry as JSON")
	fs.Usage = func() {
		fmt.Fprint(stderr, tokenUsage, "\nFlags:\n")
		fs.PrintDefaults()
	}
	cfg, rest, err := parseConfig(fs, args, getenv)
	if err != nil {
		return err
	}
	if len(rest) > 0 {
		return fmt.Errorf("unexpected arguments: %v", rest)
	}
	switch {
	case *user < 1:
		return fmt.Errorf("--user must be an integer >= 1, got %d", *user)
	case *ttl < time.Second || *ttl > maxTokenTTL: // below a second, exp (in seconds) is iat
		return fmt.Errorf("--ttl must be from 1s to %s, got %s", maxTokenTTL, *ttl)
	}
	switch cfg.AuthMode {
	case AuthJWKS:
		return fmt.Errorf("AUTH_MODE=jwks: tokens come from your identity provider (issuer %s); checkins token mints only hs256 and dev tokens", cfg.Issuer)
	case AuthOff:
		return errors.New("AUTH_MODE=off: the service takes no tokens, so there is nothing to mint")
	}
	key, err := cfg.signingKey()
	if err != nil {
		return err
	}
	iss, err := ports.NewTokenIssuer(key, cfg.Issuer, cfg.Audience)
	if err != nil {
		return err
	}
	tok, err := iss.Mint(*user, scopes, *ttl)
	if err != nil {
		return err
	}
	if *asJSON {
		return ports.WriteJSON(stdout, tok)
	}
	_, err = fmt.Fprintln(stdout, tok.Token)
	return err
}
