package ports

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/checkins/checkins/adapters"
)

// RetentionPolicy bounds the event stream. The zero policy keeps everything: the stream is the
// system of record and is never trimmed unless asked.
type RetentionPolicy struct {
	MaxEntries int64         // keep about this many newest entries (0: no bound)
	MaxAge     time.Duration // drop entries recorded longer ago than this (0: no bound)
}

// Enabled reports whether the policy trims at all.
func (p RetentionPolicy) Enabled() bool { return p.MaxEntries > 0 || p.MaxAge > 0 }

func (p RetentionPolicy) String() string {
	switch {
	case p.MaxEntries > 0:
		return strconv.FormatInt(p.MaxEntries, 10) + " entries"
	case p.MaxAge > 0:
		return p.MaxAge.String()
	default:
		return "off"
	}
}

// ParseRetention reads "off", a number of entries ("1000000") or an age ("720h", "30d").
func ParseRetention(s string) (RetentionPolicy, error) {
	s = strings.TrimSpace(s)
	if s == "" || s == "off" {
		return RetentionPolicy{}, nil
	}
	if n, err := strconv.ParseInt(s, 10, 64); err == nil {
		if n < 1 {
			return RetentionPolicy{}, fmt.Errorf("a number of entries must be >= 1, got %d", n)
		}
		return RetentionPolicy{MaxEntries: n}, nil
	}
	if days, ok := strings.CutSuffix(s, "d"); ok {
		if n, err := strconv.Atoi(days); err == nil && n >= 1 {
			return RetentionPolicy{MaxAge: time.Duration(n) * 24 * time.Hour}, nil
		}
	}
	if d, err := time.ParseDuration(s); err == nil {
		if d < time.Second {
			return RetentionPolicy{}, fmt.Errorf("an age must be at least 1s, got %s", d)
		}
		return RetentionPolicy{MaxAge: d}, nil
	}
	return RetentionPolicy{}, fmt.Errorf("must be off, a number of entries (1000000) or an age (720h, 30d), got %q", s)
}

// StreamTrimmer applies a RetentionPolicy without ever removing an entry a consumer group still
// needs: it trims (XTRIM MINID) only below every group's oldest pending entry and every group's
// last-delivered ID, whatever the policy asks. A group that stopped consuming therefore holds
// the stream at its position: that is on purpose, the stall shows in status and metrics.
type StreamTrimmer struct {
	client redis.UniversalClient
	keys   adapters.KeySpace
	policy RetentionPolicy
	log    *slog.Logger
	now    func() time.Time
}

// NewStreamTrimmer trims keys.Stream() by policy.
func NewStreamTrimmer(client redis.UniversalClient, keys adapters.KeySpace, policy RetentionPolicy, log *slog.Logger) (*StreamTrimmer, error) {
	if client == nil || log == nil {
		return nil, errors.New("ports: StreamTrimmer needs Redis and a Logger")
	}
	return &StreamTrimmer{client: client, keys: keys, policy: policy, log: log, now: time.Now}, nil
}

// maxTrimPerRound bounds how many entries one MaxEntries round looks up and removes, so a first
// run on a huge stream does not block Redis; later rounds continue.
const maxTrimPerRound = 10000

// TrimResult is what one round did.
type TrimResult struct {
	Trimmed int64  `json:"trimmed"`
	MinID   string `json:"minId,omitempty"` // entries below this were removed
	// Floor is the lowest ID some group still needs: nothing at or above it is ever removed.
	Floor string `json:"floor,omitempty"`
}

// TrimOnce runs one round.
func (t *StreamTrimmer) TrimOnce(ctx context.Context) (TrimResult, error) {
	var res TrimResult
	if !t.policy.Enabled() {
		return res, nil
	}
	stream := t.keys.Stream()
	info, err := adapters.ReadStreamInfo(ctx, t.client, stream)
	if err != nil || !info.Exists {
		return res, err
	}
	if len(info.Groups) == 0 {
		// Nobody has consumed anything: trimming would lose events no projection ever saw.
		return res, nil
	}
	var floor streamID
	for i, g := range info.Groups {
		need, err := parseStreamID(g.LastDeliveredID)
		if err != nil {
			return res, err
		}
		need = need.next()
		if g.Pending > 0 && g.OldestPendingID != "" {
			p, err := parseStreamID(g.OldestPendingID)
			if err != nil {
				return res, err
			}
			need = minID(need, p)
		}
		if i == 0 {
			floor = need
		} else {
			floor = minID(floor, need)
		}
	}
	res.Floor = floor.String()
	var want streamID
	switch {
	case t.policy.MaxEntries > 0:
		excess := info.Length - t.policy.MaxEntries
		if excess <= 0 {
			return res, nil
		}
		xs, err := t.client.XRangeN(ctx, stream, "-", "+", min(excess, maxTrimPerRound)).Result()
		if err != nil || len(xs) == 0 {
			return res, err
		}
		last, err := parseStreamID(xs[len(xs)-1].ID)
		if err != nil {
			return res, err
		}
		want = last.next()
	default:
		want = streamID{ms: uint64(max(t.now().Add(-t.policy.MaxAge).UnixMilli(), 0))}
	}
	cut := minID(want, floor)
	res.MinID = cut.String()
	n, err := t.client.XTrimMinID(ctx, stream, res.MinID).Result()
	if err != nil {
		return res, fmt.Errorf("XTRIM %s MINID %s: %w", stream, res.MinID, err)
	}
	res.Trimmed = n
	return res, nil
}

// Run trims every interval until ctx ends.
func (t *StreamTrimmer) Run(ctx context.Context, interval time.Duration) error {
	if !t.policy.Enabled() {
		return nil
	}
	t.log.Info("stream retention on", "stream", t.keys.Stream(), "retention", t.policy.String(), "interval", interval.String())
	tick := time.NewTicker(interval)
	defer tick.Stop()
	failing := &throttledLog{interval: 10 * time.Minute}
	for {
		res, err := t.TrimOnce(ctx)
		switch {
		case err != nil && ctx.Err() == nil:
			if ok, n := failing.allow(); ok {
				t.log.Warn("stream trim failed, will retry", "error", err, "suppressed", n)
			}
		case res.Trimmed > 0:
			t.log.Info("stream trimmed", "stream", t.keys.Stream(), "removed", res.Trimmed, "min_id", res.MinID, "floor", res.Floor)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
	}
}

// streamID is a parsed stream entry ID, ordered like Redis orders them.
type streamID struct{ ms, seq uint64 }

func parseStreamID(s string) (streamID, error) {
	ms, seq, ok := strings.Cut(s, "-")
	a, err1 := strconv.ParseUint(ms, 10, 64)
	b, err2 := strconv.ParseUint(seq, 10, 64)
	if !ok || err1 != nil || err2 != nil {
		return streamID{}, fmt.Errorf("not a stream entry ID: %q", s)
	}
	return streamID{a, b}, nil
}

func (id streamID) String() string {
	return strconv.FormatUint(id.ms, 10) + "-" + strconv.FormatUint(id.seq, 10)
}

func (id streamID) next() streamID {
	if id.seq == ^uint64(0) {
		return streamID{id.ms + 1, 0}
	}
	return streamID{id.ms, id.seq + 1}
}

func minID(a, b streamID) streamID {
	if a.ms < b.ms || a.ms == b.ms && a.seq < b.seq {
		return a
	}
	return b
}
