package ports

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/labstack/echo/v4"

	"github.com/checkins/checkins/app/command"
	"github.com/checkins/checkins/app/query"
	"github.com/checkins/checkins/domain"
)

// HeaderIdempotencyKey may carry the checkinId.
const HeaderIdempotencyKey = "Idempotency-Key"

type checkinRequest struct {
	CheckinID  *string `json:"checkinId"`
	UserID     *int64  `json:"userId"`
	LocationID *int64  `json:"locationId"`
	StarRating *int64  `json:"starRating"`
	Timestamp  *int64  `json:"timestamp"`
}

// CheckinResponse is a check-in as the API returns it.
type CheckinResponse struct {
	CheckinID  string `json:"checkinId"`
	UserID     int64  `json:"userId"`
	LocationID int64  `json:"locationId"`
	StarRating int    `json:"starRating"`
	Timestamp  int64  `json:"timestamp"`
	RecordedAt int64  `json:"recordedAt,omitempty"`
	EntryID    string `json:"entryId,omitempty"`
}

func toResponse(c domain.Checkin) CheckinResponse {
	return CheckinResponse{CheckinID: c.ID, UserID: c.UserID, LocationID: c.LocationID, StarRating: c.StarRating, Timestamp: c.Timestamp}
}

func (s *HTTPServer) postCheckin(c echo.Context) error {
	// Every authenticated request counts against its user's limit (the command counts it, in
	// the reservation's round trip), also one whose body is refused here.
	var limitUser int64
	if p, ok := principalOf(c); ok && s.cfg.UserLimit.Rate > 0 {
		limitUser = p.UserID
	}
	ctx := c.Request().Context()
	rec := s.app.Commands.RecordCheckin
	in, err := decodeCheckin(c.Request())
	if err == nil {
		// Before anything is reserved or written: the check-in is the token's user's.
		in.UserID, err = checkinUser(c, in.UserID)
	}
	var res command.RecordCheckinResult
	if err != nil {
		cctx := ctx
		if ctx.Err() != nil { // a body that arrived too slowly outlived the request's deadline
			var cancel context.CancelFunc
			cctx, cancel = context.WithTimeout(context.WithoutCancel(ctx), time.Second)
			defer cancel()
		}
		res, err = rec.CountRejected(cctx, limitUser, err)
	} else {
		res, err = rec.Handle(ctx, command.RecordCheckin{Input: in, CorrelationID: CorrelationID(ctx), LimitUser: limitUser})
	}
	if res.Rate != nil {
		rateHeaders(c.Response().Header(), "user", s.cfg.UserLimit, *res.Rate)
	}
	var limited *command.RateLimitedError
	if errors.As(err, &limited) {
		return rateLimited(c, "for this user", limited.Decision)
	}
	if err != nil {
		return err
	}
	if res.Replayed {
		c.Response().Header().Set("Idempotent-Replayed", "true")
	}
	return acceptedJSON(c, res.Checkin)
}

// acceptedJSON is c.JSON(202, toResponse(ch)), the same bytes (TestAcceptedJSONIsEchoJSON)
// appended without reflection: every accepted check-in answers with it. ?pretty and Echo's debug
// mode, which indent, go through c.JSON.
func acceptedJSON(c echo.Context, ch domain.Checkin) error {
	if c.Request().URL.RawQuery != "" || c.Echo().Debug {
		return c.JSON(http.StatusAccepted, toResponse(ch))
	}
	b := make([]byte, 0, 128+len(ch.ID))
	b = append(b, `{"checkinId":`...)
	b = appendJSONString(b, ch.ID)
	b = append(b, `,"userId":`...)
	b = strconv.AppendInt(b, ch.UserID, 10)
	b = append(b, `,"locationId":`...)
	b = strconv.AppendInt(b, ch.LocationID, 10)
	b = append(b, `,"starRating":`...)
	b = strconv.AppendInt(b, int64(ch.StarRating), 10)
	b = append(b, `,"timestamp":`...)
	b = strconv.AppendInt(b, ch.Timestamp, 10)
	b = append(b, "}\n"...) // json.Encoder ends its output with a newline
	return c.JSONBlob(http.StatusAccepted, b)
}

// appendJSONString appends s as encoding/json writes it: as is when it needs no escaping (the
// usual case: printable ASCII but for the HTML characters encoding/json escapes), through
// encoding/json otherwise.
func appendJSONString(dst []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c == '"' || c == '\\' || c >= 0x80 || c == '<' || c == '>' || c == '&' {
			b, _ := json.Marshal(s) // a string always encodes
			return append(dst, b...)
		}
	}
	dst = append(dst, '"')
	dst = append(dst, s...)
	return append(dst, '"')
}

func decodeCheckin(r *http.Request) (domain.CheckinInput, error) {
	ct := r.Header.Get(echo.HeaderContentType)
	mt, _, err := mime.ParseMediaType(ct)
	if ct == "" || err != nil || mt != echo.MIMEApplicationJSON {
		return domain.CheckinInput{}, apiError(http.StatusUnsupportedMediaType, "unsupported_media_type", "",
			fmt.Sprintf("Content-Type must be application/json, got %q", ct))
	}
	body, err := io.ReadAll(http.MaxBytesReader(nil, r.Body, MaxBodyBytes))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return domain.CheckinInput{}, apiError(http.StatusRequestEntityTooLarge, "body_too_large", "",
				fmt.Sprintf("request body is larger than %d bytes", MaxBodyBytes))
		}
		if errors.Is(err, os.ErrDeadlineExceeded) { // the listener's ReadTimeout: a client too slow to send
			return domain.CheckinInput{}, apiError(http.StatusRequestTimeout, "request_timeout", "",
				"the request body did not arrive in time")
		}
		return domain.CheckinInput{}, apiError(http.StatusBadRequest, "malformed_body", "", "could not read request body: "+err.Error())
	}
	in, err := DecodeCheckinJSON(body)
	if err != nil {
		return domain.CheckinInput{}, err
	}
	// A header sent empty is refused like any bad key, not taken for no header: its retries
	// would each have been recorded as a new check-in.
	if keys := r.Header.Values(HeaderIdempotencyKey); len(keys) > 1 {
		// Which one the client meant is not ours to pick: the first was taken, the others dropped.
		return domain.CheckinInput{}, apiError(http.StatusBadRequest, domain.CodeInvalid, HeaderIdempotencyKey,
			fmt.Sprintf("%s header sent %d times: send it once", HeaderIdempotencyKey, len(keys)))
	} else if len(keys) == 1 {
		key := keys[0]
		if err := domain.ValidateCheckinID(key); err != nil {
			var ve *domain.ValidationError
			if errors.As(err, &ve) {
				return domain.CheckinInput{}, apiError(http.StatusBadRequest, ve.Code, HeaderIdempotencyKey,
					HeaderIdempotencyKey+" header (the checkinId): "+ve.Message)
			}
			return domain.CheckinInput{}, err
		}
		if in.CheckinID != nil && *in.CheckinID != key {
			return domain.CheckinInput{}, apiError(http.StatusBadRequest, domain.CodeInvalid, "checkinId",
				fmt.Sprintf("checkinId %q differs from the Idempotency-Key header %q", *in.CheckinID, key))
		}
		in.CheckinID = &key
	}
	return in, nil
}

// DecodeCheckinJSON decodes the body of POST /checkins. A rejected body gets an *APIError
// (400, with a code, and the field when one is to blame).
func DecodeCheckinJSON(body []byte) (domain.CheckinInput, error) {
	if err := checkStrictJSON(body); err != nil {
		return domain.CheckinInput{}, err
	}
	if in, ok := decodePlainCheckin(body); ok {
		return in, nil
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	var req checkinRequest
	if err := dec.Decode(&req); err != nil {
		return domain.CheckinInput{}, jsonError(err)
	}
	// dec.More() misses a trailing ']' or '}'; anything but the end of the body is refused.
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return domain.CheckinInput{}, apiError(http.StatusBadRequest, "malformed_json", "", "request body must be a single JSON object")
	}
	return domain.CheckinInput{CheckinID: req.CheckinID, UserID: req.UserID, LocationID: req.LocationID,
		StarRating: req.StarRating, Timestamp: req.Timestamp}, nil
}

// decodePlainCheckin reads the usual body without reflection: one object of the fields, spelled
// exactly, each a null or, for checkinId, a string of printable ASCII without escapes, for the
// others an integer in int64's range, nothing but whitespace around it. Anything else (ok false)
// goes to encoding/json, which accepts it or says why not: this path never refuses a body, and
// gives what encoding/json gives for those it takes (FuzzDecodeCheckinJSON compares the two).
// The strict checks have run: the keys are known and unique. Decoding with encoding/json was
// the largest share of the API's own CPU per check-in.
func decodePlainCheckin(b []byte) (in domain.CheckinInput, ok bool) {
	var num *[len(checkinFields) - 1]int64 // one allocation for the four numbers
	i := skipSpace(b, 0)
	if i >= len(b) || b[i] != '{' {
		return in, false
	}
	if i = skipSpace(b, i+1); i < len(b) && b[i] == '}' {
		return in, skipSpace(b, i+1) == len(b)
	}
	for {
		if i >= len(b) || b[i] != '"' {
			return in, false
		}
		start, end := i+1, plainStringEnd(b, i)
		if end < 0 {
			return in, false
		}
		f := fieldIndex(b[start : end-1])
		if f < 0 {
			return in, false
		}
		if i = skipSpace(b, end); i >= len(b) || b[i] != ':' {
			return in, false
		}
		i = skipSpace(b, i+1)
		switch {
		case len(b)-i >= 4 && string(b[i:i+4]) == "null":
			i += 4 // the field stays nil, as encoding/json leaves it
		case f == 0:
			if i >= len(b) || b[i] != '"' {
				return in, false
			}
			end := plainStringEnd(b, i)
			if end < 0 {
				return in, false
			}
			id := string(b[i+1 : end-1])
			in.CheckinID, i = &id, end
		default:
			j := i
			if j < len(b) && b[j] == '-' {
				j++
			}
			digits := j
			for j < len(b) && b[j] >= '0' && b[j] <= '9' {
				j++
			}
			if j == digits || (b[digits] == '0' && j-digits > 1) || (j < len(b) && (b[j] == '.' || b[j] == 'e' || b[j] == 'E')) {
				return in, false // not a JSON integer, or a fraction or exponent: encoding/json decides
			}
			v, ok := parseInt64(b[digits:j], digits > i)
			if !ok {
				return in, false
			}
			if num == nil {
				num = new([len(checkinFields) - 1]int64)
			}
			p := &num[f-1]
			*p = v
			switch f {
			case 1:
				in.UserID = p
			case 2:
				in.LocationID = p
			case 3:
				in.StarRating = p
			case 4:
				in.Timestamp = p
			}
			i = j
		}
		switch i = skipSpace(b, i); {
		case i < len(b) && b[i] == ',':
			i = skipSpace(b, i+1)
		case i < len(b) && b[i] == '}':
			return in, skipSpace(b, i+1) == len(b)
		default:
			return in, false
		}
	}
}

// parseInt64 reads decimal digits (negated when neg); ok is false outside int64's range.
func parseInt64(digits []byte, neg bool) (int64, bool) {
	const limit = uint64(1) << 63 // -limit is the least int64, limit-1 the greatest
	var u uint64
	for _, c := range digits {
		if u > limit/10 { // u*10 would pass limit
			return 0, false
		}
		u = u*10 + uint64(c-'0')
		if u > limit {
			return 0, false
		}
	}
	if neg {
		return -int64(u-1) - 1, true // #nosec G115 -- u <= 1<<63, so u-1 fits and -(u-1)-1 is at least the least int64
	}
	if u == limit {
		return 0, false
	}
	return int64(u), true // #nosec G115 -- u < 1<<63: fits
}

// plainStringEnd returns the index after the closing quote of the string at b[i] when it is
// printable ASCII without escapes, -1 otherwise.
func plainStringEnd(b []byte, i int) int {
	for j := i + 1; j < len(b); j++ {
		switch c := b[j]; {
		case c == '"':
			return j + 1
		case c == '\\' || c < 0x20 || c >= 0x80:
			return -1
		}
	}
	return -1
}

// checkinFields are the body's keys, exactly as they must be spelled.
var checkinFields = [...]string{"checkinId", "userId", "locationId", "starRating", "timestamp"}

// checkStrictJSON refuses what encoding/json would take silently: a key given twice (the last
// one would win), a key that matches a field only case-insensitively or by Unicode folding
// (USERID, ſtarRating), and invalid UTF-8 (replaced by U+FFFD). Either would let a body say one
// thing to a reader and another to us. It walks the top-level keys only; values, syntax, types and
// trailing data are left to the decoder that follows, so every other answer stays what it was:
// wherever this scan does not understand the body, it lets it through to the decoder, which
// rejects it. (A scan with json.Decoder.Token did the same at three times the cost of decoding.)
func checkStrictJSON(body []byte) error {
	if !utf8.Valid(body) {
		return apiError(http.StatusBadRequest, "invalid_utf8", "", "request body is not valid UTF-8")
	}
	i := skipSpace(body, 0)
	if i < len(body) && body[i] == 'n' && string(bytes.TrimSpace(body)) == "null" {
		// The decoder takes null for an object with no fields.
		return apiError(http.StatusBadRequest, "malformed_json", "", "request body must be a JSON object, got JSON null")
	}
	if i >= len(body) || body[i] != '{' {
		return nil // not an object: the decoder says what it is
	}
	var seen [len(checkinFields)]bool
	for i++; ; i++ {
		if i = skipSpace(body, i); i >= len(body) || body[i] != '"' {
			return nil // `}` of `{}`, or not JSON
		}
		end, escaped := scanString(body, i)
		if end < 0 {
			return nil
		}
		raw := body[i+1 : end-1]
		if escaped { // "\u0075serId" is userId: compare what the decoder will see
			if raw = unescapeKey(body[i:end]); raw == nil {
				return nil
			}
		}
		f := fieldIndex(raw)
		switch {
		case f < 0:
			key := string(raw)
			for _, name := range checkinFields {
				if strings.EqualFold(key, name) {
					return apiError(http.StatusBadRequest, "unknown_field", key,
						fmt.Sprintf("unknown field %q: field names are case-sensitive, did you mean %q?", key, name))
				}
			}
			return apiError(http.StatusBadRequest, "unknown_field", key, fmt.Sprintf("unknown field %q", key))
		case seen[f]:
			return apiError(http.StatusBadRequest, "duplicate_field", checkinFields[f],
				fmt.Sprintf("field %q is given more than once", checkinFields[f]))
		}
		seen[f] = true
		if i = skipSpace(body, end); i >= len(body) || body[i] != ':' {
			return nil
		}
		if i = skipValue(body, skipSpace(body, i+1)); i < 0 {
			return nil
		}
		if i = skipSpace(body, i); i >= len(body) || body[i] != ',' {
			return nil // the closing brace, or not JSON
		}
	}
}

// unescapeKey decodes a quoted key with escapes (rare: kept off the common path, where the key
// is the raw bytes); nil when it is not a valid JSON string.
func unescapeKey(quoted []byte) []byte {
	var key string
	if json.Unmarshal(quoted, &key) != nil {
		return nil
	}
	return []byte(key)
}

// fieldIndex is the index of key in checkinFields, -1 if none; it does not allocate.
func fieldIndex(key []byte) int {
	for i, f := range checkinFields {
		if string(key) == f {
			return i
		}
	}
	return -1
}

func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// scanString returns the index after the closing quote of the string starting at b[i] (-1 when
// it does not end), and whether it holds an escape.
func scanString(b []byte, i int) (end int, escaped bool) {
	for j := i + 1; j < len(b); j++ {
		switch b[j] {
		case '\\':
			escaped = true
			j++
		case '"':
			return j + 1, escaped
		}
	}
	return -1, escaped
}

// skipValue returns the index after the JSON value starting at b[i], -1 when it does not end.
// Scalars end at a delimiter; objects and arrays at their matching bracket, strings inside them
// skipped whole. It does not validate: the decoder does.
func skipValue(b []byte, i int) int {
	if i >= len(b) {
		return -1
	}
	switch b[i] {
	case '"':
		end, _ := scanString(b, i)
		return end
	case '{', '[':
		depth := 0
		for j := i; j < len(b); j++ {
			switch b[j] {
			case '"':
				end, _ := scanString(b, j)
				if end < 0 {
					return -1
				}
				j = end - 1
			case '{', '[':
				depth++
			case '}', ']':
				if depth--; depth == 0 {
					return j + 1
				}
			}
		}
		return -1
	}
	j := i
	for j < len(b) && !strings.ContainsRune(",}] \t\n\r", rune(b[j])) {
		j++
	}
	return j
}

func jsonError(err error) error {
	var te *json.UnmarshalTypeError
	var se *json.SyntaxError
	switch {
	case errors.As(err, &te) && te.Field == "":
		// The body itself is not an object (an array, a string...): no field to blame.
		return apiError(http.StatusBadRequest, "malformed_json", "", "request body must be a JSON object, got JSON "+te.Value)
	case errors.As(err, &te) && te.Field != "checkinId" && isIntegerLiteral(strings.TrimPrefix(te.Value, "number ")):
		// An integer, only too large for any field: not a wrong type.
		return apiError(http.StatusBadRequest, domain.CodeOutOfRange, te.Field,
			fmt.Sprintf("%s is out of range: %s does not fit a 64-bit integer", te.Field, strings.TrimPrefix(te.Value, "number ")))
	case errors.As(err, &te):
		return apiError(http.StatusBadRequest, "wrong_type", te.Field,
			fmt.Sprintf("%s must be %s, got JSON %s", te.Field, jsonTypeName(te.Field), te.Value))
	case errors.As(err, &se), errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return apiError(http.StatusBadRequest, "malformed_json", "", "request body is not valid JSON: "+err.Error())
	}
	// encoding/json reports unknown fields only as text: `json: unknown field "x"`.
	const unknown = "json: unknown field "
	if msg := err.Error(); len(msg) > len(unknown) && msg[:len(unknown)] == unknown {
		field, _ := strconv.Unquote(msg[len(unknown):])
		return apiError(http.StatusBadRequest, "unknown_field", field, fmt.Sprintf("unknown field %q", field))
	}
	return apiError(http.StatusBadRequest, "malformed_json", "", "request body is not a valid check-in: "+err.Error())
}

// isIntegerLiteral: an optional minus and digits only.
func isIntegerLiteral(s string) bool {
	s = strings.TrimPrefix(s, "-")
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

func jsonTypeName(field string) string {
	if field == "checkinId" {
		return "a string"
	}
	return "an integer"
}

func recordedResponse(r query.RecordedCheckin) CheckinResponse {
	resp := toResponse(r.Checkin)
	resp.RecordedAt = r.RecordedAt
	resp.EntryID = r.EntryID
	if resp.RecordedAt == 0 {
		// An entry another producer added without recordedAt: the time Redis recorded it, the
		// milliseconds of its entry ID (the contract makes recordedAt required).
		if ms, _, ok := strings.Cut(r.EntryID, "-"); ok {
			resp.RecordedAt, _ = strconv.ParseInt(ms, 10, 64)
		}
	}
	return resp
}

func (s *HTTPServer) getLatestCheckin(c echo.Context) error {
	r, err := s.app.Queries.Checkins.Latest(c.Request().Context())
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, recordedResponse(r))
}

type checkinListResponse struct {
	Checkins   []CheckinResponse `json:"checkins"`
	NextCursor string            `json:"nextCursor,omitempty"`
}

func (s *HTTPServer) listCheckins(c echo.Context) error {
	q := query.RangeQuery{To: 1<<63 - 1}
	var err error
	for _, p := range []struct {
		name string
		dst  *int64
	}{{"from", &q.From}, {"to", &q.To}} {
		if v := c.QueryParam(p.name); v != "" {
			if *p.dst, err = strconv.ParseInt(v, 10, 64); err != nil || !asJSONInteger(v) {
				return apiError(http.StatusBadRequest, domain.CodeInvalid, p.name, fmt.Sprintf("%s must be milliseconds since the epoch, got %q", p.name, v))
			}
		}
	}
	if q.Limit, err = queryLimit(c, q.Limit, domain.MaxPageLimit); err != nil {
		return err
	}
	q.Cursor = c.QueryParam("cursor")
	page, err := s.app.Queries.Checkins.Range(c.Request().Context(), q)
	if err != nil {
		return err
	}
	out := checkinListResponse{Checkins: make([]CheckinResponse, len(page.Checkins)), NextCursor: page.Next}
	for i, r := range page.Checkins {
		out.Checkins[i] = recordedResponse(r)
	}
	return c.JSON(http.StatusOK, out)
}

// asJSONInteger says whether v is an integer as JSON writes one, as the path's ids must be: no
// "+5", no "05" (strconv takes both, and two spellings of one query made two cache entries and
// two answers for what a client meant as one).
func asJSONInteger(v string) bool {
	v = strings.TrimPrefix(v, "-")
	if v == "" || v[0] < '0' || v[0] > '9' {
		return false
	}
	return v == "0" || v[0] != '0'
}

func pathID(c echo.Context, name string) (int64, error) {
	// Echo matches the escaped path (and so hands the parameter on escaped) only when the
	// request's path has a non-default escaping: /users/%34%32 is /users/42, but /users/%2531
	// arrives decoded once already ("%31"), and is no number.
	v := c.Param("id")
	if c.Request().URL.RawPath != "" {
		if u, err := url.PathUnescape(v); err == nil {
			v = u
		}
	}
	id, err := strconv.ParseInt(v, 10, 64)
	if err != nil || id < 1 || !asJSONInteger(v) { // the integer as written in JSON: no "+1", no "01"
		return 0, apiError(http.StatusBadRequest, domain.CodeInvalid, name, fmt.Sprintf("%s must be an integer >= 1, got %q", name, v))
	}
	return id, nil
}
