package ports

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/checkins/checkins/app/ops"
	"github.com/checkins/checkins/app/query"
)

const statusUsage = "Usage:\n  checkins status [--json]\n"

// StatusCommand is `checkins status [--json]`.
func StatusCommand(ctx context.Context, args []string, stdout, stderr io.Writer, connect Connect) error {
	fs := newVerbFlags("status", statusUsage, stderr)
	asJSON := fs.Bool("json", false, "print JSON")
	s, err := connect("status", fs, PermuteArgs(args, map[string]bool{"json": true, "h": true, "help": true}))
	if err != nil {
		return err
	}
	defer s.Close()
	if err := listOnly(s); err != nil {
		return err
	}
	st, err := s.App.Queries.Status.Status(ctx)
	if err != nil {
		return err
	}
	return printAs(stdout, *asJSON, st, WriteStatusText)
}

// WriteStatusText prints st as tables for people.
func WriteStatusText(w io.Writer, st query.StatusReport) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "stream %s: %d entries, last %s; poison queue %s: %d entries\n\n", st.Stream, st.StreamLength,
		orDash(st.LastEntryID), st.PoisonStream, st.Poisoned)
	fmt.Fprintln(tw, "GROUP\tFEEDS\tSERVING\tCONSUMERS\tPENDING\tLAG\tOLDEST PENDING\tPOISONED\tSTATE")
	for _, p := range st.Projections {
		lag := "?"
		if p.Lag != nil {
			lag = strconv.FormatInt(*p.Lag, 10)
		}
		oldest := "-"
		if p.OldestPending != nil {
			oldest = fmt.Sprintf("%s (idle %s, %d deliveries, %s)", p.OldestPending.ID,
				time.Duration(p.OldestPending.IdleMs)*time.Millisecond, p.OldestPending.Deliveries, p.OldestPending.Consumer)
		}
		group := p.Group
		if !p.GroupExists {
			group += " (not created yet)"
		}
		feeds, serving := ops.MemberName(p.Projection, max(p.Version, 1)), strconv.FormatBool(p.Serving)
		switch p.Kind {
		case query.KindLive:
			feeds, serving = strings.Join(p.Members, " "), "-"
		case query.KindBackfill:
			feeds += " up to " + p.BackfillTo
		}
		state := "ok"
		switch {
		case p.Stalled:
			state = "STALLED"
		case p.Building:
			state = "rebuilding"
		case p.BackfillDone:
			state = "backfilled"
		case p.Kind == query.KindBackfill:
			state = "backfilling"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%s\t%s\t%d\t%s\n", group, feeds, serving, len(p.Consumers), p.Pending, lag, oldest, p.Poisoned, state)
	}
	for _, p := range st.Projections {
		if p.Stalled {
			fmt.Fprintf(tw, "\n%s", p.StallCause)
		}
	}
	fmt.Fprintln(tw)
	fmt.Fprintln(tw)
	fmt.Fprintln(tw, "GROUP\tCONSUMER\tPENDING\tIDLE")
	for _, p := range st.Projections {
		for _, c := range p.Consumers {
			fmt.Fprintf(tw, "%s\t%s\t%d\t%s\n", p.Group, c.Name, c.Pending, time.Duration(c.IdleMs)*time.Millisecond)
		}
	}
	return tw.Flush()
}
