package main

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/checkins/checkins/app/command"
	"github.com/checkins/checkins/ports"
)

// Authentication modes (AUTH_MODE).
const (
	AuthJWKS  = "jwks"
	AuthHS256 = "hs256"
	AuthDev   = "dev"
	AuthOff   = "off"
)

// defaultIssuer is the issuer and audience of hs256 and dev tokens unless configured.
const defaultIssuer = "checkins"

// AccessConfig is who may call the service and how often: authentication, the ops listener,
// rate limits and the proxies trusted to name the client's address.
type AccessConfig struct {
	AuthMode        string // jwks, hs256, dev or off (resolved: never empty after parseConfig)
	JWKSURL         string
	Issuer          string
	Audience        string
	HS256Secret     []byte // from AUTH_HS256_SECRET or AUTH_HS256_SECRET_FILE; never logged
	hs256SecretEnv  bool
	HS256SecretFile string
	ClockLeeway     time.Duration
	PublicReads     bool
	JWKSRefresh     time.Duration
	JWKSMinRefresh  time.Duration
	StateDir        string // dev mode's key lives here
	OpsAddr         string
	RateLimitUser   command.RateLimit
	RateLimitIP     command.RateLimit
	TrustedProxies  []*net.IPNet
}

func accessSettings() []setting {
	dur := func(dst func(*Config) *time.Duration, lo, hi time.Duration) func(*Config, string) error {
		return func(c *Config, v string) error {
			d, err := time.ParseDuration(v)
			if err != nil {
				return fmt.Errorf("not a duration like 30s or 15m: %q", v)
			}
			if d < lo || (hi > 0 && d > hi) {
				return fmt.Errorf("must be from %s to %s, got %s", lo, hi, d)
			}
			*dst(c) = d
			return nil
		}
	}
	rate := func(dst func(*Config) *command.RateLimit) func(*Config, string) error {
		return func(c *Config, v string) error {
			l, err := command.ParseRateLimit(v)
			if err != nil {
				return err
			}
			*dst(c) = l
			return nil
		}
	}
	return []setting{
		{"AUTH_MODE", "auth-mode", "", "jwks (tokens of your identity provider), hs256 (a shared secret), dev (a random key made on first run in STATE_DIR) or off (no authentication; only on loopback listeners); empty: jwks when AUTH_JWKS_URL is set, hs256 when a secret is, otherwise dev", func(c *Config, v string) error {
			switch v {
			case "", AuthJWKS, AuthHS256, AuthDev, AuthOff:
				c.AuthMode = v
				return nil
			}
			return fmt.Errorf("must be jwks, hs256, dev or off, got %q", v)
		}},
		{"AUTH_JWKS_URL", "auth-jwks-url", "", "JWK Set URL of the identity provider (jwks mode; https, or http on loopback)", func(c *Config, v string) error {
			if v != "" {
				u, err := url.Parse(v)
				if err != nil || u.Host == "" || (u.Scheme != "https" && u.Scheme != "http") {
					return fmt.Errorf("must be an https:// URL, got %q", redact(v))
				}
				if u.Scheme == "http" && !isLoopback(u.Hostname()) { // refused here, naming the setting, not after connecting to Redis
					return fmt.Errorf("must use https (plain http only on loopback), got %q", redact(v))
				}
			}
			c.JWKSURL = v
			return nil
		}},
		{"AUTH_ISSUER", "auth-issuer", "", "the exact iss every token must carry (required with jwks; default checkins with hs256 and dev)", func(c *Config, v string) error {
			c.Issuer = v
			return nil
		}},
		{"AUTH_AUDIENCE", "auth-audience", "checkins", "the audience every token's aud must include", func(c *Config, v string) error {
			if v == "" {
				return errors.New("must not be empty")
			}
			c.Audience = v
			return nil
		}},
		{"AUTH_HS256_SECRET", "auth-hs256-secret", "", "hs256 mode: the shared secret, at least 32 bytes (never logged; prefer AUTH_HS256_SECRET_FILE)", func(c *Config, v string) error {
			c.HS256Secret, c.hs256SecretEnv = []byte(v), v != ""
			return nil
		}},
		{"AUTH_HS256_SECRET_FILE", "auth-hs256-secret-file", "", "hs256 mode: a file holding the secret (a trailing newline is ignored)", func(c *Config, v string) error {
			c.HS256SecretFile = v
			return nil
		}},
		{"AUTH_CLOCK_LEEWAY", "auth-clock-leeway", "30s", "clock skew allowed when checking a token's exp and nbf", dur(func(c *Config) *time.Duration { return &c.ClockLeeway }, 0, 5*time.Minute)},
		{"AUTH_PUBLIC_READS", "auth-public-reads", "true", "GET query routes answer without a token (false: any valid token is needed)", func(c *Config, v string) error {
			b, err := strconv.ParseBool(v)
			if err != nil {
				return fmt.Errorf("must be true or false, got %q", v)
			}
			c.PublicReads = b
			return nil
		}},
		{"AUTH_JWKS_REFRESH", "auth-jwks-refresh", "15m", "jwks mode: how often the key set is fetched again", dur(func(c *Config) *time.Duration { return &c.JWKSRefresh }, time.Second, 24*time.Hour)},
		{"AUTH_JWKS_MIN_REFRESH", "auth-jwks-min-refresh", "30s", "jwks mode: a token with an unknown kid fetches the key set at most this often", dur(func(c *Config) *time.Duration { return &c.JWKSMinRefresh }, 100*time.Millisecond, time.Hour)},
		{"STATE_DIR", "state-dir", "", "where dev mode keeps its key (default $XDG_STATE_HOME/checkins, else ~/.local/state/checkins)", func(c *Config, v string) error {
			c.StateDir = v
			return nil
		}},
		{"OPS_ADDR", "ops-addr", "127.0.0.1:8081", "listen address of /ops and /metrics (and /healthz, /readyz); the same as HTTP_ADDR serves everything on one port", func(c *Config, v string) error {
			if err := checkListenAddr(v); err != nil {
				return err
			}
			c.OpsAddr = v
			return nil
		}},
		{"RATE_LIMIT_USER", "rate-limit-user", "10/s,burst=20", "POST /checkins per token subject, shared by every API instance on the Redis (off: none)", rate(func(c *Config) *command.RateLimit { return &c.RateLimitUser })},
		{"RATE_LIMIT_IP", "rate-limit-ip", "200/s,burst=400", "every route per client address, per process and listener (off: none)", rate(func(c *Config) *command.RateLimit { return &c.RateLimitIP })},
		{"TRUSTED_PROXIES", "trusted-proxies", "", "comma-separated IPs or CIDR ranges of proxies whose X-Forwarded-For names the client (default: none, the peer address is the client)", func(c *Config, v string) error {
			n, err := ports.ParseTrustedProxies(v)
			if err != nil {
				return err
			}
			c.TrustedProxies = n
			return nil
		}},
	}
}

// finishAccess checks the access settings against each other and fills what depends on them.
func (c *Config) finishAccess(getenv func(string) string) error {
	if c.hs256SecretEnv && c.HS256SecretFile != "" {
		return errors.New("invalid AUTH_HS256_SECRET_FILE: set either AUTH_HS256_SECRET or AUTH_HS256_SECRET_FILE, not both")
	}
	if c.HS256SecretFile != "" {
		b, err := os.ReadFile(c.HS256SecretFile)
		if err != nil {
			return fmt.Errorf("invalid AUTH_HS256_SECRET_FILE: %w", err)
		}
		c.HS256Secret = []byte(strings.TrimRight(string(b), "\r\n"))
	}
	// A secret file chooses hs256 as a secret does, empty or not: an empty one (a secret mount
	// without its key, a truncated file) fell through to dev mode, which turned the identity
	// provider's tokens away and logged ready-made ops tokens.
	hasSecret := len(c.HS256Secret) > 0 || c.HS256SecretFile != ""
	name := "AUTH_HS256_SECRET"
	if c.HS256SecretFile != "" {
		name = "AUTH_HS256_SECRET_FILE"
	}
	if c.AuthMode == "" {
		switch {
		case c.JWKSURL != "":
			c.AuthMode = AuthJWKS
		case hasSecret:
			c.AuthMode = AuthHS256
		default:
			c.AuthMode = AuthDev
		}
	}
	switch c.AuthMode {
	case AuthJWKS:
		if c.JWKSURL == "" {
			return errors.New("invalid AUTH_JWKS_URL: AUTH_MODE=jwks needs the identity provider's JWK Set URL")
		}
		if c.Issuer == "" {
			return errors.New("invalid AUTH_ISSUER: AUTH_MODE=jwks needs the exact issuer of your tokens")
		}
		if hasSecret {
			return fmt.Errorf("invalid %s: AUTH_MODE=jwks verifies with the identity provider's keys; an HS256 secret would mix symmetric and asymmetric algorithms", name)
		}
	case AuthHS256:
		if !hasSecret {
			return errors.New("invalid AUTH_HS256_SECRET: AUTH_MODE=hs256 needs AUTH_HS256_SECRET or AUTH_HS256_SECRET_FILE")
		}
		if len(c.HS256Secret) == 0 && c.HS256SecretFile != "" {
			return fmt.Errorf("invalid AUTH_HS256_SECRET_FILE: the file %s is empty", c.HS256SecretFile)
		}
		if len(c.HS256Secret) < ports.MinHS256SecretBytes {
			return fmt.Errorf("invalid %s: the secret must be at least %d bytes, got %d", name, ports.MinHS256SecretBytes, len(c.HS256Secret))
		}
	case AuthDev, AuthOff:
		if hasSecret {
			return fmt.Errorf("invalid %s: it is used only with AUTH_MODE=hs256 (AUTH_MODE is %s)", name, c.AuthMode)
		}
	}
	if c.AuthMode != AuthJWKS && c.JWKSURL != "" {
		return fmt.Errorf("invalid AUTH_JWKS_URL: it is used only with AUTH_MODE=jwks (AUTH_MODE is %s)", c.AuthMode)
	}
	if c.Issuer == "" {
		c.Issuer = defaultIssuer
	}
	if c.StateDir == "" {
		switch {
		case getenv("XDG_STATE_HOME") != "":
			c.StateDir = filepath.Join(getenv("XDG_STATE_HOME"), "checkins")
		case getenv("HOME") != "":
			c.StateDir = filepath.Join(getenv("HOME"), ".local", "state", "checkins")
		}
	}
	return nil
}

// checkListeners refuses AUTH_MODE=off unless every listener is on loopback.
func (c Config) checkListeners() error {
	if c.AuthMode != AuthOff {
		return nil
	}
	if name, addr, ok := c.offLoopback(); ok {
		return fmt.Errorf("AUTH_MODE=off is allowed only when every listener is on loopback: %s is %q (use 127.0.0.1:port, or an authentication mode)", name, addr)
	}
	return nil
}

// offLoopback names the first listener other machines may reach (ok false: every one is on
// loopback).
func (c Config) offLoopback() (name, addr string, ok bool) {
	for _, a := range []struct{ name, addr string }{{"HTTP_ADDR", c.HTTPAddr}, {"OPS_ADDR", c.OpsAddr}} {
		host, _, _ := net.SplitHostPort(a.addr)
		if !isLoopback(host) {
			return a.name, a.addr, true
		}
	}
	return "", "", false
}

// checkListenAddr: host:port or :port, the port given (0 asks for any free one); "host:" would
// listen on a port nobody chose.
func checkListenAddr(v string) error {
	if _, port, err := net.SplitHostPort(v); err != nil || port == "" {
		return fmt.Errorf("must be host:port or :port, got %q", v)
	}
	return nil
}

// isLoopback: a host that only this machine can reach ("" and 0.0.0.0 are every interface).
func isLoopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
