package sshd_test

import (
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/hiloop/hiloop/internal/eventually"
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
		eventually.True(t, fmt.Sprintf("%d waiting", n), func() bool { return counter(t, met, `hiloop_ssh_startups{state="waiting"}`) == n })
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

// TestPromotedWaiterNotSilentAtOnce: a connection that waited in the queue
// is greeted only when it gets its place, and a client that reads the
// gateway's version before it sends its own (RFC 4253 lets it) is silent
// until it answers. It is not taken for silent for the time it waited: an
// arrival over the cap right after it got its place does not take it.
func TestPromotedWaiterNotSilentAtOnce(t *testing.T) {
	g, met := limited(t, setup{}, func(o *sshd.Options) {
		o.MaxStartups, o.StartupQueue, o.StartupWait, o.LoginGrace = sshd.Startups{Start: 1, Rate: 100, Full: 1}, 2, time.Hour, time.Hour
	})
	holder, ok := speaking(t, g.addr, "127.0.0.1")
	if !ok {
		t.Fatal("a connection within the caps was refused")
	}
	w := silent(t, g.addr, "127.0.0.2")
	queued := time.Now()
	eventually.True(t, "1 waiting", func() bool { return counter(t, met, `hiloop_ssh_startups{state="waiting"}`) == 1 })
	// It waits longer than a client may stay silent once greeted; the
	// machine being slow only makes it longer.
	eventually.True(t, "3s past", func() bool { return time.Since(queued) > 3*time.Second })
	holder.Close()
	if !held(t, w) {
		t.Fatal("the waiting connection was not given the freed place")
	}
	// w has read the greeting and not answered yet. A silent arrival
	// over the cap (it cannot jump a place later) takes w's place at
	// once, or waits.
	silent(t, g.addr, "127.0.0.3")
	eventually.True(t, "the arrival placed", func() bool {
		return counter(t, met, `hiloop_ssh_startups{state="waiting"}`) == 1 || refused(t, met, "silent") > 0
	})
	if got := refused(t, met, "silent"); got != 0 {
		t.Errorf("closed as silent: %d, want 0: a client just greeted after its wait lost its place", got)
	}
}
