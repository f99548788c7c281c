package sshd_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	gossh "golang.org/x/crypto/ssh"

	"github.com/hiloop/hiloop/agent"
	"github.com/hiloop/hiloop/control/controltest"
	"github.com/hiloop/hiloop/internal/eventually"
	"github.com/hiloop/hiloop/receipt"
)

// directTCPIP is the payload of a direct-tcpip channel open (RFC 4254 7.2).
type directTCPIP struct {
	Host       string
	Port       uint32
	OriginHost string
	OriginPort uint32
}

// forward opens a -L channel to host:port inside the sandbox.
func forward(c *gossh.Client, host string, port uint32) (gossh.Channel, error) {
	ch, reqs, err := c.OpenChannel("direct-tcpip", gossh.Marshal(directTCPIP{host, port, "127.0.0.1", 40000}))
	if err != nil {
		return nil, err
	}
	go gossh.DiscardRequests(reqs)
	return ch, nil
}

// TestForwardRefused: -L reaches only loopback inside the sandbox, on a
// port in 1..65535, and only for a sandbox that has the forward transport.
// Each refusal is Prohibited and comes before anything is asked of the
// cluster or a helper is dialled.
func TestForwardRefused(t *testing.T) {
	g := start(t, setup{})
	org := g.org("a")
	key, _ := g.key(org)
	withHelper := g.sandbox(org, receipt.TransportSSH, receipt.TransportForward)
	without := g.sandbox(org, receipt.TransportSSH)
	for _, tc := range []struct {
		id, host string
		port     uint32
		message  string
	}{
		{withHelper, "10.0.0.1", 80, "only loopback"},
		{withHelper, "169.254.169.254", 80, "only loopback"},
		{withHelper, "example.com", 443, "only loopback"},
		{withHelper, "kubernetes.default.svc", 443, "only loopback"},
		{withHelper, "127.0.0.2", 80, "only loopback"},
		{withHelper, "0.0.0.0", 80, "only loopback"},
		{withHelper, "::", 80, "only loopback"},
		{withHelper, "", 80, "only loopback"},
		{withHelper, "127.0.0.1", 0, "outside 1..65535"},
		{withHelper, "127.0.0.1", 70000, "outside 1..65535"},
		{withHelper, "localhost", 65536, "outside 1..65535"},
		{without, "127.0.0.1", 8080, "forward transport"},
	} {
		c := g.login(tc.id, key)
		_, err := forward(c, tc.host, tc.port)
		var oce *gossh.OpenChannelError
		if !errors.As(err, &oce) || oce.Reason != gossh.Prohibited || !strings.Contains(oce.Message, tc.message) {
			t.Errorf("-L to %q port %d (forward transport %v): %v, want prohibited saying %q",
				tc.host, tc.port, tc.id == withHelper, err, tc.message)
		}
	}
	for _, call := range g.fc.Calls() {
		if strings.HasPrefix(call, "podaddr ") {
			t.Errorf("a refused forward asked the cluster for the helper's address: %v", g.fc.Calls())
		}
	}
	if n := g.core.Sessions(); n != 0 {
		t.Errorf("%d sessions admitted for refused forwards", n)
	}
}

// helper runs a real session helper for sandbox id on ln until the test
// ends. It accepts the gateway key the fake cluster was handed when the
// sandbox was created, as the kubelet would project it into the pod.
func helper(t *testing.T, ln net.Listener, fc *controltest.Cluster, id string) *agent.Agent {
	t.Helper()
	key := fc.HelperKey(id)
	if key == "" {
		t.Fatalf("the cluster was given no gateway key for %s", id)
	}
	keys := filepath.Join(t.TempDir(), "gateway.pub")
	if err := os.WriteFile(keys, []byte(key+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	a, err := agent.New(agent.Options{SandboxID: id, AuthorizedKeysFile: keys, Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Serve(ctx, ln) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("helper: %v", err)
		}
	})
	return a
}

// echoServer answers on 127.0.0.1:0 with what it reads, then half-closes.
func echoServer(t *testing.T) uint32 {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				io.Copy(c, c)
				c.(*net.TCPConn).CloseWrite()
			}()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		wg.Wait()
	})
	return uint32(ln.Addr().(*net.TCPAddr).Port)
}

// TestForwardThroughHelper: a loopback destination of a sandbox with the
// forward transport is reached through the sandbox's session helper, at the
// port its receipt promises and the address the cluster gives, logged in to
// with the key the sandbox's pod was given; bytes and half-closes pass both
// ways, every -L channel of one client connection shares one upstream
// connection, and the forward session ends with the client's connection.
func TestForwardThroughHelper(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := start(t, setup{sessionPort: ln.Addr().(*net.TCPAddr).Port})
	org := g.org("a")
	key, _ := g.key(org)
	id := g.sandbox(org, receipt.TransportSSH, receipt.TransportForward)
	a := helper(t, ln, g.fc, id)
	port := echoServer(t)
	c := g.login(id, key)

	payload := make([]byte, 1<<20)
	rand.Read(payload)
	for _, host := range []string{"127.0.0.1", "localhost"} {
		ch, err := forward(c, host, port)
		if err != nil {
			t.Fatalf("-L to %s:%d: %v", host, port, err)
		}
		go func() {
			ch.Write(payload)
			ch.CloseWrite()
		}()
		got, err := io.ReadAll(ch)
		ch.Close()
		if err != nil || !bytes.Equal(got, payload) {
			t.Fatalf("-L to %s: %d bytes back of %d (%v)", host, len(got), len(payload), err)
		}
	}
	if n := a.Conns(); n != 1 {
		t.Errorf("the helper saw %d gateway connections for one client connection's channels, want 1", n)
	}
	if !slices.Contains(g.fc.Calls(), "podaddr "+id) {
		t.Errorf("the helper's address was not asked of the cluster: %v", g.fc.Calls())
	}
	if got := g.core.SessionsByTransport()[receipt.TransportForward]; got != 1 {
		t.Errorf("%d forward sessions live, want 1", got)
	}
	// Where nothing listens (a closed port; ::1, which the policy allows
	// but the echo server does not listen on) the helper says so, and the
	// connection goes on.
	dead, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	deadPort := uint32(dead.Addr().(*net.TCPAddr).Port)
	dead.Close()
	for _, dest := range []struct {
		host string
		port uint32
	}{{"127.0.0.1", deadPort}, {"::1", port}} {
		var oce *gossh.OpenChannelError
		if _, err := forward(c, dest.host, dest.port); !errors.As(err, &oce) || oce.Reason != gossh.ConnectionFailed {
			t.Errorf("-L to %s port %d where nothing listens: %v, want connection failed", dest.host, dest.port, err)
		}
	}
	ch, err := forward(c, "127.0.0.1", port)
	if err != nil {
		t.Fatalf("-L after the failed ones: %v", err)
	}
	ch.Write([]byte("again"))
	ch.CloseWrite()
	if got, err := io.ReadAll(ch); err != nil || string(got) != "again" {
		t.Errorf("-L after the failed ones: %q, %v", got, err)
	}
	ch.Close()

	c.Close()
	eventually.True(t, "the forward session ended with its client's connection", func() bool { return g.core.Sessions() == 0 })
}
