package agent

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/tls"
	"errors"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	gossh "golang.org/x/crypto/ssh"

	"github.com/hiloop/hiloop/control"
	"github.com/hiloop/hiloop/forward"
	"github.com/hiloop/hiloop/internal/eventually"
)

func newKey(t *testing.T) ed25519.PrivateKey {
	t.Helper()
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return priv
}

func writeKeys(t *testing.T, path string, keys ...ed25519.PrivateKey) {
	t.Helper()
	var b []byte
	for _, k := range keys {
		pub, err := gossh.NewPublicKey(k.Public())
		if err != nil {
			t.Fatal(err)
		}
		b = append(b, gossh.MarshalAuthorizedKey(pub)...)
	}
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// serve runs a helper for sandbox id with the keys file and returns its
// address.
func serve(t *testing.T, o Options) (*Agent, string) {
	t.Helper()
	o.Log = slog.New(slog.NewTextHandler(io.Discard, nil))
	a, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Serve(ctx, ln) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
	return a, ln.Addr().String()
}

// dial connects to the helper at addr as the gateway does, naming sandbox
// and showing key.
func dial(t *testing.T, addr, sandbox string, key ed25519.PrivateKey) (*forward.Mux, error) {
	t.Helper()
	cfg, err := forward.ClientConfig(sandbox, key, func(ed25519.PublicKey) error { return nil })
	if err != nil {
		t.Fatal(err)
	}
	tc, err := handshake(t, addr, cfg)
	if err != nil {
		return nil, err
	}
	tc.SetDeadline(time.Time{})
	m := forward.NewMux(tc, forward.MuxOptions{})
	t.Cleanup(func() { m.Close() })
	return m, nil
}

// handshake dials the helper at addr and completes the TLS handshake with
// cfg, the connection's deadline 10s from now.
func handshake(t *testing.T, addr string, cfg *tls.Config) (*forward.Conn, error) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	c.SetDeadline(time.Now().Add(10 * time.Second))
	tc, err := forward.Handshake(c, cfg)
	if err != nil {
		c.Close()
	}
	return tc, err
}

func open(m *forward.Mux, host string, port uint32) (*forward.Stream, error) {
	req, err := forward.EncodeOpen(host, port)
	if err != nil {
		return nil, err
	}
	return m.Open(nil, req)
}

// echo runs a loopback echo server and returns its port.
func echo(t *testing.T) uint32 {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			s, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { io.Copy(s, s); s.Close() }()
		}
	}()
	return uint32(ln.Addr().(*net.TCPAddr).Port)
}

// TestAgent: only the listed key gets in, a changed file takes effect at
// the next connection, only loopback is dialled (a destination sent
// straight to the helper, bypassing the gateway's own check, included),
// and data moves over several streams of one connection.
func TestAgent(t *testing.T) {
	keys := filepath.Join(t.TempDir(), "gateway.pub")
	oldKey, newKey2, stranger := newKey(t), newKey(t), newKey(t)
	writeKeys(t, keys, oldKey)
	a, addr := serve(t, Options{SandboxID: "sbx_a", AuthorizedKeysFile: keys})
	if _, err := dial(t, addr, "sbx_a", stranger); !errors.Is(err, forward.ErrRefused) {
		t.Fatalf("a key not in the file: %v, want refused", err)
	}
	m, err := dial(t, addr, "sbx_a", oldKey)
	if err != nil {
		t.Fatal(err)
	}
	port := echo(t)
	for i := range 3 {
		st, err := open(m, "localhost", port)
		if err != nil {
			t.Fatal(err)
		}
		msg := strings.Repeat("x", 3<<20) + strconv.Itoa(i)
		go func() { io.WriteString(st, msg); st.CloseWrite() }()
		got, _ := io.ReadAll(st)
		if string(got) != msg {
			t.Fatalf("echo %d: %d bytes back, want %d", i, len(got), len(msg))
		}
		st.Close()
	}
	free, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	freePort := uint32(free.Addr().(*net.TCPAddr).Port)
	free.Close()
	for _, bad := range []struct {
		host   string
		port   uint32
		reason uint8
		says   string
	}{
		{"169.254.169.254", 80, forward.Prohibited, "only loopback"},
		{"10.0.0.1", port, forward.Prohibited, "only loopback"},
		{"127.0.0.2", port, forward.Prohibited, "only loopback"},
		{"LOCALHOST", port, forward.Prohibited, "only loopback"},
		{"127.0.0.1", 65537, forward.Prohibited, "65537"},
		{"127.0.0.1", 0, forward.Prohibited, "outside"},
		{"127.0.0.1", freePort, forward.ConnectionFailed, "nothing answers on port " + strconv.Itoa(int(freePort)) + " inside the sandbox"},
	} {
		_, err := open(m, bad.host, bad.port)
		var oe *forward.OpenError
		if !errors.As(err, &oe) || oe.Reason != bad.reason || !strings.Contains(oe.Message, bad.says) {
			t.Errorf("open %s:%d: %v, want reason %d saying %q", bad.host, bad.port, err, bad.reason, bad.says)
		}
	}
	if _, err := m.Open(nil, []byte{1, 2}); err == nil || !strings.Contains(err.Error(), "malformed") {
		t.Errorf("a malformed open request: %v", err)
	}
	if n := a.Conns(); n != 1 {
		t.Fatalf("%d connections for one client with several streams", n)
	}

	// Rotation: the file now names the new key only.
	writeKeys(t, keys, newKey2)
	if _, err := dial(t, addr, "sbx_a", oldKey); !errors.Is(err, forward.ErrRefused) {
		t.Fatalf("the old key after rotation: %v, want refused", err)
	}
	if _, err := dial(t, addr, "sbx_a", newKey2); err != nil {
		t.Fatalf("the new key: %v", err)
	}
}

// TestAgentOnlyItsSandbox: the helper of sandbox A lets in only a
// connection naming A with the key the gateway derived for A. The key
// derived for another sandbox, A's key naming another sandbox, and the
// gateway key itself are refused, so a gateway dial that lands on the
// wrong pod's helper goes no further than the handshake.
func TestAgentOnlyItsSandbox(t *testing.T) {
	root := newKey(t)
	derive := func(id string) ed25519.PrivateKey {
		k, err := control.HelperLoginKey(root, id)
		if err != nil {
			t.Fatal(err)
		}
		return k
	}
	keyA, keyB := derive("sbx_a"), derive("sbx_b")
	keys := filepath.Join(t.TempDir(), "gateway.pub")
	writeKeys(t, keys, keyA)
	a, addr := serve(t, Options{SandboxID: "sbx_a", AuthorizedKeysFile: keys})
	for _, tc := range []struct {
		name, sandbox string
		key           ed25519.PrivateKey
		ok            bool
	}{
		{"its sandbox and key", "sbx_a", keyA, true},
		{"another sandbox's id", "sbx_b", keyA, false},
		{"a name that is no sandbox", "gateway", keyA, false},
		{"another sandbox's key", "sbx_a", keyB, false},
		{"the gateway key itself", "sbx_a", root, false},
	} {
		_, err := dial(t, addr, tc.sandbox, tc.key)
		if (err == nil) != tc.ok {
			t.Errorf("%s: %v, want success %v", tc.name, err, tc.ok)
		}
	}
	if n := a.Conns(); n != 1 {
		t.Errorf("%d connections accepted, want 1", n)
	}
	if _, err := New(Options{AuthorizedKeysFile: keys}); err == nil {
		t.Error("a helper without a sandbox id was built")
	}
}

// TestAgentRefusesOtherClients: a client that speaks no TLS (an SSH client
// of the protocol before this one), a TLS client without a certificate or
// without the forward protocol, and a client that never completes the
// handshake are all closed without a connection counted; the last within
// the handshake deadline.
func TestAgentRefusesOtherClients(t *testing.T) {
	keys := filepath.Join(t.TempDir(), "gateway.pub")
	key := newKey(t)
	writeKeys(t, keys, key)
	a, addr := serve(t, Options{SandboxID: "sbx_a", AuthorizedKeysFile: keys, HandshakeTimeout: 500 * time.Millisecond})

	_, err := gossh.Dial("tcp", addr, &gossh.ClientConfig{User: "sbx_a", HostKeyCallback: gossh.InsecureIgnoreHostKey(), Timeout: 5 * time.Second})
	if err == nil {
		t.Error("an SSH client got in")
	}

	cfg, err := forward.ClientConfig("sbx_a", key, func(ed25519.PublicKey) error { return nil })
	if err != nil {
		t.Fatal(err)
	}
	noCert := cfg.Clone()
	noCert.Certificates = nil
	noProto := cfg.Clone()
	noProto.NextProtos = nil
	noProto.VerifyConnection = nil
	for name, c := range map[string]*tls.Config{"no certificate": noCert, "no protocol": noProto} {
		nc, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		nc.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := forward.Handshake(nc, c); err == nil {
			t.Errorf("a TLS client with %s got in", name)
		}
		nc.Close()
	}

	silent, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	// The helper's handshake deadline is far shorter than this read's: a
	// read that reaches its own deadline means the helper never closed.
	silent.SetReadDeadline(time.Now().Add(10 * time.Second))
	if n, err := silent.Read(make([]byte, 1)); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Errorf("a client that never sent a byte: read %d, %v; want the helper to close it", n, err)
	}
	if n := a.Conns(); n != 0 {
		t.Errorf("%d connections accepted", n)
	}
}

// TestAgentTooManyStreams: past MaxStreams open at once, an open is
// refused with a reason, the connection stays, and a stream closed makes
// room again.
func TestAgentTooManyStreams(t *testing.T) {
	keys := filepath.Join(t.TempDir(), "gateway.pub")
	key := newKey(t)
	writeKeys(t, keys, key)
	_, addr := serve(t, Options{SandboxID: "sbx_a", AuthorizedKeysFile: keys, MaxStreams: 2})
	m, err := dial(t, addr, "sbx_a", key)
	if err != nil {
		t.Fatal(err)
	}
	port := echo(t)
	first, err := open(m, "localhost", port)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := open(m, "localhost", port); err != nil {
		t.Fatal(err)
	}
	_, err = open(m, "localhost", port)
	var oe *forward.OpenError
	if !errors.As(err, &oe) || oe.Reason != forward.ResourceShortage || !strings.Contains(oe.Message, "too many streams") {
		t.Fatalf("a third stream: %v, want refused as too many", err)
	}
	first.Close()
	eventually.Within(t, "a stream after one closed", eventually.Patience, func() (bool, error) {
		st, err := open(m, "localhost", port)
		if err != nil {
			return false, err
		}
		st.Close()
		return true, nil
	})
}
