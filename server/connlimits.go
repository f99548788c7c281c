package server

import (
	"errors"
	"io"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hiloop/hiloop/control"
	"github.com/hiloop/hiloop/metrics"
)

// ConnLimits bound what a client can hold of an HTTP listener that no
// handler, and so no rate limit, has seen yet, or that waits on the
// client; sshd's limits are their twin for the gateway. http.Server's
// ReadTimeout and WriteTimeout would count from the start of a request and
// end long polls and one-shot commands; these count only while the server
// waits on the client. Every request's body is held to the one deadline
// policy of bodyDeadline, uploads included: no handler sets read
// deadlines of its own.
type ConnLimits struct {
	// IOTimeout is how long a request's body may go without a byte, and
	// take to arrive once its handler starts reading it (longer by a
	// second for each minBodyRate bytes it brings), and how long one write
	// of an answer may wait for the client to take it; past either the
	// connection is closed. Without them a client that announces a body
	// and never sends it, or stops reading what it asked for, holds its
	// connection forever, even on the probes, which no rate limit holds.
	IOTimeout time.Duration
	// HeaderTimeout is how long a request's line and headers may take to
	// arrive; DefaultHeaderTimeout when zero.
	HeaderTimeout time.Duration
	// MaxHeaderReads and MaxHeaderReadsPerSource bound the connections
	// reading a request's headers at once, in all and from one client
	// address (control.Source), as sshd's MaxStartups does for logins:
	// each may hold up to MaxHeaderBytes for up to the header timeout
	// before anything checks who it is, so without a bound a stranger
	// opening connections holds any amount of memory. A request whose
	// line and headers come in one read (a few KiB at most, sent at once:
	// every ordinary request) holds no place, so bursts of them never
	// meet the caps; one that needs a second read holds a place from then
	// until its headers are read, and its connection is closed when the
	// caps refuse it.
	MaxHeaderReads, MaxHeaderReadsPerSource int
	Metrics                                 *metrics.Metrics

	mu       sync.Mutex
	reading  int
	bySource map[string]int
}

// Headers the API takes: a request's line and headers may hold 512 KiB, room
// for an exec command line of MaxArgvBytes in the URL, percent-encoded; 10s
// to arrive unless ConnLimits say otherwise.
const (
	MaxHeaderBytes       = 512 << 10
	DefaultHeaderTimeout = 10 * time.Second
)

// Reasons a connection is closed at a limit, as the metric
// hiloop_http_refused_connections_total labels them.
const (
	refusedHeaderReads          = "header_reads"
	refusedHeaderReadsPerSource = "header_reads_per_source"
)

// errHeaderReads closes a connection that starts a request past the caps.
var errHeaderReads = errors.New("too many connections reading request headers")

// Server is an http.Server for handler whose connections, served from the
// listener it returns, keep to the limits.
func (l *ConnLimits) Server(handler http.Handler, ln net.Listener) (*http.Server, net.Listener) {
	header := l.HeaderTimeout
	if header <= 0 {
		header = DefaultHeaderTimeout
	}
	srv := &http.Server{Handler: bodyDeadline(handler, l.IOTimeout), ReadHeaderTimeout: header,
		MaxHeaderBytes: MaxHeaderBytes, IdleTimeout: 2 * time.Minute}
	srv.ConnState = func(c net.Conn, st http.ConnState) {
		if sc, ok := c.(*servedConn); ok {
			sc.state(st)
		}
	}
	return srv, servedListener{Listener: ln, l: l}
}

// take takes a place among the connections reading headers for source;
// false past either cap.
func (l *ConnLimits) take(source string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	reason := ""
	switch {
	case l.reading >= l.MaxHeaderReads:
		reason = refusedHeaderReads
	case l.bySource[source] >= l.MaxHeaderReadsPerSource:
		reason = refusedHeaderReadsPerSource
	default:
		l.reading++
		if l.bySource == nil {
			l.bySource = map[string]int{}
		}
		l.bySource[source]++
		return true
	}
	l.Metrics.HTTPRefused(reason)
	return false
}

func (l *ConnLimits) drop(source string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.reading--
	if l.bySource[source] <= 1 {
		delete(l.bySource, source)
	} else {
		l.bySource[source]--
	}
}

// minBodyRate is the slowest a request's body may arrive on average, past
// the first IOTimeout: slow enough for a large upload over a poor link,
// and it still closes a connection whose client dribbles its body.
const minBodyRate = 16 << 10 // bytes per second

// bodyDeadline holds a request's body to arriving, on one clock that
// starts when the handler first reads it (so a handler that reads late,
// as an upload does once the sandbox is ready to take it, is not charged
// for its own wait): each read within timeout of the last, and no later
// than timeout after the first plus a second for each minBodyRate bytes
// it brought, so a body that trickles in is cut however regularly it
// trickles. Until the handler reads, the deadline is timeout after the
// headers. The deadline is lifted once the body was read to its end, so
// the server's wait for the client's next bytes (which tells it the
// client went away) has none. A handler that does not read the body
// leaves it to the server, which reads what is left (at most 256 KiB)
// before it answers, within the deadline as it then stands.
func bodyDeadline(next http.Handler, timeout time.Duration) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.ContentLength != 0 { // -1: chunked, length unknown
			b := &bodyReader{ReadCloser: r.Body, rc: http.NewResponseController(w), clock: bodyClock{timeout: timeout}}
			if b.rc.SetReadDeadline(time.Now().Add(timeout)) == nil {
				r.Body = b
			}
		}
		next.ServeHTTP(w, r)
	})
}

// bodyClock is the deadline policy of a request's body.
type bodyClock struct {
	timeout time.Duration
	start   time.Time // the handler's first read; zero before it
	read    int64     // the bytes read since
}

// begin starts the clock at the first read, and says so.
func (c *bodyClock) begin(now time.Time) bool {
	if !c.start.IsZero() {
		return false
	}
	c.start = now
	return true
}

// deadline is when the next read must have brought bytes, as of now.
func (c *bodyClock) deadline(now time.Time) time.Time {
	next, floor := now.Add(c.timeout), c.start.Add(c.timeout+time.Duration(c.read)*time.Second/minBodyRate)
	if floor.Before(next) {
		return floor
	}
	return next
}

// bodyReader moves its connection's read deadline on as the body arrives,
// and lifts it at the body's end.
type bodyReader struct {
	io.ReadCloser
	rc    *http.ResponseController
	clock bodyClock
	done  bool
}

func (b *bodyReader) Read(p []byte) (int, error) {
	if now := time.Now(); !b.done && b.clock.begin(now) {
		b.rc.SetReadDeadline(b.clock.deadline(now))
	}
	n, err := b.ReadCloser.Read(p)
	switch {
	case b.done:
	case err == io.EOF:
		b.done = true
		b.rc.SetReadDeadline(time.Time{})
	case n > 0:
		b.clock.read += int64(n)
		b.rc.SetReadDeadline(b.clock.deadline(time.Now()))
	}
	return n, err
}

// servedListener accepts servedConns.
type servedListener struct {
	net.Listener
	l *ConnLimits
}

func (sl servedListener) Accept() (net.Conn, error) {
	c, err := sl.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &servedConn{Conn: c, l: sl.l, source: control.Source(c.RemoteAddr().String())}, nil
}

// servedConn is one connection of an HTTP server, held to its limits: it
// takes a place among the connections reading headers from the second read
// of a request until the server has read its headers (the server's
// ConnState tells it), and gives each write IOTimeout to be taken by the
// client, until it is hijacked (the exec WebSocket keeps to its own
// deadlines; the server clears the connection's as it hands it over).
type servedConn struct {
	net.Conn
	l        *ConnLimits
	source   string
	hijacked atomic.Bool

	mu sync.Mutex
	// between is true while the server waits for a request or reads its
	// headers; reads counts the reads that brought bytes meanwhile.
	between bool
	reads   int
	// reading is true while the connection holds a place among those
	// reading headers.
	reading bool
}

func (c *servedConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if n > 0 && !c.startRequest() {
		c.Conn.Close()
		return 0, errHeaderReads
	}
	return n, err
}

// startRequest takes a place among the connections reading headers when
// a request's line and headers need a second read; false when the caps
// refuse it.
func (c *servedConn) startRequest() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.between || c.reading {
		return true
	}
	if c.reads++; c.reads < 2 {
		return true
	}
	if !c.l.take(c.source) {
		return false
	}
	c.reading = true
	return true
}

// state follows the server's view of the connection: between requests
// when new or idle; a request's headers read once it is active, hijacked
// or closed.
func (c *servedConn) state(st http.ConnState) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.between, c.reads = st == http.StateNew || st == http.StateIdle, 0
	if !c.between && c.reading {
		c.reading = false
		c.l.drop(c.source)
	}
	if st == http.StateHijacked {
		c.hijacked.Store(true)
	}
}

func (c *servedConn) Write(p []byte) (int, error) {
	if !c.hijacked.Load() {
		c.Conn.SetWriteDeadline(time.Now().Add(c.l.IOTimeout))
	}
	return c.Conn.Write(p)
}
