package httpidem

import (
	"crypto/sha256"
	"encoding/binary"
	"io"
	"net/http"
	"strconv"
)

func (m *Middleware) readBody(w http.ResponseWriter, r *http.Request) ([]byte, error) {
	if r.Body == nil || r.Body == http.NoBody {
		return []byte{}, nil
	}
	defer r.Body.Close()
	return io.ReadAll(http.MaxBytesReader(w, r.Body, m.config.MaxRequestBytes))
}

// fingerprint identifies the request: method, path and query, the configured headers and the
// body, length-prefixed so that no two different requests encode alike.
func (m *Middleware) fingerprint(r *http.Request, body []byte) []byte {
	h := sha256.New()
	write := func(s []byte) {
		var n [binary.MaxVarintLen64]byte
		_, _ = h.Write(n[:binary.PutUvarint(n[:], uint64(len(s)))])
		_, _ = h.Write(s)
	}
	write([]byte("watermill-once/httpidem/v1"))
	write([]byte(r.Method))
	write([]byte(r.URL.RequestURI()))
	for _, name := range m.fpHdrs {
		write([]byte(name))
		vals := r.Header.Values(name)
		write([]byte(strconv.Itoa(len(vals))))
		for _, v := range vals {
			write([]byte(v))
		}
	}
	write(body)
	return h.Sum(nil)
}

func (m *Middleware) lockKey(req *request) int64 {
	h := sha256.New()
	for _, s := range []string{"watermill-once/httpidem/lock", m.config.Schema, req.scope, req.key} {
		var n [binary.MaxVarintLen64]byte
		_, _ = h.Write(n[:binary.PutUvarint(n[:], uint64(len(s)))])
		_, _ = h.Write([]byte(s))
	}
	return int64(binary.BigEndian.Uint64(h.Sum(nil)[:8]))
}
