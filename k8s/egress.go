package k8s

import (
	"context"
	"fmt"
	"net/netip"
	"strings"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/hiloop/hiloop/cluster"
)

// clusterAddr is one of the cluster's own addresses a sandbox must not
// reach, and what it is.
type clusterAddr struct {
	addr netip.Addr
	what string
}

// CheckEgress reads the API server's addresses (the kubernetes
// EndpointSlices and the kubernetes Service) and every node's internal and
// external addresses, and fails when the NetworkPolicies of namespace ns,
// evaluated together (their ipBlocks), let a sandbox reach any of them.
// hiloop doctor runs it with the operator's credentials: serve's account
// may not list nodes.
func (c *Clients) CheckEgress(ctx context.Context, ns string) cluster.Check {
	ch := cluster.Check{Name: "egress", Object: "Egress from namespace " + ns + " to the cluster's own addresses"}
	fail := func(what string, err error) cluster.Check {
		ch.Problem, ch.Detail = "cannot read "+what, shortError(err)
		ch.Fix = "run hiloop doctor with credentials that may list " + what
		return ch
	}
	var addrs []clusterAddr
	seen := map[string]bool{}
	add := func(s, what string) {
		a, err := netip.ParseAddr(s)
		if err != nil || seen[a.String()+what] {
			return
		}
		seen[a.String()+what] = true
		addrs = append(addrs, clusterAddr{a.Unmap(), what})
	}
	eps, err := c.Kube.DiscoveryV1().EndpointSlices(metav1.NamespaceDefault).List(ctx,
		metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=kubernetes"})
	if err != nil {
		return fail("EndpointSlices in default", err)
	}
	var api []string
	for _, s := range eps.Items {
		port := ""
		if len(s.Ports) > 0 && s.Ports[0].Port != nil {
			port = fmt.Sprintf(":%d", *s.Ports[0].Port)
		}
		for _, e := range s.Endpoints {
			for _, a := range e.Addresses {
				add(a, "the API server")
				api = append(api, a+port)
			}
		}
	}
	svc, err := c.Kube.CoreV1().Services(metav1.NamespaceDefault).Get(ctx, "kubernetes", metav1.GetOptions{})
	if err != nil {
		return fail("the Service default/kubernetes", err)
	}
	for _, ip := range svc.Spec.ClusterIPs {
		add(ip, "the API server's Service")
	}
	nodes, opts := 0, metav1.ListOptions{Limit: 500}
	for {
		list, err := c.Kube.CoreV1().Nodes().List(ctx, opts)
		if err != nil {
			return fail("nodes", err)
		}
		for _, n := range list.Items {
			nodes++
			for _, a := range n.Status.Addresses {
				if a.Type == corev1.NodeInternalIP || a.Type == corev1.NodeExternalIP {
					add(a.Address, "node "+n.Name)
				}
			}
		}
		if opts.Continue = list.Continue; opts.Continue == "" {
			break
		}
	}
	list, err := c.Kube.NetworkingV1().NetworkPolicies(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return fail("NetworkPolicies in "+ns, err)
	}
	nps := make([]*networkingv1.NetworkPolicy, len(list.Items))
	for i := range list.Items {
		nps[i] = &list.Items[i]
	}
	var reached []string
	for _, a := range addrs {
		ok, by := egressReaches(nps, a.addr)
		switch {
		case !ok:
			continue
		case by == "":
			reached = append(reached, fmt.Sprintf("%s at %s (no NetworkPolicy restricts egress)", a.what, a.addr))
		default:
			reached = append(reached, fmt.Sprintf("%s at %s (NetworkPolicy %s allows it)", a.what, a.addr, by))
		}
	}
	if len(api) == 0 {
		api = []string{"(no endpoints)"}
	}
	ch.Object = fmt.Sprintf("Egress from namespace %s to the API server (%s) and %d node(s)", ns, strings.Join(api, ", "), nodes)
	if len(reached) > 0 {
		if len(reached) > 5 {
			reached = append(reached[:5], fmt.Sprintf("and %d more", len(reached)-5))
		}
		ch.Problem = "sandboxes can reach " + strings.Join(reached, "; ")
		ch.Fix = "add these addresses to the chart's networkPolicy.cluster values (apiServer, serviceCIDRs, nodeCIDRs) and upgrade it (docs/install.md, Egress)"
		return ch
	}
	ch.OK = true
	return ch
}
