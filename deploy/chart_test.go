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
	"k8s.io/apimachinery/pkg/api/equality"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"

	"github.com/hiloop/hiloop/boundary"
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
		{"../localcluster/assets/boundary.yaml", []string{"template", "hiloop", "deploy/chart", "-f", "deploy/chart/values-local.yaml"}},
		{"../boundary/chart-boundary.yaml", []string{"template", "hiloop", "deploy/chart", "--show-only", "templates/namespaces.yaml",
			"--show-only", "templates/runtimeclass.yaml", "--show-only", "templates/admission.yaml",
			"--show-only", "templates/networkpolicy.yaml", "--show-only", "templates/quota.yaml"}},
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

// subchartPatch is the one change to upstream's chart: its image may be
// pinned by digest (image.digest), which upstream's helper cannot express
// (a digest in image.tag would also land in a label, where it is invalid).
var subchartPatch = map[string][2]string{
	"templates/_helpers.tpl": {`{{- define "agent-sandbox.image" -}}
{{- $tag := required "image.tag is required" .Values.image.tag }}
{{- printf "%s:%s" .Values.image.repository $tag }}
{{- end }}`, `{{- define "agent-sandbox.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- $tag := required "image.tag is required" .Values.image.tag }}
{{- printf "%s:%s" .Values.image.repository $tag }}
{{- end }}
{{- end }}`},
}

// TestVendoredAgentSandboxChart: the subchart is upstream's chart at the
// pinned module version, without the extension CRDs, unchanged but for
// subchartPatch.
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
		if p, ok := subchartPatch[filepath.ToSlash(rel)]; ok {
			if !bytes.Contains(want, []byte(p[0])) {
				t.Errorf("upstream %s no longer has the text the patch replaces", rel)
			}
			want = bytes.Replace(want, []byte(p[0]), []byte(p[1]), 1)
		}
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
		"pod-security.kubernetes.io/warn": "restricted", "pod-security.kubernetes.io/enforce-version": "latest"} {
		if ns.Labels[k] != v {
			t.Errorf("sandbox namespace label %s = %q, want %q", k, ns.Labels[k], v)
		}
	}
	rc := decode[nodev1.RuntimeClass](t, objs, "RuntimeClass/gvisor")
	if rc.Handler != "runsc" || rc.Overhead == nil || rc.Overhead.PodFixed.Memory().IsZero() {
		t.Errorf("RuntimeClass gvisor: handler %q, overhead %v", rc.Handler, rc.Overhead)
	}
	for _, name := range []string{boundary.PolicySandbox, boundary.PolicyPod} {
		p := decode[admissionv1.ValidatingAdmissionPolicy](t, objs, "ValidatingAdmissionPolicy/"+name)
		if p.Spec.FailurePolicy == nil || *p.Spec.FailurePolicy != admissionv1.Fail {
			t.Errorf("%s: failurePolicy %v", name, p.Spec.FailurePolicy)
		}
		for _, rule := range boundary.PolicyRules {
			if !slices.ContainsFunc(p.Spec.Validations, func(v admissionv1.Validation) bool { return strings.HasPrefix(v.Message, "["+rule+"]") }) {
				t.Errorf("%s: no rule [%s]", name, rule)
			}
		}
		b := decode[admissionv1.ValidatingAdmissionPolicyBinding](t, objs, "ValidatingAdmissionPolicyBinding/"+name)
		if b.Spec.PolicyName != name || !slices.Equal(b.Spec.ValidationActions, []admissionv1.ValidationAction{admissionv1.Deny}) {
			t.Errorf("binding %s: policy %q, actions %v", name, b.Spec.PolicyName, b.Spec.ValidationActions)
		}
		// By the name the API server gives the namespace, not by a label
		// anyone who may edit the namespace could remove.
		sel := b.Spec.MatchResources.NamespaceSelector
		if len(sel.MatchLabels) != 0 || len(sel.MatchExpressions) != 1 || sel.MatchExpressions[0].Key != corev1.LabelMetadataName ||
			!slices.Equal(sel.MatchExpressions[0].Values, []string{"hiloop-sandboxes"}) {
			t.Errorf("binding %s selects %v", name, sel)
		}
	}
	np := decode[networkingv1.NetworkPolicy](t, objs, "NetworkPolicy/"+boundary.NetworkPolicy)
	var excepts []string
	for _, r := range np.Spec.Egress {
		for _, p := range r.To {
			if p.IPBlock != nil {
				excepts = append(excepts, p.IPBlock.Except...)
			}
		}
	}
	for _, d := range boundary.DeniedCIDRs {
		if !slices.Contains(excepts, d) {
			t.Errorf("NetworkPolicy: egress does not except %s", d)
		}
	}
	q := decode[corev1.ResourceQuota](t, objs, "ResourceQuota/"+boundary.QuotaName)
	for _, r := range []corev1.ResourceName{"count/sandboxes.agents.x-k8s.io", "requests.cpu", "requests.memory", "limits.cpu", "limits.memory",
		"requests.storage", "persistentvolumeclaims"} {
		if _, ok := q.Spec.Hard[r]; !ok {
			t.Errorf("quota sets no %s: %v", r, q.Spec.Hard)
		}
	}
	for _, name := range []string{"hiloop-system", "agent-sandbox-system"} {
		ns := decode[corev1.Namespace](t, objs, "Namespace/"+name)
		if ns.Labels["pod-security.kubernetes.io/enforce"] != "restricted" {
			t.Errorf("namespace %s does not enforce restricted: %v", name, ns.Labels)
		}
	}
	sys := decode[networkingv1.NetworkPolicy](t, objs, "NetworkPolicy/hiloop-system")
	if sys.Namespace != "hiloop-system" || len(sys.Spec.PolicyTypes) != 2 || len(sys.Spec.PodSelector.MatchLabels) != 0 {
		t.Errorf("hiloop-system's NetworkPolicy: %+v", sys.Spec)
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
	case c.StartupProbe == nil || c.StartupProbe.HTTPGet.Path != "/healthz" || c.StartupProbe.FailureThreshold*c.StartupProbe.PeriodSeconds < 300:
		t.Errorf("deployment: no startup probe giving migrations 5 minutes: %+v", c.StartupProbe)
	case !slices.Contains(c.Args, "--boundary-file=/etc/hiloop/boundary.yaml"):
		t.Errorf("deployment: the self-check is not given the release's boundary: %v", c.Args)
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
	ctl := decode[appsv1.Deployment](t, objs, "Deployment/agent-sandbox-controller")
	cc, cpsc := ctl.Spec.Template.Spec.Containers[0], ctl.Spec.Template.Spec.SecurityContext
	switch {
	case cpsc == nil || cpsc.RunAsNonRoot == nil || !*cpsc.RunAsNonRoot || cpsc.SeccompProfile == nil || cpsc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault:
		t.Errorf("controller: pod securityContext %+v", cpsc)
	case cc.SecurityContext == nil || cc.SecurityContext.AllowPrivilegeEscalation == nil || *cc.SecurityContext.AllowPrivilegeEscalation ||
		cc.SecurityContext.Capabilities == nil || !slices.Contains(cc.SecurityContext.Capabilities.Drop, "ALL"):
		t.Errorf("controller: container securityContext %+v", cc.SecurityContext)
	case cc.Resources.Limits.Cpu().IsZero() || cc.Resources.Limits.Memory().IsZero() || cc.Resources.Requests.Memory().IsZero():
		t.Errorf("controller: resources %+v", cc.Resources)
	}
	// The ConfigMap the self-check reads holds exactly the boundary built
	// into hiloop for the default values.
	cm := decode[corev1.ConfigMap](t, objs, "ConfigMap/hiloop-boundary")
	fromMap, err := boundary.Parse([]byte(cm.Data["boundary.yaml"]))
	if err != nil {
		t.Fatalf("ConfigMap hiloop-boundary: %v", err)
	}
	if !equality.Semantic.DeepEqual(fromMap, boundary.Chart()) {
		t.Error("ConfigMap hiloop-boundary differs from boundary/chart-boundary.yaml")
	}

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

// TestRenderingOptions: metrics stay on a ClusterIP Service whatever
// service.type, images are pinned by digest when values give one, and the
// cluster's own addresses land in the sandboxes' egress exceptions, by
// family.
func TestRenderingOptions(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "r.yaml")
	out := helm(t, "template", "hiloop", "deploy/chart", "--set", "service.type=LoadBalancer",
		"--set", "image.digest=sha256:"+strings.Repeat("a", 64), "--set", "agent-sandbox.image.digest=sha256:"+strings.Repeat("b", 64),
		"--set", "networkPolicy.cluster.apiServer={203.0.113.7,2001:db8::7}", "--set", "networkPolicy.cluster.podCIDRs={10.244.0.0/16,fd00:10:244::/56}")
	if err := os.WriteFile(file, []byte(out), 0o600); err != nil {
		t.Fatal(err)
	}
	objs := objects(t, file)
	if m := decode[corev1.Service](t, objs, "Service/hiloop-metrics"); m.Spec.Type != corev1.ServiceTypeClusterIP {
		t.Errorf("metrics Service is %s", m.Spec.Type)
	}
	for _, svc := range []string{"Service/hiloop-api", "Service/hiloop-ssh"} {
		s := decode[corev1.Service](t, objs, svc)
		if s.Spec.Type != corev1.ServiceTypeLoadBalancer || slices.ContainsFunc(s.Spec.Ports, func(p corev1.ServicePort) bool { return p.Name == "metrics" }) {
			t.Errorf("%s: type %s, ports %v", svc, s.Spec.Type, s.Spec.Ports)
		}
	}
	d := decode[appsv1.Deployment](t, objs, "Deployment/hiloop")
	want := "hiloop/hiloop@sha256:" + strings.Repeat("a", 64)
	if c := d.Spec.Template.Spec.Containers[0]; c.Image != want || !slices.Contains(c.Args, "--agent-image="+want) {
		t.Errorf("hiloop's image %s, args %v", c.Image, c.Args)
	}
	ctl := decode[appsv1.Deployment](t, objs, "Deployment/agent-sandbox-controller")
	if img := ctl.Spec.Template.Spec.Containers[0].Image; img != "registry.k8s.io/agent-sandbox/agent-sandbox-controller@sha256:"+strings.Repeat("b", 64) {
		t.Errorf("controller image %s", img)
	}
	np := decode[networkingv1.NetworkPolicy](t, objs, "NetworkPolicy/"+boundary.NetworkPolicy)
	v4, v6 := np.Spec.Egress[1].To[0].IPBlock, np.Spec.Egress[1].To[1].IPBlock
	for _, c := range []struct {
		block *networkingv1.IPBlock
		cidr  string
	}{{v4, "203.0.113.7/32"}, {v4, "10.244.0.0/16"}, {v6, "2001:db8::7/128"}, {v6, "fd00:10:244::/56"}} {
		if !slices.Contains(c.block.Except, c.cidr) {
			t.Errorf("%s excepts no %s: %v", c.block.CIDR, c.cidr, c.block.Except)
		}
	}
	sys := decode[networkingv1.NetworkPolicy](t, objs, "NetworkPolicy/hiloop-system")
	api := sys.Spec.Egress[len(sys.Spec.Egress)-1]
	if len(api.To) != 2 || api.To[0].IPBlock.CIDR != "203.0.113.7/32" {
		t.Errorf("hiloop-system's egress to the API server: %+v", api)
	}
}
