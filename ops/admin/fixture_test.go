package admin_test

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/wmonce/watermill-once/ops/admin"
)

// The fixture (a schema the real components filled) is internal/admintest's, shared with
// e2e/adminbrowser; the HTTP helpers below are the API tests' own.

// response is a decoded API answer.
type response struct {
	status int
	header http.Header
	body   []byte
}

func (r response) decode(t *testing.T, v any) {
	t.Helper()
	require.NoError(t, json.Unmarshal(r.body, v), string(r.body))
}

func (r response) errorText(t *testing.T) string {
	t.Helper()
	var e admin.ErrorBody
	r.decode(t, &e)
	require.NotEmpty(t, e.Error)
	return e.Error
}

func get(t *testing.T, url string) response {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	require.NoError(t, err)
	return send(t, req)
}

// send sends req and reads the answer.
func send(t *testing.T, req *http.Request) response {
	t.Helper()
	res, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer res.Body.Close()
	body, err := io.ReadAll(res.Body)
	require.NoError(t, err)
	return response{status: res.StatusCode, header: res.Header, body: body}
}

// post sends body as JSON with the write header, unless headers says otherwise.
func post(t *testing.T, url string, body any, headers map[string]string) response {
	t.Helper()
	var buf bytes.Buffer
	if s, ok := body.(string); ok {
		buf.WriteString(s)
	} else {
		require.NoError(t, json.NewEncoder(&buf).Encode(body))
	}
	req, err := http.NewRequest(http.MethodPost, url, &buf)
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(admin.WriteHeader, "1")
	for k, v := range headers {
		if v == "" {
			req.Header.Del(k)
		} else {
			req.Header.Set(k, v)
		}
	}
	return send(t, req)
}

// jsonAt returns the value at path (object keys and array indexes) in the JSON body, and
// whether it is there: a null value is there, a missing field is not.
func jsonAt(t *testing.T, body []byte, path ...any) (any, bool) {
	t.Helper()
	var v any
	require.NoError(t, json.Unmarshal(body, &v), string(body))
	for _, p := range path {
		switch k := p.(type) {
		case string:
			m, ok := v.(map[string]any)
			require.True(t, ok, "%v: not an object at %q in %s", path, k, body)
			if v, ok = m[k]; !ok {
				return nil, false
			}
		case int:
			a, ok := v.([]any)
			require.True(t, ok && k < len(a), "%v: no element %d in %s", path, k, body)
			v = a[k]
		}
	}
	return v, true
}
