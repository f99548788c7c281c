package e2e_test

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/hiloop/hiloop/control"
	hlforward "github.com/hiloop/hiloop/forward"
	"github.com/hiloop/hiloop/internal/e2e"
	"github.com/hiloop/hiloop/internal/eventually"
	"github.com/hiloop/hiloop/k8s"
	"github.com/hiloop/hiloop/store"
)

// serveForward starts serve backing the forward transport, with the local
// cluster's helper runner.
func serveForward(t testing.TB) (*e2e.Instance, string) {
	t.Helper()
	dir := e2e.Helpers(t)
	in := e2e.ServeInProcess(t, filepath.Join(t.TempDir(), "h.db"), e2e.NewNamespace(t),
		"--transports", "exec,ssh,forward", "--agent-image", "hiloop-agent:local")
	return in, dir
}

// loopbackServer serves every connection on the host's loopback, which in
// the local cluster is the pod's, with handle, and returns its address.
func loopbackServer(t testing.TB, handle func(c *net.TCPConn)) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				handle(c.(*net.TCPConn))
			}()
		}
	}()
	return l.Addr().String()
}

// echoServer echoes every connection and returns its port.
func echoServer(t testing.TB) string {
	_, port, _ := net.SplitHostPort(loopbackServer(t, func(c *net.TCPConn) {
		io.Copy(c, c)
		c.CloseWrite()
	}))
	return port
}

// forwardSandbox serves with the forward transport and returns a running
// sandbox that has it, its helper listening, and a user whose key is
// registered.
func forwardSandbox(t testing.TB) (*e2e.Instance, string, e2e.Sandbox, *sshUser) {
	t.Helper()
	requireSSH(t)
	in, dir := serveForward(t)
	sb := in.Create(in.Token, "busybox", "--transport", "ssh", "--transport", "forward", "--wait")
	u := newSSHUser(t, in, in.Token)
	waitHelper(t, in, dir, sb.ID)
	return in, dir, sb, u
}

// forward runs ssh -N -L to localhost:port inside the sandbox and returns
// the local address and the running ssh.
func forward(t *testing.T, u *sshUser, id, port string) (string, *exec.Cmd, *e2e.SyncBuffer) {
	t.Helper()
	local := e2e.FreeAddr(t)
	cmd := exec.Command("ssh", u.args("-N", "-o", "ExitOnForwardFailure=yes", "-L", local+":localhost:"+port, id+"@127.0.0.1")...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	out := &e2e.SyncBuffer{}
	cmd.Stderr = out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
		if t.Failed() {
			t.Logf("ssh -L's stderr:\n%s", out.String())
		}
	})
	e2e.WaitListening(t, "-L listening", local)
	return local, cmd, out
}

// roundTrip sends n random bytes through addr to the echo server and
// checks the SHA-256 of what comes back.
func roundTrip(t *testing.T, addr string, n int64) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	sent, got := sha256.New(), sha256.New()
	errc := make(chan error, 1)
	go func() {
		_, err := io.Copy(io.MultiWriter(c, sent), io.LimitReader(rand.Reader, n))
		c.(*net.TCPConn).CloseWrite()
		errc <- err
	}()
	m, err := io.Copy(got, c)
	if err != nil || <-errc != nil || m != n {
		t.Fatalf("moved %d of %d bytes: %v", m, n, err)
	}
	if string(sent.Sum(nil)) != string(got.Sum(nil)) {
		t.Fatal("the bytes that came back differ from those sent")
	}
}

// waitHelper waits until the sandbox's session helper listens.
func waitHelper(t testing.TB, in *e2e.Instance, dir, id string) {
	t.Helper()
	eventually.Within(t, "helper listening", 30*time.Second, func() (bool, error) {
		return strings.Contains(helperLog(t, in, dir, id), "session helper listening"), nil
	})
}

// helperLog is the session helper log of the sandbox's pod.
func helperLog(t testing.TB, in *e2e.Instance, dir, id string) string {
	t.Helper()
	pod, err := e2e.SharedCluster(t).Clients.Kube.CoreV1().Pods(in.NS).Get(context.Background(), k8s.ObjectName(id), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(filepath.Join(dir, "helpers", string(pod.UID), "agent.log"))
	return string(b)
}

// TestSSHForward: ssh -L through the gateway and the sandbox's session
// helper moves 100 MB intact, ten parallel channels share one upstream
// connection, a rotated gateway key reaches the helper, and stopping the
// sandbox ends the forward.
func TestSSHForward(t *testing.T) {
	in, dir, sb, u := forwardSandbox(t)
	port := echoServer(t)
	local, ssh, sshOut := forward(t, u, sb.ID, port)

	roundTrip(t, local, 100<<20)
	var wg sync.WaitGroup
	for range 10 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			roundTrip(t, local, 1<<20)
		}()
	}
	wg.Wait()
	if n := strings.Count(helperLog(t, in, dir, sb.ID), "gateway connected"); n != 1 {
		t.Fatalf("%d upstream connections for one client connection, want 1:\n%s", n, helperLog(t, in, dir, sb.ID))
	}

	// Rotation: one annotate patch per sandbox, with the key derived for
	// that sandbox; the helper takes the new key and refuses the old one.
	// It only ever takes its own sandbox's id as the user name and its own
	// sandbox's key, never the gateway key itself.
	old := helperLoginKey(t, in.DB, sb.ID)
	in.MustCLI("", "ssh-rotate-agent-key", "--kubeconfig", e2e.SharedCluster(t).Kubeconfig, "--namespace", in.NS)
	cur := helperLoginKey(t, in.DB, sb.ID)
	podIP := e2e.Kubectl(t, "get", "pod", "-n", in.NS, k8s.ObjectName(sb.ID), "-o", "jsonpath={.status.podIP}")
	helper := net.JoinHostPort(podIP, "2223")
	dial := func(sandboxID string, k ed25519.PrivateKey) error {
		cfg, err := hlforward.ClientConfig(sandboxID, k, func(ed25519.PublicKey) error { return nil })
		if err != nil {
			return err
		}
		nc, err := net.DialTimeout("tcp", helper, 10*time.Second)
		if err != nil {
			return err
		}
		defer nc.Close()
		nc.SetDeadline(time.Now().Add(10 * time.Second))
		_, err = hlforward.Handshake(nc, cfg)
		return err
	}
	eventually.Within(t, "the helper takes the new key", 60*time.Second, func() (bool, error) {
		return dial(sb.ID, cur) == nil && dial(sb.ID, old) != nil, nil
	})
	if dial("gateway", cur) == nil {
		t.Error("the helper let in a connection that names another than its sandbox")
	}
	if dial(sb.ID, gatewayKey(t, in.DB)) == nil {
		t.Error("the helper let in the gateway key itself")
	}
	// A new client connection reaches the helper with the new key.
	local2, _, _ := forward(t, u, sb.ID, port)
	roundTrip(t, local2, 1<<20)

	// Stopping the sandbox ends the forward.
	in.MustCLI(in.Token, "sandbox", "stop", sb.ID)
	done := make(chan struct{})
	go func() { ssh.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		t.Fatalf("ssh -L outlived the sandbox's stop:\n%s", sshOut.String())
	}
}

// TestHelperHostKeyChange: a helper that shows another host key within one
// pod's life is refused, and the sandbox turns attention with
// helper_host_key_changed.
func TestHelperHostKeyChange(t *testing.T) {
	in, dir, sb, u := forwardSandbox(t)
	port := echoServer(t)
	local, _, _ := forward(t, u, sb.ID, port)
	roundTrip(t, local, 1<<10) // the helper's key is pinned for this pod
	podIP := e2e.Kubectl(t, "get", "pod", "-n", in.NS, k8s.ObjectName(sb.ID), "-o", "jsonpath={.status.podIP}")
	// The helper process dies within the same pod, and the local
	// cluster's runner starts it again, as a kubelet restarts a
	// container: a new host key.
	exec.Command("pkill", "-f", "agent --listen "+podIP+":2223").Run()
	eventually.Within(t, "helper back", 30*time.Second, func() (bool, error) {
		return strings.Count(helperLog(t, in, dir, sb.ID), "session helper listening") == 2, nil
	})
	errOut := forwardOnce(t, u, sb.ID, "localhost:"+port)
	if !strings.Contains(errOut, "open failed") {
		t.Fatalf("forward through a helper with a changed key: %q", errOut)
	}
	got := in.WaitState(in.Token, sb.ID, "attention")
	if got.Anomaly != "helper_host_key_changed" {
		t.Fatalf("anomaly %q", got.Anomaly)
	}
}

// TestSSHForwardRefused: -L into a sandbox without a helper says so.
func TestSSHForwardRefused(t *testing.T) {
	requireSSH(t)
	in, _ := serveForward(t)
	sb := in.Create(in.Token, "busybox", "--transport", "ssh", "--wait")
	u := newSSHUser(t, in, in.Token)
	errOut := forwardOnce(t, u, sb.ID, "localhost:"+echoServer(t))
	if !regexp.MustCompile(`administratively prohibited: .*no session helper`).MatchString(errOut) {
		t.Fatalf("-L without a helper: %q", errOut)
	}
}

// gatewayKey reads the gateway's current key from the record.
func gatewayKey(t *testing.T, db string) ed25519.PrivateKey {
	t.Helper()
	s, err := store.Open(context.Background(), store.Options{Path: db})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	k, err := s.PrivateKey(context.Background(), store.KeyGateway)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// helperLoginKey is the key the gateway logs in to the sandbox's helper
// with now, derived from its current key.
func helperLoginKey(t *testing.T, db, id string) ed25519.PrivateKey {
	t.Helper()
	k, err := control.HelperLoginKey(gatewayKey(t, db), id)
	if err != nil {
		t.Fatal(err)
	}
	return k
}
