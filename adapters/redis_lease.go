package adapters

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"
)

// lease is a key held with a random token and a TTL (SET NX PX), extended every ttl/3 while its
// holder lives, so that one process at a time does what it guards and a holder that died lets go
// after ttl.
type lease struct {
	lost     chan struct{} // closed once the key no longer holds the token, or could not be extended for ttl
	release  func(context.Context) error
	lostOnce sync.Once
}

var releaseLeaseLua = redis.NewScript(`
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
`)

var extendLeaseLua = redis.NewScript(`
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return 0
`)

// acquireLease takes key for ttl, or answers ok false when another holder has it. The holder
// must call release when done; the lease's lost channel closes if another holder took the key
// (the TTL passed while this process could not extend it).
func acquireLease(ctx context.Context, client redis.UniversalClient, key string, ttl time.Duration) (*lease, bool, error) {
	token := uuid.NewString()
	ok, err := client.SetNX(ctx, key, token, ttl).Result()
	if err != nil || !ok {
		return nil, false, err
	}
	l := &lease{lost: make(chan struct{})}
	stop, stopped := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(stopped)
		t := time.NewTicker(max(ttl/3, time.Millisecond))
		defer t.Stop()
		// The key expires ttl after the last extension Redis took, which was sent at extended at
		// the latest. An extension that fails when half the ttl has passed since then is the
		// last chance: the next tick (ttl/3 later, plus the ttl/6 an extension may take) would
		// come when the key may be gone and another holder may have it, so the lease counts as
		// lost before that can happen, not after.
		extended := time.Now()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
				sent := time.Now()
				ectx, cancel := context.WithTimeout(context.WithoutCancel(ctx), max(ttl/6, time.Millisecond))
				n, err := extendLeaseLua.Run(ectx, client, []string{key}, token, ttl.Milliseconds()).Int()
				cancel()
				switch {
				case err == nil && n == 1:
					extended = sent
				case err == nil || time.Since(extended) >= ttl/2: // taken, or it may expire before the next try
					l.lostOnce.Do(func() { close(l.lost) })
					return
				} // else retried at the next tick
			}
		}
	}()
	var once sync.Once
	l.release = func(ctx context.Context) error {
		once.Do(func() { close(stop) })
		<-stopped
		if err := releaseLeaseLua.Run(ctx, client, []string{key}, token).Err(); err != nil {
			return fmt.Errorf("release %s: %w", key, err)
		}
		return nil
	}
	return l, true, nil
}
