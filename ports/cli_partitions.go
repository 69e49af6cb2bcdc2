package ports

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/checkins/checkins/app/command"
)

const partitionsUsage = `Usage:
  checkins partitions migrate --to N [--wait 2m] [--force] [--batch 1000] [--batch-pause 0] [--json]

migrate moves the event stream to N partitions (1 to 1024): it sets the quiesce flag in
<prefix>:meta (running API processes answer 503 with code migrating and Retry-After, projectors
stop reading, both within a second), waits until no consumer group has entries pending (up to
--wait; then it fails, or goes on with --force), copies every entry in ID order into its new
partition with its ID, positions every consumer group and live-group registry entry on every new
partition where it was, records N, deletes the old partitions and clears the flag. Every step is
recorded as it ends: after a crash, run it again and it carries on; with N recorded already it
does nothing. One run at a time: another run started while one works waits up to 20s, then is
refused (a run that died lets go within 15s). Restart every process with STREAM_PARTITIONS=N afterwards.
Connection flags (--redis-url, --key-prefix, ...) are those of "checkins serve --help";
STREAM_PARTITIONS is not read (the recorded count is the one migrated from).
`

// PartitionsCommand is `checkins partitions migrate`.
func PartitionsCommand(ctx context.Context, args []string, stdout, stderr io.Writer, connect Connect) error {
	boolFlags := map[string]bool{"json": true, "force": true, "h": true, "help": true}
	verb, args, err := pickVerb(args, boolFlags, partitionsUsage, stderr, "migrate")
	if err != nil {
		return err
	}
	fs := newVerbFlags("partitions "+verb, partitionsUsage, stderr)
	to := DecimalInt(fs, "to", 0, "the number of partitions to move the stream to (required)")
	wait := fs.Duration("wait", 2*time.Minute, "how long to wait for pending entries to be acknowledged")
	force := fs.Bool("force", false, "go on with entries still pending after --wait: they are delivered again on the new partitions (the dedupe markers catch what was applied)")
	batch := DecimalInt(fs, "batch", 1000, "entries per read and per write round trip")
	batchPause := fs.Duration("batch-pause", 0, "wait this long after each copied batch (spares a busy Redis)")
	asJSON := fs.Bool("json", false, "print the result as JSON")
	s, err := connect("partitions "+verb, fs, PermuteArgs(args, boolFlags))
	if err != nil {
		return err
	}
	defer s.Close()
	if err := listOnly(s); err != nil {
		return err
	}
	switch {
	case *to < 1:
		return errors.New("--to N is required: the number of partitions, 1 to 1024")
	case *batch < 1:
		return fmt.Errorf("--batch must be at least 1, got %d", *batch)
	case *wait < 0 || *batchPause < 0:
		return errors.New("--wait and --batch-pause must not be negative")
	}
	mp := s.App.Commands.MigratePartitions
	if mp == nil {
		return errors.New("partition migration is not wired in this build")
	}
	report := func(line string) {
		if !*asJSON {
			fmt.Fprintln(stdout, line)
		}
	}
	res, err := mp.Handle(ctx, command.MigrateRequest{To: *to, Force: *force, Wait: *wait, Settle: s.Settle, RequestTimeout: s.RequestTimeout, Poll: s.Poll,
		MinReplicas: s.MinReplicas, ReplicaTimeout: s.ReplicaTimeout,
		Batch: *batch, Pause: *batchPause, Report: report})
	if err != nil {
		return err
	}
	if *asJSON {
		return WriteJSON(stdout, migrateJSON{From: res.From, To: res.To, NoOp: res.NoOp, Entries: res.Copy.Entries, Copied: res.Copy.Copied,
			Skipped: res.Copy.Skipped, Renumbered: res.Copy.Renumbered, Groups: res.Position.Groups, Seconds: res.Took.Seconds()})
	}
	if res.NoOp {
		fmt.Fprintf(stdout, "the event stream has %d partitions already: nothing to do\n", res.To)
		return nil
	}
	fmt.Fprintf(stdout, "migrated from %d to %d partitions in %s\n", res.From, res.To, res.Took.Round(time.Millisecond))
	return nil
}

type migrateJSON struct {
	From       int     `json:"from"`
	To         int     `json:"to"`
	NoOp       bool    `json:"noOp"`
	Entries    int64   `json:"entries"`
	Copied     int64   `json:"copied"`
	Skipped    int64   `json:"skipped"`
	Renumbered int64   `json:"renumbered"`
	Groups     int     `json:"groups"`
	Seconds    float64 `json:"seconds"`
}
