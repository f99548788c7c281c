package boundary

import (
	"net/netip"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"
)

// chartPolicy is the chart's sandbox NetworkPolicy at the default values,
// moved to namespace ns as the self-check sees it.
func chartPolicy(ns string) *networkingv1.NetworkPolicy {
	np := Chart().NetworkPolicy.DeepCopy()
	np.Namespace = ns
	return np
}

func policy(t *testing.T, name, spec string) *networkingv1.NetworkPolicy {
	t.Helper()
	np := &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "sbx"}}
	if err := yaml.UnmarshalStrict([]byte(spec), &np.Spec); err != nil {
		t.Fatal(err)
	}
	return np
}

// TestPolicyExcess plays someone who may edit the sandbox namespace's
// NetworkPolicies: every way to open it more than the chart's policy is
// named, with the policy; policies that open nothing more pass.
func TestPolicyExcess(t *testing.T) {
	chart := chartPolicy("sbx")
	if p := policyExcess([]*networkingv1.NetworkPolicy{chart}, chart, "sbx"); len(p) > 0 {
		t.Fatalf("the chart's policy alone: %v", p)
	}
	for _, tc := range []struct {
		name, spec string
		want       string // "" when the policy opens nothing more
	}{
		{"allow all", `{podSelector: {}, policyTypes: [Ingress, Egress], ingress: [{}], egress: [{}]}`,
			"NetworkPolicy extra allows more than the chart's: ingress from any address on any port; egress to any address on any port"},
		{"allow all egress, types left to the API", `{podSelector: {}, egress: [{}]}`, "egress to any address on any port"},
		{"a selector that matches no sandbox today", `{podSelector: {matchLabels: {x: y}}, policyTypes: [Egress], egress: [{}]}`, "egress to any address"},
		{"egress rules of a policy that restricts only ingress", `{podSelector: {}, policyTypes: [Ingress], egress: [{}]}`, ""},
		{"deny all", `{podSelector: {}, policyTypes: [Ingress, Egress]}`, ""},
		{"DNS to every namespace", `{podSelector: {}, policyTypes: [Egress], egress: [{to: [{namespaceSelector: {}}], ports: [{protocol: UDP, port: 53}]}]}`,
			"egress to pods (all) in namespaces (all) on UDP 53"},
		{"DNS to kube-system's every pod", `{podSelector: {}, policyTypes: [Egress], egress: [{to: [{namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: kube-system}}}], ports: [{protocol: UDP, port: 53}]}]}`,
			"egress to pods (all) in namespaces {kubernetes.io/metadata.name=kube-system}"},
		{"DNS pods by a label any namespace may carry", `{podSelector: {}, policyTypes: [Egress], egress: [{to: [{namespaceSelector: {matchLabels: {team: dns}}, podSelector: {matchLabels: {k8s-app: kube-dns}}}], ports: [{protocol: UDP, port: 53}]}]}`,
			"namespaces {team=dns}"},
		{"DNS, narrower than the chart's", `{podSelector: {}, policyTypes: [Egress], egress: [{to: [{namespaceSelector: {matchExpressions: [{key: kubernetes.io/metadata.name, operator: In, values: [kube-system]}]}, podSelector: {matchLabels: {k8s-app: kube-dns, extra: x}}}], ports: [{protocol: TCP, port: 53, endPort: 53}]}]}`, ""},
		{"DNS namespaces by NotIn", `{podSelector: {}, policyTypes: [Egress], egress: [{to: [{namespaceSelector: {matchExpressions: [{key: kubernetes.io/metadata.name, operator: NotIn, values: [default]}]}, podSelector: {matchLabels: {k8s-app: kube-dns}}}], ports: [{protocol: UDP, port: 53}]}]}`,
			"kubernetes.io/metadata.name notin (default)"},
		{"DNS on every UDP port", `{podSelector: {}, policyTypes: [Egress], egress: [{to: [{namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: kube-system}}, podSelector: {matchLabels: {k8s-app: kube-dns}}}], ports: [{protocol: UDP}]}]}`,
			"on any UDP port"},
		{"DNS on a port range", `{podSelector: {}, policyTypes: [Egress], egress: [{to: [{namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: kube-system}}, podSelector: {matchLabels: {k8s-app: kube-dns}}}], ports: [{protocol: UDP, port: 53, endPort: 54}]}]}`,
			"on UDP 53-54"},
		{"DNS by a named port", `{podSelector: {}, policyTypes: [Egress], egress: [{to: [{namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: kube-system}}, podSelector: {matchLabels: {k8s-app: kube-dns}}}], ports: [{protocol: UDP, port: dns}]}]}`,
			"UDP port named dns"},
		{"DNS pods in this namespace", `{podSelector: {}, policyTypes: [Egress], egress: [{to: [{podSelector: {matchLabels: {k8s-app: kube-dns}}}], ports: [{protocol: UDP, port: 53}]}]}`,
			"in namespace sbx"},
		{"a narrower except", `{podSelector: {}, policyTypes: [Egress], egress: [{to: [{ipBlock: {cidr: 0.0.0.0/0, except: [10.0.0.0/9, 172.16.0.0/12, 192.168.0.0/16, 100.64.0.0/10, 169.254.0.0/16, 127.0.0.0/8, 0.0.0.0/8, 198.18.0.0/15, 240.0.0.0/4, 168.63.129.16/32]}}]}]}`,
			"it reaches 10.128.0.0/9"},
		{"the same except split in two", `{podSelector: {}, policyTypes: [Egress], egress: [{to: [{ipBlock: {cidr: 0.0.0.0/0, except: [10.0.0.0/9, 10.128.0.0/9, 172.16.0.0/12, 192.168.0.0/16, 100.64.0.0/10, 169.254.0.0/16, 127.0.0.0/8, 0.0.0.0/8, 198.18.0.0/15, 240.0.0.0/4, 168.63.129.16/32]}}]}]}`, ""},
		{"the metadata service", `{podSelector: {}, policyTypes: [Egress], egress: [{to: [{ipBlock: {cidr: 169.254.169.254/32}}], ports: [{port: 80}]}]}`,
			"it reaches 169.254.169.254/32"},
		{"WireServer", `{podSelector: {}, policyTypes: [Egress], egress: [{to: [{ipBlock: {cidr: 168.63.128.0/23}}]}]}`, "it reaches 168.63.129.16/32"},
		{"a public block", `{podSelector: {}, policyTypes: [Egress], egress: [{to: [{ipBlock: {cidr: 203.0.113.0/24}}], ports: [{port: 443}]}]}`, ""},
		{"a host address within a public block", `{podSelector: {}, policyTypes: [Egress], egress: [{to: [{ipBlock: {cidr: 203.0.113.9/24}}]}]}`, ""},
		{"IPv6 unique-local", `{podSelector: {}, policyTypes: [Egress], egress: [{to: [{ipBlock: {cidr: "fd00::/8"}}]}]}`, "it reaches fd00::/8"},
		{"NAT64 to a private address", `{podSelector: {}, policyTypes: [Egress], egress: [{to: [{ipBlock: {cidr: "64:ff9b::a00:0/104"}}]}]}`, "it reaches 64:ff9b::a00:0/104"},
		{"IPv4-mapped private addresses", `{podSelector: {}, policyTypes: [Egress], egress: [{to: [{ipBlock: {cidr: "::ffff:10.0.0.0/104"}}]}]}`, "it reaches ::ffff:10.0.0.0/104"},
		{"public IPv6", `{podSelector: {}, policyTypes: [Egress], egress: [{to: [{ipBlock: {cidr: "2001:db8::/32"}}]}]}`, ""},
		{"an unparseable block", `{podSelector: {}, policyTypes: [Egress], egress: [{to: [{ipBlock: {cidr: "not-a-cidr"}}]}]}`, "unparseable"},
		{"ingress from anywhere on the session port", `{podSelector: {}, policyTypes: [Ingress], ingress: [{ports: [{port: 2223}]}]}`,
			"ingress from any address on TCP 2223"},
		{"ingress from an ipBlock", `{podSelector: {}, policyTypes: [Ingress], ingress: [{from: [{ipBlock: {cidr: 10.0.0.5/32}}], ports: [{port: 2223}]}]}`,
			"ingress from ipBlock 10.0.0.5/32"},
		{"ingress from every pod of hiloop's namespace", `{podSelector: {}, policyTypes: [Ingress], ingress: [{from: [{namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: hiloop-system}}}], ports: [{port: 2223}]}]}`,
			"ingress from pods (all) in namespaces {kubernetes.io/metadata.name=hiloop-system}"},
		{"ingress from hiloop's pod in any namespace", `{podSelector: {}, policyTypes: [Ingress], ingress: [{from: [{namespaceSelector: {}, podSelector: {matchLabels: {app.kubernetes.io/name: hiloop, app.kubernetes.io/component: control-plane}}}], ports: [{port: 2223}]}]}`,
			"in namespaces (all)"},
		{"ingress from hiloop's pod on another port", `{podSelector: {}, policyTypes: [Ingress], ingress: [{from: [{namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: hiloop-system}}, podSelector: {matchLabels: {app.kubernetes.io/name: hiloop, app.kubernetes.io/component: control-plane}}}], ports: [{port: 22}]}]}`,
			"on TCP 22"},
		{"ingress from hiloop's pod by UDP", `{podSelector: {}, policyTypes: [Ingress], ingress: [{from: [{namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: hiloop-system}}, podSelector: {matchLabels: {app.kubernetes.io/name: hiloop, app.kubernetes.io/component: control-plane}}}], ports: [{protocol: UDP, port: 2223}]}]}`,
			"on UDP 2223"},
		{"ingress from hiloop's pod, as the chart", `{podSelector: {matchLabels: {a: b}}, ingress: [{from: [{namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: hiloop-system}}, podSelector: {matchLabels: {app.kubernetes.io/name: hiloop, app.kubernetes.io/component: control-plane}}}], ports: [{port: 2223}]}]}`, ""},
		{"a contradictory selector matches nothing", `{podSelector: {}, policyTypes: [Ingress], ingress: [{from: [{namespaceSelector: {matchExpressions: [{key: a, operator: Exists}, {key: a, operator: DoesNotExist}]}}]}]}`, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := strings.Join(policyExcess([]*networkingv1.NetworkPolicy{chart, policy(t, "extra", tc.spec)}, chart, "sbx"), "; ")
			switch {
			case tc.want == "" && p != "":
				t.Errorf("problems %q, want none", p)
			case tc.want != "" && (!strings.Contains(p, tc.want) || !strings.Contains(p, "NetworkPolicy extra")):
				t.Errorf("problems %q, want one naming extra and %q", p, tc.want)
			}
		})
	}
}

// TestPolicyIsolation: without a policy that selects every pod, a
// direction is open; the chart's policy edited to select some pods, or to
// restrict only ingress, is named.
func TestPolicyIsolation(t *testing.T) {
	chart := chartPolicy("sbx")
	if p := strings.Join(policyExcess(nil, chart, "sbx"), "; "); !strings.Contains(p, "restricts ingress") || !strings.Contains(p, "restricts egress") {
		t.Errorf("no policies: %q", p)
	}
	some := chart.DeepCopy()
	some.Spec.PodSelector = metav1.LabelSelector{MatchLabels: map[string]string{"hiloop.dev/org": "org_a"}}
	if p := strings.Join(policyExcess([]*networkingv1.NetworkPolicy{some}, chart, "sbx"), "; "); !strings.Contains(p, "restricts ingress") {
		t.Errorf("selecting some pods: %q", p)
	}
	ingressOnly := chart.DeepCopy()
	ingressOnly.Spec.PolicyTypes = []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}
	if p := strings.Join(policyExcess([]*networkingv1.NetworkPolicy{ingressOnly}, chart, "sbx"), "; "); !strings.Contains(p, "restricts egress") || strings.Contains(p, "restricts ingress") {
		t.Errorf("ingress only: %q", p)
	}
}

func TestSelectorImplies(t *testing.T) {
	sel := func(s string) *metav1.LabelSelector {
		var l metav1.LabelSelector
		if err := yaml.UnmarshalStrict([]byte(s), &l); err != nil {
			t.Fatal(err)
		}
		return &l
	}
	for _, tc := range []struct {
		a, b string
		want bool
	}{
		{`{}`, `{}`, true},
		{`{matchLabels: {a: "1"}}`, `{}`, true},
		{`{}`, `{matchLabels: {a: "1"}}`, false},
		{`{matchLabels: {a: "1", b: "2"}}`, `{matchLabels: {a: "1"}}`, true},
		{`{matchExpressions: [{key: a, operator: In, values: ["1"]}]}`, `{matchLabels: {a: "1"}}`, true},
		{`{matchExpressions: [{key: a, operator: In, values: ["1", "2"]}]}`, `{matchLabels: {a: "1"}}`, false},
		{`{matchExpressions: [{key: a, operator: In, values: ["1", "2"]}, {key: a, operator: NotIn, values: ["2"]}]}`, `{matchLabels: {a: "1"}}`, true},
		{`{matchExpressions: [{key: a, operator: Exists}]}`, `{matchLabels: {a: "1"}}`, false},
		{`{matchLabels: {a: "1"}}`, `{matchExpressions: [{key: a, operator: Exists}]}`, true},
		{`{matchLabels: {a: "1"}}`, `{matchExpressions: [{key: a, operator: NotIn, values: ["2"]}]}`, true},
		{`{matchExpressions: [{key: a, operator: DoesNotExist}]}`, `{matchExpressions: [{key: a, operator: NotIn, values: ["2"]}]}`, true},
		{`{matchExpressions: [{key: a, operator: NotIn, values: ["2", "3"]}]}`, `{matchExpressions: [{key: a, operator: NotIn, values: ["2"]}]}`, true},
		{`{matchExpressions: [{key: a, operator: NotIn, values: ["3"]}]}`, `{matchExpressions: [{key: a, operator: NotIn, values: ["2"]}]}`, false},
		{`{matchExpressions: [{key: a, operator: Exists}]}`, `{matchExpressions: [{key: a, operator: DoesNotExist}]}`, false},
		{`{matchExpressions: [{key: a, operator: Bogus}]}`, `{}`, false},
	} {
		if got := selectorImplies(sel(tc.a), sel(tc.b)); got != tc.want {
			t.Errorf("%s implies %s: %v, want %v", tc.a, tc.b, got, tc.want)
		}
	}
}

// TestCoveredBounded: a block with thousands of excepts is evaluated
// without blowing up, and one gap among them is found.
func TestCoveredBounded(t *testing.T) {
	var ex []netip.Prefix
	for i := range 4096 {
		if i == 1234 {
			continue
		}
		ex = append(ex, netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(i >> 4), byte(i << 4), 0}), 20))
	}
	ok, w := covered(netip.MustParsePrefix("10.0.0.0/8"), ex)
	if ok || w != "10.77.32.0/20" {
		t.Errorf("covered: %v %q", ok, w)
	}
}

func TestEgressReaches(t *testing.T) {
	chart := chartPolicy("sbx")
	for _, tc := range []struct {
		nps  []*networkingv1.NetworkPolicy
		addr string
		want bool
	}{
		{[]*networkingv1.NetworkPolicy{chart}, "10.0.0.1", false},
		{[]*networkingv1.NetworkPolicy{chart}, "127.0.0.1", false},
		{[]*networkingv1.NetworkPolicy{chart}, "203.0.113.5", true},
		{[]*networkingv1.NetworkPolicy{chart}, "168.63.129.16", false},
		{[]*networkingv1.NetworkPolicy{chart}, "64:ff9b::a00:1", false},
		{[]*networkingv1.NetworkPolicy{chart}, "2001:db8::1", true},
		{nil, "10.0.0.1", true},
		{[]*networkingv1.NetworkPolicy{chart, policy(t, "x", `{podSelector: {}, policyTypes: [Egress], egress: [{to: [{ipBlock: {cidr: 10.0.0.0/24}}], ports: [{port: 6443}]}]}`)}, "10.0.0.1", true},
	} {
		if got, _ := egressReaches(tc.nps, netip.MustParseAddr(tc.addr)); got != tc.want {
			t.Errorf("%d policies reach %s: %v, want %v", len(tc.nps), tc.addr, got, tc.want)
		}
	}
}

func TestPortSubset(t *testing.T) {
	udp := corev1.ProtocolUDP
	p := func(proto *corev1.Protocol, port *intstr.IntOrString, end *int32) *networkingv1.NetworkPolicyPort {
		return &networkingv1.NetworkPolicyPort{Protocol: proto, Port: port, EndPort: end}
	}
	n53, n54, named := intstr.FromInt32(53), intstr.FromInt32(54), intstr.FromString("dns")
	for _, tc := range []struct {
		p, a *networkingv1.NetworkPolicyPort
		want bool
	}{
		{p(nil, &n53, nil), nil, true},
		{nil, p(nil, &n53, nil), false},
		{p(nil, &n53, nil), p(nil, &n53, nil), true},
		{p(&udp, &n53, nil), p(nil, &n53, nil), false},
		{p(nil, &n53, ptr.To[int32](60)), p(nil, &n53, nil), false},
		{p(nil, &n54, nil), p(nil, &n53, ptr.To[int32](60)), true},
		{p(nil, &named, nil), p(nil, &n53, nil), false},
		{p(nil, &named, nil), p(nil, &named, nil), true},
		{p(nil, nil, nil), p(nil, &n53, nil), false},
		{p(nil, &n53, nil), p(nil, nil, nil), true},
	} {
		if got := portSubset(tc.p, tc.a); got != tc.want {
			t.Errorf("%s within %s: %v, want %v", describePort(tc.p), describePort(tc.a), got, tc.want)
		}
	}
}
