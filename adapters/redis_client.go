package adapters

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"os"
	"time"

	"github.com/redis/go-redis/v9"
)

// ClientOptions tune the go-redis client. Timeouts are short so an outage turns into a quick
// error (503 at the API, a retried handler) instead of a hang.
type ClientOptions struct {
	URL          string
	DialTimeout  time.Duration
	ReadTimeout  time.Duration
	WriteTimeout time.Duration
	PoolSize     int
	Mode         RedisMode // NewUniversalRedisClient only; "" is auto
	// TLS, when set, is the TLS configuration of a rediss:// URL: the CA that signed the
	// servers' certificates, the client certificate a server with tls-auth-clients asks for, and
	// optionally the name every server's certificate must carry (ServerName; empty: each server
	// is verified by the host it is reached at). Without it a rediss:// URL trusts the system's
	// CAs and offers no client certificate. See LoadRedisTLS.
	TLS *tls.Config
}

// ErrTLSWithoutRediss: TLS settings were given for a redis:// URL, which speaks plain TCP.
var ErrTLSWithoutRediss = errors.New("TLS settings need a rediss:// REDIS_URL")

// tlsFor is the TLS configuration for a connection to addr: o.TLS (or go-redis's from the URL,
// parsed), with the server's host as the name to verify unless a name is fixed.
func (o ClientOptions) tlsFor(parsed *tls.Config, addr string) (*tls.Config, error) {
	if o.TLS == nil {
		return parsed, nil
	}
	if parsed == nil {
		return nil, ErrTLSWithoutRediss
	}
	c := o.TLS.Clone()
	c.InsecureSkipVerify = c.InsecureSkipVerify || parsed.InsecureSkipVerify // #nosec G402 -- only as the operator's REDIS_URL asks (?skip_verify=true, go-redis's URL option)
	if c.ServerName == "" {
		host, _, err := net.SplitHostPort(addr)
		if err != nil {
			return nil, fmt.Errorf("REDIS_URL: address %q is not host:port: %w", addr, err)
		}
		c.ServerName = host
	}
	return c, nil
}

// NewRedisClient builds a client from a redis:// or rediss:// URL. Each Watermill publisher and
// subscriber needs a client of its own: their Close closes the client they were given.
func NewRedisClient(o ClientOptions) (*redis.Client, error) {
	opt, err := redis.ParseURL(o.URL)
	if err != nil {
		return nil, fmt.Errorf("REDIS_URL: %w", err)
	}
	if opt.TLSConfig, err = o.tlsFor(opt.TLSConfig, opt.Addr); err != nil {
		return nil, err
	}
	if o.DialTimeout > 0 {
		opt.DialTimeout = o.DialTimeout
	}
	if o.ReadTimeout > 0 {
		opt.ReadTimeout = o.ReadTimeout
	}
	if o.WriteTimeout > 0 {
		opt.WriteTimeout = o.WriteTimeout
	}
	if o.PoolSize > 0 {
		opt.PoolSize = o.PoolSize
	}
	opt.ContextTimeoutEnabled = true
	// RESP2: the service uses no push messages, and with RESP3 go-redis peeks for pending push
	// notifications around every command, which costs a syscall each on the hot paths.
	opt.Protocol = 2
	// One retry hides a dropped idle connection; more would only delay the error while Redis is down.
	opt.MaxRetries = 1
	return redis.NewClient(opt), nil
}

// RedisTLSFiles name the PEM files of a TLS connection to Redis (REDIS_TLS_*).
type RedisTLSFiles struct {
	CAFile     string // the CA (bundle) that signed the servers' certificates; empty: the system's
	CertFile   string // client certificate (chain), for a server with tls-auth-clients yes
	KeyFile    string // its private key
	ServerName string // the name every server's certificate must carry; empty: each server's host
}

// Set reports whether any of the files or the name is given.
func (f RedisTLSFiles) Set() bool {
	return f.CAFile != "" || f.CertFile != "" || f.KeyFile != "" || f.ServerName != ""
}

// LoadRedisTLS reads the files into a TLS configuration (TLS 1.2 at least); nil when none is
// given. Errors name the setting at fault.
func LoadRedisTLS(f RedisTLSFiles) (*tls.Config, error) {
	if !f.Set() {
		return nil, nil
	}
	c := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: f.ServerName}
	if f.CAFile != "" {
		pem, err := os.ReadFile(f.CAFile) // #nosec G304 -- a file the operator named in REDIS_TLS_CA_FILE
		if err != nil {
			return nil, fmt.Errorf("invalid REDIS_TLS_CA_FILE: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("invalid REDIS_TLS_CA_FILE: %s holds no PEM certificate", f.CAFile)
		}
		c.RootCAs = pool
	}
	switch {
	case f.CertFile != "" && f.KeyFile == "":
		return nil, errors.New("invalid REDIS_TLS_CERT_FILE: set without REDIS_TLS_KEY_FILE; a client certificate needs its key")
	case f.KeyFile != "" && f.CertFile == "":
		return nil, errors.New("invalid REDIS_TLS_KEY_FILE: set without REDIS_TLS_CERT_FILE")
	case f.CertFile != "":
		pair, err := tls.LoadX509KeyPair(f.CertFile, f.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("invalid REDIS_TLS_CERT_FILE/REDIS_TLS_KEY_FILE: %w", err)
		}
		c.Certificates = []tls.Certificate{pair}
	}
	return c, nil
}
