package ports

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"golang.org/x/net/netutil"
)

// ServerLimits bound what one client can hold of a listener: time to send headers and body, time
// to take the answer, time a keep-alive connection may idle, header size, open connections.
// Without them a client sending one byte per second, or thousands of idle connections, keep
// goroutines and descriptors until the process can accept nothing else.
type ServerLimits struct {
	ReadHeaderTimeout time.Duration // request line and headers
	ReadTimeout       time.Duration // the whole request, body included
	WriteTimeout      time.Duration // from the end of the headers to the end of the answer
	IdleTimeout       time.Duration // a keep-alive connection waiting for its next request
	MaxHeaderBytes    int           // 431 beyond it (net/http allows 4 KiB of slack on top)
	MaxConns          int           // open connections; 0: no cap
	TLS               *tls.Config   // nil: plain HTTP
}

// HTTPListener is one listening HTTP server with its own limits. The process runs one per
// address (the public API, and an operations listener next to it), so saturating one leaves the
// others answering.
type HTTPListener struct {
	Name string // for logs: "http", "ops"
	ln   net.Listener
	srv  *http.Server
	log  *slog.Logger
}

// ListenHTTP binds addr and prepares h behind limits; Serve starts answering. h may be nil
// when the caller binds first and gives the handler (Handle) before Serve. The connection cap
// sits under TLS, so it counts TCP connections, handshakes included: past it, new connections wait
// in the kernel's accept queue until one closes, instead of the process running out of
// descriptors (accept: too many open files) and failing everything that opens one, Redis
// connections included.
func ListenHTTP(name, addr string, h http.Handler, lim ServerLimits, log *slog.Logger) (*HTTPListener, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	if lim.MaxConns > 0 {
		ln = netutil.LimitListener(ln, lim.MaxConns)
	}
	srv := &http.Server{
		Handler:           h,
		ReadHeaderTimeout: lim.ReadHeaderTimeout,
		ReadTimeout:       lim.ReadTimeout,
		WriteTimeout:      lim.WriteTimeout,
		IdleTimeout:       lim.IdleTimeout,
		MaxHeaderBytes:    lim.MaxHeaderBytes,
		// net/http's own complaints (accept errors, TLS handshakes, panics) go to the structured log.
		ErrorLog: slog.NewLogLogger(log.With("listener", name).Handler(), slog.LevelWarn),
	}
	if lim.TLS != nil {
		srv.TLSConfig = lim.TLS.Clone()
	}
	return &HTTPListener{Name: name, ln: ln, srv: srv, log: log}, nil
}

// Handle sets the handler; before Serve only.
func (l *HTTPListener) Handle(h http.Handler) { l.srv.Handler = h }

// Addr is the bound address (the port, when addr asked for :0).
func (l *HTTPListener) Addr() net.Addr { return l.ln.Addr() }

// TLS tells whether the listener speaks HTTPS.
func (l *HTTPListener) TLS() bool { return l.srv.TLSConfig != nil }

// Serve answers until Shutdown; it returns nil after a Shutdown.
func (l *HTTPListener) Serve() error {
	var err error
	if l.srv.TLSConfig != nil {
		// ServeTLS adds HTTP/2 to the ALPN protocols; the certificate is in TLSConfig already.
		err = l.srv.ServeTLS(l.ln, "", "")
	} else {
		err = l.srv.Serve(l.ln)
	}
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}

// Shutdown stops accepting, then waits for in-flight requests until ctx ends.
func (l *HTTPListener) Shutdown(ctx context.Context) error { return l.srv.Shutdown(ctx) }

// Close closes the listener without serving (a start that failed after Listen).
func (l *HTTPListener) Close() error { return l.ln.Close() }

// LoadTLS reads a certificate and its key (PEM files) for a listener that accepts TLS 1.2 and
// newer only: the versions before it are deprecated (RFC 8996) and have known weaknesses.
func LoadTLS(certFile, keyFile string) (*tls.Config, error) {
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, fmt.Errorf("load certificate %s and key %s: %w", certFile, keyFile, err)
	}
	return &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{cert}}, nil
}
