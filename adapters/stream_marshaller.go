package adapters

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"

	"github.com/ThreeDotsLabs/watermill-redisstream/pkg/redisstream"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/google/uuid"

	"github.com/checkins/checkins/app/projection"
	"github.com/checkins/checkins/domain"
)

// Stream entry layout written by FlatMarshaller:
//
//	_watermill_message_uuid  the Watermill message UUID
//	type, checkinId, ...     the event's own flat fields, readable with plain XRANGE
//	meta:<key>               Watermill metadata (correlation_id, ...)
const (
	MetaFieldPrefix = "meta:"
	// MetaDecodeError is set on a message whose entry could not be decoded; the projection
	// machinery parks such messages in the poison queue instead of ending the subscription.
	MetaDecodeError = "decode_error"
)

// FlatMarshaller writes a message whose payload is a flat JSON object of strings (an event's
// Fields) as one stream field per key, so `redis-cli XRANGE` shows the event as it is. Its
// Unmarshal never fails: one bad entry must not end a subscription (stock watermill-redisstream
// stops consuming on an unmarshal error), so a bad entry comes out flagged with MetaDecodeError.
type FlatMarshaller struct{}

var _ redisstream.MarshallerUnmarshaller = FlatMarshaller{}

// Marshal implements redisstream.Marshaller.
func (FlatMarshaller) Marshal(_ string, msg *message.Message) (map[string]any, error) {
	values := make(map[string]any, 10+len(msg.Metadata))
	// One copy of the payload: the keys and values are slices of it, not a string each.
	ok := eachFlatField(string(msg.Payload), func(k, v string) { values[k] = v })
	if !ok {
		var fields map[string]string
		if err := json.Unmarshal(msg.Payload, &fields); err != nil {
			return nil, fmt.Errorf("flat marshaller: payload of message %s must be a JSON object of strings: %w", msg.UUID, err)
		}
		if fields == nil { // JSON null decodes without error
			return nil, fmt.Errorf("flat marshaller: payload of message %s must be a JSON object of strings, got null", msg.UUID)
		}
		clear(values)
		for k, v := range fields {
			values[k] = v
		}
	}
	for k := range values {
		if k == redisstream.UUIDHeaderKey || strings.HasPrefix(k, MetaFieldPrefix) {
			return nil, fmt.Errorf("flat marshaller: payload field %q of message %s is reserved", k, msg.UUID)
		}
	}
	for k, v := range msg.Metadata {
		if !strings.HasPrefix(k, "_") { // a subscriber's, of the process that read it
			values[MetaFieldPrefix+k] = v
		}
	}
	values[redisstream.UUIDHeaderKey] = msg.UUID
	return values, nil
}

// Unmarshal implements redisstream.Unmarshaller.
func (FlatMarshaller) Unmarshal(values map[string]any) (*message.Message, error) {
	// The payload is written straight as a JSON object: this runs once per entry and projection,
	// and an intermediate map plus encoding/json was a large share of the projectors' CPU.
	// Keys are sorted so the same entry always gives the same payload.
	md := message.Metadata{}
	var id string
	var problems []string
	fieldKeys := make([]string, 0, len(values))
	for k, v := range values {
		s, ok := v.(string)
		if !ok {
			problems = append(problems, fmt.Sprintf("field %q is not a string", k))
			continue
		}
		switch {
		case k == redisstream.UUIDHeaderKey:
			id = s
		case strings.HasPrefix(k, MetaFieldPrefix+"_"):
			// "_" keys are the subscribers' own (the entry ID, the stream, what is queued
			// behind): an entry anyone can XADD must not set them.
		case strings.HasPrefix(k, MetaFieldPrefix):
			md[strings.TrimPrefix(k, MetaFieldPrefix)] = s
		default:
			fieldKeys = append(fieldKeys, k)
		}
	}
	slices.Sort(fieldKeys)
	payload := appendFlatObject(make([]byte, 0, 256), fieldKeys, func(k string) string { return values[k].(string) })
	if id == "" {
		// Entries written by hand (redis-cli XADD) have no UUID; they are still events if their
		// fields are valid, and the checkinId, not the UUID, is what projections dedupe on.
		id = uuid.NewString()
	}
	msg := message.NewMessage(id, payload)
	msg.Metadata = md
	if len(problems) > 0 {
		sort.Strings(problems)
		msg.Metadata.Set(MetaDecodeError, strings.Join(problems, "; "))
	}
	return msg, nil
}

// appendFlatObject appends the JSON object of keys (in that order) and their values.
func appendFlatObject(dst []byte, keys []string, value func(string) string) []byte {
	dst = append(dst, '{')
	for i, k := range keys {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = appendJSONString(dst, k)
		dst = append(dst, ':')
		dst = appendJSONString(dst, value(k))
	}
	return append(dst, '}')
}

// appendJSONString appends s as a JSON string: as is when it needs no escaping (the usual case:
// printable ASCII), through encoding/json otherwise.
func appendJSONString(dst []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c == '"' || c == '\\' || c >= 0x80 {
			b, _ := json.Marshal(s) // a string always encodes
			return append(dst, b...)
		}
	}
	dst = append(dst, '"')
	dst = append(dst, s...)
	return append(dst, '"')
}

// DecodeFields returns the flat event fields carried by a message from FlatMarshaller.
func DecodeFields(msg *message.Message) (map[string]string, error) {
	return decodeFieldsInto(msg, nil)
}

// decodeFieldsInto is DecodeFields filling into (cleared first) when it is not nil, so a batch
// decodes every entry into one map.
func decodeFieldsInto(msg *message.Message, into map[string]string) (map[string]string, error) {
	if reason := msg.Metadata.Get(MetaDecodeError); reason != "" {
		return nil, fmt.Errorf("undecodable stream entry: %s", reason)
	}
	if fields, ok := parseFlatObject(msg.Payload, into); ok {
		return fields, nil
	}
	var fields map[string]string
	if err := json.Unmarshal(msg.Payload, &fields); err != nil {
		return nil, fmt.Errorf("undecodable stream entry: payload is not a flat JSON object of strings: %w", err)
	}
	return fields, nil
}

// parseFlatObject is the fast path for what FlatMarshaller.Unmarshal produces: a JSON object of
// plain strings without escapes. Reflection-based decoding was the largest cost per event in the
// projectors' profile; anything unusual falls back to encoding/json (ok == false).
func parseFlatObject(b []byte, out map[string]string) (map[string]string, bool) {
	if out == nil {
		out = make(map[string]string, 10)
	} else {
		clear(out)
	}
	if !eachFlatField(string(b), func(k, v string) { out[k] = v }) {
		return nil, false
	}
	return out, true
}

// eachFlatField calls set for each key and value of b, a JSON object of plain strings without
// escapes, and reports whether b was one (set may have been called before a false). A key that
// comes twice is set twice, the last value winning, as encoding/json decides. Keys and values
// are substrings of b: no allocation per field.
func eachFlatField(b string, set func(k, v string)) bool {
	if len(b) < 2 || b[0] != '{' || b[len(b)-1] != '}' {
		return false
	}
	i, n := 1, len(b)-1
	str := func() (string, bool) {
		if i >= n || b[i] != '"' {
			return "", false
		}
		start := i + 1
		for j := start; j < n; j++ {
			switch c := b[j]; {
			case c == '"':
				i = j + 1
				return b[start:j], true
			case c == '\\' || c < 0x20:
				return "", false
			}
		}
		return "", false
	}
	if i == n {
		return true
	}
	for {
		k, ok := str()
		if !ok || i >= n || b[i] != ':' {
			return false
		}
		i++
		v, ok := str()
		if !ok {
			return false
		}
		set(k, v)
		if i == n {
			return true
		}
		if b[i] != ',' {
			return false
		}
		i++
	}
}

// Metadata the batched subscriber (adapters/batchsub) puts on every message; the same values as
// its constants, repeated here so ports need not depend on which subscriber runs.
const (
	MetaStream  = "_stream"
	MetaEntryID = "_entry_id"
)

// DecodeEntries decodes a batch of messages from FlatMarshaller (read by either subscriber)
// into out[i], once for every projection and attempt: the entry ID the subscriber put in the
// metadata, and the event, or why the entry is not one.
func (FlatMarshaller) DecodeEntries(msgs []*message.Message, out []projection.Entry) {
	// One map for the batch: domain.ParseEvent keeps none of it (the strings it keeps are the
	// payload's).
	into := make(map[string]string, 10)
	for i, m := range msgs {
		d := &out[i]
		d.ID, d.Stream = m.Metadata.Get(MetaEntryID), m.Metadata.Get(MetaStream)
		fields, err := decodeFieldsInto(m, into)
		if err != nil {
			d.Err = err
			continue
		}
		d.Event, d.Err = domain.ParseEvent(d.ID, fields)
	}
}

// messageFields rebuilds the stream entry's fields from the message (a fallback when the entry
// cannot be read back), including the raw fields of an entry that could not be decoded.
func messageFields(msg *message.Message) map[string]string {
	out := map[string]string{}
	raw := false
	for k, v := range msg.Metadata {
		if rest, ok := strings.CutPrefix(k, "_raw."); ok {
			out[rest] = v
			raw = true
		}
	}
	if raw {
		return out
	}
	if fields, err := DecodeFields(msg); err == nil {
		maps.Copy(out, fields)
	} else {
		out["payload"] = string(msg.Payload)
	}
	for k, v := range msg.Metadata {
		if strings.HasPrefix(k, "_") || k == MetaDecodeError {
			continue
		}
		out[MetaFieldPrefix+k] = v
	}
	out[redisstream.UUIDHeaderKey] = msg.UUID
	return out
}
