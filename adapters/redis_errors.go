package adapters

import (
	"errors"
	"io"
	"net"
	"strings"
	"syscall"

	"github.com/redis/go-redis/v9"

	"github.com/checkins/checkins/domain"
)

// Redis failures that say nothing about the event or the request at hand: the server cannot
// do anything right now, and will again. They are retried for as long as they last and never
// make an event "poisoned". Everything else Redis answers (a wrong type, a script error, a
// syntax error) comes from what was asked.
var transientPrefixes = []struct{ prefix, reason string }{
	{"OOM", "redis out of memory"},
	{"BUSY", "redis busy running a script"},
	{"LOADING", "redis loading its data"},
	{"NOSCRIPT", "redis lost its scripts"},
	{"READONLY", "redis is a read-only replica (failover)"},
	{"MASTERDOWN", "redis master down"},
	{"CLUSTERDOWN", "redis cluster down"},
	{"TRYAGAIN", "redis cluster moving keys"},
	// A redirection go-redis gave up following (it follows a few): the slot moved, or is moving.
	{"MOVED", "redis cluster moving keys"},
	{"ASK", "redis cluster moving keys"},
	{"MISCONF", "redis cannot persist to disk"},
	{"NOREPLICAS", "redis has too few replicas"},
}

// TransientReason classifies err: ok is true for a Redis failure that will pass (unreachable,
// restarting, out of memory, busy, failing over), with a short reason for logs, metrics and
// readiness ("redis out of memory"). It is the one place that knows Redis's error replies.
func TransientReason(err error) (reason string, ok bool) {
	if err == nil {
		return "", false
	}
	for _, p := range transientPrefixes {
		if hasErrorCode(err, p.prefix) {
			return p.reason, true
		}
	}
	// Written, but not yet on as many replicas as required (RequireReplicas): they catch up, or
	// one takes over from its master.
	if errors.Is(err, domain.ErrNotReplicated) {
		return "redis replicas behind", true
	}
	// A script that failed because of a command inside it reports that command's error after
	// its own prefix ("ERR Error running script ... OOM ..."); older servers do this.
	var rErr redis.Error
	if errors.As(err, &rErr) {
		msg := rErr.Error()
		for _, p := range transientPrefixes {
			if strings.Contains(msg, " "+p.prefix+" ") || strings.HasSuffix(msg, " "+p.prefix) {
				return p.reason, true
			}
		}
		return "", false
	}
	var ne net.Error
	if errors.As(err, &ne) {
		if ne.Timeout() {
			return "redis did not answer in time", true
		}
		return "redis unreachable", true
	}
	for _, target := range []error{io.EOF, io.ErrUnexpectedEOF, syscall.ECONNREFUSED, syscall.ECONNRESET, syscall.EPIPE} {
		if errors.Is(err, target) {
			return "redis unreachable", true
		}
	}
	// A closed client or pipeline means the process is stopping: not the event's fault either.
	for _, target := range []error{redis.ErrClosed, redis.ErrPoolTimeout, ErrPipelineClosed} {
		if errors.Is(err, target) {
			return "redis connection closed", true
		}
	}
	msg := err.Error()
	for _, s := range []string{"connection refused", "broken pipe", "connection reset", "i/o timeout"} {
		if strings.Contains(msg, s) {
			return "redis unreachable", true
		}
	}
	return "", false
}

// IsTransient reports whether err is a Redis failure that will pass (see TransientReason).
func IsTransient(err error) bool {
	_, ok := TransientReason(err)
	return ok
}

// RedisErrors classifies Redis failures for the app (ops.Failures).
type RedisErrors struct{}

// TransientReason implements ops.Failures.
func (RedisErrors) TransientReason(err error) (string, bool) { return TransientReason(err) }

// hasErrorCode says whether err is Redis's reply with that error code: its first word, so that
// BUSY (a script running) is not BUSYGROUP or BUSYKEY, which are answers about what was asked.
func hasErrorCode(err error, code string) bool {
	var rErr redis.Error
	if !errors.As(err, &rErr) {
		return false
	}
	msg := strings.TrimPrefix(rErr.Error(), "ERR ") // as redis.HasErrorPrefix (KVRocks adds it)
	return msg == code || strings.HasPrefix(msg, code+" ")
}
