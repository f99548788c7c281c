package sshd_test

import (
	"context"
	"errors"
	"net"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
	gossh "golang.org/x/crypto/ssh"

	"github.com/hiloop/hiloop/control"
	"github.com/hiloop/hiloop/internal/eventually"
	"github.com/hiloop/hiloop/receipt"
)

// TestKeepAlive: once a connection has a channel, the gateway asks it
// every KeepAlive whether it is still there. A client that answers stays
// connected past KeepAliveMax asks; one that stops answering is closed.
func TestKeepAlive(t *testing.T) {
	const asks = 3
	g := start(t, setup{keepAlive: 300 * time.Millisecond, keepAliveMax: asks})
	org := g.org("a")
	key, _ := g.key(org)
	id := g.sandbox(org, receipt.TransportSSH)

	// open connects and opens an idle session channel, which starts the
	// keepalives.
	open := func(t *testing.T) (gossh.Conn, <-chan *gossh.Request) {
		conn, chans, reqs, err := g.raw(id, gossh.PublicKeys(key))
		if err != nil {
			t.Fatal(err)
		}
		go func() {
			for nc := range chans {
				nc.Reject(gossh.Prohibited, "no")
			}
		}()
		ch, chReqs, err := conn.OpenChannel("session", nil)
		if err != nil {
			t.Fatal(err)
		}
		go gossh.DiscardRequests(chReqs)
		t.Cleanup(func() { ch.Close() })
		return conn, reqs
	}

	t.Run("answering", func(t *testing.T) {
		conn, reqs := open(t)
		for n := 0; n < 2*asks+1; n++ {
			req, ok := <-reqs
			if !ok {
				t.Fatalf("closed after %d answered keepalives: %v", n, conn.Wait())
			}
			if req.Type != "keepalive@openssh.com" || !req.WantReply {
				t.Fatalf("global request %q (want reply %v)", req.Type, req.WantReply)
			}
			req.Reply(false, nil) // what OpenSSH answers, and an answer
		}
		go gossh.DiscardRequests(reqs)
		if _, _, err := conn.SendRequest("keepalive@openssh.com", true, nil); err != nil {
			t.Fatalf("the connection of a client that answers was closed: %v", err)
		}
	})

	t.Run("silent", func(t *testing.T) {
		conn, reqs := open(t)
		n := 0
		for req := range reqs {
			if req.Type == "keepalive@openssh.com" {
				n++ // and never answered
			}
		}
		if err := conn.Wait(); errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("the gateway never closed a client that stopped answering (%d keepalives)", n)
		}
		// x/crypto sends one global request at a time, so the later asks
		// wait behind the first unanswered one; the gateway counts the
		// intervals without an answer.
		if n == 0 || !strings.Contains(g.logs.String(), "stopped answering keepalives") {
			t.Errorf("closed after %d keepalives, not for want of answers", n)
		}
	})
}

// TestShutdownEndsSessions drains as serve does: the core ends every live
// session, each with exit 255 and a line saying why, then the gateway's
// Shutdown returns once the clients left, and accepts no one after.
// Nothing the gateway started is left running.
func TestShutdownEndsSessions(t *testing.T) {
	leftBefore := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, leftBefore) })
	g := start(t, setup{keepAlive: time.Second})
	org := g.org("a")
	key, _ := g.key(org)
	id := g.sandbox(org, receipt.TransportSSH)
	c := g.login(id, key)
	e := startEcho(t, c)

	type closed struct{ core, gateway error }
	done := make(chan closed, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		var r closed
		r.core = g.core.Close(ctx)
		r.gateway = g.gw.Shutdown(ctx)
		done <- r
	}()
	r := e.wait(t)
	if r.Exit != "exit-status 255" || !strings.Contains(r.Stderr, control.ErrShuttingDown.Error()) {
		t.Errorf("the session at shutdown: %+v, want exit 255 saying hiloop is shutting down", r)
	}
	c.Close() // as ssh does once its session ended
	if got := <-done; got.core != nil || got.gateway != nil {
		t.Fatalf("close the core: %v; shut the gateway down: %v", got.core, got.gateway)
	}
	refusesAfterShutdown(t, g)
}

// TestShutdownDuringLogins: Shutdown while clients log in returns once
// every connection ended (those still logging in are closed, those that
// got in leave), and no one is accepted after. It is the race detector
// that checks the gateway's own wait here: gliderlabs' Shutdown joined a
// handshake that ended while it waited to a WaitGroup already waited on.
func TestShutdownDuringLogins(t *testing.T) {
	g := start(t, setup{})
	org := g.org("a")
	key, _ := g.key(org)
	id := g.sandbox(org, receipt.TransportSSH)
	stop := make(chan struct{})
	var clients sync.WaitGroup
	var in atomic.Int64
	for range 8 {
		clients.Go(func() {
			loginsUntil(g, id, key, stop, func(c *gossh.Client) {
				in.Add(1)
				c.Close()
			})
		})
	}
	defer clients.Wait()
	defer close(stop)
	eventually.True(t, "clients logging in", func() bool { return in.Load() >= 20 })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := g.gw.Shutdown(ctx); err != nil {
		t.Errorf("Shutdown while clients log in: %v", err)
	}
	refusesAfterShutdown(t, g)
}

// refusesAfterShutdown fails t if g's gateway accepts a connection.
func refusesAfterShutdown(t *testing.T, g *gateway) {
	t.Helper()
	if nc, err := net.Dial("tcp", g.addr); err == nil {
		nc.Close()
		t.Error("the gateway accepts connections after Shutdown")
	}
}

// TestShutdownClosesWhatIsLeft: a connection still open when Shutdown's
// deadline passes is closed, and Shutdown says so.
func TestShutdownClosesWhatIsLeft(t *testing.T) {
	g := start(t, setup{})
	org := g.org("a")
	key, _ := g.key(org)
	c := g.login(g.sandbox(org, receipt.TransportSSH), key)
	startEcho(t, c)
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if err := g.gw.Shutdown(ctx); err == nil {
		t.Error("Shutdown reported nothing with a connection still open past its deadline")
	}
	if err := c.Wait(); errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatal("the connection left open at shutdown was not closed")
	}
	eventually.True(t, "the closed connection's session ended", func() bool { return g.core.Sessions() == 0 })
}

// TestRevokedKey: deleting an SSH key ends its live session with exit 255
// and a line saying why, leaves the sessions of the organization's other
// keys, and refuses a new login with it.
func TestRevokedKey(t *testing.T) {
	g := start(t, setup{})
	org := g.org("a")
	revoked, revokedKey := g.key(org)
	kept, _ := g.key(org)
	id := g.sandbox(org, receipt.TransportSSH)
	gone := startEcho(t, g.login(id, revoked))
	stays := startEcho(t, g.login(id, kept))

	if err := g.core.DeleteSSHKey(context.Background(), g.admin(org), revokedKey.ID); err != nil {
		t.Fatal(err)
	}
	if r := gone.wait(t); r.Exit != "exit-status 255" || !strings.Contains(r.Stderr, control.ErrKeyRevoked.Error()) {
		t.Errorf("the deleted key's session: %+v, want exit 255 saying the key was revoked", r)
	}
	stays.roundTrip(t, "another key's session goes on")
	if _, err := g.dial(id, gossh.PublicKeys(revoked)); err == nil {
		t.Error("a deleted key logged in")
	}
}

// TestRevokedKeyConnectionOpensNoSession: the connection a deleted key
// authenticated stays open (only its sessions end), and must not be a way
// to open new ones: a session opened on it afterwards must not run.
func TestRevokedKeyConnectionOpensNoSession(t *testing.T) {
	g := start(t, setup{})
	org := g.org("a")
	key, sshKey := g.key(org)
	id := g.sandbox(org, receipt.TransportSSH)
	c := g.login(id, key)
	e := startEcho(t, c)
	if err := g.core.DeleteSSHKey(context.Background(), g.admin(org), sshKey.ID); err != nil {
		t.Fatal(err)
	}
	e.wait(t)
	sess, err := c.NewSession()
	if err != nil {
		return // refused at the channel: fine
	}
	defer sess.Close()
	var out, errOut strings.Builder
	sess.Stdout, sess.Stderr = &out, &errOut
	err = sess.Run("exit 0")
	if err == nil {
		t.Errorf("a new session on the deleted key's connection ran a command (exit 0)")
	}
}
