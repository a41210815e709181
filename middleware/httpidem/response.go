package httpidem

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"

	"github.com/wmonce/watermill-once/internal/setup"
)

// Problem types (RFC 9457) of the responses the middleware itself produces.
const (
	ProblemMissingKey = "urn:watermill-once:idempotency:missing-key"
	ProblemInvalidKey = "urn:watermill-once:idempotency:invalid-key"
	ProblemNoScope    = "urn:watermill-once:idempotency:no-client-scope"
	ProblemTooLarge   = "urn:watermill-once:idempotency:request-too-large"
	ProblemBadBody    = "urn:watermill-once:idempotency:unreadable-body"
	ProblemInProgress = "urn:watermill-once:idempotency:in-progress"
	ProblemKeyReused  = "urn:watermill-once:idempotency:key-reused"
	ProblemNotStored  = "urn:watermill-once:idempotency:not-completed"
	// ProblemHandlerEndedTx (500): the handler ended the request's transaction; nothing was
	// applied or stored.
	ProblemHandlerEndedTx = "urn:watermill-once:idempotency:handler-ended-transaction"
)

type problem struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail,omitempty"`
}

func writeProblem(w http.ResponseWriter, status int, typ, title, detail string) {
	body, _ := json.Marshal(problem{Type: typ, Title: title, Status: status, Detail: detail})
	w.Header().Set("Content-Type", "application/problem+json")
	w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

func writeResponse(w http.ResponseWriter, status int, header http.Header, body []byte, replayed bool) {
	dst := w.Header()
	for k, v := range header {
		dst[k] = append([]string(nil), v...)
	}
	if replayed {
		dst.Set(ReplayedHeader, "true")
	}
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

// recorder buffers the handler's response until the transaction has committed. It offers
// neither Flush nor Hijack nor Unwrap: reaching the real connection would let bytes out before
// the commit.
type recorder struct {
	header      http.Header
	sentHeader  http.Header // snapshot at WriteHeader, as net/http freezes headers then
	status      int
	body        bytes.Buffer
	maxBytes    int64
	overflow    bool
	wroteHeader bool
}

func newRecorder(maxBytes int64) *recorder {
	return &recorder{header: http.Header{}, maxBytes: maxBytes}
}

func (r *recorder) Header() http.Header { return r.header }

func (r *recorder) WriteHeader(status int) {
	if r.wroteHeader || status < 200 {
		return // like net/http: the first final status wins; 1xx are not stored
	}
	r.wroteHeader = true
	r.status = status
	r.sentHeader = r.header.Clone()
}

func (r *recorder) Write(p []byte) (int, error) {
	if !r.wroteHeader {
		r.WriteHeader(http.StatusOK)
	}
	if r.overflow || int64(r.body.Len()+len(p)) > r.maxBytes {
		r.overflow = true
		return 0, errResponseTooLarge
	}
	return r.body.Write(p)
}

// bytes returns the buffered body, never nil: an empty body is stored as an empty bytea, as
// a nil slice would be sent as NULL.
func (r *recorder) bytes() []byte {
	if b := r.body.Bytes(); b != nil {
		return b
	}
	return []byte{}
}

var errResponseTooLarge = &responseTooLargeError{}

type responseTooLargeError struct{}

func (*responseTooLargeError) Error() string {
	return "httpidem: response exceeds MaxResponseBytes and cannot be stored for replay"
}

// final returns the status and headers as net/http would have sent them, with the
// Content-Type sniffed the way net/http does when the handler set none, so that the stored
// record is complete.
func (r *recorder) final() (int, http.Header) {
	if !r.wroteHeader {
		r.WriteHeader(http.StatusOK)
	}
	h := r.sentHeader
	if _, ok := h["Content-Type"]; !ok && r.body.Len() > 0 && bodyAllowed(r.status) {
		h.Set("Content-Type", http.DetectContentType(r.body.Bytes()))
	}
	return r.status, h
}

func bodyAllowed(status int) bool {
	return status != http.StatusNoContent && status != http.StatusNotModified
}

// encodedPrefix marks, in the stored headers, a header whose values are base64: values that
// are not valid UTF-8 (obs-text) or hold a NUL byte, which jsonb would alter or refuse. No
// header name can start with it (':' is not a token character), so rows stored without
// encoded values read back unchanged.
const encodedPrefix = "base64:"

// encodeHeaders returns h as the JSON object stored in response_headers. Names net/http does
// not send (not a token) are left out, as they never reach the client either.
func encodeHeaders(h http.Header) ([]byte, error) {
	out := make(map[string][]string, len(h))
	for name, values := range h {
		if !setup.IsHTTPToken(name) {
			continue
		}
		if allText(values) {
			out[name] = values
			continue
		}
		enc := make([]string, len(values))
		for i, v := range values {
			enc[i] = base64.StdEncoding.EncodeToString([]byte(v))
		}
		out[encodedPrefix+name] = enc
	}
	return json.Marshal(out)
}

// allText reports whether jsonb keeps every value as it is (setup.IsText).
func allText(values []string) bool {
	for _, v := range values {
		if !setup.IsText(v) {
			return false
		}
	}
	return true
}

// decodeHeaders reads what encodeHeaders stored.
func decodeHeaders(stored []byte) (http.Header, error) {
	var raw map[string][]string
	if err := json.Unmarshal(stored, &raw); err != nil {
		return nil, err
	}
	h := make(http.Header, len(raw))
	for name, values := range raw {
		plain, encoded := strings.CutPrefix(name, encodedPrefix)
		if !encoded {
			h[name] = values
			continue
		}
		dec := make([]string, len(values))
		for i, v := range values {
			b, err := base64.StdEncoding.DecodeString(v)
			if err != nil {
				return nil, fmt.Errorf("header %s: %w", plain, err)
			}
			dec[i] = string(b)
		}
		h[plain] = dec
	}
	return h, nil
}
