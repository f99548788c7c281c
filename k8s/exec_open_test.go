package k8s_test

import (
	"context"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"k8s.io/client-go/rest"

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
	req := k8s.ExecRequest{Command: []string{"true"}, Stdout: io.Discard, Stderr: io.Discard, ConnectTimeout: time.Minute}
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	_, err = k8s.Exec(ctx, &rest.Config{Host: base}, execURL(base, req), req)
	var ce *k8s.ConnectError
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
			req := k8s.ExecRequest{Command: []string{"sh", "-c", "echo started; exec sleep 30"}, Stderr: io.Discard}
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
			var ce *k8s.ConnectError
			if errors.As(err, &ce) || !errors.Is(err, context.Canceled) {
				t.Fatalf("Exec = %v (%T), want the bare context error of a command that ran", err, err)
			}
		})
	}
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }
