package ports

import (
	"fmt"
	"math"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/checkins/checkins/app/command"
)

// CodeRateLimited is the JSON error code of a 429.
const CodeRateLimited = "rate_limited"

// IPRateLimiter is an in-process GCRA limiter keyed by client address: the same algorithm as
// the per-user limiter, without a round trip. An IPv6 client is limited per /64, the block one
// subscriber usually holds. Memory: one entry per address seen within the policy's window.
type IPRateLimiter struct {
	limit    command.RateLimit
	interval time.Duration // between two requests on average
	burst    time.Duration // interval * burst
	now      func() time.Time

	mu        sync.Mutex
	tat       map[string]time.Time // theoretical arrival time per address
	lastSweep time.Time
}

// NewIPRateLimiter limits with l.
func NewIPRateLimiter(l command.RateLimit) (*IPRateLimiter, error) {
	if l.Off() || l.Burst < 1 || l.Period <= 0 {
		return nil, fmt.Errorf("ports: rate limit %+v is not a limit", l)
	}
	iv := l.Period / time.Duration(l.Rate)
	return &IPRateLimiter{limit: l, interval: iv, burst: iv * time.Duration(l.Burst), now: time.Now, tat: map[string]time.Time{}}, nil
}

// Allow counts one request from ip.
func (l *IPRateLimiter) Allow(ip string) command.RateDecision {
	key := ipKey(ip)
	now := l.now()
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.tat) > 4096 && now.Sub(l.lastSweep) > time.Second {
		// An entry whose TAT has passed is a fresh budget: dropping it changes nothing.
		for k, t := range l.tat {
			if !t.After(now) {
				delete(l.tat, k)
			}
		}
		l.lastSweep = now
	}
	tat := l.tat[key]
	if tat.Before(now) {
		tat = now
	}
	next := tat.Add(l.interval)
	allowAt := next.Add(-l.burst)
	if now.Before(allowAt) {
		return command.RateDecision{RetryAfter: allowAt.Sub(now), ResetAfter: tat.Sub(now)}
	}
	l.tat[key] = next
	return command.RateDecision{Allowed: true, Remaining: int(now.Sub(allowAt) / l.interval), ResetAfter: next.Sub(now)}
}

// ipKey is the address a budget belongs to: an IPv4 address, or the /64 of an IPv6 one.
func ipKey(ip string) string {
	p := net.ParseIP(ip)
	if p == nil || p.To4() != nil {
		return ip
	}
	return p.Mask(net.CIDRMask(64, 128)).String() + "/64"
}

// The IETF draft's fields, spelled as it spells them; they are set under these map keys as they
// are (see addItem), never through Header.Set, which would canonicalize them to Ratelimit.
const (
	headerRateLimit       = "RateLimit"
	headerRateLimitPolicy = "RateLimit-Policy"
)

// rateHeaders writes the RateLimit-Policy and RateLimit fields of the IETF draft
// (draft-ietf-httpapi-ratelimit-headers: q = quota, w = window in seconds, r = remaining,
// t = seconds until the quota is back) for one named policy, appended to those already set.
func rateHeaders(h http.Header, name string, l command.RateLimit, d command.RateDecision) {
	// Appended, not fmt.Sprintf'd: every POST /checkins answers with both.
	var buf [64]byte
	b := strconv.AppendQuote(buf[:0], name)
	b = append(b, ";q="...)
	b = strconv.AppendInt(b, int64(l.Burst), 10)
	b = append(b, ";w="...)
	b = strconv.AppendInt(b, ceilSeconds(l.Window()), 10)
	addItem(h, headerRateLimitPolicy, b)
	b = strconv.AppendQuote(buf[:0], name)
	b = append(b, ";r="...)
	b = strconv.AppendInt(b, int64(max(d.Remaining, 0)), 10)
	b = append(b, ";t="...)
	b = strconv.AppendInt(b, ceilSeconds(d.ResetAfter), 10)
	addItem(h, headerRateLimit, b)
}

// addItem appends one item to a structured-field list header. key is the map key as is, spelled
// as the draft spells it ("RateLimit", which Header.Get would look up as "Ratelimit" and never
// find: the user's item then replaced the address's).
func addItem(h http.Header, key string, item []byte) {
	if old := h[key]; len(old) > 0 {
		h[key] = []string{old[0] + ", " + string(item)}
		return
	}
	h[key] = []string{string(item)}
}

func ceilSeconds(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64(math.Ceil(d.Seconds()))
}

// rateLimited is the 429 answer: Retry-After in whole seconds (at least 1), the JSON error.
func rateLimited(c echo.Context, what string, d command.RateDecision) error {
	secs := max(ceilSeconds(d.RetryAfter), 1)
	c.Response().Header().Set("Retry-After", strconv.FormatInt(secs, 10))
	return apiError(http.StatusTooManyRequests, CodeRateLimited, "",
		fmt.Sprintf("too many requests %s: retry in %ds", what, secs))
}

// limitIP is the per-address limit of every route of a listener; it runs before anything else
// is done for the request, so a refused request costs little and writes nothing.
func (s *HTTPServer) limitIP(l *IPRateLimiter) echo.MiddlewareFunc {
	return func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			d := l.Allow(c.RealIP())
			rateHeaders(c.Response().Header(), "ip", l.limit, d)
			if !d.Allowed {
				return rateLimited(c, "from this address", d)
			}
			return next(c)
		}
	}
}

// IPExtractor is how the client address is found: the connection's peer, unless that peer is
// one of trusted (proxies), in which case X-Forwarded-For is walked from the right, skipping
// trusted hops. X-Real-IP is never read, and loopback, link-local or private peers are not
// trusted unless listed.
func IPExtractor(trusted []*net.IPNet) echo.IPExtractor {
	if len(trusted) == 0 {
		return echo.ExtractIPDirect()
	}
	opts := []echo.TrustOption{echo.TrustLoopback(false), echo.TrustLinkLocal(false), echo.TrustPrivateNet(false)}
	for _, n := range trusted {
		opts = append(opts, echo.TrustIPRange(n))
	}
	return echo.ExtractIPFromXFFHeader(opts...)
}

// ParseTrustedProxies reads a comma-separated list of IPs and CIDR ranges.
func ParseTrustedProxies(v string) ([]*net.IPNet, error) {
	var out []*net.IPNet
	for _, f := range strings.Split(v, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		if !strings.Contains(f, "/") {
			ip := net.ParseIP(f)
			if ip == nil {
				return nil, fmt.Errorf("%q is neither an IP address nor a CIDR range", f)
			}
			bits := 128
			if ip.To4() != nil {
				ip, bits = ip.To4(), 32
			}
			out = append(out, &net.IPNet{IP: ip, Mask: net.CIDRMask(bits, bits)})
			continue
		}
		_, n, err := net.ParseCIDR(f)
		if err != nil {
			return nil, fmt.Errorf("%q is neither an IP address nor a CIDR range", f)
		}
		out = append(out, n)
	}
	return out, nil
}
