package k8s_test

import (
	"context"
	"sync"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	kubefake "k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"sigs.k8s.io/agent-sandbox/api/v1beta1"
	sandboxfake "sigs.k8s.io/agent-sandbox/clients/k8s/clientset/versioned/fake"

	"github.com/hiloop/hiloop/k8s"
	"github.com/hiloop/hiloop/store"
)

// answering is a writer whose patches are answered, in the order the test
// releases them, with the uid and generation the test gives.
func answering(t *testing.T) (*k8s.Writer, chan<- v1beta1.Sandbox) {
	t.Helper()
	answers := make(chan v1beta1.Sandbox)
	sb := sandboxfake.NewSimpleClientset()
	sb.PrependReactor("patch", "sandboxes", func(k8stesting.Action) (bool, runtime.Object, error) {
		obj := <-answers
		return true, &obj, nil
	})
	w, err := k8s.NewWriter(&k8s.Clients{Kube: kubefake.NewClientset(), Sandbox: sb}, k8s.RenderOptions{Namespace: "ns", RuntimeClass: "gvisor"})
	if err != nil {
		t.Fatal(err)
	}
	return w, answers
}

func answer(uid types.UID, gen int64) v1beta1.Sandbox {
	return v1beta1.Sandbox{ObjectMeta: metav1.ObjectMeta{UID: uid, Generation: gen}}
}

// TestAttackWrittenOutOfOrder: of two patches of one object answered out of
// order, the higher generation stands; a patch answered with generation 0
// asks for no hold; a re-created object's patch replaces the old object's
// entry, and a late answer of the old object makes the entry name an
// object the cache will not hold (a hold lost, never one that cannot end).
func TestAttackWrittenOutOfOrder(t *testing.T) {
	w, answers := answering(t)
	ctx := context.Background()
	id := store.NewID("sbx")
	patch := func(uid types.UID, gen int64) {
		t.Helper()
		done := make(chan error, 1)
		go func() { done <- w.SetMode(ctx, id, store.ModeStopped) }()
		answers <- answer(uid, gen)
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	want := func(uid string, gen int64) {
		t.Helper()
		if u, g := w.Written(id); u != uid || g != gen {
			t.Errorf("Written: %q %d, want %q %d", u, g, uid, gen)
		}
	}
	patch("u1", 5)
	patch("u1", 4) // the earlier patch's answer, arriving late
	want("u1", 5)
	patch("u1", 6)
	want("u1", 6)
	patch("u2", 1) // the object was re-created under the same name
	want("u2", 1)
	patch("u1", 7) // a late answer of the old object
	want("u1", 7)
	if err := w.Delete(ctx, id); err != nil {
		t.Fatal(err)
	}
	want("", 0)
	patch("u3", 0)
	want("u3", 0)
}

// TestAttackWrittenConcurrent: many concurrent patches of one object,
// answered in any order, leave the highest generation.
func TestAttackWrittenConcurrent(t *testing.T) {
	w, answers := answering(t)
	ctx := context.Background()
	id := store.NewID("sbx")
	var wg sync.WaitGroup
	for range 50 {
		wg.Go(func() {
			if err := w.SetMode(ctx, id, store.ModeRunning); err != nil {
				t.Error(err)
			}
		})
	}
	for _, g := range []int64{17, 3, 50, 9, 1, 49, 22, 8, 33, 2, 4, 5, 6, 7, 10, 11, 12, 13, 14, 15, 16, 18, 19, 20, 21, 23, 24, 25, 26, 27,
		28, 29, 30, 31, 32, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47, 48} {
		answers <- answer("u1", g)
	}
	wg.Wait()
	if u, g := w.Written(id); u != "u1" || g != 50 {
		t.Errorf("Written: %q %d, want u1 50", u, g)
	}
}
