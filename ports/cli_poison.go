package ports

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/checkins/checkins/app/command"
	"github.com/checkins/checkins/app/ops"
	"github.com/checkins/checkins/app/query"
)

const poisonUsage = `Usage:
  checkins poison list [--projection P] [--limit N] [--cursor ID] [--json]
  checkins poison show <id>
  checkins poison replay <id> | --all [--projection P [--version N]] [--json]
  checkins poison purge <id> | --all [--projection P [--version N]] [--json]

Parked events live in the stream <KEY_PREFIX>:events:poison. Replay runs an event through the
projection that failed, against its store (which dedupes: a replay never double counts), and
deletes the entry on success; a failed replay keeps the entry with the new error. --all works in
chunks of 100 and only on the entries present when it starts.
Connection flags (--redis-url, --key-prefix, ...) are those of "checkins serve --help".
`

// PoisonCommand is `checkins poison list|show|replay|purge`.
func PoisonCommand(ctx context.Context, args []string, stdout, stderr io.Writer, connect Connect) error {
	boolFlags := map[string]bool{"json": true, "all": true, "h": true, "help": true}
	verb, args, err := pickVerb(args, boolFlags, poisonUsage, stderr, "list", "show", "replay", "purge")
	if err != nil {
		return err
	}
	fs := newVerbFlags("poison "+verb, poisonUsage, stderr)
	asJSON := fs.Bool("json", false, "print JSON")
	all := fs.Bool("all", false, "every entry (replay, purge)")
	projection := fs.String("projection", "", "only entries of this projection")
	version := DecimalInt(fs, "version", 0, "with --all --projection: only entries that version of it parked")
	limit := DecimalInt(fs, "limit", query.DefaultPoisonListLimit, "entries per page (list)")
	cursor := fs.String("cursor", "", "continue a list after this entry ID")
	s, err := connect("poison "+verb, fs, PermuteArgs(args, boolFlags))
	if err != nil {
		return err
	}
	defer s.Close()
	if err := poisonFlagsFit(fs, verb, *all); err != nil {
		return err
	}
	c, q := s.App.Commands, s.App.Queries
	switch verb {
	case "list":
		if err := listOnly(s); err != nil {
			return err
		}
		if *limit < 1 || *limit > query.MaxPoisonListLimit { // as GET /ops/poison?limit=
			return fmt.Errorf("--limit must be from 1 to %d, got %d", query.MaxPoisonListLimit, *limit)
		}
		page, err := q.ListPoisoned.List(ctx, query.PoisonFilter{Projection: *projection, Cursor: *cursor, Limit: *limit})
		if err != nil {
			return err
		}
		return printAs(stdout, *asJSON, page, WritePoisonText)
	case "show":
		id, err := oneID(s.Args, false)
		if err != nil {
			return err
		}
		e, err := q.ListPoisoned.Show(ctx, id)
		if err != nil {
			return err
		}
		return WriteJSON(stdout, e)
	case "replay":
		id, err := oneID(s.Args, *all)
		if err != nil {
			return err
		}
		if *all {
			res, err := c.ReplayPoisoned.ReplayAll(ctx, command.BulkRequest{Projection: *projection, Version: *version})
			if err != nil && ops.IsClientError(err) {
				return err // refused: nothing ran
			}
			if werr := writeBulk(stdout, res, *asJSON, "replayed"); werr != nil {
				return werr
			}
			if err := bulkStopped(res, err, "replay"); err != nil {
				return err
			}
			if res.Failed+res.NotReplayable > 0 {
				return fmt.Errorf("%d replays failed and %d entries cannot be replayed; they stay in the queue", res.Failed, res.NotReplayable)
			}
			return nil
		}
		res, err := c.ReplayPoisoned.Replay(ctx, id)
		if *asJSON {
			// A result only when there is one: the replay ran (and maybe failed, the entry kept
			// under a new ID), not when the entry was not found or the ID was refused.
			if err == nil || errors.Is(err, command.ErrReplayFailed) || errors.Is(err, command.ErrNotReplayable) {
				if werr := WriteJSON(stdout, res); werr != nil {
					return werr
				}
			}
		} else if err == nil {
			fmt.Fprintf(stdout, "replayed %s into %s (applied: %t; false means it was already counted), entry deleted\n", id, res.Projection, res.Applied)
		}
		return err
	default: // purge
		id, err := oneID(s.Args, *all)
		if err != nil {
			return err
		}
		if *all {
			res, err := c.PurgePoisoned.PurgeAll(ctx, command.BulkRequest{Projection: *projection, Version: *version})
			if err != nil && ops.IsClientError(err) {
				return err // refused: nothing ran
			}
			if werr := writeBulk(stdout, res, *asJSON, "purged"); werr != nil {
				return werr
			}
			return bulkStopped(res, err, "purge")
		}
		if err := c.PurgePoisoned.Purge(ctx, id); err != nil {
			return err
		}
		if *asJSON {
			return WriteJSON(stdout, struct {
				ID     string `json:"id"`
				Purged bool   `json:"purged"`
			}{id, true})
		}
		fmt.Fprintf(stdout, "purged %s\n", id)
		return nil
	}
}

// poisonFlagsFit refuses a flag set on the command line that verb does not take: ignored, it
// would do more than asked (`purge --all --limit 1` purged the whole queue, `purge <id>
// --projection users` an entry of another projection).
func poisonFlagsFit(fs *flag.FlagSet, verb string, all bool) error {
	takes := map[string][]string{
		"list":   {"projection", "limit", "cursor", "json"},
		"show":   {"json"},
		"replay": {"all", "json"},
		"purge":  {"all", "json"},
	}[verb]
	if all {
		takes = append(takes, "projection", "version")
	}
	wrong := wrongFlags(fs, takes, poisonFlagNames...)
	if len(wrong) == 0 {
		return nil
	}
	why := fmt.Sprintf("poison %s does not take %s", verb, strings.Join(wrong, ", "))
	if (verb == "replay" || verb == "purge") && !all && (slices.Contains(wrong, "--projection") || slices.Contains(wrong, "--version")) {
		why += " without --all (one entry is named by its ID)"
	}
	return errors.New(why + "; see `checkins poison --help`")
}

// wrongFlags are the flags of the command's own (own, not the connection flags) set on the
// command line that its verb does not take, as "--name".
func wrongFlags(fs *flag.FlagSet, takes []string, own ...string) []string {
	var wrong []string
	fs.Visit(func(f *flag.Flag) {
		if slices.Contains(own, f.Name) && !slices.Contains(takes, f.Name) {
			wrong = append(wrong, "--"+f.Name)
		}
	})
	return wrong
}

// verbFlagsFit refuses a flag of the command's own (own) set for a verb that does not take it.
func verbFlagsFit(fs *flag.FlagSet, cmd, verb string, takes []string, own ...string) error {
	if wrong := wrongFlags(fs, takes, own...); len(wrong) > 0 {
		return fmt.Errorf("%s %s does not take %s; see `checkins %s --help`", cmd, verb, strings.Join(wrong, ", "), cmd)
	}
	return nil
}

// poisonFlagNames are the flags of the poison verbs (the connection flags are everyone's).
var poisonFlagNames = []string{"json", "all", "projection", "version", "limit", "cursor"}

// oneID reads the single <id> argument, or none with --all.
func oneID(args []string, all bool) (string, error) {
	switch {
	case all && len(args) > 0:
		return "", fmt.Errorf("give either an entry ID or --all, not both (got %v)", args)
	case all:
		return "", nil
	case len(args) == 0:
		return "", errors.New("missing poison entry ID (see `checkins poison list`), or --all")
	case len(args) > 1:
		return "", fmt.Errorf("expected one poison entry ID, got %d: %v", len(args), args)
	}
	return args[0], nil
}

// bulkStopped is a bulk run's error: err, or one saying the run stopped before the end of the
// queue (interrupted, or out of time), so that the command does not exit 0 as if it were done.
func bulkStopped(res command.BulkResult, err error, what string) error {
	if err == nil && res.Next != "" {
		return fmt.Errorf("the %s stopped early, before entry %s: the entries from there on are still in the queue; run it again to go on", what, res.Next)
	}
	return err
}

func writeBulk(w io.Writer, res command.BulkResult, asJSON bool, what string) error {
	if asJSON {
		return WriteJSON(w, res)
	}
	if what == "purged" {
		fmt.Fprintf(w, "purged %d entries\n", res.Purged)
	} else {
		fmt.Fprintf(w, "replayed %d, failed %d (kept with the new error), not replayable %d (kept)", res.Replayed, res.Failed, res.NotReplayable)
		if res.Gone > 0 {
			// Concurrent runs' totals add up only with these.
			fmt.Fprintf(w, ", gone %d (replayed or purged by another run meanwhile)", res.Gone)
		}
		fmt.Fprintln(w)
	}
	for _, f := range res.Failures {
		kept := f.ID
		if f.NewID != "" {
			kept = f.NewID
		}
		fmt.Fprintf(w, "  %s %s: %s (kept as %s)\n", f.Projection, f.Status, f.Error, kept)
	}
	if res.Next != "" {
		_, err := fmt.Fprintf(w, "stopped early, after entry %s; run the command again to go on\n", res.Next)
		return err
	}
	return nil
}

// WritePoisonText prints a page of parked entries as a table for people.
func WritePoisonText(w io.Writer, page query.PoisonPage) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tFAILED AT\tPROJECTION\tATTEMPTS\tENTRY\tERROR")
	for _, e := range page.Entries {
		msg := strings.ReplaceAll(e.Error, "\n", " ")
		if len(msg) > 100 {
			msg = msg[:97] + "..."
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%s\n", e.ID, e.FailedAt.UTC().Format(time.RFC3339), e.Projection, e.Attempts, orDash(e.EntryID), msg)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if page.Next != "" {
		_, err := fmt.Fprintf(w, "more: --cursor %s\n", page.Next)
		return err
	}
	return nil
}
