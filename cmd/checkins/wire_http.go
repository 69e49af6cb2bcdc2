package main

import (
	"context"
	"fmt"
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

// opsMaxConns caps the ops listener's connections: operators, scrapers and the dashboard, a
// handful at a time. It comes out of the descriptors reservedDescriptors keeps aside.
const opsMaxConns = 64

// uiReservedOpsConns of the ops listener's connections are never the dashboard streams': with
// every connection a stream, /healthz and /readyz there went unanswered.
const uiReservedOpsConns = 16

// listenHTTP binds the public listener and, on another address (OPS_ADDR), the ops listener.
// Each listener has its own limits: the connection cap is the public API's, so the ops listener
// (operations, /metrics, /healthz, /readyz) keeps answering while the public one is saturated.
// NewService binds them before it writes anything to Redis (a projector joins its live group),
// so that a start refused for a port in use has changed nothing; handleHTTP gives them their
// handlers once they are built.
func (s *Service) listenHTTP() error {
	l, err := ports.ListenHTTP("http", s.cfg.HTTPAddr, nil, s.httpLims, s.log)
	if err != nil {
		return fmt.Errorf("HTTP_ADDR %s: %w", s.cfg.HTTPAddr, err)
	}
	s.closers = append(s.closers, l.Close)
	if s.cfg.OpsAddr != s.cfg.HTTPAddr {
		lim := s.httpLims
		lim.MaxConns = opsMaxConns
		ol, err := ports.ListenHTTP("ops", s.cfg.OpsAddr, nil, lim, s.log)
		if err != nil {
			return fmt.Errorf("OPS_ADDR %s: %w", s.cfg.OpsAddr, err)
		}
		s.closers = append(s.closers, ol.Close)
		s.opsListener = ol
	}
	s.listener = l
	return nil
}

// handleHTTP gives the bound listeners their handlers.
func (s *Service) handleHTTP() {
	if s.opsListener == nil {
		s.listener.Handle(s.http.SharedHandler())
		return
	}
	s.listener.Handle(s.http.Handler())
	s.opsListener.Handle(s.http.OpsHandler())
}

// serveHTTP serves every listener until ctx ends, then shuts them down within DRAIN_TIMEOUT.
func (s *Service) serveHTTP(ctx context.Context, g *errgroup.Group) {
	listeners := []*ports.HTTPListener{s.listener}
	if s.opsListener != nil {
		listeners = append(listeners, s.opsListener)
	}
	for _, l := range listeners {
		g.Go(func() error {
			if l == s.listener {
				s.log.Info("http listening", "listener", l.Name, "addr", l.Addr().String(), "ops_addr", s.OpsAddr().String(), "tls", l.TLS())
			} else {
				s.log.Info("ops listening", "listener", l.Name, "addr", l.Addr().String(), "tls", l.TLS())
			}
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
