package main

import (
	"bufio"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"
	"time"
)

// ioTestTimeout is the deadline the tests give the server, short so they
// run quickly; clientPatience is how long a client waits for the server
// to act on it, long enough for any load.
const (
	ioTestTimeout  = 200 * time.Millisecond
	clientPatience = 30 * time.Second
)

// ioServer serves h with serve's deadlines and reports each connection the
// server closes.
func ioServer(t *testing.T, h http.Handler) (addr string, closed <-chan struct{}) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 2 * time.Minute}
	served := ioDeadlines(srv, ln, ioTestTimeout)
	hook := srv.ConnState
	c := make(chan struct{}, 16)
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
			addr, closed := ioServer(t, h)
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

// TestResponseNeverRead: a client that sends requests and never reads the
// answers (pipelined, so it costs it nothing to send them) has its
// connection closed once a write has waited the deadline.
func TestResponseNeverRead(t *testing.T) {
	big := strings.Repeat("x", 256<<10)
	addr, closed := ioServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, big) }))
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
	}))
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

// TestHTTPIOTimeoutFlag: the deadlines are a flag with a default and an
// environment variable; zero or negative is refused naming the flag.
func TestHTTPIOTimeoutFlag(t *testing.T) {
	if s, err := parseServe(t); err != nil || s.HTTPIOTimeout != time.Minute {
		t.Errorf("default: %v, %v; want 1m", s.HTTPIOTimeout, err)
	}
	t.Setenv("HILOOP_HTTP_IO_TIMEOUT", "7s")
	if s, err := parseServe(t); err != nil || s.HTTPIOTimeout != 7*time.Second {
		t.Errorf("HILOOP_HTTP_IO_TIMEOUT=7s: %v, %v", s.HTTPIOTimeout, err)
	}
	for _, v := range []string{"0s", "-1s"} {
		if _, err := parseServe(t, "--http-io-timeout="+v); err == nil || !strings.Contains(err.Error(), "--http-io-timeout:") {
			t.Errorf("--http-io-timeout=%s: %v, want refused naming the flag", v, err)
		}
	}
}
