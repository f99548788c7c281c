package localcluster

import (
	"bytes"
	"context"
	_ "embed"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/restmapper"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/agent-sandbox/api/v1beta1"

	"github.com/hiloop/hiloop/boundary"
	"github.com/hiloop/hiloop/k8s"
)

// boundaryYAML is the hiloop chart (deploy/chart) rendered with
// values-local.yaml: the isolation boundary and hiloop's RBAC, without the
// Deployment or the agent-sandbox controller, which run here as local
// processes. `make chart` writes it; a test keeps it equal to helm's output.
//
//go:embed assets/boundary.yaml
var boundaryYAML []byte

// BoundaryYAML is a copy of the local cluster's rendering of the chart's
// isolation boundary (deploy/chart with values-local.yaml).
func BoundaryYAML() []byte { return bytes.Clone(boundaryYAML) }

// chartSandboxNamespace is the sandbox namespace the rendering names.
const chartSandboxNamespace = k8s.DefaultNamespace

// boundaryObjects parses the rendering, with the cluster's own API server
// address denied to sandboxes (see denyAPIServer).
func (c *Cluster) boundaryObjects(ctx context.Context) ([]*unstructured.Unstructured, error) {
	objs, err := parseBoundary()
	if err != nil {
		return nil, err
	}
	return objs, c.denyAPIServer(ctx, objs)
}

// denyAPIServer adds the API server's advertised addresses (the kubernetes
// EndpointSlice's) to the excepts of the sandbox NetworkPolicy's egress
// blocks, as an operator sets networkPolicy.cluster.apiServer in values. The
// local API server advertises the machine's own address, which differs
// from machine to machine, so the rendering cannot name it; values-local
// names the rest of the cluster's addresses. The policy only gets narrower
// than the rendering, which the self-check allows.
func (c *Cluster) denyAPIServer(ctx context.Context, objs []*unstructured.Unstructured) error {
	var addrs []netip.Addr
	for len(addrs) == 0 {
		// The API server publishes its EndpointSlice a moment after it serves.
		eps, err := c.Clients.Kube.DiscoveryV1().EndpointSlices(metav1.NamespaceDefault).List(ctx,
			metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=kubernetes"})
		if err != nil {
			return fmt.Errorf("the API server's EndpointSlice: %w", err)
		}
		for _, sl := range eps.Items {
			for _, e := range sl.Endpoints {
				for _, a := range e.Addresses {
					if ip, err := netip.ParseAddr(a); err == nil {
						addrs = append(addrs, ip)
					}
				}
			}
		}
		if len(addrs) > 0 {
			break
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("the API server published no EndpointSlice: %w", ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
	for _, o := range objs {
		if o.GetKind() != "NetworkPolicy" || o.GetName() != boundary.NetworkPolicy {
			continue
		}
		egress, _, _ := unstructured.NestedSlice(o.Object, "spec", "egress")
		for _, r := range egress {
			to, _ := r.(map[string]any)["to"].([]any)
			for _, peer := range to {
				block, ok := peer.(map[string]any)["ipBlock"].(map[string]any)
				if !ok {
					continue
				}
				cidr, _ := netip.ParsePrefix(fmt.Sprint(block["cidr"]))
				except, _ := block["except"].([]any)
				for _, a := range addrs {
					if cidr.IsValid() && cidr.Contains(a) {
						except = append(except, netip.PrefixFrom(a, a.BitLen()).String())
					}
				}
				block["except"] = except
			}
		}
		if err := unstructured.SetNestedSlice(o.Object, egress, "spec", "egress"); err != nil {
			return err
		}
	}
	return nil
}

// parseBoundary parses the rendering.
func parseBoundary() ([]*unstructured.Unstructured, error) {
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(boundaryYAML), 4096)
	var objs []*unstructured.Unstructured
	for {
		var u unstructured.Unstructured
		err := dec.Decode(&u.Object)
		if errors.Is(err, io.EOF) {
			return objs, nil
		}
		if err != nil {
			return nil, fmt.Errorf("boundary rendering: %w", err)
		}
		if len(u.Object) > 0 {
			objs = append(objs, &u)
		}
	}
}

// createObjects creates objects in order, through discovery of their
// resources. One that already exists is left as it is.
func (c *Cluster) createObjects(ctx context.Context, objs []*unstructured.Unstructured) error {
	groups, err := restmapper.GetAPIGroupResources(c.Clients.Kube.Discovery())
	if err != nil {
		return err
	}
	mapper := restmapper.NewDiscoveryRESTMapper(groups)
	dyn, err := dynamic.NewForConfig(c.Clients.Config)
	if err != nil {
		return err
	}
	for _, o := range objs {
		gvk := o.GroupVersionKind()
		m, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
		if err != nil {
			return fmt.Errorf("%s %s: %w", gvk.Kind, o.GetName(), err)
		}
		var ri dynamic.ResourceInterface = dyn.Resource(m.Resource)
		if m.Scope.Name() == meta.RESTScopeNameNamespace {
			ri = dyn.Resource(m.Resource).Namespace(o.GetNamespace())
		}
		if _, err := ri.Create(ctx, o, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("%s %s: %w", gvk.Kind, o.GetName(), err)
		}
	}
	return nil
}

// InstallBoundary creates every object of the rendering that is missing (an
// existing one is left as it is), then the extra
// sandbox namespace when the cluster was asked for another one.
func (c *Cluster) InstallBoundary(ctx context.Context) error {
	objs, err := c.boundaryObjects(ctx)
	if err != nil {
		return err
	}
	if err := c.createObjects(ctx, objs); err != nil {
		return err
	}
	if err := c.waitQuota(ctx, chartSandboxNamespace); err != nil {
		return err
	}
	if c.Namespace != chartSandboxNamespace {
		return c.AddSandboxNamespace(ctx, c.Namespace)
	}
	return nil
}

// waitQuota waits until the quota controller has computed the namespace's
// quota, usage included: until then the API server refuses every Sandbox
// create there ("status unknown for quota").
func (c *Cluster) waitQuota(ctx context.Context, ns string) error {
	for {
		q, err := c.Clients.Kube.CoreV1().ResourceQuotas(ns).Get(ctx, boundary.QuotaName, metav1.GetOptions{})
		if err == nil && len(q.Status.Hard) > 0 && len(q.Status.Used) == len(q.Status.Hard) {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("quota in %s not computed: %w", ns, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// AddSandboxNamespace makes another namespace with the chart's sandbox
// namespace objects (its Pod Security labels, quota,
// NetworkPolicy and hiloop's Role), adds it to the namespaces the admission
// bindings select by name, and waits until admission holds it. Tests use
// one per hiloop instance.
func (c *Cluster) AddSandboxNamespace(ctx context.Context, name string) error {
	objs, err := c.boundaryObjects(ctx)
	if err != nil {
		return err
	}
	var copies []*unstructured.Unstructured
	for _, o := range objs {
		switch {
		case o.GetKind() == "Namespace" && o.GetName() == chartSandboxNamespace:
			o.SetName(name)
			labels := o.GetLabels()
			labels["kubernetes.io/metadata.name"] = name
			o.SetLabels(labels)
		case o.GetNamespace() == chartSandboxNamespace:
			o.SetNamespace(name)
		default:
			continue
		}
		copies = append(copies, o)
	}
	if err := c.createObjects(ctx, copies); err != nil {
		return err
	}
	if err := c.waitQuota(ctx, name); err != nil {
		return err
	}
	return c.BindNamespace(ctx, name, true)
}

// BindNamespace adds ns to (bind) or removes it from the namespaces the
// chart's two admission bindings select, by kubernetes.io/metadata.name,
// and waits until admission holds the namespace or lets it go. A test that
// plays an attacker who got past admission unbinds its namespace.
func (c *Cluster) BindNamespace(ctx context.Context, ns string, bind bool) error {
	bindings := c.Clients.Kube.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings()
	for _, name := range []string{boundary.PolicySandbox, boundary.PolicyPod} {
		err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
			b, err := bindings.Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			var sel *metav1.LabelSelector
			if m := b.Spec.MatchResources; m != nil {
				sel = m.NamespaceSelector
			}
			if sel == nil || len(sel.MatchExpressions) != 1 || sel.MatchExpressions[0].Key != corev1.LabelMetadataName {
				return fmt.Errorf("binding %s does not select namespaces by %s", name, corev1.LabelMetadataName)
			}
			values := slices.DeleteFunc(slices.Clone(sel.MatchExpressions[0].Values), func(v string) bool { return v == ns })
			if bind {
				values = append(values, ns)
			}
			if slices.Equal(values, sel.MatchExpressions[0].Values) {
				return nil
			}
			sel.MatchExpressions[0].Values = values
			_, err = bindings.Update(ctx, b, metav1.UpdateOptions{})
			return err
		})
		if err != nil {
			return fmt.Errorf("bind %s in %s: %w", ns, name, err)
		}
	}
	return c.waitBound(ctx, ns, bind)
}

// waitBound waits until both policies refuse (bound) or no longer refuse
// (unbound) a dry run each of them alone refuses: a Sandbox not named as
// hiloop names them, and a pod with a hostname. The API server picks up a
// changed binding a moment after it is stored.
func (c *Cluster) waitBound(ctx context.Context, ns string, bound bool) error {
	dry := metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}
	spec := corev1.PodSpec{Containers: []corev1.Container{{Name: "probe", Image: "busybox"}}, Hostname: "probe"}
	for {
		_, serr := c.Clients.Sandbox.AgentsV1beta1().Sandboxes(ns).Create(ctx, &v1beta1.Sandbox{
			ObjectMeta: metav1.ObjectMeta{Name: "binding-probe"},
			Spec:       v1beta1.SandboxSpec{SandboxBlueprint: v1beta1.SandboxBlueprint{PodTemplate: v1beta1.PodTemplate{Spec: spec}}}}, dry)
		_, perr := c.Clients.Kube.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "binding-probe"}, Spec: spec}, dry)
		held := func(err error, policy string) bool {
			return err != nil && strings.Contains(err.Error(), "'"+policy+"'")
		}
		if held(serr, boundary.PolicySandbox) == bound && held(perr, boundary.PolicyPod) == bound {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("admission in %s not %v within the deadline (sandbox: %v; pod: %v)", ns, map[bool]string{true: "bound", false: "unbound"}[bound], serr, perr)
		case <-time.After(50 * time.Millisecond):
		}
	}
}
