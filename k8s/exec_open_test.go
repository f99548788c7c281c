package k8s_test

import (
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/rest"

	"github.com/hiloop/hiloop/cluster"
	"github.com/hiloop/hiloop/internal/hungtest"
	"github.com/hiloop/hiloop/k8s"
)

// TestExecDeadlineBeforeTheStreamOpens: when the caller's deadline passes
// while the stream is still being set up (against an API server that
// accepts the connection and never answers, as one stopped with SIGSTOP
// does), no command ran: the answer is a *ConnectError, not the bare
// deadline of a command that ran too long. A command whose stream is open
// ends with the bare context error when its context ends.
func TestExecDeadlineBeforeTheStreamOpens(t *testing.T) {
	silent, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	go func() {
		var held []net.Conn // accepted, never answered
		defer func() {
			for _, c := range held {
				c.Close()
			}
		}()
		for {
			c, err := silent.Accept()
			if err != nil {
				return
			}
			held = append(held, c)
		}
	}()
	base := "http://" + silent.Addr().String()
	req := cluster.ExecRequest{Command: []string{"true"}, Stdout: io.Discard, Stderr: io.Discard, ConnectTimeout: time.Minute}
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	_, err = k8s.Exec(ctx, &rest.Config{Host: base}, execURL(base, req), req)
	var ce *cluster.ConnectError
	if !errors.As(err, &ce) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Exec = %v (%T), want a ConnectError wrapping the deadline", err, err)
	}

	for _, tr := range transports {
		t.Run("open "+tr.name, func(t *testing.T) {
			cfg, base := server(t, tr)
			// The context ends only once the command runs: it wrote.
			opened := make(chan struct{})
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			// The command writes until its writes fail, so it ends once the
			// stream is gone rather than outliving the test.
			req := cluster.ExecRequest{Command: []string{"sh", "-c", "while echo started; do sleep 0.1; done"}, Stderr: io.Discard}
			req.Stdout = writerFunc(func(p []byte) (int, error) {
				select {
				case <-opened:
				default:
					close(opened)
				}
				return len(p), nil
			})
			go func() {
				<-opened
				cancel()
			}()
			_, err := k8s.Exec(ctx, cfg, execURL(base, req), req)
			var ce *cluster.ConnectError
			if errors.As(err, &ce) || !errors.Is(err, context.Canceled) {
				t.Fatalf("Exec = %v (%T), want the bare context error of a command that ran", err, err)
			}
		})
	}
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

// TestExecSetUpEndsAtItsDeadline: whatever step of a stream's set-up an
// API server hangs in, the exec answers once the set-up's deadline passes,
// with a *ConnectError (no command ran), while the server still hangs;
// and a WebSocket handshake that failed without an answer is no refusal,
// so it does not fall back to SPDY (which would wait on the server
// again). The caller's own context is far longer than the deadline, so
// only the set-up's deadline can end these.
func TestExecSetUpEndsAtItsDeadline(t *testing.T) {
	const refusal = "HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n"
	spdyOnly := func(after string) func(int, string) (string, bool) {
		return func(_ int, line string) (string, bool) {
			if strings.HasPrefix(line, "GET ") { // the WebSocket handshake
				return refusal, false
			}
			return after, false
		}
	}
	for _, tc := range []struct {
		name   string
		scheme string
		answer func(n int, line string) (string, bool)
		// deadline says the set-up ended at its deadline, not at an
		// error of its own.
		deadline bool
	}{
		{"no TLS handshake", "https", nil, true},
		{"no answer to the upgrade", "http", func(int, string) (string, bool) { return "", false }, true},
		{"SPDY upgrade unanswered", "http", spdyOnly(""), true},
		{"SPDY streams unanswered", "http", spdyOnly("HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: SPDY/3.1\r\n" +
			"X-Stream-Protocol-Version: v4.channel.k8s.io\r\n\r\n"), true},
		{"WebSocket handshake dropped", "http", func(n int, _ string) (string, bool) { return "", n == 0 }, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			base := tc.scheme + "://" + hungtest.Server(t, tc.answer)
			cfg := &rest.Config{Host: base, TLSClientConfig: rest.TLSClientConfig{Insecure: tc.scheme == "https"}}
			// A set-up that must end at its deadline gets a short one; one
			// that must end at its own error gets a long one, which a
			// loaded machine's slow dial cannot reach first.
			timeout := 200 * time.Millisecond
			if !tc.deadline {
				timeout = 30 * time.Second
			}
			req := cluster.ExecRequest{Command: []string{"true"}, Stdout: io.Discard, Stderr: io.Discard, ConnectTimeout: timeout}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
			defer cancel()
			done := make(chan error, 1)
			go func() {
				_, err := k8s.Exec(ctx, cfg, execURL(base, req), req)
				done <- err
			}()
			var err error
			select {
			case err = <-done:
			case <-time.After(time.Minute): // a hang, not a slow answer
				t.Fatal("the exec still waits on the hung server")
			}
			var ce *cluster.ConnectError
			if !errors.As(err, &ce) || errors.Is(err, context.DeadlineExceeded) != tc.deadline {
				t.Fatalf("Exec = %v (%T), want a ConnectError (at the set-up's deadline: %v)", err, err, tc.deadline)
			}
		})
	}
}
