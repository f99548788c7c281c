package e2e_test

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hiloop/hiloop/internal/e2e"
	"github.com/hiloop/hiloop/internal/eventually"
)

// Attacks on what a stranger or a tenant can open, each once a way to hold
// hiloop's resources without a bound, run against serve as deployed.

// clientPatience is how long an attacking client waits for serve to act
// on it: far past the deadlines the tests give serve, so only a deadline
// that never fires fails.
const clientPatience = 45 * time.Second

// TestAttackHTTPHeldConnections: a stranger who announces a body and never
// sends it, even to /healthz (which no rate limit holds), has the
// connection closed once --http-io-timeout passes, and so has a caller who
// asks for an answer and never reads it; one who starts requests and
// dribbles their headers holds at most --http-max-header-reads-per-source
// connections; a long poll that waits past the deadlines on a request
// without a body is answered.
func TestAttackHTTPHeldConnections(t *testing.T) {
	in := e2e.ServeInProcess(t, filepath.Join(t.TempDir(), "h.db"), e2e.NewNamespace(t), "--http-io-timeout", "2s",
		"--http-max-header-reads-per-source", "2")
	addr := strings.TrimPrefix(in.URL, "http://")
	dial := func(request string) net.Conn {
		nc, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { nc.Close() })
		nc.SetDeadline(time.Now().Add(clientPatience))
		if _, err := io.WriteString(nc, request); err != nil {
			t.Fatal(err)
		}
		return nc
	}
	for _, request := range []string{
		"GET /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n",
		"POST /v1/sandboxes HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + in.Token + "\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"image\":",
		"POST /v1/keys HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer hl_madeup\r\nTransfer-Encoding: chunked\r\n\r\n5\r\n{\"na",
	} {
		nc := dial(request)
		if _, err := io.Copy(io.Discard, nc); errors.Is(err, os.ErrDeadlineExceeded) {
			t.Errorf("serve held a connection whose body never came: %q", request)
		}
	}

	// An answer the client never reads, larger than the kernel's buffers
	// (a megabyte of NUL bytes is 6 MB of JSON): serve's write waits on the
	// client and gives up, and serve lets go of the connection, and of the
	// command's session.
	sb := in.Create(in.Token, "busybox", "--wait")
	body := `{"command":["sh","-c","head -c 1000000 /dev/zero"]}`
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	nc.(*net.TCPConn).SetReadBuffer(4 << 10)
	fmt.Fprintf(nc, "POST /v1/sandboxes/%s/exec/run HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s",
		sb.ID, in.Token, len(body), body)
	eventually.Within(t, "serve let go of a connection whose client never read its answer", clientPatience, func() (bool, error) {
		return !serveHolds(t, nc), errors.New("serve still holds it")
	})

	// Connections that start a request and never finish its headers hold
	// at most --http-max-header-reads-per-source places of one address:
	// once every one has sent the rest, those past the cap were closed and
	// the others are answered.
	var partial []net.Conn
	for range 5 {
		partial = append(partial, dial("GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: "))
	}
	eventually.Within(t, "serve reading the headers of two of them", clientPatience, func() (bool, error) {
		n := 0
		for _, nc := range partial {
			nc.Write([]byte("a")) // a read more: only a request needing several holds a place
			if serveHolds(t, nc) {
				n++
			}
		}
		return n == 2, fmt.Errorf("%d held", n)
	})
	answered := 0
	for _, nc := range partial {
		io.WriteString(nc, "1\r\n\r\n")
		if line, err := bufio.NewReader(nc).ReadString('\n'); err == nil && strings.HasPrefix(line, "HTTP/1.1 200") {
			answered++
		} else if errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatal("serve neither answered nor closed a connection whose headers were complete")
		}
	}
	if answered != 2 {
		t.Errorf("%d of 5 connections reading headers at once from one address were answered, want 2", answered)
	}

	// The deadlines count only while serve waits on the client: a long
	// poll on a sandbox that never changes is answered when it ends, past
	// them.
	nc = dial("GET /v1/sandboxes/" + sb.ID + "?while=running&wait=5s HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + in.Token + "\r\n\r\n")
	line, err := bufio.NewReader(nc).ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "HTTP/1.1 200") {
		t.Errorf("a long poll past --http-io-timeout: %q, %v", line, err)
	}
}

// TestAttackSSHChannelsOnOneConnection: one SSH connection holds at most
// --ssh-max-channels-per-conn channels. Each may hold an SSH window of
// unread data, so a tenant that opened channels without a bound on one
// connection could hold any amount of the gateway's memory. The stock
// client multiplexing sessions over a master connection (ControlMaster)
// gets the one past the cap refused, and a session again once one ended.
func TestAttackSSHChannelsOnOneConnection(t *testing.T) {
	requireSSH(t)
	in := e2e.ServeInProcess(t, filepath.Join(t.TempDir(), "h.db"), e2e.NewNamespace(t), "--ssh-max-channels-per-conn", "3")
	sb := in.Create(in.Token, "busybox", "--wait")
	u := newSSHUser(t, in, in.Token)
	// A socket path must fit in sun_path (108 bytes).
	dir, err := os.MkdirTemp("", "cm")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	mux := func(extra ...string) []string {
		return u.args(append([]string{"-o", "ControlPath=" + filepath.Join(dir, "m"), "-o", "ControlPersist=yes"}, extra...)...)
	}
	if out, errOut, code := u.ssh("", mux("-o", "ControlMaster=yes", sb.ID+"@127.0.0.1", "echo master")...); code != 0 || out != "master\n" {
		t.Fatalf("the master's first command: code %d out %q err %q", code, out, errOut)
	}
	t.Cleanup(func() { exec.Command("ssh", mux("-O", "exit", sb.ID+"@127.0.0.1")...).Run() })
	// Three sessions that stay open fill the connection's places.
	var held []*exec.Cmd
	for i := range 3 {
		cmd := exec.Command("ssh", mux("-o", "ControlMaster=no", sb.ID+"@127.0.0.1", "echo started; sleep 120")...)
		out := &e2e.SyncBuffer{}
		cmd.Stdout, cmd.Stderr = out, out
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		held = append(held, cmd)
		t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
		eventually.Within(t, fmt.Sprintf("held session %d running", i), 30*time.Second, func() (bool, error) {
			return strings.Contains(out.String(), "started"), errors.New(out.String())
		})
	}
	// The stock client says the master refused the session, and then
	// opens a connection of its own, which has places of its own.
	eventually.Within(t, "a fourth session refused on the master connection", 30*time.Second, func() (bool, error) {
		_, errOut, _ := u.ssh("", mux("-v", "-o", "ControlMaster=no", sb.ID+"@127.0.0.1", "echo fourth")...)
		return strings.Contains(errOut, "Session open refused by peer"), errors.New(errOut)
	})
	if !strings.Contains(in.Out.String(), "ssh channel refused: too many open") {
		t.Errorf("serve did not log the refusal:\n%s", in.Out.String())
	}
	held[0].Process.Kill()
	held[0].Wait()
	eventually.Within(t, "a session on the master again once one ended", 30*time.Second, func() (bool, error) {
		out, errOut, code := u.ssh("", mux("-v", "-o", "ControlMaster=no", sb.ID+"@127.0.0.1", "echo again")...)
		return code == 0 && out == "again\n" && !strings.Contains(errOut, "refused"), errors.New(errOut)
	})
}

// serveHolds reports whether serve still holds the server side of nc, a
// TCP connection to it over IPv4 loopback: the kernel lists the socket
// with an inode while a process has it open (a closed socket the kernel
// still winds down has inode 0).
func serveHolds(t *testing.T, nc net.Conn) bool {
	t.Helper()
	hexAddr := func(a net.Addr) string {
		ta := a.(*net.TCPAddr)
		ip := ta.IP.To4()
		return fmt.Sprintf("%02X%02X%02X%02X:%04X", ip[3], ip[2], ip[1], ip[0], ta.Port)
	}
	server, client := hexAddr(nc.RemoteAddr()), hexAddr(nc.LocalAddr())
	table, err := os.ReadFile("/proc/net/tcp")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(table), "\n") {
		f := strings.Fields(line)
		if len(f) > 9 && f[1] == server && f[2] == client && f[9] != "0" {
			return true
		}
	}
	return false
}

// TestAttackSSHForwardRevokedMidTransfer: deleting an SSH key while one of
// its -L channels is in the middle of a transfer ends the transfer and the
// client's connection, not only new channels: a stream the sandbox would
// send forever stops, and ssh -L exits.
func TestAttackSSHForwardRevokedMidTransfer(t *testing.T) {
	in, _, sb, u := forwardSandbox(t)
	_, port, _ := net.SplitHostPort(loopbackServer(t, func(c *net.TCPConn) {
		chunk := make([]byte, 32<<10)
		for {
			if _, err := c.Write(chunk); err != nil {
				return
			}
		}
	}))
	local, ssh, sshOut := forward(t, u, sb.ID, port)
	c, err := net.Dial("tcp", local)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetReadDeadline(time.Now().Add(clientPatience))
	if _, err := io.ReadFull(c, make([]byte, 1<<20)); err != nil {
		t.Fatalf("the stream before the delete: %v", err)
	}
	in.MustCLI(in.Token, "ssh-key", "delete", keyID(t, in, in.Token, u.key))
	if _, err := io.Copy(io.Discard, c); errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatal("the stream went on after its key was deleted")
	}
	done := make(chan struct{})
	go func() { ssh.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(clientPatience):
		t.Fatalf("ssh -L outlived its key:\n%s", sshOut.String())
	}
}
