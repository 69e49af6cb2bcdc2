package ports

import (
	"context"
	"log/slog"

	"github.com/ThreeDotsLabs/watermill"
)

// NewWatermillLogger is Watermill's slog adapter, except that Trace and Debug first ask l
// whether the level is on. The stock adapter turns the fields into slog attributes before slog
// looks at the level, and the Redis Streams publisher logs two traces per message: on the API's
// hot path that was a slice and a map walk per XADD for lines nobody sees. What is logged, and
// at which level, is the stock adapter's.
func NewWatermillLogger(l *slog.Logger) watermill.LoggerAdapter {
	if l == nil {
		l = slog.Default()
	}
	return levelGated{LoggerAdapter: watermill.NewSlogLogger(l), log: l}
}

type levelGated struct {
	watermill.LoggerAdapter
	log *slog.Logger
}

func (g levelGated) Debug(msg string, fields watermill.LogFields) {
	if g.log.Enabled(context.Background(), slog.LevelDebug) {
		g.LoggerAdapter.Debug(msg, fields)
	}
}

func (g levelGated) Trace(msg string, fields watermill.LogFields) {
	if g.log.Enabled(context.Background(), watermill.LevelTrace) {
		g.LoggerAdapter.Trace(msg, fields)
	}
}

func (g levelGated) With(fields watermill.LogFields) watermill.LoggerAdapter {
	return levelGated{LoggerAdapter: g.LoggerAdapter.With(fields), log: g.log}
}
