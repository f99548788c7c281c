// Package boundary is the isolation self-check: it reads the objects the
// sandboxes' isolation rests on (the namespace's Pod Security labels, the
// RuntimeClass, the admission policies and their bindings, the quota, the
// NetworkPolicies) through the cluster adapter's clients and holds them to
// the chart's rendering; hiloop doctor also checks egress to the cluster's
// own addresses. It writes nothing.
package boundary

import (
	"bytes"
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"sort"
	"strings"
	"sync"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/sets"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"

	"github.com/hiloop/hiloop/cluster"
	"github.com/hiloop/hiloop/k8s"
)

// The objects of the isolation boundary, as the chart (deploy/chart) names
// them. The self-check reads each by name, and every NetworkPolicy of the
// sandbox namespace.
const (
	PolicySandbox    = "hiloop-sandbox-isolation"
	PolicyPod        = "hiloop-pod-isolation"
	QuotaName        = "hiloop-sandboxes"
	NetworkPolicy    = "hiloop-sandbox-isolation"
	GVisorHandler    = "runsc"
	quotaResource    = "count/sandboxes.agents.x-k8s.io"
	ruleRuntimeClass = "runtime-class"
)

// PolicyRules are the ids of some of the rules every isolation policy
// holds; each rule's message starts with its id in brackets. The
// self-check compares the policies whole, with the chart's rendering.
var PolicyRules = []string{ruleRuntimeClass, "host-namespaces", "service-account-token", "privileged", "helper-hardened"}

// DeniedCIDRs are the ranges the chart's default values keep sandbox egress
// from, whatever the cluster: private, carrier-grade NAT, link-local (the
// metadata services), loopback, "this network", benchmarking, reserved,
// Azure's WireServer; IPv6 unique-local, link-local, loopback and NAT64.
// The cluster's own networks come on top, from values.
var DeniedCIDRs = []string{"10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10", "169.254.0.0/16", "127.0.0.0/8",
	"0.0.0.0/8", "198.18.0.0/15", "240.0.0.0/4", "168.63.129.16/32",
	"fc00::/7", "fe80::/10", "::1/128", "64:ff9b::/96", "64:ff9b:1::/48"}

// auditor reads the boundary's objects from the cluster.
type auditor struct{ *k8s.Clients }

// Objects is the isolation boundary as the chart renders it: what the
// self-check holds a cluster to.
type Objects struct {
	// Namespace is the sandbox namespace (its Pod Security labels count).
	Namespace *corev1.Namespace
	Policies  map[string]*admissionv1.ValidatingAdmissionPolicy
	Bindings  map[string]*admissionv1.ValidatingAdmissionPolicyBinding
	// NetworkPolicy is the sandbox namespace's policy: the widest the
	// namespace's policies together may allow.
	NetworkPolicy *networkingv1.NetworkPolicy
	Quota         *corev1.ResourceQuota
}

// chartBoundary is the chart's boundary templates rendered with the default
// values (make chart).
//
//go:embed chart-boundary.yaml
var chartBoundary []byte

// Chart is the boundary of the chart's default values, built in.
var Chart = sync.OnceValue(func() *Objects {
	b, err := Parse(chartBoundary)
	if err != nil {
		panic("boundary/chart-boundary.yaml: " + err.Error()) // TestChartBoundary parses it
	}
	return b
})

// Parse reads a rendering of the chart (helm template's output, or
// the ConfigMap hiloop-boundary's boundary.yaml) and picks the boundary's
// objects out of it; other objects are ignored. The sandbox namespace is
// the quota's.
func Parse(raw []byte) (*Objects, error) {
	b := &Objects{Policies: map[string]*admissionv1.ValidatingAdmissionPolicy{}, Bindings: map[string]*admissionv1.ValidatingAdmissionPolicyBinding{}}
	var namespaces []*corev1.Namespace
	var nps []*networkingv1.NetworkPolicy
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(raw), 4096)
	for {
		var doc json.RawMessage
		err := dec.Decode(&doc)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, err
		}
		if len(doc) == 0 || string(doc) == "null" {
			continue
		}
		var meta metav1.TypeMeta
		if err := json.Unmarshal(doc, &meta); err != nil {
			return nil, err
		}
		var into any
		switch meta.Kind {
		case "Namespace":
			into = &corev1.Namespace{}
		case "ValidatingAdmissionPolicy":
			into = &admissionv1.ValidatingAdmissionPolicy{}
		case "ValidatingAdmissionPolicyBinding":
			into = &admissionv1.ValidatingAdmissionPolicyBinding{}
		case "NetworkPolicy":
			into = &networkingv1.NetworkPolicy{}
		case "ResourceQuota":
			into = &corev1.ResourceQuota{}
		default:
			continue
		}
		if err := json.Unmarshal(doc, into); err != nil {
			return nil, fmt.Errorf("%s: %w", meta.Kind, err)
		}
		switch o := into.(type) {
		case *corev1.Namespace:
			namespaces = append(namespaces, o)
		case *admissionv1.ValidatingAdmissionPolicy:
			b.Policies[o.Name] = o
		case *admissionv1.ValidatingAdmissionPolicyBinding:
			b.Bindings[o.Name] = o
		case *networkingv1.NetworkPolicy:
			nps = append(nps, o)
		case *corev1.ResourceQuota:
			if o.Name == QuotaName {
				b.Quota = o
			}
		}
	}
	if b.Quota == nil {
		return nil, fmt.Errorf("no ResourceQuota %s", QuotaName)
	}
	ns := b.Quota.Namespace
	for _, n := range namespaces {
		if n.Name == ns {
			b.Namespace = n
		}
	}
	for _, np := range nps {
		if np.Namespace == ns && np.Name == NetworkPolicy {
			b.NetworkPolicy = np
		}
	}
	switch {
	case b.Namespace == nil:
		return nil, fmt.Errorf("no Namespace %s", ns)
	case b.NetworkPolicy == nil:
		return nil, fmt.Errorf("no NetworkPolicy %s/%s", ns, NetworkPolicy)
	}
	return b, b.complete()
}

// complete checks that both policies and their bindings are there.
func (b *Objects) complete() error {
	for _, name := range []string{PolicySandbox, PolicyPod} {
		if b.Policies[name] == nil {
			return fmt.Errorf("no ValidatingAdmissionPolicy %s", name)
		}
		if b.Bindings[name] == nil {
			return fmt.Errorf("no ValidatingAdmissionPolicyBinding %s", name)
		}
	}
	return nil
}

// Options say what the boundary must hold for this deployment.
type Options struct {
	Namespace    string
	RuntimeClass string
	SessionPort  int
	// NoGVisor is the development mode without gVisor: a missing runtime
	// class and a policy that does not require it are failures it allows.
	NoGVisor bool
	// Expected is the chart's rendering the cluster is held to
	// (--boundary-file); Chart when nil. Its sandbox namespace
	// stands for Namespace.
	Expected *Objects
}

func (o Options) expected() *Objects {
	if o.Expected != nil {
		return o.Expected
	}
	return Chart()
}

const fixChart = "install or upgrade the hiloop chart (docs/install.md)"

// Check reads every object the isolation boundary depends on and
// compares it with the chart's rendering (o.Expected): the namespace's Pod
// Security labels, the RuntimeClass, both admission policies and their
// bindings, the quota, and every NetworkPolicy of the namespace together.
// It also reports Sandboxes in the namespace that hiloop did not make. An
// object it cannot read is a failure.
func Check(ctx context.Context, clients *k8s.Clients, o Options) []cluster.Check {
	c, exp := auditor{clients}, o.expected()
	out := []cluster.Check{c.checkNamespace(ctx, o, exp), c.checkRuntimeClass(ctx, o)}
	for _, name := range []string{PolicySandbox, PolicyPod} {
		out = append(out, c.checkPolicy(ctx, o, exp, name), c.checkBinding(ctx, o, exp, name))
	}
	out = append(out, c.checkQuota(ctx, o, exp), c.checkNetworkPolicies(ctx, o, exp), c.checkForeignSandboxes(ctx, o))
	return out
}

// readFailure is a check that could not read its object.
func readFailure(ch cluster.Check, err error) cluster.Check {
	if apierrors.IsNotFound(err) {
		ch.Problem, ch.Fix = "missing", fixChart
		return ch
	}
	ch.Problem, ch.Detail = "cannot read it", k8s.ShortError(err)
	ch.Fix = "give hiloop's service account get on it (the chart's RBAC does), and check the cluster answers"
	return ch
}

// Pod Security levels, weakest first.
var psaLevels = []string{"privileged", "baseline", "restricted"}

func (c auditor) checkNamespace(ctx context.Context, o Options, exp *Objects) cluster.Check {
	ch := cluster.Check{Name: "namespace", Object: "Namespace " + o.Namespace}
	ns, err := c.Kube.CoreV1().Namespaces().Get(ctx, o.Namespace, metav1.GetOptions{})
	if err != nil {
		return readFailure(ch, err)
	}
	if problems := podSecurityProblems(ns.Labels, exp.Namespace.Labels); len(problems) > 0 {
		var fix []string
		for _, mode := range []string{"enforce", "audit", "warn"} {
			for _, k := range []string{"pod-security.kubernetes.io/" + mode, "pod-security.kubernetes.io/" + mode + "-version"} {
				if v, ok := exp.Namespace.Labels[k]; ok {
					fix = append(fix, k+"="+v)
				}
			}
		}
		ch.Problem = strings.Join(problems, "; ")
		ch.Fix = fmt.Sprintf("kubectl label --overwrite namespace %s %s", o.Namespace, strings.Join(fix, " "))
		return ch
	}
	ch.OK = true
	return ch
}

// podSecurityProblems says where the namespace's Pod Security labels are
// weaker than the chart's: a lower level in any mode, or a version other
// than the chart's (a version pinned to an older release lacks the newer
// checks; no version label means latest).
func podSecurityProblems(have, want map[string]string) []string {
	var problems []string
	for _, mode := range []string{"enforce", "audit", "warn"} {
		key := "pod-security.kubernetes.io/" + mode
		w, ok := want[key]
		if !ok {
			continue
		}
		h := have[key]
		if slices.Index(psaLevels, h) < slices.Index(psaLevels, w) {
			problems = append(problems, fmt.Sprintf("Pod Security %s is %q, not %s or stricter", mode, h, w))
		}
		wv, hv := orLatest(want[key+"-version"]), orLatest(have[key+"-version"])
		if hv != wv && hv != "latest" {
			problems = append(problems, fmt.Sprintf("Pod Security %s-version is %q, not %s", mode, hv, wv))
		}
	}
	return problems
}

func orLatest(v string) string {
	if v == "" {
		return "latest"
	}
	return v
}

func (c auditor) checkRuntimeClass(ctx context.Context, o Options) cluster.Check {
	ch := cluster.Check{Name: "runtime_class", Object: "RuntimeClass " + o.RuntimeClass}
	if o.NoGVisor {
		ch.Object, ch.Allowed = "RuntimeClass (none)", true
		ch.Problem = "sandboxes run without gVisor (--insecure-no-gvisor): the workload shares the node's kernel"
		ch.Fix = "install gVisor on the nodes and run without --insecure-no-gvisor"
		return ch
	}
	rc, err := c.Kube.NodeV1().RuntimeClasses().Get(ctx, o.RuntimeClass, metav1.GetOptions{})
	if err != nil {
		return readFailure(ch, err)
	}
	if rc.Handler != GVisorHandler {
		ch.Problem = fmt.Sprintf("handler is %q, not %s (gVisor)", rc.Handler, GVisorHandler)
		ch.Fix = fixChart
		return ch
	}
	ch.OK = true
	return ch
}

// withoutRuntimeClass is a policy spec without its [runtime-class] rule.
func withoutRuntimeClass(s admissionv1.ValidatingAdmissionPolicySpec) admissionv1.ValidatingAdmissionPolicySpec {
	s.Validations = slices.DeleteFunc(slices.Clone(s.Validations), isRuntimeClassRule)
	return s
}

func isRuntimeClassRule(v admissionv1.Validation) bool {
	return strings.HasPrefix(v.Message, "["+ruleRuntimeClass+"]")
}

func (c auditor) checkPolicy(ctx context.Context, o Options, exp *Objects, name string) cluster.Check {
	ch := cluster.Check{Name: "admission_policy", Object: "ValidatingAdmissionPolicy " + name}
	p, err := c.Kube.AdmissionregistrationV1().ValidatingAdmissionPolicies().Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return readFailure(ch, err)
	}
	have, want := *p.Spec.DeepCopy(), *exp.Policies[name].Spec.DeepCopy()
	defaultPolicy(&have)
	defaultPolicy(&want)
	wantRC := slices.IndexFunc(want.Validations, isRuntimeClassRule)
	switch {
	case o.NoGVisor && len(specDiff(have, withoutRuntimeClass(want))) == 0:
		ch.Allowed, ch.Problem = true, "the runtime class is not required (--insecure-no-gvisor)"
		ch.Fix = "install the chart with gvisor.required=true on a cluster with gVisor"
		return ch
	case !o.NoGVisor && wantRC < 0:
		ch.Problem = "the chart's rendering does not require a runtime class (gvisor.required=false): run with --insecure-no-gvisor, or install the chart with gvisor.required=true"
		ch.Fix = fixChart
		return ch
	case !o.NoGVisor && !strings.Contains(want.Validations[wantRC].Expression, "'"+o.RuntimeClass+"'"):
		ch.Problem = fmt.Sprintf("the chart's rendering requires another runtime class than %s (--runtime-class)", o.RuntimeClass)
		ch.Fix = "install the chart with gvisor.runtimeClass=" + o.RuntimeClass + ", or pass --boundary-file with its rendering"
		return ch
	}
	if diff := specDiff(have, want); len(diff) > 0 {
		if !o.NoGVisor && !slices.ContainsFunc(have.Validations, isRuntimeClassRule) {
			diff = append([]string{"rule [" + ruleRuntimeClass + "] is missing"}, diff...)
		}
		ch.Problem = "differs from the chart's rendering: " + strings.Join(diff, "; ")
		ch.Fix = fixChart + "; if it was installed with other values, pass their rendering with --boundary-file"
		return ch
	}
	ch.OK = true
	return ch
}

// selectedNames is the set of namespace names a selector selects by
// kubernetes.io/metadata.name, in either form the chart could write; ok is
// false for a selector that selects by anything else.
func selectedNames(s *metav1.LabelSelector) (sets.Set[string], bool) {
	if s == nil {
		return nil, false
	}
	switch {
	case len(s.MatchLabels) == 1 && len(s.MatchExpressions) == 0:
		if v, ok := s.MatchLabels[corev1.LabelMetadataName]; ok {
			return sets.New(v), true
		}
	case len(s.MatchLabels) == 0 && len(s.MatchExpressions) == 1:
		e := s.MatchExpressions[0]
		if e.Key == corev1.LabelMetadataName && e.Operator == metav1.LabelSelectorOpIn {
			return sets.New(e.Values...), true
		}
	}
	return nil, false
}

func (c auditor) checkBinding(ctx context.Context, o Options, exp *Objects, name string) cluster.Check {
	ch := cluster.Check{Name: "admission_binding", Object: "ValidatingAdmissionPolicyBinding " + name}
	b, err := c.Kube.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings().Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return readFailure(ch, err)
	}
	have, want := b.Spec.DeepCopy(), exp.Bindings[name].Spec.DeepCopy()
	var problems []string
	// The namespaces: by name, and this one among them. The chart's own
	// namespace stands for this one, and more names only bind more.
	if have.MatchResources == nil {
		problems = append(problems, "it selects every resource in every namespace, not the sandbox namespace by name")
	} else if names, ok := selectedNames(have.MatchResources.NamespaceSelector); !ok {
		problems = append(problems, "it does not select namespaces by "+corev1.LabelMetadataName+" alone, so a label edit can lift it")
	} else if !names.Has(o.Namespace) {
		problems = append(problems, "it does not select namespace "+o.Namespace)
	}
	if have.MatchResources != nil {
		have.MatchResources.NamespaceSelector = nil
	}
	if want.MatchResources != nil {
		want.MatchResources.NamespaceSelector = nil
	}
	defaultMatch(have.MatchResources)
	defaultMatch(want.MatchResources)
	if diff := specDiff(have, want); len(problems) == 0 && len(diff) > 0 {
		problems = append(problems, "differs from the chart's rendering: "+strings.Join(diff, "; "))
	}
	if len(problems) > 0 {
		ch.Problem, ch.Fix = strings.Join(problems, "; "), fixChart
		return ch
	}
	ch.OK = true
	return ch
}

func (c auditor) checkQuota(ctx context.Context, o Options, exp *Objects) cluster.Check {
	ch := cluster.Check{Name: "quota", Object: "ResourceQuota " + o.Namespace + "/" + QuotaName}
	q, err := c.Kube.CoreV1().ResourceQuotas(o.Namespace).Get(ctx, QuotaName, metav1.GetOptions{})
	if err != nil {
		return readFailure(ch, err)
	}
	var problems []string
	if len(q.Spec.Scopes) > 0 || q.Spec.ScopeSelector != nil {
		problems = append(problems, "it has scopes, so it counts only some of the namespace's objects")
	}
	names := make([]string, 0, len(exp.Quota.Spec.Hard))
	for r := range exp.Quota.Spec.Hard {
		names = append(names, string(r))
	}
	sort.Strings(names)
	for _, r := range names {
		want := exp.Quota.Spec.Hard[corev1.ResourceName(r)]
		have, ok := q.Spec.Hard[corev1.ResourceName(r)]
		switch {
		case !ok:
			problems = append(problems, "it sets no limit on "+r)
		case have.Cmp(want) > 0:
			problems = append(problems, fmt.Sprintf("its %s is %s, above the chart's %s", r, have.String(), want.String()))
		}
	}
	if len(problems) > 0 {
		ch.Problem, ch.Fix = strings.Join(problems, "; "), fixChart
		return ch
	}
	ch.OK = true
	return ch
}

// checkNetworkPolicies evaluates every NetworkPolicy of the namespace
// together (see netpol.go): some must isolate every pod both ways, and none
// may allow a peer or port the chart's policy does not.
func (c auditor) checkNetworkPolicies(ctx context.Context, o Options, exp *Objects) cluster.Check {
	ch := cluster.Check{Name: "network_policy", Object: "NetworkPolicies in namespace " + o.Namespace}
	list, err := c.Kube.NetworkingV1().NetworkPolicies(o.Namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return readFailure(ch, err)
	}
	nps := make([]*networkingv1.NetworkPolicy, len(list.Items))
	for i := range list.Items {
		nps[i] = &list.Items[i]
	}
	if problems := policyExcess(nps, exp.NetworkPolicy, o.Namespace); len(problems) > 0 {
		ch.Problem = strings.Join(problems, "; ")
		ch.Fix = fmt.Sprintf("delete or narrow the NetworkPolicies named (kubectl -n %s get networkpolicies), and install or upgrade the hiloop chart", o.Namespace)
		return ch
	}
	ch.OK = true
	return ch
}

// ForeignLimit bounds how many foreign Sandboxes one check lists.
const ForeignLimit = 500

// checkForeignSandboxes finds Sandboxes in the namespace without hiloop's
// managed-by label, which the mirror, watching hiloop's label only, never
// sees. The admission policies hold them like any other, so they refuse
// nothing; they are reported.
func (c auditor) checkForeignSandboxes(ctx context.Context, o Options) cluster.Check {
	ch := cluster.Check{Name: cluster.CheckForeignSandboxes, Object: "Sandboxes in namespace " + o.Namespace + " that hiloop did not make"}
	list, err := c.Sandbox.AgentsV1beta1().Sandboxes(o.Namespace).List(ctx, metav1.ListOptions{
		LabelSelector: k8s.LabelManagedBy + "!=" + k8s.ManagedBy, Limit: ForeignLimit})
	if err != nil {
		ch.Warning, ch.Problem, ch.Detail = true, "cannot list them", k8s.ShortError(err)
		ch.Fix = "give hiloop's service account list on sandboxes (the chart's RBAC does)"
		return ch
	}
	if len(list.Items) == 0 {
		ch.OK = true
		return ch
	}
	names := make([]string, 0, len(list.Items))
	for _, sb := range list.Items {
		names = append(names, sb.Name)
	}
	more := ""
	if list.Continue != "" {
		more = fmt.Sprintf(" (the first %d)", ForeignLimit)
	}
	ch.Warning, ch.Count = true, len(names)
	ch.Problem = fmt.Sprintf("%d Sandboxes without hiloop's label %s=%s%s: %s", len(names), k8s.LabelManagedBy, k8s.ManagedBy, more, strings.Join(names, ", "))
	ch.Fix = fmt.Sprintf("find who made them (kubectl -n %s get sandboxes -l '%s!=%s' -o yaml) and delete them: the sandbox namespace is hiloop's alone", o.Namespace, k8s.LabelManagedBy, k8s.ManagedBy)
	return ch
}
