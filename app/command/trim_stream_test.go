package command_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/checkins/checkins/app/command"
)

func TestParseRetention(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		in   string
		want command.RetentionPolicy
		bad  bool
	}{
		{in: "", want: command.RetentionPolicy{}},
		{in: "off", want: command.RetentionPolicy{}},
		{in: "1000000", want: command.RetentionPolicy{MaxEntries: 1000000}},
		{in: "720h", want: command.RetentionPolicy{MaxAge: 720 * time.Hour}},
		{in: "30d", want: command.RetentionPolicy{MaxAge: 30 * 24 * time.Hour}},
		{in: "0", bad: true},
		{in: "-5", bad: true},
		{in: "10ms", bad: true},
		{in: "forever", bad: true},
	} {
		got, err := command.ParseRetention(tc.in)
		if tc.bad {
			assert.Error(t, err, tc.in)
			continue
		}
		require.NoError(t, err, tc.in)
		assert.Equal(t, tc.want, got, tc.in)
	}
}
