package command_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/checkins/checkins/app/command"
	"github.com/checkins/checkins/app/ops"
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
		{in: "106751d", want: command.RetentionPolicy{MaxAge: 106751 * 24 * time.Hour}},
		{in: "106752d", bad: true}, // a time.Duration overflowed: off
		{in: "213504d", bad: true}, // overflowed: 25m26s
		{in: "0d", bad: true},
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

func TestTrimFloor(t *testing.T) {
	t.Parallel()
	id := func(s string) ops.EntryID {
		e, err := ops.ParseEntryID(s)
		require.NoError(t, err)
		return e
	}
	for _, tc := range []struct {
		name   string
		groups []ops.GroupInfo
		want   string
		ok     bool
	}{
		{"no groups: nothing may go", nil, "", false},
		{"one group: the entry after its last delivered", []ops.GroupInfo{{LastDeliveredID: "10-3"}}, "10-4", true},
		{"a pending entry holds it lower", []ops.GroupInfo{{LastDeliveredID: "10-3", Pending: 2, OldestPendingID: "7-1"}}, "7-1", true},
		{"pending without an oldest ID", []ops.GroupInfo{{LastDeliveredID: "10-3", Pending: 2}}, "10-4", true},
		{"the slowest group decides", []ops.GroupInfo{{LastDeliveredID: "50-0"}, {LastDeliveredID: "20-9"}, {LastDeliveredID: "30-0", Pending: 1, OldestPendingID: "25-0"}}, "20-10", true},
		{"a group that read nothing holds everything", []ops.GroupInfo{{LastDeliveredID: "50-0"}, {LastDeliveredID: "0-0"}}, "0-1", true},
		{"the last sequence of a millisecond", []ops.GroupInfo{{LastDeliveredID: "5-18446744073709551615"}}, "6-0", true},
	} {
		floor, ok, err := command.TrimFloor(tc.groups)
		require.NoError(t, err, tc.name)
		assert.Equal(t, tc.ok, ok, tc.name)
		if tc.ok {
			assert.Equal(t, id(tc.want), floor, tc.name)
		}
	}
	_, _, err := command.TrimFloor([]ops.GroupInfo{{LastDeliveredID: "junk"}})
	assert.Error(t, err, "an ID that is not ms-seq is an error, not a guess")
}
