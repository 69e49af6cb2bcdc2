package ports_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"slices"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/checkins/checkins/domain"
	"github.com/checkins/checkins/ports"
)

var exactFields = []string{"checkinId", "userId", "locationId", "starRating", "timestamp"}

// plainCheckin is the body as encoding/json alone reads it: case-insensitive keys, the last of
// duplicates, invalid UTF-8 replaced. The strict decoder must agree with it on every body it accepts.
type plainCheckin struct {
	CheckinID  *string `json:"checkinId"`
	UserID     *int64  `json:"userId"`
	LocationID *int64  `json:"locationId"`
	StarRating *int64  `json:"starRating"`
	Timestamp  *int64  `json:"timestamp"`
}

// plainDecode is the decoder before strict decoding: one object, known fields, nothing after it.
func plainDecode(body []byte) (plainCheckin, bool) {
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	var p plainCheckin
	if dec.Decode(&p) != nil {
		return p, false
	}
	_, err := dec.Token()
	return p, errors.Is(err, io.EOF)
}

// topLevelKeys lists the object's keys as a JSON reader sees them (escapes decoded), in order,
// duplicates kept; ok is false when body is not one JSON object. It walks with json.Decoder.Token,
// independently of the decoder under test.
func topLevelKeys(body []byte) (keys []string, ok bool) {
	dec := json.NewDecoder(bytes.NewReader(body))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return nil, false
	}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, false
		}
		keys = append(keys, tok.(string))
		var v json.RawMessage
		if dec.Decode(&v) != nil {
			return nil, false
		}
	}
	if _, err := dec.Token(); err != nil {
		return nil, false
	}
	return keys, true
}

// strictOK says whether a body is acceptable JSON for a check-in by the rules of strict decoding:
// valid UTF-8, one object whose keys are the fields spelled exactly, each at most once.
func strictOK(body []byte) bool {
	if !utf8.Valid(body) {
		return false
	}
	keys, ok := topLevelKeys(body)
	if !ok {
		return false
	}
	seen := map[string]bool{}
	for _, k := range keys {
		if !slices.Contains(exactFields, k) || seen[k] {
			return false
		}
		seen[k] = true
	}
	return true
}

// FuzzDecodeCheckinJSON: the decoder never panics; it accepts a body exactly when the body is
// valid UTF-8 with exact-case unique keys and plain encoding/json reads it as a check-in, and
// then with plain encoding/json's values; a body it rejects gets a 400 with a code and a message.
// Seeds: f.Add below and testdata/fuzz/FuzzDecodeCheckinJSON.
func FuzzDecodeCheckinJSON(f *testing.F) {
	for _, s := range []string{
		`{"userId": 42, "locationId": 7, "starRating": 4, "timestamp": 1609602085397, "checkinId": "c-0001"}`,
		`{"userId":1,"userId":2,"locationId":1,"starRating":1}`,
		`{"USERID":43,"locationId":1,"starRating":1}`,
		`{"userId":1,"locationId":1,"ſtarRating":1}`,
		`{"\u0075serId":1,"locationId":1,"starRating":1}`,
		"{\"userId\":1,\"locationId\":1,\"starRating\":1,\"checkinId\":\"a\xffb\"}",
		`{"userId":1,"locationId":1,"starRating":1} x`,
		`{"userId":{"a":[1,{"b":"}"}]},"locationId":1}`,
		`[{"userId":1}]`,
		``,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		in, err := ports.DecodeCheckinJSON(body)
		plain, plainOK := plainDecode(body)
		want := strictOK(body) && plainOK
		if err != nil {
			var ae *ports.APIError
			require.ErrorAs(t, err, &ae)
			assert.Equal(t, http.StatusBadRequest, ae.Status)
			assert.NotEmpty(t, ae.Code)
			assert.NotEmpty(t, ae.Message)
			require.False(t, want, "an acceptable body was rejected with %s: %s", ae.Code, ae.Message)
			return
		}
		require.True(t, want, "accepted a body that is not valid UTF-8 with exact, unique keys, or not a check-in: %q", body)
		assert.Equal(t, domain.CheckinInput{CheckinID: plain.CheckinID, UserID: plain.UserID, LocationID: plain.LocationID,
			StarRating: plain.StarRating, Timestamp: plain.Timestamp}, in)
	})
}

func TestDecodeCheckinJSONAccepts(t *testing.T) {
	t.Parallel()
	for _, body := range []string{
		`{"userId":42,"locationId":7,"starRating":4}`,
		" {\n\t\"userId\" : 42 ,\r\n \"locationId\":7,\"starRating\":4 } \n",
		`{"\u0075serId":42,"locationId":7,"starRating":4}`, // the key is userId once decoded
		`{"userId":42,"locationId":7,"starRating":4,"checkinId":"a\"b}"}`,
		`{"userId":42,"locationId":7,"starRating":4,"checkinId":null}`,
	} {
		in, err := ports.DecodeCheckinJSON([]byte(body))
		require.NoError(t, err, "body %q", body)
		require.NotNil(t, in.UserID)
		assert.Equal(t, int64(42), *in.UserID, "body %q", body)
	}
}

// The decoder's own path for plain bodies gives what encoding/json gives, at the edges of what
// it takes (int64's range, zeros, null, whitespace) and just past them (where it hands over).
func TestDecodeCheckinJSONPlainBodiesAsEncodingJSON(t *testing.T) {
	t.Parallel()
	for _, body := range []string{
		`{}`, ` { } `, `{"userId":null}`, `{"checkinId":""}`, `{"checkinId":"a b~"}`,
		`{"userId":9223372036854775807}`, `{"userId":-9223372036854775808}`,
		`{"userId":9223372036854775808}`, `{"userId":-9223372036854775809}`, `{"userId":99999999999999999999}`,
		`{"userId":0}`, `{"userId":-0}`, `{"userId":00}`, `{"userId":-}`, `{"userId":1.0}`, `{"userId":1e2}`,
		`{"userId":1E2}`, `{"userId":+1}`, `{"userId":"1"}`, `{"checkinId":1}`, `{"userId":1,}`, `{,}`,
		`{"userId":1 "locationId":2}`, `{"userId":1}}`, `{"userId":1}[`, `{"userId":nul}`, `{"userId":nullx}`,
		`{"userId":true}`, `{"checkinId":"tab\there"}`, "{\"checkinId\":\"é\"}", `{"userId":12,"locationId":3,"starRating":5,"timestamp":-1}`,
		"\t{\"userId\"\n:\r42 , \"starRating\" : 0}\n",
	} {
		in, err := ports.DecodeCheckinJSON([]byte(body))
		plain, plainOK := plainDecode([]byte(body))
		if !plainOK || !strictOK([]byte(body)) {
			assert.Error(t, err, "body %q", body)
			continue
		}
		require.NoError(t, err, "body %q", body)
		assert.Equal(t, domain.CheckinInput{CheckinID: plain.CheckinID, UserID: plain.UserID, LocationID: plain.LocationID,
			StarRating: plain.StarRating, Timestamp: plain.Timestamp}, in, "body %q", body)
	}
}
