package ports

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/checkins/checkins/app/command"
	"github.com/checkins/checkins/app/ops"
	"github.com/checkins/checkins/app/query"
)

const projectionsUsage = `Usage:
  checkins projections list [--json]
  checkins projections rebuild <name> [--no-wait] [--json]
  checkins projections disband <live group> [--dry-run] [--json]
  checkins projections drop <name>.v<N> [--dry-run] [--json]

list shows, per projection, the version serving reads, the version being rebuilt if any, their
consumer groups, lag, pending and state, and the last rebuild's progress.

rebuild builds a fresh copy of <name> from the whole event stream under version N+1 (consumer
group <name>.v<N+1> from the start of the stream, keys <prefix>:p:<name>:v<N+1>:...) while
version N keeps serving. Running projectors (serve, project) start it within
PROJECTION_POLL_INTERVAL; when it has caught up, reads switch to it in one step, projectors stop
version N, and after PROJECTION_RETIRE_GRACE its keys and group are removed. The command waits
and reports progress (unless --no-wait); stopping it does not stop the rebuild: projectors carry
it on. Running it again for a rebuild in progress resumes watching it.

disband lets projectors run the projections of a live group in other PROJECTIONS sets (processes
that run the same projections share one consumer group, live or live:<a>,<b>, and a projection
version is fed by one group at a time). Stop every projector that runs the group first; the
command refuses while one read from it within CLAIM_IDLE (at least 2s), while entries are pending, or while a
version still backfills. Each version then gets its own group at the position the live group had
reached, and catches up from there once a projector with its new PROJECTIONS joins it to its new
live group. --dry-run only checks.

drop removes a version that a disband took out of its live group and that no PROJECTIONS set
runs any more: its own group, its moved record and its read model (its keys), so that partitions
migrate can run. Run by a projector again later, it starts from the start of the stream, like a
new projection. It refuses while the version is in a live group again, and while events it
parked wait in the poison queue (purge or replay them first). --dry-run only checks.
Connection flags (--redis-url, --key-prefix, ...) are those of "checkins serve --help".
`

// ProjectionsCommand is `checkins projections list|rebuild|disband|drop`.
func ProjectionsCommand(ctx context.Context, args []string, stdout, stderr io.Writer, connect Connect) error {
	boolFlags := map[string]bool{"json": true, "no-wait": true, "dry-run": true, "h": true, "help": true}
	verb, args, err := pickVerb(args, boolFlags, projectionsUsage, stderr, "list", "rebuild", "disband", "drop")
	if err != nil {
		return err
	}
	fs := newVerbFlags("projections "+verb, projectionsUsage, stderr)
	asJSON := fs.Bool("json", false, "print JSON")
	noWait := fs.Bool("no-wait", false, "rebuild: start it and return; projectors carry it out")
	// A flag set that the verb does not take is refused (verbFlagsFit): ignored, `rebuild
	// --dry-run` started a real rebuild.
	dryRun := fs.Bool("dry-run", false, "disband, drop: only check, and say what it would do")
	s, err := connect("projections "+verb, fs, PermuteArgs(args, boolFlags))
	if err != nil {
		return err
	}
	defer s.Close()
	if err := verbFlagsFit(fs, "projections", verb, map[string][]string{
		"list":    {"json"},
		"rebuild": {"json", "no-wait"},
		"disband": {"json", "dry-run"},
		"drop":    {"json", "dry-run"},
	}[verb], "json", "no-wait", "dry-run"); err != nil {
		return err
	}
	if verb == "list" {
		if err := listOnly(s); err != nil {
			return err
		}
		rep, err := s.App.Queries.ProjectionVersions.List(ctx)
		if err != nil {
			return err
		}
		return printAs(stdout, *asJSON, rep, WriteProjectionsText)
	}
	if len(s.Args) != 1 {
		what := "projection name"
		switch verb {
		case "disband":
			what = "live group (live, or live:<projection>,...)"
		case "drop":
			what = "projection version (<name>.v<N>)"
		}
		return fmt.Errorf("%s takes one %s, got %d arguments %v", verb, what, len(s.Args), s.Args)
	}
	if verb == "disband" {
		rep, err := s.App.Commands.DisbandLiveGroup.Run(ctx, s.Args[0], *dryRun)
		if err != nil {
			return err
		}
		return printAs(stdout, *asJSON, rep, WriteDisbandText)
	}
	if verb == "drop" {
		rep, err := s.App.Commands.DropMovedVersion.Run(ctx, s.Args[0], *dryRun)
		if err != nil {
			return err
		}
		return printAs(stdout, *asJSON, rep, WriteDropText)
	}
	return rebuild(ctx, s.App.Commands.RebuildProjection, s.Args[0], s.Poll, *noWait, *asJSON, stdout)
}

// startTimeout bounds a rebuild's start, which an interrupt does not cut short.
const startTimeout = 30 * time.Second

func rebuild(ctx context.Context, rb *command.RebuildProjection, name string, poll time.Duration, noWait, asJSON bool, stdout io.Writer) error {
	// Starting is a few writes (the building version, its group, where it begins, its time):
	// Ctrl-C waits for them rather than leave a build half-recorded, and stops the wait after.
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), startTimeout)
	rp, err := rb.Start(sctx, name)
	cancel()
	if err != nil {
		return err
	}
	if !asJSON {
		fmt.Fprintf(stdout, "rebuild of %s: v%d serves reads while v%d is built from the start of the stream\n", name, rp.From, rp.To)
	}
	if noWait {
		if asJSON {
			return WriteJSON(stdout, rp)
		}
		return nil
	}
	last, latest := "", rp
	rp, err = rb.Drive(ctx, name, poll, func(p ops.RebuildProgress) {
		latest = p
		if asJSON {
			return
		}
		line := fmt.Sprintf("%s: %s", name, p.State)
		switch p.State {
		case ops.RebuildBuilding:
			if p.Lag >= 0 {
				line += fmt.Sprintf(", v%d has %d of %d entries to go, %d pending", p.To, p.Lag, p.StreamLength, p.Pending)
			} else {
				line += fmt.Sprintf(", waiting for a projector to start v%d", p.To)
			}
		case ops.RebuildRetiring:
			line += fmt.Sprintf(", reads switched to v%d; v%d is removed after the grace period", p.To, p.From)
		case ops.RebuildDone:
			line += fmt.Sprintf(", v%d serves reads, v%d removed", p.To, p.From)
		}
		if line != last {
			fmt.Fprintln(stdout, line)
			last = line
		}
	})
	if errors.Is(err, context.Canceled) {
		if asJSON { // the last progress seen: stdout stays JSON
			return WriteJSON(stdout, latest)
		}
		fmt.Fprintln(stdout, "stopped waiting; running projectors carry the rebuild on (see: checkins projections list)")
		return nil
	}
	if err != nil {
		return err
	}
	if asJSON {
		return WriteJSON(stdout, rp)
	}
	return nil
}

// WriteDisbandText prints what a disband did, or would do, for people.
func WriteDisbandText(w io.Writer, rep ops.DisbandReport) error {
	streams := make([]string, 0, len(rep.Positions))
	for st := range rep.Positions {
		streams = append(streams, st)
	}
	slices.Sort(streams)
	where := make([]string, 0, len(streams))
	for _, st := range streams {
		where = append(where, st+" "+rep.Positions[st])
	}
	if rep.Unfinished && len(rep.Members) == 0 {
		if !rep.Done {
			_, err := fmt.Fprintf(w, "live group %s was disbanded, and removing its applied markers was cut short: run this again without --dry-run to finish\n", rep.Group)
			return err
		}
		_, err := fmt.Fprintf(w, "live group %s: finished removing what its disband left (its applied markers); a group of that name can be joined again\n", rep.Group)
		return err
	}
	members := "no projection versions"
	if len(rep.Members) > 0 {
		members = strings.Join(rep.Members, ", ")
	}
	if !rep.Done {
		_, err := fmt.Fprintf(w, "live group %s can be disbanded: %s would each get an own group at the position it reached (%s)\n",
			rep.Group, members, strings.Join(where, ", "))
		return err
	}
	_, err := fmt.Fprintf(w, "live group %s disbanded: %s each have an own group at the position it reached (%s)\n"+
		"start the projectors with their new PROJECTIONS: each version joins its new live group and catches up from there\n",
		rep.Group, members, strings.Join(where, ", "))
	return err
}

// WriteDropText prints what dropping a moved version did, or would do, for people.
func WriteDropText(w io.Writer, rep ops.DropReport) error {
	streams := make([]string, 0, len(rep.Positions))
	for st := range rep.Positions {
		streams = append(streams, st)
	}
	slices.Sort(streams)
	where := make([]string, 0, len(streams))
	for _, st := range streams {
		where = append(where, st+" "+rep.Positions[st])
	}
	if !rep.Done {
		_, err := fmt.Fprintf(w, "%s can be dropped: its own group (at %s), its moved record and its read model would be removed\n",
			rep.Member, strings.Join(where, ", "))
		return err
	}
	resumed := ""
	if rep.Resumed {
		resumed = " (a drop cut short, finished)"
	}
	_, err := fmt.Fprintf(w, "%s dropped%s: its own group (at %s), its moved record and its read model (%d keys) are gone\n"+
		"a projector that runs it again starts it from the start of the stream\n",
		rep.Member, resumed, strings.Join(where, ", "), rep.KeysRemoved)
	return err
}

// WriteProjectionsText prints the report as a table for people.
func WriteProjectionsText(w io.Writer, rep query.ProjectionsReport) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "PROJECTION\tSERVING\tBUILDING\tVERSION\tGROUP\tLAG\tPENDING\tSTATE")
	for _, v := range rep.Versions {
		var row query.ProjectionRow
		for _, r := range rep.Projections {
			if r.Projection == v.Projection {
				row = r
			}
		}
		lag := "?"
		if v.Lag != nil {
			lag = strconv.FormatInt(*v.Lag, 10)
		}
		building := "-"
		if row.Building > 0 {
			building = "v" + strconv.Itoa(row.Building)
		}
		fmt.Fprintf(tw, "%s\tv%d\t%s\tv%d (%s)\t%s\t%s\t%d\t%s\n", v.Projection, row.Serving, building, v.Version, v.Role, v.Group, lag, v.Pending, v.State)
	}
	if len(rep.Rebuilds) > 0 {
		fmt.Fprintln(tw)
		fmt.Fprintln(tw, "LAST REBUILD\tFROM\tTO\tSTATE\tSTARTED\tSWITCHED\tFINISHED")
		for _, r := range rep.Rebuilds {
			fmt.Fprintf(tw, "%s\tv%d\tv%d\t%s\t%s\t%s\t%s\n", r.Projection, r.From, r.To, r.State,
				r.StartedAt.Format(time.RFC3339), fmtTime(r.SwitchedAt), fmtTime(r.FinishedAt))
		}
	}
	return tw.Flush()
}

func fmtTime(t *time.Time) string {
	if t == nil {
		return "-"
	}
	return t.Format(time.RFC3339)
}
