package main

import (
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/checkins/checkins/ports"
)

// httpConfig is how the public HTTP listener protects itself from slow, idle and too many
// clients, which browsers may call it (CORS), and whether it speaks TLS.
type httpConfig struct {
	ReadHeaderTimeout time.Duration
	ReadTimeout       time.Duration
	WriteTimeout      time.Duration
	IdleTimeout       time.Duration
	MaxHeaderBytes    int
	MaxConns          int // 0: auto (from the descriptor limit, see maxConns)
	CORSOrigins       []string
	TLSCertFile       string
	TLSKeyFile        string
}

// defaultMaxConns is HTTP_MAX_CONNS=auto's cap when the descriptor limit leaves room for it.
const defaultMaxConns = 4096

type durSetter func(dst func(*Config) *time.Duration, min time.Duration) func(*Config, string) error

func httpSettings(dur durSetter) []setting {
	return []setting{
		{"HTTP_READ_HEADER_TIMEOUT", "http-read-header-timeout", "5s", "longest a client may take to send a request's line and headers (slow clients are disconnected)", dur(func(c *Config) *time.Duration { return &c.HTTP.ReadHeaderTimeout }, time.Millisecond)},
		{"HTTP_READ_TIMEOUT", "http-read-timeout", "10s", "longest a client may take to send a whole request, body included; at least HTTP_READ_HEADER_TIMEOUT", dur(func(c *Config) *time.Duration { return &c.HTTP.ReadTimeout }, time.Millisecond)},
		{"HTTP_WRITE_TIMEOUT", "http-write-timeout", "15s", "longest from the end of a request's headers to the end of its answer; above REQUEST_TIMEOUT", dur(func(c *Config) *time.Duration { return &c.HTTP.WriteTimeout }, time.Millisecond)},
		{"HTTP_IDLE_TIMEOUT", "http-idle-timeout", "60s", "a keep-alive connection idle this long between requests is closed", dur(func(c *Config) *time.Duration { return &c.HTTP.IdleTimeout }, time.Millisecond)},
		{"HTTP_MAX_HEADER_BYTES", "http-max-header-bytes", "16384", "largest request line and headers in bytes (431 beyond it)", func(c *Config, v string) error {
			n, err := strconv.Atoi(v)
			if err != nil || n < 1024 || n > 1<<20 {
				return fmt.Errorf("must be a number of bytes from 1024 to 1048576, got %q", v)
			}
			c.HTTP.MaxHeaderBytes = n
			return nil
		}},
		{"HTTP_MAX_CONNS", "http-max-conns", "auto", "open connections of the public listener; more wait until one closes. auto: 4096, lower when the descriptor limit (ulimit -n) needs it; a number above what the limit allows stops the start", func(c *Config, v string) error {
			if v == "auto" {
				c.HTTP.MaxConns = 0
				return nil
			}
			n, err := strconv.Atoi(v)
			if err != nil || n < 1 {
				return fmt.Errorf("must be auto or a number of connections >= 1, got %q", v)
			}
			c.HTTP.MaxConns = n
			return nil
		}},
		{"CORS_ALLOWED_ORIGINS", "cors-allowed-origins", "", "comma-separated browser origins (https://app.example.com) allowed to call the API; empty: CORS off", func(c *Config, v string) error {
			o, err := ports.ParseCORSOrigins(v)
			if err != nil {
				return err
			}
			c.HTTP.CORSOrigins = o
			return nil
		}},
		{"TLS_CERT_FILE", "tls-cert-file", "", "PEM certificate (chain) for HTTPS on HTTP_ADDR and OPS_ADDR, with TLS_KEY_FILE; TLS 1.2 at least. Empty: plain HTTP", func(c *Config, v string) error {
			c.HTTP.TLSCertFile = v
			return nil
		}},
		{"TLS_KEY_FILE", "tls-key-file", "", "PEM private key of TLS_CERT_FILE", func(c *Config, v string) error {
			c.HTTP.TLSKeyFile = v
			return nil
		}},
	}
}

// validate checks what no single setting can: how they relate.
func (h httpConfig) validate(requestTimeout time.Duration) error {
	if h.ReadTimeout < h.ReadHeaderTimeout {
		return fmt.Errorf("invalid HTTP_READ_TIMEOUT: %s is below HTTP_READ_HEADER_TIMEOUT %s, and it bounds the headers too", h.ReadTimeout, h.ReadHeaderTimeout)
	}
	// A request may take REQUEST_TIMEOUT to answer 503: the connection must still be writable then.
	if h.WriteTimeout <= requestTimeout {
		return fmt.Errorf("invalid HTTP_WRITE_TIMEOUT: %s must be above REQUEST_TIMEOUT %s, or a slow answer is cut off instead of sent", h.WriteTimeout, requestTimeout)
	}
	if (h.TLSCertFile == "") != (h.TLSKeyFile == "") {
		set, unset := "TLS_CERT_FILE", "TLS_KEY_FILE"
		if h.TLSCertFile == "" {
			set, unset = unset, set
		}
		return fmt.Errorf("invalid %s: set without %s; HTTPS needs both the certificate and its key", set, unset)
	}
	return nil
}

// reservedDescriptors are the descriptors kept out of HTTP_MAX_CONNS for everything else: Redis
// connection pools (a few clients, each up to 10 per core), the embedded Redis's own side of them,
// logs and files.
func reservedDescriptors(cores int) int { return 128 + 64*cores }

// maxConns resolves HTTP_MAX_CONNS against the process's descriptor limit: auto takes what fits,
// an explicit number that does not fit is an error (the process would fail with EMFILE under load
// instead of making new connections wait).
func (h httpConfig) maxConns(limit uint64, cores int) (int, error) {
	reserve := uint64(reservedDescriptors(cores)) // #nosec G115 -- 128 + 64 per core: positive
	room := 0
	if limit > reserve {
		room = int(min(limit-reserve, 1<<30))
	}
	switch {
	case h.MaxConns == 0 && room < 1:
		return 0, fmt.Errorf("the descriptor limit (RLIMIT_NOFILE, ulimit -n) is %d: too low for HTTP_MAX_CONNS=auto, which keeps %d for Redis connections and files; raise it", limit, reserve)
	case h.MaxConns == 0:
		return min(defaultMaxConns, room), nil
	case h.MaxConns > room:
		return 0, fmt.Errorf("invalid HTTP_MAX_CONNS: %d connections do not fit the descriptor limit (RLIMIT_NOFILE, ulimit -n) of %d, which must also keep %d for Redis connections and files: set HTTP_MAX_CONNS to at most %d, or raise the limit", h.MaxConns, limit, reserve, max(room, 0))
	}
	return h.MaxConns, nil
}

var errNoRlimit = errors.New("descriptor limit unknown on this platform")
