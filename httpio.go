package main

import (
	"io"
	"net"
	"net/http"
	"sync/atomic"
	"time"
)

// ioDeadlines gives every connection srv serves from ln a deadline at each
// step that http.Server leaves open without cutting long requests short,
// and returns the listener to serve: a request's body must arrive within
// timeout of its headers, and each write of a response must be taken by
// the client within timeout. Without them a client that announces a body
// and never sends it, or stops reading what it asked for, holds its
// connection and goroutine forever, even on the probes, which no rate
// limit holds. http.Server's ReadTimeout and WriteTimeout would count from
// the start of the request and end long polls and one-shot commands; these
// count only while the server waits on the client. A hijacked connection
// (the exec WebSocket) keeps to its own deadlines.
func ioDeadlines(srv *http.Server, ln net.Listener, timeout time.Duration) net.Listener {
	srv.Handler = bodyDeadline(srv.Handler, timeout)
	srv.ConnState = func(c net.Conn, st http.ConnState) {
		// The server clears the connection's deadlines as it hands it
		// over.
		if wc, ok := c.(*writeDeadlineConn); ok && st == http.StateHijacked {
			wc.hijacked.Store(true)
		}
	}
	return writeDeadlineListener{Listener: ln, timeout: timeout}
}

// bodyDeadline gives a request's body timeout to arrive, from when its
// headers were read, and lifts the deadline once the body was read to its
// end, so the server's wait for the client's next bytes (which tells it the
// client went away) has none. A handler that does not read the body leaves
// it to the server, which reads what is left before it answers, within the
// same deadline.
func bodyDeadline(next http.Handler, timeout time.Duration) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.ContentLength != 0 { // -1: chunked, length unknown
			rc := http.NewResponseController(w)
			if rc.SetReadDeadline(time.Now().Add(timeout)) == nil {
				r.Body = &liftAtEOF{ReadCloser: r.Body, lift: func() { rc.SetReadDeadline(time.Time{}) }}
			}
		}
		next.ServeHTTP(w, r)
	})
}

// liftAtEOF calls lift once its body has been read to the end.
type liftAtEOF struct {
	io.ReadCloser
	lift func()
	done bool
}

func (b *liftAtEOF) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err == io.EOF && !b.done {
		b.done = true
		b.lift()
	}
	return n, err
}

// writeDeadlineListener accepts writeDeadlineConns.
type writeDeadlineListener struct {
	net.Listener
	timeout time.Duration
}

func (l writeDeadlineListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &writeDeadlineConn{Conn: c, timeout: l.timeout}, nil
}

// writeDeadlineConn gives each write timeout to be taken by the client,
// until the connection is hijacked.
type writeDeadlineConn struct {
	net.Conn
	timeout  time.Duration
	hijacked atomic.Bool
}

func (c *writeDeadlineConn) Write(p []byte) (int, error) {
	if !c.hijacked.Load() {
		c.Conn.SetWriteDeadline(time.Now().Add(c.timeout))
	}
	return c.Conn.Write(p)
}
