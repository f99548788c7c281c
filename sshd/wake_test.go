package sshd_test

import (
	"bufio"
	"context"
	"errors"
	"strings"
	"testing"

	gossh "golang.org/x/crypto/ssh"

	"github.com/hiloop/hiloop/control"
	"github.com/hiloop/hiloop/receipt"
	"github.com/hiloop/hiloop/store"
)

// TestWakeWaitRefused: with its key's one waiting place taken by a session
// that waits for its sandbox to come up, another session on the connection
// is refused at once, exit 255 with the reason, and so is an -L channel
// (resource shortage); the waiting session goes on once the sandbox runs,
// and the next session needs no place.
func TestWakeWaitRefused(t *testing.T) {
	g := start(t, setup{limits: control.Limits{WakeWaitsPerKey: 1}})
	org := g.org("a")
	key, _ := g.key(org)
	sb, _, err := g.core.Create(context.Background(), g.admin(org),
		control.CreateRequest{Spec: store.Spec{Image: "busybox", Transports: []receipt.Transport{receipt.TransportSSH, receipt.TransportForward}}})
	if err != nil {
		t.Fatal(err)
	}
	g.observe(sb.ID, store.StateStarting)
	c := g.login(sb.ID, key)

	waiting, err := c.NewSession()
	if err != nil {
		t.Fatal(err)
	}
	defer waiting.Close()
	errOut, err := waiting.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := waiting.Start("exit 3"); err != nil {
		t.Fatal(err)
	}
	// The line comes once the session holds its place and waits.
	if line, err := bufio.NewReader(errOut).ReadString('\n'); err != nil || line != "waking "+sb.ID+"\r\n" {
		t.Fatalf("the first session's stderr: %q %v, want the line saying it waits", line, err)
	}

	r := run(t, c, "exit 0")
	if r.Exit != "exit-status 255" || !strings.Contains(r.Stderr, "may not wait for it") || !strings.Contains(r.Stderr, "this key") ||
		strings.Contains(r.Stderr, "waking") {
		t.Errorf("a second session past the key's bound: %+v, want exit 255 saying it may not wait", r)
	}
	_, err = forward(c, "127.0.0.1", 8080)
	var oce *gossh.OpenChannelError
	if !errors.As(err, &oce) || oce.Reason != gossh.ResourceShortage || !strings.Contains(oce.Message, "may not wait for it") {
		t.Errorf("an -L channel past the key's bound: %v, want resource shortage saying it may not wait", err)
	}

	g.observe(sb.ID, store.StateRunning)
	var ee *gossh.ExitError
	if err := waiting.Wait(); !errors.As(err, &ee) || ee.ExitStatus() != 3 {
		t.Fatalf("the waiting session once the sandbox runs: %v, want exit 3", err)
	}
	if r := run(t, c, "exit 0"); r.Exit != "exit-status 0" {
		t.Errorf("a session into the running sandbox: %+v", r)
	}
}
