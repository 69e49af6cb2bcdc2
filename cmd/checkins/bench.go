package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// The phases of `checkins bench`, in the order they run.
const (
	phaseIngest         = "ingest"
	phaseIngestBaseline = "ingest-baseline"
	phaseDrain          = "drain"
	phaseDrainBaseline  = "drain-baseline"
	phaseE2E            = "e2e"
)

func benchPhaseOrder() []string {
	return []string{phaseIngest, phaseIngestBaseline, phaseDrain, phaseDrainBaseline, phaseE2E}
}

// benchCommands is the `bench` verb.
func benchCommands() map[string]subcommand {
	return map[string]subcommand{
		"bench": {"measure ingest, drain and end-to-end latency against raw-Redis baselines", runBench},
	}
}

const benchUsage = `Usage: checkins bench [flags]

Measures, in one run and one process, against raw go-redis baselines:
  ingest           C keep-alive HTTP clients post distinct check-ins to the real API for D
  ingest-baseline  the same clients and payloads against a bare net/http handler doing one XADD
  drain            N preloaded events consumed by K projector instances (users, locations),
                   for each K of --consumers, until every group has lag 0 and nothing pending;
                   the read models are then checked against an independent computation
  drain-baseline   the same data read by raw XREADGROUP COUNT 500 consumers running the same
                   Lua updates pipelined, with batched XACK
  e2e              check-ins posted at a fixed rate to an in-process serve; time from the 202
                   to the check-in being visible in the user projection

Redis: REDIS_URL when set (keys under a private bench-<random> prefix, deleted at the end);
otherwise a private redis-server (--save "" --appendonly no) on a free port, killed at the end.
Service settings (SUBSCRIBER/--subscriber, BATCH_SIZE, MAX_IN_FLIGHT, ...) apply to the
in-process services; the bench sets KEY_PREFIX, HTTP_ADDR, CONSUMER_NAME and PROJECTIONS itself
(KEY_PREFIX names the stream of --target for the stream check). LOG_LEVEL defaults to warn.

Time: ingest, ingest-baseline and e2e take --duration each; drain and drain-baseline each drain
--events once per --consumers entry (8 drains by default), so they dominate when consumption
is slow: lower --events or --consumers for a quicker run.

Flags:
`

// benchOptions are the bench's own flags.
type benchOptions struct {
	Phases    []string
	Duration  time.Duration
	Clients   int
	Events    int
	Consumers []int
	Rate      float64
	Target    string
	JSON      bool
}

func runBench(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	stderr = &lockedWriter{w: stderr} // the service logs and the progress lines share it
	fs := flag.NewFlagSet("checkins bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	phases := fs.String("phases", strings.Join(benchPhaseOrder(), ","), "comma-separated phases to run: "+strings.Join(benchPhaseOrder(), ", ")+" (or all)")
	duration := fs.Duration("duration", 10*time.Second, "length of each ingest, ingest-baseline and e2e phase")
	clients := fs.Int("clients", 50, "concurrent keep-alive HTTP clients (ingest) and senders (e2e)")
	events := fs.Int("events", 100000, "events preloaded for drain and drain-baseline (100,000 keeps the default run under 2 minutes on 2 cores; the issue names 200,000)")
	consumers := fs.String("consumers", "1,2,4,8", "comma-separated numbers of consumers per projection to sweep in drain and drain-baseline")
	rate := fs.Float64("rate", 2000, "check-ins per second posted in e2e")
	target := fs.String("target", "", "base URL of a running API (e.g. http://127.0.0.1:8080) for ingest instead of the in-process one")
	asJSON := fs.Bool("json", false, "print the result as JSON on stdout instead of the table")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), benchUsage)
		fs.PrintDefaults()
	}
	cfg, rest, err := parseConfig(fs, args, benchGetenv(getenv))
	if err != nil {
		return err
	}
	if len(rest) > 0 {
		return fmt.Errorf("unexpected arguments: %v", rest)
	}
	opts, err := parseBenchOptions(*phases, *duration, *clients, *events, *consumers, *rate, *target)
	if err != nil {
		return err
	}
	opts.JSON = *asJSON
	log := newLogger(stderr, cfg.LogLevel)

	b, err := newBencher(ctx, cfg, opts, log, stderr)
	if err != nil {
		return err
	}
	res, runErr := b.run(ctx)
	b.close()
	if len(res.Phases) > 0 || runErr == nil {
		if opts.JSON {
			enc := json.NewEncoder(stdout)
			enc.SetIndent("", "  ")
			if err := enc.Encode(res); err != nil {
				return err
			}
		} else {
			printBenchTable(stdout, res)
		}
	}
	return runErr
}

// benchGetenv keeps the in-process services quiet unless LOG_LEVEL asks otherwise: info logs of
// a dozen services would bury the progress lines.
func benchGetenv(getenv func(string) string) func(string) string {
	return func(k string) string {
		if v := getenv(k); v != "" || k != "LOG_LEVEL" {
			return v
		}
		return "warn"
	}
}

func parseBenchOptions(phases string, duration time.Duration, clients, events int, consumers string, rate float64, target string) (benchOptions, error) {
	o := benchOptions{Duration: duration, Clients: clients, Events: events, Rate: rate}
	want := map[string]bool{}
	for _, p := range strings.Split(phases, ",") {
		p = strings.TrimSpace(p)
		switch {
		case p == "":
		case p == "all":
			for _, q := range benchPhaseOrder() {
				want[q] = true
			}
		case slices.Contains(benchPhaseOrder(), p):
			want[p] = true
		default:
			return o, fmt.Errorf("invalid --phases: unknown phase %q (known: %s)", p, strings.Join(benchPhaseOrder(), ", "))
		}
	}
	for _, p := range benchPhaseOrder() {
		if want[p] {
			o.Phases = append(o.Phases, p)
		}
	}
	if len(o.Phases) == 0 {
		return o, errors.New("invalid --phases: no phase selected")
	}
	if duration < 100*time.Millisecond {
		return o, fmt.Errorf("invalid --duration: must be at least 100ms, got %s", duration)
	}
	if clients < 1 || clients > 10000 {
		return o, fmt.Errorf("invalid --clients: must be from 1 to 10000, got %d", clients)
	}
	if events < 1 || events > 10_000_000 {
		return o, fmt.Errorf("invalid --events: must be from 1 to 10000000, got %d", events)
	}
	if rate <= 0 || rate > 1_000_000 {
		return o, fmt.Errorf("invalid --rate: must be above 0 and at most 1000000 per second, got %g", rate)
	}
	seen := map[int]bool{}
	for _, s := range strings.Split(consumers, ",") {
		if s = strings.TrimSpace(s); s == "" {
			continue
		}
		k, err := strconv.Atoi(s)
		if err != nil || k < 1 || k > 64 {
			return o, fmt.Errorf("invalid --consumers: each must be an integer from 1 to 64, got %q", s)
		}
		if !seen[k] {
			seen[k] = true
			o.Consumers = append(o.Consumers, k)
		}
	}
	if len(o.Consumers) == 0 {
		return o, errors.New("invalid --consumers: give at least one number, e.g. 1,2,4,8")
	}
	if target != "" {
		u, err := url.Parse(target)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return o, fmt.Errorf("invalid --target: must be a base URL like http://127.0.0.1:8080, got %q", target)
		}
		o.Target = strings.TrimRight(target, "/")
	}
	return o, nil
}

// lockedWriter serialises writes from the progress lines and the services' loggers.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}
