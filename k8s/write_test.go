package k8s_test

import (
	"context"
	"sync"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kubefake "k8s.io/client-go/kubernetes/fake"
	sandboxfake "sigs.k8s.io/agent-sandbox/clients/k8s/clientset/versioned/fake"

	"github.com/hiloop/hiloop/k8s"
	"github.com/hiloop/hiloop/sandbox"
	"github.com/hiloop/hiloop/store"
)

// TestServiceAccountOncePerBurst: the first creates of a new organization,
// arriving at once, make one service-account create call between them, and
// every sandbox is created.
func TestServiceAccountOncePerBurst(t *testing.T) {
	kube := kubefake.NewClientset()
	sb := sandboxfake.NewSimpleClientset()
	w, err := k8s.NewWriter(&k8s.Clients{Kube: kube, Sandbox: sb}, k8s.RenderOptions{Namespace: "ns", RuntimeClass: "gvisor", Transports: []sandbox.Transport{sandbox.TransportExec}})
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
		k8s.RenderOptions{Namespace: "ns", RuntimeClass: "gvisor", Transports: []sandbox.Transport{sandbox.TransportExec, sandbox.TransportForward}, AgentImage: "agent"})
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
		Spec: store.Spec{Image: "busybox", Transports: []sandbox.Transport{sandbox.TransportExec}}}
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
