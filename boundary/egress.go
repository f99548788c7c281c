package boundary

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strings"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/hiloop/hiloop/cluster"
	"github.com/hiloop/hiloop/k8s"
)

// clusterAddr is one of the cluster's own addresses a sandbox must not
// reach, and what it is.
type clusterAddr struct {
	addr netip.Addr
	what string
}

// clusterAddrs gathers the cluster's own addresses, each once per what.
type clusterAddrs struct {
	list []clusterAddr
	seen map[string]bool
}

func (c *clusterAddrs) add(s, what string) {
	a, err := netip.ParseAddr(s)
	if err != nil || c.seen[a.String()+what] {
		return
	}
	if c.seen == nil {
		c.seen = map[string]bool{}
	}
	c.seen[a.String()+what] = true
	c.list = append(c.list, clusterAddr{a.Unmap(), what})
}

// readFailed is a reason CheckEgress could not read what it needs.
type readFailed struct {
	what string
	err  error
}

func (e *readFailed) Error() string { return "cannot read " + e.what + ": " + e.err.Error() }

// CheckEgress reads the API server's addresses (the kubernetes
// EndpointSlices and the kubernetes Service) and every node's internal and
// external addresses, and fails when the NetworkPolicies of namespace ns,
// evaluated together (their ipBlocks), let a sandbox reach any of them.
// hiloop doctor runs it with the operator's credentials: serve's account
// may not list nodes.
func CheckEgress(ctx context.Context, c *k8s.Clients, ns string) cluster.Check {
	ch := cluster.Check{Name: "egress", Object: "Egress from namespace " + ns + " to the cluster's own addresses"}
	var addrs clusterAddrs
	api, err := apiServerAddrs(ctx, c, &addrs)
	nodes := 0
	if err == nil {
		nodes, err = nodeAddrs(ctx, c, &addrs)
	}
	var nps []*networkingv1.NetworkPolicy
	if err == nil {
		nps, err = networkPolicies(ctx, c, ns)
	}
	var rf *readFailed
	if errors.As(err, &rf) {
		ch.Problem, ch.Detail = "cannot read "+rf.what, k8s.ShortError(rf.err)
		ch.Fix = "run hiloop doctor with credentials that may list " + rf.what
		return ch
	}
	var reached []string
	for _, a := range addrs.list {
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

// apiServerAddrs adds the API server's addresses, from the kubernetes
// EndpointSlices and Service, and returns its endpoints as host:port.
func apiServerAddrs(ctx context.Context, c *k8s.Clients, addrs *clusterAddrs) ([]string, error) {
	eps, err := c.Kube.DiscoveryV1().EndpointSlices(metav1.NamespaceDefault).List(ctx,
		metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=kubernetes"})
	if err != nil {
		return nil, &readFailed{"EndpointSlices in default", err}
	}
	var api []string
	for _, s := range eps.Items {
		port := ""
		if len(s.Ports) > 0 && s.Ports[0].Port != nil {
			port = fmt.Sprintf(":%d", *s.Ports[0].Port)
		}
		for _, e := range s.Endpoints {
			for _, a := range e.Addresses {
				addrs.add(a, "the API server")
				api = append(api, a+port)
			}
		}
	}
	svc, err := c.Kube.CoreV1().Services(metav1.NamespaceDefault).Get(ctx, "kubernetes", metav1.GetOptions{})
	if err != nil {
		return nil, &readFailed{"the Service default/kubernetes", err}
	}
	for _, ip := range svc.Spec.ClusterIPs {
		addrs.add(ip, "the API server's Service")
	}
	return api, nil
}

// nodeAddrs adds every node's internal and external addresses, and
// returns how many nodes there are.
func nodeAddrs(ctx context.Context, c *k8s.Clients, addrs *clusterAddrs) (int, error) {
	nodes, opts := 0, metav1.ListOptions{Limit: 500}
	for {
		list, err := c.Kube.CoreV1().Nodes().List(ctx, opts)
		if err != nil {
			return 0, &readFailed{"nodes", err}
		}
		for _, n := range list.Items {
			nodes++
			for _, a := range n.Status.Addresses {
				if a.Type == corev1.NodeInternalIP || a.Type == corev1.NodeExternalIP {
					addrs.add(a.Address, "node "+n.Name)
				}
			}
		}
		if opts.Continue = list.Continue; opts.Continue == "" {
			return nodes, nil
		}
	}
}

// networkPolicies lists the NetworkPolicies of namespace ns.
func networkPolicies(ctx context.Context, c *k8s.Clients, ns string) ([]*networkingv1.NetworkPolicy, error) {
	list, err := c.Kube.NetworkingV1().NetworkPolicies(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, &readFailed{"NetworkPolicies in " + ns, err}
	}
	nps := make([]*networkingv1.NetworkPolicy, len(list.Items))
	for i := range list.Items {
		nps[i] = &list.Items[i]
	}
	return nps, nil
}
