package k8s_test

// Exact exit codes, tested against the real server code kube-apiserver and
// the kubelet run: the kubelet's SPDY exec server (cri-streaming ServeExec)
// with an executor that runs real local processes, and the API server's v5
// WebSocket-to-SPDY translator in front of it.

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/creack/pty"
	"github.com/google/go-cmp/cmp"
	"k8s.io/apiserver/pkg/util/proxy"
	"k8s.io/client-go/rest"
	criremote "k8s.io/cri-streaming/pkg/streaming/remotecommand"
	utilexec "k8s.io/utils/exec"

	"github.com/hiloop/hiloop/cluster"
	"github.com/hiloop/hiloop/internal/e2e"
	"github.com/hiloop/hiloop/internal/eventually"
	"github.com/hiloop/hiloop/k8s"
)

// localExecutor runs the command as a local process, as a container runtime
// would inside the container, and returns the kubelet's kind of exit error.
type localExecutor struct{}

func (localExecutor) ExecInContainer(ctx context.Context, _, _, _ string, cmd []string, in io.Reader, out, errw io.WriteCloser,
	tty bool, resize <-chan criremote.TerminalSize, _ time.Duration) error {
	c := exec.CommandContext(ctx, cmd[0], cmd[1:]...)
	var err error
	if tty {
		f, perr := pty.Start(c)
		if perr != nil {
			return perr
		}
		// The terminal is closed only once no resize can touch it.
		var mu sync.Mutex
		closed := false
		defer func() {
			mu.Lock()
			defer mu.Unlock()
			closed = true
			f.Close()
		}()
		go func() {
			for sz := range resize {
				mu.Lock()
				if !closed {
					pty.Setsize(f, &pty.Winsize{Rows: sz.Height, Cols: sz.Width})
				}
				mu.Unlock()
			}
		}()
		if in != nil {
			go io.Copy(f, in)
		}
		io.Copy(out, f) // ends with EIO when the process exits
		err = c.Wait()
	} else {
		c.Stdin, c.Stdout, c.Stderr = in, out, errw
		err = c.Run()
	}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return &utilexec.ExitErrorWrapper{ExitError: ee}
	}
	return err
}

// kubelet serves pods/exec the way the kubelet does, reading the API
// server's PodExecOptions parameters.
func kubelet() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		opts := &criremote.Options{Stdin: q.Get("stdin") == "true", Stdout: q.Get("stdout") == "true",
			Stderr: q.Get("stderr") == "true", TTY: q.Get("tty") == "true"}
		criremote.ServeExec(w, r, localExecutor{}, "pod", "uid", "workload", q["command"], opts, 0, 30*time.Second,
			[]string{"v4.channel.k8s.io", "v3.channel.k8s.io", "v2.channel.k8s.io", "channel.k8s.io"})
	})
}

// apiserver serves WebSocket requests through the API server's stream
// translator to the kubelet handler, and SPDY requests straight to it, as
// kube-apiserver chains them.
func apiserver(t *testing.T, upstream *httptest.Server) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !strings.EqualFold(r.Header.Get("Upgrade"), "websocket") {
			kubelet().ServeHTTP(w, r)
			return
		}
		q := r.URL.Query()
		loc, _ := url.Parse(upstream.URL + r.URL.Path + "?" + r.URL.RawQuery)
		proxy.NewStreamTranslatorHandler(loc, http.DefaultTransport, 0, proxy.Options{Stdin: q.Get("stdin") == "true",
			Stdout: q.Get("stdout") == "true", Stderr: q.Get("stderr") == "true", Tty: q.Get("tty") == "true"}).ServeHTTP(w, r)
	})
}

type transport struct {
	name string
	// websocket says whether the client may upgrade to WebSocket; when not,
	// the server refuses the upgrade and the client falls back to SPDY.
	websocket bool
}

var transports = []transport{{"websocket", true}, {"spdy", false}}

// server starts the chain for one transport and returns the exec URL base.
func server(t *testing.T, tr transport) (*rest.Config, string) {
	up := httptest.NewServer(kubelet())
	t.Cleanup(up.Close)
	h := apiserver(t, up)
	if !tr.websocket {
		inner := h
		h = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if strings.EqualFold(r.Header.Get("Upgrade"), "websocket") {
				http.Error(w, "websocket not supported here", http.StatusBadRequest)
				return
			}
			inner.ServeHTTP(w, r)
		})
	}
	front := httptest.NewServer(h)
	t.Cleanup(front.Close)
	return &rest.Config{Host: front.URL}, front.URL
}

func execURL(base string, req cluster.ExecRequest) *url.URL {
	q := url.Values{"command": req.Command}
	q.Set("stdin", fmt.Sprint(req.Stdin != nil))
	q.Set("stdout", fmt.Sprint(req.Stdout != nil))
	q.Set("stderr", fmt.Sprint(req.Stderr != nil && !req.TTY))
	q.Set("tty", fmt.Sprint(req.TTY))
	u, _ := url.Parse(base + "/api/v1/namespaces/ns/pods/pod/exec?" + q.Encode())
	return u
}

func run(t *testing.T, tr transport, req cluster.ExecRequest) (cluster.ExitStatus, error) {
	t.Helper()
	cfg, base := server(t, tr)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	return k8s.Exec(ctx, cfg, execURL(base, req), req)
}

func TestExecExitCodes(t *testing.T) {
	for _, tr := range transports {
		for _, code := range []int{0, 1, 42, 255} {
			t.Run(fmt.Sprintf("%s/%d", tr.name, code), func(t *testing.T) {
				var out bytes.Buffer
				st, err := run(t, tr, cluster.ExecRequest{Command: []string{"sh", "-c", fmt.Sprintf("echo hi; exit %d", code)}, Stdout: &out, Stderr: io.Discard})
				if err != nil {
					t.Fatal(err)
				}
				if st.Code != code || st.Signal != "" || out.String() != "hi\n" {
					t.Fatalf("got %+v %q, want code %d", st, out.String(), code)
				}
			})
		}
	}
}

func TestExecSignalDeath(t *testing.T) {
	for _, tr := range transports {
		t.Run(tr.name, func(t *testing.T) {
			st, err := run(t, tr, cluster.ExecRequest{Command: []string{"sh", "-c", "kill -KILL $$"}, Stdout: io.Discard, Stderr: io.Discard})
			if err != nil {
				t.Fatal(err)
			}
			if st.Signal != "killed" || st.Code != 137 {
				t.Fatalf("got %+v, want killed/137", st)
			}
		})
	}
}

// cutProxy forwards TCP to target and cuts every connection once more than
// after bytes went back to the client.
func cutProxy(t *testing.T, target string, after int64) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				u, err := net.Dial("tcp", target)
				if err != nil {
					c.Close()
					return
				}
				go io.Copy(u, c)
				var n atomic.Int64
				buf := make([]byte, 4096)
				for {
					k, err := u.Read(buf)
					if k > 0 {
						c.Write(buf[:k])
						if n.Add(int64(k)) > after {
							break
						}
					}
					if err != nil {
						break
					}
				}
				c.Close()
				u.Close()
			}()
		}
	}()
	return ln.Addr().String()
}

func TestExecConnectionCutIsNeverExitZero(t *testing.T) {
	for _, tr := range transports {
		t.Run(tr.name, func(t *testing.T) {
			_, base := server(t, tr)
			addr := cutProxy(t, strings.TrimPrefix(base, "http://"), 64<<10)
			req := cluster.ExecRequest{Command: []string{"sh", "-c", "yes hiloop | head -c 50000000; exit 0"}, Stdout: io.Discard, Stderr: io.Discard}
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			st, err := k8s.Exec(ctx, &rest.Config{Host: "http://" + addr}, execURL("http://"+addr, req), req)
			if err == nil {
				t.Fatalf("cut stream reported %+v with no error", st)
			}
			if !errors.Is(err, cluster.ErrNoStatus) {
				t.Fatalf("want ErrNoStatus, got %v", err)
			}
		})
	}
}

// orderedWriter checks the bytes of `seq 1 N` arrive complete and in order
// without keeping them.
type hashWriter struct {
	h interface {
		io.Writer
		Sum([]byte) []byte
	}
	n int64
}

func (w *hashWriter) Write(p []byte) (int, error) {
	w.n += int64(len(p))
	return w.h.Write(p)
}

func TestExecLargeOutputCompleteAndInOrder(t *testing.T) {
	const size = 50 << 20
	want := sha256.New()
	expected, err := exec.Command("sh", "-c", fmt.Sprintf("seq 1 20000000 | head -c %d", size)).Output()
	if err != nil {
		t.Fatal(err)
	}
	want.Write(expected)
	for _, tr := range transports {
		t.Run(tr.name, func(t *testing.T) {
			got := &hashWriter{h: sha256.New()}
			st, err := run(t, tr, cluster.ExecRequest{Command: []string{"sh", "-c", fmt.Sprintf("seq 1 20000000 | head -c %d", size)}, Stdout: got, Stderr: io.Discard})
			if err != nil || st.Code != 0 {
				t.Fatalf("%+v %v", st, err)
			}
			if got.n != size || !bytes.Equal(got.h.Sum(nil), want.Sum(nil)) {
				t.Fatalf("got %d bytes (hash match %v), want %d", got.n, bytes.Equal(got.h.Sum(nil), want.Sum(nil)), size)
			}
		})
	}
}

func TestExecStdinEOF(t *testing.T) {
	for _, tr := range transports {
		t.Run(tr.name, func(t *testing.T) {
			var out bytes.Buffer
			in := strings.NewReader("line one\nline two\n")
			// wc only finishes, and prints, once stdin reaches EOF.
			st, err := run(t, tr, cluster.ExecRequest{Command: []string{"wc", "-l"}, Stdin: in, Stdout: &out, Stderr: io.Discard})
			if err != nil || st.Code != 0 {
				t.Fatalf("%+v %v", st, err)
			}
			if strings.TrimSpace(out.String()) != "2" {
				t.Fatalf("wc -l printed %q", out.String())
			}
		})
	}
}

func TestExecTTYWithResize(t *testing.T) {
	for _, tr := range transports {
		t.Run(tr.name, func(t *testing.T) {
			resize := make(chan cluster.TerminalSize, 2)
			resize <- cluster.TerminalSize{Width: 80, Height: 24}
			stdinR, stdinW := io.Pipe()
			// The caller owns stdin and the resizes: the exec's goroutines
			// that copy them end when they end.
			defer close(resize)
			defer stdinW.Close()
			out := &e2e.SyncBuffer{}
			done := make(chan struct{})
			var st cluster.ExitStatus
			var err error
			go func() {
				defer close(done)
				// Each input line prints the terminal size; "q" ends it.
				st, err = run(t, tr, cluster.ExecRequest{Command: []string{"sh", "-c", `while read x; do stty size; [ "$x" = q ] && exit 7; done`},
					Stdin: stdinR, Stdout: out, TTY: true, Resize: resize})
			}()
			poke := func(size string) {
				eventually.True(t, "the terminal size "+size, func() bool {
					stdinW.Write([]byte("a\r"))
					time.Sleep(50 * time.Millisecond)
					return strings.Contains(out.String(), size)
				})
			}
			poke("24 80")
			resize <- cluster.TerminalSize{Width: 132, Height: 50}
			poke("50 132")
			stdinW.Write([]byte("q\r"))
			<-done
			if err != nil || st.Code != 7 {
				t.Fatalf("%+v %v", st, err)
			}
			if !strings.Contains(out.String(), "50 132") {
				t.Fatalf("resize not seen by the terminal: %q", out.String())
			}
		})
	}
}

// TestExecerResumesTLS: an Execer's streams after the first resume the TLS
// session of the first instead of a whole handshake, and each still runs
// its command to its exit code.
func TestExecerResumesTLS(t *testing.T) {
	up := httptest.NewServer(kubelet())
	t.Cleanup(up.Close)
	inner := apiserver(t, up)
	var mu sync.Mutex
	var resumed []bool
	front := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		resumed = append(resumed, r.TLS.DidResume)
		mu.Unlock()
		inner.ServeHTTP(w, r)
	}))
	t.Cleanup(front.Close)
	ca := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: front.Certificate().Raw})
	clients, err := k8s.NewClients(&rest.Config{Host: front.URL, TLSClientConfig: rest.TLSClientConfig{CAData: ca}})
	if err != nil {
		t.Fatal(err)
	}
	e := &k8s.Execer{Clients: clients, Namespace: "ns"}
	for code := range 3 {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		st, err := e.Exec(ctx, "sbx_a", cluster.ExecRequest{Command: []string{"sh", "-c", fmt.Sprintf("exit %d", code)}, Stdout: io.Discard, Stderr: io.Discard})
		cancel()
		if err != nil || st.Code != code {
			t.Fatalf("exec %d: %+v %v", code, st, err)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if diff := cmp.Diff([]bool{false, true, true}, resumed); diff != "" {
		t.Fatalf("TLS sessions resumed (-want +got):\n%s", diff)
	}
}
