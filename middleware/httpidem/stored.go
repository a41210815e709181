package httpidem

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/wmonce/watermill-once/pgtx"
)

// storedResponse is a live record of a key.
type storedResponse struct {
	fingerprint []byte
	status      int
	header      http.Header
	body        []byte
	createdAt   time.Time
}

// lookup returns the live record of the request's key, or nil.
func (m *Middleware) lookup(ctx context.Context, q pgtx.Executor, req *request) (*storedResponse, error) {
	var s storedResponse
	var headersJSON string
	err := q.QueryRowContext(ctx, m.q.lookup, req.scope, req.key, m.config.Retention.Microseconds()).
		Scan(&s.fingerprint, &s.status, &headersJSON, &s.body, &s.createdAt)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		if pgtx.IsUndefinedTable(err) {
			return nil, fmt.Errorf("table http_idempotency_keys is missing in schema %q: run the migrations: %w", m.config.Schema, err)
		}
		return nil, err
	}
	if s.header, err = decodeHeaders([]byte(headersJSON)); err != nil {
		return nil, fmt.Errorf("decode stored headers: %w", err)
	}
	return &s, nil
}

// answerStored replays the stored response, or refuses a request that reuses its key.
func (m *Middleware) answerStored(w http.ResponseWriter, req *request, s *storedResponse) {
	if !bytes.Equal(s.fingerprint, req.fingerprint) {
		m.mismatches.Add(1)
		m.logger.Info("Idempotency key reused for a different request", req.fields.Add(watermill.LogFields{"first_used": s.createdAt}))
		writeProblem(w, http.StatusUnprocessableEntity, ProblemKeyReused, m.header+" already used for a different request",
			fmt.Sprintf("the key was first used at %s with a different method, path or body; use a new key for a new request", s.createdAt.UTC().Format(time.RFC3339)))
		return
	}
	m.replayed.Add(1)
	m.logger.Debug("Replaying stored response", req.fields.Add(watermill.LogFields{"status": s.status}))
	writeResponse(w, s.status, s.header, s.body, true)
}
