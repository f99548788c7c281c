package e2e_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hiloop/hiloop/app"
	"github.com/hiloop/hiloop/internal/e2e"
	"github.com/hiloop/hiloop/internal/eventually"
	"github.com/hiloop/hiloop/k8s"
	"github.com/hiloop/hiloop/localcluster"
)

// TestServeReadyAndCleanShutdown: serve answers, stops cleanly on SIGINT,
// and writes the first admin key to its file, mode 0600. Its stdout is not
// a terminal, so the key is nowhere in its output: the log names the file.
func TestServeReadyAndCleanShutdown(t *testing.T) {
	in := e2e.Serve(t, filepath.Join(t.TempDir(), "h.db"), e2e.NewNamespace(t))
	if !in.NewKey || !strings.HasPrefix(in.Token, "hl_") {
		t.Fatalf("first start wrote no admin key to %s (%q)", in.KeyFile, in.Token)
	}
	fi, err := os.Stat(in.KeyFile)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Fatalf("key file mode %v, want 0600", fi.Mode().Perm())
	}
	status, body := in.Call("", "GET", "/healthz", "")
	if status != 200 {
		t.Fatalf("healthz %d %s", status, body)
	}
	in.Stop()
	if out := in.Out.String(); strings.Contains(out, in.Token) || !strings.Contains(out, "key_file="+in.KeyFile) {
		t.Fatalf("the output carries the key, or does not say where it is:\n%s", out)
	}
	// A second start on the same database issues no new admin key.
	again := e2e.Serve(t, in.DB, in.NS)
	if again.NewKey || again.Token != in.Token {
		t.Fatal("second start issued another admin key")
	}
	if _, _, code := again.CLI(in.Token, "sandbox", "list"); code != 0 {
		t.Fatal("first key no longer works after restart")
	}
}

// TestServeBootstrapKeyOnATerminal: on a terminal, serve prints the first
// admin key as well, the same key as in its file.
func TestServeBootstrapKeyOnATerminal(t *testing.T) {
	c := e2e.SharedCluster(t)
	db := filepath.Join(t.TempDir(), "h.db")
	term := e2e.Tmux(t, 200, 50, strings.Join([]string{e2e.Binary(t), "serve", "--listen", "127.0.0.1:0", "--ssh-listen", "127.0.0.1:0",
		"--db", db, "--kubeconfig", c.Kubeconfig, "--namespace", e2e.NewNamespace(t), "--storage-classes", "kwok-volume"}, " ")+
		"; sleep 600") // the window stays, with what serve said, should it fail
	var shown string
	eventually.Within(t, "the key on the terminal", 60*time.Second, func() (bool, error) {
		screen := term.Screen()
		if strings.Contains(screen, "hiloop: error") {
			t.Fatalf("serve failed:\n%s", screen)
		}
		if m := e2e.TokenRE.FindStringSubmatch(screen); m != nil {
			shown = m[1]
		}
		return shown != "" && strings.Contains(screen, "serving on"), fmt.Errorf("screen:\n%s", screen)
	})
	key, err := os.ReadFile(db + ".admin-key")
	if err != nil || strings.TrimSpace(string(key)) != shown {
		t.Fatalf("key file %q (%v), the terminal shows %q", key, err, shown)
	}
}

func TestServeUnreachableCluster(t *testing.T) {
	kc := filepath.Join(t.TempDir(), "kubeconfig")
	cfg := `apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: u, user: {token: x}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
current-context: c
`
	if err := writeFile(kc, cfg); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(e2e.Binary(t), "serve", "--kubeconfig", kc, "--db", filepath.Join(t.TempDir(), "h.db"), "--listen", "127.0.0.1:0", "--cluster-timeout", "3s")
	out, err := cmd.CombinedOutput()
	ee, ok := err.(*exec.ExitError)
	if !ok || ee.ExitCode() == 0 {
		t.Fatalf("serve against an unreachable cluster: err %v, output %q", err, out)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if len(lines) != 1 || !strings.Contains(lines[0], "127.0.0.1:1") || !strings.Contains(lines[0], "unreachable") {
		t.Fatalf("want one clear line naming the cluster, got:\n%s", out)
	}
}

func TestServeBadFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		flag string
	}{
		{[]string{"--listen", "nowhere"}, "--listen"},
		{[]string{"--namespace", "Bad_NS"}, "--namespace"},
		{[]string{"--runtime-class", ""}, "--runtime-class"},
		{[]string{"--transports", "telnet"}, "--transports"},
		{[]string{"--kubeconfig", "/does/not/exist"}, "--kubeconfig"},
		{[]string{"--cluster-timeout", "soon"}, "--cluster-timeout"},
		{[]string{"--log-level", "loud"}, "--log-level"},
		{[]string{"--no-such-flag"}, "--no-such-flag"},
		{[]string{"--event-retention", "-1h"}, "--event-retention"},
		{[]string{"--self-check-interval", "10ms"}, "--self-check-interval"},
	} {
		cmd := exec.Command(e2e.Binary(t), append([]string{"serve"}, tc.args...)...)
		cmd.Env = []string{"PATH=/usr/bin:/bin", "HOME=" + t.TempDir()}
		out, err := cmd.CombinedOutput()
		ee, ok := err.(*exec.ExitError)
		if !ok || ee.ExitCode() != 2 || !strings.Contains(string(out), tc.flag) {
			t.Errorf("serve %v: err %v, want exit 2 naming %s; output:\n%s", tc.args, err, tc.flag, out)
		}
	}
	// The env equivalents are checked the same way.
	cmd := exec.Command(e2e.Binary(t), "serve")
	cmd.Env = []string{"PATH=/usr/bin:/bin", "HILOOP_LISTEN=bad"}
	out, err := cmd.CombinedOutput()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 2 || !strings.Contains(string(out), "--listen") {
		t.Errorf("HILOOP_LISTEN=bad: %v %s", err, out)
	}
}

// TestLifecycleWithVolume: create, running (observed from the pod), stop,
// stopped, start, running, delete, deleted, with a volume whose claim
// survives stop/start and is collected on delete.
func TestLifecycleWithVolume(t *testing.T) {
	in := e2e.ServeInProcess(t, filepath.Join(t.TempDir(), "h.db"), e2e.NewNamespace(t))
	sb := in.Create(in.Token, "busybox", "--volume", "data:1Gi:/data", "--wait")
	if sb.State != "running" {
		t.Fatalf("create --wait returned state %s", sb.State)
	}
	claim := "data-" + k8s.ObjectName(sb.ID)
	pvcUID := e2e.Kubectl(t, "get", "pvc", "-n", in.NS, claim, "-o", "jsonpath={.metadata.uid}")
	podOwner := e2e.Kubectl(t, "get", "pod", "-n", in.NS, k8s.ObjectName(sb.ID), "-o", "jsonpath={.metadata.labels.hiloop\\.dev/sandbox}")
	if podOwner != sb.ID {
		t.Fatalf("pod carries sandbox label %q", podOwner)
	}

	in.MustCLI(in.Token, "sandbox", "stop", sb.ID)
	in.MustCLI(in.Token, "sandbox", "wait", sb.ID, "--for", "stopped", "--timeout", "60s")
	if out, _ := e2e.SharedCluster(t).Kubectl(context.Background(), "get", "pod", "-n", in.NS, k8s.ObjectName(sb.ID)); !strings.Contains(out, "NotFound") {
		t.Fatalf("stopped sandbox still has a pod: %s", out)
	}
	if got := e2e.Kubectl(t, "get", "pvc", "-n", in.NS, claim, "-o", "jsonpath={.metadata.uid}"); got != pvcUID {
		t.Fatalf("claim did not survive stop: uid %q, was %q", got, pvcUID)
	}

	in.MustCLI(in.Token, "sandbox", "start", sb.ID)
	in.MustCLI(in.Token, "sandbox", "wait", sb.ID, "--for", "running", "--timeout", "60s")
	if got := e2e.Kubectl(t, "get", "pvc", "-n", in.NS, claim, "-o", "jsonpath={.metadata.uid}"); got != pvcUID {
		t.Fatalf("claim did not survive start: uid %q, was %q", got, pvcUID)
	}
	mounted := e2e.Kubectl(t, "get", "pod", "-n", in.NS, k8s.ObjectName(sb.ID), "-o", "jsonpath={.spec.volumes[*].persistentVolumeClaim.claimName}")
	if mounted != claim {
		t.Fatalf("replacement pod mounts %q, want %q", mounted, claim)
	}

	in.MustCLI(in.Token, "sandbox", "delete", sb.ID)
	in.MustCLI(in.Token, "sandbox", "wait", sb.ID, "--for", "deleted", "--timeout", "60s")
	eventually.Within(t, "claim collected", 60*time.Second, func() (bool, error) {
		out, _ := e2e.SharedCluster(t).Kubectl(context.Background(), "get", "pvc", "-n", in.NS, claim)
		return strings.Contains(out, "NotFound"), nil
	})

	events := in.MustCLI(in.Token, "sandbox", "events", sb.ID, "-o", "json")
	for _, want := range []string{`"to": "pending"`, `"to": "starting"`, `"to": "running"`, `"to": "stopped"`, `"to": "deleted"`} {
		if !strings.Contains(events, want) {
			t.Errorf("events lack %s:\n%s", want, events)
		}
	}
}

func TestTTLExpiry(t *testing.T) {
	in := e2e.ServeInProcess(t, filepath.Join(t.TempDir(), "h.db"), e2e.NewNamespace(t))
	retain := in.Create(in.Token, "busybox", "--ttl", "6s", "--wait")
	del := in.Create(in.Token, "busybox", "--ttl", "6s", "--shutdown-policy", "delete", "--wait")
	// Extending one TTL through the API keeps it alive past the others.
	keep := in.Create(in.Token, "busybox", "--ttl", "6s", "--wait")
	in.MustCLI(in.Token, "sandbox", "ttl", keep.ID, "1h")

	in.WaitState(in.Token, retain.ID, "expired")
	in.WaitState(in.Token, del.ID, "deleted")
	if sb := in.Get(in.Token, keep.ID); sb.State != "running" {
		t.Fatalf("extended sandbox is %s", sb.State)
	}
	// A retained, expired sandbox keeps its object (and record) but no pod.
	if out, _ := e2e.SharedCluster(t).Kubectl(context.Background(), "get", "pod", "-n", in.NS, k8s.ObjectName(retain.ID)); !strings.Contains(out, "NotFound") {
		t.Fatalf("expired sandbox still has a pod: %s", out)
	}
	e2e.Kubectl(t, "get", "sandbox", "-n", in.NS, k8s.ObjectName(retain.ID))
	// Shortening works too.
	in.MustCLI(in.Token, "sandbox", "ttl", keep.ID, "5s")
	in.WaitState(in.Token, keep.ID, "expired")
}

// TestDevCommand runs `hiloop dev`, which `make run` runs: it starts its own
// local cluster, serves against it, and on Ctrl-C leaves no cluster process.
// It names every transport, forward included, which dev backs with its own
// session helpers and so without --agent-image. On the simulated node it
// says first that sandboxes are simulated; on the real node (where this
// machine can run one), a sandbox's `uname -r` is gVisor's kernel.
func TestDevCommand(t *testing.T) {
	t.Run("simulated", func(t *testing.T) { devCommand(t, "simulated") })
	t.Run("real", func(t *testing.T) {
		if err := localcluster.RealNodeSupported(os.Getenv("HILOOP_CLUSTER_BIN")); err != nil && os.Geteuid() != 0 {
			t.Skipf("no real node on this machine: %v", err)
		}
		devCommand(t, "real")
	})
}

func devCommand(t *testing.T, node string) {
	db := filepath.Join(t.TempDir(), "dev.db")
	addrFile := filepath.Join(t.TempDir(), "addrs.json")
	cmd := exec.Command(e2e.Binary(t), "dev", "--listen", "127.0.0.1:0", "--ssh-listen", "127.0.0.1:0", "--db", db,
		"--transports", "exec,ssh,forward", "--node", node, "--addr-file", addrFile)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	out := &e2e.SyncBuffer{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	var url, workdir string
	// The real node waits for another test process's to stop.
	eventually.Within(t, "dev serving", 10*time.Minute, func() (bool, error) {
		select {
		case err := <-done:
			t.Fatalf("hiloop dev exited before it served: %v\n%s", err, out.String())
		default:
		}
		var addrs app.Addrs
		if raw, err := os.ReadFile(addrFile); err == nil && json.Unmarshal(raw, &addrs) == nil && addrs.API != "" {
			url = "http://" + addrs.API
		}
		if m := regexp.MustCompile(`KWOK_WORKDIR=(\S+)`).FindStringSubmatch(out.String()); m != nil {
			workdir = m[1]
		}
		return url != "" && workdir != "", fmt.Errorf("output so far:\n%s", out.String())
	})
	eventually.Within(t, "dev /readyz", 30*time.Second, func() (bool, error) {
		resp, err := http.Get(url + "/readyz")
		if err != nil {
			return false, err
		}
		resp.Body.Close()
		return resp.StatusCode == 200, nil
	})
	// Its stdout is no terminal: the key is in the file beside the
	// database, and not in the output.
	key, err := os.ReadFile(db + ".admin-key")
	if err != nil || !strings.HasPrefix(string(key), "hl_") {
		t.Fatalf("dev wrote no admin key: %q %v", key, err)
	}
	if strings.Contains(out.String(), strings.TrimSpace(string(key))) || !strings.Contains(out.String(), "kubectl --kubeconfig") {
		t.Fatalf("dev printed the key, or not the kubectl hint:\n%s", out.String())
	}
	const banner = "WARNING: sandboxes are simulated: commands run on this host"
	if strings.HasPrefix(out.String(), banner) != (node == "simulated") {
		t.Fatalf("dev on the %s node, its banner:\n%s", node, out.String())
	}
	if node == "real" {
		in := e2e.Attach(t, url, strings.TrimSpace(string(key)))
		sb := in.Create(in.Token, "busybox", "--wait")
		if out, errOut, code := in.CLI(in.Token, "sandbox", "exec", sb.ID, "--", "uname", "-r"); code != 0 || !strings.Contains(out, "gvisor") {
			t.Fatalf("uname -r in dev's sandbox: %d %q %q", code, out, errOut)
		}
	}
	cmd.Process.Signal(os.Interrupt)
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("dev exited with %v:\n%s", err, out.String())
		}
	case <-time.After(2 * time.Minute):
		cmd.Process.Kill()
		t.Fatal("dev did not stop on SIGINT")
	}
	eventually.Within(t, "dev's cluster gone", 60*time.Second, func() (bool, error) {
		_, err := os.Stat(workdir)
		return os.IsNotExist(err), err
	})
}
