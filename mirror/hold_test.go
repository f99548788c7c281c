package mirror

import (
	"errors"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	kubefake "k8s.io/client-go/kubernetes/fake"
	"sigs.k8s.io/agent-sandbox/api/v1beta1"
	sandboxfake "sigs.k8s.io/agent-sandbox/clients/k8s/clientset/versioned/fake"

	"github.com/hiloop/hiloop/k8s"
	"github.com/hiloop/hiloop/store"
)

// holdMirror is a mirror whose Written answers *uid and *gen, and whose
// clock reads *clock.
func holdMirror(t *testing.T, uid *types.UID, gen *int64, clock *time.Time) *Mirror {
	t.Helper()
	db, err := store.Open(t.Context(), store.Options{Path: filepath.Join(t.TempDir(), "m.db")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	m, err := New(Options{Clients: &k8s.Clients{Kube: kubefake.NewClientset(), Sandbox: sandboxfake.NewSimpleClientset()}, Store: db, Namespace: "ns",
		Now:     func() time.Time { return *clock },
		Written: func(string) (string, int64) { return string(*uid), *gen }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.queue.ShutDown)
	return m
}

// TestDecideWaitsForOwnWrite: while the cached Sandbox is older than
// hiloop's own latest write of that object, nothing is decided, so a start's
// pod seen before the Sandbox that asked for it is not recorded as a mode
// changed outside hiloop; once the watch shows the write, the decision is
// made. A write of another object (another uid) holds nothing.
func TestDecideWaitsForOwnWrite(t *testing.T) {
	uid, gen, clock := types.UID("uid-1"), int64(3), now
	m := holdMirror(t, &uid, &gen, &clock)
	// A stopped sandbox being started: the record asks for running, the
	// pod of the start is up, and the cache still has the Sandbox as it
	// was before the start's patch.
	rec := record(func(s *store.Sandbox) { s.State = store.StateStopped })
	cache := func(g int64, u types.UID) {
		t.Helper()
		obj := object(func(o *v1beta1.Sandbox) {
			o.UID, o.Generation, o.ResourceVersion = u, g, fmt.Sprint(g)
			o.Spec.OperatingMode = v1beta1.SandboxOperatingModeSuspended
			if g >= 3 {
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
	uid = "uid-old"
	cache(2, "uid-1")
	if obs, _, err := m.decide(rec); err != nil || obs.Reason != ReasonModeOutside {
		t.Fatalf("a write of another object: %+v, %v; want the mode outside hiloop decided", obs, err)
	}
}

// TestAttackHoldEnds: the hold lets go whenever the cache cannot be
// waiting for the write: the object gone from the cache, replaced by
// another object (a delete and re-create under the same name), ahead of
// the write, being deleted at a generation past it, or a write answered
// with generation 0.
func TestAttackHoldEnds(t *testing.T) {
	uid, gen, clock := types.UID("uid-1"), int64(9), now
	m := holdMirror(t, &uid, &gen, &clock)
	rec := record(func(s *store.Sandbox) { s.State = store.StateRunning })
	cache := func(u types.UID, g int64, mut ...func(*v1beta1.Sandbox)) {
		t.Helper()
		obj := object(func(o *v1beta1.Sandbox) {
			o.UID, o.Generation, o.ResourceVersion = u, g, string(u)+"-"+time.Duration(g).String()
			o.Spec.OperatingMode = v1beta1.SandboxOperatingModeRunning
		})
		for _, f := range mut {
			f(obj)
		}
		if err := m.objects.Update(compactSandbox(obj)); err != nil {
			t.Fatal(err)
		}
	}
	held := func(what string, want bool) {
		t.Helper()
		_, _, err := m.decide(rec)
		if got := errors.Is(err, errBehindWrite); got != want {
			t.Errorf("%s: held %v (%v), want %v", what, got, err, want)
		}
	}
	cache("uid-1", 8)
	held("behind the write", true)
	cache("uid-1", 9)
	held("at the write", false)
	cache("uid-1", 12)
	held("ahead of the write", false)
	cache("uid-2", 1)
	held("re-created under the same name", false)
	cache("uid-1", 10, func(o *v1beta1.Sandbox) { o.DeletionTimestamp = &metav1.Time{Time: now} })
	held("being deleted past the write", false)
	if err := m.objects.Delete(compactSandbox(object())); err != nil {
		t.Fatal(err)
	}
	held("gone from the cache", false)
	gen = 0
	cache("uid-1", 0)
	held("a write answered with generation 0", false)
}

// TestHoldBounded: while a sandbox's writes stay ahead of the Sandbox
// watch (patches coming faster than the watch shows them), its decisions
// wait for at most maxHold from the first that waited; then the failed pod
// is recorded though the writes are still ahead. The wait is timed again
// once the watch has caught up.
func TestHoldBounded(t *testing.T) {
	uid, gen, clock := types.UID("uid-1"), int64(2), now
	m := holdMirror(t, &uid, &gen, &clock)
	rec := record(func(s *store.Sandbox) { s.State = store.StateRunning })
	p := pod(func(p *corev1.Pod) {
		p.Namespace, p.UID = "ns", "pod-1"
		p.Status.Phase = corev1.PodFailed
	})
	if err := m.pods.Add(compactPod(p)); err != nil {
		t.Fatal(err)
	}
	cache := func(g int64) {
		t.Helper()
		obj := object(func(o *v1beta1.Sandbox) { o.UID, o.Generation, o.ResourceVersion = uid, g, time.Duration(g).String() })
		if err := m.objects.Update(compactSandbox(obj)); err != nil {
			t.Fatal(err)
		}
	}
	g := int64(1)
	for ; clock.Sub(now) < maxHold; clock = clock.Add(maxHold / 10) {
		cache(g)
		gen = g + 1 // the next patch answered before the watch shows it
		if _, _, err := m.decide(rec); !errors.Is(err, errBehindWrite) {
			t.Fatalf("%v into the hold: %v, want the hold", clock.Sub(now), err)
		}
		g++
	}
	cache(g)
	gen = g + 1
	obs, changed, err := m.decide(rec)
	if err != nil || !changed || obs.State == store.StateRunning {
		t.Fatalf("maxHold after the first wait, writes still ahead: %+v changed %v, %v; want the failed pod recorded", obs, changed, err)
	}
	// The watch catches up: the next write ahead of it waits again.
	cache(gen)
	if _, _, err := m.decide(rec); err != nil {
		t.Fatalf("caught up: %v", err)
	}
	gen++
	if _, _, err := m.decide(rec); !errors.Is(err, errBehindWrite) {
		t.Fatalf("a new write ahead after catching up: %v, want the hold", err)
	}
}

// TestDecideWaitsForOwnModeChange: while hiloop changes a sandbox's mode
// (the record already asks to run, the cluster's answer to the start's
// patch has not come, so Written still names the stop's generation), the
// start's pod seen beside the Sandbox still suspended is not recorded as a
// mode changed outside hiloop, however long the patch takes; once it is
// answered, the decision waits for the watch to show the patch, for
// maxHold from then, and is made once it does.
func TestDecideWaitsForOwnModeChange(t *testing.T) {
	uid, gen, clock := types.UID("uid-1"), int64(2), now
	m := holdMirror(t, &uid, &gen, &clock)
	writing := true
	m.o.Writing = func(id string) bool { return writing && id == record().ID }
	rec := record(func(s *store.Sandbox) { s.State = store.StateStopped })
	cache := func(g int64) {
		t.Helper()
		obj := object(func(o *v1beta1.Sandbox) {
			o.UID, o.Generation, o.ResourceVersion = uid, g, fmt.Sprint(g)
			o.Spec.OperatingMode = v1beta1.SandboxOperatingModeSuspended
			if g >= 3 {
				o.Spec.OperatingMode = v1beta1.SandboxOperatingModeRunning
			}
		})
		if err := m.objects.Update(compactSandbox(obj)); err != nil {
			t.Fatal(err)
		}
	}
	cache(2)
	p := pod(func(p *corev1.Pod) { p.Namespace, p.UID = "ns", "pod-2" })
	if err := m.pods.Add(compactPod(p)); err != nil {
		t.Fatal(err)
	}
	for ; clock.Sub(now) <= 2*maxHold; clock = clock.Add(maxHold / 2) {
		if obs, _, err := m.decide(rec); !errors.Is(err, errBehindWrite) {
			t.Fatalf("%v into the change, its patch unanswered: decided %+v, %v; want the hold", clock.Sub(now), obs, err)
		}
	}
	// The patch is answered; the watch has not shown it yet.
	writing, gen = false, 3
	if obs, _, err := m.decide(rec); !errors.Is(err, errBehindWrite) {
		t.Fatalf("the patch answered, the watch behind it: decided %+v, %v; want the hold", obs, err)
	}
	cache(3)
	obs, changed, err := m.decide(rec)
	if err != nil || !changed || obs.State != store.StateRunning || obs.Reason == ReasonModeOutside {
		t.Fatalf("the watch at the patch: %+v changed %v, %v; want running", obs, changed, err)
	}
	// A sandbox no change is under way for is decided as before.
	other := record(func(s *store.Sandbox) { s.ID, s.State = "sbx_other", store.StateStopped })
	if _, _, err := m.decide(other); errors.Is(err, errBehindWrite) {
		t.Fatalf("another sandbox is held: %v", err)
	}
}
