package ports

import (
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/checkins/checkins/app/ops"
)

const idempotencyUsage = `Usage:
  checkins idempotency format [compact|json] [--json]

format prints how the API processes write the idempotency records that answer retries, or
switches it; every process follows within a minute. Records of both formats answer retries
alike. A compact record takes about 14 bytes where the JSON takes about 144: in Redis about
215 bytes a check-in of the last IDEMPOTENCY_TTL instead of 344. A new deployment writes compact
records from its first check-in. One that releases before 2026-12-06 served writes JSON until it
is switched: switch it once every API process runs this release or a later one (a process of an
earlier release cannot read a compact record: it answers the retry with 500). Before rolling
back to such a release, switch back to json, wait a minute, then IDEMPOTENCY_TTL, or its
retries of the check-ins recorded meanwhile fail the same way. Without an argument, format
prints the format recorded, or the one the first check-in will record.
Connection flags (--redis-url, --key-prefix, ...) are those of "checkins serve --help".
`

// IdempotencyCommand is `checkins idempotency format [compact|json]`.
func IdempotencyCommand(ctx context.Context, args []string, stdout, stderr io.Writer, connect Connect) error {
	boolFlags := map[string]bool{"json": true, "h": true, "help": true}
	verb, args, err := pickVerb(args, boolFlags, idempotencyUsage, stderr, "format")
	if err != nil {
		return err
	}
	fs := newVerbFlags("idempotency "+verb, idempotencyUsage, stderr)
	asJSON := fs.Bool("json", false, "print JSON")
	s, err := connect("idempotency "+verb, fs, PermuteArgs(args, boolFlags))
	if err != nil {
		return err
	}
	defer s.Close()
	rf := s.App.Commands.RecordFormat
	if rf == nil {
		return errors.New("the idempotency records' format is not wired in this build")
	}
	out := struct {
		Format string `json:"format"`
		Before string `json:"before,omitempty"`
	}{}
	switch len(s.Args) {
	case 0:
		if out.Format, err = rf.Get(ctx); err != nil {
			return err
		}
	case 1:
		if out.Before, err = rf.Set(ctx, s.Args[0]); err != nil {
			return err
		}
		out.Format = s.Args[0]
	default:
		return fmt.Errorf("unexpected arguments: %v (one format: %s or %s)", s.Args[1:], ops.RecordFormatCompact, ops.RecordFormatJSON)
	}
	if *asJSON {
		return WriteJSON(stdout, out)
	}
	switch {
	case out.Before == "":
		fmt.Fprintf(stdout, "idempotency records are written %s\n", out.Format)
	case out.Before == out.Format:
		fmt.Fprintf(stdout, "idempotency records are written %s already\n", out.Format)
	default:
		fmt.Fprintf(stdout, "idempotency records were written %s and are written %s from now on (every API process within a minute)\n", out.Before, out.Format)
	}
	return nil
}
