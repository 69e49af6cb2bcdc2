package ports

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"strconv"

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
	if p, ok := principalOf(c); ok && s.cfg.UserLimiter != nil {
		if err := s.limitUser(c, p.UserID); err != nil {
			return err
		}
	}
	in, err := decodeCheckin(c.Request())
	if err != nil {
		return err
	}
	// Before anything is reserved or written: the check-in is the token's user's.
	if in.UserID, err = checkinUser(c, in.UserID); err != nil {
		return err
	}
	res, err := s.app.Commands.RecordCheckin.Handle(c.Request().Context(), command.RecordCheckin{
		Input: in, CorrelationID: CorrelationID(c.Request().Context()),
	})
	if err != nil {
		return err
	}
	if res.Replayed {
		c.Response().Header().Set("Idempotent-Replayed", "true")
	}
	return c.JSON(http.StatusAccepted, toResponse(res.Checkin))
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
		return domain.CheckinInput{}, apiError(http.StatusBadRequest, "malformed_body", "", "could not read request body: "+err.Error())
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
	if key := r.Header.Get(HeaderIdempotencyKey); key != "" {
		if req.CheckinID != nil && *req.CheckinID != key {
			return domain.CheckinInput{}, apiError(http.StatusBadRequest, domain.CodeInvalid, "checkinId",
				fmt.Sprintf("checkinId %q differs from the Idempotency-Key header %q", *req.CheckinID, key))
		}
		req.CheckinID = &key
	}
	return domain.CheckinInput{CheckinID: req.CheckinID, UserID: req.UserID, LocationID: req.LocationID,
		StarRating: req.StarRating, Timestamp: req.Timestamp}, nil
}

func jsonError(err error) error {
	var te *json.UnmarshalTypeError
	var se *json.SyntaxError
	switch {
	case errors.As(err, &te) && te.Field == "":
		// The body itself is not an object (an array, a string...): no field to blame.
		return apiError(http.StatusBadRequest, "malformed_json", "", "request body must be a JSON object, got JSON "+te.Value)
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
			if *p.dst, err = strconv.ParseInt(v, 10, 64); err != nil {
				return apiError(http.StatusBadRequest, domain.CodeInvalid, p.name, fmt.Sprintf("%s must be milliseconds since the epoch, got %q", p.name, v))
			}
		}
	}
	if v := c.QueryParam("limit"); v != "" {
		if q.Limit, err = strconv.Atoi(v); err != nil || q.Limit < 1 {
			return apiError(http.StatusBadRequest, domain.CodeOutOfRange, "limit", fmt.Sprintf("limit must be an integer from 1 to %d, got %q", domain.MaxPageLimit, v))
		}
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

func pathID(c echo.Context, name string) (int64, error) {
	v := c.Param("id")
	id, err := strconv.ParseInt(v, 10, 64)
	if err != nil || id < 1 {
		return 0, apiError(http.StatusBadRequest, domain.CodeInvalid, name, fmt.Sprintf("%s must be an integer >= 1, got %q", name, v))
	}
	return id, nil
}
