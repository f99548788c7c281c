package agent

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/hiloop/hiloop/forward"
	"github.com/hiloop/hiloop/internal/eventually"
	"github.com/hiloop/hiloop/internal/tlstest"
)

// Attacks on the helper from what shares its network: the tenant's own
// processes in the pod, and anything else that reaches its port.

func keyed(t *testing.T, o Options) (*Agent, string, ed25519.PrivateKey) {
	t.Helper()
	keys := filepath.Join(t.TempDir(), "gateway.pub")
	key := newKey(t)
	writeKeys(t, keys, key)
	o.SandboxID, o.AuthorizedKeysFile = "sbx_a", keys
	a, addr := serve(t, o)
	return a, addr, key
}

// TestAgentHandshakeCap: connections that never finish their handshake
// hold at most MaxHandshakes places; one past it is closed at once rather
// than held (a goroutine and buffers each, towards the helper's 64Mi
// limit), and the places come back as they end.
func TestAgentHandshakeCap(t *testing.T) {
	a, addr, key := keyed(t, Options{MaxHandshakes: 4, HandshakeTimeout: time.Minute})
	var silent []net.Conn
	defer func() {
		for _, c := range silent {
			c.Close()
		}
	}()
	for range 4 {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		silent = append(silent, c)
	}
	eventually.True(t, "four handshakes under way", func() bool { return len(a.handshakes) == 4 })
	for i := range 50 {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		c.SetReadDeadline(time.Now().Add(10 * time.Second))
		n, err := c.Read(make([]byte, 1))
		c.Close()
		if n != 0 || errors.Is(err, syscall.ETIMEDOUT) || errors.Is(err, context.DeadlineExceeded) || isTimeout(err) {
			t.Fatalf("connection %d past the cap: read %d, %v; want it closed at once", i, n, err)
		}
	}
	if n := len(a.handshakes); n != 4 {
		t.Errorf("%d places held, want 4", n)
	}
	for _, c := range silent {
		c.Close()
	}
	silent = nil
	eventually.True(t, "the places freed", func() bool { return len(a.handshakes) == 0 })
	m, err := dial(t, addr, "sbx_a", key)
	if err != nil {
		t.Fatalf("the gateway once the silent connections left: %v", err)
	}
	m.Close()
	eventually.True(t, "the gateway's handshake freed its place", func() bool { return len(a.handshakes) == 0 })
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// flakyListener fails its first accepts with err.
type flakyListener struct {
	net.Listener
	fails atomic.Int32
	err   error
}

func (l *flakyListener) Accept() (net.Conn, error) {
	if l.fails.Add(-1) >= 0 {
		return nil, l.err
	}
	return l.Listener.Accept()
}

// TestAgentAcceptFailures: running out of file descriptors (what a flood
// of connections does) is waited out, and the helper goes on with the
// same key; a listener that fails for good still ends Serve.
func TestAgentAcceptFailures(t *testing.T) {
	keys := filepath.Join(t.TempDir(), "gateway.pub")
	key := newKey(t)
	writeKeys(t, keys, key)
	a, err := New(Options{SandboxID: "sbx_a", AuthorizedKeysFile: keys, Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	fl := &flakyListener{Listener: ln, err: &net.OpError{Op: "accept", Net: "tcp", Err: syscall.EMFILE}}
	fl.fails.Store(5)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Serve(ctx, fl) }()
	m, err := dial(t, ln.Addr().String(), "sbx_a", key)
	if err != nil {
		t.Fatalf("after EMFILE: %v", err)
	}
	m.Close()
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Serve: %v", err)
	}

	ln2, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln2.Close()
	bad := &flakyListener{Listener: ln2, err: errors.New("listener broken")}
	bad.fails.Store(1)
	if err := a.Serve(context.Background(), bad); err == nil || err.Error() != "listener broken" {
		t.Fatalf("Serve on a broken listener: %v", err)
	}
}

// TestAgentDialsOnlyLoopback: every other spelling of a loopback address
// (short, decimal, hex, octal, IPv4-mapped, zoned, with a port, with a
// trailing dot or NUL) and ports 0, 65536 and 2^32-1 sent straight to the
// helper are refused as prohibited, and nothing is dialled for them.
func TestAgentDialsOnlyLoopback(t *testing.T) {
	_, addr, key := keyed(t, Options{})
	m, err := dial(t, addr, "sbx_a", key)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 64)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			accepted <- c
		}
	}()
	port := uint32(ln.Addr().(*net.TCPAddr).Port)
	ps := fmt.Sprint(port)
	for _, tc := range []struct {
		host string
		port uint32
	}{
		{"127.1", port}, {"2130706433", port}, {"0x7f000001", port}, {"0177.0.0.1", port}, {"127.0.0.01", port},
		{"::ffff:127.0.0.1", port}, {"[::ffff:127.0.0.1]", port}, {"0:0:0:0:0:0:0:1", port}, {"::1%lo", port},
		{"[::1]:" + ps, port}, {"127.0.0.1:" + ps, port}, {"localhost.", port}, {"localhost\x00", port},
		{"127.0.0.1\n", port}, {" localhost", port}, {"[::1", port}, {"0.0.0.0", port}, {"::", port},
		{"localhost.localdomain", port}, {"ip6-localhost", port},
		{"127.0.0.1", 0}, {"127.0.0.1", 65536}, {"127.0.0.1", 1<<32 - 1}, {"localhost", port + 1<<16},
	} {
		_, err := open(m, tc.host, tc.port)
		var oe *forward.OpenError
		if !errors.As(err, &oe) || oe.Reason != forward.Prohibited {
			t.Errorf("open %q port %d: %v, want prohibited", tc.host, tc.port, err)
		}
	}
	st, err := open(m, "127.0.0.1", port)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if _, err := st.Write([]byte("allowed")); err != nil {
		t.Fatal(err)
	}
	// A dial for a refused open would have connected before its refusal,
	// so before this open was sent, and the listener hands connections
	// over in the order they came: the first must be the allowed one.
	var c net.Conn
	select {
	case c = <-accepted:
	case <-time.After(eventually.Patience):
		t.Fatal("the allowed open dialled nothing")
	}
	defer c.Close()
	c.SetReadDeadline(time.Now().Add(eventually.Patience))
	got := make([]byte, len("allowed"))
	if _, err := io.ReadFull(c, got); err != nil || string(got) != "allowed" {
		t.Fatalf("the first connection the helper dialled carried %q (%v): a refused open was dialled", got, err)
	}
}

// recorder is a TCP proxy to addr that keeps what the client sent.
func recorder(t *testing.T, addr string) (string, func() []byte) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	var mu sync.Mutex
	var sent bytes.Buffer
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		up, err := net.Dial("tcp", addr)
		if err != nil {
			return
		}
		defer up.Close()
		go io.Copy(c, up)
		buf := make([]byte, 4096)
		for {
			n, err := c.Read(buf)
			mu.Lock()
			sent.Write(buf[:n])
			mu.Unlock()
			if _, werr := up.Write(buf[:n]); err != nil || werr != nil {
				return
			}
		}
	}()
	return ln.Addr().String(), func() []byte {
		mu.Lock()
		defer mu.Unlock()
		return bytes.Clone(sent.Bytes())
	}
}

// TestAgentReplayedHandshake: the bytes the gateway sent on a connection
// the helper accepted, replayed on a new connection, get no ready and no
// connection: the helper's fresh random and key share make the recorded
// Finished and CertificateVerify worthless.
func TestAgentReplayedHandshake(t *testing.T) {
	a, addr, key := keyed(t, Options{HandshakeTimeout: 2 * time.Second})
	via, sent := recorder(t, addr)
	m, err := dial(t, via, "sbx_a", key)
	if err != nil {
		t.Fatal(err)
	}
	req, _ := forward.EncodeOpen("localhost", 1)
	m.Open(nil, req) // a stream's open on the record too
	m.Close()
	rec := sent()
	if n := a.Conns(); n != 1 || len(rec) == 0 {
		t.Fatalf("%d connections, %d bytes recorded", n, len(rec))
	}
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	c.Write(rec)
	got, _ := io.ReadAll(c)
	// The helper's own flight comes back, then an alert; never a ready
	// in application data, which the recorded keys cannot produce anyway.
	if n := a.Conns(); n != 1 {
		t.Errorf("the replay was accepted as a connection (%d, %d bytes answered)", n, len(got))
	}
}

// TestAgentTLSDetails: the helper refuses TLS 1.2, a client certificate of
// another key type, and offers no resumption: a client with a session
// cache does a full handshake (and shows its certificate) every time.
func TestAgentTLSDetails(t *testing.T) {
	a, addr, key := keyed(t, Options{HandshakeTimeout: 2 * time.Second})
	cfg, err := forward.ClientConfig("sbx_a", key, func(ed25519.PublicKey) error { return nil })
	if err != nil {
		t.Fatal(err)
	}

	tls12 := cfg.Clone()
	tls12.MinVersion, tls12.MaxVersion = tls.VersionTLS12, tls.VersionTLS12
	if _, err := handshake(t, addr, tls12); err == nil {
		t.Error("a TLS 1.2 client got in")
	}

	ecdsaCert := cfg.Clone()
	ecdsaCert.Certificates = []tls.Certificate{tlstest.ECDSACertificate(t)}
	if _, err := handshake(t, addr, ecdsaCert); err == nil {
		t.Error("an ECDSA client certificate got in")
	}

	// The gateway's certificate followed by another: only the first is
	// the key, and it must sign.
	other, err := forward.Certificate(newKey(t))
	if err != nil {
		t.Fatal(err)
	}
	gw, err := forward.Certificate(key)
	if err != nil {
		t.Fatal(err)
	}
	chained := cfg.Clone()
	chained.Certificates = []tls.Certificate{{Certificate: [][]byte{other.Certificate[0], gw.Certificate[0]}, PrivateKey: other.PrivateKey}}
	if _, err := handshake(t, addr, chained); err == nil {
		t.Error("a stranger's certificate chained to the gateway's got in")
	}

	resuming := cfg.Clone()
	resuming.ClientSessionCache = tls.NewLRUClientSessionCache(4)
	for i := range 3 {
		tc, err := handshake(t, addr, resuming)
		if err != nil {
			t.Fatal(err)
		}
		// A TLS 1.3 server sends its tickets within its handshake, which
		// ends before the helper writes the ready that forward.Handshake
		// read: a ticket, were one sent, has been taken in.
		if tc.ConnectionState().DidResume {
			t.Errorf("handshake %d resumed a session", i)
		}
		tc.Close()
	}
	// The helper counts a connection after it wrote the ready the client
	// waits for, so the count may come after the client's handshake: wait
	// for the third, then check there was no fourth.
	eventually.True(t, "the 3 full handshakes counted", func() bool { return a.Conns() >= 3 })
	if n := a.Conns(); n != 3 {
		t.Errorf("%d connections, want the 3 full handshakes", n)
	}
}
