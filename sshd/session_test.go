package sshd_test

import (
	"bufio"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	gossh "golang.org/x/crypto/ssh"

	"github.com/hiloop/hiloop/api"
	"github.com/hiloop/hiloop/receipt"
	"github.com/hiloop/hiloop/store"
)

// TestSessionRequestsRefused: on a session channel the gateway answers
// false to every request it does not serve, when the client asks for a
// reply: env (the sandbox gets the image's environment only), agent
// forwarding, X11 and subsystems (sftp). The stock client never asks for a
// reply to env and agent requests, so only a protocol-level client sees
// this. pty-req is the control: the same session does get a true, and runs
// a command after all the refusals.
func TestSessionRequestsRefused(t *testing.T) {
	g := start(t, setup{})
	org := g.org("a")
	key, _ := g.key(org)
	id := g.sandbox(org, receipt.TransportSSH)
	c := g.login(id, key)
	ch, reqs, err := c.OpenChannel("session", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	for _, tc := range []struct {
		typ     string
		payload []byte
		want    bool
	}{
		{"env", gossh.Marshal(struct{ Name, Value string }{"LD_PRELOAD", "/tmp/x.so"}), false},
		{"auth-agent-req@openssh.com", nil, false},
		{"x11-req", gossh.Marshal(struct {
			Single        bool
			Proto, Cookie string
			Screen        uint32
		}{false, "MIT-MAGIC-COOKIE-1", "00", 0}), false},
		{"subsystem", gossh.Marshal(struct{ Name string }{"sftp"}), false},
		{"signal", gossh.Marshal(struct{ Signal string }{"INT"}), false},
		{"pty-req", ptyReq("xterm", 80, 24), true},
	} {
		ok, err := ch.SendRequest(tc.typ, true, tc.payload)
		if err != nil || ok != tc.want {
			t.Errorf("session request %s: answered %v (err %v), want %v", tc.typ, ok, err, tc.want)
		}
	}
	want := result{Exit: "exit-status 0", Stdout: "tty=true $0=xterm\n"}
	if diff := cmp.Diff(want, execute(t, ch, reqs, "tty")); diff != "" {
		t.Errorf("the command after the refusals (-want +got)\n%s", diff)
	}
}

// ptyReq is a pty-req payload (RFC 4254 6.2).
func ptyReq(term string, cols, rows uint32) []byte {
	return gossh.Marshal(struct {
		Term                 string
		Cols, Rows, PxW, PxH uint32
		Modes                string
	}{term, cols, rows, 0, 0, ""})
}

// TestSessionStartsOnce: a session channel runs one shell or command; a
// second start, and a terminal asked for once it runs, are refused.
func TestSessionStartsOnce(t *testing.T) {
	g := start(t, setup{})
	org := g.org("a")
	key, _ := g.key(org)
	c := g.login(g.sandbox(org, receipt.TransportSSH), key)
	e := startEcho(t, c)
	for _, req := range []struct {
		typ     string
		payload []byte
	}{
		{"exec", gossh.Marshal(struct{ Command string }{"exit 0"})},
		{"shell", nil},
		{"pty-req", ptyReq("xterm", 80, 24)},
	} {
		if ok, err := e.sess.SendRequest(req.typ, true, req.payload); err != nil || ok {
			t.Errorf("%s on a running session: answered %v (err %v), want false", req.typ, ok, err)
		}
	}
	e.roundTrip(t, "still the first command")
}

// TestGlobalRequestsAndChannelsRefused: -R (tcpip-forward), its Unix-socket
// form, and every channel type but session and direct-tcpip are refused;
// the connection is still usable after.
func TestGlobalRequestsAndChannelsRefused(t *testing.T) {
	g := start(t, setup{})
	org := g.org("a")
	key, _ := g.key(org)
	c := g.login(g.sandbox(org, receipt.TransportSSH), key)
	for _, req := range []struct {
		typ     string
		payload []byte
	}{
		{"tcpip-forward", gossh.Marshal(struct {
			Addr string
			Port uint32
		}{"127.0.0.1", 0})},
		{"streamlocal-forward@openssh.com", gossh.Marshal(struct{ Path string }{"/tmp/hiloop.sock"})},
	} {
		if ok, _, err := c.SendRequest(req.typ, true, req.payload); err != nil || ok {
			t.Errorf("global request %s: answered %v (err %v), want false", req.typ, ok, err)
		}
	}
	for _, ch := range []struct {
		typ     string
		payload []byte
	}{
		{"direct-streamlocal@openssh.com", gossh.Marshal(struct {
			Path, Reserved string
			ReservedPort   uint32
		}{"/var/run/docker.sock", "", 0})},
		{"x11", gossh.Marshal(struct {
			Host string
			Port uint32
		}{"127.0.0.1", 6000})},
		{"auth-agent@openssh.com", nil},
		{"hiloop-no-such-type", nil},
	} {
		_, _, err := c.OpenChannel(ch.typ, ch.payload)
		var oce *gossh.OpenChannelError
		if !errors.As(err, &oce) || oce.Reason != gossh.UnknownChannelType {
			t.Errorf("channel %s: %v, want refused as an unknown channel type", ch.typ, err)
		}
	}
	if r := run(t, c, "exit 0"); r.Exit != "exit-status 0" {
		t.Errorf("a command after the refusals: %+v", r)
	}
}

// TestCommandExitStatus: what the workload's exec status says comes back
// exact: an exit status, or an exit-signal for a death by signal; a stream
// that ended without a status is never 0.
func TestCommandExitStatus(t *testing.T) {
	g := start(t, setup{})
	org := g.org("a")
	key, _ := g.key(org)
	c := g.login(g.sandbox(org, receipt.TransportSSH), key)
	for _, tc := range []struct {
		cmd  string
		want result
		// stderr is what standard error must contain (nothing when empty).
		stderr string
	}{
		{cmd: "exit 0", want: result{Exit: "exit-status 0"}},
		{cmd: "exit 3", want: result{Exit: "exit-status 3"}},
		// 128+n without a signal name is a plain exit status.
		{cmd: "exit 130", want: result{Exit: "exit-status 130"}},
		{cmd: "signal 143 terminated", want: result{Exit: "exit-signal TERM terminated"}},
		{cmd: "signal 137 killed", want: result{Exit: "exit-signal KILL killed"}},
		{cmd: "print", want: result{Exit: "exit-status 0", Stdout: "out\n"}, stderr: "err\n"},
		// Without a terminal, $0 is sh: no TERM.
		{cmd: "tty", want: result{Exit: "exit-status 0", Stdout: "tty=false $0=sh\n"}},
		{cmd: "nostatus", want: result{Exit: "exit-status 255"}, stderr: "before the command's exit status arrived"},
		{cmd: "unreachable", want: result{Exit: "exit-status 255"}, stderr: "the cluster did not answer"},
	} {
		t.Run(tc.cmd, func(t *testing.T) {
			got := run(t, c, tc.cmd)
			if (tc.stderr == "") != (got.Stderr == "") || !strings.Contains(got.Stderr, tc.stderr) {
				t.Errorf("stderr %q, want %q", got.Stderr, tc.stderr)
			}
			if strings.Contains(got.Stderr, "10.96.0.1") {
				t.Errorf("the cluster's own error reached the client: %q", got.Stderr)
			}
			got.Stderr = ""
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("(-want +got)\n%s", diff)
			}
		})
	}
}

// TestCommandLineLimits: an ssh command is held to the same command-line
// limits as the API's exec (control.CheckArgv): a NUL byte or a command
// past api.MaxArgvBytes is refused with the reason, and nothing runs.
func TestCommandLineLimits(t *testing.T) {
	g := start(t, setup{})
	org := g.org("a")
	key, _ := g.key(org)
	c := g.login(g.sandbox(org, receipt.TransportSSH), key)
	for _, tc := range []struct{ name, cmd, stderr string }{
		{"nul", "exit 0\x00", "refused: command arguments cannot contain NUL bytes"},
		{"long", "exit 0;" + strings.Repeat(" ", api.MaxArgvBytes), fmt.Sprintf("refused: command exceeds %d bytes", api.MaxArgvBytes)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := run(t, c, tc.cmd)
			if got.Exit != "exit-status 255" || got.Stdout != "" || !strings.Contains(got.Stderr, tc.stderr) {
				t.Errorf("exit %q, stdout %q, stderr %q; want 255 and %q", got.Exit, got.Stdout, got.Stderr, tc.stderr)
			}
		})
	}
}

// TestTerminal: a PTY session's shell gets a terminal, TERM from the PTY
// request, the PTY request's window size and then every window change.
func TestTerminal(t *testing.T) {
	g := start(t, setup{})
	org := g.org("a")
	key, _ := g.key(org)
	c := g.login(g.sandbox(org, receipt.TransportSSH), key)
	sess, err := c.NewSession()
	if err != nil {
		t.Fatal(err)
	}
	defer sess.Close()
	if err := sess.RequestPty("xterm-256color", 40, 100, gossh.TerminalModes{gossh.ECHO: 0}); err != nil {
		t.Fatal(err)
	}
	pipe, err := sess.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	out := bufio.NewReader(pipe)
	if err := sess.Shell(); err != nil {
		t.Fatal(err)
	}
	var got []string
	line := func() {
		l, err := out.ReadString('\n')
		if err != nil {
			t.Fatalf("after %q: %v", got, err)
		}
		got = append(got, strings.TrimSuffix(l, "\n"))
	}
	line()
	line()
	if err := sess.WindowChange(50, 120); err != nil {
		t.Fatal(err)
	}
	line()
	if err := sess.Wait(); err != nil {
		t.Errorf("shell: %v", err)
	}
	if diff := cmp.Diff([]string{"tty=true TERM=xterm-256color", "100x40", "120x50"}, got); diff != "" {
		t.Errorf("the shell saw (-want +got)\n%s", diff)
	}
}

// TestSessionRefused: a key of the sandbox's organization logs in, and a
// session the core does not admit ends at once with exit 255 and one line
// that says what to do.
func TestSessionRefused(t *testing.T) {
	g := start(t, setup{})
	org := g.org("a")
	key, _ := g.key(org)
	stopped := g.sandbox(org, receipt.TransportSSH)
	g.observe(stopped, store.StateStopped)
	quarantined := g.sandbox(org, receipt.TransportSSH)
	g.observe(quarantined, store.StateQuarantined)
	for _, tc := range []struct {
		name, id, stderr string
	}{
		{"without the ssh transport", g.sandbox(org, receipt.TransportExec), "not created with the ssh transport"},
		{"stopped", stopped, "start it with: hiloop sandbox start " + stopped},
		{"quarantined", quarantined, "quarantined"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := run(t, g.login(tc.id, key), "exit 0")
			if got.Exit != "exit-status 255" || !strings.Contains(got.Stderr, tc.stderr) {
				t.Errorf("%s, stderr %q; want exit-status 255 and %q", got.Exit, got.Stderr, tc.stderr)
			}
		})
	}
	if n := g.core.Sessions(); n != 0 {
		t.Errorf("%d sessions live after refusals", n)
	}
}

// TestExecAnsweredBeforeClose: a shell or exec request that asks for a
// reply is answered before the gateway closes the session, so a client that
// waits for the answer before it looks for the exit status (x/crypto's
// Session.Run, paramiko's exec_command) gets the exit status of a quick
// command or of a refused session.
func TestExecAnsweredBeforeClose(t *testing.T) {
	g := start(t, setup{})
	org := g.org("a")
	key, _ := g.key(org)
	running := g.login(g.sandbox(org, receipt.TransportSSH), key)
	stopped := g.sandbox(org, receipt.TransportSSH)
	g.observe(stopped, store.StateStopped)
	refused := g.login(stopped, key)
	for i := range 50 {
		for _, tc := range []struct {
			c    *gossh.Client
			cmd  string
			want int
		}{{running, "exit 3", 3}, {refused, "exit 0", 255}} {
			sess, err := tc.c.NewSession()
			if err != nil {
				t.Fatal(err)
			}
			err = sess.Run(tc.cmd)
			sess.Close()
			var ee *gossh.ExitError
			if !errors.As(err, &ee) || ee.ExitStatus() != tc.want {
				t.Fatalf("run %d of %q: %v, want exit status %d", i, tc.cmd, err, tc.want)
			}
		}
	}
}
