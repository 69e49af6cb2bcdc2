package adapters

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"
)

// RateLimit is a GCRA policy: Rate requests per Period on average, Burst at once.
type RateLimit struct {
	Rate   int
	Period time.Duration
	Burst  int
}

// Off reports the zero policy: no limit.
func (l RateLimit) Off() bool { return l.Rate == 0 }

// Window is how long a full burst takes to come back: the "w" of the RateLimit-Policy header.
func (l RateLimit) Window() time.Duration {
	return time.Duration(int64(l.Period) * int64(l.Burst) / int64(l.Rate))
}

// String writes the policy the way ParseRateLimit reads it.
func (l RateLimit) String() string {
	if l.Off() {
		return "off"
	}
	unit := map[time.Duration]string{time.Second: "s", time.Minute: "m", time.Hour: "h"}[l.Period]
	return fmt.Sprintf("%d/%s,burst=%d", l.Rate, unit, l.Burst)
}

// ParseRateLimit reads "off" or "<n>/<s|m|h>[,burst=<b>]" (burst defaults to n).
func ParseRateLimit(v string) (RateLimit, error) {
	v = strings.TrimSpace(v)
	if v == "off" {
		return RateLimit{}, nil
	}
	bad := fmt.Errorf("must be off or like 10/s,burst=20 (a rate per s, m or h, and an optional burst), got %q", v)
	spec, burst, hasBurst := strings.Cut(v, ",")
	n, unit, ok := strings.Cut(strings.TrimSpace(spec), "/")
	if !ok {
		return RateLimit{}, bad
	}
	rate, err := strconv.Atoi(n)
	if err != nil || rate < 1 {
		return RateLimit{}, bad
	}
	period, ok := map[string]time.Duration{"s": time.Second, "m": time.Minute, "h": time.Hour}[unit]
	if !ok {
		return RateLimit{}, bad
	}
	l := RateLimit{Rate: rate, Period: period, Burst: rate}
	if hasBurst {
		k, b, ok := strings.Cut(strings.TrimSpace(burst), "=")
		if !ok || k != "burst" {
			return RateLimit{}, bad
		}
		if l.Burst, err = strconv.Atoi(b); err != nil || l.Burst < 1 {
			return RateLimit{}, bad
		}
	}
	return l, nil
}

// RateDecision is the limiter's answer for one request.
type RateDecision struct {
	Allowed    bool
	Remaining  int           // requests that could be made at once now
	RetryAfter time.Duration // when refused: until the next one is allowed
	ResetAfter time.Duration // until the full burst is back
}

// RedisRateLimiter limits per user in Redis (GCRA, go-redis/redis_rate), so every API instance
// on the same Redis shares each user's budget. Keys: "rate:" + KeySpace.RateLimitUser(id), with
// a TTL of at most the policy's window.
type RedisRateLimiter struct {
	limiter *redis_rate.Limiter
	keys    KeySpace
	limit   redis_rate.Limit
}

// NewRedisRateLimiter limits with l on client; with a pipeline, the limiter's script call
// shares round trips with the requests' other commands.
func NewRedisRateLimiter(client redis.UniversalClient, p *AutoPipeline, keys KeySpace, l RateLimit) (*RedisRateLimiter, error) {
	if l.Off() || l.Burst < 1 || l.Period <= 0 {
		return nil, fmt.Errorf("adapters: rate limit %+v is not a limit", l)
	}
	var r rediser = client
	if p != nil {
		r = pipelinedRediser{UniversalClient: client, p: p}
	}
	return &RedisRateLimiter{limiter: redis_rate.NewLimiter(r), keys: keys,
		limit: redis_rate.Limit{Rate: l.Rate, Period: l.Period, Burst: l.Burst}}, nil
}

// Allow counts one request of user.
func (r *RedisRateLimiter) Allow(ctx context.Context, user int64) (RateDecision, error) {
	res, err := r.limiter.Allow(ctx, r.keys.RateLimitUser(user), r.limit)
	if err != nil {
		return RateDecision{}, fmt.Errorf("rate limit of user %d: %w", user, err)
	}
	return RateDecision{Allowed: res.Allowed > 0, Remaining: res.Remaining, RetryAfter: res.RetryAfter, ResetAfter: res.ResetAfter}, nil
}

// rediser is what redis_rate needs of a client.
type rediser interface {
	Eval(ctx context.Context, script string, keys []string, args ...any) *redis.Cmd
	EvalSha(ctx context.Context, sha1 string, keys []string, args ...any) *redis.Cmd
	ScriptExists(ctx context.Context, hashes ...string) *redis.BoolSliceCmd
	ScriptLoad(ctx context.Context, script string) *redis.StringCmd
	Del(ctx context.Context, keys ...string) *redis.IntCmd
	EvalRO(ctx context.Context, script string, keys []string, args ...any) *redis.Cmd
	EvalShaRO(ctx context.Context, sha1 string, keys []string, args ...any) *redis.Cmd
}

// pipelinedRediser sends the limiter's EVALSHA (and its EVAL fallback) through the
// auto-pipeline; everything else goes straight to the client.
type pipelinedRediser struct {
	redis.UniversalClient
	p *AutoPipeline
}

func (r pipelinedRediser) eval(ctx context.Context, verb, scriptOrSha string, keys []string, args []any) *redis.Cmd {
	cmdArgs := make([]any, 0, 3+len(keys)+len(args))
	cmdArgs = append(cmdArgs, verb, scriptOrSha, len(keys))
	for _, k := range keys {
		cmdArgs = append(cmdArgs, k)
	}
	cmdArgs = append(cmdArgs, args...)
	cmd := redis.NewCmd(ctx, cmdArgs...)
	v, err := r.p.Do(ctx, cmdArgs...)
	if err != nil && !errors.Is(err, redis.Nil) {
		cmd.SetErr(err)
		return cmd
	}
	cmd.SetVal(v)
	cmd.SetErr(err)
	return cmd
}

func (r pipelinedRediser) Eval(ctx context.Context, script string, keys []string, args ...any) *redis.Cmd {
	return r.eval(ctx, "EVAL", script, keys, args)
}

func (r pipelinedRediser) EvalSha(ctx context.Context, sha string, keys []string, args ...any) *redis.Cmd {
	return r.eval(ctx, "EVALSHA", sha, keys, args)
}
