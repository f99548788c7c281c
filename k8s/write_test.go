package k8s_test

import (
	"context"
	"sync"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kubefake "k8s.io/client-go/kubernetes/fake"
	sandboxfake "sigs.k8s.io/agent-sandbox/clients/k8s/clientset/versioned/fake"

	"github.com/hiloop/hiloop/k8s"
	"github.com/hiloop/hiloop/store"
)

// TestServiceAccountOncePerBurst: the first creates of a new organization,
// arriving at once, make one service-account create call between them, and
// every sandbox is created.
func TestServiceAccountOncePerBurst(t *testing.T) {
	kube := kubefake.NewClientset()
	sb := sandboxfake.NewSimpleClientset()
	w, err := k8s.NewWriter(&k8s.Clients{Kube: kube, Sandbox: sb}, k8s.RenderOptions{Namespace: "ns", RuntimeClass: "gvisor", Transports: []string{"exec"}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for range 50 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rec := store.Sandbox{ID: store.NewID("sbx"), OrgID: "org_new", DesiredMode: store.ModeRunning, Spec: store.Spec{Image: "busybox"}}
			if err := w.Create(context.Background(), rec); err != nil {
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

// TestGatewayKeyOnlyForHelpers: a create asks for the gateway's key only
// when the sandbox has a session helper, and puts the key it got on that
// sandbox's pod template.
func TestGatewayKeyOnlyForHelpers(t *testing.T) {
	sb := sandboxfake.NewSimpleClientset()
	asked := 0
	w, err := k8s.NewWriter(&k8s.Clients{Kube: kubefake.NewClientset(), Sandbox: sb},
		k8s.RenderOptions{Namespace: "ns", RuntimeClass: "gvisor", Transports: []string{"exec", k8s.TransportForward}, AgentImage: "agent"},
		func(context.Context) (string, error) { asked++; return "ssh-ed25519 AAAAkey", nil })
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	plain := store.Sandbox{ID: store.NewID("sbx"), OrgID: "org_a", DesiredMode: store.ModeRunning, Spec: store.Spec{Image: "busybox", Transports: []string{"exec"}}}
	if err := w.Create(ctx, plain); err != nil {
		t.Fatal(err)
	}
	if asked != 0 {
		t.Errorf("a sandbox without a helper asked for the gateway key %d times", asked)
	}
	helped := store.Sandbox{ID: store.NewID("sbx"), OrgID: "org_a", DesiredMode: store.ModeRunning, Spec: store.Spec{Image: "busybox"}}
	if err := w.Create(ctx, helped); err != nil {
		t.Fatal(err)
	}
	obj, err := sb.AgentsV1beta1().Sandboxes("ns").Get(ctx, k8s.ObjectName(helped.ID), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if asked != 1 || obj.Spec.PodTemplate.ObjectMeta.Annotations[k8s.AnnotationGatewayKey] != "ssh-ed25519 AAAAkey" {
		t.Errorf("a sandbox with a helper (every backed transport): asked %d times, annotation %q", asked, obj.Spec.PodTemplate.ObjectMeta.Annotations[k8s.AnnotationGatewayKey])
	}
}
