package server

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hiloop/hiloop/cluster"
	"github.com/hiloop/hiloop/control"
	"github.com/hiloop/hiloop/control/controltest"
	"github.com/hiloop/hiloop/internal/eventually"
	"github.com/hiloop/hiloop/metrics"
	"github.com/hiloop/hiloop/store"
)

// ioTestTimeout is the deadline the tests give the server, short so they
// run quickly; clientPatience is how long a client waits for the server
// to act on it, long enough for any load.
const (
	ioTestTimeout  = 200 * time.Millisecond
	clientPatience = 30 * time.Second
)

// ioServer serves h with serve's limits, the deadlines short, and reports
// each connection the server closes.
func ioServer(t *testing.T, h http.Handler, l *ConnLimits) (addr string, closed <-chan struct{}) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	if l == nil {
		l = &ConnLimits{IOTimeout: ioTestTimeout, HeaderTimeout: ioTestTimeout, MaxHeaderReads: 256, MaxHeaderReadsPerSource: 32}
	}
	srv, served := l.Server(h, ln)
	hook := srv.ConnState
	c := make(chan struct{}, 64)
	srv.ConnState = func(nc net.Conn, st http.ConnState) {
		hook(nc, st)
		if st == http.StateClosed {
			c <- struct{}{}
		}
	}
	done := make(chan struct{})
	go func() { defer close(done); srv.Serve(served) }()
	t.Cleanup(func() { srv.Close(); <-done })
	return ln.Addr().String(), c
}

func dialRaw(t *testing.T, addr, request string) net.Conn {
	t.Helper()
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	nc.SetDeadline(time.Now().Add(clientPatience))
	if _, err := io.WriteString(nc, request); err != nil {
		t.Fatal(err)
	}
	return nc
}

func waitClosed(t *testing.T, closed <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-closed:
	case <-time.After(clientPatience):
		t.Fatalf("the server did not close %s", what)
	}
}

var answerOK = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok\n") })

// TestBodyNeverSent: a request that announces a body and never sends it,
// to a handler that does not read it (a probe) or to one that does, is
// answered or closed once the body's deadline passes: the server reads
// what is left of a body before it answers, and without a deadline it
// waited forever.
func TestBodyNeverSent(t *testing.T) {
	reads := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, err := io.ReadAll(r.Body); err != nil {
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		io.WriteString(w, "read\n")
	})
	for name, h := range map[string]http.Handler{"not read": answerOK, "read": reads} {
		t.Run(name, func(t *testing.T) {
			addr, closed := ioServer(t, h, nil)
			for _, req := range []string{
				"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n",
				"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nab",
			} {
				dialRaw(t, addr, req)
				waitClosed(t, closed, "a connection whose body never came")
			}
		})
	}
}

// TestHeadersDribbled: a request whose line and headers trickle in, a
// byte at a time (slow loris), is closed once the header timeout passes,
// however regularly the bytes come.
func TestHeadersDribbled(t *testing.T) {
	addr, closed := ioServer(t, answerOK, nil)
	nc := dialRaw(t, addr, "GET / HTTP/1.1\r\nHost: x\r\n")
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		for {
			select {
			case <-stop:
				return
			case <-time.After(ioTestTimeout / 10):
			}
			if _, err := nc.Write([]byte("X-Slow: a\r\n")); err != nil {
				return
			}
		}
	}()
	waitClosed(t, closed, "a connection whose headers trickled in")
}

// TestBodyDribbled: a body that trickles in, a byte at a time, is cut once
// the deadline passes, and so is one that stops arriving halfway.
func TestBodyDribbled(t *testing.T) {
	addr, closed := ioServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n, err := io.Copy(io.Discard, r.Body)
		if err != nil {
			return
		}
		fmt.Fprintf(w, "read %d\n", n)
	}), nil)
	nc := dialRaw(t, addr, "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n")
	go func() {
		for range 1000 {
			if _, err := nc.Write([]byte("a")); err != nil {
				return
			}
			time.Sleep(20 * time.Millisecond)
		}
	}()
	waitClosed(t, closed, "a connection whose body trickled in")
	stalled := dialRaw(t, addr, "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000\r\n\r\n")
	stalled.Write(make([]byte, 600000)) // enough to earn more of the rate's allowance than clientPatience
	waitClosed(t, closed, "a connection whose body stopped arriving halfway")
}

// TestBodyKeepsMoving: a body that arrives steadily above minBodyRate is
// read whole, however long it takes past IOTimeout. The timeout here is a
// second, and the client never pauses longer than a thirtieth of it, so a
// loaded machine does not make the body look stalled.
func TestBodyKeepsMoving(t *testing.T) {
	const timeout = time.Second
	addr, _ := ioServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n, err := io.Copy(io.Discard, r.Body)
		if err != nil {
			return
		}
		fmt.Fprintf(w, "read %d\n", n)
	}), &ConnLimits{IOTimeout: timeout, MaxHeaderReads: 256, MaxHeaderReadsPerSource: 32})
	const size = 160 << 10
	steady := dialRaw(t, addr, fmt.Sprintf("POST / HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n", size))
	chunk := make([]byte, 2<<10)
	for range size / len(chunk) { // 64 KiB/s, four times minBodyRate, for 2.5 s
		if _, err := steady.Write(chunk); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Second * time.Duration(len(chunk)) / (64 << 10))
	}
	if got, err := readUntil(steady, fmt.Sprintf("read %d", size)); err != nil {
		t.Errorf("a body arriving steadily: %v after %q", err, got)
	}
}

// TestBodyClock: the body's deadline policy. Its clock starts at the
// handler's first read, not at the headers; each read must come within
// the timeout of the last, and the whole body within the timeout of the
// first read plus a second for each minBodyRate bytes read.
func TestBodyClock(t *testing.T) {
	const timeout = time.Minute
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	c := bodyClock{timeout: timeout}
	if !c.begin(t0) || c.begin(t0.Add(time.Hour)) {
		t.Fatal("the clock must start at the first read only")
	}
	check := func(what string, now, want time.Time) {
		t.Helper()
		if got := c.deadline(now); !got.Equal(want) {
			t.Errorf("%s: deadline %v after the first read, want %v", what, got.Sub(t0), want.Sub(t0))
		}
	}
	check("first read", t0, t0.Add(timeout))
	// Fast: the next read must come within the timeout.
	c.read = 10 * minBodyRate
	check("a fast body", t0.Add(time.Second), t0.Add(time.Second+timeout))
	// Slow: the bytes read earn a second each minBodyRate, no more.
	c.read = minBodyRate
	check("a trickle", t0.Add(50*time.Second), t0.Add(timeout+time.Second))
	// Past the floor the deadline is already gone.
	check("a trickle past its floor", t0.Add(2*timeout), t0.Add(timeout+time.Second))
}

// TestResponseNeverRead: a client that sends requests and never reads the
// answers (pipelined, so it costs it nothing to send them) has its
// connection closed once a write has waited the deadline.
func TestResponseNeverRead(t *testing.T) {
	big := strings.Repeat("x", 256<<10)
	addr, closed := ioServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, big) }), nil)
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	// A small receive buffer fills at once.
	nc.(*net.TCPConn).SetReadBuffer(4 << 10)
	go func() {
		for range 64 {
			if _, err := io.WriteString(nc, "GET / HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
				return
			}
		}
	}()
	waitClosed(t, closed, "a connection whose client never read")
}

// TestDeadlinesSpareLongRequests: the deadlines count only while the server
// waits on the client. A handler that answers long after the body arrived
// (a one-shot command), or with no body at all (a long poll), answers; so
// does a hijacked connection (the exec WebSocket), long after.
func TestDeadlinesSpareLongRequests(t *testing.T) {
	slow := 4 * ioTestTimeout
	var mu sync.Mutex
	var bodies []string
	addr, _ := ioServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		bodies = append(bodies, string(b))
		mu.Unlock()
		time.Sleep(slow)
		if r.URL.Path == "/hijack" {
			nc, rw, err := http.NewResponseController(w).Hijack()
			if err != nil {
				t.Error(err)
				return
			}
			defer nc.Close()
			rw.WriteString("HTTP/1.1 101 Switching Protocols\r\n\r\n")
			rw.Flush()
			time.Sleep(slow)
			nc.Write([]byte("later\n"))
			return
		}
		io.WriteString(w, "answered\n")
	}), nil)
	for _, tc := range []struct{ request, want string }{
		{"POST /run HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\n\r\nbody", "answered"},
		{"GET /wait HTTP/1.1\r\nHost: x\r\n\r\n", "answered"},
		{"GET /hijack HTTP/1.1\r\nHost: x\r\n\r\n", "later"},
	} {
		nc := dialRaw(t, addr, tc.request)
		got, err := readUntil(nc, tc.want)
		if err != nil {
			t.Errorf("%q: %v after %q", tc.request, err, got)
		}
	}
	if len(bodies) == 0 || bodies[0] != "body" {
		t.Errorf("bodies read: %q", bodies)
	}
}

// readUntil reads nc until a line equal to want, or an error.
func readUntil(nc net.Conn, want string) (string, error) {
	var seen []string
	br := bufio.NewReader(nc)
	for {
		line, err := br.ReadString('\n')
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return strings.Join(seen, ""), err
		}
		if strings.TrimRight(line, "\r\n") == want {
			return "", nil
		}
		seen = append(seen, line)
		if err != nil {
			return strings.Join(seen, ""), err
		}
	}
}

// TestHeaderReadsCapped: connections reading a request's headers over more
// than one read hold at most MaxHeaderReadsPerSource places per client
// address and MaxHeaderReads in all, each refusal counted; one more is
// closed before it can send the rest. Requests whose headers come in one
// read (every ordinary one), and connections between requests, hold none;
// a place given back is taken again.
func TestHeaderReadsCapped(t *testing.T) {
	met := metrics.New()
	l := &ConnLimits{IOTimeout: ioTestTimeout, MaxHeaderReads: 3, MaxHeaderReadsPerSource: 2, Metrics: met}
	addr, _ := ioServer(t, answerOK, l)
	from := func(source, request string) net.Conn {
		t.Helper()
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(source)}}
		nc, err := d.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { nc.Close() })
		nc.SetDeadline(time.Now().Add(clientPatience))
		if _, err := io.WriteString(nc, request); err != nil {
			t.Fatal(err)
		}
		return nc
	}
	answered := func(nc net.Conn) bool {
		t.Helper()
		_, err := readUntil(nc, "ok")
		return err == nil
	}
	refusals := func() float64 {
		return counter(t, met, "hiloop_http_refused_connections_total", refusedHeaderReads) +
			counter(t, met, "hiloop_http_refused_connections_total", refusedHeaderReadsPerSource)
	}
	// dribble starts a request from source and sends its headers a byte at
	// a time until the server takes a place for it (true) or refuses it.
	dribble := func(source string) (net.Conn, bool) {
		t.Helper()
		l.mu.Lock()
		places := l.reading
		l.mu.Unlock()
		refused := refusals()
		nc := from(source, "GET / HTTP/1.1\r\nHost: x\r\nX-Slow: ")
		took := false
		eventually.True(t, "the server to take or refuse a place for a request from "+source, func() bool {
			nc.Write([]byte("a"))
			l.mu.Lock()
			took = l.reading > places
			l.mu.Unlock()
			return took || refusals() > refused
		})
		return nc, took
	}

	// A burst of ordinary requests from one address, on as many
	// connections as the caps allow three times over, all answered.
	var burst []net.Conn
	for range 9 {
		burst = append(burst, from("127.0.0.1", "GET / HTTP/1.1\r\nHost: x\r\n\r\n"))
	}
	for _, nc := range burst {
		if !answered(nc) {
			t.Fatal("a request whose headers came at once was not answered")
		}
	}
	var held []net.Conn
	hold := func(source string) {
		t.Helper()
		nc, ok := dribble(source)
		if !ok {
			t.Fatalf("a request from %s within the caps was refused", source)
		}
		held = append(held, nc)
	}
	hold("127.0.0.1")
	hold("127.0.0.1")
	if _, ok := dribble("127.0.0.1"); ok {
		t.Error("a third connection from one address reading headers took a place")
	}
	hold("127.0.0.2")
	if _, ok := dribble("127.0.0.3"); ok {
		t.Error("a fourth connection reading headers in all took a place")
	}
	for reason, want := range map[string]float64{refusedHeaderReads: 1, refusedHeaderReadsPerSource: 1} {
		if got := counter(t, met, "hiloop_http_refused_connections_total", reason); got != want {
			t.Errorf("refused %s: %v, want %v", reason, got, want)
		}
	}
	// A held connection that finishes its headers gives its place back.
	io.WriteString(held[0], "\r\n\r\n")
	if !answered(held[0]) {
		t.Fatal("a held request, finished, was not answered")
	}
	if _, ok := dribble("127.0.0.3"); !ok {
		t.Error("a request after a place was given back was refused")
	}
}

// counter is the value of a counter of met with label reason.
func counter(t *testing.T, met *metrics.Metrics, name, reason string) float64 {
	t.Helper()
	rec := httptest.NewRecorder()
	met.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	prefix := name + `{reason="` + reason + `"} `
	for _, line := range strings.Split(rec.Body.String(), "\n") {
		if v, ok := strings.CutPrefix(line, prefix); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatal(err)
			}
			return f
		}
	}
	return 0
}

// TestUploadDeadline: an upload keeps to the listener's one deadline
// policy, whose clock starts when the sandbox is ready to read the body:
// an upload whose command starts long after the body arrived (a sandbox
// waking) is written whole, and one whose body stops halfway is cut,
// leaving no file behind.
func TestUploadDeadline(t *testing.T) {
	dir := t.TempDir()
	ts := newTestServer(t, &controltest.Cluster{}, func(so *Options, co *control.Options) {
		run := localExec(os.Getenv("PATH"), nil).Run
		co.Exec = controltest.Exec{Run: func(ctx context.Context, req cluster.ExecRequest) (cluster.ExitStatus, error) {
			// The command starts well past the deadline the headers set.
			time.Sleep(3 * ioTestTimeout)
			return run(ctx, req)
		}}
	})
	id := ts.create(`{"image":"busybox"}`)
	ts.db.Observe(context.Background(), id, store.Observation{State: store.StateRunning})
	addr, closed := ioServer(t, ts.srv, nil)
	put := func(name string, size int, body []byte) net.Conn {
		return dialRaw(t, addr, fmt.Sprintf("PUT /v1/sandboxes/%s/files?path=%s HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nContent-Length: %d\r\n\r\n%s",
			id, filepath.Join(dir, name), ts.token, size, body))
	}

	whole := bytes.Repeat([]byte("w"), 64<<10)
	nc := put("whole", len(whole), whole)
	if got, err := readUntil(nc, "HTTP/1.1 200 OK"); err != nil {
		t.Fatalf("an upload read late: %v after %q", err, got)
	}
	if got, err := os.ReadFile(filepath.Join(dir, "whole")); err != nil || !bytes.Equal(got, whole) {
		t.Errorf("the upload read late wrote %d bytes (%v), want %d", len(got), err, len(whole))
	}

	put("stalled", 1<<20, bytes.Repeat([]byte("s"), 64<<10))
	waitClosed(t, closed, "an upload whose body stopped halfway")
	eventually.True(t, "the stalled upload's temporary file removed", func() bool {
		entries, _ := os.ReadDir(dir)
		return len(entries) == 1
	})
	if _, err := os.Stat(filepath.Join(dir, "stalled")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a stalled upload left its file: %v", err)
	}
}
