package e2e_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/hiloop/hiloop/internal/e2e"
	"github.com/hiloop/hiloop/internal/eventually"
	"github.com/hiloop/hiloop/k8s"
)

// pause stalls a control-plane component until the test ends or resume is
// called.
func pause(t *testing.T, component string) (resume func()) {
	t.Helper()
	r, err := e2e.SharedCluster(t).Pause(component)
	if err != nil {
		t.Fatal(err)
	}
	done := false
	resume = func() {
		if !done {
			done = true
			if err := r(); err != nil {
				t.Error(err)
			}
		}
	}
	t.Cleanup(resume)
	return resume
}

// TestAmbiguousCreateEndsWithOneSandbox stalls etcd past hiloop's cluster
// timeout while five creates run. Their outcome is unknown, so each answer
// is 202 with the record pending, and each record is resolved from evidence
// once the cluster answers: every create ends tracking exactly one object,
// no object lacks a record, and a retry with the same key finds the same
// sandbox.
func TestAmbiguousCreateEndsWithOneSandbox(t *testing.T) {
	ns := e2e.NewNamespace(t)
	in := e2e.ServeInProcess(t, filepath.Join(t.TempDir(), "h.db"), ns, "--cluster-timeout", "2s")
	in.Create(in.Token, "busybox", "--wait") // the org's service account exists now
	resume := pause(t, "etcd")
	const n = 5
	ids := make([]string, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			status, _, body, err := in.TryCall(in.Token, "POST", "/v1/sandboxes", `{"image":"busybox"}`, "Idempotency-Key", "ambiguous-"+strconv.Itoa(i))
			var sb e2e.Sandbox
			json.Unmarshal([]byte(body), &sb)
			if err != nil || status != http.StatusAccepted || sb.State != "pending" {
				t.Errorf("create %d with etcd stalled: %d %s %v", i, status, body, err)
			}
			ids[i] = sb.ID
		}()
	}
	wg.Wait()
	resume()
	if t.Failed() {
		t.FailNow()
	}
	for _, id := range ids {
		in.WaitState(in.Token, id, "running")
	}
	objs, err := e2e.SharedCluster(t).Clients.Sandbox.AgentsV1beta1().Sandboxes(ns).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	count := map[string]int{}
	for _, o := range objs.Items {
		id := o.Labels[k8s.LabelSandbox]
		count[id]++
		if status, _ := in.Call(in.Token, "GET", "/v1/sandboxes/"+id, ""); status != 200 {
			t.Errorf("object %s has no record", o.Name)
		}
	}
	for _, id := range ids {
		if count[id] != 1 {
			t.Errorf("%d objects for %s, want 1", count[id], id)
		}
	}
	if len(objs.Items) != n+1 {
		t.Fatalf("%d objects in all, want %d", len(objs.Items), n+1)
	}
	status, body := in.Call(in.Token, "POST", "/v1/sandboxes", `{"image":"busybox"}`, "Idempotency-Key", "ambiguous-0")
	var again e2e.Sandbox
	json.Unmarshal([]byte(body), &again)
	if status != 200 || again.ID != ids[0] {
		t.Fatalf("retry: %d %s", status, body)
	}
}

// TestAnswersWhileTheAPIServerHangs stops the API server for at least 35 s
// (longer than the stall after which a leader-electing scheduler gives
// up): reads still answer from the record, /readyz stays ready (hiloop can
// serve what does not need the cluster, so it stays in its Services), stop
// and exec answer 503 cluster_unavailable with Retry-After instead of
// hanging (an exec whose own timeout passes first too: no command ran),
// and a create is accepted (its write may land when the server wakes).
// After the resume everything converges: the create runs exactly once (the
// scheduler and controller manager survived), and the server's memory did
// not pile up.
//
// The API server is resumed only once every call below has answered, so
// every answer came while it was stopped. A call that has not answered
// after a whole stall's length waits for the API server to come back: a
// hang, whatever the machine's load (hiloop's own deadline, the cluster
// timeout of 2s, is far shorter).
func TestAnswersWhileTheAPIServerHangs(t *testing.T) {
	const stall = 35 * time.Second
	ns := e2e.NewNamespace(t)
	in := e2e.Serve(t, filepath.Join(t.TempDir(), "h.db"), ns, "--cluster-timeout", "2s", "--metrics-listen", "127.0.0.1:0")
	sb := in.Create(in.Token, "busybox", "--wait")
	rssBefore := rssKB(t, in.Cmd.Process.Pid)
	goroutinesBefore := goroutines(t, in)
	resume := pause(t, "kube-apiserver")
	paused := time.Now()
	call := func(method, path, body string) (int, http.Header, string) {
		t.Helper()
		done := make(chan struct{})
		var status int
		var h http.Header
		var b string
		go func() {
			defer close(done)
			status, h, b = in.CallFull(in.Token, method, path, body)
		}()
		select {
		case <-done:
		case <-time.After(stall):
			t.Fatalf("%s %s got no answer in a whole stall (%s) of the API server: it waits for the API server", method, path, stall)
		}
		return status, h, b
	}
	if status, _, body := call("GET", "/v1/sandboxes/"+sb.ID, ""); status != 200 || !strings.Contains(body, `"running"`) {
		t.Fatalf("read during the outage: %d %s", status, body)
	}
	if status, _, body := call("GET", "/readyz", ""); status != 200 || !strings.Contains(body, `"ready"`) {
		t.Fatalf("readyz during the outage: %d %s", status, body)
	}
	if status, h, body := call("POST", "/v1/sandboxes/"+sb.ID+"/exec/run", `{"command":["true"]}`); status != 503 ||
		errorCode(t, body) != "cluster_unavailable" || h.Get("Retry-After") == "" {
		t.Fatalf("exec during the outage: %d %s", status, body)
	}
	// A timeout shorter than the cluster's that passes while the stream is
	// being opened: no command ran, so none timed out.
	if status, h, body := call("POST", "/v1/sandboxes/"+sb.ID+"/exec/run", `{"command":["true"],"timeout":"1s"}`); status != 503 ||
		errorCode(t, body) != "cluster_unavailable" || h.Get("Retry-After") == "" {
		t.Fatalf("exec with a short timeout during the outage: %d %s", status, body)
	}
	// The same through the CLI's stream, whose exit frame says so.
	cli, cancel := context.WithTimeout(context.Background(), stall)
	defer cancel()
	streamed := exec.CommandContext(cli, e2e.Binary(t), "sandbox", "exec", "--timeout", "1s", sb.ID, "--", "true")
	streamed.Env = in.Env(in.Token)
	if out, _ := streamed.CombinedOutput(); streamed.ProcessState.ExitCode() != 255 || !strings.Contains(string(out), "cluster_unavailable") {
		t.Fatalf("streamed exec with a short timeout during the outage: %v %q", streamed.ProcessState, out)
	}
	if status, h, body := call("POST", "/v1/sandboxes/"+sb.ID+"/stop", ""); status != 503 ||
		errorCode(t, body) != "cluster_unavailable" || h.Get("Retry-After") == "" {
		t.Fatalf("stop during the outage: %d %s", status, body)
	}
	if _, _, body := call("GET", "/v1/sandboxes/"+sb.ID, ""); !strings.Contains(body, `"desired": "running"`) {
		t.Fatalf("a failed stop left its intent behind: %s", body)
	}
	status, _, body := call("POST", "/v1/sandboxes", `{"image":"busybox"}`)
	var during e2e.Sandbox
	json.Unmarshal([]byte(body), &during)
	if status != http.StatusAccepted || during.State != "pending" {
		t.Fatalf("create during the outage: %d %s", status, body)
	}
	// Reads keep answering for the whole stall.
	for time.Since(paused) < stall {
		if status, _, _ := call("GET", "/v1/sandboxes?limit=10", ""); status != 200 {
			t.Fatalf("list during the outage: %d", status)
		}
		time.Sleep(time.Second)
	}
	resume()
	for _, c := range []string{"kube-scheduler", "kube-controller-manager"} {
		if exec.Command("pgrep", "-f", "clusters/hiloop/bin/"+c).Run() != nil {
			t.Fatalf("%s did not survive the stall", c)
		}
	}
	in.WaitState(in.Token, during.ID, "running")
	after := in.Create(in.Token, "busybox", "--wait")
	objs, err := e2e.SharedCluster(t).Clients.Sandbox.AgentsV1beta1().Sandboxes(ns).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(objs.Items) != 3 {
		t.Fatalf("%d Sandbox objects for 3 sandboxes (%s, %s, %s)", len(objs.Items), sb.ID, during.ID, after.ID)
	}
	if rss := rssKB(t, in.Cmd.Process.Pid); rss > 2*rssBefore+64<<10 {
		t.Fatalf("resident memory grew from %d KB to %d KB over the stall", rssBefore, rss)
	}
	// The requests made during the stall left nothing running behind.
	eventually.Within(t, "goroutines back to their level", 30*time.Second, func() (bool, error) {
		n := goroutines(t, in)
		return n <= goroutinesBefore+20, fmt.Errorf("%d goroutines, %d before the stall", n, goroutinesBefore)
	})
}

// execInBackground starts `hiloop sandbox exec ID -- sleep SECS`, waits
// until the command runs, and returns a channel that yields its exit status
// and stderr. Each call should use other SECS, which tells its command
// apart on the host (kwok runs exec commands as local processes; those
// of another test process's cluster are not this one's: e2e.ExecProcs).
func execInBackground(t *testing.T, in *e2e.Instance, token, id string, secs int) <-chan [2]string {
	t.Helper()
	arg := strconv.Itoa(secs)
	cmd := exec.Command(e2e.Binary(t), "sandbox", "exec", id, "--", "sleep", arg)
	cmd.Env = in.Env(token)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	var errOut bytes.Buffer
	cmd.Stderr = &errOut
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	out := make(chan [2]string, 1)
	go func() {
		cmd.Wait()
		out <- [2]string{strings.TrimSpace(cmd.ProcessState.String()), errOut.String()}
	}()
	eventually.Within(t, "exec running", 30*time.Second, func() (bool, error) {
		return len(e2e.ExecProcs(t, regexp.MustCompile("^sleep "+arg+"$"))) > 0, nil
	})
	return out
}

// ended waits for a backgrounded exec to end, for at most timeout: a
// session that should have been ended and was not is a hang.
func ended(t *testing.T, ch <-chan [2]string, why string) {
	t.Helper()
	select {
	case r := <-ch:
		if r[0] != "exit status 255" || !strings.Contains(r[1], why) {
			t.Fatalf("exec ended with %q, stderr %q; want exit 255 saying %q", r[0], r[1], why)
		}
	case <-time.After(20 * time.Second):
		t.Fatalf("the session did not end (%s)", why)
	}
}

// TestSessionsEnd: a live exec ends within seconds when its key is revoked
// (through the API or offline), when its sandbox stops, and when hiloop
// shuts down, with a final frame saying why.
func TestSessionsEnd(t *testing.T) {
	in := e2e.Serve(t, filepath.Join(t.TempDir(), "h.db"), e2e.NewNamespace(t))
	// kwok's exec does not signal a command whose stream closed, so the
	// commands of an earlier run may still be there. Only this cluster's
	// are reaped: a SIGTERM to another test process's command ends its
	// session with 143 and no reason.
	reap := func() { e2e.KillExecProcs(t, regexp.MustCompile("^sleep 30[1-4]$")) }
	reap()
	t.Cleanup(reap)
	sb := in.Create(in.Token, "busybox", "--wait")
	newKey := func() (id, secret string) {
		status, body := in.Call(in.Token, "POST", "/v1/keys", `{"name":"s"}`)
		var k struct{ ID, Secret string }
		json.Unmarshal([]byte(body), &k)
		if status != 201 {
			t.Fatalf("create key: %d %s", status, body)
		}
		return k.ID, k.Secret
	}

	id, secret := newKey()
	ch := execInBackground(t, in, secret, sb.ID, 301)
	if status, body := in.Call(in.Token, "DELETE", "/v1/keys/"+id, ""); status != 204 {
		t.Fatalf("revoke: %d %s", status, body)
	}
	ended(t, ch, "revoked")

	id, secret = newKey()
	ch = execInBackground(t, in, secret, sb.ID, 302)
	in.MustCLI("", "key", "revoke", "--org", "admin", id)
	ended(t, ch, "revoked")

	ch = execInBackground(t, in, in.Token, sb.ID, 303)
	in.MustCLI(in.Token, "sandbox", "stop", sb.ID)
	ended(t, ch, "stopped")

	in.MustCLI(in.Token, "sandbox", "start", sb.ID)
	in.WaitState(in.Token, sb.ID, "running")
	ch = execInBackground(t, in, in.Token, sb.ID, 304)
	if err := in.Signal(syscall.SIGTERM, 30*time.Second); err != nil {
		t.Fatalf("serve after SIGTERM with a live session: %v\n%s", err, in.Out.String())
	}
	ended(t, ch, "shutting down")
}

// goroutines is the server's go_goroutines, from its metrics endpoint.
func goroutines(t *testing.T, in *e2e.Instance) int {
	t.Helper()
	resp, err := http.Get(in.MetricsURL)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	m := regexp.MustCompile(`(?m)^go_goroutines ([0-9]+)$`).FindSubmatch(b)
	if m == nil {
		t.Fatal("no go_goroutines")
	}
	n, _ := strconv.Atoi(string(m[1]))
	return n
}
