package adapters

import (
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

// ClientOptions tune the go-redis client. Timeouts are short so an outage turns into a quick
// error (503 at the API, a retried handler) instead of a hang.
type ClientOptions struct {
	URL          string
	DialTimeout  time.Duration
	ReadTimeout  time.Duration
	WriteTimeout time.Duration
	PoolSize     int
	Mode         RedisMode // NewUniversalRedisClient only; "" is auto
}

// NewRedisClient builds a client from a redis:// or rediss:// URL. Each Watermill publisher and
// subscriber needs a client of its own: their Close closes the client they were given.
func NewRedisClient(o ClientOptions) (*redis.Client, error) {
	opt, err := redis.ParseURL(o.URL)
	if err != nil {
		return nil, fmt.Errorf("REDIS_URL: %w", err)
	}
	if o.DialTimeout > 0 {
		opt.DialTimeout = o.DialTimeout
	}
	if o.ReadTimeout > 0 {
		opt.ReadTimeout = o.ReadTimeout
	}
	if o.WriteTimeout > 0 {
		opt.WriteTimeout = o.WriteTimeout
	}
	if o.PoolSize > 0 {
		opt.PoolSize = o.PoolSize
	}
	opt.ContextTimeoutEnabled = true
	// RESP2: the service uses no push messages, and with RESP3 go-redis peeks for pending push
	// notifications around every command, which costs a syscall each on the hot paths.
	opt.Protocol = 2
	// One retry hides a dropped idle connection; more would only delay the error while Redis is down.
	opt.MaxRetries = 1
	return redis.NewClient(opt), nil
}
