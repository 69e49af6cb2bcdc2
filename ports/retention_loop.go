package ports

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/checkins/checkins/app/command"
	"github.com/checkins/checkins/domain"
)

// RunRetention trims the event stream every interval until ctx ends (RETENTION): the projector
// drives command.TrimStream, which never removes what a consumer group still needs.
//
// paused, when set and true, skips a round (a partition migration copies the stream).
func RunRetention(ctx context.Context, t *command.TrimStream, interval time.Duration, log *slog.Logger, paused func() bool) error {
	if !t.Policy().Enabled() {
		return nil
	}
	log.Info("stream retention on", "stream", t.Stream(), "retention", t.Policy().String(), "interval", interval.String())
	tick := time.NewTicker(interval)
	defer tick.Stop()
	failing := &throttledLog{interval: 10 * time.Minute}
	for {
		var res command.TrimResult
		var err error
		if paused == nil || !paused() {
			res, err = t.TrimOnce(ctx)
		}
		switch {
		case errors.Is(err, domain.ErrMigrating):
			log.Debug("stream trim waits for the partition migration", "error", err)
		case err != nil && ctx.Err() == nil:
			if ok, n := failing.allow(); ok {
				log.Warn("stream trim failed, will retry", "error", err, "suppressed", n)
			}
		case res.Trimmed > 0:
			log.Info("stream trimmed", "stream", t.Stream(), "removed", res.Trimmed, "min_id", res.MinID, "floor", res.Floor)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
	}
}
