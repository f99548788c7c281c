package k8s_test

import (
	"context"
	"errors"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	kubefake "k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"sigs.k8s.io/agent-sandbox/api/v1beta1"
	sandboxfake "sigs.k8s.io/agent-sandbox/clients/k8s/clientset/versioned/fake"

	"github.com/hiloop/hiloop/cluster"
	"github.com/hiloop/hiloop/k8s"
	"github.com/hiloop/hiloop/receipt"
	"github.com/hiloop/hiloop/store"
)

// TestServiceAccountOncePerBurst: the first creates of a new organization,
// arriving at once, make one service-account create call between them, and
// every sandbox is created.
func TestServiceAccountOncePerBurst(t *testing.T) {
	kube := kubefake.NewClientset()
	sb := sandboxfake.NewSimpleClientset()
	w, err := k8s.NewWriter(&k8s.Clients{Kube: kube, Sandbox: sb}, k8s.RenderOptions{Namespace: "ns", RuntimeClass: "gvisor", Transports: []receipt.Transport{receipt.TransportExec}})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for range 50 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rec := store.Sandbox{ID: store.NewID("sbx"), OrgID: "org_new", DesiredMode: store.ModeRunning, Spec: store.Spec{Image: "busybox"}}
			if err := w.Create(context.Background(), rec, ""); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	creates := 0
	for _, a := range kube.Actions() {
		if a.GetVerb() == "create" && a.GetResource().Resource == "serviceaccounts" {
			creates++
		}
	}
	if creates != 1 {
		t.Errorf("%d service-account creates for one organization, want 1", creates)
	}
	list, err := sb.AgentsV1beta1().Sandboxes("ns").List(context.Background(), metav1.ListOptions{})
	if err != nil || len(list.Items) != 50 {
		t.Errorf("%d sandboxes created, want 50 (%v)", len(list.Items), err)
	}
}

// TestGatewayKeyOnlyForHelpers: the gateway's key goes on the pod template
// of a sandbox with a session helper, and nowhere else; a helper without a
// key is refused rather than rendered unreachable.
func TestGatewayKeyOnlyForHelpers(t *testing.T) {
	sb := sandboxfake.NewSimpleClientset()
	w, err := k8s.NewWriter(&k8s.Clients{Kube: kubefake.NewClientset(), Sandbox: sb},
		k8s.RenderOptions{Namespace: "ns", RuntimeClass: "gvisor", Transports: []receipt.Transport{receipt.TransportExec, receipt.TransportForward}, AgentImage: "agent"})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	annotation := func(id string) (string, bool) {
		obj, err := sb.AgentsV1beta1().Sandboxes("ns").Get(ctx, k8s.ObjectName(id), metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		v, ok := obj.Spec.PodTemplate.ObjectMeta.Annotations[k8s.AnnotationGatewayKey]
		return v, ok
	}
	plain := store.Sandbox{ID: store.NewID("sbx"), OrgID: "org_a", DesiredMode: store.ModeRunning,
		Spec: store.Spec{Image: "busybox", Transports: []receipt.Transport{receipt.TransportExec}}}
	if err := w.Create(ctx, plain, "ssh-ed25519 AAAAkey"); err != nil {
		t.Fatal(err)
	}
	if v, ok := annotation(plain.ID); ok {
		t.Errorf("a sandbox without a helper carries the gateway key %q", v)
	}
	helped := store.Sandbox{ID: store.NewID("sbx"), OrgID: "org_a", DesiredMode: store.ModeRunning, Spec: store.Spec{Image: "busybox"}}
	if err := w.Create(ctx, helped, ""); err == nil {
		t.Error("a sandbox with a helper was created without the gateway's key")
	}
	if err := w.Create(ctx, helped, "ssh-ed25519 AAAAkey"); err != nil {
		t.Fatal(err)
	}
	if v, _ := annotation(helped.ID); v != "ssh-ed25519 AAAAkey" {
		t.Errorf("a sandbox with a helper (every backed transport): annotation %q", v)
	}
}

// TestPodAddr: the address of a sandbox's pod is given only for the pod
// whose uid the record observed, carrying the sandbox's label, Running,
// Ready and not being deleted; anything else is a PodNotServingError that
// says why. A Failed pod that kept its IP is the case that matters: the
// network may have handed that address to another tenant's pod.
func TestPodAddr(t *testing.T) {
	const id, uid = "sbx_a", "u1"
	serving := func(mut ...func(*corev1.Pod)) *corev1.Pod {
		p := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: k8s.ObjectName(id), Namespace: "ns", UID: uid, Labels: map[string]string{k8s.LabelSandbox: id}},
			Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "10.0.0.7",
				Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}},
		}
		for _, m := range mut {
			m(p)
		}
		return p
	}
	now := metav1.Now()
	for _, tc := range []struct {
		name   string
		pod    *corev1.Pod
		uid    string
		ip     string
		reason string
	}{
		{"serving", serving(), uid, "10.0.0.7", ""},
		{"no pod observed yet", serving(), "", "", "no pod has been observed yet"},
		{"gone", nil, uid, "", "the pod is gone"},
		{"replaced", serving(func(p *corev1.Pod) { p.UID = "u2" }), uid, "", "the pod was replaced since it was last observed"},
		{"failed, address kept", serving(func(p *corev1.Pod) { p.Status.Phase = corev1.PodFailed }), uid, "", `the pod is "Failed", not Running`},
		{"succeeded", serving(func(p *corev1.Pod) { p.Status.Phase = corev1.PodSucceeded }), uid, "", `the pod is "Succeeded", not Running`},
		{"pending", serving(func(p *corev1.Pod) { p.Status.Phase = corev1.PodPending }), uid, "", `the pod is "Pending", not Running`},
		{"not ready", serving(func(p *corev1.Pod) { p.Status.Conditions[0].Status = corev1.ConditionFalse }), uid, "", "the pod is not Ready"},
		{"no ready condition", serving(func(p *corev1.Pod) { p.Status.Conditions = nil }), uid, "", "the pod is not Ready"},
		{"being deleted", serving(func(p *corev1.Pod) { p.DeletionTimestamp = &now; p.Finalizers = []string{"x"} }), uid, "", "the pod is being deleted"},
		{"another sandbox's label", serving(func(p *corev1.Pod) { p.Labels[k8s.LabelSandbox] = "sbx_b" }), uid, "", "the pod does not carry the sandbox's label"},
		{"no address", serving(func(p *corev1.Pod) { p.Status.PodIP = "" }), uid, "", "the pod has no address yet"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			kube := kubefake.NewClientset()
			if tc.pod != nil {
				kube = kubefake.NewClientset(tc.pod)
			}
			w, err := k8s.NewWriter(&k8s.Clients{Kube: kube, Sandbox: sandboxfake.NewSimpleClientset()}, k8s.RenderOptions{Namespace: "ns", RuntimeClass: "gvisor"})
			if err != nil {
				t.Fatal(err)
			}
			ip, err := w.PodAddr(context.Background(), id, tc.uid)
			reason := ""
			var pe *cluster.PodNotServingError
			if errors.As(err, &pe) {
				reason = pe.Reason
			} else if err != nil {
				t.Fatalf("not a PodNotServingError: %v", err)
			}
			if ip != tc.ip || reason != tc.reason {
				t.Errorf("PodAddr = %q, reason %q; want %q, reason %q", ip, reason, tc.ip, tc.reason)
			}
		})
	}
	// A failing API server is a cluster error, not a verdict on the pod.
	kube := kubefake.NewClientset(serving())
	kube.PrependReactor("get", "pods", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewServiceUnavailable("down")
	})
	w, err := k8s.NewWriter(&k8s.Clients{Kube: kube, Sandbox: sandboxfake.NewSimpleClientset()}, k8s.RenderOptions{Namespace: "ns", RuntimeClass: "gvisor"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.PodAddr(context.Background(), id, uid); err == nil || errors.As(err, new(*cluster.PodNotServingError)) {
		t.Errorf("an unavailable API server: %v, want a cluster error", err)
	}
}

// TestRotateGatewayKeyPerSandbox: a rotation writes each sandbox with a
// helper the key made for its own id, and leaves a sandbox without a
// helper alone.
func TestRotateGatewayKeyPerSandbox(t *testing.T) {
	sb := sandboxfake.NewSimpleClientset()
	w, err := k8s.NewWriter(&k8s.Clients{Kube: kubefake.NewClientset(), Sandbox: sb},
		k8s.RenderOptions{Namespace: "ns", RuntimeClass: "gvisor", Transports: []receipt.Transport{receipt.TransportExec}, AgentImage: "agent"})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	var helped []string
	for i := range 3 {
		rec := store.Sandbox{ID: store.NewID("sbx"), OrgID: "org_a", DesiredMode: store.ModeRunning, Spec: store.Spec{Image: "busybox"}}
		key := ""
		if i < 2 {
			rec.Spec.Transports = []receipt.Transport{receipt.TransportForward}
			key = "old-" + rec.ID
			helped = append(helped, rec.ID)
		}
		if err := w.Create(ctx, rec, key); err != nil {
			t.Fatal(err)
		}
	}
	n, err := w.RotateGatewayKey(ctx, cluster.DefaultTimeout, func(id string) (string, error) { return "new-" + id, nil })
	if err != nil || n != 2 {
		t.Fatalf("rotated %d sandboxes (%v), want 2", n, err)
	}
	list, err := sb.AgentsV1beta1().Sandboxes("ns").List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, o := range list.Items {
		if v, ok := o.Spec.PodTemplate.ObjectMeta.Annotations[k8s.AnnotationGatewayKey]; ok {
			got[o.Labels[k8s.LabelSandbox]] = v
		}
	}
	want := map[string]string{helped[0]: "new-" + helped[0], helped[1]: "new-" + helped[1]}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("gateway key annotations (-want +got):\n%s", diff)
	}
}

// TestWrittenGeneration: a patch records the object's uid and the
// generation the API server answered with; a delete forgets it; a sandbox
// never patched has none.
func TestWrittenGeneration(t *testing.T) {
	id := store.NewID("sbx")
	sb := sandboxfake.NewSimpleClientset()
	w, err := k8s.NewWriter(&k8s.Clients{Kube: kubefake.NewClientset(), Sandbox: sb}, k8s.RenderOptions{Namespace: "ns", RuntimeClass: "gvisor"})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := sb.AgentsV1beta1().Sandboxes("ns").Create(ctx, &v1beta1.Sandbox{
		ObjectMeta: metav1.ObjectMeta{Name: k8s.ObjectName(id), Namespace: "ns", UID: "uid-1", Generation: 4}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if uid, gen := w.Written(id); uid != "" || gen != 0 {
		t.Errorf("before any patch: %q %d", uid, gen)
	}
	if err := w.SetMode(ctx, id, store.ModeStopped); err != nil {
		t.Fatal(err)
	}
	if uid, gen := w.Written(id); uid != "uid-1" || gen != 4 {
		t.Errorf("after a patch: %q %d, want uid-1 4", uid, gen)
	}
	if uid, _ := w.Written(store.NewID("sbx")); uid != "" {
		t.Errorf("another sandbox: %q", uid)
	}
	if err := w.Delete(ctx, id); err != nil {
		t.Fatal(err)
	}
	if uid, gen := w.Written(id); uid != "" || gen != 0 {
		t.Errorf("after the delete: %q %d", uid, gen)
	}
}
