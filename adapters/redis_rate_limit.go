package adapters

import (
	"context"
	"errors"
	"fmt"

	"github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"

	"github.com/checkins/checkins/app/command"
)

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
func NewRedisRateLimiter(client redis.UniversalClient, p *AutoPipeline, keys KeySpace, l command.RateLimit) (*RedisRateLimiter, error) {
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
func (r *RedisRateLimiter) Allow(ctx context.Context, user int64) (command.RateDecision, error) {
	res, err := r.limiter.Allow(ctx, r.keys.RateLimitUser(user), r.limit)
	if err != nil {
		return command.RateDecision{}, fmt.Errorf("rate limit of user %d: %w", user, err)
	}
	return command.RateDecision{Allowed: res.Allowed > 0, Remaining: res.Remaining, RetryAfter: res.RetryAfter, ResetAfter: res.ResetAfter}, nil
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
