package main

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/checkins/checkins/ports"
)

// The service's logger puts a request's correlation ID on every line logged with the request's
// context, not only on the access log's: the use cases' own lines (a reservation taken over, a
// mark that failed) had none, so they could not be found from the client's X-Correlation-ID. A
// line that names one itself keeps it, once; a line without a request has none.
func TestLogLinesCarryTheRequestsCorrelationID(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	log := newLogger(&buf, slog.LevelInfo)
	ctx := ports.WithCorrelationID(context.Background(), "req-7")
	log.InfoContext(ctx, "took over an abandoned reservation", "checkin_id", "c1")
	log.With("component", "api").WarnContext(ctx, "could not mark check-in as published")
	log.InfoContext(ctx, "http request", ports.LogAttrCorrelationID, "req-7")
	log.InfoContext(context.Background(), "no request")
	log.With(ports.LogAttrCorrelationID, "req-7").InfoContext(ctx, "bound with With") // once, not twice
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	require.Len(t, lines, 5)
	for i, want := range []string{"req-7", "req-7", "req-7", "", "req-7"} {
		var m map[string]any
		require.NoError(t, json.Unmarshal([]byte(lines[i]), &m), lines[i])
		got, _ := m[ports.LogAttrCorrelationID].(string)
		assert.Equal(t, want, got, "line %d: %s", i, lines[i])
		assert.Equal(t, strings.Count(lines[i], ports.LogAttrCorrelationID), min(len(want), 1), "once: %s", lines[i])
	}
}
