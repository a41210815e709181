package httpidem

import (
	"net/http"

	"go.opentelemetry.io/otel/codes"

	"github.com/wmonce/watermill-once/internal/tracing"
)

// traced serves r under an "httpidem request" span: a child of the span in the request's
// context, or a server span continuing the request's traceparent header. The handler, and the
// outbox messages it writes, run under it.
func (m *Middleware) traced(w http.ResponseWriter, r *http.Request, serve func(http.ResponseWriter, *http.Request)) {
	ctx, span := tracing.StartServer(r.Context(), m.tracer, tracing.SpanHTTPIdem, r.Header)
	defer span.End()
	if key, present, err := m.parseKey(r); present && err == nil {
		span.SetAttributes(tracing.IdempotencyKey.String(key))
	}
	sw := &statusWriter{ResponseWriter: w, status: http.StatusOK}
	serve(sw, r.WithContext(ctx))
	replayed := sw.Header().Get(ReplayedHeader) == "true"
	span.SetAttributes(tracing.HTTPStatus.Int(sw.status), tracing.Replayed.Bool(replayed), tracing.Duplicate.Bool(replayed),
		tracing.FingerprintMismatch.Bool(sw.status == http.StatusUnprocessableEntity))
	if sw.status >= 500 {
		span.SetStatus(codes.Error, http.StatusText(sw.status))
	}
}

// statusWriter remembers the status written, for the span.
type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(status int) {
	w.status = status
	w.ResponseWriter.WriteHeader(status)
}

// Unwrap lets http.ResponseController reach the connection's writer.
func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
