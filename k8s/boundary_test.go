package k8s_test

import (
	"bytes"
	"errors"
	"io"
	"os"
	"strings"
	"testing"

	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"

	"github.com/hiloop/hiloop/k8s"
)

// chartNetworkPolicy is the NetworkPolicy of the chart's default rendering.
func chartNetworkPolicy(t *testing.T) *networkingv1.NetworkPolicy {
	t.Helper()
	raw, err := os.ReadFile("../deploy/hiloop.yaml")
	if err != nil {
		t.Fatal(err)
	}
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(raw), 4096)
	for {
		var np networkingv1.NetworkPolicy
		err := dec.Decode(&np)
		if errors.Is(err, io.EOF) {
			t.Fatal("no NetworkPolicy in deploy/hiloop.yaml")
		}
		if err != nil {
			t.Fatal(err)
		}
		if np.Kind == "NetworkPolicy" && np.Name == k8s.NetworkPolicy {
			return &np
		}
	}
}

// TestNetworkPolicyProblems: the chart's policy holds; each way of
// weakening it is named.
func TestNetworkPolicyProblems(t *testing.T) {
	if p := k8s.NetworkPolicyProblems(chartNetworkPolicy(t), k8s.DefaultSessionPort); len(p) > 0 {
		t.Fatalf("the chart's policy: %v", p)
	}
	port := intstr.FromInt32(22)
	for _, tc := range []struct {
		name   string
		weaken func(*networkingv1.NetworkPolicy)
		want   string
	}{
		{"selects some pods", func(np *networkingv1.NetworkPolicy) { np.Spec.PodSelector.MatchLabels = map[string]string{"a": "b"} }, "every pod"},
		{"egress unrestricted", func(np *networkingv1.NetworkPolicy) { np.Spec.PolicyTypes = np.Spec.PolicyTypes[:1] }, "both ingress and egress"},
		{"ingress from anywhere", func(np *networkingv1.NetworkPolicy) { np.Spec.Ingress[0].From = nil }, "more than hiloop's pod"},
		{"ingress on another port", func(np *networkingv1.NetworkPolicy) { np.Spec.Ingress[0].Ports[0].Port = &port }, "more than the session port"},
		{"egress everywhere", func(np *networkingv1.NetworkPolicy) {
			np.Spec.Egress = append(np.Spec.Egress, networkingv1.NetworkPolicyEgressRule{})
		}, "every destination"},
		{"in-cluster egress beyond DNS", func(np *networkingv1.NetworkPolicy) { np.Spec.Egress[0].Ports = nil }, "more than DNS"},
		{"metadata service reachable", func(np *networkingv1.NetworkPolicy) {
			b := np.Spec.Egress[1].To[0].IPBlock
			b.Except = b.Except[:len(b.Except)-1]
		}, "169.254.0.0/16"},
		{"IPv6 unique-local reachable", func(np *networkingv1.NetworkPolicy) { np.Spec.Egress[1].To[1].IPBlock.Except = nil }, "fc00::/7, fe80::/10"},
		{"a narrower except does not cover", func(np *networkingv1.NetworkPolicy) {
			np.Spec.Egress[1].To[0].IPBlock.Except[0] = "10.0.0.0/9"
		}, "10.0.0.0/8"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			np := chartNetworkPolicy(t)
			tc.weaken(np)
			if p := strings.Join(k8s.NetworkPolicyProblems(np, k8s.DefaultSessionPort), "; "); !strings.Contains(p, tc.want) {
				t.Errorf("problems %q, want one naming %q", p, tc.want)
			}
		})
	}
}
