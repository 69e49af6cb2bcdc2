package main

import (
	"fmt"
	"slices"

	"github.com/checkins/checkins/app/projection"
)

// allProjections is every projection the service runs. Adding a projection is writing
// app/projection/<name>.go and adding one line here.
func allProjections(cfg Config) []projection.Projection {
	return []projection.Projection{
		projection.UserStats{},
		projection.LocationStats{},
		projection.Leaderboards{MinCheckins: cfg.LeaderboardMinCheckins},
		projection.RecentCheckins{},
		projection.DailyCheckins{},
	}
}

// selectProjections keeps the ones named in PROJECTIONS (all when empty).
func selectProjections(cfg Config) ([]projection.Projection, error) {
	all := allProjections(cfg)
	if len(cfg.Projections) == 0 {
		return all, nil
	}
	var names []string
	for _, p := range all {
		names = append(names, p.Name())
	}
	var out []projection.Projection
	for _, want := range cfg.Projections {
		i := slices.Index(names, want)
		if i < 0 {
			return nil, fmt.Errorf("invalid PROJECTIONS: unknown projection %q (known: %v)", want, names)
		}
		out = append(out, all[i])
	}
	return out, nil
}
