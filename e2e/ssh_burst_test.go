package e2e_test

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hiloop/hiloop/internal/e2e"
	"github.com/hiloop/hiloop/internal/eventually"
)

// An agent platform runs on one host and opens SSH sessions to many
// sandboxes at once: the gateway's limits before authentication must let
// such a burst through while they hold off a stranger from the same
// address.

// burstFlags raise the tenant's own caps (sessions, channels, connections
// of its one key) to the burst's size: those are budgets an operator sets
// per organization, not limits on strangers, and the burst tests only the
// latter.
var burstFlags = []string{"--exec-per-org", "256", "--ssh-max-channels-per-org", "256", "--ssh-max-conns-per-key", "256"}

// burstSandboxes creates n running sandboxes in a new organization and
// registers an SSH key for it.
func burstSandboxes(t testing.TB, in *e2e.Instance, n int) (*sshUser, []string) {
	t.Helper()
	token := in.NewOrg("burst", n, n)
	ids := make([]string, n)
	for i := range ids {
		ids[i] = in.Create(token, "busybox").ID
	}
	for _, id := range ids {
		in.WaitState(token, id, "running")
	}
	return newSSHUser(t, in, token), ids
}

// sshResult is how one ssh process ended.
type sshResult struct {
	code           int
	stdout, stderr string
	// ttfb is from the start of the process to the first byte of its
	// output.
	ttfb time.Duration
}

// firstOut is stdout that notes when its first byte came.
type firstOut struct {
	start time.Time
	mu    sync.Mutex
	buf   bytes.Buffer
	at    time.Duration
}

func (f *firstOut) Write(p []byte) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.at == 0 && len(p) > 0 {
		f.at = time.Since(f.start)
	}
	return f.buf.Write(p)
}

// sshBurst runs the stock client once per element of args, all at once,
// and returns how each ended.
func sshBurst(t testing.TB, args [][]string) []sshResult {
	t.Helper()
	res := make([]sshResult, len(args))
	var wg sync.WaitGroup
	for i, a := range args {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cmd := exec.Command("ssh", a...)
			out := &firstOut{start: time.Now()}
			var errOut bytes.Buffer
			cmd.Stdout, cmd.Stderr = out, &errOut
			if err := cmd.Start(); err != nil {
				res[i] = sshResult{code: -1, stderr: err.Error()}
				return
			}
			timer := time.AfterFunc(3*time.Minute, func() { cmd.Process.Kill() })
			cmd.Wait()
			timer.Stop()
			out.mu.Lock()
			res[i] = sshResult{code: cmd.ProcessState.ExitCode(), stdout: out.buf.String(), stderr: errOut.String(), ttfb: out.at}
			out.mu.Unlock()
		}()
	}
	wg.Wait()
	return res
}

// TestSSHBurstFromOneAddress: 200 stock ssh clients at once from one
// address, across 50 sandboxes of one organization, all run their command
// and exit 0, with the default limits on connections not yet
// authenticated; none is refused or penalised.
func TestSSHBurstFromOneAddress(t *testing.T) {
	requireSSH(t)
	const clients, sandboxes = 200, 50
	in := e2e.Serve(t, filepath.Join(t.TempDir(), "h.db"), e2e.NewNamespace(t), append([]string{"--metrics-listen", "127.0.0.1:0"}, burstFlags...)...)
	u, ids := burstSandboxes(t, in, sandboxes)
	args := make([][]string, clients)
	for i := range args {
		args[i] = u.args(ids[i%sandboxes]+"@127.0.0.1", "echo ok")
	}
	failed := 0
	for i, r := range sshBurst(t, args) {
		if r.code != 0 || r.stdout != "ok\n" {
			failed++
			if failed <= 5 {
				t.Errorf("client %d: exit %d, stdout %q, stderr %q", i, r.code, r.stdout, r.stderr)
			}
		}
	}
	if failed > 0 {
		t.Errorf("%d of %d clients at once from one address failed", failed, clients)
	}
	for _, reason := range []string{"startups", "startups_per_source", "startup_wait", "silent", "penalty", "per_key", "per_org"} {
		if n := metric(t, in, `hiloop_ssh_refused_connections_total{reason="`+reason+`"}`); n != 0 {
			t.Errorf("%v connections refused for %s", n, reason)
		}
	}
}

// TestSSHSilentFloodFromOneAddress: 1,000 TCP connections from one address
// that say nothing are refused or closed, with at most
// --ssh-max-startups-per-source of them in their key exchange and
// --ssh-startup-queue waiting at once, and a legitimate login from that
// same address still runs its command; the API answers throughout.
func TestSSHSilentFloodFromOneAddress(t *testing.T) {
	requireSSH(t)
	const silents, held = 1000, 128 + 256
	// A long login grace: the silent connections held must not reach it
	// (which would penalise their address) before the login below.
	in := e2e.Serve(t, filepath.Join(t.TempDir(), "h.db"), e2e.NewNamespace(t), "--metrics-listen", "127.0.0.1:0", "--ssh-login-grace", "5m")
	sb := in.Create(in.Token, "busybox", "--wait")
	u := newSSHUser(t, in, in.Token)
	fds := func() int {
		ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", in.Cmd.Process.Pid))
		if err != nil {
			t.Fatal(err)
		}
		return len(ents)
	}
	before := fds()

	var closed atomic.Int64
	var named atomic.Int64
	conns := make([]net.Conn, 0, silents)
	var wg sync.WaitGroup
	for range silents {
		nc, err := net.Dial("tcp", in.SSHAddr)
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, nc)
		wg.Add(1)
		go func() {
			defer wg.Done()
			nc.SetReadDeadline(time.Now().Add(10 * time.Minute))
			all, err := io.ReadAll(nc)
			if !errors.Is(err, os.ErrDeadlineExceeded) && !errors.Is(err, net.ErrClosed) {
				closed.Add(1)
				if strings.Contains(string(all), "--ssh-") {
					named.Add(1)
				}
			}
		}()
	}
	t.Cleanup(func() {
		for _, nc := range conns {
			nc.Close()
		}
		wg.Wait()
	})
	eventually.Within(t, "the silent connections past the cap closed", 2*time.Minute, func() (bool, error) {
		return closed.Load() >= silents-held, fmt.Errorf("%d closed", closed.Load())
	})
	if grew := fds() - before; grew > held+300 {
		t.Errorf("1,000 silent connections left serve holding %d more descriptors, want at most the %d places and what refusals hold briefly", grew, held)
	}
	if status, body := in.Call(in.Token, "GET", "/v1/sandboxes/"+sb.ID, ""); status != 200 {
		t.Errorf("the API during the flood: %d %s", status, body)
	}
	if out, errOut, code := u.run(sb.ID, "echo through"); code != 0 || out != "through\n" {
		t.Errorf("a login from the flooding address: exit %d, %q %q", code, out, errOut)
	}
	// Those waiting for a place are refused, with a line naming the
	// limit, when their wait ends.
	eventually.Within(t, "the waiting silent connections refused", 2*time.Minute, func() (bool, error) {
		return metric(t, in, `hiloop_ssh_refused_connections_total{reason="startup_wait"}`) > 0 && named.Load() > 0,
			fmt.Errorf("%d closed, %d told why", closed.Load(), named.Load())
	})
	evicted := metric(t, in, `hiloop_ssh_refused_connections_total{reason="silent"}`)
	if evicted+metric(t, in, `hiloop_ssh_refused_connections_total{reason="startup_wait"}`) < silents-held {
		t.Errorf("%v silent connections gave their place to newer ones, want at least %d with those refused after waiting", evicted, silents-held)
	}
}

// TestSSHPenaltyPerAddress: an address whose logins fail 50 times is
// refused, a good key from it too, with a message naming
// --ssh-penalties; another address logs in.
func TestSSHPenaltyPerAddress(t *testing.T) {
	requireSSH(t)
	in := e2e.Serve(t, filepath.Join(t.TempDir(), "h.db"), e2e.NewNamespace(t), "--metrics-listen", "127.0.0.1:0")
	sb := in.Create(in.Token, "busybox", "--wait")
	u := newSSHUser(t, in, in.Token)
	stranger := newSSHUser(t, in, in.Token)
	in.MustCLI(in.Token, "ssh-key", "delete", keyID(t, in, in.Token, stranger.key))

	denied, penalised := 0, 0
	for range 50 {
		_, errOut, code := stranger.ssh("", stranger.args("-b", "127.0.0.2", sb.ID+"@127.0.0.1", "true")...)
		switch {
		case code != 255:
			t.Fatalf("an unregistered key: exit %d %q", code, errOut)
		case strings.Contains(errOut, "--ssh-penalties"):
			penalised++
		case strings.Contains(errOut, "Permission denied"):
			denied++
		default:
			t.Errorf("an unregistered key refused without a reason: %q", errOut)
		}
	}
	if denied == 0 || penalised == 0 || denied > 5 {
		t.Errorf("%d logins denied, then %d refused for the penalty; want a few, then the rest", denied, penalised)
	}
	if _, errOut, code := u.ssh("", u.args("-b", "127.0.0.2", sb.ID+"@127.0.0.1", "true")...); code != 255 || !strings.Contains(errOut, "--ssh-penalties") {
		t.Errorf("a good key from the penalised address: exit %d %q, want refused naming --ssh-penalties", code, errOut)
	}
	if out, errOut, code := u.ssh("", u.args("-b", "127.0.0.1", sb.ID+"@127.0.0.1", "echo fine")...); code != 0 || out != "fine\n" {
		t.Errorf("a good key from another address: exit %d %q %q", code, out, errOut)
	}
	if n := metric(t, in, `hiloop_ssh_penalties_total{event="authfail"}`); n < float64(denied) {
		t.Errorf("%v failed logins charged, want %d", n, denied)
	}
	if n := metric(t, in, `hiloop_ssh_refused_connections_total{reason="penalty"}`); n != float64(penalised+1) {
		t.Errorf("%v refused for the penalty, want %d", n, penalised+1)
	}
}
