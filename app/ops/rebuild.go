package ops

import (
	"encoding/json"
	"errors"
	"time"

	"github.com/checkins/checkins/app/projection"
)

// VersionState is one projection's entry in the registry.
type VersionState struct {
	Serving    int
	Building   int   // 0: no rebuild in progress
	Retiring   int   // 0: nothing left to clean up
	SwitchedAt int64 // ms since epoch of the last switch
	Rebuild    string
	// The layouts (projection.Layouts) the serving and the building version are written in; 0:
	// none recorded, i.e. layout 1 (a release before layouts) or, for a serving version, not yet
	// decided for a projection that never ran (RebuildProjection.UpgradeLayouts decides).
	ServingLayout, BuildingLayout int
}

// LayoutOf is the layout version is written in: the recorded one (1 when none is) for the
// serving or the building version; 0 for another version.
func (st VersionState) LayoutOf(version int) int {
	switch version {
	case st.Serving:
		return max(st.ServingLayout, 1)
	case st.Building:
		return max(st.BuildingLayout, 1)
	}
	return 0
}

// ErrRetiring is returned by Registry.BeginBuild while the previous version is still being
// removed.
var ErrRetiring = errors.New("the previous rebuild is still removing the old version")

// ProjectionTarget is one projection version a projector feeds.
type ProjectionTarget struct {
	Projection projection.Projection
	Version    int
}

// Rebuild states, as RebuildProgress.State.
const (
	RebuildBuilding = "building" // version N+1 consumes the stream from the start; N serves reads
	RebuildRetiring = "retiring" // reads switched to N+1; N's keys and group go after the grace
	RebuildDone     = "done"
)

// RebuildProgress is the state of a projection's last rebuild, as stored in the registry.
type RebuildProgress struct {
	Projection string     `json:"projection"`
	State      string     `json:"state"`
	From       int        `json:"from"`
	To         int        `json:"to"`
	StartedAt  time.Time  `json:"startedAt"`
	SwitchedAt *time.Time `json:"switchedAt,omitempty"`
	FinishedAt *time.Time `json:"finishedAt,omitempty"`
	// Lag and Pending of the building group the last time a driver looked (-1: unknown); while
	// it backfills, Lag counts the entries up to its join (ops.BackfillLag) where Redis tells.
	Lag     int64 `json:"lag"`
	Pending int64 `json:"pending"`
	// StreamLength is the stream's length then, for a sense of how far the build got.
	StreamLength int64 `json:"streamLength"`
}

// Progress is the stored progress record of the last rebuild (ok false: none), read against the
// registry: a record that is not done while the registry has nothing built or retired and
// serves its target is done. A driver that wrote an earlier step after another finished the
// rebuild, or the one that finished it and could not record that (its context ended), left it
// saying "retiring" for good (found by a review); its FinishedAt is then unknown (nil).
func (st VersionState) Progress() (RebuildProgress, bool) {
	rp, ok := ParseRebuildProgress(st.Rebuild)
	if ok && rp.State != RebuildDone && st.Building == 0 && st.Retiring == 0 && rp.To == st.Serving {
		rp.State = RebuildDone
	}
	return rp, ok
}

// ParseRebuildProgress reads a stored progress record.
func ParseRebuildProgress(s string) (RebuildProgress, bool) {
	var rp RebuildProgress
	if s == "" || json.Unmarshal([]byte(s), &rp) != nil {
		return RebuildProgress{}, false
	}
	return rp, true
}
