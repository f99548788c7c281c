package sshd_test

import (
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"testing"

	gossh "golang.org/x/crypto/ssh"

	"github.com/hiloop/hiloop/internal/eventually"
	"github.com/hiloop/hiloop/receipt"
	"github.com/hiloop/hiloop/store"
)

// TestForwardRefusedByAnotherSandboxsHelper: a helper of another sandbox
// answering the dial, as one could when the network handed a dead pod's
// address to another tenant's pod, refuses the gateway: the user is the
// wrong sandbox id and the key was made for another sandbox. The -L
// channel open fails, the helper accepted no connection, and the forward
// session ends.
func TestForwardRefusedByAnotherSandboxsHelper(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := start(t, setup{sessionPort: ln.Addr().(*net.TCPAddr).Port})
	org, other := g.org("a"), g.org("b")
	key, _ := g.key(org)
	mine := g.sandbox(org, receipt.TransportSSH, receipt.TransportForward)
	theirs := g.sandbox(other, receipt.TransportSSH, receipt.TransportForward)
	foreign := helper(t, ln, g.fc, theirs)
	port := echoServer(t)

	c := g.login(mine, key)
	_, err = forward(c, "127.0.0.1", port)
	var oce *gossh.OpenChannelError
	if !errors.As(err, &oce) || oce.Reason != gossh.ConnectionFailed {
		t.Fatalf("-L through another sandbox's helper: %v, want the channel open to fail", err)
	}
	if n := foreign.Conns(); n != 0 {
		t.Errorf("the other sandbox's helper accepted %d gateway connections", n)
	}
	eventually.True(t, "the refused forward session ended", func() bool { return g.core.Sessions() == 0 })
	sb, err := g.db.SandboxAnyOrg(context.Background(), mine)
	if err != nil || sb.State != store.StateRunning {
		t.Errorf("a refused login changed the sandbox: %s (%v)", sb.State, err)
	}
}

// TestForwardRefusedForPodNotObserved: when the pod the cluster has is not
// the one the record observed (a record that lags a replaced or dead pod),
// the gateway does not dial its address, and the -L channel open says
// why.
func TestForwardRefusedForPodNotObserved(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := start(t, setup{sessionPort: ln.Addr().(*net.TCPAddr).Port})
	org := g.org("a")
	key, _ := g.key(org)
	id := g.sandbox(org, receipt.TransportSSH, receipt.TransportForward)
	a := helper(t, ln, g.fc, id)
	if _, err := g.db.Observe(context.Background(), id, store.Observation{State: store.StateRunning, PodUID: "uid-of-a-dead-pod"}); err != nil {
		t.Fatal(err)
	}
	c := g.login(id, key)
	_, err = forward(c, "127.0.0.1", echoServer(t))
	var oce *gossh.OpenChannelError
	if !errors.As(err, &oce) || oce.Reason != gossh.ConnectionFailed || !strings.Contains(oce.Message, "the sandbox's pod is not serving") {
		t.Fatalf("-L with a record that lags its pod: %v, want a refusal saying the pod is not serving", err)
	}
	if n := a.Conns(); n != 0 {
		t.Errorf("the helper was dialled %d times", n)
	}
}

// TestForwardOldHelper: a helper that greets in SSH, as one started before
// the gateway moved to TLS does, refuses the -L channel at once with a
// message that says to restart the sandbox, rather than holding it until
// the dial's deadline.
func TestForwardOldHelper(t *testing.T) {
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
				defer c.Close()
				c.Write([]byte("SSH-2.0-hiloop-agent\r\n"))
				io.Copy(io.Discard, c)
			}()
		}
	}()
	g := start(t, setup{sessionPort: ln.Addr().(*net.TCPAddr).Port})
	org := g.org("a")
	key, _ := g.key(org)
	id := g.sandbox(org, receipt.TransportSSH, receipt.TransportForward)
	c := g.login(id, key)
	_, err = forward(c, "127.0.0.1", echoServer(t))
	var oce *gossh.OpenChannelError
	if !errors.As(err, &oce) || oce.Reason != gossh.ConnectionFailed || oce.Message != "the sandbox's session helper is older than the gateway; restart the sandbox" {
		t.Fatalf("-L through a helper of the SSH protocol: %v", err)
	}
	eventually.True(t, "the refused forward session ended", func() bool { return g.core.Sessions() == 0 })
}
