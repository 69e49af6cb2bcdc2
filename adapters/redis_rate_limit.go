package adapters

import (
	"context"
	"fmt"
	"math"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/checkins/checkins/app/command"
)

// RedisRateLimiter limits per user in Redis (GCRA), so every API instance on the same Redis
// shares each user's budget. Key: KeySpace.RateLimitUser(id), holding the theoretical arrival
// time in seconds since 2017-01-01 with a TTL of at most the policy's window (the state
// go-redis/redis_rate keeps, whose script this limiter used before).
//
// With WithReservations it also reserves a check-in's id in the same script call when it allows
// the request (command.ReservingLimiter): the user's rate key and the reservation's key carry
// the same hash tag ({user:N}), so they share a slot on a cluster too, and a request that was
// two round trips in a row (count, then reserve) is one.
type RedisRateLimiter struct {
	client   redis.UniversalClient
	pipeline *AutoPipeline // nil: one round trip per call
	keys     KeySpace
	limit    command.RateLimit
	idem     *IdempotencyStore // nil: Allow only
}

// NewRedisRateLimiter limits with l on client; with a pipeline, the limiter's script call
// shares round trips with the requests' other commands.
func NewRedisRateLimiter(client redis.UniversalClient, p *AutoPipeline, keys KeySpace, l command.RateLimit) (*RedisRateLimiter, error) {
	if l.Off() || l.Burst < 1 || l.Period <= 0 {
		return nil, fmt.Errorf("adapters: rate limit %+v is not a limit", l)
	}
	return &RedisRateLimiter{client: client, pipeline: p, keys: keys, limit: l}, nil
}

// WithReservations makes AllowAndReserve reserve in idem (whose keys must be r's).
func (r *RedisRateLimiter) WithReservations(idem *IdempotencyStore) *RedisRateLimiter {
	r.idem = idem
	return r
}

// gcraLua defines gcra(key, burst, rate, period, ttl): GCRA, the algorithm and state of
// redis_rate's allowN for one request, with the key's TTL (seconds, as a string) the policy's
// window rounded up (gcraTTL), which every reset after is within. It returns allowed (1 or 0),
// remaining, retry after and reset after (microseconds; retry after is -1 when allowed); a
// refused request writes nothing. The durations come back as integers and the TTL goes in as a
// string because Redis prints every other number of a script with snprintf ("%.17g"): three
// prints cost a request about 7,500 of Redis's instructions. TIME needs effects replication,
// the default since Redis 5.
//
// The state is redis_rate's, the theoretical arrival time (TAT) in seconds since 2017, but the
// arithmetic is in microseconds, and on how far the TAT is ahead of now rather than on both: at
// about 3.1e8 s a double holds a time to about 6e-8 s, and computed there, a user's first
// request under 10/s,burst=20 left a remaining of 18.99999... that floor made 18. The stored
// TAT is read back to about 0.03 µs (not rounded to whole ones, so that an interval below a
// microsecond still moves it), and remaining is floored with a tolerance of 0.1 µs: it absorbs
// that error and a division's rounding, and only a request within 0.1 µs of regaining a unit
// of quota can see one more than exact.
const gcraLua = `
local function gcra(key, burst, rate, period, ttl)
  local interval = period * 1000000 / rate
  local t = redis.call('TIME')
  local now = (t[1] - 1483228800) * 1000000 + t[2]
  local tat = tonumber(redis.call('GET', key) or '')
  local ahead = 0
  if tat then ahead = math.max(tat * 1000000 - now, 0) end
  local diff = interval * burst - ahead - interval
  if diff < 0 then
    return 0, 0, math.ceil(-diff), math.ceil(ahead)
  end
  redis.call('SET', key, (now + ahead + interval) / 1000000, 'EX', ttl)
  return 1, math.floor((diff + 0.1) / interval), -1, math.ceil(ahead + interval)
end
`

// gcraTTL is the TTL of a user's rate key under l: its window in whole seconds, rounded up.
// After an allowed request the theoretical arrival time is at most a window ahead.
func gcraTTL(l command.RateLimit) int64 {
	return max(1, int64(math.Ceil(l.Window().Seconds())))
}

// rateLua is gcra on KEYS[1] (ARGV[1..4]: burst, rate, period, ttl) and, with a second key, a
// reservation when the request is allowed: SET KEYS[2] ARGV[5] NX GET PX ARGV[6], whose reply
// comes fifth.
var rateLua = redis.NewScript(gcraLua + `
local allowed, remaining, retry, reset = gcra(KEYS[1], tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4])
if allowed == 0 or #KEYS == 1 then
  return {allowed, remaining, retry, reset}
end
return {allowed, remaining, retry, reset, redis.call('SET', KEYS[2], ARGV[5], 'NX', 'GET', 'PX', ARGV[6])}
`)

// Allow counts one request of user.
func (r *RedisRateLimiter) Allow(ctx context.Context, user int64) (command.RateDecision, error) {
	d, _, err := r.call(ctx, user, nil)
	return d, err
}

// AllowAndReserve counts one request of rec's user and, when allowed, reserves rec as
// IdempotencyStore.Reserve does, in one script call (two while legacy records may exist).
func (r *RedisRateLimiter) AllowAndReserve(ctx context.Context, rec command.IdempotencyRecord) (command.RateDecision, *command.IdempotencyRecord, error) {
	if r.idem == nil || r.idem.legacyLookups(ctx) {
		d, err := r.Allow(ctx, rec.Checkin.UserID)
		if err != nil || !d.Allowed || r.idem == nil {
			return d, nil, err
		}
		existing, err := r.idem.Reserve(ctx, rec)
		return d, existing, err
	}
	b, err := encodeRecord(stateReserved, rec)
	if err != nil {
		return command.RateDecision{}, nil, err
	}
	d, old, err := r.call(ctx, rec.Checkin.UserID, []any{r.idem.key(rec.Checkin), b, r.idem.ttl.Milliseconds()})
	if err != nil || !d.Allowed || old == nil {
		return d, nil, err
	}
	existing, err := decodeRecord(rec.Checkin.ID, old)
	return d, existing, err
}

// call runs rateLua for user, with reserve = {key, record, px} or nil; old is the reservation's
// GET (nil: the key was free).
func (r *RedisRateLimiter) call(ctx context.Context, user int64, reserve []any) (d command.RateDecision, old any, err error) {
	key, args := r.gcraArgs(user)
	keys := []string{key}
	if reserve != nil {
		keys = append(keys, reserve[0].(string))
		args = append(args, reserve[1:]...)
	}
	var v any
	if r.pipeline != nil {
		v, err = r.pipeline.Run(ctx, rateLua, keys, args...)
	} else {
		v, err = rateLua.Run(ctx, r.client, keys, args...).Result()
	}
	if err != nil {
		return d, nil, fmt.Errorf("rate limit of user %d: %w", user, err)
	}
	return decisionOf(user, v)
}

// gcraArgs are gcra's key and arguments (burst, rate, period, ttl) for user.
func (r *RedisRateLimiter) gcraArgs(user int64) (string, []any) {
	return r.keys.RateLimitUser(user), []any{r.limit.Burst, r.limit.Rate, r.limit.Period.Seconds(), gcraTTL(r.limit)}
}

// decisionOf reads a reply of gcra's four values (and the reservation's GET, fifth, when there
// is one: old, nil when the key was free).
func decisionOf(user int64, v any) (d command.RateDecision, old any, err error) {
	vals, ok := v.([]any)
	if !ok || len(vals) < 4 {
		return d, nil, fmt.Errorf("rate limit of user %d: unexpected reply %v", user, v)
	}
	allowed, _ := vals[0].(int64)
	remaining, _ := vals[1].(int64)
	retry, ok1 := vals[2].(int64)
	reset, ok2 := vals[3].(int64)
	if !ok1 || !ok2 {
		return d, nil, fmt.Errorf("rate limit of user %d: unexpected reply %v", user, v)
	}
	d = command.RateDecision{Allowed: allowed == 1, Remaining: int(remaining), RetryAfter: micros(retry), ResetAfter: micros(reset)}
	if len(vals) > 4 {
		old = vals[4]
	}
	return d, old, nil
}

// micros reads the script's microseconds; -1 (not refused) is -1, as redis_rate has it.
func micros(us int64) time.Duration {
	if us == -1 {
		return -1
	}
	return time.Duration(us) * time.Microsecond
}
