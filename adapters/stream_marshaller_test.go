package adapters_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/ThreeDotsLabs/watermill-redisstream/pkg/redisstream"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/checkins/checkins/adapters"
	"github.com/checkins/checkins/app/projection"
	"github.com/checkins/checkins/domain"
)

func sampleFields() map[string]string {
	return recorded("ck-9", 42, 7, 5, 1_700_000_000_000).Fields()
}

func TestFlatMarshallerWritesReadableEntries(t *testing.T) {
	t.Parallel()
	env := newProjEnv(t)
	ctx := context.Background()
	msg, err := adapters.NewEventMessage(sampleFields(), "corr-1")
	require.NoError(t, err)
	values, err := adapters.FlatMarshaller{}.Marshal("ignored", msg)
	require.NoError(t, err)

	stream := env.keys.Stream()
	require.NoError(t, env.client.XAdd(ctx, &redis.XAddArgs{Stream: stream, Values: values}).Err())
	xs, err := env.client.XRange(ctx, stream, "-", "+").Result()
	require.NoError(t, err)
	require.Len(t, xs, 1)
	// What `redis-cli XRANGE` shows: the event's own fields as plain strings, no blob.
	want := map[string]any{
		"type": "checkin.recorded.v1", "checkinId": "ck-9", "userId": "42", "locationId": "7",
		"starRating": "5", "timestamp": "1700000000000", "recordedAt": "1700000000000",
		"meta:correlation_id":     "corr-1",
		redisstream.UUIDHeaderKey: msg.UUID,
	}
	assert.Equal(t, want, xs[0].Values)

	got, err := adapters.FlatMarshaller{}.Unmarshal(xs[0].Values)
	require.NoError(t, err)
	assert.Equal(t, msg.UUID, got.UUID)
	assert.Equal(t, "corr-1", got.Metadata.Get(adapters.MetaCorrelationID))
	assert.Empty(t, got.Metadata.Get(adapters.MetaDecodeError))
	fields, err := adapters.DecodeFields(got)
	require.NoError(t, err)
	assert.Equal(t, sampleFields(), fields)
	ev, err := domain.ParseEvent(got.Metadata.Get(adapters.MetaEntryID), fields)
	require.NoError(t, err)
	assert.Equal(t, recorded("ck-9", 42, 7, 5, 1_700_000_000_000), ev)
}

func TestFlatMarshallerRoundTripMetadata(t *testing.T) {
	t.Parallel()
	msg := message.NewMessage("uuid-1", mustJSON(t, map[string]string{"a": "1", "b": ""}))
	msg.Metadata.Set("correlation_id", "c-1")
	msg.Metadata.Set("other", "x y")
	values, err := adapters.FlatMarshaller{}.Marshal("topic", msg)
	require.NoError(t, err)
	got, err := adapters.FlatMarshaller{}.Unmarshal(values)
	require.NoError(t, err)
	assert.Equal(t, "uuid-1", got.UUID)
	assert.Equal(t, message.Metadata{"correlation_id": "c-1", "other": "x y"}, got.Metadata)
	assert.JSONEq(t, `{"a":"1","b":""}`, string(got.Payload))
}

func TestFlatMarshallerUnmarshalWithoutUUID(t *testing.T) {
	t.Parallel()
	// What `redis-cli XADD stream * type ... userId 42 ...` writes: no Watermill UUID. Stock
	// Watermill ends the subscription on this; ours must not fail.
	values := map[string]any{}
	for k, v := range sampleFields() {
		values[k] = v
	}
	msg, err := adapters.FlatMarshaller{}.Unmarshal(values)
	require.NoError(t, err)
	assert.NotEmpty(t, msg.UUID)
	fields, err := adapters.DecodeFields(msg)
	require.NoError(t, err)
	assert.Equal(t, sampleFields(), fields)

	other, err := adapters.FlatMarshaller{}.Unmarshal(values)
	require.NoError(t, err)
	assert.NotEqual(t, msg.UUID, other.UUID, "each entry gets its own UUID")
}

func TestFlatMarshallerUnmarshalFlagsUndecodable(t *testing.T) {
	t.Parallel()
	msg, err := adapters.FlatMarshaller{}.Unmarshal(map[string]any{"type": "checkin.recorded.v1", "userId": 42})
	require.NoError(t, err, "a bad entry must not end a subscription")
	assert.Contains(t, msg.Metadata.Get(adapters.MetaDecodeError), `"userId"`)
	_, err = adapters.DecodeFields(msg)
	assert.ErrorContains(t, err, "userId")
}

func TestFlatMarshallerMarshalRejects(t *testing.T) {
	t.Parallel()
	tests := map[string]struct {
		payload string
		want    string
	}{
		"not JSON":              {`userId=42`, "JSON object of strings"},
		"JSON array":            {`["a","b"]`, "JSON object of strings"},
		"JSON string":           {`"a"`, "JSON object of strings"},
		"JSON null":             {`null`, "JSON object of strings"},
		"empty payload":         {``, "JSON object of strings"},
		"number value":          {`{"userId":42}`, "JSON object of strings"},
		"nested object":         {`{"a":{"b":"c"}}`, "JSON object of strings"},
		"reserved uuid field":   {`{"_watermill_message_uuid":"x"}`, "reserved"},
		"reserved meta: prefix": {`{"meta:correlation_id":"x"}`, "reserved"},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			msg := message.NewMessage("uuid-2", []byte(tt.payload))
			values, err := adapters.FlatMarshaller{}.Marshal("topic", msg)
			require.Error(t, err)
			assert.Nil(t, values)
			assert.Contains(t, err.Error(), tt.want)
			assert.Contains(t, err.Error(), "uuid-2", "the error names the message")
		})
	}
}

func mustJSON(t testing.TB, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	require.NoError(t, err)
	return b
}

// The same entry must always give the same payload: the poison queue finds a stock-subscriber
// message's entry by comparing payloads.
func TestFlatMarshallerUnmarshalIsDeterministic(t *testing.T) {
	t.Parallel()
	values := map[string]any{"type": "checkin.recorded.v1", "checkinId": "c1", "userId": "1", "locationId": "2",
		"starRating": "3", "timestamp": "4", "recordedAt": "5", "extra": "é\"x"}
	first, err := adapters.FlatMarshaller{}.Unmarshal(values)
	require.NoError(t, err)
	for range 50 {
		m, err := adapters.FlatMarshaller{}.Unmarshal(values)
		require.NoError(t, err)
		require.Equal(t, string(first.Payload), string(m.Payload))
	}
}

// TestCheckinRecordedMessage: the publisher's direct encoding is byte for byte what encoding/json
// writes for the event's Fields, with or without a fingerprint, escapes included.
func TestCheckinRecordedMessage(t *testing.T) {
	for _, e := range []domain.CheckinRecorded{
		{Checkin: domain.Checkin{ID: "c-1", UserID: 1, LocationID: 2, StarRating: 0, Timestamp: 3}, RecordedAt: 4},
		{Checkin: domain.Checkin{ID: "0b7c6a53-2f3e", UserID: 9223372036854775807, LocationID: 77, StarRating: 5,
			Timestamp: -1}, RecordedAt: 1700000000123, Fingerprint: "f3a9c2"},
		{Checkin: domain.Checkin{ID: `q"uo\te` + "\u00e9\n", UserID: 5, LocationID: 6, StarRating: 3, Timestamp: 7},
			RecordedAt: 8, Fingerprint: "x<y>&"},
	} {
		want, err := json.Marshal(e.Fields())
		require.NoError(t, err)
		msg := adapters.NewCheckinRecordedMessage(e, "corr-9")
		assert.JSONEq(t, string(want), string(msg.Payload))
		assert.Equal(t, string(stripHTMLEscapes(want)), string(msg.Payload), "keys in encoding/json's order")
		assert.Equal(t, "corr-9", msg.Metadata.Get(adapters.MetaCorrelationID))
		generic, err := adapters.NewEventMessage(e.Fields(), "corr-9")
		require.NoError(t, err)
		assert.Equal(t, string(generic.Payload), string(msg.Payload))
		values, err := adapters.FlatMarshaller{}.Marshal("events", msg)
		require.NoError(t, err)
		for k, v := range e.Fields() {
			assert.Equal(t, v, values[k], k)
		}
	}
}

// stripHTMLEscapes undoes encoding/json's \u003c, \u003e and \u0026 (valid JSON either way).
func stripHTMLEscapes(b []byte) []byte {
	return []byte(strings.NewReplacer(`\u003c`, "<", `\u003e`, ">", `\u0026`, "&").Replace(string(b)))
}

// TestDecodeEntriesDecodesEachEntryOnItsOwn: a batch decodes its entries into one map; nothing of
// an entry may carry over to the next (a fingerprint, part of the identity; a field the next one
// lacks), and an undecodable entry between them changes nothing for the others.
func TestDecodeEntriesDecodesEachEntryOnItsOwn(t *testing.T) {
	t.Parallel()
	withPrint := recorded("ck-1", 42, 7, 5, 1_700_000_000_000)
	withPrint.Fingerprint = "8329d18f837f649738b6af51691aa119"
	plain := recorded("ck-2", 43, 8, 1, 1_700_000_000_001)
	noUser := plain.Fields()
	delete(noUser, domain.FieldUserID)
	var msgs []*message.Message
	for _, f := range []map[string]string{withPrint.Fields(), noUser, plain.Fields(), withPrint.Fields()} {
		m, err := adapters.NewEventMessage(f, "")
		require.NoError(t, err)
		m.Metadata.Set(adapters.MetaEntryID, "1700000000000-0")
		msgs = append(msgs, m)
	}
	out := make([]projection.Entry, len(msgs))
	adapters.FlatMarshaller{}.DecodeEntries(msgs, out)
	require.NoError(t, out[0].Err)
	assert.Equal(t, withPrint, out[0].Event)
	assert.ErrorContains(t, out[1].Err, domain.FieldUserID, "the userId of the entry before must not fill in")
	require.NoError(t, out[2].Err)
	assert.Equal(t, plain, out[2].Event, "no fingerprint of an entry before")
	require.NoError(t, out[3].Err)
	assert.Equal(t, withPrint, out[3].Event)
}
