package command

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/checkins/checkins/app/ops"
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
		if n, err := strconv.Atoi(days); err == nil {
			// The most days a time.Duration holds: beyond, n days overflowed into any age at
			// all ("106752d" was off, "213504d" 25m26s).
			const maxDays = int(math.MaxInt64 / int64(24*time.Hour))
			if n < 1 || n > maxDays {
				return RetentionPolicy{}, fmt.Errorf("an age in days must be from 1 to %d, got %q", maxDays, s)
			}
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

// TrimStream applies a RetentionPolicy without ever removing an entry a consumer group still
// needs: it trims only below the trim floor (TrimFloor), whatever the policy asks. A group that
// stopped consuming therefore holds the stream at its position: that is on purpose, the stall
// shows in status and metrics.
type TrimStream struct {
	stream    ops.Stream
	policy    RetentionPolicy
	migration ops.Migration // nil: not asked
}

// WaitForMigrations makes TrimOnce refuse (domain.ErrMigrating) while a partition migration
// copies the stream.
func (t *TrimStream) WaitForMigrations(m ops.Migration) *TrimStream {
	t.migration = m
	return t
}

// NewTrimStream trims stream by policy. An age is measured by the clock of the Redis server
// holding the stream, which numbered its entries, not by this process's.
func NewTrimStream(stream ops.Stream, policy RetentionPolicy) (*TrimStream, error) {
	if stream == nil {
		return nil, errors.New("command: TrimStream needs a Stream")
	}
	return &TrimStream{stream: stream, policy: policy}, nil
}

// Policy is the policy it applies.
func (t *TrimStream) Policy() RetentionPolicy { return t.policy }

// Stream names the stream it trims.
func (t *TrimStream) Stream() string { return t.stream.Name() }

// MaxTrimPerRound bounds how many entries one MaxEntries round looks up and removes, so a first
// run on a huge stream does not block Redis; later rounds continue.
const MaxTrimPerRound = 10000

// TrimResult is what one round did.
type TrimResult struct {
	Trimmed int64  `json:"trimmed"`
	MinID   string `json:"minId,omitempty"` // entries below this were removed
	// Floor is the lowest ID some group still needs: nothing at or above it is ever removed.
	Floor string `json:"floor,omitempty"`
}

// TrimFloor is the lowest entry some consumer group still needs: the one after each group's
// last-delivered entry, or its oldest pending one if lower. ok is false without groups:
// nobody has consumed anything, and trimming would lose events no projection ever saw.
func TrimFloor(groups []ops.GroupInfo) (floor ops.EntryID, ok bool, err error) {
	for i, g := range groups {
		need, err := ops.ParseEntryID(g.LastDeliveredID)
		if err != nil {
			return floor, false, err
		}
		need = need.Next()
		if g.Pending > 0 && g.OldestPendingID != "" {
			p, err := ops.ParseEntryID(g.OldestPendingID)
			if err != nil {
				return floor, false, err
			}
			need = ops.MinEntryID(need, p)
		}
		if i == 0 {
			floor = need
		} else {
			floor = ops.MinEntryID(floor, need)
		}
	}
	return floor, len(groups) > 0, nil
}

// PartitionedStream is a stream split into partitions (adapters.StreamAdmin with P > 1): each
// is trimmed by itself, below its own groups' floor.
type PartitionedStream interface {
	Parts() []ops.Stream
}

// TrimOnce runs one round. A partitioned stream is trimmed partition by partition, each below
// its own floor (a partition nobody writes to does not hold the others back); MaxEntries is
// then shared out evenly (each partition keeps MaxEntries/P, rounded up). The result sums the
// partitions up: Trimmed in total, MinID the highest cut and Floor the lowest floor.
func (t *TrimStream) TrimOnce(ctx context.Context) (TrimResult, error) {
	if err := notMigrating(ctx, t.migration); err != nil {
		return TrimResult{}, err
	}
	ps, ok := t.stream.(PartitionedStream)
	if !ok || len(ps.Parts()) < 2 || !t.policy.Enabled() {
		return t.trimOne(ctx, t.stream, t.policy)
	}
	parts := ps.Parts()
	policy := t.policy
	if policy.MaxEntries > 0 {
		policy.MaxEntries = (policy.MaxEntries + int64(len(parts)) - 1) / int64(len(parts))
	}
	var sum TrimResult
	for _, p := range parts {
		res, err := t.trimOne(ctx, p, policy)
		sum.Trimmed += res.Trimmed
		if res.MinID != "" && (sum.MinID == "" || ops.CompareEntryIDs(res.MinID, sum.MinID) > 0) {
			sum.MinID = res.MinID
		}
		if res.Floor != "" && (sum.Floor == "" || ops.CompareEntryIDs(res.Floor, sum.Floor) < 0) {
			sum.Floor = res.Floor
		}
		if err != nil {
			return sum, err
		}
	}
	return sum, nil
}

func (t *TrimStream) trimOne(ctx context.Context, stream ops.Stream, policy RetentionPolicy) (TrimResult, error) {
	var res TrimResult
	if !policy.Enabled() {
		return res, nil
	}
	info, err := stream.Info(ctx)
	if err != nil || !info.Exists {
		return res, err
	}
	floor, ok, err := TrimFloor(info.Groups)
	if err != nil || !ok {
		return res, err
	}
	res.Floor = floor.String()
	var want ops.EntryID
	var maxAge time.Duration
	switch {
	case policy.MaxEntries > 0:
		excess := info.Length - policy.MaxEntries
		if excess <= 0 {
			return res, nil
		}
		ids, err := stream.OldestIDs(ctx, min(excess, MaxTrimPerRound))
		if err != nil || len(ids) == 0 {
			return res, err
		}
		last, err := ops.ParseEntryID(ids[len(ids)-1])
		if err != nil {
			return res, err
		}
		want = last.Next()
	default:
		// By Redis's clock, in the trim: it numbered the entries (the projector's may be ahead).
		want, maxAge = floor, policy.MaxAge
	}
	// The floor is checked again in the trim itself: a group created (at "0") since Info read
	// the groups holds the cut where it needs it.
	res.Trimmed, res.MinID, err = stream.TrimBelow(ctx, ops.MinEntryID(want, floor).String(), maxAge)
	return res, err
}
