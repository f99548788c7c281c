package sshd_test

import (
	"context"
	"log/slog"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	gossh "golang.org/x/crypto/ssh"

	"github.com/hiloop/hiloop/control"
	"github.com/hiloop/hiloop/control/controltest"
	"github.com/hiloop/hiloop/receipt"
	"github.com/hiloop/hiloop/sshd"
	"github.com/hiloop/hiloop/store"
)

// sweepEvery is the core's sweep interval in these tests: short, so that
// waiting for a few sweeps costs little.
const sweepEvery = 20 * time.Millisecond

// sweptGateway is a real gateway on 127.0.0.1:0 over a real core and
// record whose sweep runs every sweepEvery, as serve runs it; its clean-up
// drains it as serve does.
func sweptGateway(t *testing.T) *gateway {
	t.Helper()
	ctx := context.Background()
	db, err := store.Open(ctx, store.Options{Path: filepath.Join(t.TempDir(), "h.db")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	logs := &lockedBuffer{}
	log := slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	fc := &controltest.Cluster{}
	core, err := control.New(control.Options{Store: db, Cluster: fc, Exec: controltest.Exec{Run: workload},
		Caps: control.Capabilities{Transports: receipt.Transports()}, SweepInterval: sweepEvery, Log: log})
	if err != nil {
		t.Fatal(err)
	}
	hostKey, err := db.HostKey(ctx)
	if err != nil {
		t.Fatal(err)
	}
	gw, err := sshd.New(sshd.Options{Control: core, HostKey: hostKey, Log: log})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	swept, served := make(chan error, 1), make(chan error, 1)
	go func() { swept <- core.Run(runCtx) }()
	go func() { served <- gw.Serve(ln) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		stop()
		if err := <-swept; err != nil {
			t.Errorf("run the core: %v", err)
		}
		if err := core.Close(ctx); err != nil {
			t.Errorf("close the core: %v", err)
		}
		if err := gw.Shutdown(ctx); err != nil {
			t.Errorf("shut the gateway down: %v", err)
		}
		if err := <-served; err != nil {
			t.Errorf("serve: %v", err)
		}
		if t.Failed() {
			t.Logf("gateway log:\n%s", logs)
		}
	})
	return &gateway{t: t, db: db, core: core, fc: fc, gw: gw, addr: ln.Addr().String(), host: hostKey.PublicKey(), logs: logs}
}

// closedConn fails the test unless the gateway closes c's connection
// within a generous deadline, and then refuses a new session on it.
func closedConn(t *testing.T, c *gossh.Client, why string) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		c.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(clientDeadline / 2):
		t.Fatalf("the connection stayed open after %s", why)
	}
	if s, err := c.NewSession(); err == nil {
		s.Close()
		t.Fatalf("a new session opened on the connection after %s", why)
	}
}

// idleLogin logs in with key and runs one command, as an OpenSSH master
// connection does before it sits idle waiting for the next one.
func idleLogin(t *testing.T, g *gateway, id string, key gossh.Signer) *gossh.Client {
	t.Helper()
	c := g.login(id, key)
	if r := run(t, c, "exit 0"); r.Exit != "exit-status 0" {
		t.Fatalf("the first session: %+v", r)
	}
	return c
}

// TestDeletedKeyClosesConnection: deleting an SSH key through the core
// closes the connections it authenticated, an idle one included, at once;
// another key's connection stays.
func TestDeletedKeyClosesConnection(t *testing.T) {
	g := sweptGateway(t)
	org := g.org("a")
	key, sshKey := g.key(org)
	other, _ := g.key(org)
	id := g.sandbox(org, receipt.TransportSSH)
	c := idleLogin(t, g, id, key)
	stays := idleLogin(t, g, id, other)

	if err := g.core.DeleteSSHKey(context.Background(), g.admin(org), sshKey.ID); err != nil {
		t.Fatal(err)
	}
	closedConn(t, c, "its key was deleted")
	if r := run(t, stays, "exit 3"); r.Exit != "exit-status 3" {
		t.Errorf("another key's connection after the delete: %+v", r)
	}
}

// TestOfflineRevokeClosesConnection: an SSH key deleted in the record by
// another process (the core is not told) closes the connections it
// authenticated within a few sweeps, and ends their live sessions with a
// line saying why.
func TestOfflineRevokeClosesConnection(t *testing.T) {
	g := sweptGateway(t)
	org := g.org("a")
	key, sshKey := g.key(org)
	id := g.sandbox(org, receipt.TransportSSH)
	c := idleLogin(t, g, id, key)
	e := startEcho(t, c)

	if err := g.db.DeleteSSHKey(context.Background(), org.ID, sshKey.ID); err != nil {
		t.Fatal(err)
	}
	if r := e.wait(t); r.Exit != "exit-status 255" || !strings.Contains(r.Stderr, control.ErrKeyRevoked.Error()) {
		t.Errorf("the live session: %+v, want exit 255 saying the key was revoked", r)
	}
	closedConn(t, c, "its key was deleted offline")
}

// TestStoppedSandboxClosesConnection: stopping the sandbox through the core
// ends its live session with what to do and closes the connection;
// deleting another closes its idle connection too.
func TestStoppedSandboxClosesConnection(t *testing.T) {
	g := sweptGateway(t)
	org := g.org("a")
	key, _ := g.key(org)
	who := g.admin(org)
	stopped, deleted := g.sandbox(org, receipt.TransportSSH), g.sandbox(org, receipt.TransportSSH)
	c := idleLogin(t, g, stopped, key)
	e := startEcho(t, c)
	idle := idleLogin(t, g, deleted, key)

	if _, err := g.core.SetMode(context.Background(), who, stopped, store.ModeStopped); err != nil {
		t.Fatal(err)
	}
	if r := e.wait(t); r.Exit != "exit-status 255" || !strings.Contains(r.Stderr, control.ErrSandboxChanged.Error()) {
		t.Errorf("the live session: %+v, want exit 255 saying the sandbox stopped", r)
	}
	closedConn(t, c, "its sandbox was stopped")
	if _, err := g.core.SetMode(context.Background(), who, deleted, store.ModeDeleted); err != nil {
		t.Fatal(err)
	}
	closedConn(t, idle, "its sandbox was deleted")
}

// TestQuarantineClosesConnection: a quarantine the mirror records closes
// the sandbox's connections within a few sweeps.
func TestQuarantineClosesConnection(t *testing.T) {
	g := sweptGateway(t)
	org := g.org("a")
	key, _ := g.key(org)
	id := g.sandbox(org, receipt.TransportSSH)
	c := idleLogin(t, g, id, key)
	if _, err := g.db.Observe(context.Background(), id, store.Observation{State: store.StateQuarantined, Anomaly: "host_namespaces"}); err != nil {
		t.Fatal(err)
	}
	closedConn(t, c, "its sandbox was quarantined")
}
