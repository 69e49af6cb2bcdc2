package ports

import (
	"bytes"
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/checkins/checkins/app/command"
)

// TestBulkRunStoppedEarlyIsNotSuccess: `poison purge --all` or `replay --all` interrupted before
// the end of the queue says so and fails, instead of printing "purged N entries" and exiting 0
// as if the queue were clean.
func TestBulkRunStoppedEarlyIsNotSuccess(t *testing.T) {
	stopped := command.BulkResult{Purged: 3, Replayed: 3, Next: "1700000000000-4", Until: "1700000000000-9"}
	for _, what := range []string{"purged", "replayed"} {
		var out bytes.Buffer
		require.NoError(t, writeBulk(&out, stopped, false, what))
		assert.Contains(t, out.String(), "stopped early, after entry 1700000000000-4; run the command again to go on", what)
	}
	err := bulkStopped(stopped, nil, "purge")
	require.Error(t, err)
	assert.Contains(t, err.Error(), "the purge stopped early, before entry 1700000000000-4")

	done := command.BulkResult{Purged: 3, Until: "1700000000000-9"}
	assert.NoError(t, bulkStopped(done, nil, "purge"), "a complete run succeeds")
	cause := errors.New("redis down")
	assert.Equal(t, cause, bulkStopped(stopped, cause, "purge"), "an error of the run comes first")
	var out bytes.Buffer
	require.NoError(t, writeBulk(&out, done, false, "purged"))
	assert.Equal(t, "purged 3 entries\n", out.String())
}

// TestBulkReplaySummarySaysWhatWasGone: `poison replay --all` next to another run: the entries
// the other run replayed or purged first are gone for this one, and the summary says how many,
// so that the two runs' totals add up to what was parked (it never printed them).
func TestBulkReplaySummarySaysWhatWasGone(t *testing.T) {
	var out bytes.Buffer
	require.NoError(t, writeBulk(&out, command.BulkResult{Replayed: 4, Gone: 2}, false, "replayed"))
	assert.Equal(t, "replayed 4, failed 0 (kept with the new error), not replayable 0 (kept), gone 2 (replayed or purged by another run meanwhile)\n", out.String())
	out.Reset()
	require.NoError(t, writeBulk(&out, command.BulkResult{Replayed: 4}, false, "replayed"))
	assert.Equal(t, "replayed 4, failed 0 (kept with the new error), not replayable 0 (kept)\n", out.String())
}
