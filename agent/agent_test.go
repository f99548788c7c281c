package agent

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	gossh "golang.org/x/crypto/ssh"

	"github.com/hiloop/hiloop/control"
	"github.com/hiloop/hiloop/forward"
)

func newKey(t *testing.T) gossh.Signer {
	t.Helper()
	_, priv, _ := ed25519.GenerateKey(rand.Reader)
	s, err := gossh.NewSignerFromKey(priv)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func writeKeys(t *testing.T, path string, keys ...gossh.Signer) {
	t.Helper()
	var b []byte
	for _, k := range keys {
		b = append(b, gossh.MarshalAuthorizedKey(k.PublicKey())...)
	}
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// TestAgent: only the listed key logs in, a changed file takes effect at
// the next login, only direct-tcpip to loopback is served, and data moves.
func TestAgent(t *testing.T) {
	keys := filepath.Join(t.TempDir(), "gateway.pub")
	oldKey, newKey2, stranger := newKey(t), newKey(t), newKey(t)
	writeKeys(t, keys, oldKey)
	a, err := New(Options{SandboxID: "sbx_a", AuthorizedKeysFile: keys})
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
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	dial := func(k gossh.Signer) (*gossh.Client, error) {
		return gossh.Dial("tcp", ln.Addr().String(), &gossh.ClientConfig{User: "sbx_a", Auth: []gossh.AuthMethod{gossh.PublicKeys(k)},
			HostKeyCallback: gossh.InsecureIgnoreHostKey()})
	}
	if _, err := dial(stranger); err == nil {
		t.Fatal("a key not in the file logged in")
	}
	c, err := dial(oldKey)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()

	echo, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer echo.Close()
	go func() {
		for {
			s, err := echo.Accept()
			if err != nil {
				return
			}
			go func() { io.Copy(s, s); s.Close() }()
		}
	}()
	_, port, _ := net.SplitHostPort(echo.Addr().String())
	p, _ := strconv.Atoi(port)
	open := func(host string, port uint32) (gossh.Channel, error) {
		ch, reqs, err := c.OpenChannel("direct-tcpip", gossh.Marshal(forward.DirectTCPIP{Host: host, Port: port, OriginHost: "127.0.0.1", OriginPort: 1}))
		if err == nil {
			go gossh.DiscardRequests(reqs)
		}
		return ch, err
	}
	for i := range 3 {
		ch, err := open("localhost", uint32(p))
		if err != nil {
			t.Fatal(err)
		}
		msg := strings.Repeat("x", 1<<16) + strconv.Itoa(i)
		go func() { io.WriteString(ch, msg); ch.CloseWrite() }()
		got, _ := io.ReadAll(ch)
		if string(got) != msg {
			t.Fatalf("echo %d: %d bytes back, want %d", i, len(got), len(msg))
		}
		ch.Close()
	}
	for _, bad := range []struct {
		host string
		port uint32
		says string
	}{{"169.254.169.254", 80, "only loopback"}, {"10.0.0.1", uint32(p), "only loopback"}, {"127.0.0.1", 65537, "65537"}, {"127.0.0.1", 0, "outside"}} {
		if _, err := open(bad.host, bad.port); err == nil || !strings.Contains(err.Error(), bad.says) {
			t.Errorf("direct-tcpip to %s:%d: %v", bad.host, bad.port, err)
		}
	}
	if _, _, err := c.OpenChannel("session", nil); err == nil {
		t.Error("a session channel was accepted")
	}
	if ok, _, _ := c.SendRequest("tcpip-forward", true, gossh.Marshal(struct {
		Addr string
		Port uint32
	}{"127.0.0.1", 0})); ok {
		t.Error("tcpip-forward was accepted")
	}
	if n := a.Conns(); n != 1 {
		t.Fatalf("%d connections for one client with several channels", n)
	}

	// Rotation: the file now names the new key only.
	writeKeys(t, keys, newKey2)
	if _, err := dial(oldKey); err == nil {
		t.Fatal("the old key still logs in after rotation")
	}
	c2, err := dial(newKey2)
	if err != nil {
		t.Fatalf("the new key: %v", err)
	}
	c2.Close()
}

// TestAgentOnlyItsSandbox: the helper of sandbox A lets in only the user
// named A with the key the gateway derived for A. The key derived for
// another sandbox, A's key under another user name, and the gateway key
// itself are refused, so a gateway dial that lands on the wrong pod's
// helper goes no further than the handshake.
func TestAgentOnlyItsSandbox(t *testing.T) {
	_, root, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	derive := func(id string) gossh.Signer {
		k, err := control.HelperLoginKey(root, id)
		if err != nil {
			t.Fatal(err)
		}
		return k
	}
	keyA, keyB := derive("sbx_a"), derive("sbx_b")
	rootSigner, err := gossh.NewSignerFromKey(root)
	if err != nil {
		t.Fatal(err)
	}
	keys := filepath.Join(t.TempDir(), "gateway.pub")
	writeKeys(t, keys, keyA)
	a, err := New(Options{SandboxID: "sbx_a", AuthorizedKeysFile: keys})
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
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	for _, tc := range []struct {
		name, user string
		key        gossh.Signer
		ok         bool
	}{
		{"its sandbox's user and key", "sbx_a", keyA, true},
		{"another sandbox's user", "sbx_b", keyA, false},
		{"a user that is no sandbox", "gateway", keyA, false},
		{"another sandbox's key", "sbx_a", keyB, false},
		{"the gateway key itself", "sbx_a", rootSigner, false},
	} {
		c, err := gossh.Dial("tcp", ln.Addr().String(), &gossh.ClientConfig{User: tc.user, Auth: []gossh.AuthMethod{gossh.PublicKeys(tc.key)},
			HostKeyCallback: gossh.InsecureIgnoreHostKey()})
		if err == nil {
			c.Close()
		}
		if (err == nil) != tc.ok {
			t.Errorf("%s: login error %v, want success %v", tc.name, err, tc.ok)
		}
	}
	if n := a.Conns(); n != 1 {
		t.Errorf("%d logins accepted, want 1", n)
	}
	if _, err := New(Options{AuthorizedKeysFile: keys}); err == nil {
		t.Error("a helper without a sandbox id was built")
	}
}
