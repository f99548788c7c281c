package k8s

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
)

// The objects of the isolation boundary, as the chart (deploy/chart) names
// them. The self-check reads each by name.
const (
	PolicySandbox    = "hiloop-sandbox-isolation"
	PolicyPod        = "hiloop-pod-isolation"
	QuotaName        = "hiloop-sandboxes"
	NetworkPolicy    = "hiloop-sandbox-isolation"
	GVisorHandler    = "runsc"
	quotaResource    = "count/sandboxes.agents.x-k8s.io"
	ruleRuntimeClass = "runtime-class"
)

// PolicyRules are the ids of the rules every isolation policy holds; each
// rule's message starts with its id in brackets.
var PolicyRules = []string{ruleRuntimeClass, "host-namespaces", "service-account-token", "privileged", "helper-hardened"}

// DeniedCIDRs are the ranges sandbox egress must never reach: private,
// carrier-grade NAT, link-local (the metadata service), and their IPv6
// counterparts.
var DeniedCIDRs = []string{"10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10", "169.254.0.0/16", "fc00::/7", "fe80::/10"}

// BoundaryOptions say what the boundary must hold for this deployment.
type BoundaryOptions struct {
	Namespace    string
	RuntimeClass string
	SessionPort  int
	// NoGVisor is the development mode without gVisor: a missing runtime
	// class and a policy that does not require it are failures it allows.
	NoGVisor bool
}

// Check is one finding of the self-check.
type Check struct {
	// Name is a fixed name, fit for a metric label.
	Name string `json:"name"`
	// Object is the cluster object checked ("Namespace hiloop-sandboxes").
	Object string `json:"object"`
	OK     bool   `json:"ok"`
	// Allowed marks a failure this deployment accepts (--insecure-no-gvisor).
	Allowed bool   `json:"allowed,omitempty"`
	Problem string `json:"problem,omitempty"`
	Fix     string `json:"fix,omitempty"`
	// Detail is the cluster's own error when the object could not be read.
	// It can name hiloop's service account, so it goes to the log and to
	// `hiloop doctor`, never into an API answer.
	Detail string `json:"-"`
}

// Failed reports whether the check fails and the failure is not allowed.
func (c Check) Failed() bool { return !c.OK && !c.Allowed }

const fixChart = "install or upgrade the hiloop chart (docs/install.md)"

// CheckBoundary reads every object the isolation boundary depends on and
// reports, for each, whether it exists and holds. It makes one request per
// object; an object it cannot read is a failure.
func (c *Clients) CheckBoundary(ctx context.Context, o BoundaryOptions) []Check {
	var out []Check
	ns, nsCheck := c.checkNamespace(ctx, o)
	out = append(out, nsCheck)
	out = append(out, c.checkRuntimeClass(ctx, o))
	for _, p := range []struct{ name, group, resource string }{
		{PolicySandbox, SandboxGroup, SandboxResource},
		{PolicyPod, "", "pods"},
	} {
		out = append(out, c.checkPolicy(ctx, o, p.name, p.group, p.resource))
		out = append(out, c.checkBinding(ctx, ns, p.name))
	}
	out = append(out, c.checkQuota(ctx, o), c.checkNetworkPolicy(ctx, o))
	return out
}

// readFailure is a check that could not read its object.
func readFailure(ch Check, err error) Check {
	if apierrors.IsNotFound(err) {
		ch.Problem, ch.Fix = "missing", fixChart
		return ch
	}
	ch.Problem, ch.Detail = "cannot read it", shortError(err)
	ch.Fix = "give hiloop's service account get on it (the chart's RBAC does), and check the cluster answers"
	return ch
}

func (c *Clients) checkNamespace(ctx context.Context, o BoundaryOptions) (*corev1.Namespace, Check) {
	ch := Check{Name: "namespace", Object: "Namespace " + o.Namespace}
	ns, err := c.Kube.CoreV1().Namespaces().Get(ctx, o.Namespace, metav1.GetOptions{})
	if err != nil {
		return nil, readFailure(ch, err)
	}
	l := ns.Labels
	var problems []string
	if e := l["pod-security.kubernetes.io/enforce"]; e != "baseline" && e != "restricted" {
		problems = append(problems, fmt.Sprintf("Pod Security enforce is %q, not baseline or restricted", e))
	}
	for _, mode := range []string{"audit", "warn"} {
		if v := l["pod-security.kubernetes.io/"+mode]; v != "restricted" {
			problems = append(problems, fmt.Sprintf("Pod Security %s is %q, not restricted", mode, v))
		}
	}
	if len(problems) > 0 {
		ch.Problem = strings.Join(problems, "; ")
		ch.Fix = fmt.Sprintf("kubectl label --overwrite namespace %s pod-security.kubernetes.io/enforce=baseline pod-security.kubernetes.io/audit=restricted pod-security.kubernetes.io/warn=restricted", o.Namespace)
		return ns, ch
	}
	ch.OK = true
	return ns, ch
}

func (c *Clients) checkRuntimeClass(ctx context.Context, o BoundaryOptions) Check {
	ch := Check{Name: "runtime_class", Object: "RuntimeClass " + o.RuntimeClass}
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

func (c *Clients) checkPolicy(ctx context.Context, o BoundaryOptions, name, group, resource string) Check {
	ch := Check{Name: "admission_policy", Object: "ValidatingAdmissionPolicy " + name}
	p, err := c.Kube.AdmissionregistrationV1().ValidatingAdmissionPolicies().Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return readFailure(ch, err)
	}
	var problems []string
	var allowed []string
	if p.Spec.FailurePolicy != nil && *p.Spec.FailurePolicy != admissionv1.Fail {
		problems = append(problems, fmt.Sprintf("failurePolicy is %s, not Fail", *p.Spec.FailurePolicy))
	}
	if !policyMatches(p.Spec.MatchConstraints, group, resource) {
		problems = append(problems, fmt.Sprintf("it does not match %s on create and update", resource))
	}
	for _, rule := range PolicyRules {
		i := slices.IndexFunc(p.Spec.Validations, func(v admissionv1.Validation) bool {
			return strings.HasPrefix(v.Message, "["+rule+"]")
		})
		switch {
		case i < 0 && rule == ruleRuntimeClass && o.NoGVisor:
			allowed = append(allowed, "the runtime class is not required (--insecure-no-gvisor)")
		case i < 0:
			problems = append(problems, fmt.Sprintf("rule [%s] is missing", rule))
		case rule == ruleRuntimeClass && !o.NoGVisor && !strings.Contains(p.Spec.Validations[i].Expression, "'"+o.RuntimeClass+"'"):
			problems = append(problems, fmt.Sprintf("rule [%s] does not require runtime class %s", rule, o.RuntimeClass))
		}
	}
	switch {
	case len(problems) > 0:
		ch.Problem, ch.Fix = strings.Join(problems, "; "), fixChart
	case len(allowed) > 0:
		ch.Allowed, ch.Problem = true, strings.Join(allowed, "; ")
		ch.Fix = "install the chart with gvisor.required=true on a cluster with gVisor"
	default:
		ch.OK = true
	}
	return ch
}

// policyMatches reports whether match constraints cover CREATE and UPDATE
// of the resource.
func policyMatches(m *admissionv1.MatchResources, group, resource string) bool {
	if m == nil {
		return false
	}
	anyOf := func(list []string, want string) bool {
		return slices.Contains(list, want) || slices.Contains(list, "*")
	}
	for _, r := range m.ResourceRules {
		ops := make([]string, 0, len(r.Operations))
		for _, op := range r.Operations {
			ops = append(ops, string(op))
		}
		if anyOf(r.APIGroups, group) && anyOf(r.Resources, resource) &&
			(slices.Contains(ops, "*") || (slices.Contains(ops, "CREATE") && slices.Contains(ops, "UPDATE"))) {
			return true
		}
	}
	return false
}

func (c *Clients) checkBinding(ctx context.Context, ns *corev1.Namespace, name string) Check {
	ch := Check{Name: "admission_binding", Object: "ValidatingAdmissionPolicyBinding " + name}
	b, err := c.Kube.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings().Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return readFailure(ch, err)
	}
	var problems []string
	if b.Spec.PolicyName != name {
		problems = append(problems, fmt.Sprintf("binds policy %q, not %s", b.Spec.PolicyName, name))
	}
	if !slices.Contains(b.Spec.ValidationActions, admissionv1.Deny) {
		problems = append(problems, "its validation actions do not include Deny")
	}
	if ns != nil && !bindingSelects(b.Spec.MatchResources, ns) {
		problems = append(problems, "it does not select namespace "+ns.Name)
	}
	if len(problems) > 0 {
		ch.Problem, ch.Fix = strings.Join(problems, "; "), fixChart
		return ch
	}
	ch.OK = true
	return ch
}

// bindingSelects reports whether a binding's namespace selector selects ns.
// A nil selector selects every namespace.
func bindingSelects(m *admissionv1.MatchResources, ns *corev1.Namespace) bool {
	if m == nil || m.NamespaceSelector == nil {
		return true
	}
	sel, err := metav1.LabelSelectorAsSelector(m.NamespaceSelector)
	if err != nil {
		return false
	}
	return sel.Matches(labels.Set(ns.Labels))
}

func (c *Clients) checkQuota(ctx context.Context, o BoundaryOptions) Check {
	ch := Check{Name: "quota", Object: "ResourceQuota " + o.Namespace + "/" + QuotaName}
	q, err := c.Kube.CoreV1().ResourceQuotas(o.Namespace).Get(ctx, QuotaName, metav1.GetOptions{})
	if err != nil {
		return readFailure(ch, err)
	}
	if _, ok := q.Spec.Hard[quotaResource]; !ok {
		ch.Problem, ch.Fix = "it sets no limit on "+quotaResource, fixChart
		return ch
	}
	ch.OK = true
	return ch
}

func (c *Clients) checkNetworkPolicy(ctx context.Context, o BoundaryOptions) Check {
	ch := Check{Name: "network_policy", Object: "NetworkPolicy " + o.Namespace + "/" + NetworkPolicy}
	np, err := c.Kube.NetworkingV1().NetworkPolicies(o.Namespace).Get(ctx, NetworkPolicy, metav1.GetOptions{})
	if err != nil {
		return readFailure(ch, err)
	}
	if problems := NetworkPolicyProblems(np, o.SessionPort); len(problems) > 0 {
		ch.Problem, ch.Fix = strings.Join(problems, "; "), fixChart
		return ch
	}
	ch.OK = true
	return ch
}

// NetworkPolicyProblems says how a sandbox NetworkPolicy falls short: it must
// select every pod, restrict ingress and egress, allow ingress only from
// selected peers on the session port, allow in-cluster egress only to DNS,
// and keep every denied range out of any wider block it allows.
func NetworkPolicyProblems(np *networkingv1.NetworkPolicy, sessionPort int) []string {
	var problems []string
	if len(np.Spec.PodSelector.MatchLabels) > 0 || len(np.Spec.PodSelector.MatchExpressions) > 0 {
		problems = append(problems, "it does not select every pod")
	}
	if !slices.Contains(np.Spec.PolicyTypes, networkingv1.PolicyTypeIngress) || !slices.Contains(np.Spec.PolicyTypes, networkingv1.PolicyTypeEgress) {
		problems = append(problems, "it does not restrict both ingress and egress")
	}
	for _, r := range np.Spec.Ingress {
		if len(r.From) == 0 || len(r.Ports) == 0 || slices.ContainsFunc(r.From, func(p networkingv1.NetworkPolicyPeer) bool { return p.IPBlock != nil }) {
			problems = append(problems, "an ingress rule admits more than hiloop's pod")
			continue
		}
		for _, p := range r.Ports {
			if p.Port == nil || p.Port.IntValue() != sessionPort || p.EndPort != nil {
				problems = append(problems, fmt.Sprintf("an ingress rule opens more than the session port %d", sessionPort))
				break
			}
		}
	}
	for _, r := range np.Spec.Egress {
		if len(r.To) == 0 {
			problems = append(problems, "an egress rule allows every destination")
			continue
		}
		for _, peer := range r.To {
			if peer.IPBlock == nil {
				if !dnsOnly(r.Ports) {
					problems = append(problems, "an in-cluster egress rule allows more than DNS")
				}
				continue
			}
			if missing := uncovered(peer.IPBlock); len(missing) > 0 {
				problems = append(problems, fmt.Sprintf("egress to %s does not except %s", peer.IPBlock.CIDR, strings.Join(missing, ", ")))
			}
		}
	}
	return slices.Compact(problems)
}

func dnsOnly(ports []networkingv1.NetworkPolicyPort) bool {
	if len(ports) == 0 {
		return false
	}
	for _, p := range ports {
		if p.Port == nil || p.Port.IntValue() != 53 || p.EndPort != nil {
			return false
		}
	}
	return true
}

// uncovered lists the denied ranges that fall inside the block's CIDR and
// that no except entry covers.
func uncovered(b *networkingv1.IPBlock) []string {
	block, err := netip.ParsePrefix(b.CIDR)
	if err != nil {
		return []string{"(unparseable " + b.CIDR + ")"}
	}
	var missing []string
	for _, d := range DeniedCIDRs {
		denied := netip.MustParsePrefix(d)
		if denied.Addr().Is4() != block.Addr().Is4() || !block.Overlaps(denied) {
			continue
		}
		covered := slices.ContainsFunc(b.Except, func(e string) bool {
			ex, err := netip.ParsePrefix(e)
			return err == nil && ex.Bits() <= denied.Bits() && ex.Contains(denied.Addr())
		})
		if !covered {
			missing = append(missing, d)
		}
	}
	return missing
}
