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
	var err error
	s.ui, err = ports.RegisterUI(s.http, ports.UIConfig{App: s.app,
		MaxClients: s.cfg.UI.MaxStreams, Heartbeat: s.cfg.UI.Heartbeat,
		Names: names, SharedPort: s.cfg.OpsAddr == s.cfg.HTTPAddr, Logger: s.log})
	return err
}
