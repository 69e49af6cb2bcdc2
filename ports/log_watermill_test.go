package ports_test

import (
	"bytes"
	"log/slog"
	"testing"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/stretchr/testify/assert"

	"github.com/checkins/checkins/ports"
)

// The gated adapter logs what the stock one logs, at the same levels, fields and With fields
// included; only lines below the logger's level are dropped.
func TestWatermillLoggerKeepsLevels(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		level slog.Level
		want  []string
		none  []string
	}{
		{watermill.LevelTrace, []string{`"msg":"t"`, `"msg":"d"`, `"msg":"i"`, `"msg":"e"`}, nil},
		{slog.LevelDebug, []string{`"msg":"d"`, `"msg":"i"`, `"msg":"e"`}, []string{`"msg":"t"`}},
		{slog.LevelInfo, []string{`"msg":"i"`, `"msg":"e"`}, []string{`"msg":"t"`, `"msg":"d"`}},
		{slog.LevelError, []string{`"msg":"e"`}, []string{`"msg":"t"`, `"msg":"d"`, `"msg":"i"`}},
	} {
		t.Run(tc.level.String(), func(t *testing.T) {
			t.Parallel()
			var buf bytes.Buffer
			l := ports.NewWatermillLogger(slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: tc.level}))).
				With(watermill.LogFields{"topic": "events"})
			f := watermill.LogFields{"message_uuid": "u1"}
			l.Trace("t", f)
			l.Debug("d", f)
			l.Info("i", f)
			l.Error("e", assert.AnError, f)
			out := buf.String()
			for _, w := range tc.want {
				assert.Contains(t, out, w)
			}
			for _, n := range tc.none {
				assert.NotContains(t, out, n)
			}
			if len(tc.want) > 0 {
				assert.Contains(t, out, `"topic":"events"`)
				assert.Contains(t, out, `"message_uuid":"u1"`)
			}
		})
	}
}
