package server

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"net"
	"net/http"
	"regexp"
	"sync"
	"time"
)

// reqInfo is what the access log says of one request; handlers fill in what
// only they learn (the route, the caller's organization).
type reqInfo struct {
	id    string
	route string
	org   string
	// quiet: no access-log line (a rate-limited refusal; see rateLimited).
	quiet bool
	// noWait: a long poll past the key's WaitsPerKey answers at once.
	noWait bool
}

type infoKey struct{}

func info(r *http.Request) *reqInfo {
	if i, ok := r.Context().Value(infoKey{}).(*reqInfo); ok {
		return i
	}
	return &reqInfo{}
}

// RequestIDHeader carries a request's id both ways.
const RequestIDHeader = "X-Request-Id"

// clientID is what a client may choose as its request id. It is compiled
// on first use: the CLI is the same binary and initializes this package
// before every command.
var clientID = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[A-Za-z0-9._-]{1,64}$`) })

func newRequestID() string {
	b := make([]byte, 8)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// statusWriter records the status and size of a response. It passes
// Hijack on, which the exec WebSocket needs, and Flush.
type statusWriter struct {
	http.ResponseWriter
	status int
	bytes  int64
}

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	n, err := w.ResponseWriter.Write(b)
	w.bytes += int64(n)
	return n, err
}

func (w *statusWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	h, ok := w.ResponseWriter.(http.Hijacker)
	if !ok {
		return nil, nil, errors.New("hijack not supported")
	}
	w.status = http.StatusSwitchingProtocols
	return h.Hijack()
}

// Unwrap lets http.ResponseController reach the connection under the
// access log's writer (a process's output is flushed as it comes).
func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

func (w *statusWriter) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// logged wraps the API with request ids and one access-log line per
// request: method, route pattern (never the path, which holds ids),
// status, duration, organization and request id. Nothing of the request's
// headers or body is logged, so no key or token reaches the log.
func (s *Server) logged(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		id := r.Header.Get(RequestIDHeader)
		if !clientID().MatchString(id) {
			id = newRequestID()
		}
		ri := &reqInfo{id: id}
		w.Header().Set(RequestIDHeader, id)
		sw := &statusWriter{ResponseWriter: w}
		// Deferred, so an answer cut on purpose (a download that broke,
		// see getFile) is logged too.
		defer func() {
			route := ri.route
			if route == "" {
				route = "unmatched"
			}
			s.o.Metrics.Request(route, sw.status, time.Since(start))
			if ri.quiet {
				return
			}
			s.log.Info("request", "method", r.Method, "route", route, "status", sw.status, "bytes", sw.bytes,
				"duration_ms", float64(time.Since(start).Microseconds())/1000, "org", ri.org, "request_id", id)
		}()
		next.ServeHTTP(sw, r.WithContext(context.WithValue(r.Context(), infoKey{}, ri)))
	})
}
