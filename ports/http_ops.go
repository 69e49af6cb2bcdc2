package ports

import (
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"

	"github.com/labstack/echo/v4"

	"github.com/checkins/checkins/app"
	"github.com/checkins/checkins/app/command"
	"github.com/checkins/checkins/app/query"
	"github.com/checkins/checkins/domain"
)

// DefaultHTTPBulkLimit bounds the entries one POST /ops/poison/replay or DELETE /ops/poison call
// handles; the answer's next and until continue the run.
const DefaultHTTPBulkLimit = 1000

// RegisterOpsRoutes adds the operations API, the same use cases as the CLI verbs:
//
//	GET    /ops/status                  consumer groups, consumers, pending, lag, poison counts
//	GET    /ops/poison                  ?projection=&cursor=&limit=
//	GET    /ops/poison/{id}
//	POST   /ops/poison/{id}/replay
//	POST   /ops/poison/replay           ?projection=&after=&until=&limit= (all, in chunks)
//	DELETE /ops/poison/{id}
//	DELETE /ops/poison                  ?projection=&after=&until=&limit= (purge all)
//	GET    /ops/projections             versions, groups, lag, pending and rebuild progress
//	POST   /ops/projections/{name}/rebuild start a rebuild (202); projectors carry it out
//
// Errors use the API's JSON error body; they pass through e's HTTPErrorHandler.
func RegisterOpsRoutes(e *echo.Echo, a app.Application) error {
	h := opsHandlers{c: a.Commands, q: a.Queries}
	if h.q.Status == nil || h.q.ListPoisoned == nil || h.q.ProjectionVersions == nil ||
		h.c.ReplayPoisoned == nil || h.c.PurgePoisoned == nil || h.c.RebuildProjection == nil {
		return errors.New("ports: RegisterOpsRoutes needs the status, poison and projection use cases")
	}
	registerAPI(e, &apiServer{ops: &h}, partOps, partProjectionOps)
	return nil
}

type opsHandlers struct {
	c app.Commands
	q app.Queries
}

func (h opsHandlers) getStatus(c echo.Context) error {
	st, err := h.q.Status.Status(c.Request().Context())
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, st)
}

func (h opsHandlers) listPoison(c echo.Context) error {
	limit, err := queryLimit(c, 0, query.MaxPoisonListLimit)
	if err != nil {
		return err
	}
	page, err := h.q.ListPoisoned.List(c.Request().Context(), query.PoisonFilter{Projection: c.QueryParam("projection"), Cursor: c.QueryParam("cursor"), Limit: limit})
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, page)
}

func (h opsHandlers) showPoison(c echo.Context) error {
	e, err := h.q.ListPoisoned.Show(c.Request().Context(), c.Param("id"))
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, e)
}

// replayFailure is the error body of a failed replay, with what happened to the entry.
type replayFailure struct {
	Error  *APIError            `json:"error"`
	Result command.ReplayResult `json:"result"`
}

func (h opsHandlers) replayOne(c echo.Context) error {
	res, err := h.c.ReplayPoisoned.Replay(c.Request().Context(), c.Param("id"))
	switch {
	case err == nil:
		return c.JSON(http.StatusOK, res)
	case errors.Is(err, command.ErrReplayFailed):
		return c.JSON(http.StatusUnprocessableEntity, replayFailure{
			Error: apiError(http.StatusUnprocessableEntity, "replay_failed", "", err.Error()), Result: res})
	case errors.Is(err, command.ErrNotReplayable):
		return c.JSON(http.StatusUnprocessableEntity, replayFailure{
			Error: apiError(http.StatusUnprocessableEntity, "not_replayable", "", err.Error()), Result: res})
	}
	return err
}

func bulkRequest(c echo.Context) (command.BulkRequest, error) {
	// A parameter it does not know is refused: ignored, a misspelt filter
	// (DELETE /ops/poison?projetion=users) ran over every entry.
	for name := range c.QueryParams() {
		if !slices.Contains(bulkParams, name) {
			return command.BulkRequest{}, &domain.ValidationError{Code: domain.CodeInvalid, Field: name,
				Message: fmt.Sprintf("is not a parameter of this route (it takes %s)", strings.Join(bulkParams, ", "))}
		}
	}
	limit, err := queryLimit(c, DefaultHTTPBulkLimit, 0)
	if err != nil {
		return command.BulkRequest{}, err
	}
	version := 0
	if v := c.QueryParam("version"); v != "" {
		if version, err = strconv.Atoi(v); err != nil || version < 1 {
			return command.BulkRequest{}, &domain.ValidationError{Code: domain.CodeInvalid, Field: "version",
				Message: fmt.Sprintf("must be a projection version, an integer >= 1, got %q", v)}
		}
	}
	return command.BulkRequest{Projection: c.QueryParam("projection"), Version: version, After: c.QueryParam("after"), Until: c.QueryParam("until"), Max: limit}, nil
}

// bulkParams are the query parameters of a bulk replay or purge.
var bulkParams = []string{"projection", "version", "after", "until", "limit"}

func (h opsHandlers) replayAll(c echo.Context) error {
	r, err := bulkRequest(c)
	if err != nil {
		return err
	}
	res, err := h.c.ReplayPoisoned.ReplayAll(c.Request().Context(), r)
	return bulkAnswer(c, res, err)
}

// bulkAnswer answers a bulk run. One that stopped on an error after it had done part of its
// work answers 200 with what it did, where to continue and why it stopped: a bare 503 would
// hide that entries were replayed or purged.
func bulkAnswer(c echo.Context, res command.BulkResult, err error) error {
	if err != nil {
		if !res.Progressed() || res.Next == "" {
			return err
		}
		res.StoppedBy = err.Error()
	}
	return c.JSON(http.StatusOK, res)
}

func (h opsHandlers) purgeOne(c echo.Context) error {
	if err := h.c.PurgePoisoned.Purge(c.Request().Context(), c.Param("id")); err != nil {
		return err
	}
	return c.NoContent(http.StatusNoContent)
}

func (h opsHandlers) purgeAll(c echo.Context) error {
	r, err := bulkRequest(c)
	if err != nil {
		return err
	}
	res, err := h.c.PurgePoisoned.PurgeAll(c.Request().Context(), r)
	return bulkAnswer(c, res, err)
}

func (h opsHandlers) listProjections(c echo.Context) error {
	rep, err := h.q.ProjectionVersions.List(c.Request().Context())
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, rep)
}

func (h opsHandlers) rebuild(c echo.Context) error {
	rp, err := h.c.RebuildProjection.Start(c.Request().Context(), c.Param("name"))
	switch {
	case errors.Is(err, domain.ErrNotFound):
		return apiError(http.StatusNotFound, domain.CodeNotFound, "name", err.Error())
	case errors.Is(err, command.ErrRebuildBusy):
		return apiError(http.StatusConflict, domain.CodeConflict, "name", err.Error())
	case err != nil:
		return err
	}
	c.Response().Header().Set(echo.HeaderLocation, "/ops/projections")
	return c.JSON(http.StatusAccepted, rp)
}
