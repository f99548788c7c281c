package mirror

import (
	"errors"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	kubefake "k8s.io/client-go/kubernetes/fake"
	"sigs.k8s.io/agent-sandbox/api/v1beta1"
	sandboxfake "sigs.k8s.io/agent-sandbox/clients/k8s/clientset/versioned/fake"

	"github.com/hiloop/hiloop/k8s"
	"github.com/hiloop/hiloop/store"
)

// TestDecideWaitsForOwnWrite: while the cached Sandbox is older than
// hiloop's own latest write of that object, nothing is decided, so a start's
// pod seen before the Sandbox that asked for it is not recorded as a mode
// changed outside hiloop; once the watch shows the write, the decision is
// made. A write of another object (another uid) holds nothing.
func TestDecideWaitsForOwnWrite(t *testing.T) {
	db, err := store.Open(t.Context(), store.Options{Path: filepath.Join(t.TempDir(), "m.db")})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	written := struct {
		uid types.UID
		gen int64
	}{"uid-1", 3}
	m, err := New(Options{Clients: &k8s.Clients{Kube: kubefake.NewClientset(), Sandbox: sandboxfake.NewSimpleClientset()}, Store: db, Namespace: "ns",
		Now:     func() time.Time { return now },
		Written: func(id string) (string, int64) { return string(written.uid), written.gen }})
	if err != nil {
		t.Fatal(err)
	}
	defer m.queue.ShutDown()
	// A stopped sandbox being started: the record asks for running, the
	// pod of the start is up, and the cache still has the Sandbox as it
	// was before the start's patch.
	rec := record(func(s *store.Sandbox) { s.State = store.StateStopped })
	cache := func(gen int64, uid types.UID) {
		t.Helper()
		obj := object(func(o *v1beta1.Sandbox) {
			o.UID, o.Generation, o.ResourceVersion = uid, gen, fmt.Sprint(gen)
			o.Spec.OperatingMode = v1beta1.SandboxOperatingModeSuspended
			if gen >= 3 {
				o.Spec.OperatingMode = v1beta1.SandboxOperatingModeRunning
			}
		})
		if err := m.objects.Update(compactSandbox(obj)); err != nil {
			t.Fatal(err)
		}
	}
	p := pod(func(p *corev1.Pod) { p.Namespace, p.UID = "ns", "pod-1" })
	if err := m.pods.Add(compactPod(p)); err != nil {
		t.Fatal(err)
	}

	cache(2, "uid-1")
	if obs, _, err := m.decide(rec); !errors.Is(err, errBehindWrite) {
		t.Fatalf("the cache behind hiloop's write: decided %+v, %v", obs, err)
	}
	cache(3, "uid-1")
	obs, changed, err := m.decide(rec)
	if err != nil || !changed || obs.State != store.StateRunning || obs.Reason == ReasonModeOutside {
		t.Fatalf("the cache at hiloop's write: %+v changed %v, %v; want running", obs, changed, err)
	}
	// A write of an object since replaced holds nothing.
	written.uid = "uid-old"
	cache(2, "uid-1")
	if obs, _, err := m.decide(rec); err != nil || obs.Reason != ReasonModeOutside {
		t.Fatalf("a write of another object: %+v, %v; want the mode outside hiloop decided", obs, err)
	}
}
