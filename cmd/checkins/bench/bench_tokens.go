package bench

import (
	"sync"
	"time"

	"github.com/checkins/checkins/ports"
)

// benchTokens mints the load generator's tokens, one per user, with the service's key (hs256,
// or dev mode's key in STATE_DIR): the bench measures the service with authentication on, as
// users run it. AUTH_MODE=off sends none.
type benchTokens struct {
	issuer *ports.TokenIssuer // nil: authentication off
	mu     sync.Mutex
	cache  map[int64]string
}

func newBenchTokens(h Host, cfg Config) (*benchTokens, error) {
	iss, err := h.TokenIssuer(cfg)
	if err != nil || iss == nil {
		return &benchTokens{}, err
	}
	return &benchTokens{issuer: iss, cache: map[int64]string{}}, nil
}

// forUser is user's token ("" with authentication off), minted once per run.
func (t *benchTokens) forUser(user int64) string {
	if t == nil || t.issuer == nil {
		return ""
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if tok, ok := t.cache[user]; ok {
		return tok
	}
	tok, err := t.issuer.Mint(user, nil, 6*time.Hour)
	if err != nil {
		return "" // unreachable for user >= 1; the request then fails with 401, counted as an error
	}
	t.cache[user] = tok.Token
	return tok.Token
}
