package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"
	"golang.org/x/sync/errgroup"

	"github.com/checkins/checkins/adapters"
	"github.com/checkins/checkins/app"
	"github.com/checkins/checkins/app/command"
	"github.com/checkins/checkins/app/query"
	"github.com/checkins/checkins/ports"
)

// Service is the wired process: API, projections, or both.
type Service struct {
	cfg     Config
	log     *slog.Logger
	keys    adapters.KeySpace
	client  redis.UniversalClient // API, queries, stores, poison queue
	closers []func() error
	guard   *evictionGuard // nil on the embedded Redis
	// quiesce: a partition migration runs (or changed P): /checkins answers 503, projectors
	// stop reading.
	quiesce  *adapters.QuiesceWatch
	http     *ports.HTTPServer
	router   *ports.ProjectionRouter
	listener *ports.HTTPListener // the public one, nil until Listen (wire_http.go)
	httpLims ports.ServerLimits  // its limits
	proj     *projectionWiring   // metrics, stall checks (wire_projections.go)
	app      app.Application
	ui       *ports.UI // the dashboard (wire_ui.go)

	// Access (wire_access.go): the ops listener (nil: it shares the public one), the API's
	// auto-pipeline (the per-user rate limit goes through it), dev mode's token issuer.
	mode        Mode
	opsListener *ports.HTTPListener
	apiPipeline *adapters.AutoPipeline
	// The API's check-in command and its reservations: httpConfig gives them the per-user limit.
	recordCheckin *command.RecordCheckinHandler
	idem          *adapters.IdempotencyStore
	pub           *adapters.EventPublisher
	devIssuer     *ports.TokenIssuer
	banner        io.Writer // dev mode's tokens are printed here for a person (nil: logged only)

	// modeGuessed: REDIS_MODE auto, and Redis did not answer at start whether it is a cluster
	// node; standalone was assumed until Ready learns otherwise. modeUnchecked: REDIS_MODE
	// standalone or cluster, and Redis did not answer at start whether it agrees; Ready asks.
	modeGuessed   atomic.Bool
	modeUnchecked atomic.Bool
}

// quiesced: projectors stop reading while a partition migration runs (or changed P).
func (s *Service) quiesced() bool {
	_, ok := s.quiesce.Quiesced()
	return ok
}

// Mode selects what the process runs.
type Mode struct {
	API, Projections bool
}

// startEmbeddedRedis gives `serve` a Redis when REDIS_URL is unset, so the service runs on a
// machine with nothing but Go. Data lives in memory only.
func startEmbeddedRedis(log *slog.Logger) (string, func(), error) {
	m := miniredis.NewMiniRedis()
	// By default miniredis only expires keys on FastForward: idempotency records (IDEMPOTENCY_TTL)
	// would never expire and memory would only grow.
	m.ClockTTL(true)
	if err := m.StartAddr("127.0.0.1:0"); err != nil {
		return "", nil, fmt.Errorf("embedded redis: %w", err)
	}
	log.Warn("REDIS_URL is not set: using an EMBEDDED IN-MEMORY Redis. All check-ins are lost when this process exits. Set REDIS_URL for real use.",
		"embedded_addr", m.Addr())
	return "redis://" + m.Addr() + "/0", m.Close, nil
}

// NewService builds clients and wires adapters into the app and ports.
func NewService(ctx context.Context, cfg Config, mode Mode, log *slog.Logger) (_ *Service, err error) {
	s := &Service{cfg: cfg, log: log, mode: mode}
	defer func() {
		if err != nil {
			s.close() // the listeners and the clients made so far
		}
	}()
	if cfg.RedisURL == "" {
		return nil, errors.New("REDIS_URL is required (only `serve` may run on the embedded Redis)")
	}
	// Settings that refuse the start come before anything is written to Redis: a refused
	// `project` had joined its projections to a live group first, and a later start with
	// another PROJECTIONS list was then refused as a conflict with a projector that never ran.
	if err := cfg.checkListeners(); err != nil {
		return nil, err
	}
	// The signing key too (hs256's secret, or dev mode's key file, made on first run): a key
	// file others may read is refused, and was refused after the join.
	if _, err := cfg.signingKey(); err != nil {
		return nil, err
	}
	if s.httpLims, err = s.publicLimits(); err != nil {
		return nil, err
	}
	pingCtx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	redisMode, guessed, err := resolveRedisMode(pingCtx, cfg, log)
	if err != nil {
		return nil, err
	}
	s.modeGuessed.Store(guessed)
	if !cfg.embeddedRedis && (cfg.RedisMode == adapters.RedisModeStandalone || cfg.RedisMode == adapters.RedisModeCluster) {
		err := adapters.CheckRedisMode(pingCtx, redisOptions(cfg), cfg.RedisMode)
		switch {
		case errors.Is(err, adapters.ErrRedisModeMismatch):
			return nil, fmt.Errorf("invalid REDIS_URL/REDIS_MODE: %w", err)
		case err != nil: // not answered yet: Ready asks until it does
			s.modeUnchecked.Store(true)
		}
	}
	if s.keys, err = adapters.NewKeySpace(cfg.KeyPrefix, redisMode == adapters.RedisModeCluster); err != nil {
		return nil, fmt.Errorf("invalid KEY_PREFIX: %w", err)
	}
	// The ports too, once the settings are known good: a start refused because one is in use
	// has written nothing to Redis.
	if err := s.listenHTTP(); err != nil {
		return nil, err
	}
	newClientRead := func(pool int, read time.Duration) (redis.UniversalClient, error) {
		return adapters.NewUniversalRedisClient(ctx, adapters.ClientOptions{URL: cfg.RedisURL, TLS: cfg.RedisTLS, Mode: redisMode, DialTimeout: 2 * time.Second,
			ReadTimeout: read, WriteTimeout: 3 * time.Second, PoolSize: pool})
	}
	newClient := func(pool int) (redis.UniversalClient, error) { return newClientRead(pool, 3*time.Second) }
	if s.client, err = newClient(0); err != nil {
		return nil, err
	}
	s.closers = append(s.closers, s.client.Close)
	parts := streamPartitions(cfg, s.keys.Cluster)
	var startCheck func(context.Context) error
	if err := s.client.Ping(pingCtx).Err(); err != nil && strings.Contains(err.Error(), "DB index is out of range") {
		// The server answered, and it will never have that database: no waiting heals it.
		s.close()
		return nil, fmt.Errorf("invalid REDIS_URL %s: %w (the server has fewer databases; see its `databases` setting)", redact(cfg.RedisURL), err)
	} else if err != nil {
		// Not fatal: the service starts, answers 503 and /readyz says why, and recovers by itself.
		// The partition count is checked against the recorded one once Redis answers: until
		// then the API and the projectors stand still (QuiesceWatch.WithStartCheck).
		log.Warn("redis is not reachable yet", "redis_url", redact(cfg.RedisURL), "error", err, "stream_partitions", parts)
		unpartitioned := s.keys
		var told atomic.Bool
		startCheck = func(ctx context.Context) error {
			_, err := withPartitions(ctx, s.client, unpartitioned, parts)
			if errors.Is(err, adapters.ErrPartitionMismatch) && !told.Swap(true) {
				log.Error("the event stream's partition count differs from this process's: it answers 503 and reads nothing until restarted", "error", err)
			}
			return err
		}
		if s.keys, err = s.keys.WithPartitions(parts); err != nil {
			s.close()
			return nil, err
		}
	} else if s.keys, err = withPartitions(pingCtx, s.client, s.keys, parts); err != nil {
		// Another P than the stream was created with: refuse, naming the migration.
		s.close()
		return nil, err
	}
	if cfg.IngestMinReplicas > 0 {
		s.keys = s.keys.WithRecordsInUserSlots()
	}
	s.quiesce = adapters.NewQuiesceWatch(s.client, s.keys)
	if mode.API {
		s.quiesce.WithRequestTimeout(cfg.RequestTimeout)
	}
	if startCheck != nil {
		s.quiesce.WithStartCheck(startCheck)
	}
	_ = s.quiesce.Check(pingCtx) // unreachable: Run looks again
	if !cfg.embeddedRedis {
		s.guard = newEvictionGuard(s.client, cfg.AllowEvictingRedis, log)
		s.guard.interval = cfg.RedisCheckInterval
		if err := s.guard.Start(pingCtx); err != nil {
			s.close()
			return nil, err
		}
	}
	wlog := ports.NewWatermillLogger(log)
	var application app.Application
	application.Queries = app.Queries{
		Checkins:  query.NewCheckins(adapters.NewEventLog(s.client, s.keys)),
		Users:     app.UserQueries{Reader: adapters.NewProjectionReader(s.client, s.keys, "users")},
		Locations: app.LocationQueries{Reader: adapters.NewProjectionReader(s.client, s.keys, "locations")},
	}
	s.projectionQueries(&application.Queries)
	closeOps, err := addOps(&application, s.client, s.keys, cfg, allProjections(cfg), log)
	if err != nil {
		return nil, err
	}
	s.closers = append(s.closers, closeOps)
	if err := s.initProjections(mode, application); err != nil {
		return nil, err
	}
	if mode.API {
		// Watermill's Publisher.Close closes its client, so it gets one of its own.
		pubClient, err := newClient(0)
		if err != nil {
			return nil, err
		}
		// The commands of concurrent requests (reserve the checkinId, XADD, mark it published)
		// share round trips through one auto-pipeline on a client of its own; every request
		// still answers only after its own XADD is confirmed.
		// A WAIT holds its pipeline's reply for up to INGEST_REPLICA_TIMEOUT.
		pipeClient, err := newClientRead(0, 3*time.Second+cfg.IngestReplicaTimeout)
		if err != nil {
			_ = pubClient.Close()
			return nil, err
		}
		if cfg.IngestMinReplicas > 0 {
			if err := adapters.RequireReplicas(pipeClient, cfg.IngestMinReplicas, cfg.IngestReplicaTimeout); err != nil {
				_, _ = pubClient.Close(), pipeClient.Close()
				return nil, err
			}
		}
		// Four pipelines in flight, not two: in serve the API's commands share Redis with the
		// projections' script calls, and with two connections a request waited behind more of
		// them (sustained, nine interleaved pairs of runs: 5,053 -> 5,653 fully projected
		// check-ins/s, medians, 7 of 9 pairs faster; the API alone within the noise).
		apiPipeline := adapters.NewAutoPipeline(pipeClient, 256, apiPipelines)
		s.closers = append(s.closers, pipeClient.Close, apiPipeline.Close)
		s.apiPipeline = apiPipeline
		pub, err := adapters.NewPipelinedEventPublisher(pubClient, apiPipeline, s.keys, wlog)
		if err != nil {
			_ = pubClient.Close()
			return nil, err
		}
		s.closers = append(s.closers, pub.Close)
		idem := adapters.NewIdempotencyStore(s.client, s.keys, cfg.IdempotencyTTL).WithAutoPipeline(apiPipeline)
		rec, err := command.NewRecordCheckinHandler(pub, idem, time.Now, uuid.NewString, log)
		if err != nil {
			return nil, err
		}
		// A reservation's owner cannot XADD after its request deadline (the auto-pipeline sends
		// no command past its caller's deadline), so past REQUEST_TIMEOUT, plus a margin for
		// network and clock skew, taking it over cannot write the event twice.
		rec.WithTakeoverAge(max(command.DefaultTakeoverAge, cfg.RequestTimeout+time.Second))
		s.closers = append(s.closers, rec.Close) // before the pipeline its marks go through
		application.Commands.RecordCheckin = rec
		s.recordCheckin, s.idem, s.pub = rec, idem, pub
	}
	if mode.Projections {
		targets, err := s.initialTargets(pingCtx, application.Queries.ProjectionVersions, application.Commands.RebuildProjection)
		if err != nil {
			return nil, err
		}
		// Room for a rebuild's own groups. With PROJECTION_MIN_REPLICAS a delivery waits for its
		// replicas too (a WAIT on its connection, up to PROJECTION_REPLICA_TIMEOUT).
		subClient, err := newClientRead(8*len(s.proj.projs), 3*time.Second+cfg.ProjectionReplicaTimeout)
		if err != nil {
			return nil, err
		}
		s.closers = append(s.closers, subClient.Close)
		if cfg.ProjectionMinReplicas > 0 {
			if err := adapters.RequireDeliveryReplicas(subClient, cfg.ProjectionMinReplicas, cfg.ProjectionReplicaTimeout); err != nil {
				return nil, err
			}
		}
		// Updates go through a pool of their own, so reads and the API never queue behind a
		// batch of projection writes. A WAIT holds its pipeline's reply for up to
		// PROJECTION_REPLICA_TIMEOUT.
		storeClient, err := newClientRead(16, 3*time.Second+cfg.ProjectionReplicaTimeout)
		if err != nil {
			return nil, err
		}
		s.closers = append(s.closers, storeClient.Close)
		applier, err := newApplier(storeClient, s.keys, cfg)
		if err != nil {
			return nil, err
		}
		names := make([]string, len(s.proj.projs))
		for i, p := range s.proj.projs {
			names[i] = p.Name()
		}
		// PROJECTIONS naming every shipped projection is the default set: the live group is
		// `live`, which a process without PROJECTIONS feeds too (not a group of its own that
		// the other's memberships refuse).
		var shipped []string
		for _, p := range allProjections(cfg) {
			shipped = append(shipped, p.Name())
		}
		all := len(cfg.Projections) == 0 || sameNames(names, shipped)
		s.router, err = ports.NewProjectionRouter(ports.ProjectionRouterConfig{
			Projections: s.proj.projs, LiveGroup: ports.LiveGroupName(names, all),
			Backend: adapters.NewProjectorBackend(s.client, s.keys), Applier: applier, BatchSize: cfg.BatchSize,
			NewSubscriber: adapters.Subscribers{Kind: cfg.Subscriber, Client: subClient, Parts: s.keys.Partitions(),
				// The stock subscriber closes its client on Close: one client each.
				NewClient: func() (redis.UniversalClient, error) { return newClient(0) },
				Consumer:  cfg.ConsumerName, BatchSize: int64(cfg.BatchSize), ReadLinger: cfg.ReadLinger, MaxInFlight: cfg.MaxInFlight,
				ClaimInterval: cfg.ClaimInterval, ClaimIdle: cfg.ClaimIdle, NackDelay: cfg.NackDelay, DrainTimeout: cfg.DrainTimeout,
				ConsumerIdleRemove: cfg.ConsumerIdleRemove, Paused: s.quiesced, Logger: wlog, StockLogger: ports.NewThrottledErrorLogger(wlog, 10*time.Second),
			}.New,
			Retry: ports.RetryPolicy{InitialInterval: cfg.RetryInitial, Multiplier: cfg.RetryMultiplier,
				MaxInterval: cfg.RetryMax, MaxAttempts: cfg.RetryAttempts},
			HandlerTimeout: cfg.HandlerTimeout, CloseTimeout: cfg.DrainTimeout, Logger: log, Observer: s.proj.metrics,
			Paused: s.quiesced,
		})
		if err != nil {
			return nil, err
		}
		if len(targets) > 0 {
			if _, _, err := s.router.SetTargets(pingCtx, targets); err != nil {
				switch {
				case ports.JoinWaits(err):
					// A disband or a drop is removing what a group or version left, or a
					// partition migration runs: the other projections start now, those the error
					// names once it is done (the registry watcher joins them; /readyz says why
					// meanwhile).
					log.Warn("some projections start once the disband, drop or partition migration in progress has finished", "error", err)
				case !ports.IsTransient(adapters.RedisErrors{}, err) && !errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil:
					return nil, err
				default:
					// Redis cannot be reached yet: the registry watcher starts the projections
					// when it answers.
					log.Warn("projections start when Redis answers", "error", err)
				}
			}
		}
	}
	httpCfg, err := s.httpConfig(ctx)
	if err != nil {
		return nil, err
	}
	httpCfg.CORSAllowedOrigins = cfg.HTTP.CORSOrigins
	httpCfg.Quiesced = s.quiesce.Err
	s.app = application
	s.http = ports.NewHTTPServer(application, s, httpCfg, log)
	if err := s.wireProjections(); err != nil {
		return nil, err
	}
	if err := s.wireUI(); err != nil {
		return nil, err
	}
	s.handleHTTP()
	return s, nil
}

// redisOptions are the options of a short-lived client of REDIS_URL, to ask it something at start.
func redisOptions(cfg Config) adapters.ClientOptions {
	return adapters.ClientOptions{URL: cfg.RedisURL, TLS: cfg.RedisTLS, DialTimeout: 2 * time.Second,
		ReadTimeout: 3 * time.Second, WriteTimeout: 3 * time.Second}
}

// resolveRedisMode decides once whether REDIS_URL is one server or a cluster, so that every
// client of the process is of the same kind. Auto mode with one address asks it; when it does not
// answer yet the service starts as on one server (as before clusters were supported), says so,
// and /readyz reports the mistake if the server turns out to be a cluster node.
func resolveRedisMode(ctx context.Context, cfg Config, log *slog.Logger) (mode adapters.RedisMode, guessed bool, err error) {
	if cfg.embeddedRedis {
		return adapters.RedisModeStandalone, false, nil
	}
	m, err := adapters.DetectRedisMode(ctx, adapters.ClientOptions{URL: cfg.RedisURL, TLS: cfg.RedisTLS, Mode: cfg.RedisMode, DialTimeout: 2 * time.Second,
		ReadTimeout: 3 * time.Second, WriteTimeout: 3 * time.Second})
	if errors.Is(err, adapters.ErrRedisModeUndetected) {
		log.Warn("redis did not answer whether it is a cluster node: starting in standalone mode; set REDIS_MODE=cluster (or standalone) to decide without asking",
			"redis_url", redact(cfg.RedisURL), "error", err)
		return adapters.RedisModeStandalone, true, nil
	}
	if err != nil {
		return "", false, fmt.Errorf("invalid REDIS_URL/REDIS_MODE: %w", err)
	}
	return m, false, nil
}

// Ready implements ports.Readiness: Redis answers and, in a projector, the router consumes.
func (s *Service) Ready(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	if err := s.client.Ping(ctx).Err(); err != nil {
		return fmt.Errorf("redis unreachable: %w", err)
	}
	if s.modeGuessed.Load() {
		info, err := s.client.Info(ctx, "cluster").Result()
		switch {
		case err == nil && strings.Contains(info, "cluster_enabled:1"):
			return errors.New("REDIS_URL names a Redis Cluster node, but the service started in standalone mode because Redis did not answer at start: restart it, or set REDIS_MODE=cluster")
		case err == nil:
			s.modeGuessed.Store(false) // one server indeed
		case !adapters.IsTransient(err):
			s.modeGuessed.Store(false) // INFO refused (a managed Redis): it cannot tell, and will not
		}
	}
	if s.modeUnchecked.Load() {
		err := adapters.CheckRedisMode(ctx, redisOptions(s.cfg), s.cfg.RedisMode)
		switch {
		case errors.Is(err, adapters.ErrRedisModeMismatch):
			return fmt.Errorf("%w: restart with the mode fixed", err)
		case err == nil || !errors.Is(err, adapters.ErrRedisModeUndetected) || !adapters.IsTransient(err):
			s.modeUnchecked.Store(false) // agreed, or INFO refused (a managed Redis): it cannot tell, and will not
		}
	}
	if why, ok := s.quiesce.Quiesced(); ok {
		return errors.New(why)
	}
	if s.guard != nil {
		if p := s.guard.Problem(); p != "" {
			return fmt.Errorf("%s", p)
		}
	}
	if s.router != nil {
		p := s.router.Problem()
		switch {
		case !s.router.Running() && p != "":
			return fmt.Errorf("projection router is not running: %s", p)
		case !s.router.Running():
			return errors.New("projection router is not running")
		case p != "":
			return fmt.Errorf("projections cannot apply events: %s", p)
		}
	}
	if err := s.projectionsReady(ctx); err != nil {
		return err
	}
	return nil
}

// Listen returns the public listener's address (OpsAddr is the other's); NewService bound
// both, so callers learn the ports before Run.
func (s *Service) Listen() (net.Addr, error) { return s.listener.Addr(), nil }

// Run serves until ctx ends, then shuts down gracefully within DrainTimeout: stop accepting
// requests, finish in-flight ones and in-flight handlers, ack what finished.
func (s *Service) Run(ctx context.Context) error {
	var stopAt atomic.Int64 // unix ns when ctx ended: what is left of DRAIN_TIMEOUT bounds the closers
	context.AfterFunc(ctx, func() { stopAt.Store(time.Now().UnixNano()) })
	defer func() { s.closeWithin(s.closeBudget(stopAt.Load())) }()
	g, gctx := errgroup.WithContext(ctx)
	if _, err := s.Listen(); err != nil {
		return err
	}
	// The ports are bound: announce dev mode's tokens before "http listening", which a reader
	// of the log (a person, a test) takes as the service being up.
	if err := s.announceDev(s.banner); err != nil {
		s.log.Warn("dev mode tokens", "error", err)
	}
	s.serveHTTP(gctx, g)
	if s.router != nil {
		g.Go(func() error { return s.router.Run(gctx) })
	}
	// Samples for the dashboard; when gctx ends it closes the open event streams, which would
	// otherwise hold the listeners' graceful shutdown for DRAIN_TIMEOUT.
	g.Go(func() error { return s.ui.Run(gctx) })
	background, berr := s.projectionBackground()
	if berr != nil {
		g.Go(func() error { return berr })
	}
	for _, run := range background {
		g.Go(func() error { return run(gctx) })
	}
	if s.guard != nil {
		g.Go(func() error { return s.guard.Run(gctx) })
	}
	g.Go(func() error { return s.quiesce.Run(gctx) })
	err := s.wait(ctx, g)
	s.log.Info("stopped", "error", err)
	return err
}

// drainSlack is how long past DRAIN_TIMEOUT the stop waits for the loops that bound their own
// drain by it (the listeners, the router) to report.
const drainSlack = 100 * time.Millisecond

// wait is g.Wait, except that once ctx ends (the stop) it waits at most DRAIN_TIMEOUT: a loop
// blocked on a Redis that stalls (the dashboard's sampler writing, the eviction guard reading)
// would otherwise hold the stop until the connection's read timeout, and an orchestrator's grace
// period before SIGKILL is set from DRAIN_TIMEOUT.
func (s *Service) wait(ctx context.Context, g *errgroup.Group) error {
	done := make(chan error, 1)
	go func() { done <- g.Wait() }()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
	}
	t := time.NewTimer(s.cfg.DrainTimeout + drainSlack)
	defer t.Stop()
	select {
	case err := <-done:
		return err
	case <-t.C:
		return fmt.Errorf("stopping took longer than DRAIN_TIMEOUT (%s): %w", s.cfg.DrainTimeout, context.DeadlineExceeded)
	}
}

func (s *Service) close() {
	for i := len(s.closers) - 1; i >= 0; i-- {
		_ = s.closers[i]()
	}
}

// minCloseBudget is the least time the closers get after a drain that used up DRAIN_TIMEOUT:
// the queued idempotency marks are a round trip.
const minCloseBudget = 300 * time.Millisecond

// closeBudget is what is left of DRAIN_TIMEOUT since the stop began at stopNs (0: Run ended by
// itself, not by a stop: the whole DRAIN_TIMEOUT), and at least minCloseBudget.
func (s *Service) closeBudget(stopNs int64) time.Duration {
	left := s.cfg.DrainTimeout
	if stopNs != 0 {
		left -= time.Since(time.Unix(0, stopNs))
	}
	return max(left, minCloseBudget)
}

// closeWithin runs the closers, waiting for them at most d: one of them may wait for a round
// trip to a Redis that stalls (the auto-pipeline's Close waits for its pipelines in flight, which
// end only at the connection's read timeout), and the stop must stay within DRAIN_TIMEOUT, which
// an orchestrator's grace period before SIGKILL is set from.
func (s *Service) closeWithin(d time.Duration) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		s.close()
	}()
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
		s.log.Warn("closing the connections took longer than what was left of DRAIN_TIMEOUT: stopped without waiting for them", "waited", d)
	}
}

// apiPipelines is how many auto-pipelined round trips the API keeps in flight.
const apiPipelines = 4

// sameNames says whether a and b hold the same names, in any order.
func sameNames(a, b []string) bool {
	x, y := slices.Clone(a), slices.Clone(b)
	slices.Sort(x)
	slices.Sort(y)
	return slices.Equal(x, y)
}
