package e2e_test

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	nodev1 "k8s.io/api/node/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/hiloop/hiloop/internal/e2e"
	"github.com/hiloop/hiloop/internal/eventually"
	"github.com/hiloop/hiloop/k8s"
	"github.com/hiloop/hiloop/store"
)

// TestOutOfBandChanges makes changes with the Kubernetes API, not through
// hiloop, and checks the record converges to what was observed.
func TestOutOfBandChanges(t *testing.T) {
	// Some changes below get past admission (WithoutAdmission): the
	// self-check must not run meanwhile.
	in := e2e.ServeInProcess(t, filepath.Join(t.TempDir(), "h.db"), e2e.NewNamespace(t), "--self-check-interval", "1h")
	ctx := context.Background()
	pods := e2e.SharedCluster(t).Clients.Kube.CoreV1().Pods(in.NS)

	t.Run("deleted sandbox is lost", func(t *testing.T) {
		sb := in.Create(in.Token, "busybox", "--wait")
		e2e.Kubectl(t, "delete", "sandbox", "-n", in.NS, k8s.ObjectName(sb.ID), "--wait=false")
		got := in.WaitState(in.Token, sb.ID, "lost")
		if got.Desired != "running" {
			t.Fatalf("desired %s", got.Desired)
		}
	})

	t.Run("failed pod is exited with its code", func(t *testing.T) {
		sb := in.Create(in.Token, "busybox", "--wait")
		status := `{"status":{"phase":"Failed","reason":"Error","containerStatuses":[{"name":"workload","image":"busybox","imageID":"","ready":false,"restartCount":0,` +
			`"state":{"terminated":{"exitCode":3,"reason":"Error","startedAt":"2026-01-01T00:00:00Z","finishedAt":"2026-01-01T00:00:01Z"}}}]}}`
		e2e.Kubectl(t, "patch", "pod", "-n", in.NS, k8s.ObjectName(sb.ID), "--subresource=status", "--type=merge", "-p", status)
		got := in.WaitState(in.Token, sb.ID, "exited")
		if got.ExitCode == nil || *got.ExitCode != 3 || got.Reason != "Error" {
			t.Fatalf("exited with code %v reason %q, want 3 Error", got.ExitCode, got.Reason)
		}
		// `wait --for running` on an exited sandbox fails with the reason.
		_, errOut, code := in.CLI(in.Token, "sandbox", "wait", sb.ID, "--for", "running", "--timeout", "10s")
		if code == 0 || !strings.Contains(errOut, "exited") || !strings.Contains(errOut, "exit code 3") {
			t.Fatalf("wait on exited: code %d stderr %q", code, errOut)
		}
	})

	t.Run("second pod is attention/multiple_pods", func(t *testing.T) {
		sb := in.Create(in.Token, "busybox", "--wait")
		obj, err := e2e.SharedCluster(t).Clients.Sandbox.AgentsV1beta1().Sandboxes(in.NS).Get(ctx, k8s.ObjectName(sb.ID), metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		live, err := pods.Get(ctx, k8s.ObjectName(sb.ID), metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		extra := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: live.Name + "-extra", Namespace: in.NS, Labels: live.Labels, Annotations: live.Annotations,
				OwnerReferences: []metav1.OwnerReference{{APIVersion: "agents.x-k8s.io/v1beta1", Kind: "Sandbox", Name: obj.Name, UID: obj.UID, Controller: ptr.To(true)}}},
			Spec: *live.Spec.DeepCopy(),
		}
		extra.Spec.NodeName = ""
		if _, err := pods.Create(ctx, extra, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		got := in.WaitState(in.Token, sb.ID, "attention")
		if got.Anomaly != "multiple_pods" {
			t.Fatalf("anomaly %q", got.Anomaly)
		}
	})

	t.Run("mangled org label is attention", func(t *testing.T) {
		sb := in.Create(in.Token, "busybox", "--wait")
		e2e.Kubectl(t, "label", "sandbox", "-n", in.NS, k8s.ObjectName(sb.ID), "--overwrite", k8s.LabelOrg+"=zz--not-an-org")
		got := in.WaitState(in.Token, sb.ID, "attention")
		if got.Anomaly != "org_label_unparseable" {
			t.Fatalf("anomaly %q", got.Anomaly)
		}
	})

	t.Run("changed runtime class on the live pod is quarantined", func(t *testing.T) {
		sb := in.Create(in.Token, "busybox", "--wait")
		rc := &nodev1.RuntimeClass{ObjectMeta: metav1.ObjectMeta{Name: "runc"}, Handler: "runc"}
		if _, err := e2e.SharedCluster(t).Clients.Kube.NodeV1().RuntimeClasses().Create(ctx, rc, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
		// Someone with cluster credentials, past admission, swaps the
		// runtime class in the template and kills the pod; the controller
		// makes a runc pod.
		defer e2e.WithoutAdmission(t, in.NS)()
		e2e.Kubectl(t, "patch", "sandbox", "-n", in.NS, k8s.ObjectName(sb.ID), "--type=merge",
			"-p", `{"spec":{"podTemplate":{"spec":{"runtimeClassName":"runc"}}}}`)
		e2e.Kubectl(t, "delete", "pod", "-n", in.NS, k8s.ObjectName(sb.ID), "--wait=false")
		got := in.WaitState(in.Token, sb.ID, "quarantined")
		if !strings.Contains(got.Anomaly, "runtime_class_mismatch") || !strings.Contains(got.Reason, "runc") {
			t.Fatalf("quarantined with %q: %s", got.Anomaly, got.Reason)
		}
		// Quarantine refuses exec.
		status, body := in.Call(in.Token, "POST", "/v1/sandboxes/"+sb.ID+"/exec/run", `{"command":["true"]}`)
		if status != 409 || errorCode(t, body) != "sandbox_quarantined" {
			t.Fatalf("exec into a quarantined sandbox: %d %s", status, body)
		}
	})

	t.Run("editing the receipt with the runtime class does not escape quarantine", func(t *testing.T) {
		sb := in.Create(in.Token, "busybox", "--wait")
		raw := e2e.Kubectl(t, "get", "sandbox", "-n", in.NS, k8s.ObjectName(sb.ID), "-o", `jsonpath={.spec.podTemplate.metadata.annotations.hiloop\.dev/runtime-receipt}`)
		forged := strings.Replace(raw, `"runtime_class":"gvisor"`, `"runtime_class":"runc"`, 1)
		if forged == raw {
			t.Fatalf("receipt %q names no gvisor runtime class", raw)
		}
		defer e2e.WithoutAdmission(t, in.NS)()
		patch, _ := json.Marshal(map[string]any{"spec": map[string]any{"podTemplate": map[string]any{
			"metadata": map[string]any{"annotations": map[string]string{k8s.AnnotationReceipt: forged}},
			"spec":     map[string]any{"runtimeClassName": "runc"}}}})
		e2e.Kubectl(t, "patch", "sandbox", "-n", in.NS, k8s.ObjectName(sb.ID), "--type=merge", "-p", string(patch))
		e2e.Kubectl(t, "delete", "pod", "-n", in.NS, k8s.ObjectName(sb.ID), "--wait=false")
		// The old pod's annotation changes first (receipt_mismatch), then
		// the runc pod replaces it (both).
		eventually.Within(t, "quarantined for both", 60*time.Second, func() (bool, error) {
			got := in.Get(in.Token, sb.ID)
			return got.State == "quarantined" && strings.Contains(got.Anomaly, "receipt_mismatch") &&
				strings.Contains(got.Anomaly, "runtime_class_mismatch"), fmt.Errorf("%s %q", got.State, got.Anomaly)
		})
	})

	t.Run("org label of another organization is org_label_mismatch", func(t *testing.T) {
		sb := in.Create(in.Token, "busybox", "--wait")
		e2e.Kubectl(t, "label", "sandbox", "-n", in.NS, k8s.ObjectName(sb.ID), "--overwrite", k8s.LabelOrg+"=org_someoneelse")
		got := in.WaitState(in.Token, sb.ID, "attention")
		if got.Anomaly != "org_label_mismatch" || !strings.Contains(got.Reason, "label changed") {
			t.Fatalf("anomaly %q reason %q", got.Anomaly, got.Reason)
		}
	})

	t.Run("mode changed outside hiloop, then start and stop through hiloop", func(t *testing.T) {
		org := in.NewOrg("oob-"+strings.ToLower(k8s.ObjectName(in.NS)), 10, 1)
		sb := in.Create(org, "busybox", "--wait")
		e2e.Kubectl(t, "patch", "sandbox", "-n", in.NS, k8s.ObjectName(sb.ID), "--type=merge", "-p", `{"spec":{"operatingMode":"Suspended"}}`)
		got := in.WaitState(org, sb.ID, "stopped")
		if got.Desired != "running" {
			t.Fatalf("desired %s", got.Desired)
		}
		// The mirror may see the pod already gone: stopping or stopped.
		if !eventsSay(t, in, org, sb.ID, "stopping", "mode changed outside hiloop") && !eventsSay(t, in, org, sb.ID, "stopped", "mode changed outside hiloop") {
			t.Fatalf("no event says the mode changed outside hiloop")
		}
		// Stopped outside hiloop, it does not hold the one running slot.
		other := in.Create(org, "busybox", "--wait")
		in.MustCLI(org, "sandbox", "stop", other.ID)
		in.WaitState(org, other.ID, "stopped")
		// start writes the cluster although desired already was running.
		in.MustCLI(org, "sandbox", "start", sb.ID)
		in.WaitState(org, sb.ID, "running")
		// And the other way round: resumed outside hiloop, stop works.
		e2e.Kubectl(t, "patch", "sandbox", "-n", in.NS, k8s.ObjectName(other.ID), "--type=merge", "-p", `{"spec":{"operatingMode":"Running"}}`)
		in.WaitState(org, other.ID, "running")
		in.MustCLI(org, "sandbox", "stop", other.ID)
		in.WaitState(org, other.ID, "stopped")
	})

	t.Run("a deleted pod is named in the event", func(t *testing.T) {
		sb := in.Create(in.Token, "busybox", "--wait")
		e2e.Kubectl(t, "delete", "pod", "-n", in.NS, k8s.ObjectName(sb.ID), "--wait=false")
		eventually.Within(t, "event naming the deleted pod", 60*time.Second, func() (bool, error) {
			return eventsSay(t, in, in.Token, sb.ID, "starting", "pod deleted"), nil
		})
	})
}

// eventsSay reports whether a sandbox's history has a transition to state
// whose reason contains reason.
func eventsSay(t testing.TB, in *e2e.Instance, token, id, state, reason string) bool {
	t.Helper()
	status, body := in.Call(token, "GET", "/v1/sandboxes/"+id+"/events", "")
	if status != 200 {
		t.Fatalf("events: %d %s", status, body)
	}
	var evs struct {
		Items []struct{ To, Reason string }
	}
	json.Unmarshal([]byte(body), &evs)
	for _, e := range evs.Items {
		if e.To == state && strings.Contains(e.Reason, reason) {
			return true
		}
	}
	return false
}

func orgOf(t testing.TB, in *e2e.Instance, token string) string {
	t.Helper()
	status, body := in.Call(token, "GET", "/v1/org", "")
	if status != 200 {
		t.Fatalf("GET /v1/org: %d %s", status, body)
	}
	var o struct{ ID string }
	json.Unmarshal([]byte(body), &o)
	return o.ID
}

// TestRestartConverges stops hiloop, changes the cluster behind its back,
// and starts it again on the same database.
func TestRestartConverges(t *testing.T) {
	ns := e2e.NewNamespace(t)
	db := filepath.Join(t.TempDir(), "h.db")
	in := e2e.ServeInProcess(t, db, ns)
	token := in.Token
	gone := in.Create(token, "busybox", "--wait")
	paused := in.Create(token, "busybox", "--wait")
	failed := in.Create(token, "busybox", "--wait")
	in.Stop()

	ctx := context.Background()
	e2e.Kubectl(t, "delete", "sandbox", "-n", ns, k8s.ObjectName(gone.ID), "--wait=true")
	e2e.Kubectl(t, "patch", "sandbox", "-n", ns, k8s.ObjectName(paused.ID), "--type=merge", "-p", `{"spec":{"operatingMode":"Suspended"}}`)
	e2e.Kubectl(t, "patch", "pod", "-n", ns, k8s.ObjectName(failed.ID), "--subresource=status", "--type=merge",
		"-p", `{"status":{"phase":"Succeeded","containerStatuses":[{"name":"workload","image":"busybox","imageID":"","ready":false,"restartCount":0,"state":{"terminated":{"exitCode":0,"reason":"Completed","startedAt":"2026-01-01T00:00:00Z","finishedAt":"2026-01-01T00:00:01Z"}}}]}}`)
	eventually.Within(t, "pod of the suspended sandbox gone", 60*time.Second, func() (bool, error) {
		_, err := e2e.SharedCluster(t).Clients.Kube.CoreV1().Pods(ns).Get(ctx, k8s.ObjectName(paused.ID), metav1.GetOptions{})
		return apierrors.IsNotFound(err), err
	})

	// A create interrupted between the record write and the cluster write:
	// the record exists, pending, with no object.
	s, err := store.Open(ctx, store.Options{Path: db})
	if err != nil {
		t.Fatal(err)
	}
	orgs, _ := s.Orgs(ctx)
	interrupted, _, err := s.CreateSandbox(ctx, store.NewSandbox{OrgID: orgs[0].ID, Spec: store.Spec{Image: "busybox", ShutdownPolicy: "retain"}})
	if err != nil {
		t.Fatal(err)
	}
	s.Close()

	again := e2e.ServeInProcess(t, db, ns)
	again.WaitState(token, gone.ID, "lost")
	again.WaitState(token, paused.ID, "stopped")
	sb := again.WaitState(token, failed.ID, "exited")
	if sb.ExitCode == nil || *sb.ExitCode != 0 {
		t.Fatalf("exit code %v", sb.ExitCode)
	}
	again.WaitState(token, interrupted.ID, "running")
	eventually.Within(t, "start-up reports the interrupted create resolved", 10*time.Second, func() (bool, error) {
		return strings.Contains(again.Out.String(), "resolved pending create"), fmt.Errorf("log:\n%s", again.Out.String())
	})
}

// TestOrphanReported: an object with hiloop's labels that no record knows is
// reported at start-up and left alone, neither adopted nor deleted.
func TestOrphanReported(t *testing.T) {
	ns := e2e.NewNamespace(t)
	ctx := context.Background()
	sb, err := k8s.Render(store.Sandbox{ID: "sbx_orphanorphanorph", OrgID: "org_nobody", DesiredMode: store.ModeRunning,
		Spec: store.Spec{Image: "busybox"}}, k8s.RenderOptions{Namespace: ns, RuntimeClass: "gvisor"})
	if err != nil {
		t.Fatal(err)
	}
	made, err := e2e.SharedCluster(t).Clients.Sandbox.AgentsV1beta1().Sandboxes(ns).Create(ctx, sb, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	in := e2e.ServeInProcess(t, filepath.Join(t.TempDir(), "h.db"), ns)
	eventually.Within(t, "orphan reported", 10*time.Second, func() (bool, error) {
		return strings.Contains(in.Out.String(), "no record knows") && strings.Contains(in.Out.String(), sb.Name), nil
	})
	status, body := in.Call(in.Token, "GET", "/v1/sandboxes", "")
	if status != 200 || strings.Contains(body, "orphan") {
		t.Fatalf("orphan adopted into the record: %d %s", status, body)
	}
	// A sandbox of hiloop's own, created and seen running after the
	// report, shows the mirror and the writer had their chance at the
	// orphan; it is still there, unchanged.
	in.Create(in.Token, "busybox", "--wait")
	got, err := e2e.SharedCluster(t).Clients.Sandbox.AgentsV1beta1().Sandboxes(ns).Get(ctx, sb.Name, metav1.GetOptions{})
	if err != nil || got.DeletionTimestamp != nil || got.Generation != made.Generation || !maps.Equal(got.Labels, made.Labels) || !maps.Equal(got.Annotations, made.Annotations) {
		t.Fatalf("orphan was touched: %v", err)
	}
}
