package e2e_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/gorilla/websocket"

	"github.com/hiloop/hiloop/api"
	"github.com/hiloop/hiloop/internal/e2e"
	"github.com/hiloop/hiloop/internal/eventually"
	"github.com/hiloop/hiloop/localcluster"
	"github.com/hiloop/hiloop/store"
)

// TestRealNode runs hiloop's product paths on pods that really run, under
// gVisor, on the local cluster's real node (a kubelet, containerd and
// runsc on this machine): the kernel a command sees, exit codes, a
// create's env and an exec's env and cwd under busybox's sh, stdin EOF
// and a terminal (its size and a resize) from a real kubelet, files both ways, a file written in
// the sandbox that is not on the host, ssh and ssh -L through the session
// helper container in the pod to a server that listens only inside it,
// stop, start, a volume across them, idle stop and wake, a workload's own exit, a delete behind
// hiloop's back, TTL, delete, admission, what attestation recorded, and a
// pod that runs outside gVisor (runc) quarantined runtime_not_gvisor.
func TestRealNode(t *testing.T) {
	requireSSH(t)
	c := e2e.NewRealCluster(t, func(o *localcluster.Options) { o.RuncHandler = true })
	in := e2e.ServeInProcessOn(t, c, filepath.Join(t.TempDir(), "h.db"), e2e.NamespaceOn(t, c),
		"--transports", "exec,ssh,forward", "--agent-image", c.AgentImage())
	sb := in.Create(in.Token, append([]string{"busybox", "--transport", "exec", "--transport", "ssh", "--transport", "forward", "--wait"},
		envArgs(hostileEnv)...)...)
	exec1 := func(stdin string, args ...string) (string, string, int) {
		return cliExec(in, in.Token, stdin, append([]string{sb.ID, "--"}, args...)...)
	}

	t.Run("the kernel is gVisor's", func(t *testing.T) {
		out, errOut, code := exec1("", "uname", "-r")
		host, _ := exec.Command("uname", "-r").Output()
		if code != 0 || !strings.Contains(out, "gvisor") || strings.TrimSpace(out) == strings.TrimSpace(string(host)) {
			t.Fatalf("uname -r in the sandbox: %d %q %q (host %q)", code, out, errOut, host)
		}
		if out, _, _ := exec1("", "dmesg"); !strings.Contains(out, "Starting gVisor") {
			t.Errorf("dmesg in the sandbox: %q", out)
		}
	})
	t.Run("the record shows gVisor observed", func(t *testing.T) {
		var got e2e.Sandbox
		eventually.Within(t, "runtime attestation", 60*time.Second, func() (bool, error) {
			got = in.Get(in.Token, sb.ID)
			return got.RuntimeObserved != "", nil
		})
		if got.RuntimeObserved != "gvisor" || got.KernelRelease != "4.19.0-gvisor" || got.State != "running" || got.Isolation != "gvisor" || got.Anomaly != "" {
			t.Fatalf("observed %q %q, state %s, isolation %q, anomaly %q", got.RuntimeObserved, got.KernelRelease, got.State, got.Isolation, got.Anomaly)
		}
		// The mirror held the real pod to the receipt it carries.
		receipt, err := c.Kubectl(t.Context(), "get", "pod", "-n", in.NS, "sbx-"+strings.TrimPrefix(sb.ID, "sbx_"),
			"-o", `jsonpath={.metadata.annotations.hiloop\.dev/runtime-receipt}`)
		if err != nil || !strings.Contains(receipt, `"runtime_class":"gvisor"`) {
			t.Fatalf("the pod's receipt: %q %v", receipt, err)
		}
	})
	t.Run("exit codes", func(t *testing.T) {
		for _, want := range []int{0, 1, 3, 255} {
			if _, errOut, code := exec1("", "sh", "-c", "exit "+strconv.Itoa(want)); code != want {
				t.Errorf("exit %d: got %d (%s)", want, code, errOut)
			}
		}
		if _, errOut, code := exec1("", "sh", "-c", "kill -KILL $$"); code != 137 {
			t.Errorf("signal death: exit %d (%s)", code, errOut)
		}
	})
	t.Run("a create's env, an exec's env and cwd, under busybox's sh", func(t *testing.T) {
		want := maps.Clone(hostileEnv)
		execEnv := map[string]string{"QUOTES": "the exec's \"own\"", "OWN": "$(id) `id`\n"}
		maps.Copy(want, execEnv)
		names := slices.Sorted(maps.Keys(want))
		// busybox has no printenv: each value is printed by name,
		// the names being this test's own.
		script := `pwd; for k in "$@"; do eval "printf '%s\\0' \"\${$k}\""; done`
		out, errOut, code := cliExec(in, in.Token, "", append(append(envArgs(execEnv), "--cwd", "/etc", sb.ID, "--", "sh", "-c", script, "sh"), names...)...)
		pwd, values, _ := strings.Cut(out, "\n")
		if code != 0 || pwd != "/etc" {
			t.Fatalf("exec: %d %q %q", code, out, errOut)
		}
		got := map[string]string{}
		for i, v := range strings.Split(strings.TrimSuffix(values, "\x00"), "\x00") {
			if i < len(names) {
				got[names[i]] = v
			}
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("the command's environment (-want +got):\n%s", diff)
		}
		if _, errOut, code := exec1("", "test", "-e", "/tmp/hiloop-env-pwned"); code == 0 {
			t.Errorf("a value was run by a shell: %s", errOut)
		}
		if _, errOut, code := cliExec(in, in.Token, "", "--cwd", "/nonexistent", sb.ID, "--", "true"); code != 255 || !strings.Contains(errOut, "file_not_found") {
			t.Errorf("a missing cwd: %d %q", code, errOut)
		}
	})
	t.Run("stdin EOF reaches the command", func(t *testing.T) {
		out, errOut, code := in.CLIInput(in.Token, "one\ntwo\n", "sandbox", "exec", "-i", sb.ID, "--", "wc", "-l")
		if code != 0 || strings.TrimSpace(out) != "2" {
			t.Fatalf("wc -l of two lines: %d %q %q", code, out, errOut)
		}
	})
	t.Run("a terminal: its size and a resize", func(t *testing.T) {
		shell := "HILOOP_URL=" + in.URL + " HILOOP_TOKEN=" + in.Token + " " + e2e.Binary(t) +
			" sandbox exec -t " + sb.ID + ` -- sh -c '[ -t 0 ] && [ -t 1 ] && echo ON-A-TERMINAL; while :; do stty size; sleep 0.2; done'`
		term := e2e.Tmux(t, 100, 30, shell)
		eventually.Within(t, "the pod's command sees 30 rows, 100 columns on a terminal", 20*time.Second, func() (bool, error) {
			screen := term.Screen()
			return strings.Contains(screen, "ON-A-TERMINAL") && strings.Contains(screen, "30 100"), fmt.Errorf("the screen:\n%s", screen)
		})
		term.Resize(120, 40)
		eventually.Within(t, "the resize", 20*time.Second, func() (bool, error) {
			screen := term.Screen()
			return strings.Contains(screen, "40 120"), fmt.Errorf("the screen:\n%s", screen)
		})
	})
	t.Run("a file written in the sandbox is not on the host", func(t *testing.T) {
		name := "/tmp/hiloop-canary-" + strings.ToLower(store.NewID("c")[2:])
		if _, errOut, code := exec1("", "sh", "-c", "echo inside > "+name+" && cat "+name); code != 0 {
			t.Fatalf("write in the sandbox: %d %s", code, errOut)
		}
		if _, err := os.Stat(name); !os.IsNotExist(err) {
			t.Fatalf("%s is on the host: %v", name, err)
		}
		if out, _, code := exec1("", "cat", name); code != 0 || out != "inside\n" {
			t.Fatalf("the file in the sandbox: %d %q", code, out)
		}
	})
	t.Run("files both ways", func(t *testing.T) {
		dir := t.TempDir()
		src := filepath.Join(dir, "in.txt")
		if err := os.WriteFile(src, []byte("from the laptop\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		in.MustCLI(in.Token, "sandbox", "cp", src, sb.ID+":/tmp/in.txt")
		if out, _, code := exec1("", "cat", "/tmp/in.txt"); code != 0 || out != "from the laptop\n" {
			t.Fatalf("uploaded file in the sandbox: %d %q", code, out)
		}
		exec1("", "sh", "-c", "mkdir -p /tmp/out/sub && echo back > /tmp/out/sub/f")
		in.MustCLI(in.Token, "sandbox", "cp", "-r", sb.ID+":/tmp/out", filepath.Join(dir, "out"))
		if b, err := os.ReadFile(filepath.Join(dir, "out", "sub", "f")); err != nil || string(b) != "back\n" {
			t.Fatalf("downloaded tree: %q %v", b, err)
		}
	})
	t.Run("file operations with busybox, and a stat that lies", func(t *testing.T) {
		realNodeFileOperations(t, in, sb.ID, exec1)
	})
	t.Run("env and cwd with a sh that lies, and values no kubelet takes", func(t *testing.T) {
		realNodeHostileSetup(t, in, sb.ID, exec1)
	})
	u := newSSHUser(t, in, in.Token)
	t.Run("ssh", func(t *testing.T) {
		if out, errOut, code := u.run(sb.ID, "uname -r; exit 7"); code != 7 || !strings.Contains(out, "gvisor") {
			t.Fatalf("ssh: %d %q %q", code, out, errOut)
		}
	})
	t.Run("ssh -L reaches a server that listens only in the pod", func(t *testing.T) {
		if _, errOut, code := exec1("", "sh", "-c", "mkdir -p /www && echo hello from the pod > /www/index.html && httpd -p 127.0.0.1:8080 -h /www"); code != 0 {
			t.Fatalf("start httpd: %d %s", code, errOut)
		}
		local := e2e.FreeAddr(t)
		cmd := exec.Command("ssh", u.args("-N", "-L", local+":127.0.0.1:8080", sb.ID+"@127.0.0.1")...)
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
		e2e.WaitListening(t, "ssh -L", local)
		var body string
		eventually.Within(t, "the pod's httpd through ssh -L", 30*time.Second, func() (bool, error) {
			resp, err := http.Get("http://" + local + "/")
			if err != nil {
				return false, err
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			body = string(b)
			return resp.StatusCode == 200, nil
		})
		if body != "hello from the pod\n" {
			t.Fatalf("through ssh -L: %q", body)
		}
		// Nothing on the host listens there: the server is the pod's.
		if conn, err := net.DialTimeout("tcp", "127.0.0.1:8080", time.Second); err == nil {
			conn.Close()
			t.Log("note: something on the host listens on 127.0.0.1:8080 too")
		}
	})
	// A process left running for the stop below, which must end it.
	var bg api.Process
	t.Run("background processes outlive their exec under gVisor", func(t *testing.T) {
		p := startProc(t, in, in.Token, sb.ID, "sh", "-c", `uname -r; read l; echo "got $l"; exit 7`)
		if status, body := in.Call(in.Token, "POST", "/v1/sandboxes/"+sb.ID+"/processes/"+p.ID+"/stdin", "hi\n",
			"Content-Type", "application/octet-stream"); status != http.StatusNoContent {
			t.Fatalf("stdin: %d %s", status, body)
		}
		status, _, out, whole := output(t, in, in.Token, sb.ID, p.ID, "offset=0&follow=true")
		if status != 200 || !whole || !strings.Contains(out, "gvisor") || !strings.HasSuffix(out, "got hi\n") {
			t.Fatalf("follow: %d %q whole=%v", status, out, whole)
		}
		if got := getProc(t, in, in.Token, sb.ID, p.ID); got.State != api.ProcessExited || *got.ExitCode != 7 {
			t.Fatalf("%+v; want exited 7", got)
		}
		bg = startProc(t, in, in.Token, sb.ID, "sleep", "3000")
		// It still runs once the exec that started it is long gone.
		if _, errOut, code := exec1("", "sh", "-c", "kill -0 $(cat /tmp/.hiloop/proc/"+bg.ID+"/pid)"); code != 0 {
			t.Fatalf("the background process is not running: %d %s", code, errOut)
		}
		if status, body := in.Call(in.Token, "POST", "/v1/sandboxes/"+sb.ID+"/processes/"+bg.ID+"/signal", `{"signal":"STOP"}`); status != 200 {
			t.Fatalf("signal STOP: %d %s", status, body)
		}
	})
	t.Run("stop and start", func(t *testing.T) {
		in.MustCLI(in.Token, "sandbox", "stop", sb.ID)
		in.WaitState(in.Token, sb.ID, "stopped")
		if bg.ID != "" {
			if got := getProc(t, in, in.Token, sb.ID, bg.ID); got.State != api.ProcessEnded || got.Reason != api.EndSandboxStopped {
				t.Errorf("a background process after the stop: %+v; want ended, sandbox_stopped", got)
			}
		}
		in.MustCLI(in.Token, "sandbox", "start", sb.ID, "--wait")
		if out, errOut, code := exec1("", "cat", "/tmp/in.txt"); code == 0 {
			t.Fatalf("a new pod kept the old one's /tmp: %q %q", out, errOut)
		}
		if out, _, code := exec1("", "uname", "-r"); code != 0 || !strings.Contains(out, "gvisor") {
			t.Fatalf("after start: %d %q", code, out)
		}
	})
	t.Run("a volume survives stop and start, and is not on the host", func(t *testing.T) {
		v := in.Create(in.Token, "busybox", "--volume", "data:1Gi:/data", "--wait")
		if _, errOut, code := cliExec(in, in.Token, "", v.ID, "--", "sh", "-c", "echo kept > /data/f"); code != 0 {
			t.Fatalf("write to the volume: %d %s", code, errOut)
		}
		in.MustCLI(in.Token, "sandbox", "stop", v.ID)
		in.WaitState(in.Token, v.ID, "stopped")
		in.MustCLI(in.Token, "sandbox", "start", v.ID, "--wait")
		if out, errOut, code := cliExec(in, in.Token, "", v.ID, "--", "cat", "/data/f"); code != 0 || out != "kept\n" {
			t.Fatalf("the volume after a stop and a start: %d %q %q", code, out, errOut)
		}
		if _, err := os.Stat(localcluster.VolumeDir); !os.IsNotExist(err) {
			t.Fatalf("%s is on the host: %v", localcluster.VolumeDir, err)
		}
		in.MustCLI(in.Token, "sandbox", "delete", v.ID)
	})
	t.Run("idle stop and wake", func(t *testing.T) {
		in.MustCLI(in.Token, "sandbox", "idle-timeout", sb.ID, "2s")
		in.WaitState(in.Token, sb.ID, "stopped")
		out, errOut, code := u.run(sb.ID, "uname -r")
		if code != 0 || !strings.Contains(out, "gvisor") {
			t.Fatalf("ssh woke the sandbox: %d %q %q", code, out, errOut)
		}
		in.MustCLI(in.Token, "sandbox", "idle-timeout", sb.ID, "0")
	})
	t.Run("admission refuses a pod without gVisor; the node runs one slipped past it under gVisor", func(t *testing.T) {
		ns := e2e.NamespaceOn(t, c)
		pod := filepath.Join(t.TempDir(), "pod.yaml")
		if err := os.WriteFile(pod, []byte(`apiVersion: v1
kind: Pod
metadata: {name: plain, namespace: `+ns+`}
spec:
  containers:
  - name: c
    image: busybox
    resources: {limits: {cpu: 100m, memory: 64Mi}, requests: {cpu: 100m, memory: 64Mi}}
`), 0o600); err != nil {
			t.Fatal(err)
		}
		if out, err := c.Kubectl(t.Context(), "apply", "-f", pod); err == nil || !strings.Contains(out, "gvisor") {
			t.Fatalf("a pod without the gvisor runtime class was admitted: %v %s", err, out)
		}
		restore := e2e.WithoutAdmissionOn(t, c, ns)
		defer restore()
		if out, err := c.Kubectl(t.Context(), "apply", "-f", pod); err != nil {
			t.Fatalf("apply without admission: %v %s", err, out)
		}
		if out, err := c.Kubectl(t.Context(), "wait", "-n", ns, "--for=condition=Ready", "pod/plain", "--timeout=120s"); err != nil {
			t.Fatalf("the slipped pod did not run: %v %s", err, out)
		}
		out, err := c.Kubectl(t.Context(), "exec", "-n", ns, "plain", "--", "uname", "-r")
		if err != nil || !strings.Contains(out, "gvisor") {
			t.Fatalf("uname -r in a pod without a runtime class: %q %v", out, err)
		}
	})
	t.Run("a workload that exits on its own is exited with its code", func(t *testing.T) {
		other := in.Create(in.Token, "busybox", "--wait")
		// busybox's command exits 0 on SIGTERM; the kubelet sees it end.
		if _, errOut, code := cliExec(in, in.Token, "", other.ID, "--", "kill", "1"); code != 0 {
			t.Fatalf("kill 1: %d %s", code, errOut)
		}
		got := in.WaitState(in.Token, other.ID, "exited")
		if got.ExitCode == nil || *got.ExitCode != 0 {
			t.Fatalf("exited with code %v (%s)", got.ExitCode, got.Reason)
		}
	})
	t.Run("a sandbox deleted behind hiloop's back is lost", func(t *testing.T) {
		other := in.Create(in.Token, "busybox", "--wait")
		if out, err := c.Kubectl(t.Context(), "delete", "sandbox", "-n", in.NS, "sbx-"+strings.TrimPrefix(other.ID, "sbx_"), "--wait=false"); err != nil {
			t.Fatalf("%v %s", err, out)
		}
		in.WaitState(in.Token, other.ID, "lost")
	})
	t.Run("TTL", func(t *testing.T) {
		// No --wait: on a loaded machine the pod may take longer to run
		// than the TTL gives it, and expired is what follows either way.
		other := in.Create(in.Token, "busybox", "--ttl", "5s")
		in.WaitState(in.Token, other.ID, "expired")
	})
	t.Run("a pod outside gVisor is quarantined runtime_not_gvisor", func(t *testing.T) {
		// Someone with cluster credentials points the gvisor RuntimeClass
		// at runc, which this node offers (RuncHandler), and kills a
		// sandbox's pod. The new pod's spec still names gvisor: only what
		// the pod itself shows gives it away.
		other := in.Create(in.Token, "busybox", "--wait")
		setHandler := func(handler string) {
			t.Helper()
			raw, err := c.Kubectl(t.Context(), "get", "runtimeclass", "gvisor", "-o", "json")
			if err != nil {
				t.Fatalf("%v %s", err, raw)
			}
			var rc map[string]any
			if err := json.Unmarshal([]byte(raw), &rc); err != nil {
				t.Fatal(err)
			}
			rc["handler"] = handler
			rc["metadata"] = map[string]any{"name": "gvisor", "labels": rc["metadata"].(map[string]any)["labels"]}
			b, _ := json.Marshal(rc)
			f := filepath.Join(t.TempDir(), "rc.json")
			os.WriteFile(f, b, 0o600)
			if out, err := c.Kubectl(t.Context(), "replace", "--force", "-f", f); err != nil {
				t.Fatalf("set the gvisor RuntimeClass's handler to %s: %v %s", handler, err, out)
			}
		}
		setHandler("runc")
		defer setHandler("runsc")
		if out, err := c.Kubectl(t.Context(), "delete", "pod", "-n", in.NS, "sbx-"+strings.TrimPrefix(other.ID, "sbx_"), "--wait=false"); err != nil {
			t.Fatalf("%v %s", err, out)
		}
		got := in.WaitState(in.Token, other.ID, "quarantined")
		host, _ := exec.Command("uname", "-r").Output()
		if got.Anomaly != "runtime_not_gvisor" || got.RuntimeObserved != "not-gvisor" || got.KernelRelease != strings.TrimSpace(string(host)) {
			t.Fatalf("quarantined %q (%s), runtime_observed %q, kernel_release %q; want runtime_not_gvisor, not-gvisor, %q",
				got.Anomaly, got.Reason, got.RuntimeObserved, got.KernelRelease, strings.TrimSpace(string(host)))
		}
		if _, errOut, code := cliExec(in, in.Token, "", other.ID, "--", "true"); code == 0 || !strings.Contains(errOut, "quarantined") {
			t.Fatalf("exec into a sandbox seen outside gVisor: %d %q", code, errOut)
		}
	})
	t.Run("delete", func(t *testing.T) {
		in.MustCLI(in.Token, "sandbox", "delete", sb.ID)
		eventually.Within(t, "its pod gone", 60*time.Second, func() (bool, error) {
			out, err := c.Kubectl(t.Context(), "get", "pods", "-n", in.NS, "-o", "name")
			return err == nil && !strings.Contains(out, "sbx-"+strings.TrimPrefix(sb.ID, "sbx_")), err
		})
	})
}

// realNodeFileOperations runs the file operations in a busybox sandbox
// under gVisor: hostile names list as themselves with busybox's sh and
// stat; mkdir, mv and rm -r work; a stat the workload put first on its
// PATH is not run (busybox's sh runs its own applets); and a workload that
// replaced sh itself gets bounded, well-formed answers about nothing but
// its own files.
func realNodeFileOperations(t *testing.T, in *e2e.Instance, id string, exec1 func(string, ...string) (string, string, int)) {
	script := `mkdir -p /tmp/fsops && cd /tmp/fsops && for n; do printf %s "$n" > "./$n"; done`
	if _, errOut, code := exec1("", append([]string{"sh", "-c", script, "sh"}, hostileNames...)...); code != 0 {
		t.Fatalf("making the names: %d %s", code, errOut)
	}
	ls := func() (api.FileList, int, string) {
		out, errOut, code := in.CLI(in.Token, "sandbox", "fs", "ls", "-o", "json", id+":/tmp/fsops")
		var l api.FileList
		json.Unmarshal([]byte(out), &l)
		return l, code, errOut
	}
	l, code, errOut := ls()
	var names []string
	for _, e := range l.Entries {
		names = append(names, e.Name)
		if e.Type != api.FileTypeFile || e.Size != int64(len(e.Name)) || e.MTime.IsZero() {
			t.Errorf("%q: %+v", e.Name, e)
		}
	}
	want := slices.Clone(hostileNames)
	slices.Sort(want)
	if code != 0 || !slices.Equal(names, want) {
		t.Fatalf("fs ls: %d %q %s, want %q", code, names, errOut, want)
	}
	if out, errOut, code := in.CLI(in.Token, "sandbox", "fs", "stat", "-o", "json", id+":/tmp/fsops/-rf"); code != 0 || !strings.Contains(out, `"size": 3`) {
		t.Errorf("fs stat: %d %q %s", code, out, errOut)
	}
	in.MustCLI(in.Token, "sandbox", "fs", "mkdir", id+":/tmp/fsops/d/e")
	in.MustCLI(in.Token, "sandbox", "fs", "mv", id+":/tmp/fsops/-rf", "/tmp/fsops/d/e/f")
	if _, errOut, code := in.CLI(in.Token, "sandbox", "fs", "rm", id+":/tmp/fsops/d"); code != 1 || !strings.Contains(errOut, "directory_not_empty") {
		t.Errorf("fs rm of a directory: %d %s", code, errOut)
	}
	in.MustCLI(in.Token, "sandbox", "fs", "rm", "-r", id+":/tmp/fsops/d")

	// Busybox's ash keeps the newlines that end the last name of a chunk
	// (stat's records pass through a command substitution), and its test
	// knows -ef: a rename onto the same directory spelled through a link
	// leaves it as it is.
	if _, errOut, code := exec1("", "sh", "-c", `mkdir -p /tmp/fsops2/real/empty && ln -s real /tmp/fsops2/l && printf x > "/tmp/fsops2/zz
"`); code != 0 {
		t.Fatalf("making /tmp/fsops2: %d %s", code, errOut)
	}
	out, errOut, code := in.CLI(in.Token, "sandbox", "fs", "ls", "-o", "json", id+":/tmp/fsops2")
	var l2 api.FileList
	if json.Unmarshal([]byte(out), &l2); code != 0 || len(l2.Entries) != 3 || l2.Entries[2].Name != "zz\n" || l2.Entries[2].Size != 1 {
		t.Errorf("fs ls of a name that ends in newlines: %d %s %s", code, out, errOut)
	}
	if _, errOut, code := in.CLI(in.Token, "sandbox", "fs", "mv", "--overwrite", id+":/tmp/fsops2/l/empty", "/tmp/fsops2/real/empty"); code != 0 {
		t.Errorf("fs mv onto itself through a link: %d %s", code, errOut)
	}
	if _, _, code := exec1("", "test", "-d", "/tmp/fsops2/real/empty"); code != 0 {
		t.Error("a rename onto itself through a link removed the directory")
	}

	// A stat the workload puts first on its PATH is not the one that
	// runs: busybox's sh runs its own applets whatever PATH says.
	lie := "#!/bin/sh\nprintf '81a4 1 1 planted\\n'\n"
	if _, errOut, code := in.CLIInput(in.Token, lie, "sandbox", "exec", "-i", id, "--", "sh", "-c", "mkdir -p /usr/local/bin && cat > /usr/local/bin/stat && chmod +x /usr/local/bin/stat"); code != 0 {
		t.Fatalf("planting a stat: %d %s", code, errOut)
	}
	if l, code, errOut := ls(); code != 0 || len(l.Entries) != len(hostileNames)-1 || slices.ContainsFunc(l.Entries, func(e api.FileEntry) bool { return e.Name == "planted" }) {
		t.Errorf("fs ls with a stat on PATH: %d %+v %s", code, l, errOut)
	}
	exec1("", "rm", "-f", "/usr/local/bin/stat")

	// A workload that replaces sh itself chooses everything its scripts
	// print: here a name of its own and then more bytes than a listing
	// reads. The answers stay bounded and well formed, never a 5xx.
	hostile := "#!/bin/busybox sh\nprintf 'planted\\0\\00081a4 1 1 planted\\n\\0'\nhead -c 10000000 /dev/urandom\n"
	if _, errOut, code := in.CLIInput(in.Token, hostile, "sandbox", "exec", "-i", id, "--", "/bin/busybox", "sh", "-c", "rm -f /bin/sh && cat > /bin/sh && chmod +x /bin/sh"); code != 0 {
		t.Fatalf("replacing sh: %d %s", code, errOut)
	}
	restore := func() {
		if _, errOut, code := exec1("", "/bin/busybox", "sh", "-c", "rm -f /bin/sh && ln /bin/busybox /bin/sh"); code != 0 {
			t.Fatalf("restoring sh: %d %s", code, errOut)
		}
	}
	defer restore()
	if l, code, errOut := ls(); code != 0 || !l.Truncated || len(l.Entries) > api.MaxListEntries || len(l.Entries) == 0 || l.Entries[0].Name != "planted" {
		t.Errorf("fs ls with a hostile sh: %d, %d entries, truncated %v, %s", code, len(l.Entries), l.Truncated, errOut)
	}
	if _, errOut, code := in.CLI(in.Token, "sandbox", "fs", "stat", id+":/tmp/fsops/a b c"); code != 1 || !strings.Contains(errOut, api.CodeFileOperationFailed) {
		t.Errorf("fs stat with a hostile sh: %d %s", code, errOut)
	}
	restore()
	if l, code, errOut := ls(); code != 0 || len(l.Entries) != len(hostileNames)-1 {
		t.Errorf("fs ls once sh is back: %d %d entries %s", code, len(l.Entries), errOut)
	}
}

// realNodeHostileSetup: an exec's env and cwd under gVisor when the
// workload replaced sh, which runs their set-up. Whatever that sh does,
// every answer is well formed, bounded and comes by the run's deadline,
// never a 5xx: a sh that says the command is ready and exits is believed
// (the sandbox is its owner's own), as is the status of one that never
// says so, unless it is the set-up's own (95: a variable refused); one
// that never ends is the run's timeout. On a terminal the ready line is
// never shown, and a terminal that lost all output is no set-up error. And
// a value the kubelet's runtime API cannot carry (not UTF-8) is refused
// before anything is asked of the cluster.
func realNodeHostileSetup(t *testing.T, in *e2e.Instance, id string, exec1 func(string, ...string) (string, string, int)) {
	for _, q := range []url.Values{
		{"command": {"true"}, "env": {"A=\xff"}},
		{"command": {"true"}, "cwd": {"/tmp/\xff"}},
	} {
		u := strings.Replace(in.URL, "http://", "ws://", 1) + "/v1/sandboxes/" + id + "/exec?" + q.Encode()
		c, resp, err := websocket.DefaultDialer.Dial(u, http.Header{"Authorization": {"Bearer " + in.Token}})
		if err == nil {
			f := readExit(t, c)
			c.Close()
			t.Errorf("stream ?%s: upgraded, exit frame %+v %+v", q.Encode(), f, f.Error)
			continue
		}
		if resp == nil || resp.StatusCode != 400 {
			t.Errorf("stream ?%s: %v %+v", q.Encode(), err, resp)
		}
	}

	// On a real terminal the set-up's ready line ends in \r\n, and is
	// still never shown.
	tty := func(stdin io.Reader) (api.ExitStatus, error, string) {
		var out bytes.Buffer
		st, err := sdk(in, in.Token).Exec(t.Context(), id, api.ExecOptions{Command: []string{"sh", "-c", `pwd; printf '%s\n' "$A"`},
			Env: map[string]string{"A": "v a l"}, Cwd: "/etc", TTY: true, Stdin: stdin, Stdout: &out})
		return st, err, out.String()
	}
	pr, pw := io.Pipe()
	st, err, out := tty(pr)
	pw.Close()
	if err != nil || st.Code != 0 || out != "/etc\r\nv a l\r\n" {
		t.Errorf("a terminal's exec with env and cwd: %+v %v %q", st, err, out)
	}
	// With stdin closed at once, the kubelet's terminal may drop all the
	// output, the ready line with it: the command still ran, and its exit
	// status is its own, not a set-up that failed.
	for range 3 {
		if st, err, out := tty(strings.NewReader("")); err != nil || st.Code != 0 || (out != "" && out != "/etc\r\nv a l\r\n") {
			t.Errorf("a terminal's exec with env and cwd, stdin closed at once: %+v %v %q", st, err, out)
		}
	}

	hostile := "#!/bin/busybox sh\ncase \"$(cat /tmp/hostile-sh)\" in\n" +
		"lie) echo hiloop-exec-ready; echo after; exit 42;;\n" +
		"silent) printf 'the sandbox says\\n%.0s' $(seq 1000); exit 3;;\n" +
		"refuse) printf 'the sandbox\\033[31m says\\n%.0s' $(seq 1000); exit 95;;\n" +
		"flood) while :; do echo flood; done;;\n" +
		"esac\n"
	if _, errOut, code := in.CLIInput(in.Token, hostile, "sandbox", "exec", "-i", id, "--", "/bin/busybox", "sh", "-c", "rm -f /bin/sh && cat > /bin/sh && chmod +x /bin/sh"); code != 0 {
		t.Fatalf("replacing sh: %d %s", code, errOut)
	}
	defer func() {
		if _, errOut, code := exec1("", "/bin/busybox", "sh", "-c", "rm -f /bin/sh && ln /bin/busybox /bin/sh"); code != 0 {
			t.Fatalf("restoring sh: %d %s", code, errOut)
		}
	}()
	run := func(mode string, timeout string) (int, api.ExecRunResponse, api.ErrorBody, string) {
		t.Helper()
		if _, errOut, code := exec1("", "/bin/busybox", "sh", "-c", "echo "+mode+" > /tmp/hostile-sh"); code != 0 {
			t.Fatalf("mode %s: %d %s", mode, code, errOut)
		}
		req, _ := json.Marshal(api.ExecRunRequest{Command: []string{"true"}, Env: map[string]string{"A": "1"}, Cwd: "/tmp", Timeout: timeout})
		status, body := in.Call(in.Token, "POST", "/v1/sandboxes/"+id+"/exec/run", string(req))
		var r api.ExecRunResponse
		var e api.ErrorBody
		json.Unmarshal([]byte(body), &r)
		json.Unmarshal([]byte(body), &e)
		return status, r, e, body
	}
	if status, r, _, body := run("lie", ""); status != 200 || r.ExitCode == nil || *r.ExitCode != 42 || r.Stdout != "after\n" {
		t.Errorf("a sh that says ready and exits 42: %d %.300s", status, body)
	}
	if status, r, _, body := run("silent", ""); status != 200 || r.ExitCode == nil || *r.ExitCode != 3 || r.Stdout != "" {
		t.Errorf("a sh that never says ready: %d %.300s", status, body)
	}
	if status, _, e, body := run("refuse", ""); status != 422 || e.Error.Code != api.CodeInvalidEnv || len(body) > 8<<10 || strings.Contains(body, "\\u001b") {
		t.Errorf("a sh that exits as the set-up does when a variable is refused: %d %.300s (%d bytes)", status, body, len(body))
	}
	if status, r, _, body := run("flood", "2s"); status != 200 || !r.TimedOut || r.ExitCode != nil || r.Stdout != "" {
		t.Errorf("a sh that never says ready nor ends: %d %.300s", status, body)
	}
}
