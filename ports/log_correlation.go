package ports

import (
	"context"
	"log/slog"
)

// LogAttrCorrelationID is the log attribute that carries a request's correlation ID.
const LogAttrCorrelationID = "correlation_id"

// WithCorrelationID is ctx carrying the correlation ID id, as requestContext gives every HTTP
// request's context.
func WithCorrelationID(ctx context.Context, id string) context.Context {
	return context.WithValue(ctx, ctxKeyCorrelation{}, id)
}

// CorrelationLogHandler adds the correlation ID of a record's context to every record logged
// with one (slog's *Context methods) that does not carry it already: the lines the API's use
// cases log while handling a request (a reservation taken over, a mark that failed, a bulk
// action cut short) can be found with the request's access log line and the client's
// X-Correlation-ID, as the projectors' lines are.
// Under a Logger.WithGroup the ID goes into the group, as every attribute of the line does.
func CorrelationLogHandler(h slog.Handler) slog.Handler { return correlationHandler{Handler: h} }

type correlationHandler struct {
	slog.Handler
	bound bool // a Logger.With bound the ID already: every line carries it
}

func (h correlationHandler) Handle(ctx context.Context, r slog.Record) error {
	if id := CorrelationID(ctx); id != "" && !h.bound {
		has := false
		r.Attrs(func(a slog.Attr) bool {
			has = a.Key == LogAttrCorrelationID
			return !has
		})
		if !has {
			r = r.Clone()
			r.AddAttrs(slog.String(LogAttrCorrelationID, id))
		}
	}
	return h.Handler.Handle(ctx, r)
}

func (h correlationHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	bound := h.bound
	for _, a := range attrs {
		bound = bound || a.Key == LogAttrCorrelationID
	}
	return correlationHandler{Handler: h.Handler.WithAttrs(attrs), bound: bound}
}

func (h correlationHandler) WithGroup(name string) slog.Handler {
	return correlationHandler{Handler: h.Handler.WithGroup(name), bound: h.bound}
}
