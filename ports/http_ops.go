package ports

import (
	"errors"
	"fmt"
	"net/http"
	"strconv"

	"github.com/labstack/echo/v4"

	"github.com/checkins/checkins/domain"
)

// DefaultHTTPBulkLimit bounds the entries one POST /ops/poison/replay or DELETE /ops/poison call
// handles; the answer's next and until continue the run.
const DefaultHTTPBulkLimit = 1000

// RegisterOpsRoutes adds the operations API, the same operations as the CLI:
//
//	GET    /ops/status                  consumer groups, consumers, pending, lag, poison counts
//	GET    /ops/poison                  ?projection=&cursor=&limit=
//	GET    /ops/poison/{id}
//	POST   /ops/poison/{id}/replay
//	POST   /ops/poison/replay           ?projection=&after=&until=&limit= (all, in chunks)
//	DELETE /ops/poison/{id}
//	DELETE /ops/poison                  ?projection=&after=&until=&limit= (purge all)
//
// Errors use the API's JSON error body; they pass through e's HTTPErrorHandler.
func RegisterOpsRoutes(e *echo.Echo, poison *PoisonOps, status *StatusOps) error {
	if poison == nil || status == nil {
		return errors.New("ports: RegisterOpsRoutes needs PoisonOps and StatusOps")
	}
	h := opsHandlers{poison: poison, status: status}
	registerAPI(e, &apiServer{ops: &h}, partOps)
	return nil
}

type opsHandlers struct {
	poison *PoisonOps
	status *StatusOps
}

func (h opsHandlers) getStatus(c echo.Context) error {
	st, err := h.status.Status(c.Request().Context())
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, st)
}

func (h opsHandlers) listPoison(c echo.Context) error {
	limit, err := queryInt(c, "limit", 0)
	if err != nil {
		return err
	}
	page, err := h.poison.List(c.Request().Context(), PoisonFilter{Projection: c.QueryParam("projection"), Cursor: c.QueryParam("cursor"), Limit: limit})
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, page)
}

func (h opsHandlers) showPoison(c echo.Context) error {
	e, err := h.poison.Show(c.Request().Context(), c.Param("id"))
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, e)
}

// replayFailure is the error body of a failed replay, with what happened to the entry.
type replayFailure struct {
	Error  *APIError    `json:"error"`
	Result ReplayResult `json:"result"`
}

func (h opsHandlers) replayOne(c echo.Context) error {
	res, err := h.poison.Replay(c.Request().Context(), c.Param("id"))
	switch {
	case err == nil:
		return c.JSON(http.StatusOK, res)
	case errors.Is(err, ErrReplayFailed):
		return c.JSON(http.StatusUnprocessableEntity, replayFailure{
			Error: apiError(http.StatusUnprocessableEntity, "replay_failed", "", err.Error()), Result: res})
	case errors.Is(err, ErrNotReplayable):
		return c.JSON(http.StatusUnprocessableEntity, replayFailure{
			Error: apiError(http.StatusUnprocessableEntity, "not_replayable", "", err.Error()), Result: res})
	}
	return err
}

func (h opsHandlers) bulkRequest(c echo.Context) (BulkRequest, error) {
	limit, err := queryInt(c, "limit", DefaultHTTPBulkLimit)
	if err != nil {
		return BulkRequest{}, err
	}
	return BulkRequest{Projection: c.QueryParam("projection"), After: c.QueryParam("after"), Until: c.QueryParam("until"), Max: limit}, nil
}

func (h opsHandlers) replayAll(c echo.Context) error {
	r, err := h.bulkRequest(c)
	if err != nil {
		return err
	}
	res, err := h.poison.ReplayAll(c.Request().Context(), r)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, res)
}

func (h opsHandlers) purgeOne(c echo.Context) error {
	if err := h.poison.Purge(c.Request().Context(), c.Param("id")); err != nil {
		return err
	}
	return c.NoContent(http.StatusNoContent)
}

func (h opsHandlers) purgeAll(c echo.Context) error {
	r, err := h.bulkRequest(c)
	if err != nil {
		return err
	}
	res, err := h.poison.PurgeAll(c.Request().Context(), r)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, res)
}

func queryInt(c echo.Context, name string, def int) (int, error) {
	v := c.QueryParam(name)
	if v == "" {
		return def, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 {
		return 0, &domain.ValidationError{Code: domain.CodeInvalid, Field: name, Message: fmt.Sprintf("must be a positive integer, got %q", v)}
	}
	return n, nil
}
