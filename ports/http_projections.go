package ports

import (
	"errors"
	"fmt"
	"net/http"
	"strconv"

	"github.com/labstack/echo/v4"

	"github.com/checkins/checkins/app/projection"
	"github.com/checkins/checkins/domain"
)

// RegisterProjectionRoutes adds the read routes of the leaderboards, recent_checkins and
// daily_checkins projections.
func (s *HTTPServer) RegisterProjectionRoutes() {
	registerAPI(s.echo, &apiServer{s: s}, partProjections)
}

type locationBoardResponse struct {
	By        string `json:"by"`
	Limit     int    `json:"limit"`
	Locations any    `json:"locations"`
}

type userBoardResponse struct {
	Limit int `json:"limit"`
	Users any `json:"users"`
}

func (s *HTTPServer) getLocationLeaderboard(c echo.Context) error {
	limit, err := queryLimit(c, 0, projection.MaxLeaderboardLimit)
	if err != nil {
		return err
	}
	by := c.QueryParam("by")
	rows, err := s.app.Queries.Leaderboards.Locations(c.Request().Context(), by, limit)
	if err != nil {
		return projectionReadErr(err)
	}
	if by == "" {
		by = "checkins"
	}
	return c.JSON(http.StatusOK, locationBoardResponse{By: by, Limit: effectiveLimit(limit), Locations: rows})
}

func (s *HTTPServer) getUserLeaderboard(c echo.Context) error {
	limit, err := queryLimit(c, 0, projection.MaxLeaderboardLimit)
	if err != nil {
		return err
	}
	rows, err := s.app.Queries.Leaderboards.Users(c.Request().Context(), limit)
	if err != nil {
		return projectionReadErr(err)
	}
	return c.JSON(http.StatusOK, userBoardResponse{Limit: effectiveLimit(limit), Users: rows})
}

func (s *HTTPServer) getUserRecentCheckins(c echo.Context) error {
	id, err := pathID(c, "userId")
	if err != nil {
		return err
	}
	v, err := s.app.Queries.Recent.OfUser(c.Request().Context(), id)
	if err != nil {
		return projectionReadErr(err)
	}
	return c.JSON(http.StatusOK, v)
}

func (s *HTTPServer) getLocationDaily(c echo.Context) error {
	id, err := pathID(c, "locationId")
	if err != nil {
		return err
	}
	v, err := s.app.Queries.Daily.OfLocation(c.Request().Context(), id, c.QueryParam("from"), c.QueryParam("to"))
	if err != nil {
		return projectionReadErr(err)
	}
	return c.JSON(http.StatusOK, v)
}

func effectiveLimit(limit int) int {
	if limit == 0 {
		return projection.DefaultLeaderboardLimit
	}
	return limit
}

// queryLimit reads ?limit=, def when it is absent. Every route answers the same way: a value
// that is not an integer is invalid, an integer outside 1..max (max 0: no upper bound) is
// out_of_range, and the message names the range.
func queryLimit(c echo.Context, def, max int) (int, error) {
	v := c.QueryParam("limit")
	if v == "" {
		return def, nil
	}
	want := "an integer >= 1"
	if max > 0 {
		want = fmt.Sprintf("an integer from 1 to %d", max)
	}
	n, err := strconv.Atoi(v)
	switch {
	case err != nil || !asJSONInteger(v):
		return 0, &domain.ValidationError{Code: domain.CodeInvalid, Field: "limit", Message: fmt.Sprintf("must be %s, got %q", want, v)}
	case n < 1 || (max > 0 && n > max):
		return 0, &domain.ValidationError{Code: domain.CodeOutOfRange, Field: "limit", Message: fmt.Sprintf("must be %s, got %q", want, v)}
	}
	return n, nil
}

// projectionReadErr keeps validation and not-found errors as they are and turns anything else
// (Redis unreachable) into unavailability.
func projectionReadErr(err error) error {
	var ve *domain.ValidationError
	if errors.As(err, &ve) {
		return err
	}
	return readErr(err)
}
