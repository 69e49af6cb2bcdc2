package adapters

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill-redisstream/pkg/redisstream"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"
)

// StreamInfo is what Redis says about the event stream and its consumer groups.
type StreamInfo struct {
	Stream      string
	Exists      bool
	Length      int64
	LastEntryID string
	Groups      []GroupInfo
}

// GroupInfo is one consumer group (XINFO GROUPS, XINFO CONSUMERS, XPENDING).
type GroupInfo struct {
	Name            string
	LastDeliveredID string
	EntriesRead     int64
	// Lag is the number of entries not yet delivered to the group; -1 when Redis cannot tell
	// (entries were deleted from the middle of the stream) or is older than 7.0.
	Lag       int64
	Pending   int64
	Consumers []ConsumerInfo
	// Oldest pending entry: its ID, how long since it was last delivered, delivery count and
	// owner. Zero when nothing is pending.
	OldestPendingID         string
	OldestPendingIdle       time.Duration
	OldestPendingDeliveries int64
	OldestPendingConsumer   string
}

// ConsumerInfo is one consumer of a group.
type ConsumerInfo struct {
	Name    string
	Pending int64
	Idle    time.Duration // since its last attempted interaction (read or claim)
}

// ReadStreamInfo reads the stream's length and every group's state. A missing stream is not an
// error: Exists is false.
func ReadStreamInfo(ctx context.Context, client redis.UniversalClient, stream string) (StreamInfo, error) {
	info := StreamInfo{Stream: stream}
	xs, err := client.XInfoStream(ctx, stream).Result()
	if isNoSuchKey(err) {
		return info, nil
	}
	if err != nil {
		return info, fmt.Errorf("XINFO STREAM %s: %w", stream, err)
	}
	info.Exists, info.Length, info.LastEntryID = true, xs.Length, xs.LastGeneratedID
	groups, err := client.XInfoGroups(ctx, stream).Result()
	if err != nil {
		return info, fmt.Errorf("XINFO GROUPS %s: %w", stream, err)
	}
	for _, g := range groups {
		gi := GroupInfo{Name: g.Name, LastDeliveredID: g.LastDeliveredID, EntriesRead: g.EntriesRead, Lag: g.Lag, Pending: g.Pending}
		if g.LastDeliveredID == xs.LastGeneratedID {
			// Delivered up to the last entry: no lag, whatever the server says. miniredis (the
			// embedded Redis of `serve`) reports the stream length as every group's lag, which
			// would make an idle service look stalled.
			gi.Lag = 0
		}
		cs, err := client.XInfoConsumers(ctx, stream, g.Name).Result()
		if err != nil {
			return info, fmt.Errorf("XINFO CONSUMERS %s %s: %w", stream, g.Name, err)
		}
		for _, c := range cs {
			gi.Consumers = append(gi.Consumers, ConsumerInfo{Name: c.Name, Pending: c.Pending, Idle: c.Idle})
		}
		if g.Pending > 0 {
			// The summary gives the lowest pending ID; the extended form gives its idle time.
			sum, err := client.XPending(ctx, stream, g.Name).Result()
			if err != nil {
				return info, fmt.Errorf("XPENDING %s %s: %w", stream, g.Name, err)
			}
			gi.Pending = sum.Count
			if sum.Count > 0 {
				ext, err := client.XPendingExt(ctx, &redis.XPendingExtArgs{Stream: stream, Group: g.Name, Start: sum.Lower, End: sum.Lower, Count: 1}).Result()
				if err != nil {
					return info, fmt.Errorf("XPENDING %s %s %s: %w", stream, g.Name, sum.Lower, err)
				}
				gi.OldestPendingID = sum.Lower
				if len(ext) == 1 {
					gi.OldestPendingIdle, gi.OldestPendingDeliveries, gi.OldestPendingConsumer = ext[0].Idle, ext[0].RetryCount, ext[0].Consumer
				}
			}
		}
		info.Groups = append(info.Groups, gi)
	}
	return info, nil
}

// EntryTime is the time encoded in a stream entry ID (when the entry was added).
func EntryTime(id string) (time.Time, bool) {
	ms, _, ok := strings.Cut(id, "-")
	n, err := strconv.ParseInt(ms, 10, 64)
	if !ok || err != nil {
		return time.Time{}, false
	}
	return time.UnixMilli(n).UTC(), true
}

// EntryFields reads one stream entry's fields exactly as they were written.
func EntryFields(ctx context.Context, client redis.UniversalClient, stream, id string) (map[string]string, error) {
	xs, err := client.XRangeN(ctx, stream, id, id, 1).Result()
	if err != nil {
		return nil, fmt.Errorf("read entry %s of %s: %w", id, stream, err)
	}
	if len(xs) == 0 {
		return nil, fmt.Errorf("entry %s of %s is not in the stream", id, stream)
	}
	return stringFields(xs[0].Values), nil
}

// matchEntry reads the entries ids of stream and returns the ID of the first one match accepts
// ("" when none does).
func matchEntry(ctx context.Context, client redis.UniversalClient, stream string, ids []string, match func(values map[string]any) bool) (string, error) {
	cmds, err := client.Pipelined(ctx, func(p redis.Pipeliner) error {
		for _, id := range ids {
			p.XRangeN(ctx, stream, id, id, 1)
		}
		return nil
	})
	if err != nil {
		return "", fmt.Errorf("read pending entries of %s: %w", stream, err)
	}
	for _, c := range cmds {
		xs, _ := c.(*redis.XMessageSliceCmd).Result()
		if len(xs) == 1 && match(xs[0].Values) {
			return xs[0].ID, nil
		}
	}
	return "", nil
}

func stringFields(values map[string]any) map[string]string {
	out := make(map[string]string, len(values))
	for k, v := range values {
		out[k] = fmt.Sprint(v)
	}
	return out
}

func isNoSuchKey(err error) bool {
	return err != nil && !errors.Is(err, redis.Nil) && strings.Contains(err.Error(), "no such key")
}

// SameMessage reports whether a stream entry's values decode (with u) to msg: the same Watermill
// UUID when the entry has one, and the same payload and metadata.
func SameMessage(msg *message.Message, values map[string]any, u redisstream.Unmarshaller) bool {
	if id, ok := values[redisstream.UUIDHeaderKey].(string); ok && id != msg.UUID {
		return false
	}
	m, err := u.Unmarshal(values)
	if err != nil || !bytes.Equal(m.Payload, msg.Payload) {
		return false
	}
	for k, v := range m.Metadata {
		if msg.Metadata.Get(k) != v {
			return false
		}
	}
	return true
}
