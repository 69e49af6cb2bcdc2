package main

import (
	"github.com/checkins/checkins/ports"
)

// wireUI adds the operations dashboard (/ui/ on the ops listener) over the same use cases as
// /ops and the CLI verbs (s.app, with the operations added by addOps).
func (s *Service) wireUI() error {
	projs := allProjections(s.cfg)
	names := make([]string, len(projs))
	for i, p := range projs {
		names[i] = p.Name()
	}
	shared := s.cfg.OpsAddr == s.cfg.HTTPAddr
	streams := s.cfg.UI.MaxStreams
	if shared {
		// One listener: each stream holds one of HTTP_MAX_CONNS, which health checks and check-ins
		// need too (with every connection a stream they waited for as long as the dashboards
		// stayed open). The streams take at most a quarter of them, and at least one.
		if most := max(s.httpLims.MaxConns/4, 1); streams > most {
			s.log.Info("UI_MAX_STREAMS lowered: the ops routes share the public listener (OPS_ADDR = HTTP_ADDR), and the dashboard's streams take at most a quarter of its HTTP_MAX_CONNS",
				"ui_max_streams", streams, "http_max_conns", s.httpLims.MaxConns, "streams", most)
			streams = most
		}
	}
	var err error
	s.ui, err = ports.RegisterUI(s.http, ports.UIConfig{App: s.app,
		MaxClients: streams, Heartbeat: s.cfg.UI.Heartbeat,
		Names: names, SharedPort: shared, Logger: s.log})
	return err
}
