package sshd_test

import (
	"context"
	"errors"
	"net"
	"os"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
	gossh "golang.org/x/crypto/ssh"

	"github.com/hiloop/hiloop/internal/eventually"
	"github.com/hiloop/hiloop/receipt"
	"github.com/hiloop/hiloop/sshd"
)

// TestShutdownAgainWithNothingOpen: once the gateway is shut down and no
// connection is left, a later Shutdown reports nothing open, even with a
// context already done.
func TestShutdownAgainWithNothingOpen(t *testing.T) {
	g := start(t, setup{})
	if err := g.gw.Shutdown(context.Background()); err != nil {
		t.Fatalf("Shutdown with nothing open: %v", err)
	}
	done, cancel := context.WithCancel(context.Background())
	cancel()
	for n := range 50 {
		if err := g.gw.Shutdown(done); err != nil {
			t.Fatalf("Shutdown %d again, nothing open, its context done: %v", n+2, err)
		}
	}
}

// TestShutdownClosesHandshakes: connections that have not authenticated,
// one silent and one that stopped after the version lines, are closed at
// once by Shutdown, which returns without waiting for their login grace.
func TestShutdownClosesHandshakes(t *testing.T) {
	g := start(t, setup{})
	quiet := silent(t, g.addr, "127.0.0.1")
	talked := silent(t, g.addr, "127.0.0.2")
	if !held(t, quiet) || !held(t, talked) {
		t.Fatal("a connection was refused")
	}
	if _, err := talked.Write([]byte("SSH-2.0-stalled\r\n")); err != nil {
		t.Fatal(err)
	}
	// Within the default login grace of 30 s: Shutdown succeeds only if it
	// closed them itself.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := g.gw.Shutdown(ctx); err != nil {
		t.Errorf("Shutdown with connections still logging in: %v", err)
	}
	closedByServer(t, quiet, "a silent connection at Shutdown")
	closedByServer(t, talked, "a connection in its handshake at Shutdown")
}

// TestServeAfterShutdown: a gateway shut down before it serves refuses
// to serve: Serve returns at once and closes the listener.
func TestServeAfterShutdown(t *testing.T) {
	g := start(t, setup{})
	gw := another(t, g)
	if err := gw.Shutdown(context.Background()); err != nil {
		t.Fatalf("Shutdown before Serve: %v", err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- gw.Serve(ln) }()
	select {
	case err := <-served:
		if err != nil {
			t.Errorf("Serve after Shutdown: %v", err)
		}
	case <-time.After(clientDeadline):
		t.Fatal("Serve after Shutdown kept serving")
	}
	if nc, err := net.Dial("tcp", ln.Addr().String()); err == nil {
		nc.Close()
		t.Error("the listener given to Serve after Shutdown still accepts")
	}
}

// TestShutdownAfterGraceAtAccept: a connection whose login grace passes
// while it is being accepted is closed and forgotten, so it does not keep
// Shutdown waiting for a connection that is no longer there.
func TestShutdownAfterGraceAtAccept(t *testing.T) {
	g, met := limited(t, setup{}, func(o *sshd.Options) {
		o.LoginGrace = time.Nanosecond
		o.MaxStartups, o.MaxStartupsPerSource = sshd.Startups{Start: 1000, Rate: 100, Full: 1000}, 1000
		// A grace that passes once the handshake started charges the
		// address; here every connection is to reach the grace.
		o.Penalties = sshd.Penalties{Off: true}
	})
	const conns = 1000
	for range conns {
		nc, err := net.Dial("tcp", g.addr)
		if err != nil {
			t.Fatal(err)
		}
		closedByServer(t, nc, "a connection past its login grace")
		nc.Close()
	}
	eventually.True(t, "every connection closed for its login grace", func() bool { return refused(t, met, "login_grace") >= conns })
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := g.gw.Shutdown(ctx); err != nil {
		t.Errorf("Shutdown with every connection closed: %v", err)
	}
}

// TestDrainWhileLoggingIn drains as serve does (the core, then the
// gateway) while clients log in and stay connected, idle, answering
// keepalives. Shutdown returns nil only once every connection that got in
// is closed: none can open a session after, and nothing the gateway
// started is left running.
func TestDrainWhileLoggingIn(t *testing.T) {
	leftBefore := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, leftBefore) })
	g, _ := limited(t, setup{keepAlive: 100 * time.Millisecond}, func(o *sshd.Options) {
		o.MaxConnsPerKey, o.MaxConnsPerOrg = 1000, 1000
	})
	org := g.org("a")
	key, _ := g.key(org)
	id := g.sandbox(org, receipt.TransportSSH)
	stop := make(chan struct{})
	var clients sync.WaitGroup
	var mu sync.Mutex
	var in []*gossh.Client
	for range 4 {
		clients.Go(func() {
			loginsUntil(g, id, key, stop, func(c *gossh.Client) {
				mu.Lock()
				in = append(in, c)
				mu.Unlock()
			})
		})
	}
	eventually.True(t, "clients logged in", func() bool { mu.Lock(); defer mu.Unlock(); return len(in) >= 10 })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := g.core.Close(ctx); err != nil {
		t.Errorf("close the core: %v", err)
	}
	if err := g.gw.Shutdown(ctx); err != nil {
		t.Errorf("Shutdown while clients log in and stay: %v", err)
	}
	close(stop)
	clients.Wait()
	for _, c := range in {
		if s, err := c.NewSession(); err == nil {
			s.Close()
			t.Error("a session opened on a connection after Shutdown returned")
		}
		if err := c.Wait(); errors.Is(err, os.ErrDeadlineExceeded) {
			t.Error("a connection that got in was left open by Shutdown")
		}
		c.Close()
	}
	t.Logf("%d connections got in", len(in))
}

// TestServeTwoListeners: the gateway serves two listeners at once, and
// Shutdown stops both.
func TestServeTwoListeners(t *testing.T) {
	g := start(t, setup{})
	gw := another(t, g)
	served := make(chan error, 2)
	var addrs []string
	for range 2 {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addrs = append(addrs, ln.Addr().String())
		go func() { served <- gw.Serve(ln) }()
	}
	for _, addr := range addrs {
		nc := silent(t, addr, "127.0.0.1")
		if !held(t, nc) {
			t.Fatalf("the gateway did not greet on %s", addr)
		}
	}
	if err := gw.Shutdown(context.Background()); err != nil {
		t.Errorf("Shutdown: %v", err)
	}
	for range 2 {
		if err := <-served; err != nil {
			t.Errorf("Serve: %v", err)
		}
	}
	for _, addr := range addrs {
		if nc, err := net.Dial("tcp", addr); err == nil {
			nc.Close()
			t.Errorf("%s still accepts after Shutdown", addr)
		}
	}
}

// another is a second gateway on g's core and host key, not yet serving.
func another(t *testing.T, g *gateway) *sshd.Gateway {
	t.Helper()
	hostKey, err := g.db.HostKey(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	gw, err := sshd.New(sshd.Options{Control: g.core, HostKey: hostKey})
	if err != nil {
		t.Fatal(err)
	}
	return gw
}

// loginsUntil logs in to g as id with key over and over, handing each
// client that got in to got, until stop is closed. A dial or login that
// fails (as every one does past Shutdown) is no test failure.
func loginsUntil(g *gateway, id string, key gossh.Signer, stop <-chan struct{}, got func(*gossh.Client)) {
	for {
		select {
		case <-stop:
			return
		default:
		}
		nc, err := net.Dial("tcp", g.addr)
		if err != nil {
			continue
		}
		nc.SetDeadline(time.Now().Add(clientDeadline))
		cfg := &gossh.ClientConfig{User: id, Auth: []gossh.AuthMethod{gossh.PublicKeys(key)}, HostKeyCallback: gossh.FixedHostKey(g.host)}
		conn, chans, reqs, err := gossh.NewClientConn(nc, g.addr, cfg)
		if err != nil {
			nc.Close()
			continue
		}
		got(gossh.NewClient(conn, chans, reqs))
	}
}
