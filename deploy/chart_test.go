package deploy_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	nodev1 "k8s.io/api/node/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"

	"github.com/hiloop/hiloop/k8s"
)

// helm is the pinned helm that testdata/cluster/build.sh builds beside the
// cluster binaries.
func helm(t *testing.T, args ...string) string {
	t.Helper()
	dir := os.Getenv("HILOOP_CLUSTER_BIN")
	if dir == "" {
		t.Fatal("HILOOP_CLUSTER_BIN is not set: run the tests with make test (testdata/cluster/build.sh builds helm)")
	}
	cmd := exec.Command(filepath.Join(dir, "helm"), args...)
	cmd.Dir = ".."
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("helm %s: %v\n%s%s", strings.Join(args, " "), err, out, stderr.String())
	}
	return string(out)
}

func TestChartLints(t *testing.T) {
	helm(t, "lint", "--strict", "deploy/chart")
	helm(t, "lint", "--strict", "deploy/chart", "-f", "deploy/chart/values-local.yaml")
}

// TestRenderingsMatchChart: the checked-in renderings are helm's output, so
// `kubectl apply -f deploy/hiloop.yaml` and the local cluster install what
// `helm install` would. make chart writes them.
func TestRenderingsMatchChart(t *testing.T) {
	for _, r := range []struct {
		file string
		args []string
	}{
		{"hiloop.yaml", []string{"template", "hiloop", "deploy/chart", "--include-crds"}},
		{"../k8s/localcluster/assets/boundary.yaml", []string{"template", "hiloop", "deploy/chart", "-f", "deploy/chart/values-local.yaml"}},
	} {
		want := helm(t, r.args...)
		got, err := os.ReadFile(r.file)
		if err != nil {
			t.Fatal(err)
		}
		if string(got) != want {
			t.Errorf("%s differs from helm %s: run make chart", r.file, strings.Join(r.args, " "))
		}
	}
}

// TestVendoredAgentSandboxChart: the subchart is upstream's chart at the
// pinned module version, unchanged, without the extension CRDs.
func TestVendoredAgentSandboxChart(t *testing.T) {
	out, err := exec.Command("go", "mod", "download", "-json", "sigs.k8s.io/agent-sandbox@v0.5.6").Output()
	if err != nil {
		t.Fatal(err)
	}
	var mod struct{ Dir string }
	if err := json.Unmarshal(out, &mod); err != nil {
		t.Fatal(err)
	}
	upstream := filepath.Join(mod.Dir, "helm")
	vendored := "chart/charts/agent-sandbox"
	seen := 0
	err = filepath.WalkDir(upstream, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(upstream, path)
		if strings.HasPrefix(rel, "crds/extensions.") {
			return nil
		}
		want, _ := os.ReadFile(path)
		got, err := os.ReadFile(filepath.Join(vendored, rel))
		if err != nil || !bytes.Equal(got, want) {
			t.Errorf("%s: differs from upstream %s", filepath.Join(vendored, rel), rel)
		}
		seen++
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	var count int
	filepath.WalkDir(vendored, func(_ string, d fs.DirEntry, _ error) error {
		if d != nil && !d.IsDir() {
			count++
		}
		return nil
	})
	if count != seen || seen == 0 {
		t.Errorf("vendored chart has %d files, upstream (without extension CRDs) %d", count, seen)
	}
}

// objects parses a rendering into kind/name -> document.
func objects(t *testing.T, file string) map[string][]byte {
	t.Helper()
	raw, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]byte{}
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(raw), 4096)
	for {
		var doc json.RawMessage
		if err := dec.Decode(&doc); errors.Is(err, io.EOF) {
			return out
		} else if err != nil {
			t.Fatal(err)
		}
		var meta struct {
			Kind     string
			Metadata struct{ Name, Namespace string }
		}
		if len(doc) == 0 || string(doc) == "null" {
			continue
		}
		if err := json.Unmarshal(doc, &meta); err != nil {
			t.Fatal(err)
		}
		out[meta.Kind+"/"+meta.Metadata.Name] = doc
	}
}

func decode[T any](t *testing.T, objs map[string][]byte, key string) T {
	t.Helper()
	var v T
	raw, ok := objs[key]
	if !ok {
		t.Fatalf("rendering has no %s", key)
	}
	if err := yaml.Unmarshal(raw, &v); err != nil {
		t.Fatalf("%s: %v", key, err)
	}
	return v
}

// TestDefaultRendering holds the default install to what docs/install.md
// promises, object by object.
func TestDefaultRendering(t *testing.T) {
	objs := objects(t, "hiloop.yaml")

	ns := decode[corev1.Namespace](t, objs, "Namespace/hiloop-sandboxes")
	for k, v := range map[string]string{"pod-security.kubernetes.io/enforce": "baseline", "pod-security.kubernetes.io/audit": "restricted",
		"pod-security.kubernetes.io/warn": "restricted", "hiloop.dev/sandbox-namespace": "true"} {
		if ns.Labels[k] != v {
			t.Errorf("sandbox namespace label %s = %q, want %q", k, ns.Labels[k], v)
		}
	}
	rc := decode[nodev1.RuntimeClass](t, objs, "RuntimeClass/gvisor")
	if rc.Handler != "runsc" || rc.Overhead == nil || rc.Overhead.PodFixed.Memory().IsZero() {
		t.Errorf("RuntimeClass gvisor: handler %q, overhead %v", rc.Handler, rc.Overhead)
	}
	for _, name := range []string{k8s.PolicySandbox, k8s.PolicyPod} {
		p := decode[admissionv1.ValidatingAdmissionPolicy](t, objs, "ValidatingAdmissionPolicy/"+name)
		if p.Spec.FailurePolicy == nil || *p.Spec.FailurePolicy != admissionv1.Fail {
			t.Errorf("%s: failurePolicy %v", name, p.Spec.FailurePolicy)
		}
		for _, rule := range k8s.PolicyRules {
			if !slices.ContainsFunc(p.Spec.Validations, func(v admissionv1.Validation) bool { return strings.HasPrefix(v.Message, "["+rule+"]") }) {
				t.Errorf("%s: no rule [%s]", name, rule)
			}
		}
		b := decode[admissionv1.ValidatingAdmissionPolicyBinding](t, objs, "ValidatingAdmissionPolicyBinding/"+name)
		if b.Spec.PolicyName != name || !slices.Equal(b.Spec.ValidationActions, []admissionv1.ValidationAction{admissionv1.Deny}) {
			t.Errorf("binding %s: policy %q, actions %v", name, b.Spec.PolicyName, b.Spec.ValidationActions)
		}
	}
	np := decode[networkingv1.NetworkPolicy](t, objs, "NetworkPolicy/"+k8s.NetworkPolicy)
	if problems := k8s.NetworkPolicyProblems(&np, k8s.DefaultSessionPort); len(problems) > 0 {
		t.Errorf("NetworkPolicy: %v", problems)
	}
	q := decode[corev1.ResourceQuota](t, objs, "ResourceQuota/"+k8s.QuotaName)
	if _, ok := q.Spec.Hard["count/sandboxes.agents.x-k8s.io"]; !ok {
		t.Errorf("quota: %v", q.Spec.Hard)
	}

	d := decode[appsv1.Deployment](t, objs, "Deployment/hiloop")
	c := d.Spec.Template.Spec.Containers[0]
	sc := c.SecurityContext
	psc := d.Spec.Template.Spec.SecurityContext
	switch {
	case *d.Spec.Replicas != 1 || d.Spec.Strategy.Type != appsv1.RecreateDeploymentStrategyType:
		t.Errorf("deployment: %d replicas, strategy %s", *d.Spec.Replicas, d.Spec.Strategy.Type)
	case c.LivenessProbe == nil || c.LivenessProbe.HTTPGet.Path != "/healthz" || c.ReadinessProbe == nil || c.ReadinessProbe.HTTPGet.Path != "/readyz":
		t.Error("deployment: probes are not /healthz and /readyz")
	case sc == nil || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem || psc == nil || psc.RunAsNonRoot == nil || !*psc.RunAsNonRoot:
		t.Error("deployment: not non-root with a read-only root filesystem")
	case !slices.ContainsFunc(d.Spec.Template.Spec.Volumes, func(v corev1.Volume) bool { return v.PersistentVolumeClaim != nil }):
		t.Error("deployment: the record is not on a volume")
	case !slices.Contains(c.Args, "--agent-image="+c.Image):
		t.Errorf("deployment: the session helper's image is not hiloop's own (%s): %v", c.Image, c.Args)
	}
	for _, svc := range []string{"Service/hiloop-api", "Service/hiloop-ssh"} {
		decode[corev1.Service](t, objs, svc)
	}
	decode[appsv1.Deployment](t, objs, "Deployment/agent-sandbox-controller")

	// hiloop's RBAC: named verbs only, no Secrets, no pod creation.
	for key := range objs {
		if !strings.HasPrefix(key, "Role/hiloop") && !strings.HasPrefix(key, "ClusterRole/hiloop") {
			continue
		}
		r := decode[rbacv1.Role](t, objs, key)
		for _, rule := range r.Rules {
			if slices.Contains(rule.Verbs, "*") || slices.Contains(rule.Resources, "*") || slices.Contains(rule.APIGroups, "*") {
				t.Errorf("%s: wildcard rule %v", key, rule)
			}
			if slices.Contains(rule.Resources, "secrets") {
				t.Errorf("%s: grants Secrets", key)
			}
			if slices.Contains(rule.Resources, "pods") && slices.ContainsFunc(rule.Verbs, func(v string) bool { return v != "get" && v != "list" && v != "watch" }) {
				t.Errorf("%s: pods beyond reading: %v", key, rule.Verbs)
			}
		}
	}
}
