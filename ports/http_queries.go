package ports

import (
	"errors"
	"fmt"
	"net/http"

	"github.com/labstack/echo/v4"

	"github.com/checkins/checkins/domain"
)

func (s *HTTPServer) getUser(c echo.Context) error {
	id, err := pathID(c, "userId")
	if err != nil {
		return err
	}
	v, err := s.app.Queries.Users.Stats(c.Request().Context(), id)
	if err != nil {
		return readErr(err)
	}
	return c.JSON(http.StatusOK, v)
}

func (s *HTTPServer) getLocation(c echo.Context) error {
	id, err := pathID(c, "locationId")
	if err != nil {
		return err
	}
	v, err := s.app.Queries.Locations.Stats(c.Request().Context(), id)
	if err != nil {
		return readErr(err)
	}
	return c.JSON(http.StatusOK, v)
}

// readErr marks read-model failures other than not-found as unavailability (503).
func readErr(err error) error {
	if errors.Is(err, domain.ErrNotFound) {
		return err
	}
	return fmt.Errorf("%w: %w", domain.ErrUnavailable, err)
}
