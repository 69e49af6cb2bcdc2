package main

import (
	"context"
	"fmt"
	"net"
	"runtime"

	"golang.org/x/sync/errgroup"

	"github.com/checkins/checkins/ports"
)

// publicLimits are the public listener's limits: timeouts, header size, TLS, and a connection cap
// that fits the descriptor limit. Checked before anything starts, so a cap the process could not
// honour stops it with a message instead of failing under load.
func (s *Service) publicLimits() (ports.ServerLimits, error) {
	h := s.cfg.HTTP
	lim := ports.ServerLimits{ReadHeaderTimeout: h.ReadHeaderTimeout, ReadTimeout: h.ReadTimeout,
		WriteTimeout: h.WriteTimeout, IdleTimeout: h.IdleTimeout, MaxHeaderBytes: h.MaxHeaderBytes}
	limit, err := descriptorLimit()
	switch {
	case err != nil && h.MaxConns == 0:
		lim.MaxConns = defaultMaxConns
	case err != nil:
		lim.MaxConns = h.MaxConns
	default:
		if lim.MaxConns, err = h.maxConns(limit, runtime.GOMAXPROCS(0)); err != nil {
			return ports.ServerLimits{}, err
		}
	}
	if h.TLSCertFile != "" {
		if lim.TLS, err = ports.LoadTLS(h.TLSCertFile, h.TLSKeyFile); err != nil {
			return ports.ServerLimits{}, fmt.Errorf("invalid TLS_CERT_FILE/TLS_KEY_FILE: %w", err)
		}
	}
	s.log.Debug("http limits", "max_conns", lim.MaxConns, "descriptor_limit", limit, "tls", lim.TLS != nil)
	return lim, nil
}

// listenHTTP binds the public listener. Each listener has its own limits: the connection cap is
// the public API's, so a listener added next to it (operations, health) keeps answering while the
// public one is saturated.
func (s *Service) listenHTTP() (net.Addr, error) {
	if s.listener != nil {
		return s.listener.Addr(), nil
	}
	l, err := ports.ListenHTTP("http", s.cfg.HTTPAddr, s.http.Handler(), s.httpLims, s.log)
	if err != nil {
		return nil, fmt.Errorf("HTTP_ADDR %s: %w", s.cfg.HTTPAddr, err)
	}
	s.listener = l
	return l.Addr(), nil
}

// serveHTTP serves every listener until ctx ends, then shuts them down within DRAIN_TIMEOUT.
func (s *Service) serveHTTP(ctx context.Context, g *errgroup.Group) {
	for _, l := range []*ports.HTTPListener{s.listener} {
		g.Go(func() error {
			s.log.Info("http listening", "listener", l.Name, "addr", l.Addr().String(), "tls", l.TLS())
			if err := l.Serve(); err != nil {
				return fmt.Errorf("http server %s: %w", l.Name, err)
			}
			return nil
		})
		g.Go(func() error {
			<-ctx.Done()
			sctx, cancel := context.WithTimeout(context.Background(), s.cfg.DrainTimeout)
			defer cancel()
			return l.Shutdown(sctx)
		})
	}
}
