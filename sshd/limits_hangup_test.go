package sshd_test

import (
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/hiloop/hiloop/sshd"
)

// TestWaiterThatHungUpGivesWay: a connection waiting for a place whose
// client hung up (closed after its version line, or reset) gives its place
// in the queue back at once, not when StartupWait ends: connections that
// cost their sender nothing cannot fill the queue and keep a client that
// waits out, and the address that gave up is not charged for it.
func TestWaiterThatHungUpGivesWay(t *testing.T) {
	g, met := limited(t, setup{}, func(o *sshd.Options) {
		o.MaxStartups, o.StartupQueue, o.StartupWait, o.LoginGrace = sshd.Startups{Start: 1, Rate: 100, Full: 1}, 1, time.Hour, time.Hour
	})
	waiting := func(n int) {
		t.Helper()
		eventually(t, fmt.Sprintf("%d waiting", n), func() bool { return counter(t, met, `hiloop_ssh_startups{state="waiting"}`) == n })
	}
	if _, ok := speaking(t, g.addr, "127.0.0.1"); !ok {
		t.Fatal("a connection within the caps was refused")
	}
	for _, reset := range []bool{false, true} {
		w := silent(t, g.addr, "127.0.0.2")
		if _, err := w.Write([]byte("SSH-2.0-gives-up\r\n")); err != nil {
			t.Fatal(err)
		}
		waiting(1)
		if reset {
			w.(*net.TCPConn).SetLinger(0)
		}
		w.Close()
		// Without the fix it holds the queue for StartupWait, an hour.
		waiting(0)
	}
	// The queue is free: the next connection waits, it is not refused.
	w := silent(t, g.addr, "127.0.0.3")
	if _, err := w.Write([]byte("SSH-2.0-waits\r\n")); err != nil {
		t.Fatal(err)
	}
	waiting(1)
	if got := refused(t, met, "startups"); got != 0 {
		t.Errorf("refused past the queue: %d, want 0", got)
	}
	if got := counter(t, met, `hiloop_ssh_penalties_total{event="noauth"}`); got != 0 {
		t.Errorf("noauth penalties: %d, want 0 for clients that gave up waiting", got)
	}
}
