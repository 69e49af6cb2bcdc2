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
func CorrelationLogHandler(h slog.Handler) slog.Handler { return correlationHandler{h} }

type correlationHandler struct{ slog.Handler }

func (h correlationHandler) Handle(ctx context.Context, r slog.Record) error {
	if id := CorrelationID(ctx); id != "" {
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
	return correlationHandler{h.Handler.WithAttrs(attrs)}
}

func (h correlationHandler) WithGroup(name string) slog.Handler {
	return correlationHandler{h.Handler.WithGroup(name)}
}
