package k8s_test

import (
	"errors"
	"fmt"
	"net"
	"syscall"
	"testing"

	"github.com/google/go-cmp/cmp"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/hiloop/hiloop/cluster"
	"github.com/hiloop/hiloop/k8s"
)

// TestClassify: the API server's answers become the core's kinds, read
// from their status and message, and whether a write may have been made.
func TestClassify(t *testing.T) {
	gr := schema.GroupResource{Group: "agents.x-k8s.io", Resource: "sandboxes"}
	gk := schema.GroupKind{Group: "agents.x-k8s.io", Kind: "Sandbox"}
	type want struct {
		Kind                error
		Policy, Rule        string
		NotFound, Ambiguous bool
	}
	for _, tc := range []struct {
		name string
		err  error
		want want
	}{
		{"invalid", apierrors.NewInvalid(gk, "sbx-a", nil), want{Kind: cluster.ErrRejected}},
		{"policy", apierrors.NewForbidden(gr, "sbx-a", errors.New("ValidatingAdmissionPolicy 'hiloop-sandbox-isolation' with binding 'b' denied request: [runtime-class] no")),
			want{Kind: cluster.ErrForbidden}},
		{"policy invalid", apierrors.NewBadRequest("ValidatingAdmissionPolicy 'hiloop-sandbox-isolation' with binding 'b' denied request: [runtime-class] no"),
			want{Kind: cluster.ErrRejected, Policy: "hiloop-sandbox-isolation", Rule: "[runtime-class] no"}},
		{"quota", apierrors.NewForbidden(gr, "sbx-a", errors.New("exceeded quota: hiloop-sandboxes")), want{Kind: cluster.ErrQuota}},
		{"quota uncounted", apierrors.NewForbidden(gr, "sbx-a", errors.New("status unknown for quota: hiloop-sandboxes")), want{Kind: cluster.ErrUnavailable}},
		{"unauthorized", apierrors.NewUnauthorized("no"), want{Kind: cluster.ErrForbidden}},
		{"timeout", apierrors.NewTimeoutError("slow", 1), want{Kind: cluster.ErrUnavailable, Ambiguous: true}},
		{"server error", apierrors.NewInternalError(errors.New("etcd")), want{Kind: cluster.ErrUnavailable, Ambiguous: true}},
		{"not found", fmt.Errorf("patch sandbox: %w", apierrors.NewNotFound(gr, "sbx-a")), want{Kind: cluster.ErrUnavailable, NotFound: true}},
		{"refused", &net.OpError{Op: "read", Err: syscall.ECONNREFUSED}, want{Kind: cluster.ErrUnavailable}},
		{"dial", &net.OpError{Op: "dial", Err: errors.New("no route")}, want{Kind: cluster.ErrUnavailable}},
		{"other", errors.New("broken"), want{Kind: cluster.ErrUnavailable, Ambiguous: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := k8s.Classify(tc.err)
			var ce *cluster.Error
			if !errors.As(err, &ce) {
				t.Fatalf("Classify = %T, want a *cluster.Error", err)
			}
			got := want{Kind: ce.Kind, Policy: ce.Policy, Rule: ce.Rule, NotFound: ce.NotFound, Ambiguous: ce.Ambiguous}
			if diff := cmp.Diff(tc.want, got, cmp.Comparer(func(a, b error) bool { return a == b })); diff != "" {
				t.Error(diff)
			}
			if !errors.Is(err, tc.err) || cluster.IsNotFound(err) != tc.want.NotFound {
				t.Errorf("Classify(%v) = %v: lost the cause", tc.err, err)
			}
			if again := k8s.Classify(err); again != err {
				t.Errorf("classifying again made %v", again)
			}
		})
	}
	if k8s.Classify(nil) != nil {
		t.Error("Classify(nil) is not nil")
	}
}
