package boundary

import (
	"fmt"
	"net/netip"
	"slices"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/apimachinery/pkg/util/sets"
)

// NetworkPolicies add up: a pod selected by several is allowed the union of
// their rules in each direction its policies isolate. The self-check
// evaluates that union, for every NetworkPolicy in the sandbox namespace
// whatever its pod selector (a selector that matches no sandbox today can
// match one tomorrow), against the chart's policy: each peer and port any
// of them allows must be one the chart's allows too.
//
// Each allowed (peer, port) is compared with the chart's one by one, so a
// grant that only a union of the chart's covers is reported as wider: the
// check may refuse a policy that is in fact no wider, never the reverse.

// direction is ingress or egress.
type direction string

const (
	ingress direction = "ingress"
	egress  direction = "egress"
)

// grant is one peer and one port a policy allows in a direction; nil means
// any peer or any port.
type grant struct {
	peer *networkingv1.NetworkPolicyPeer
	port *networkingv1.NetworkPolicyPort
}

// applies reports whether np's rules of dir take effect: its policyTypes
// name dir, or, when it names none, dir is ingress or np has egress rules.
func applies(np *networkingv1.NetworkPolicy, dir direction) bool {
	if len(np.Spec.PolicyTypes) == 0 {
		return dir == ingress || len(np.Spec.Egress) > 0
	}
	want := networkingv1.PolicyTypeIngress
	if dir == egress {
		want = networkingv1.PolicyTypeEgress
	}
	return slices.Contains(np.Spec.PolicyTypes, want)
}

// grants lists what np allows in dir, none when its rules of dir do not
// apply. A rule with no peers allows every peer; one with no ports, every
// port.
func grants(np *networkingv1.NetworkPolicy, dir direction) []grant {
	if !applies(np, dir) {
		return nil
	}
	var out []grant
	add := func(peers []networkingv1.NetworkPolicyPeer, ports []networkingv1.NetworkPolicyPort) {
		ps := []*networkingv1.NetworkPolicyPeer{nil}
		if len(peers) > 0 {
			ps = ps[:0]
			for i := range peers {
				ps = append(ps, &peers[i])
			}
		}
		qs := []*networkingv1.NetworkPolicyPort{nil}
		if len(ports) > 0 {
			qs = qs[:0]
			for i := range ports {
				qs = append(qs, &ports[i])
			}
		}
		for _, p := range ps {
			for _, q := range qs {
				out = append(out, grant{p, q})
			}
		}
	}
	if dir == ingress {
		for _, r := range np.Spec.Ingress {
			add(r.From, r.Ports)
		}
	} else {
		for _, r := range np.Spec.Egress {
			add(r.To, r.Ports)
		}
	}
	return out
}

// selectsAll reports whether np's pod selector selects every pod.
func selectsAll(np *networkingv1.NetworkPolicy) bool {
	return len(np.Spec.PodSelector.MatchLabels) == 0 && len(np.Spec.PodSelector.MatchExpressions) == 0
}

// policyExcess lists, for each NetworkPolicy in nps (all in namespace ns),
// what it allows beyond chart, and whether some policy that selects every
// pod isolates each direction. chart lives in ns too.
func policyExcess(nps []*networkingv1.NetworkPolicy, chart *networkingv1.NetworkPolicy, ns string) []string {
	var problems []string
	for _, dir := range []direction{ingress, egress} {
		if !slices.ContainsFunc(nps, func(np *networkingv1.NetworkPolicy) bool { return selectsAll(np) && applies(np, dir) }) {
			problems = append(problems, fmt.Sprintf("no NetworkPolicy that selects every pod restricts %s, so sandboxes take or make any connection", dir))
		}
	}
	sorted := slices.Clone(nps)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i].Name < sorted[j].Name })
	for _, np := range sorted {
		var wider []string
		for _, dir := range []direction{ingress, egress} {
			allowed := grants(chart, dir)
			for _, g := range grants(np, dir) {
				if ok, why := grantCovered(g, allowed, ns, dir); !ok {
					wider = append(wider, why)
				}
			}
		}
		if len(wider) == 0 {
			continue
		}
		wider = slices.Compact(wider)
		if len(wider) > 3 {
			wider = append(wider[:3], fmt.Sprintf("and %d more", len(wider)-3))
		}
		problems = append(problems, fmt.Sprintf("NetworkPolicy %s allows more than the chart's: %s", np.Name, strings.Join(wider, "; ")))
	}
	return problems
}

// grantCovered reports whether one of allowed covers g, and if not, says
// what g allows beyond them.
func grantCovered(g grant, allowed []grant, ns string, dir direction) (bool, string) {
	if p := g.peer; p != nil && p.IPBlock == nil && (matchesNothing(namespaceSelector(p, ns)) || matchesNothing(orEmpty(p.PodSelector))) {
		return true, "" // a peer no pod can match allows nothing
	}
	witness := ""
	for _, a := range allowed {
		if !portSubset(g.port, a.port) {
			continue
		}
		ok, w := peerSubset(g.peer, a.peer, ns)
		if ok {
			return true, ""
		}
		if witness == "" {
			witness = w
		}
	}
	what := "ingress from "
	if dir == egress {
		what = "egress to "
	}
	what += describePeer(g.peer, ns)
	if witness != "" {
		what += " (it reaches " + witness + ")"
	}
	return false, what + " on " + describePort(g.port)
}

// peerSubset reports whether every endpoint p selects, a selects too; ns is
// the namespace both policies live in. For an ipBlock within a block of a,
// it names a range p reaches that a excepts.
func peerSubset(p, a *networkingv1.NetworkPolicyPeer, ns string) (bool, string) {
	switch {
	case a == nil:
		return true, ""
	case p == nil:
		return false, ""
	case p.IPBlock != nil:
		if a.IPBlock == nil {
			return false, ""
		}
		return blockSubset(p.IPBlock, a.IPBlock)
	case a.IPBlock != nil:
		// Pods' addresses are not known here: a pod peer is covered
		// only by a pod peer.
		return false, ""
	}
	return selectorImplies(namespaceSelector(p, ns), namespaceSelector(a, ns)) && selectorImplies(orEmpty(p.PodSelector), orEmpty(a.PodSelector)), ""
}

// matchesNothing reports whether a selector contradicts itself.
func matchesNothing(s *metav1.LabelSelector) bool {
	_, empty, ok := constraints(s)
	return ok && empty
}

// namespaceSelector is the namespaces a pod peer selects: its namespace
// selector, or, without one, the policy's own namespace.
func namespaceSelector(p *networkingv1.NetworkPolicyPeer, ns string) *metav1.LabelSelector {
	if p.NamespaceSelector != nil {
		return p.NamespaceSelector
	}
	return &metav1.LabelSelector{MatchLabels: map[string]string{corev1.LabelMetadataName: ns}}
}

func orEmpty(s *metav1.LabelSelector) *metav1.LabelSelector {
	if s == nil {
		return &metav1.LabelSelector{}
	}
	return s
}

// keyConstraint is what a selector says of one label key.
type keyConstraint struct {
	values    sets.Set[string] // the key must have one of these; nil: any
	excluded  sets.Set[string] // the key must not have these
	exists    bool             // the key must be there
	notExists bool             // the key must not be there
}

// constraints folds a selector's requirements per key. ok is false for a
// selector that cannot be parsed (the API server would refuse it), which
// then implies nothing; empty is true when it matches no object at all.
func constraints(s *metav1.LabelSelector) (m map[string]*keyConstraint, empty, ok bool) {
	sel, err := metav1.LabelSelectorAsSelector(s)
	if err != nil {
		return nil, false, false
	}
	reqs, _ := sel.Requirements()
	m = map[string]*keyConstraint{}
	for _, r := range reqs {
		c := m[r.Key()]
		if c == nil {
			c = &keyConstraint{excluded: sets.New[string]()}
			m[r.Key()] = c
		}
		vals := sets.New(r.Values().UnsortedList()...)
		switch r.Operator() {
		case selection.In, selection.Equals, selection.DoubleEquals:
			c.exists = true
			if c.values == nil {
				c.values = vals
			} else {
				c.values = c.values.Intersection(vals)
			}
		case selection.NotIn, selection.NotEquals:
			c.excluded = c.excluded.Union(vals)
		case selection.Exists:
			c.exists = true
		case selection.DoesNotExist:
			c.notExists = true
		default:
			return nil, false, false
		}
	}
	for _, c := range m {
		if c.values != nil {
			c.values = c.values.Difference(c.excluded)
		}
		if (c.exists && c.notExists) || (c.values != nil && c.values.Len() == 0) {
			return m, true, true
		}
	}
	return m, false, true
}

// selectorImplies reports whether every label set a matches, b matches.
func selectorImplies(a, b *metav1.LabelSelector) bool {
	ac, empty, ok := constraints(a)
	if !ok {
		return false
	}
	if empty {
		return true
	}
	bc, _, ok := constraints(b)
	if !ok {
		return false
	}
	for key, want := range bc {
		have := ac[key]
		if have == nil {
			have = &keyConstraint{excluded: sets.New[string]()}
		}
		if want.notExists && !have.notExists {
			return false
		}
		if want.exists && !have.exists {
			return false
		}
		if want.values != nil && (have.values == nil || !want.values.IsSuperset(have.values)) {
			return false
		}
		if want.excluded.Len() > 0 && !have.notExists && !have.excluded.IsSuperset(want.excluded) &&
			(have.values == nil || have.values.HasAny(want.excluded.UnsortedList()...)) {
			return false
		}
	}
	return true
}

// portSubset reports whether every port p allows, a allows too.
func portSubset(p, a *networkingv1.NetworkPolicyPort) bool {
	if a == nil {
		return true
	}
	if p == nil || protocol(p) != protocol(a) {
		return false
	}
	if a.Port == nil {
		return true
	}
	if p.Port == nil {
		return false
	}
	if a.Port.Type != p.Port.Type {
		return false
	}
	if a.Port.StrVal != "" || p.Port.StrVal != "" {
		return a.Port.StrVal == p.Port.StrVal && a.EndPort == nil && p.EndPort == nil
	}
	lo, hi := portRange(p)
	alo, ahi := portRange(a)
	return alo <= lo && hi <= ahi
}

func protocol(p *networkingv1.NetworkPolicyPort) corev1.Protocol {
	if p.Protocol == nil {
		return corev1.ProtocolTCP
	}
	return *p.Protocol
}

func portRange(p *networkingv1.NetworkPolicyPort) (int32, int32) {
	lo := p.Port.IntVal
	if p.EndPort != nil && *p.EndPort > lo {
		return lo, *p.EndPort
	}
	return lo, lo
}

// blockSubset reports whether every address c allows, a allows too, and if
// not, names the first range c reaches that a does not.
func blockSubset(c, a *networkingv1.IPBlock) (bool, string) {
	cp, err := netip.ParsePrefix(c.CIDR)
	if err != nil {
		return false, "an unparseable block " + c.CIDR
	}
	cp = cp.Masked()
	if cp.Addr().Is4In6() {
		// The API server refuses IPv4-mapped blocks; one that got through
		// could reach any IPv4 address.
		return false, cp.String()
	}
	ap, err := netip.ParsePrefix(a.CIDR)
	if err != nil {
		return false, ""
	}
	ap = ap.Masked()
	if ap.Addr().Is4() != cp.Addr().Is4() || ap.Bits() > cp.Bits() || !ap.Contains(cp.Addr()) {
		return false, cp.String()
	}
	cex := prefixes(c.Except)
	for _, e := range prefixes(a.Except) {
		if !e.Overlaps(cp) {
			continue
		}
		r := e
		if cp.Bits() > e.Bits() {
			r = cp
		}
		if ok, w := covered(r, cex); !ok {
			return false, w
		}
	}
	return true, ""
}

// prefixes parses CIDRs, leaving out those that do not parse (which except
// nothing).
func prefixes(cidrs []string) []netip.Prefix {
	out := make([]netip.Prefix, 0, len(cidrs))
	for _, s := range cidrs {
		if p, err := netip.ParsePrefix(s); err == nil {
			out = append(out, p.Masked())
		}
	}
	return out
}

// covered reports whether the union of ex covers r, and if not, names the
// first part of r it leaves out. Only the prefixes that overlap r are
// carried down, so the work is bounded by the prefixes' count times the
// address length.
func covered(r netip.Prefix, ex []netip.Prefix) (bool, string) {
	var inside []netip.Prefix
	for _, e := range ex {
		switch {
		case e.Bits() <= r.Bits() && e.Contains(r.Addr()):
			return true, ""
		case e.Bits() > r.Bits() && r.Contains(e.Addr()):
			inside = append(inside, e)
		}
	}
	if len(inside) == 0 {
		return false, r.String()
	}
	lo, hi := halves(r)
	if ok, w := covered(lo, inside); !ok {
		return false, w
	}
	return covered(hi, inside)
}

// halves splits a prefix into its two halves.
func halves(p netip.Prefix) (netip.Prefix, netip.Prefix) {
	bits := p.Bits()
	lo := netip.PrefixFrom(p.Addr(), bits+1)
	b := p.Addr().AsSlice()
	b[bits/8] |= 0x80 >> (bits % 8)
	a, _ := netip.AddrFromSlice(b)
	return lo, netip.PrefixFrom(a, bits+1)
}

// blockReaches reports whether b allows addr: within its CIDR and in none
// of its excepts.
func blockReaches(b *networkingv1.IPBlock, addr netip.Addr) bool {
	p, err := netip.ParsePrefix(b.CIDR)
	if err != nil || !p.Masked().Contains(addr) {
		return false
	}
	for _, e := range prefixes(b.Except) {
		if e.Contains(addr) {
			return false
		}
	}
	return true
}

// egressReaches says whether any of nps lets a sandbox open a connection
// to addr, and which policy does ("" when no policy restricts egress at
// all). Pod peers are left out: they select pods, not addresses.
func egressReaches(nps []*networkingv1.NetworkPolicy, addr netip.Addr) (bool, string) {
	if !slices.ContainsFunc(nps, func(np *networkingv1.NetworkPolicy) bool { return selectsAll(np) && applies(np, egress) }) {
		return true, ""
	}
	for _, np := range nps {
		for _, g := range grants(np, egress) {
			if g.peer == nil || (g.peer.IPBlock != nil && blockReaches(g.peer.IPBlock, addr)) {
				return true, np.Name
			}
		}
	}
	return false, ""
}

func describePeer(p *networkingv1.NetworkPolicyPeer, ns string) string {
	switch {
	case p == nil:
		return "any address"
	case p.IPBlock != nil:
		s := "ipBlock " + p.IPBlock.CIDR
		if len(p.IPBlock.Except) > 0 {
			s += " except " + strings.Join(p.IPBlock.Except, ",")
		}
		return s
	}
	nsDesc := "namespace " + ns
	if p.NamespaceSelector != nil {
		nsDesc = "namespaces " + describeSelector(p.NamespaceSelector)
	}
	return "pods " + describeSelector(orEmpty(p.PodSelector)) + " in " + nsDesc
}

func describeSelector(s *metav1.LabelSelector) string {
	sel, err := metav1.LabelSelectorAsSelector(s)
	if err != nil {
		return "(invalid selector)"
	}
	if sel.Empty() {
		return "(all)"
	}
	return "{" + sel.String() + "}"
}

func describePort(p *networkingv1.NetworkPolicyPort) string {
	switch {
	case p == nil:
		return "any port"
	case p.Port == nil:
		return "any " + string(protocol(p)) + " port"
	case p.Port.StrVal != "":
		return string(protocol(p)) + " port named " + p.Port.StrVal
	case p.EndPort != nil:
		return fmt.Sprintf("%s %d-%d", protocol(p), p.Port.IntVal, *p.EndPort)
	}
	return fmt.Sprintf("%s %d", protocol(p), p.Port.IntVal)
}
