package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/checkins/checkins/adapters"
	"github.com/checkins/checkins/ports"
)

// devTokenTTL is how long the tokens dev mode prints at start stay valid.
const devTokenTTL = 24 * time.Hour

// devUser and devOpsUser are the subjects of dev mode's ready-made tokens (42 is the user of
// the README's examples).
const (
	devUser    = 42
	devOpsUser = 1
)

// httpConfig builds the HTTP server's settings: authentication per AUTH_MODE, rate limits, the
// client address. AUTH_MODE=off is refused unless every listener is on loopback.
func (s *Service) httpConfig(ctx context.Context) (ports.HTTPConfig, error) {
	cfg := s.cfg
	hc := ports.HTTPConfig{RequestTimeout: cfg.RequestTimeout, IPLimit: cfg.RateLimitIP,
		IPExtractor: ports.IPExtractor(cfg.TrustedProxies), Observe: s.proj.metrics.Middleware()}
	if err := cfg.checkListeners(); err != nil {
		return hc, err
	}
	vc := ports.VerifierConfig{Issuer: cfg.Issuer, Audience: cfg.Audience, Leeway: cfg.ClockLeeway}
	var v *ports.Verifier
	var err error
	switch cfg.AuthMode {
	case AuthOff:
		s.log.Warn("AUTH_MODE=off: NO AUTHENTICATION. Anyone who reaches the listeners may check in as any user and run every operation. Allowed only because every listener is on loopback.",
			"http_addr", cfg.HTTPAddr, "ops_addr", cfg.OpsAddr)
		return hc, nil
	case AuthJWKS:
		v, err = ports.NewJWKSVerifier(ctx, ports.JWKSConfig{URL: cfg.JWKSURL, VerifierConfig: vc,
			RefreshInterval: cfg.JWKSRefresh, MinRefreshInterval: cfg.JWKSMinRefresh,
			FetchTimeout: min(cfg.RequestTimeout, 10*time.Second), Logger: s.log})
	default:
		var key []byte
		if key, err = cfg.signingKey(); err != nil {
			return hc, err
		}
		if v, err = ports.NewHS256Verifier(key, vc); err != nil {
			return hc, err
		}
		if cfg.AuthMode == AuthDev {
			s.devIssuer, err = ports.NewTokenIssuer(key, cfg.Issuer, cfg.Audience)
		}
	}
	if err != nil {
		return hc, err
	}
	hc.Auth = &ports.AuthPolicy{Verifier: v, PublicReads: cfg.PublicReads, OpsShared: cfg.OpsAddr == cfg.HTTPAddr}
	var limiter *adapters.RedisRateLimiter
	if s.apiPipeline != nil && !cfg.RateLimitUser.Off() && s.recordCheckin != nil {
		l, err := adapters.NewRedisRateLimiter(s.client, s.apiPipeline, s.keys, cfg.RateLimitUser)
		if err != nil {
			return hc, err
		}
		limiter = l.WithReservations(s.idem)
		s.recordCheckin.WithUserLimit(limiter)
		hc.UserLimit = cfg.RateLimitUser
	}
	// Without INGEST_MIN_REPLICAS, on a single Redis or a cluster with stream partitions, a
	// check-in is recorded in one script call: the limit, the reservation and Watermill's XADD
	// (adapters.ReservingPublisher).
	if s.recordCheckin != nil && cfg.IngestMinReplicas == 0 && s.keys.IngestInOneSlot() {
		rp, err := adapters.NewReservingPublisher(s.pub, s.apiPipeline, s.idem, limiter)
		if err != nil {
			return hc, err
		}
		s.recordCheckin.WithReservingPublisher(rp)
	}
	return hc, nil
}

// OpsAddr is the ops listener's address (the public one when they share a port).
func (s *Service) OpsAddr() net.Addr {
	if s.opsListener != nil {
		return s.opsListener.Addr()
	}
	return s.listener.Addr()
}

// devTokens are dev mode's ready-made tokens and a curl line that uses them.
type devTokens struct {
	user, ops ports.Token
	curl      string
	opsCurl   string
}

func (s *Service) devTokens() (*devTokens, error) {
	if s.devIssuer == nil || s.listener == nil {
		return nil, nil
	}
	user, err := s.devIssuer.Mint(devUser, nil, devTokenTTL)
	if err != nil {
		return nil, err
	}
	ops, err := s.devIssuer.Mint(devOpsUser, []string{ports.ScopeOps}, devTokenTTL)
	if err != nil {
		return nil, err
	}
	d := &devTokens{user: user, ops: ops}
	// Both listeners speak HTTPS with TLS_CERT_FILE: the lines name https:// and trust that
	// certificate (a self-signed one is what development uses; curl takes a leaf as a trust
	// anchor as well).
	scheme, trust := "http://", ""
	if f := s.cfg.HTTP.TLSCertFile; f != "" {
		scheme, trust = "https://", " --cacert "+shellQuote(f)
	}
	if s.http != nil && s.mode.API {
		d.curl = fmt.Sprintf(`curl -i%s -X POST %s/checkins -H 'Authorization: Bearer %s' -H 'Content-Type: application/json' -d '{"locationId": 7, "starRating": 4}'`,
			trust, scheme+hostPort(s.listener.Addr()), user.Token)
	}
	d.opsCurl = fmt.Sprintf(`curl -s%s %s/ops/status -H 'Authorization: Bearer %s'`, trust, scheme+hostPort(s.OpsAddr()), ops.Token)
	return d, nil
}

// shellQuote is s as one word of a POSIX shell.
func shellQuote(s string) string {
	if s != "" && strings.Trim(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789/._-+=:,@") == "" {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// announceDev logs dev mode's tokens, and prints them plainly on w for a person to copy.
func (s *Service) announceDev(w io.Writer) error {
	d, err := s.devTokens()
	if err != nil || d == nil {
		return err
	}
	keyFile := filepath.Join(s.cfg.StateDir, devKeyFile)
	if name, addr, exposed := s.cfg.offLoopback(); exposed {
		// Other machines may reach it (HTTP_ADDR defaults to :8080): a structured log is read by
		// more people than the terminal (a log pipeline, `docker logs`), and a 24h token of scope
		// checkins:ops in it let any of them purge the poison queue. The tokens go to the
		// terminal's banner only.
		s.log.Warn("dev mode (no AUTH_* set, or AUTH_MODE=dev) on a listener other machines may reach: anyone with a token signed by the dev key may check in as any user and run every operation; set AUTH_MODE=jwks or hs256 for anything but development",
			"listener", name, "addr", addr, "key_file", keyFile)
		s.log.Info("dev mode: ready-made tokens are printed on the terminal only, not logged here; make more with `checkins token --user N [--scope checkins:ops]`",
			"key_file", keyFile)
	} else {
		s.log.Info("dev mode: ready-made tokens, signed with the dev key (valid 24h; more with `checkins token --user N`)",
			"key_file", keyFile, "user_id", devUser, "user_token", d.user.Token, "ops_token", d.ops.Token,
			"curl", d.curl, "ops_curl", d.opsCurl)
	}
	if w == nil {
		return nil
	}
	if _, _, exposed := s.cfg.offLoopback(); exposed && !isTerminal(w) {
		// Not a person's terminal (a container's output, a log file): what is printed here ends
		// up where the structured log does, read by as many.
		_, err := fmt.Fprintf(w, "\ncheckins dev mode on a listener other machines may reach: no ready-made tokens are printed here; make one with\n  checkins token --user N [--scope %s]\n\n", ports.ScopeOps)
		return err
	}
	var b strings.Builder
	fmt.Fprintf(&b, "\ncheckins dev mode: tokens signed with the dev key in %s (valid until %s)\n", keyFile, d.user.ExpiresAt.Format(time.RFC3339))
	fmt.Fprintf(&b, "  user %d token: %s\n", devUser, d.user.Token)
	fmt.Fprintf(&b, "  ops token (scope %s): %s\n", ports.ScopeOps, d.ops.Token)
	if d.curl != "" {
		fmt.Fprintf(&b, "  check in:\n    %s\n", d.curl)
	}
	fmt.Fprintf(&b, "  operations:\n    %s\n  more tokens: checkins token --user N [--scope %s]\n\n", d.opsCurl, ports.ScopeOps)
	_, err = io.WriteString(w, b.String())
	return err
}

// hostPort is an address as a client on this machine reaches it (host:port).
func hostPort(a net.Addr) string {
	host, port, err := net.SplitHostPort(a.String())
	if err != nil {
		return a.String()
	}
	if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
		host = "localhost"
	}
	return net.JoinHostPort(host, port)
}

// isTerminal says whether w is a terminal (a character device), where a person reads it.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}
