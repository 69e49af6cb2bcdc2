package adapters

import (
	"net/url"
	"time"

	"github.com/redis/go-redis/v9"
)

// NewClusterClientWith builds the service's cluster client with one remedy for a failover or the
// other: a slot map reloaded every reload, and/or reloaded on connection errors.
func NewClusterClientWith(o ClientOptions, reload time.Duration, reloadOnErrors bool) (*redis.ClusterClient, error) {
	u, err := url.Parse(o.URL)
	if err != nil {
		return nil, err
	}
	return newClusterClientWith(o, u, reload, reloadOnErrors)
}
