package localcluster

import (
	"bytes"
	"context"
	_ "embed"
	"errors"
	"fmt"
	"io"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/restmapper"

	"github.com/hiloop/hiloop/k8s"
)

// Boundary is the hiloop chart (deploy/chart) rendered with
// values-local.yaml: the isolation boundary and hiloop's RBAC, without the
// Deployment or the agent-sandbox controller, which run here as local
// processes. `make chart` writes it; a test keeps it equal to helm's output.
//
//go:embed assets/boundary.yaml
var Boundary []byte

// chartSandboxNamespace is the sandbox namespace the rendering names.
const chartSandboxNamespace = k8s.DefaultNamespace

// boundaryObjects parses the rendering.
func boundaryObjects() ([]*unstructured.Unstructured, error) {
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(Boundary), 4096)
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
	objs, err := boundaryObjects()
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
		q, err := c.Clients.Kube.CoreV1().ResourceQuotas(ns).Get(ctx, k8s.QuotaName, metav1.GetOptions{})
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
// namespace objects: its labels (Pod Security, and the one the admission
// bindings select), quota, NetworkPolicy and hiloop's Role. Tests use one
// per hiloop instance.
func (c *Cluster) AddSandboxNamespace(ctx context.Context, name string) error {
	objs, err := boundaryObjects()
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
	return c.waitQuota(ctx, name)
}
