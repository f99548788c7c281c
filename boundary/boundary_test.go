package boundary_test

import (
	"context"
	"os"
	"slices"
	"strings"
	"testing"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	nodev1 "k8s.io/api/node/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	kubefake "k8s.io/client-go/kubernetes/fake"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/agent-sandbox/api/v1beta1"
	sandboxfake "sigs.k8s.io/agent-sandbox/clients/k8s/clientset/versioned/fake"

	"github.com/hiloop/hiloop/boundary"
	"github.com/hiloop/hiloop/cluster"
	"github.com/hiloop/hiloop/k8s"
)

// TestChartBoundary: the built-in boundary parses and holds every object
// the self-check compares; the local cluster's rendering parses too; a
// rendering without them is refused by name.
func TestChartBoundary(t *testing.T) {
	b := boundary.Chart()
	if b.Namespace.Name != k8s.DefaultNamespace || b.Quota.Namespace != k8s.DefaultNamespace || b.NetworkPolicy.Name != boundary.NetworkPolicy {
		t.Errorf("boundary: namespace %s, quota in %s, policy %s", b.Namespace.Name, b.Quota.Namespace, b.NetworkPolicy.Name)
	}
	local, err := os.ReadFile("../localcluster/assets/boundary.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := boundary.Parse(local); err != nil {
		t.Errorf("the local cluster's rendering: %v", err)
	}
	for _, tc := range []struct{ raw, want string }{
		{"", "no ResourceQuota"},
		{"kind: ResourceQuota\napiVersion: v1\nmetadata: {name: hiloop-sandboxes, namespace: x}\n", "no Namespace x"},
		{"{", ""},
	} {
		if _, err := boundary.Parse([]byte(tc.raw)); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Parse(%q): %v, want %q", tc.raw, err, tc.want)
		}
	}
}

const ns = "t-boundary"

// fakeCluster is a fake cluster holding the chart's boundary in namespace ns,
// with f applied to its objects first.
func fakeCluster(t *testing.T, f func(*objects)) *k8s.Clients {
	t.Helper()
	b := boundary.Chart()
	o := &objects{namespace: b.Namespace.DeepCopy(), quota: b.Quota.DeepCopy(), np: b.NetworkPolicy.DeepCopy(),
		policies: map[string]*admissionv1.ValidatingAdmissionPolicy{}, bindings: map[string]*admissionv1.ValidatingAdmissionPolicyBinding{}}
	o.namespace.Name, o.quota.Namespace, o.np.Namespace = ns, ns, ns
	for name, p := range b.Policies {
		o.policies[name] = p.DeepCopy()
	}
	for name, p := range b.Bindings {
		pb := p.DeepCopy()
		pb.Spec.MatchResources.NamespaceSelector.MatchExpressions[0].Values = []string{"hiloop-sandboxes", ns}
		o.bindings[name] = pb
	}
	if f != nil {
		f(o)
	}
	objs := []runtime.Object{o.namespace, o.quota, o.np, &nodev1.RuntimeClass{ObjectMeta: metav1.ObjectMeta{Name: "gvisor"}, Handler: "runsc"}}
	objs = append(objs, o.extra...)
	for _, p := range o.policies {
		objs = append(objs, p)
	}
	for _, p := range o.bindings {
		objs = append(objs, p)
	}
	sbs := sandboxfake.NewSimpleClientset()
	for _, sb := range o.sandboxes {
		if _, err := sbs.AgentsV1beta1().Sandboxes(sb.Namespace).Create(context.Background(), sb, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	return &k8s.Clients{Kube: kubefake.NewClientset(objs...), Sandbox: sbs}
}

type objects struct {
	namespace *corev1.Namespace
	quota     *corev1.ResourceQuota
	np        *networkingv1.NetworkPolicy
	policies  map[string]*admissionv1.ValidatingAdmissionPolicy
	bindings  map[string]*admissionv1.ValidatingAdmissionPolicyBinding
	extra     []runtime.Object
	sandboxes []*v1beta1.Sandbox
}

func check(t *testing.T, c *k8s.Clients, noGVisor bool) map[string]cluster.Check {
	t.Helper()
	out := map[string]cluster.Check{}
	for _, ch := range boundary.Check(context.Background(), c, boundary.Options{Namespace: ns, RuntimeClass: "gvisor", NoGVisor: noGVisor}) {
		out[ch.Object] = ch
	}
	return out
}

// TestCheckBoundary plays someone who may edit the boundary's objects but
// wants the self-check to pass: every weakening of a policy, binding,
// quota or namespace label is a failure naming the object, and a
// foreign Sandbox is a warning that refuses nothing.
func TestCheckBoundary(t *testing.T) {
	for _, ch := range check(t, fakeCluster(t, nil), false) {
		if !ch.OK {
			t.Fatalf("the chart's boundary: %s: %s", ch.Object, ch.Problem)
		}
	}
	sandboxPolicy := "ValidatingAdmissionPolicy " + boundary.PolicySandbox
	podPolicy := "ValidatingAdmissionPolicy " + boundary.PolicyPod
	sandboxBinding := "ValidatingAdmissionPolicyBinding " + boundary.PolicySandbox
	for _, tc := range []struct {
		name, object, want string
		edit               func(*objects)
	}{
		{"failurePolicy Ignore", podPolicy, "spec.failurePolicy is \"Ignore\", the chart's \"Fail\"", func(o *objects) {
			o.policies[boundary.PolicyPod].Spec.FailurePolicy = ptr.To(admissionv1.Ignore)
		}},
		{"matchConditions that skip labelled pods", podPolicy, "spec.matchConditions is", func(o *objects) {
			o.policies[boundary.PolicyPod].Spec.MatchConditions = []admissionv1.MatchCondition{{Name: "skip", Expression: "!has(object.metadata.labels.skip)"}}
		}},
		{"a variable redefined", sandboxPolicy, "spec.variables[", func(o *objects) {
			o.policies[boundary.PolicySandbox].Spec.Variables[0].Expression = "{}"
		}},
		{"a rule's expression rewritten under its message", sandboxPolicy, ".expression is", func(o *objects) {
			v := o.policies[boundary.PolicySandbox].Spec.Validations
			v[len(v)-1].Expression = "true"
		}},
		{"a rule dropped", podPolicy, "spec.validations has", func(o *objects) {
			v := o.policies[boundary.PolicyPod].Spec.Validations
			o.policies[boundary.PolicyPod].Spec.Validations = v[:len(v)-1]
		}},
		{"the runtime class rule dropped", podPolicy, "rule [runtime-class] is missing", func(o *objects) {
			o.policies[boundary.PolicyPod].Spec.Validations = slices.DeleteFunc(o.policies[boundary.PolicyPod].Spec.Validations,
				func(v admissionv1.Validation) bool { return strings.HasPrefix(v.Message, "[runtime-class]") })
		}},
		{"an object selector on the policy", podPolicy, "spec.matchConstraints.objectSelector", func(o *objects) {
			o.policies[boundary.PolicyPod].Spec.MatchConstraints.ObjectSelector = &metav1.LabelSelector{MatchLabels: map[string]string{"checked": "yes"}}
		}},
		{"excluded resources", podPolicy, "spec.matchConstraints.excludeResourceRules", func(o *objects) {
			o.policies[boundary.PolicyPod].Spec.MatchConstraints.ExcludeResourceRules = []admissionv1.NamedRuleWithOperations{{ResourceNames: []string{"x"},
				RuleWithOperations: admissionv1.RuleWithOperations{Operations: []admissionv1.OperationType{"*"}, Rule: admissionv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"pods"}}}}}
		}},
		{"a resource name on the rule", podPolicy, "resourceNames", func(o *objects) {
			o.policies[boundary.PolicyPod].Spec.MatchConstraints.ResourceRules[0].ResourceNames = []string{"only-this"}
		}},
		{"audit instead of deny", sandboxBinding, "spec.validationActions[0] is \"Audit\"", func(o *objects) {
			o.bindings[boundary.PolicySandbox].Spec.ValidationActions = []admissionv1.ValidationAction{admissionv1.Audit}
		}},
		{"an object selector on the binding", sandboxBinding, "spec.matchResources.objectSelector", func(o *objects) {
			o.bindings[boundary.PolicySandbox].Spec.MatchResources.ObjectSelector = &metav1.LabelSelector{MatchLabels: map[string]string{"checked": "yes"}}
		}},
		{"a param the policy never asked for", sandboxBinding, "spec.paramRef", func(o *objects) {
			o.bindings[boundary.PolicySandbox].Spec.ParamRef = &admissionv1.ParamRef{Name: "x", ParameterNotFoundAction: ptr.To(admissionv1.AllowAction)}
		}},
		{"namespaces by a label", sandboxBinding, "alone, so a label edit can lift it", func(o *objects) {
			o.bindings[boundary.PolicySandbox].Spec.MatchResources.NamespaceSelector = &metav1.LabelSelector{MatchLabels: map[string]string{"sandboxes": "true"}}
		}},
		{"namespaces by name and a label", sandboxBinding, "alone", func(o *objects) {
			o.bindings[boundary.PolicySandbox].Spec.MatchResources.NamespaceSelector.MatchLabels = map[string]string{"sandboxes": "true"}
		}},
		{"another namespace", sandboxBinding, "does not select namespace " + ns, func(o *objects) {
			o.bindings[boundary.PolicySandbox].Spec.MatchResources.NamespaceSelector.MatchExpressions[0].Values = []string{"elsewhere"}
		}},
		{"NotIn the namespace", sandboxBinding, "alone", func(o *objects) {
			o.bindings[boundary.PolicySandbox].Spec.MatchResources.NamespaceSelector.MatchExpressions[0].Operator = metav1.LabelSelectorOpNotIn
		}},
		{"binding another policy", sandboxBinding, "spec.policyName", func(o *objects) {
			o.bindings[boundary.PolicySandbox].Spec.PolicyName = boundary.PolicyPod
		}},
		{"binding missing", sandboxBinding, "missing", func(o *objects) { delete(o.bindings, boundary.PolicySandbox) }},
		{"quota raised", "ResourceQuota " + ns + "/" + boundary.QuotaName, "its requests.cpu is 1M, above the chart's 1k", func(o *objects) {
			o.quota.Spec.Hard["requests.cpu"] = resource.MustParse("1M")
		}},
		{"quota without a limit", "ResourceQuota " + ns + "/" + boundary.QuotaName, "it sets no limit on persistentvolumeclaims", func(o *objects) {
			delete(o.quota.Spec.Hard, "persistentvolumeclaims")
		}},
		{"quota scoped", "ResourceQuota " + ns + "/" + boundary.QuotaName, "scopes", func(o *objects) {
			o.quota.Spec.Scopes = []corev1.ResourceQuotaScope{corev1.ResourceQuotaScopeBestEffort}
		}},
		{"Pod Security pinned to an old version", "Namespace " + ns, "enforce-version is \"v1.22\", not latest", func(o *objects) {
			o.namespace.Labels["pod-security.kubernetes.io/enforce-version"] = "v1.22"
		}},
		{"Pod Security privileged", "Namespace " + ns, "enforce is \"privileged\", not baseline or stricter", func(o *objects) {
			o.namespace.Labels["pod-security.kubernetes.io/enforce"] = "privileged"
		}},
		{"Pod Security unknown level", "Namespace " + ns, "enforce is \"strict\"", func(o *objects) {
			o.namespace.Labels["pod-security.kubernetes.io/enforce"] = "strict"
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := check(t, fakeCluster(t, tc.edit), false)
			ch := got[tc.object]
			if !ch.Failed() || !strings.Contains(ch.Problem, tc.want) {
				t.Errorf("%s: failed %v, problem %q, want %q", tc.object, ch.Failed(), ch.Problem, tc.want)
			}
			for obj, other := range got {
				if obj != tc.object && other.Failed() {
					t.Errorf("also failed: %s: %s", obj, other.Problem)
				}
			}
		})
	}

	// Stricter than the chart is fine.
	stricter := check(t, fakeCluster(t, func(o *objects) {
		o.namespace.Labels["pod-security.kubernetes.io/enforce"] = "restricted"
		delete(o.namespace.Labels, "pod-security.kubernetes.io/enforce-version")
		o.quota.Spec.Hard["requests.cpu"] = resource.MustParse("10")
	}), false)
	for _, ch := range stricter {
		if !ch.OK {
			t.Errorf("stricter: %s: %s", ch.Object, ch.Problem)
		}
	}

	// A Sandbox hiloop did not make is reported and refuses nothing.
	foreign := check(t, fakeCluster(t, func(o *objects) {
		o.sandboxes = append(o.sandboxes,
			&v1beta1.Sandbox{ObjectMeta: metav1.ObjectMeta{Name: "by-hand", Namespace: ns}},
			&v1beta1.Sandbox{ObjectMeta: metav1.ObjectMeta{Name: "sbx-abc", Namespace: ns, Labels: map[string]string{k8s.LabelManagedBy: k8s.ManagedBy}}})
	}), false)
	f := foreign["Sandboxes in namespace "+ns+" that hiloop did not make"]
	if f.OK || !f.Warning || f.Failed() || f.Count != 1 || !strings.Contains(f.Problem, "by-hand") || strings.Contains(f.Problem, "sbx-abc") {
		t.Errorf("foreign Sandboxes: %+v", f)
	}
}

// TestCheckBoundaryNoGVisor: with --insecure-no-gvisor, policies without
// the runtime class rule are an allowed failure; policies that still
// require it pass (creates are then refused by admission).
func TestCheckBoundaryNoGVisor(t *testing.T) {
	drop := func(o *objects) {
		for _, p := range o.policies {
			p.Spec.Validations = slices.DeleteFunc(p.Spec.Validations, func(v admissionv1.Validation) bool { return strings.HasPrefix(v.Message, "[runtime-class]") })
		}
	}
	for obj, ch := range check(t, fakeCluster(t, drop), true) {
		if strings.HasPrefix(obj, "ValidatingAdmissionPolicy ") && (!ch.Allowed || ch.Failed()) {
			t.Errorf("%s without the rule: %+v", obj, ch)
		}
	}
	for obj, ch := range check(t, fakeCluster(t, nil), true) {
		if strings.HasPrefix(obj, "ValidatingAdmissionPolicy ") && !ch.OK {
			t.Errorf("%s with the rule: %+v", obj, ch)
		}
	}
	// Another rule dropped as well is no longer the insecure mode's gap.
	got := check(t, fakeCluster(t, func(o *objects) {
		drop(o)
		v := o.policies[boundary.PolicyPod].Spec.Validations
		o.policies[boundary.PolicyPod].Spec.Validations = v[:len(v)-1]
	}), true)
	if ch := got["ValidatingAdmissionPolicy "+boundary.PolicyPod]; !ch.Failed() {
		t.Errorf("two rules dropped: %+v", ch)
	}
}

// TestBoundaryIsSemantic: a policy as the API server stores it, with its
// defaults filled in and empty fields spelled out, equals the chart's.
func TestBoundaryIsSemantic(t *testing.T) {
	c := fakeCluster(t, func(o *objects) {
		p := o.policies[boundary.PolicyPod]
		p.Spec.MatchConstraints.NamespaceSelector = &metav1.LabelSelector{}
		p.Spec.MatchConstraints.ObjectSelector = &metav1.LabelSelector{}
		p.Spec.MatchConstraints.MatchPolicy = ptr.To(admissionv1.Equivalent)
		p.Spec.MatchConstraints.ResourceRules[0].Scope = ptr.To(admissionv1.AllScopes)
		p.Spec.MatchConditions = []admissionv1.MatchCondition{}
		b := o.bindings[boundary.PolicyPod]
		b.Spec.MatchResources.ObjectSelector = &metav1.LabelSelector{}
		b.Spec.MatchResources.MatchPolicy = ptr.To(admissionv1.Equivalent)
	})
	for _, ch := range check(t, c, false) {
		if !ch.OK {
			t.Errorf("%s: %s", ch.Object, ch.Problem)
		}
	}
	if !equality.Semantic.DeepEqual(boundary.Chart().Policies[boundary.PolicyPod].Spec.MatchConstraints.ObjectSelector, (*metav1.LabelSelector)(nil)) {
		t.Error("the test changed the built-in boundary")
	}
}
