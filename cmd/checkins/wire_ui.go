package main

import (
	"github.com/checkins/checkins/adapters"
	"github.com/checkins/checkins/app"
	"github.com/checkins/checkins/ports"
)

// wireUI adds the operations dashboard (/ui/ on the ops listener) over the same operations as
// /ops and the CLI verbs.
func (s *Service) wireUI(q app.Queries) error {
	projs := allProjections(s.cfg)
	applier, err := adapters.NewProjectionApplier(s.client, s.keys, s.cfg.DedupeWindow)
	if err != nil {
		return err
	}
	poison, err := ports.NewPoisonOps(ports.PoisonOpsConfig{Redis: s.client, Keys: s.keys, Projections: projs, Applier: applier, Logger: s.log})
	if err != nil {
		return err
	}
	status, err := ports.NewStatusOps(s.client, s.keys, projs)
	if err != nil {
		return err
	}
	status.WithStallAfter(s.cfg.StallAfter)
	names := make([]string, len(projs))
	for i, p := range projs {
		names[i] = p.Name()
	}
	s.ui, err = ports.RegisterUI(s.http, ports.UIConfig{Status: status, Poison: poison, Projections: s.proj.ops,
		MaxClients: s.cfg.UI.MaxStreams, Heartbeat: s.cfg.UI.Heartbeat,
		Names: names, Queries: q, SharedPort: s.cfg.OpsAddr == s.cfg.HTTPAddr, Logger: s.log})
	return err
}
