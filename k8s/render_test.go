package k8s_test

import (
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"sigs.k8s.io/yaml"

	"github.com/hiloop/hiloop/k8s"
	"github.com/hiloop/hiloop/receipt"
	"github.com/hiloop/hiloop/store"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/")

// TestRenderGolden pins the exact Sandbox hiloop writes.
func TestRenderGolden(t *testing.T) {
	expires := time.Date(2026, 12, 1, 10, 30, 0, 0, time.UTC)
	opts := k8s.RenderOptions{Namespace: "hiloop-sandboxes", RuntimeClass: "gvisor", Transports: receipt.Transports(),
		AgentImage: "ghcr.io/hiloop/hiloop:dev", GatewayKey: "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGatewayKeyForTheGoldenFileOnly0000000000 hiloop-gateway"}
	for name, sb := range map[string]store.Sandbox{
		"minimal": {ID: "sbx_abcdefghijklmnop", OrgID: "org_qrstuvwxyz234567", DesiredMode: store.ModeRunning,
			Spec: store.Spec{Image: "busybox", ShutdownPolicy: "retain", Transports: []receipt.Transport{receipt.TransportExec}}},
		"forward": {ID: "sbx_abcdefghijklmnop", OrgID: "org_qrstuvwxyz234567", DesiredMode: store.ModeRunning,
			Spec: store.Spec{Image: "busybox", ShutdownPolicy: "retain", Transports: []receipt.Transport{receipt.TransportSSH, receipt.TransportForward}}},
		"full": {ID: "sbx_abcdefghijklmnop", OrgID: "org_qrstuvwxyz234567", DesiredMode: store.ModeRunning, ExpiresAt: &expires,
			Spec: store.Spec{Image: "ghcr.io/acme/tool:1.2@sha256:" + "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
				CPURequest: "500m", CPULimit: "2", MemoryRequest: "256Mi", MemoryLimit: "1Gi", TTLSeconds: 3600, ShutdownPolicy: "delete",
				Volumes: []store.Volume{{Name: "data", Size: "10Gi", MountPath: "/data"}, {Name: "cache", Size: "1Gi", MountPath: "/cache", StorageClass: "fast"}},
				Labels:  map[string]string{"team": "ml"}}},
		"env": {ID: "sbx_abcdefghijklmnop", OrgID: "org_qrstuvwxyz234567", DesiredMode: store.ModeRunning,
			Spec: store.Spec{Image: "busybox", ShutdownPolicy: "retain", Transports: []receipt.Transport{receipt.TransportExec},
				Env: map[string]string{"TOKEN": "s3cret", "QUOTED": `a "b" 'c'`, "REF": "$(TOKEN) $$ $HOME", "EMPTY": "", "LINES": "one\ntwo"}}},
		"stopped": {ID: "sbx_abcdefghijklmnop", OrgID: "org_qrstuvwxyz234567", DesiredMode: store.ModeStopped,
			Spec: store.Spec{Image: "busybox", ShutdownPolicy: "retain", Transports: []receipt.Transport{receipt.TransportExec}}},
	} {
		t.Run(name, func(t *testing.T) {
			obj, err := k8s.Render(sb, opts)
			if err != nil {
				t.Fatal(err)
			}
			got, err := yaml.Marshal(obj)
			if err != nil {
				t.Fatal(err)
			}
			path := filepath.Join("testdata", "render-"+name+".yaml")
			if *update {
				if err := os.WriteFile(path, got, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("%v (run go test ./k8s -update)", err)
			}
			if diff := cmp.Diff(string(want), string(got)); diff != "" {
				t.Errorf("rendered Sandbox differs from %s (-want +got):\n%s", path, diff)
			}
			// The invariants DESIGN.md names, checked on the object itself.
			c := obj.Spec.PodTemplate.Spec.Containers[0]
			if c.Command != nil || c.Args != nil || c.EnvFrom != nil || c.SecurityContext != nil {
				t.Error("workload container has command, args, envFrom or securityContext")
			}
			// Its env is the spec's, as plain values the kubelet expands
			// back to exactly the spec's.
			if len(c.Env) != len(sb.Spec.Env) {
				t.Errorf("workload env %v, spec %v", c.Env, sb.Spec.Env)
			}
			for _, e := range c.Env {
				if e.ValueFrom != nil || strings.ReplaceAll(e.Value, "$$", "$") != sb.Spec.Env[e.Name] {
					t.Errorf("workload env %s: %+v, spec %q", e.Name, e, sb.Spec.Env[e.Name])
				}
			}
			ps := obj.Spec.PodTemplate.Spec
			if ps.RestartPolicy != "Never" || ps.AutomountServiceAccountToken == nil || *ps.AutomountServiceAccountToken ||
				ps.RuntimeClassName == nil || *ps.RuntimeClassName != "gvisor" || obj.Spec.Service == nil || *obj.Spec.Service {
				t.Error("pod template breaks a rendering invariant")
			}
			r, err := receipt.Parse(obj.Spec.PodTemplate.ObjectMeta.Annotations[k8s.AnnotationReceipt])
			if err != nil || r.RuntimeClass != "gvisor" {
				t.Errorf("receipt %+v %v", r, err)
			}
			// The helper exists exactly when the receipt promises forward,
			// and is hardened.
			helpers := ps.Containers[1:]
			if (r.SessionPort > 0) != (len(helpers) == 1) {
				t.Errorf("session port %d with %d helper containers", r.SessionPort, len(helpers))
			}
			for _, h := range helpers {
				if why := k8s.HelperHardened(h); h.Name != k8s.HelperContainer || why != "" {
					t.Errorf("helper %s: %s", h.Name, why)
				}
				if why := k8s.HelperKeySource(h, ps.Volumes); why != "" {
					t.Errorf("helper %s: %s", h.Name, why)
				}
			}
		})
	}
}

// TestRenderInsecure: without gVisor the pod gets no runtime class and the
// receipt says why, and reads back.
func TestRenderInsecure(t *testing.T) {
	obj, err := k8s.Render(store.Sandbox{ID: "sbx_x", OrgID: "org_x", DesiredMode: store.ModeRunning, Spec: store.Spec{Image: "busybox"}},
		k8s.RenderOptions{Namespace: "ns", RuntimeClass: "gvisor", NoGVisor: true, Transports: []receipt.Transport{receipt.TransportExec}})
	if err != nil {
		t.Fatal(err)
	}
	if rc := obj.Spec.PodTemplate.Spec.RuntimeClassName; rc != nil {
		t.Errorf("runtime class %q", *rc)
	}
	r, err := receipt.Parse(obj.Spec.PodTemplate.ObjectMeta.Annotations[k8s.AnnotationReceipt])
	if err != nil || r.RuntimeClass != "" || r.Insecure != receipt.InsecureNoGVisor || r.Isolation() != "insecure-no-gvisor" {
		t.Errorf("receipt %+v, %v", r, err)
	}
}

// TestObjectNameRoundTrip: IDFromName inverts ObjectName, and refuses names
// ObjectName never makes.
func TestObjectNameRoundTrip(t *testing.T) {
	for _, id := range []string{"sbx_abc", "sbx_0123456789abcdef"} {
		if got, ok := k8s.IDFromName(k8s.ObjectName(id)); !ok || got != id {
			t.Errorf("IDFromName(ObjectName(%q)) = %q, %v", id, got, ok)
		}
	}
	for _, name := range []string{"other", "sbx-", "hiloop-org-x"} {
		if got, ok := k8s.IDFromName(name); ok {
			t.Errorf("IDFromName(%q) = %q, want refused", name, got)
		}
	}
}

// TestRenderEnvOnlyInTheWorkload: a sandbox's env, even names that would
// steer a program's loader or its PATH, goes into the workload container
// alone: the session helper's environment is its own sandbox id, from its
// pod's label, and nothing of the caller's.
func TestRenderEnvOnlyInTheWorkload(t *testing.T) {
	opts := k8s.RenderOptions{Namespace: "hiloop-sandboxes", RuntimeClass: "gvisor", Transports: receipt.Transports(),
		AgentImage: "ghcr.io/hiloop/hiloop:dev", GatewayKey: "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGatewayKeyForTheGoldenFileOnly0000000000 hiloop-gateway"}
	sb := store.Sandbox{ID: "sbx_abcdefghijklmnop", OrgID: "org_qrstuvwxyz234567", DesiredMode: store.ModeRunning,
		Spec: store.Spec{Image: "busybox", ShutdownPolicy: "retain", Transports: []receipt.Transport{receipt.TransportExec, receipt.TransportForward},
			Env: map[string]string{"PATH": "/evil", "LD_PRELOAD": "/evil.so", "KUBERNETES_SERVICE_HOST": "10.0.0.1"}}}
	obj, err := k8s.Render(sb, opts)
	if err != nil {
		t.Fatal(err)
	}
	cs := obj.Spec.PodTemplate.Spec.Containers
	if len(cs) != 2 || cs[0].Name != k8s.WorkloadContainer || cs[1].Name != k8s.HelperContainer {
		t.Fatalf("containers: %+v", cs)
	}
	if len(cs[0].Env) != 3 {
		t.Errorf("the workload's env: %+v", cs[0].Env)
	}
	if diff := cmp.Diff(k8s.Helper(opts.AgentImage, k8s.DefaultSessionPort).Env, cs[1].Env); diff != "" || len(cs[1].Env) != 1 || cs[1].EnvFrom != nil {
		t.Errorf("the helper's env (-want +got):\n%s", diff)
	}
}
