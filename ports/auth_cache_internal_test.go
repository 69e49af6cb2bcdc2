package ports

import (
	"strconv"
	"testing"
	"time"
)

// TestVerifiedTokensAreBounded: the cache never holds more than maxVerifiedTokens, drops expired
// entries first, and still answers for what it kept.
func TestVerifiedTokensAreBounded(t *testing.T) {
	var c verifiedTokens
	now := time.Now()
	for i := range maxVerifiedTokens {
		until := now.Add(time.Minute)
		if i%2 == 0 {
			until = now.Add(time.Second) // expires first
		}
		c.put("t"+strconv.Itoa(i), verifiedToken{p: Principal{UserID: int64(i + 1)}, until: until}, now)
	}
	later := now.Add(2 * time.Second)
	c.put("new", verifiedToken{p: Principal{UserID: 99}, until: later.Add(time.Minute)}, later)
	if n := len(c.m); n != maxVerifiedTokens/2+1 {
		t.Fatalf("after a put into a full cache: %d entries, want the %d unexpired ones and the new one", n, maxVerifiedTokens/2)
	}
	if p, ok := c.get("t1", later); !ok || p.UserID != 2 {
		t.Fatalf("an unexpired entry was dropped: %v %v", p, ok)
	}
	for i := range 2 * maxVerifiedTokens { // none expires: a quarter goes at each overflow
		c.put("u"+strconv.Itoa(i), verifiedToken{until: later.Add(time.Hour)}, later)
		if len(c.m) > maxVerifiedTokens {
			t.Fatalf("%d entries, more than %d", len(c.m), maxVerifiedTokens)
		}
	}
	if _, ok := c.get("new", later.Add(2*time.Minute)); ok {
		t.Fatal("an entry answered after its end")
	}
}
