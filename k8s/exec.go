package k8s

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"regexp"
	"strconv"
	"sync"
	"syscall"
	"time"

	gwebsocket "github.com/gorilla/websocket"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/httpstream"
	utilnet "k8s.io/apimachinery/pkg/util/net"
	"k8s.io/apimachinery/pkg/util/remotecommand"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/transport"
	"k8s.io/client-go/transport/spdy"
	"k8s.io/client-go/transport/websocket"
	streamhttp "k8s.io/streaming/pkg/httpstream"

	"github.com/hiloop/hiloop/cluster"
)

// copyBuffer is the size of the chunks exec output is copied in.
const copyBuffer = 256 << 10

// ExecURL is the pods/exec URL of a container: the workload's, or the
// session helper's for a request with Helper.
func (c *Clients) ExecURL(namespace, pod string, req cluster.ExecRequest) *url.URL {
	container := WorkloadContainer
	if req.Helper {
		container = HelperContainer
	}
	return c.Kube.CoreV1().RESTClient().Post().Resource("pods").Namespace(namespace).Name(pod).SubResource("exec").
		VersionedParams(&corev1.PodExecOptions{
			Container: container,
			Command:   req.Command,
			Stdin:     req.Stdin != nil,
			Stdout:    req.Stdout != nil,
			Stderr:    req.Stderr != nil && !req.TTY,
			TTY:       req.TTY,
		}, scheme.ParameterCodec).URL()
}

// Execer runs commands in sandboxes of one namespace; it is the core's
// executor (control.Executor).
type Execer struct {
	Clients   *Clients
	Namespace string
	// ConnectTimeout is the ConnectTimeout of requests that set none.
	ConnectTimeout time.Duration

	once   sync.Once
	dialer *execDialer
	err    error
}

// Exec runs a command in the workload container of a sandbox's pod.
func (e *Execer) Exec(ctx context.Context, sandboxID string, req cluster.ExecRequest) (cluster.ExitStatus, error) {
	if req.ConnectTimeout == 0 {
		req.ConnectTimeout = e.ConnectTimeout
	}
	e.once.Do(func() { e.dialer, e.err = newExecDialer(e.Clients.Config) })
	if e.err != nil {
		return cluster.ExitStatus{}, e.err
	}
	return e.dialer.exec(ctx, e.Clients.ExecURL(e.Namespace, ObjectName(sandboxID), req), req)
}

// execDialer opens exec streams to one API server. Its TLS configuration is
// built once, with a session cache, so every stream after the first
// resumes a TLS session instead of making a whole handshake: that spares
// the API server its signature and hiloop the certificate checks and, with
// a client certificate, an RSA signature of its own; and the keys and
// certificates are parsed once, not for each stream. Both are large costs
// of a loop of execs (docs/benchmarks.md, exec round trip). The CA bundle
// is read once, as the
// clients' own transport reads it; a client certificate that client-go
// reloads from its files still is.
type execDialer struct {
	cfg       *rest.Config
	transport *transport.Config
	tls       *tls.Config
	proxy     func(*http.Request) (*url.URL, error)
}

// execSessions is how many TLS sessions an execDialer keeps: one per API
// server address it reached.
const execSessions = 64

func newExecDialer(cfg *rest.Config) (*execDialer, error) {
	tc, err := cfg.TransportConfig()
	if err != nil {
		return nil, err
	}
	tlsCfg, err := transport.TLSConfigFor(tc)
	if err != nil {
		return nil, err
	}
	if tlsCfg != nil {
		tlsCfg.ClientSessionCache = tls.NewLRUClientSessionCache(execSessions)
	}
	proxy := cfg.Proxy
	if proxy == nil {
		proxy = utilnet.NewProxierWithNoProxyCIDR(http.ProxyFromEnvironment)
	}
	return &execDialer{cfg: cfg, transport: tc, tls: tlsCfg, proxy: proxy}, nil
}

// roundTripper is one stream's: client-go's WebSocket round tripper holds
// the connection it opened, so each stream needs its own, behind the
// configuration's wrappers (credentials, user agent, impersonation).
func (d *execDialer) roundTripper() (http.RoundTripper, websocket.ConnectionHolder, error) {
	ws := &websocket.RoundTripper{TLSConfig: d.tls, Proxier: d.proxy}
	rt, err := transport.HTTPWrappersForConfig(d.transport, ws)
	if err != nil {
		return nil, nil, err
	}
	return rt, ws, nil
}

// connectCtx is the one deadline of a stream's set-up: the WebSocket
// attempt and a SPDY fallback share it, so the fallback never starts a
// budget of its own. Both transports use the request's context only to
// dial and upgrade, so ending it afterwards does not end the stream.
func connectCtx(ctx context.Context, req cluster.ExecRequest) (context.Context, context.CancelFunc) {
	if req.ConnectTimeout <= 0 {
		return context.WithCancel(ctx)
	}
	return context.WithTimeout(ctx, req.ConnectTimeout)
}

// errSetUpCut is how a set-up that cctx ended is reported when the set-up
// itself has not returned yet.
var errSetUpCut = errors.New("the stream was not set up in time")

// within runs setUp, which opens a stream and returns it, and returns its
// result, or an error wrapping cctx's as soon as cctx ends, whatever setUp
// waits on then: client-go's SPDY round tripper reads the upgrade's answer
// with no deadline, and spdystream waits 30 s for each stream's reply
// whether or not its connection is closed, so an API server that accepts
// connections and never answers (one stopped with SIGSTOP) would hold the
// caller for as long as it hangs. A set-up left behind closes what it
// opened when it ends.
func within[T io.Closer](cctx context.Context, setUp func() (T, error)) (T, error) {
	type result struct {
		v   T
		err error
	}
	done := make(chan result, 1)
	go func() {
		v, err := setUp()
		done <- result{v, err}
	}()
	var r result
	select {
	case r = <-done:
		return r.v, r.err
	case <-cctx.Done():
	}
	select {
	case r = <-done: // it ended as the deadline passed: its own answer
		return r.v, r.err
	default:
	}
	go func() {
		if r := <-done; r.err == nil {
			r.v.Close()
		}
	}()
	return r.v, fmt.Errorf("%w: %w", errSetUpCut, cctx.Err())
}

// Exec runs a command through the pods/exec endpoint at u: WebSocket
// (v5.channel.k8s.io) first, SPDY (v4.channel.k8s.io) when the server does
// not upgrade to WebSocket. The exit status comes only from the terminating
// status frame.
func Exec(ctx context.Context, cfg *rest.Config, u *url.URL, req cluster.ExecRequest) (cluster.ExitStatus, error) {
	d, err := newExecDialer(cfg)
	if err != nil {
		return cluster.ExitStatus{}, err
	}
	return d.exec(ctx, u, req)
}

func (d *execDialer) exec(ctx context.Context, u *url.URL, req cluster.ExecRequest) (cluster.ExitStatus, error) {
	cctx, cancel := connectCtx(ctx, req)
	defer cancel()
	st, err := d.execWebSocket(ctx, cctx, u, req)
	var up *upgradeError
	if errors.As(err, &up) {
		return execSPDY(ctx, cctx, d.cfg, u, req)
	}
	return st, err
}

// upgradeError reports that the API server answered the WebSocket
// handshake without upgrading, so the SPDY fallback may be tried: nothing
// was sent yet. Only an answer is a refusal: a handshake that failed
// otherwise (no answer in time, a connection that broke) says nothing of
// what the server speaks, and SPDY would only wait on it again.
type upgradeError struct{ err error }

func (e *upgradeError) Error() string { return "websocket upgrade: " + e.err.Error() }

// execWebSocket runs the command over WebSocket, its stream set up within
// cctx.
func (d *execDialer) execWebSocket(ctx, cctx context.Context, u *url.URL, req cluster.ExecRequest) (cluster.ExitStatus, error) {
	rt, holder, err := d.roundTripper()
	if err != nil {
		return cluster.ExitStatus{}, err
	}
	hreq, err := http.NewRequestWithContext(cctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return cluster.ExitStatus{}, err
	}
	conn, err := within(cctx, func() (*gwebsocket.Conn, error) {
		return websocket.Negotiate(rt, holder, hreq, remotecommand.StreamProtocolV5Name)
	})
	if err != nil {
		// A refusal is an answer; whatever else failed, no command ran,
		// even when it failed at a deadline before cctx said so (the
		// connection's deadline and cctx's timer are apart).
		var uf *streamhttp.UpgradeFailureError
		if errors.As(err, &uf) && cctx.Err() == nil {
			return cluster.ExitStatus{}, &upgradeError{err}
		}
		return cluster.ExitStatus{}, connectError(ctx, cctx, err)
	}
	defer conn.Close()
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()

	sendV5Input(channelSender(conn), req)
	status, gotStatus, readErr, err := readV5(conn, req)
	if err != nil {
		return cluster.ExitStatus{}, err
	}
	if ctx.Err() != nil {
		return cluster.ExitStatus{}, ctx.Err()
	}
	if !gotStatus {
		if readErr != nil && !gwebsocket.IsCloseError(readErr, gwebsocket.CloseNormalClosure) {
			return cluster.ExitStatus{}, fmt.Errorf("%w: %v", cluster.ErrNoStatus, readErr)
		}
		return cluster.ExitStatus{}, cluster.ErrNoStatus
	}
	return decodeStatus(status)
}

// sendV5Input sends req's stdin, then its end, and its terminal sizes, each
// from a goroutine of its own that ends with its source or the connection.
func sendV5Input(send func(byte, []byte) error, req cluster.ExecRequest) {
	if req.Stdin != nil {
		go func() {
			buf := make([]byte, 32<<10)
			for {
				n, err := req.Stdin.Read(buf)
				if n > 0 {
					if send(remotecommand.StreamStdIn, buf[:n]) != nil {
						return
					}
				}
				if err != nil {
					// v5's CLOSE signal half-closes stdin: the command sees EOF.
					send(remotecommand.StreamClose, []byte{remotecommand.StreamStdIn})
					return
				}
			}
		}()
	}
	if req.TTY && req.Resize != nil {
		go func() {
			for sz := range req.Resize {
				b, _ := json.Marshal(sz)
				if send(remotecommand.StreamResize, b) != nil {
					return
				}
			}
		}()
	}
}

// readV5 copies the stream's output to req's writers until the connection
// ends, and returns the status the error channel brought (gotStatus says
// whether it brought any) and the read error that ended it; err is a write
// downstream that failed.
func readV5(conn *gwebsocket.Conn, req cluster.ExecRequest) (status []byte, gotStatus bool, readErr, err error) {
	// Large copies mean large messages downstream: fewer frames per byte.
	buf := make([]byte, copyBuffer)
	for {
		mt, r, err := conn.NextReader()
		if err != nil {
			return status, gotStatus, err, nil
		}
		if mt != gwebsocket.BinaryMessage {
			continue
		}
		var ch [1]byte
		if _, err := io.ReadFull(r, ch[:]); err != nil {
			continue // an empty message carries nothing
		}
		var dst io.Writer
		switch ch[0] {
		case remotecommand.StreamStdOut:
			dst = req.Stdout
		case remotecommand.StreamStdErr:
			dst = req.Stderr
		case remotecommand.StreamErr:
			b, err := io.ReadAll(r)
			if err != nil {
				return status, gotStatus, err, nil
			}
			status = append(status, b...)
			gotStatus = true
		}
		if dst == nil {
			continue
		}
		if rerr, werr := copyMessage(dst, r, buf); werr != nil {
			return nil, false, nil, fmt.Errorf("exec: write output: %w", werr)
		} else if rerr != nil {
			return status, gotStatus, rerr, nil
		}
	}
}

// copyMessage copies one message to dst. A TLS read yields one record (16
// KiB at most), and a message is sent whole, so the rest of it is on its
// way: it takes the message whole before passing it on, for one write
// downstream per message, not one per record.
func copyMessage(dst io.Writer, r io.Reader, buf []byte) (readErr, writeErr error) {
	for {
		n, err := io.ReadFull(r, buf)
		if n > 0 {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return nil, werr
			}
		}
		if err == io.EOF || err == io.ErrUnexpectedEOF {
			return nil, nil
		}
		if err != nil {
			return err, nil
		}
	}
}

// channelSender returns the one writer of the v5 protocol's messages on
// conn: each is one channel byte followed by the payload. Stdin and resize
// are sent from two goroutines, so it serialises them.
func channelSender(conn *gwebsocket.Conn) func(ch byte, p []byte) error {
	var mu sync.Mutex
	return func(ch byte, p []byte) error {
		mu.Lock()
		defer mu.Unlock()
		w, err := conn.NextWriter(gwebsocket.BinaryMessage)
		if err != nil {
			return err
		}
		if _, err := w.Write([]byte{ch}); err != nil {
			return err
		}
		if _, err := w.Write(p); err != nil {
			return err
		}
		return w.Close()
	}
}

// spdyStreams is an exec stream set up over SPDY: the connection and the
// streams the kubelet waits for before it runs the command.
type spdyStreams struct {
	conn           httpstream.Connection
	errS, stdin    httpstream.Stream
	resize         httpstream.Stream
	stdout, stderr httpstream.Stream
}

func (s *spdyStreams) Close() error { return s.conn.Close() }

// setUpSPDY upgrades to SPDY and creates the streams of req. The kubelet
// runs the command once every stream is created: until then, a failure
// is one to set the stream up.
func setUpSPDY(cctx context.Context, cfg *rest.Config, u *url.URL, req cluster.ExecRequest) (*spdyStreams, error) {
	rt, upgrader, err := spdy.RoundTripperFor(cfg)
	if err != nil {
		return nil, err
	}
	hreq, err := http.NewRequestWithContext(cctx, http.MethodPost, u.String(), nil)
	if err != nil {
		return nil, err
	}
	conn, proto, err := spdy.Negotiate(upgrader, &http.Client{Transport: rt}, hreq, remotecommand.StreamProtocolV4Name)
	if err != nil {
		return nil, err
	}
	s := &spdyStreams{conn: conn}
	fail := func(err error) (*spdyStreams, error) {
		conn.Close()
		return nil, err
	}
	if proto != remotecommand.StreamProtocolV4Name {
		return fail(&protocolError{proto})
	}
	create := func(kind string) (httpstream.Stream, error) {
		h := http.Header{}
		h.Set(corev1.StreamType, kind)
		st, err := conn.CreateStream(h)
		if err != nil {
			return nil, fmt.Errorf("create %s stream: %w", kind, err)
		}
		return st, nil
	}
	if s.errS, err = create(corev1.StreamTypeError); err != nil {
		return fail(err)
	}
	s.errS.Close() // the client never writes to it
	if req.Stdin != nil {
		if s.stdin, err = create(corev1.StreamTypeStdin); err != nil {
			return fail(err)
		}
	}
	if req.Stdout != nil {
		if s.stdout, err = create(corev1.StreamTypeStdout); err != nil {
			return fail(err)
		}
	}
	if req.Stderr != nil && !req.TTY {
		if s.stderr, err = create(corev1.StreamTypeStderr); err != nil {
			return fail(err)
		}
	}
	if req.TTY {
		if s.resize, err = create(corev1.StreamTypeResize); err != nil {
			return fail(err)
		}
	}
	return s, nil
}

// protocolError: the API server upgraded to another exec protocol than
// v4, whose status frame carries the exit code.
type protocolError struct{ proto string }

func (e *protocolError) Error() string {
	return fmt.Sprintf("exec: server speaks %q, want %s (exit codes need it)", e.proto, remotecommand.StreamProtocolV4Name)
}

// execSPDY runs the command over SPDY, its stream set up within cctx.
func execSPDY(ctx, cctx context.Context, cfg *rest.Config, u *url.URL, req cluster.ExecRequest) (cluster.ExitStatus, error) {
	s, err := within(cctx, func() (*spdyStreams, error) { return setUpSPDY(cctx, cfg, u, req) })
	var pe *protocolError
	if errors.As(err, &pe) {
		return cluster.ExitStatus{}, err
	}
	if err != nil {
		return cluster.ExitStatus{}, connectError(ctx, cctx, err)
	}
	defer s.Close()
	stop := context.AfterFunc(ctx, func() { s.Close() })
	defer stop()

	var copies sync.WaitGroup
	if s.stdin != nil {
		go func() {
			io.Copy(s.stdin, req.Stdin)
			s.stdin.Close() // half-close: the command sees EOF
		}()
	}
	for _, out := range []struct {
		s httpstream.Stream
		w io.Writer
	}{{s.stdout, req.Stdout}, {s.stderr, req.Stderr}} {
		if out.s == nil {
			continue
		}
		copies.Add(1)
		go func() {
			defer copies.Done()
			io.CopyBuffer(out.w, out.s, make([]byte, copyBuffer))
		}()
	}
	if s.resize != nil && req.Resize != nil {
		go func() {
			enc := json.NewEncoder(s.resize)
			for sz := range req.Resize {
				if enc.Encode(sz) != nil {
					return
				}
			}
		}()
	}
	status, readErr := io.ReadAll(s.errS)
	// All output is delivered before the exit is reported.
	copies.Wait()
	if ctx.Err() != nil {
		return cluster.ExitStatus{}, ctx.Err()
	}
	if len(status) == 0 {
		if readErr != nil {
			return cluster.ExitStatus{}, fmt.Errorf("%w: %v", cluster.ErrNoStatus, readErr)
		}
		return cluster.ExitStatus{}, cluster.ErrNoStatus
	}
	return decodeStatus(status)
}

// connectError is a failure to set up the stream, with the context error
// of what ended first: the caller's context, else the set-up's (cctx). The
// stream is set up once the upgrade is answered and, with SPDY, its streams
// are created: the kubelet starts the command only after that.
func connectError(ctx, cctx context.Context, err error) *cluster.ConnectError {
	for _, c := range []context.Context{ctx, cctx} {
		cerr := c.Err()
		// A dial or read cut short by the deadline may fail a moment
		// before the context itself says so.
		if d, ok := c.Deadline(); ok && cerr == nil && !time.Now().Before(d) {
			cerr = context.DeadlineExceeded
		}
		switch {
		case cerr == nil:
			continue
		case errors.Is(err, cerr):
			return &cluster.ConnectError{Err: err}
		}
		return &cluster.ConnectError{Err: fmt.Errorf("%w (%v)", cerr, err)}
	}
	return &cluster.ConnectError{Err: err}
}

// goExitRE matches the text of a Go exec error that a runtime wrapped into
// an internal-error status instead of reporting it as an exit code (the
// kubelet does so for signal deaths; kwok does so for every non-zero exit).
var goExitRE = regexp.MustCompile(`(?:exit status (\d+)|signal: ([a-z ]+))$`)

// decodeStatus reads a terminating status frame.
func decodeStatus(b []byte) (cluster.ExitStatus, error) {
	var st metav1.Status
	if err := json.Unmarshal(b, &st); err != nil {
		return cluster.ExitStatus{}, fmt.Errorf("exec: unreadable status frame %q: %w", truncateBytes(b), err)
	}
	switch st.Status {
	case metav1.StatusSuccess:
		return cluster.ExitStatus{Code: 0}, nil
	case metav1.StatusFailure:
	default:
		return cluster.ExitStatus{}, fmt.Errorf("exec: status frame with status %q", st.Status)
	}
	if st.Reason == remotecommand.NonZeroExitCodeReason && st.Details != nil {
		for _, c := range st.Details.Causes {
			if c.Type != remotecommand.ExitCodeCauseType {
				continue
			}
			code, err := strconv.ParseUint(c.Message, 10, 8)
			if err != nil {
				return cluster.ExitStatus{}, fmt.Errorf("exec: invalid exit code %q", c.Message)
			}
			return cluster.ExitStatus{Code: int(code)}, nil
		}
	}
	if m := goExitRE.FindStringSubmatch(st.Message); m != nil {
		if m[1] != "" {
			code, _ := strconv.Atoi(m[1])
			return cluster.ExitStatus{Code: code}, nil
		}
		if sig, ok := signals[m[2]]; ok {
			return cluster.ExitStatus{Code: 128 + int(sig), Signal: m[2]}, nil
		}
	}
	return cluster.ExitStatus{}, &cluster.RemoteError{Message: st.Message}
}

// signals maps Go's signal descriptions ("killed") to numbers.
var signals = func() map[string]syscall.Signal {
	m := map[string]syscall.Signal{}
	for s := syscall.Signal(1); s < 32; s++ {
		m[s.String()] = s
	}
	return m
}()

func truncateBytes(b []byte) string {
	if len(b) > 200 {
		return string(b[:200]) + "..."
	}
	return string(b)
}
