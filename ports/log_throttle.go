package ports

import (
	"log/slog"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
)

// Logging that stays readable during an outage: a repeating condition is one line per interval.

// throttledLog logs a repeating condition at most once per interval, with how often it happened.
type throttledLog struct {
	mu         sync.Mutex
	interval   time.Duration
	last       time.Time
	suppressed int
}

func (t *throttledLog) allow() (bool, int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if time.Since(t.last) < t.interval {
		t.suppressed++
		return false, 0
	}
	n := t.suppressed
	t.last, t.suppressed = time.Now(), 0
	return true, n
}

// quietHandlerErrors keeps Watermill's router from logging every nack at error level ("Handler
// returned error"): the poison middleware logs the failures that matter itself, once per
// interval for a Redis outage, where the router would log every attempt of every message.
type quietHandlerErrors struct{ watermill.LoggerAdapter }

func (q quietHandlerErrors) Error(msg string, err error, fields watermill.LogFields) {
	if msg == "Handler returned error" {
		q.LoggerAdapter.Debug(msg, fields.Add(watermill.LogFields{"error": err}))
		return
	}
	q.LoggerAdapter.Error(msg, err, fields)
}

func (q quietHandlerErrors) With(fields watermill.LogFields) watermill.LoggerAdapter {
	return quietHandlerErrors{q.LoggerAdapter.With(fields)}
}

func newRouterLogger(l *slog.Logger) watermill.LoggerAdapter {
	return quietHandlerErrors{NewWatermillLogger(l)}
}

// throttledErrorLogger logs each distinct error message at most once per interval, with how many
// were suppressed. The stock watermill-redisstream subscriber logs every failed read (twice a
// second per consumer group) while Redis is down; an outage should be one line per interval.
type throttledErrorLogger struct {
	watermill.LoggerAdapter
	interval time.Duration
	mu       *sync.Mutex
	byMsg    map[string]*throttledLog
}

// NewThrottledErrorLogger wraps l so that repeated errors are logged once per interval.
func NewThrottledErrorLogger(l watermill.LoggerAdapter, interval time.Duration) watermill.LoggerAdapter {
	return throttledErrorLogger{LoggerAdapter: l, interval: interval, mu: &sync.Mutex{}, byMsg: map[string]*throttledLog{}}
}

func (t throttledErrorLogger) Error(msg string, err error, fields watermill.LogFields) {
	t.mu.Lock()
	tl, ok := t.byMsg[msg]
	if !ok {
		tl = &throttledLog{interval: t.interval}
		t.byMsg[msg] = tl
	}
	t.mu.Unlock()
	if ok, n := tl.allow(); ok {
		t.LoggerAdapter.Error(msg, err, fields.Add(watermill.LogFields{"suppressed": n}))
	}
}

func (t throttledErrorLogger) With(fields watermill.LogFields) watermill.LoggerAdapter {
	return throttledErrorLogger{LoggerAdapter: t.LoggerAdapter.With(fields), interval: t.interval, mu: t.mu, byMsg: t.byMsg}
}
