package bench

import (
	"fmt"
	"sync"
	"time"

	"github.com/checkins/checkins/ports"
)

// benchTokens mints the load generator's tokens, one per user, with the service's key (hs256,
// or dev mode's key in STATE_DIR): the bench measures the service with authentication on, as
// users run it. AUTH_MODE=off sends none.
//
// The closed-loop clients' users (1 to loadUsers) get their tokens before any phase starts, and
// read them without a lock. Minted on first use, they cost the first timed phase (ingest) about
// 10,000 signatures that the phases after it, ingest-baseline among them, never paid, and every
// request of every phase took one mutex that 50 clients shared.
type benchTokens struct {
	issuer *ports.TokenIssuer // nil: authentication off
	load   []string           // load[u-1] is user u's token, for u in 1..loadUsers; read-only
	mu     sync.Mutex
	cache  map[int64]string // the other users' (e2e gives each check-in a user of its own)
}

func newBenchTokens(h Host, cfg Config) (*benchTokens, error) {
	iss, err := h.TokenIssuer(cfg)
	if err != nil || iss == nil {
		return &benchTokens{}, err
	}
	t := &benchTokens{issuer: iss, load: make([]string, loadUsers), cache: map[int64]string{}}
	for u := range t.load {
		tok, err := iss.Mint(int64(u+1), nil, tokenLife)
		if err != nil {
			return nil, fmt.Errorf("bench: mint user %d's token: %w", u+1, err)
		}
		t.load[u] = tok.Token
	}
	return t, nil
}

// tokenLife is how long the bench's tokens are valid: longer than any run.
const tokenLife = 6 * time.Hour

// forUser is user's token ("" with authentication off), minted once per run.
func (t *benchTokens) forUser(user int64) string {
	if t == nil || t.issuer == nil {
		return ""
	}
	if user >= 1 && user <= int64(len(t.load)) {
		return t.load[user-1]
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if tok, ok := t.cache[user]; ok {
		return tok
	}
	tok, err := t.issuer.Mint(user, nil, tokenLife)
	if err != nil {
		return "" // unreachable for user >= 1; the request then fails with 401, counted as an error
	}
	t.cache[user] = tok.Token
	return tok.Token
}
