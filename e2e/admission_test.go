package e2e_test

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	nodev1 "k8s.io/api/node/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/agent-sandbox/api/v1beta1"

	"github.com/hiloop/hiloop/boundary"
	"github.com/hiloop/hiloop/cluster"
	"github.com/hiloop/hiloop/internal/e2e"
	"github.com/hiloop/hiloop/internal/eventually"
	"github.com/hiloop/hiloop/k8s"
	"github.com/hiloop/hiloop/receipt"
	"github.com/hiloop/hiloop/store"
)

// hiloopUser is the chart's ServiceAccount as the API server names it.
const hiloopUser = "system:serviceaccount:hiloop-system:hiloop"

// asHiloop returns clients that act as the chart's ServiceAccount: the
// cluster's admin impersonates it, so admission sees hiloop's user name and
// RBAC applies hiloop's Role.
func asHiloop(t *testing.T) *k8s.Clients {
	t.Helper()
	cfg := rest.CopyConfig(e2e.SharedCluster(t).Clients.Config)
	cfg.WarningHandler = rest.NoWarnings{}
	cfg.Impersonate = rest.ImpersonationConfig{UserName: hiloopUser,
		Groups: []string{"system:serviceaccounts", "system:serviceaccounts:hiloop-system", "system:authenticated"}}
	c, err := k8s.NewClients(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// quietAdmin returns the cluster admin's clients without the API server's
// warnings (Pod Security's restricted level warns of nearly every shape).
func quietAdmin(t *testing.T) *k8s.Clients {
	t.Helper()
	cfg := rest.CopyConfig(e2e.SharedCluster(t).Clients.Config)
	cfg.WarningHandler = rest.NoWarnings{}
	c, err := k8s.NewClients(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// escape is one way out of the boundary and the chart rule that must refuse
// it. spec mutates a conforming pod spec (the one hiloop renders, session
// helper and a volume included) and applies to a Sandbox's template and to
// a pod alike; sandbox mutates only a Sandbox, pod only a pod.
type escape struct {
	name    string
	rule    string
	spec    func(*corev1.PodSpec)
	sandbox func(*v1beta1.Sandbox)
	pod     func(*corev1.Pod)
	// pss marks an escape Pod Security baseline refuses too: while the
	// namespace enforces it, a pod may be refused by either.
	pss bool
	// invalid marks a pod the API server's own validation refuses before
	// admission runs (a field that cannot be set on create, say).
	invalid bool
	// createOnly marks a Sandbox escape that is not one as an update: a
	// name, claim templates (which the CRD itself keeps immutable), the
	// Sandbox's own metadata (which the controller annotates later).
	createOnly bool
}

func helperOf(s *corev1.PodSpec) *corev1.Container {
	for i := range s.Containers {
		if s.Containers[i].Name == k8s.HelperContainer {
			return &s.Containers[i]
		}
	}
	panic("no helper")
}

func workloadSC(s *corev1.PodSpec) *corev1.SecurityContext {
	if s.Containers[0].SecurityContext == nil {
		s.Containers[0].SecurityContext = &corev1.SecurityContext{}
	}
	return s.Containers[0].SecurityContext
}

func podSC(s *corev1.PodSpec) *corev1.PodSecurityContext {
	if s.SecurityContext == nil {
		s.SecurityContext = &corev1.PodSecurityContext{}
	}
	return s.SecurityContext
}

func addVolume(src corev1.VolumeSource) func(*corev1.PodSpec) {
	return func(s *corev1.PodSpec) {
		s.Volumes = append(s.Volumes, corev1.Volume{Name: "extra", VolumeSource: src})
		s.Containers[0].VolumeMounts = append(s.Containers[0].VolumeMounts, corev1.VolumeMount{Name: "extra", MountPath: "/extra"})
	}
}

func addEnv(src *corev1.EnvVarSource) func(*corev1.PodSpec) {
	return func(s *corev1.PodSpec) {
		s.Containers[0].Env = append(s.Containers[0].Env, corev1.EnvVar{Name: "STOLEN", ValueFrom: src})
	}
}

func addClaim(mutate func(*v1beta1.PersistentVolumeClaimTemplate)) func(*v1beta1.Sandbox) {
	return func(sb *v1beta1.Sandbox) { mutate(&sb.Spec.VolumeClaimTemplates[0]) }
}

// volumeEscapes are every volume source but the two hiloop renders (and
// the projected service account token, which its own rule refuses).
var volumeEscapes = []escape{
	{name: "hostPath", spec: addVolume(corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/"}}), pss: true},
	{name: "emptyDir", spec: addVolume(corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}})},
	{name: "gitRepo", spec: addVolume(corev1.VolumeSource{GitRepo: &corev1.GitRepoVolumeSource{Repository: "https://example.com/x.git"}})},
	{name: "nfs", spec: addVolume(corev1.VolumeSource{NFS: &corev1.NFSVolumeSource{Server: "198.51.100.1", Path: "/"}})},
	{name: "iscsi", spec: addVolume(corev1.VolumeSource{ISCSI: &corev1.ISCSIVolumeSource{TargetPortal: "198.51.100.1:3260", IQN: "iqn.2001-04.com.example:x", Lun: 0}})},
	{name: "flexVolume", spec: addVolume(corev1.VolumeSource{FlexVolume: &corev1.FlexVolumeSource{Driver: "example.com/x"}})},
	{name: "inline csi", spec: addVolume(corev1.VolumeSource{CSI: &corev1.CSIVolumeSource{Driver: "x.example.com"}})},
	{name: "generic ephemeral", spec: addVolume(corev1.VolumeSource{Ephemeral: &corev1.EphemeralVolumeSource{VolumeClaimTemplate: &corev1.PersistentVolumeClaimTemplate{
		Spec: corev1.PersistentVolumeClaimSpec{AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("100Ti")}}}}}})},
	{name: "secret", spec: addVolume(corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: "x"}})},
	{name: "configMap", spec: addVolume(corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: "x"}}})},
	{name: "image", spec: addVolume(corev1.VolumeSource{Image: &corev1.ImageVolumeSource{Reference: "busybox"}})},
	{name: "another downwardAPI", spec: addVolume(corev1.VolumeSource{DownwardAPI: &corev1.DownwardAPIVolumeSource{
		Items: []corev1.DownwardAPIVolumeFile{{Path: "name", FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.name"}}}}})},
	{name: "a second item in the key volume", spec: func(s *corev1.PodSpec) {
		d := s.Volumes[0].DownwardAPI
		d.Items = append(d.Items, corev1.DownwardAPIVolumeFile{Path: "labels", FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.labels"}})
	}},
	{name: "the key volume made an emptyDir", spec: func(s *corev1.PodSpec) {
		s.Volumes[0].VolumeSource = corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}
	}},
	{name: "projected configMap", spec: addVolume(corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{Sources: []corev1.VolumeProjection{
		{ConfigMap: &corev1.ConfigMapProjection{LocalObjectReference: corev1.LocalObjectReference{Name: "x"}}}}}})},
	{name: "projected secret", spec: addVolume(corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{Sources: []corev1.VolumeProjection{
		{Secret: &corev1.SecretProjection{LocalObjectReference: corev1.LocalObjectReference{Name: "x"}}}}}})},
	{name: "projected clusterTrustBundle", spec: addVolume(corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{Sources: []corev1.VolumeProjection{
		{ClusterTrustBundle: &corev1.ClusterTrustBundleProjection{Name: ptr.To("x"), Path: "ca.pem"}}}}})},
	{name: "projected podCertificate", spec: addVolume(corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{Sources: []corev1.VolumeProjection{
		{PodCertificate: &corev1.PodCertificateProjection{SignerName: "example.com/x", KeyType: "ED25519", CredentialBundlePath: "creds.pem"}}}}})},
	{name: "rbd", spec: addVolume(corev1.VolumeSource{RBD: &corev1.RBDVolumeSource{CephMonitors: []string{"198.51.100.1"}, RBDImage: "x"}})},
	{name: "cephfs", spec: addVolume(corev1.VolumeSource{CephFS: &corev1.CephFSVolumeSource{Monitors: []string{"198.51.100.1"}}})},
	{name: "glusterfs", spec: addVolume(corev1.VolumeSource{Glusterfs: &corev1.GlusterfsVolumeSource{EndpointsName: "x", Path: "y"}})},
	{name: "fc", spec: addVolume(corev1.VolumeSource{FC: &corev1.FCVolumeSource{TargetWWNs: []string{"500a0982991b8dc5"}, Lun: ptr.To(int32(0))}})},
	{name: "azureFile", spec: addVolume(corev1.VolumeSource{AzureFile: &corev1.AzureFileVolumeSource{SecretName: "x", ShareName: "y"}})},
	{name: "awsElasticBlockStore", spec: addVolume(corev1.VolumeSource{AWSElasticBlockStore: &corev1.AWSElasticBlockStoreVolumeSource{VolumeID: "x"}})},
	{name: "gcePersistentDisk", spec: addVolume(corev1.VolumeSource{GCEPersistentDisk: &corev1.GCEPersistentDiskVolumeSource{PDName: "x"}})},
	{name: "another sandbox's claim", spec: func(s *corev1.PodSpec) {
		// The pod has its claim volume already; the template has none.
		for i := range s.Volumes {
			if s.Volumes[i].PersistentVolumeClaim != nil {
				s.Volumes[i].PersistentVolumeClaim.ClaimName = "data-sbx-victim"
				return
			}
		}
		s.Volumes = append(s.Volumes, corev1.Volume{Name: "data", VolumeSource: corev1.VolumeSource{
			PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: "data-sbx-victim"}}})
	}},
}

// escapes are the shapes a pod spec must not take.
var escapes = append([]escape{
	{name: "no runtime class", rule: "runtime-class", spec: func(s *corev1.PodSpec) { s.RuntimeClassName = nil }},
	{name: "another runtime class", rule: "runtime-class", spec: func(s *corev1.PodSpec) { s.RuntimeClassName = ptr.To("runc") }},
	{name: "hostNetwork", rule: "host-namespaces", spec: func(s *corev1.PodSpec) { s.HostNetwork = true }, pss: true},
	{name: "hostPID", rule: "host-namespaces", spec: func(s *corev1.PodSpec) { s.HostPID = true }, pss: true},
	{name: "hostIPC", rule: "host-namespaces", spec: func(s *corev1.PodSpec) { s.HostIPC = true }, pss: true},
	{name: "Windows HostProcess", rule: "host-process", spec: func(s *corev1.PodSpec) {
		workloadSC(s).WindowsOptions = &corev1.WindowsSecurityContextOptions{HostProcess: ptr.To(true)}
	}, pss: true, invalid: true},
	{name: "token automount unset", rule: "service-account-token", spec: func(s *corev1.PodSpec) { s.AutomountServiceAccountToken = nil }},
	{name: "token automounted", rule: "service-account-token", spec: func(s *corev1.PodSpec) { s.AutomountServiceAccountToken = ptr.To(true) }},
	{name: "token projected by hand", rule: "service-account-token", spec: addVolume(corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{
		Sources: []corev1.VolumeProjection{{ServiceAccountToken: &corev1.ServiceAccountTokenProjection{Path: "token"}}}}})},
	{name: "privileged workload", rule: "privileged", spec: func(s *corev1.PodSpec) { workloadSC(s).Privileged = ptr.To(true) }, pss: true},
	{name: "privileged helper", rule: "privileged", spec: func(s *corev1.PodSpec) {
		helperOf(s).SecurityContext.Privileged = ptr.To(true)
		helperOf(s).SecurityContext.AllowPrivilegeEscalation = ptr.To(true)
	}, pss: true},
	{name: "privileged init container", rule: "privileged", spec: func(s *corev1.PodSpec) {
		s.InitContainers = []corev1.Container{{Name: "init", Image: "busybox", SecurityContext: &corev1.SecurityContext{Privileged: ptr.To(true)}}}
	}, pss: true},
	{name: "privileged ephemeral container", rule: "privileged", spec: func(s *corev1.PodSpec) {
		s.EphemeralContainers = []corev1.EphemeralContainer{{EphemeralContainerCommon: corev1.EphemeralContainerCommon{
			Name: "debug", Image: "busybox", SecurityContext: &corev1.SecurityContext{Privileged: ptr.To(true)}}}}
	}, pss: true, invalid: true},
	{name: "SYS_ADMIN added", rule: "capabilities", spec: func(s *corev1.PodSpec) {
		workloadSC(s).Capabilities = &corev1.Capabilities{Add: []corev1.Capability{"SYS_ADMIN"}}
	}, pss: true},
	{name: "NET_RAW added to an init container", rule: "capabilities", spec: func(s *corev1.PodSpec) {
		s.InitContainers = []corev1.Container{{Name: "init", Image: "busybox", SecurityContext: &corev1.SecurityContext{
			Capabilities: &corev1.Capabilities{Add: []corev1.Capability{"NET_RAW"}}}}}
	}, pss: true},
	{name: "hostPort", rule: "host-ports", spec: func(s *corev1.PodSpec) {
		s.Containers[0].Ports = []corev1.ContainerPort{{ContainerPort: 80, HostPort: 80}}
	}, pss: true},
	{name: "probe of the metadata service", rule: "probe-host", spec: func(s *corev1.PodSpec) {
		s.Containers[0].LivenessProbe = &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{
			Host: "169.254.169.254", Path: "/computeMetadata/v1/", Port: intstr.FromInt32(80)}}}
	}, pss: true},
	{name: "preStop hook to the API server", rule: "probe-host", spec: func(s *corev1.PodSpec) {
		s.Containers[0].Lifecycle = &corev1.Lifecycle{PreStop: &corev1.LifecycleHandler{TCPSocket: &corev1.TCPSocketAction{Host: "10.96.0.1", Port: intstr.FromInt32(443)}}}
	}, pss: true},
	{name: "pod seccomp Unconfined", rule: "seccomp", spec: func(s *corev1.PodSpec) {
		podSC(s).SeccompProfile = &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeUnconfined}
	}, pss: true},
	{name: "container seccomp Unconfined", rule: "seccomp", spec: func(s *corev1.PodSpec) {
		workloadSC(s).SeccompProfile = &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeUnconfined}
	}, pss: true},
	{name: "pod AppArmor Unconfined", rule: "apparmor", spec: func(s *corev1.PodSpec) {
		podSC(s).AppArmorProfile = &corev1.AppArmorProfile{Type: corev1.AppArmorProfileTypeUnconfined}
	}, pss: true},
	{name: "container AppArmor Unconfined", rule: "apparmor", spec: func(s *corev1.PodSpec) {
		workloadSC(s).AppArmorProfile = &corev1.AppArmorProfile{Type: corev1.AppArmorProfileTypeUnconfined}
	}, pss: true},
	{name: "SELinux spc_t", rule: "selinux", spec: func(s *corev1.PodSpec) {
		workloadSC(s).SELinuxOptions = &corev1.SELinuxOptions{Type: "spc_t"}
	}, pss: true},
	{name: "SELinux user on the pod", rule: "selinux", spec: func(s *corev1.PodSpec) {
		podSC(s).SELinuxOptions = &corev1.SELinuxOptions{User: "system_u"}
	}, pss: true},
	{name: "procMount Unmasked", rule: "proc-mount", spec: func(s *corev1.PodSpec) {
		s.HostUsers = ptr.To(false)
		workloadSC(s).ProcMount = ptr.To(corev1.UnmaskedProcMount)
	}, pss: true},
	{name: "unsafe sysctl", rule: "sysctls", spec: func(s *corev1.PodSpec) {
		podSC(s).Sysctls = []corev1.Sysctl{{Name: "kernel.msgmax", Value: "65536"}}
	}, pss: true},
	{name: "a subPath", rule: "volume-mounts", spec: func(s *corev1.PodSpec) {
		helperOf(s).VolumeMounts[0].SubPath = "gateway.pub"
	}},
	{name: "a subPathExpr", rule: "volume-mounts", spec: func(s *corev1.PodSpec) {
		s.Containers[0].VolumeMounts[0].SubPathExpr = "$(POD)"
		s.Containers[0].Env = []corev1.EnvVar{{Name: "POD", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.name"}}}}
	}},
	{name: "mount propagation from the host", rule: "volume-mounts", spec: func(s *corev1.PodSpec) {
		s.Containers[0].VolumeMounts[0].MountPropagation = ptr.To(corev1.MountPropagationHostToContainer)
	}},
	{name: "env from a Secret", rule: "env", spec: addEnv(&corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{
		LocalObjectReference: corev1.LocalObjectReference{Name: "x"}, Key: "k"}})},
	{name: "env from a ConfigMap", rule: "env", spec: addEnv(&corev1.EnvVarSource{ConfigMapKeyRef: &corev1.ConfigMapKeySelector{
		LocalObjectReference: corev1.LocalObjectReference{Name: "x"}, Key: "k"}})},
	{name: "env from the node's address", rule: "env", spec: addEnv(&corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "status.hostIP"}})},
	// The workload's env is plain values only, as hiloop renders a
	// sandbox's env: not even its own pod's metadata or resources.
	{name: "env from the pod's own metadata in the workload", rule: "env", spec: addEnv(&corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.name"}})},
	{name: "env from a resource field", rule: "env", spec: addEnv(&corev1.EnvVarSource{ResourceFieldRef: &corev1.ResourceFieldSelector{Resource: "limits.memory"}})},
	{name: "env from a Secret in the helper", rule: "env", spec: func(s *corev1.PodSpec) {
		h := helperOf(s)
		h.Env = append(h.Env, corev1.EnvVar{Name: "STOLEN", ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{
			LocalObjectReference: corev1.LocalObjectReference{Name: "x"}, Key: "k"}}})
	}},
	{name: "env from a resource field in the helper", rule: "env", spec: func(s *corev1.PodSpec) {
		h := helperOf(s)
		h.Env = append(h.Env, corev1.EnvVar{Name: "MEM", ValueFrom: &corev1.EnvVarSource{ResourceFieldRef: &corev1.ResourceFieldSelector{Resource: "limits.memory"}}})
	}},
	{name: "envFrom a Secret", rule: "env", spec: func(s *corev1.PodSpec) {
		s.Containers[0].EnvFrom = []corev1.EnvFromSource{{SecretRef: &corev1.SecretEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: "x"}}}}
	}},
	{name: "envFrom a ConfigMap in the helper", rule: "env", spec: func(s *corev1.PodSpec) {
		helperOf(s).EnvFrom = []corev1.EnvFromSource{{ConfigMapRef: &corev1.ConfigMapEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: "x"}}}}
	}},
	// The helper's exception is its own pod's metadata, nothing of the
	// node's, and only in the container named the helper: not in an init
	// container, whatever its name.
	{name: "env from the node's name in the helper", rule: "env", spec: func(s *corev1.PodSpec) {
		h := helperOf(s)
		h.Env = append(h.Env, corev1.EnvVar{Name: "NODE", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "spec.nodeName"}}})
	}},
	{name: "env from the node's address in the helper", rule: "env", spec: func(s *corev1.PodSpec) {
		h := helperOf(s)
		h.Env = append(h.Env, corev1.EnvVar{Name: "NODE", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "status.hostIP"}}})
	}},
	{name: "env from a Secret beside the helper's metadata", rule: "env", invalid: true, spec: func(s *corev1.PodSpec) {
		h := helperOf(s)
		h.Env[0].ValueFrom.SecretKeyRef = &corev1.SecretKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "x"}, Key: "k"}
	}},
	{name: "a value and a Secret on one variable", rule: "env", invalid: true, spec: func(s *corev1.PodSpec) {
		s.Containers[0].Env = append(s.Containers[0].Env, corev1.EnvVar{Name: "STOLEN", Value: "v", ValueFrom: &corev1.EnvVarSource{
			SecretKeyRef: &corev1.SecretKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "x"}, Key: "k"}}})
	}},
	{name: "env from a Secret in an init container", rule: "env", spec: func(s *corev1.PodSpec) {
		s.InitContainers = []corev1.Container{{Name: "init", Image: "busybox", Env: []corev1.EnvVar{{Name: "STOLEN", ValueFrom: &corev1.EnvVarSource{
			SecretKeyRef: &corev1.SecretKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "x"}, Key: "k"}}}}}}
	}},
	{name: "envFrom a Secret in an init container", rule: "env", spec: func(s *corev1.PodSpec) {
		s.InitContainers = []corev1.Container{{Name: "init", Image: "busybox",
			EnvFrom: []corev1.EnvFromSource{{SecretRef: &corev1.SecretEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: "x"}}}}}}
	}},
	{name: "env from the pod's metadata in an init container", rule: "env", spec: func(s *corev1.PodSpec) {
		s.InitContainers = []corev1.Container{{Name: "init", Image: "busybox", Env: []corev1.EnvVar{{Name: "POD", ValueFrom: &corev1.EnvVarSource{
			FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.name"}}}}}}
	}},
	{name: "a resource claim", rule: "devices", spec: func(s *corev1.PodSpec) {
		s.ResourceClaims = []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimName: ptr.To("gpu")}}
		s.Containers[0].Resources.Claims = []corev1.ResourceClaim{{Name: "gpu"}}
	}},
	{name: "a raw block device", rule: "devices", spec: func(s *corev1.PodSpec) {
		s.Containers[0].VolumeMounts = nil
		s.Containers[0].VolumeDevices = []corev1.VolumeDevice{{Name: "data", DevicePath: "/dev/xvda"}}
	}},
	{name: "nodeName", rule: "node-name", spec: func(s *corev1.PodSpec) { s.NodeName = "kwok-node-0" }},
	{name: "system-node-critical", rule: "priority-class", spec: func(s *corev1.PodSpec) { s.PriorityClassName = "system-node-critical" }},
	{name: "tolerate everything", rule: "tolerations", spec: func(s *corev1.PodSpec) {
		s.Tolerations = []corev1.Toleration{{Operator: corev1.TolerationOpExists}}
	}},
	{name: "tolerate the control plane", rule: "tolerations", spec: func(s *corev1.PodSpec) {
		s.Tolerations = []corev1.Toleration{{Key: "node-role.kubernetes.io/control-plane", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule}}
	}},
	{name: "not-ready tolerated without NoExecute", rule: "tolerations", spec: func(s *corev1.PodSpec) {
		s.Tolerations = []corev1.Toleration{{Key: "node.kubernetes.io/not-ready", Operator: corev1.TolerationOpExists}}
	}},
	{name: "control-plane nodeSelector", rule: "node-selector", spec: func(s *corev1.PodSpec) {
		s.NodeSelector = map[string]string{"node-role.kubernetes.io/control-plane": ""}
	}},
	{name: "shareProcessNamespace", rule: "share-process-namespace", spec: func(s *corev1.PodSpec) { s.ShareProcessNamespace = ptr.To(true) }},
	{name: "node affinity", rule: "pod-fields", spec: func(s *corev1.PodSpec) {
		s.Affinity = &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{
			NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{{
				Key: "node-role.kubernetes.io/control-plane", Operator: corev1.NodeSelectorOpExists}}}}}}}
	}},
	{name: "pod affinity to a victim", rule: "pod-fields", spec: func(s *corev1.PodSpec) {
		s.Affinity = &corev1.Affinity{PodAffinity: &corev1.PodAffinity{RequiredDuringSchedulingIgnoredDuringExecution: []corev1.PodAffinityTerm{{
			LabelSelector: &metav1.LabelSelector{MatchLabels: map[string]string{k8s.LabelSandbox: "sbx_victim"}}, TopologyKey: "kubernetes.io/hostname"}}}}
	}},
	{name: "another scheduler", rule: "pod-fields", spec: func(s *corev1.PodSpec) { s.SchedulerName = "evil-scheduler" }},
	{name: "imagePullSecrets", rule: "pod-fields", spec: func(s *corev1.PodSpec) {
		s.ImagePullSecrets = []corev1.LocalObjectReference{{Name: "registry"}}
	}},
	{name: "the node's DNS", rule: "pod-fields", spec: func(s *corev1.PodSpec) { s.DNSPolicy = corev1.DNSDefault }},
	{name: "hostAliases", rule: "pod-fields", spec: func(s *corev1.PodSpec) {
		s.HostAliases = []corev1.HostAlias{{IP: "198.51.100.1", Hostnames: []string{"api.example.com"}}}
	}},
	{name: "a sidecar init container", rule: "container-fields", spec: func(s *corev1.PodSpec) {
		s.InitContainers = []corev1.Container{{Name: "sidecar", Image: "busybox", RestartPolicy: ptr.To(corev1.ContainerRestartPolicyAlways)}}
	}},
	{name: "helper with a writable root", rule: "helper-hardened", spec: func(s *corev1.PodSpec) {
		helperOf(s).SecurityContext.ReadOnlyRootFilesystem = ptr.To(false)
	}},
	{name: "helper that may escalate", rule: "helper-hardened", spec: func(s *corev1.PodSpec) {
		helperOf(s).SecurityContext.AllowPrivilegeEscalation = ptr.To(true)
	}},
	{name: "helper as root", rule: "helper-hardened", spec: func(s *corev1.PodSpec) { helperOf(s).SecurityContext.RunAsUser = ptr.To(int64(0)) }},
	{name: "helper with a baseline capability", rule: "helper-hardened", spec: func(s *corev1.PodSpec) {
		helperOf(s).SecurityContext.Capabilities.Add = []corev1.Capability{"CHOWN"}
	}},
	{name: "helper without seccomp", rule: "helper-hardened", spec: func(s *corev1.PodSpec) { helperOf(s).SecurityContext.SeccompProfile = nil }},

	// The Sandbox's own fields.
	{name: "a name not hiloop's", rule: "sandbox-name", sandbox: func(sb *v1beta1.Sandbox) { sb.Name = "victim" }, createOnly: true},
	{name: "the controller's pod-name annotation", rule: "sandbox-metadata", createOnly: true, sandbox: func(sb *v1beta1.Sandbox) {
		sb.Annotations = map[string]string{"agents.x-k8s.io/pod-name": "sbx-victim"}
	}},
	{name: "a warm pool's label", rule: "sandbox-metadata", createOnly: true, sandbox: func(sb *v1beta1.Sandbox) {
		sb.Labels = maps.Clone(sb.Labels)
		sb.Labels["agents.x-k8s.io/warm-pool-sandbox"] = "pool"
	}},
	{name: "an owner", rule: "sandbox-metadata", createOnly: true, sandbox: func(sb *v1beta1.Sandbox) {
		sb.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "ConfigMap", Name: "x", UID: "00000000-0000-0000-0000-000000000000"}}
	}},
	{name: "a Service", rule: "sandbox-fields", sandbox: func(sb *v1beta1.Sandbox) { sb.Spec.Service = ptr.To(true) }},
	{name: "a gVisor annotation on the template", rule: "pod-metadata", sandbox: func(sb *v1beta1.Sandbox) {
		sb.Spec.PodTemplate.ObjectMeta.Annotations["dev.gvisor.spec.mount.host.source"] = "/"
	}},
	{name: "AppArmor unconfined by annotation", rule: "apparmor", sandbox: func(sb *v1beta1.Sandbox) {
		sb.Spec.PodTemplate.ObjectMeta.Annotations["container.apparmor.security.beta.kubernetes.io/workload"] = "unconfined"
	}},
	{name: "a label not hiloop's on the template", rule: "pod-metadata", sandbox: func(sb *v1beta1.Sandbox) {
		sb.Spec.PodTemplate.ObjectMeta.Labels["agents.x-k8s.io/adoptable"] = "true"
	}},
	{name: "nine claims", rule: "claim-size", createOnly: true, sandbox: func(sb *v1beta1.Sandbox) {
		for i := range 8 {
			c := *sb.Spec.VolumeClaimTemplates[0].DeepCopy()
			c.Name = fmt.Sprintf("more%d", i)
			sb.Spec.VolumeClaimTemplates = append(sb.Spec.VolumeClaimTemplates, c)
		}
	}},
	{name: "a 100Ti claim", rule: "claim-size", createOnly: true, sandbox: addClaim(func(c *v1beta1.PersistentVolumeClaimTemplate) {
		c.Spec.Resources.Requests[corev1.ResourceStorage] = resource.MustParse("100Ti")
	})},
	{name: "a claim with limits", rule: "claim-size", createOnly: true, sandbox: addClaim(func(c *v1beta1.PersistentVolumeClaimTemplate) {
		c.Spec.Resources.Limits = corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("100Ti")}
	})},
	{name: "a storage class not allowed", rule: "storage-class", createOnly: true, sandbox: addClaim(func(c *v1beta1.PersistentVolumeClaimTemplate) {
		c.Spec.StorageClassName = ptr.To("fast")
	})},
	{name: "the empty storage class", rule: "storage-class", createOnly: true, sandbox: addClaim(func(c *v1beta1.PersistentVolumeClaimTemplate) {
		c.Spec.StorageClassName = ptr.To("")
	})},
	{name: "a claim in place of the key volume", rule: "claim-templates", createOnly: true, sandbox: addClaim(func(c *v1beta1.PersistentVolumeClaimTemplate) {
		// The controller would mount the claim where the helper's key is.
		c.Name = k8s.GatewayKeyVolume
	})},
	{name: "a claim bound to a volume by name", rule: "claim-templates", createOnly: true, sandbox: addClaim(func(c *v1beta1.PersistentVolumeClaimTemplate) {
		c.Spec.VolumeName = "pv-of-another-tenant"
	})},
	{name: "a claim from a snapshot", rule: "claim-templates", createOnly: true, sandbox: addClaim(func(c *v1beta1.PersistentVolumeClaimTemplate) {
		c.Spec.DataSource = &corev1.TypedLocalObjectReference{APIGroup: ptr.To("snapshot.storage.k8s.io"), Kind: "VolumeSnapshot", Name: "x"}
	})},
	{name: "a claim cloned from another claim", rule: "claim-templates", createOnly: true, sandbox: addClaim(func(c *v1beta1.PersistentVolumeClaimTemplate) {
		c.Spec.DataSourceRef = &corev1.TypedObjectReference{Kind: "PersistentVolumeClaim", Name: "data-sbx-victim"}
	})},
	{name: "a claim selecting volumes", rule: "claim-templates", createOnly: true, sandbox: addClaim(func(c *v1beta1.PersistentVolumeClaimTemplate) {
		c.Spec.Selector = &metav1.LabelSelector{MatchLabels: map[string]string{"tenant": "victim"}}
	})},
	{name: "a block claim", rule: "claim-templates", createOnly: true, sandbox: addClaim(func(c *v1beta1.PersistentVolumeClaimTemplate) {
		c.Spec.VolumeMode = ptr.To(corev1.PersistentVolumeBlock)
	})},
	{name: "an annotated claim", rule: "claim-templates", createOnly: true, sandbox: addClaim(func(c *v1beta1.PersistentVolumeClaimTemplate) {
		c.Annotations = map[string]string{"volume.kubernetes.io/selected-node": "control-plane"}
	})},
	{name: "an adoptable claim", rule: "claim-templates", createOnly: true, sandbox: addClaim(func(c *v1beta1.PersistentVolumeClaimTemplate) {
		// Render shares one label map among the Sandbox, its template and
		// its claims.
		c.Labels = maps.Clone(c.Labels)
		c.Labels["agents.x-k8s.io/adoptable"] = "true"
	})},

	// A pod's own.
	{name: "an annotation not hiloop's", rule: "pod-metadata", pod: func(p *corev1.Pod) { p.Annotations["io.kubernetes.cri-o.userns-mode"] = "host" }},
	{name: "a claim named for another pod", rule: "volumes", pod: func(p *corev1.Pod) {
		p.Name = "victim"
		for i := range p.Spec.Volumes {
			if pvc := p.Spec.Volumes[i].PersistentVolumeClaim; pvc != nil {
				pvc.ClaimName = p.Spec.Volumes[i].Name + "-victim"
			}
		}
	}},
}, volumeEscapesWithRule()...)

func volumeEscapesWithRule() []escape {
	out := make([]escape, len(volumeEscapes))
	for i, e := range volumeEscapes {
		e.name, e.rule = "volume "+e.name, "volumes"
		out[i] = e
	}
	return out
}

// refusedBy reports whether err is a refusal by the policy naming the rule.
func refusedBy(err error, policy, rule string) bool {
	return err != nil && apierrors.IsInvalid(err) && strings.Contains(err.Error(), "'"+policy+"'") && strings.Contains(err.Error(), "["+rule+"]")
}

// mergePatch is the JSON merge patch that turns from into to: changed
// values replaced, removed keys null, lists whole.
func mergePatch(t *testing.T, from, to any) []byte {
	t.Helper()
	asMap := func(v any) map[string]any {
		b, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		var m map[string]any
		if err := json.Unmarshal(b, &m); err != nil {
			t.Fatal(err)
		}
		return m
	}
	var diff func(a, b map[string]any) map[string]any
	diff = func(a, b map[string]any) map[string]any {
		out := map[string]any{}
		for k, bv := range b {
			av, ok := a[k]
			if ok && reflect.DeepEqual(av, bv) {
				continue
			}
			am, aok := av.(map[string]any)
			bm, bok := bv.(map[string]any)
			if ok && aok && bok {
				out[k] = diff(am, bm)
				continue
			}
			out[k] = bv
		}
		for k := range a {
			if _, ok := b[k]; !ok {
				out[k] = nil
			}
		}
		return out
	}
	b, err := json.Marshal(diff(asMap(from), asMap(to)))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// podOf is the pod the agent-sandbox controller makes of a Sandbox: its
// name, the template's labels and annotations with the controller's own,
// and the template's spec with a claim volume per claim template.
func podOf(sb *v1beta1.Sandbox) *corev1.Pod {
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: sb.Name, Namespace: sb.Namespace,
		Labels: map[string]string{"agents.x-k8s.io/sandbox-name-hash": "c3e87006"}, Annotations: map[string]string{
			"agents.x-k8s.io/propagated-labels": "app.kubernetes.io/managed-by,hiloop.dev/org,hiloop.dev/sandbox"}},
		Spec: *sb.Spec.PodTemplate.Spec.DeepCopy()}
	for k, v := range sb.Spec.PodTemplate.ObjectMeta.Labels {
		p.Labels[k] = v
	}
	for k, v := range sb.Spec.PodTemplate.ObjectMeta.Annotations {
		p.Annotations[k] = v
	}
	for _, c := range sb.Spec.VolumeClaimTemplates {
		p.Spec.Volumes = append(p.Spec.Volumes, corev1.Volume{Name: c.Name, VolumeSource: corev1.VolumeSource{
			PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: c.Name + "-" + sb.Name}}})
	}
	return p
}

// liftPodSecurity removes the namespace's Pod Security labels and waits
// until Pod Security no longer refuses there, so that what refuses a pod
// afterwards is hiloop's policy alone.
func liftPodSecurity(t *testing.T, ns string, probe func() error) {
	t.Helper()
	e2e.Kubectl(t, "label", "namespace", ns, "pod-security.kubernetes.io/enforce-", "pod-security.kubernetes.io/enforce-version-",
		"pod-security.kubernetes.io/audit-", "pod-security.kubernetes.io/audit-version-",
		"pod-security.kubernetes.io/warn-", "pod-security.kubernetes.io/warn-version-")
	eventually.Within(t, "Pod Security lifted", 30*time.Second, func() (bool, error) {
		err := probe()
		return err != nil && !strings.Contains(err.Error(), "PodSecurity"), err
	})
}

// TestAdmissionDeniesEscapes sends every escape shape to the real API
// server with the chart's policies installed (server-side dry runs: admission
// runs, nothing is stored): as a Sandbox created by hiloop's
// ServiceAccount, as a merge patch of a conforming Sandbox by it, and as a
// pod created in the namespace. Each is refused by hiloop's own policy,
// naming the rule; then once more with the namespace's Pod Security labels
// lifted, so that no refusal rests on Pod Security alone. The conforming
// shapes hiloop renders pass.
func TestAdmissionDeniesEscapes(t *testing.T) {
	ns := e2e.NewNamespace(t)
	ctx := context.Background()
	admin := quietAdmin(t)
	hiloop := asHiloop(t)
	dryCreate := metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}
	dryPatch := metav1.PatchOptions{DryRun: []string{metav1.DryRunAll}}
	// The other runtime class exists, so that it is the policy that refuses
	// it, not the RuntimeClass admission plugin.
	rc := &nodev1.RuntimeClass{ObjectMeta: metav1.ObjectMeta{Name: "runc"}, Handler: "runc"}
	if _, err := admin.Kube.NodeV1().RuntimeClasses().Create(ctx, rc, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	opts := k8s.RenderOptions{Namespace: ns, RuntimeClass: k8s.DefaultRuntimeClass,
		Transports: []receipt.Transport{receipt.TransportExec, receipt.TransportForward}, AgentImage: "hiloop/hiloop:test"}
	gatewayKey := "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIA== gateway"
	// Every conforming shape has an environment, as a sandbox created
	// with env renders it: plain values, one of them escaped for the
	// kubelet's $(...) expansion.
	record := func(id string, transports []receipt.Transport, volumes ...store.Volume) store.Sandbox {
		return store.Sandbox{ID: id, OrgID: "org_admission", DesiredMode: store.ModeRunning,
			Spec: store.Spec{Image: "busybox", Transports: transports, Volumes: volumes, ShutdownPolicy: "retain",
				Env: map[string]string{"PLAIN": "value", "REF": "$(PLAIN)", "EMPTY": ""}}}
	}
	withHelper := []receipt.Transport{receipt.TransportExec, receipt.TransportForward}
	data := store.Volume{Name: "data", Size: "1Gi", MountPath: "/data"}
	render := func(sb store.Sandbox) *v1beta1.Sandbox {
		o := opts
		o.GatewayKey = gatewayKey
		obj, err := k8s.Render(sb, o)
		if err != nil {
			t.Fatal(err)
		}
		return obj
	}

	// The conforming shapes, created for real by hiloop's account through
	// hiloop's own writer: the controller makes their pods, which the pod
	// policy must admit.
	w, err := k8s.NewWriter(hiloop, opts)
	if err != nil {
		t.Fatal(err)
	}
	target := record("sbx_admission", withHelper, data, store.Volume{Name: "cache", Size: "2Gi", MountPath: "/cache", StorageClass: "kwok-volume"})
	for _, sb := range []store.Sandbox{target, record("sbx_admissionbare", []receipt.Transport{receipt.TransportExec}),
		record("sbx_admissionhelper", withHelper)} {
		if err := w.Create(ctx, sb, gatewayKey); err != nil {
			t.Fatalf("a conforming Sandbox (%s) is refused: %v", sb.ID, err)
		}
	}
	livePod := func(id string) *corev1.Pod {
		var pod *corev1.Pod
		eventually.Within(t, "pod of "+id+" running", 60*time.Second, func() (bool, error) {
			p, err := admin.Kube.CoreV1().Pods(ns).Get(ctx, k8s.ObjectName(id), metav1.GetOptions{})
			if err != nil {
				return false, err
			}
			pod = p
			return k8s.PodReady(p) && p.DeletionTimestamp == nil, fmt.Errorf("phase %s", p.Status.Phase)
		})
		return pod
	}
	for _, id := range []string{"sbx_admission", "sbx_admissionbare", "sbx_admissionhelper"} {
		livePod(id)
	}

	// Every patch hiloop makes, by its account: stop, start, expiry,
	// annotate, gateway key rotation. The controller's pod of the started
	// sandbox and its metadata updates pass the pod policy.
	first := livePod("sbx_admission")
	if err := w.SetMode(ctx, "sbx_admission", store.ModeStopped); err != nil {
		t.Fatalf("stop: %v", err)
	}
	eventually.Within(t, "pod gone after stop", 60*time.Second, func() (bool, error) {
		_, err := admin.Kube.CoreV1().Pods(ns).Get(ctx, k8s.ObjectName("sbx_admission"), metav1.GetOptions{})
		return apierrors.IsNotFound(err), err
	})
	if err := w.SetMode(ctx, "sbx_admission", store.ModeRunning); err != nil {
		t.Fatalf("start: %v", err)
	}
	if second := livePod("sbx_admission"); second.UID == first.UID {
		t.Fatal("the started sandbox kept its old pod")
	}
	if err := w.SetExpiry(ctx, "sbx_admission", time.Now().Add(time.Hour)); err != nil {
		t.Fatalf("expiry: %v", err)
	}
	if err := w.Annotate(ctx, "sbx_admission", k8s.AnnotationGatewayKey, "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIB== annotated"); err != nil {
		t.Fatalf("annotate: %v", err)
	}
	n, err := w.RotateGatewayKey(ctx, cluster.DefaultTimeout, func(id string) (string, error) { return "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIC== " + id, nil })
	if err != nil || n != 2 {
		t.Fatalf("rotation: %d patched, %v", n, err)
	}
	eventually.Within(t, "rotated key on the live pod", 30*time.Second, func() (bool, error) {
		p, err := admin.Kube.CoreV1().Pods(ns).Get(ctx, k8s.ObjectName("sbx_admission"), metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		return p.Annotations[k8s.AnnotationGatewayKey] == "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIC== sbx_admission", nil
	})

	current := func() *v1beta1.Sandbox {
		obj, err := admin.Sandbox.AgentsV1beta1().Sandboxes(ns).Get(ctx, "sbx-admission", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return obj
	}
	// The shapes as each way in sends them.
	createSandbox := func(e escape) error {
		obj := render(record("sbx_admissiondry", withHelper, data))
		if e.spec != nil {
			e.spec(&obj.Spec.PodTemplate.Spec)
		}
		if e.sandbox != nil {
			e.sandbox(obj)
		}
		_, err := hiloop.Sandbox.AgentsV1beta1().Sandboxes(ns).Create(ctx, obj, dryCreate)
		return err
	}
	updateSandbox := func(e escape) error {
		from := current()
		to := from.DeepCopy()
		if e.spec != nil {
			e.spec(&to.Spec.PodTemplate.Spec)
		}
		if e.sandbox != nil {
			e.sandbox(to)
		}
		_, err := hiloop.Sandbox.AgentsV1beta1().Sandboxes(ns).Patch(ctx, from.Name, types.MergePatchType, mergePatch(t, from, to), dryPatch)
		return err
	}
	createPod := func(e escape) error {
		pod := podOf(render(record("sbx_admissionpod", withHelper, data)))
		if e.spec != nil {
			e.spec(&pod.Spec)
		}
		if e.pod != nil {
			e.pod(pod)
		}
		_, err := admin.Kube.CoreV1().Pods(ns).Create(ctx, pod, dryCreate)
		return err
	}
	conforming := escape{name: "conforming"}
	for _, tc := range []struct {
		what string
		err  error
	}{
		{"Sandbox without the helper", func() error {
			_, err := hiloop.Sandbox.AgentsV1beta1().Sandboxes(ns).Create(ctx, render(record("sbx_admissionx", []receipt.Transport{receipt.TransportExec})), dryCreate)
			return err
		}()},
		{"Sandbox with the helper and a volume", createSandbox(conforming)},
		{"no-op patch", updateSandbox(conforming)},
		{"pod", createPod(conforming)},
	} {
		if tc.err != nil {
			t.Errorf("a conforming %s is refused: %v", tc.what, tc.err)
		}
	}

	run := func(t *testing.T, lifted bool) {
		for _, e := range escapes {
			t.Run(e.name, func(t *testing.T) {
				if e.spec != nil || e.sandbox != nil {
					if err := createSandbox(e); !refusedBy(err, boundary.PolicySandbox, e.rule) {
						t.Errorf("Sandbox create: want refused by %s [%s], got %v", boundary.PolicySandbox, e.rule, err)
					}
					if err := updateSandbox(e); !e.createOnly && !refusedBy(err, boundary.PolicySandbox, e.rule) {
						t.Errorf("Sandbox patch: want refused by %s [%s], got %v", boundary.PolicySandbox, e.rule, err)
					}
				}
				if e.spec == nil && e.pod == nil {
					return
				}
				err := createPod(e)
				switch {
				case e.invalid && apierrors.IsInvalid(err) && !strings.Contains(err.Error(), "ValidatingAdmissionPolicy"):
					// Refused by the API server's validation, before admission.
				case refusedBy(err, boundary.PolicyPod, e.rule):
				case e.pss && !lifted && err != nil && strings.Contains(err.Error(), "violates PodSecurity"):
				default:
					t.Errorf("pod: want refused by %s [%s], got %v", boundary.PolicyPod, e.rule, err)
				}
			})
		}
	}
	t.Run("under Pod Security", func(t *testing.T) { run(t, false) })
	privileged := escape{spec: func(s *corev1.PodSpec) { workloadSC(s).Privileged = ptr.To(true) }}
	liftPodSecurity(t, ns, func() error { return createPod(privileged) })
	t.Run("without Pod Security", func(t *testing.T) { run(t, true) })
}

// TestAdmissionPinsTheTemplate: after create, a Sandbox's spec changes only
// where hiloop's patches change it, whoever asks and however; hiloop's
// account writes only with the verbs hiloop uses; and pods of the namespace
// take no ephemeral container or toleration beyond the rules.
func TestAdmissionPinsTheTemplate(t *testing.T) {
	ns := e2e.NewNamespace(t)
	ctx := context.Background()
	admin := quietAdmin(t)
	hiloop := asHiloop(t)
	dryPatch := metav1.PatchOptions{DryRun: []string{metav1.DryRunAll}}
	opts := k8s.RenderOptions{Namespace: ns, RuntimeClass: k8s.DefaultRuntimeClass,
		Transports: []receipt.Transport{receipt.TransportExec, receipt.TransportForward}, AgentImage: "hiloop/hiloop:test"}
	w, err := k8s.NewWriter(hiloop, opts)
	if err != nil {
		t.Fatal(err)
	}
	const id, name = "sbx_pinned", "sbx-pinned"
	rec := store.Sandbox{ID: id, OrgID: "org_pinned", DesiredMode: store.ModeRunning, Spec: store.Spec{Image: "busybox",
		Transports: []receipt.Transport{receipt.TransportExec, receipt.TransportForward}, ShutdownPolicy: "retain",
		Volumes: []store.Volume{{Name: "data", Size: "1Gi", MountPath: "/data"}}}}
	if err := w.Create(ctx, rec, "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIA== gateway"); err != nil {
		t.Fatal(err)
	}
	sandboxes := func(cl *k8s.Clients) interface {
		Patch(context.Context, string, types.PatchType, []byte, metav1.PatchOptions, ...string) (*v1beta1.Sandbox, error)
	} {
		return cl.Sandbox.AgentsV1beta1().Sandboxes(ns)
	}
	current := func() *v1beta1.Sandbox {
		obj, err := admin.Sandbox.AgentsV1beta1().Sandboxes(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return obj
	}
	patchTo := func(cl *k8s.Clients, mutate func(*v1beta1.Sandbox), o metav1.PatchOptions) error {
		from := current()
		to := from.DeepCopy()
		mutate(to)
		_, err := sandboxes(cl).Patch(ctx, name, types.MergePatchType, mergePatch(t, from, to), o)
		return err
	}

	// Changes that keep the pod's shape but are not hiloop's, by hiloop's
	// account and by the cluster's admin: refused as [immutable].
	for _, tc := range []struct {
		name   string
		mutate func(*v1beta1.Sandbox)
	}{
		{"another image", func(sb *v1beta1.Sandbox) { sb.Spec.PodTemplate.Spec.Containers[0].Image = "evil:latest" }},
		{"another command", func(sb *v1beta1.Sandbox) { sb.Spec.PodTemplate.Spec.Containers[0].Command = []string{"/bin/evil"} }},
		{"a literal environment variable", func(sb *v1beta1.Sandbox) {
			sb.Spec.PodTemplate.Spec.Containers[0].Env = []corev1.EnvVar{{Name: "X", Value: "y"}}
		}},
		{"more memory", func(sb *v1beta1.Sandbox) {
			sb.Spec.PodTemplate.Spec.Containers[0].Resources.Limits = corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("1Ti")}
		}},
		{"the helper removed", func(sb *v1beta1.Sandbox) {
			sb.Spec.PodTemplate.Spec.Containers = sb.Spec.PodTemplate.Spec.Containers[:1]
			sb.Spec.PodTemplate.Spec.Volumes = nil
		}},
		{"another organization's label", func(sb *v1beta1.Sandbox) { sb.Spec.PodTemplate.ObjectMeta.Labels[k8s.LabelOrg] = "org_victim" }},
		{"the service account of another organization", func(sb *v1beta1.Sandbox) {
			sb.Spec.PodTemplate.Spec.ServiceAccountName = "hiloop-org-victim"
		}},
		{"service unset", func(sb *v1beta1.Sandbox) { sb.Spec.Service = nil }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for who, cl := range map[string]*k8s.Clients{"hiloop": hiloop, "admin": admin} {
				if err := patchTo(cl, tc.mutate, dryPatch); !refusedBy(err, boundary.PolicySandbox, "immutable") {
					t.Errorf("merge patch by %s: want refused [immutable], got %v", who, err)
				}
			}
			// A JSON patch, which hiloop never sends, is held to the same.
			from := current()
			to := from.DeepCopy()
			tc.mutate(to)
			fromJSON, _ := json.Marshal(from.Spec)
			toJSON, _ := json.Marshal(to.Spec)
			ops, _ := json.Marshal([]map[string]any{{"op": "test", "path": "/spec", "value": json.RawMessage(fromJSON)},
				{"op": "replace", "path": "/spec", "value": json.RawMessage(toJSON)}})
			if _, err := sandboxes(hiloop).Patch(ctx, name, types.JSONPatchType, ops, dryPatch); !refusedBy(err, boundary.PolicySandbox, "immutable") {
				t.Errorf("JSON patch by hiloop: want refused [immutable], got %v", err)
			}
		})
	}

	// What hiloop's account may do: merge patches of the mode, the
	// shutdown and hiloop's annotations. The controller's annotations on
	// the Sandbox itself stay its business.
	for _, tc := range []struct {
		name   string
		mutate func(*v1beta1.Sandbox)
	}{
		{"stop", func(sb *v1beta1.Sandbox) { sb.Spec.OperatingMode = v1beta1.SandboxOperatingModeSuspended }},
		{"expiry", func(sb *v1beta1.Sandbox) {
			sb.Spec.ShutdownTime = &metav1.Time{Time: time.Now().Add(time.Hour).Truncate(time.Second)}
		}},
		{"shutdown policy", func(sb *v1beta1.Sandbox) { sb.Spec.ShutdownPolicy = ptr.To(v1beta1.ShutdownPolicyDelete) }},
		{"gateway key", func(sb *v1beta1.Sandbox) {
			sb.Spec.PodTemplate.ObjectMeta.Annotations[k8s.AnnotationGatewayKey] = "ssh-ed25519 AAAA== new"
		}},
	} {
		if err := patchTo(hiloop, tc.mutate, dryPatch); err != nil {
			t.Errorf("%s by hiloop: %v", tc.name, err)
		}
	}
	if err := patchTo(admin, func(sb *v1beta1.Sandbox) {
		sb.Annotations = map[string]string{"agents.x-k8s.io/pod-name": name}
	}, dryPatch); err != nil {
		t.Errorf("the controller's annotation on the Sandbox: %v", err)
	}

	// hiloop's account writes only as hiloop does: no server-side apply
	// (with or without force, changing something or nothing), no field
	// manager, no PUT, no strategic merge (which custom resources lack).
	apply := func(spec string, force bool) error {
		body := fmt.Sprintf(`{"apiVersion":"agents.x-k8s.io/v1beta1","kind":"Sandbox","metadata":{"name":%q,"namespace":%q},"spec":%s}`, name, ns, spec)
		_, err := sandboxes(hiloop).Patch(ctx, name, types.ApplyPatchType, []byte(body),
			metav1.PatchOptions{FieldManager: "other", Force: ptr.To(force), DryRun: []string{metav1.DryRunAll}})
		return err
	}
	for what, err := range map[string]error{
		"apply of the same mode":           apply(`{"operatingMode":"Running"}`, false),
		"forced apply of another image":    apply(`{"podTemplate":{"spec":{"containers":[{"name":"workload","image":"evil"}]}}}`, true),
		"forced apply of an nfs volume":    apply(`{"podTemplate":{"spec":{"volumes":[{"name":"x","nfs":{"server":"198.51.100.1","path":"/"}}]}}}`, true),
		"merge patch with a field manager": patchTo(hiloop, func(sb *v1beta1.Sandbox) { sb.Spec.OperatingMode = v1beta1.SandboxOperatingModeSuspended }, metav1.PatchOptions{FieldManager: "hiloop", DryRun: []string{metav1.DryRunAll}}),
		"create with a field manager":      createWith(ctx, t, hiloop, ns, metav1.CreateOptions{FieldManager: "hiloop", DryRun: []string{metav1.DryRunAll}}),
		"an apply create of a new Sandbox": applyCreate(ctx, hiloop, ns),
	} {
		if !refusedBy(err, boundary.PolicySandbox, "write-vocabulary") {
			t.Errorf("%s by hiloop: want refused [write-vocabulary], got %v", what, err)
		}
	}
	if _, err := sandboxes(hiloop).Patch(ctx, name, types.StrategicMergePatchType, []byte(`{"spec":{"operatingMode":"Running"}}`), dryPatch); !apierrors.IsUnsupportedMediaType(err) {
		t.Errorf("strategic merge patch by hiloop: want unsupported, got %v", err)
	}
	obj := current()
	obj.Spec.OperatingMode = v1beta1.SandboxOperatingModeSuspended
	if _, err := hiloop.Sandbox.AgentsV1beta1().Sandboxes(ns).Update(ctx, obj, metav1.UpdateOptions{DryRun: []string{metav1.DryRunAll}}); !apierrors.IsForbidden(err) {
		t.Errorf("PUT by hiloop: want forbidden, got %v", err)
	}
	// JSON patches that break the shape are named by the shape's rule.
	for rule, ops := range map[string]string{
		"volumes":    `[{"op":"add","path":"/spec/podTemplate/spec/volumes/-","value":{"name":"x","nfs":{"server":"198.51.100.1","path":"/"}}}]`,
		"privileged": `[{"op":"add","path":"/spec/podTemplate/spec/containers/0/securityContext","value":{"privileged":true}}]`,
	} {
		if _, err := sandboxes(hiloop).Patch(ctx, name, types.JSONPatchType, []byte(ops), dryPatch); !refusedBy(err, boundary.PolicySandbox, rule) {
			t.Errorf("JSON patch by hiloop: want refused [%s], got %v", rule, err)
		}
	}

	// The live pod: an ephemeral container is held to the rules (Pod
	// Security lifted, so that the refusal is the policy's); a conforming
	// one is admitted. Tolerations added later are refused too.
	var pod *corev1.Pod
	eventually.Within(t, "pod running", 60*time.Second, func() (bool, error) {
		p, err := admin.Kube.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		pod = p
		return k8s.PodReady(p), fmt.Errorf("phase %s", p.Status.Phase)
	})
	withEphemeral := func(sc *corev1.SecurityContext) error {
		p := pod.DeepCopy()
		p.Spec.EphemeralContainers = append(p.Spec.EphemeralContainers, corev1.EphemeralContainer{EphemeralContainerCommon: corev1.EphemeralContainerCommon{
			Name: "debug", Image: "busybox", SecurityContext: sc, TerminationMessagePolicy: corev1.TerminationMessageReadFile}, TargetContainerName: k8s.WorkloadContainer})
		_, err := admin.Kube.CoreV1().Pods(ns).UpdateEphemeralContainers(ctx, name, p, metav1.UpdateOptions{DryRun: []string{metav1.DryRunAll}})
		return err
	}
	liftPodSecurity(t, ns, func() error { return withEphemeral(&corev1.SecurityContext{Privileged: ptr.To(true)}) })
	for rule, sc := range map[string]*corev1.SecurityContext{
		"privileged":   {Privileged: ptr.To(true)},
		"capabilities": {Capabilities: &corev1.Capabilities{Add: []corev1.Capability{"SYS_PTRACE"}}},
		"seccomp":      {SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeUnconfined}},
	} {
		if err := withEphemeral(sc); !refusedBy(err, boundary.PolicyPod, rule) {
			t.Errorf("ephemeral container: want refused [%s], got %v", rule, err)
		}
	}
	if err := withEphemeral(nil); err != nil {
		t.Errorf("a conforming ephemeral container is refused: %v", err)
	}
	tolerant := pod.DeepCopy()
	tolerant.Spec.Tolerations = append(tolerant.Spec.Tolerations, corev1.Toleration{Operator: corev1.TolerationOpExists})
	if _, err := admin.Kube.CoreV1().Pods(ns).Update(ctx, tolerant, metav1.UpdateOptions{DryRun: []string{metav1.DryRunAll}}); !refusedBy(err, boundary.PolicyPod, "tolerations") {
		t.Errorf("toleration added to the live pod: want refused [tolerations], got %v", err)
	}
	// A service account hiloop's account made with an image pull secret:
	// the API server copies the secret onto every pod that runs as it, and
	// the pod policy refuses the pod.
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "hiloop-org-pullsecret", Namespace: ns},
		AutomountServiceAccountToken: ptr.To(false), ImagePullSecrets: []corev1.LocalObjectReference{{Name: "registry"}}}
	if _, err := hiloop.Kube.CoreV1().ServiceAccounts(ns).Create(ctx, sa, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pulling := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "sbx-pullsecret", Namespace: ns}, Spec: *pod.Spec.DeepCopy()}
	pulling.Spec.NodeName, pulling.Spec.ServiceAccountName, pulling.Spec.DeprecatedServiceAccount = "", sa.Name, ""
	// The key volume stays; the claim is the other pod's.
	pulling.Spec.Volumes = slices.DeleteFunc(pulling.Spec.Volumes, func(v corev1.Volume) bool { return v.Name != k8s.GatewayKeyVolume })
	pulling.Spec.Containers[0].VolumeMounts = nil
	if _, err := admin.Kube.CoreV1().Pods(ns).Create(ctx, pulling, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}); !refusedBy(err, boundary.PolicyPod, "pod-fields") {
		t.Errorf("a pod whose service account carries an image pull secret: want refused [pod-fields], got %v", err)
	}
	annotated := pod.DeepCopy()
	annotated.Annotations["example.com/note"] = "x"
	if _, err := admin.Kube.CoreV1().Pods(ns).Update(ctx, annotated, metav1.UpdateOptions{DryRun: []string{metav1.DryRunAll}}); err != nil {
		t.Errorf("an annotation on the live pod is refused: %v", err)
	}
}

// createWith creates a conforming Sandbox as cl with o.
func createWith(ctx context.Context, t *testing.T, cl *k8s.Clients, ns string, o metav1.CreateOptions) error {
	obj, err := k8s.Render(store.Sandbox{ID: "sbx_created", OrgID: "org_pinned", DesiredMode: store.ModeRunning, Spec: store.Spec{Image: "busybox"}},
		k8s.RenderOptions{Namespace: ns, RuntimeClass: k8s.DefaultRuntimeClass, Transports: []receipt.Transport{receipt.TransportExec}})
	if err != nil {
		t.Fatal(err)
	}
	_, err = cl.Sandbox.AgentsV1beta1().Sandboxes(ns).Create(ctx, obj, o)
	return err
}

// applyCreate creates a Sandbox by server-side apply as cl.
func applyCreate(ctx context.Context, cl *k8s.Clients, ns string) error {
	body := fmt.Sprintf(`{"apiVersion":"agents.x-k8s.io/v1beta1","kind":"Sandbox","metadata":{"name":"sbx-applied","namespace":%q},`+
		`"spec":{"podTemplate":{"metadata":{"labels":{"app.kubernetes.io/managed-by":"hiloop"}},"spec":{"automountServiceAccountToken":false,`+
		`"runtimeClassName":"gvisor","containers":[{"name":"workload","image":"busybox"}]}}}}`, ns)
	_, err := cl.Sandbox.AgentsV1beta1().Sandboxes(ns).Patch(ctx, "sbx-applied", types.ApplyPatchType, []byte(body),
		metav1.PatchOptions{FieldManager: "other", DryRun: []string{metav1.DryRunAll}})
	return err
}

// TestAdmissionValues: the chart's admission values widen the allowlist by
// exactly what they name. A cluster of its own (the policies are
// cluster-wide) gets the chart rendered with a priority class, a
// toleration, a node selector (its own and the RuntimeClass's) and claim
// bounds; Sandboxes with those are admitted, and with anything next to them
// refused.
func TestAdmissionValues(t *testing.T) {
	c := e2e.NewCluster(t)
	ctx := context.Background()
	rendering := helmTemplate(t, "-f", e2e.Path(t, "deploy/chart/values-local.yaml"),
		"--set", "admission.priorityClassNames={sandbox-low}",
		"--set", "admission.tolerations[0].key=pool,admission.tolerations[0].operator=Equal,admission.tolerations[0].value=sandboxes,admission.tolerations[0].effect=NoSchedule",
		"--set", "admission.tolerations[1].key=spot,admission.tolerations[1].operator=Exists,admission.tolerations[1].effect=NoExecute,admission.tolerations[1].tolerationSeconds=60",
		"--set", "admission.nodeSelector.pool=sandboxes",
		"--set", "gvisor.scheduling.nodeSelector.runtime=gvisor",
		"--set", "admission.claims.maxCount=2,admission.claims.maxSize=10Gi",
		"--set", "admission.claims.storageClasses={kwok-volume,fast}")
	if out, err := c.Kubectl(ctx, "apply", "-f", writeTemp(t, rendering)); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	cfg := rest.CopyConfig(c.Clients.Config)
	cfg.WarningHandler = rest.NoWarnings{}
	admin, err := k8s.NewClients(cfg)
	if err != nil {
		t.Fatal(err)
	}
	create := func(mutate func(*v1beta1.Sandbox)) error {
		obj, err := k8s.Render(store.Sandbox{ID: "sbx_values", OrgID: "org_values", DesiredMode: store.ModeRunning, Spec: store.Spec{Image: "busybox",
			Volumes: []store.Volume{{Name: "data", Size: "10Gi", MountPath: "/data", StorageClass: "fast"}}}},
			k8s.RenderOptions{Namespace: c.Namespace, RuntimeClass: k8s.DefaultRuntimeClass, Transports: []receipt.Transport{receipt.TransportExec}})
		if err != nil {
			t.Fatal(err)
		}
		mutate(obj)
		_, err = admin.Sandbox.AgentsV1beta1().Sandboxes(c.Namespace).Create(ctx, obj, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return err
	}
	spec := func(f func(*corev1.PodSpec)) func(*v1beta1.Sandbox) {
		return func(sb *v1beta1.Sandbox) { f(&sb.Spec.PodTemplate.Spec) }
	}
	allowed := spec(func(s *corev1.PodSpec) {
		s.PriorityClassName = "sandbox-low"
		s.Tolerations = []corev1.Toleration{{Key: "pool", Operator: corev1.TolerationOpEqual, Value: "sandboxes", Effect: corev1.TaintEffectNoSchedule},
			{Key: "spot", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute, TolerationSeconds: ptr.To(int64(60))}}
		s.NodeSelector = map[string]string{"pool": "sandboxes", "runtime": "gvisor"}
	})
	// Admission picks up the changed policies a moment later.
	eventually.Within(t, "the values admitted", 30*time.Second, func() (bool, error) {
		err := create(allowed)
		return err == nil, err
	})
	for _, tc := range []struct {
		name, rule string
		mutate     func(*v1beta1.Sandbox)
	}{
		{"another priority class", "priority-class", spec(func(s *corev1.PodSpec) { s.PriorityClassName = "sandbox-high" })},
		{"the toleration with another value", "tolerations", spec(func(s *corev1.PodSpec) {
			s.Tolerations = []corev1.Toleration{{Key: "pool", Operator: corev1.TolerationOpEqual, Value: "control-plane", Effect: corev1.TaintEffectNoSchedule}}
		})},
		{"the toleration for longer", "tolerations", spec(func(s *corev1.PodSpec) {
			s.Tolerations = []corev1.Toleration{{Key: "spot", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute, TolerationSeconds: ptr.To(int64(3600))}}
		})},
		{"the toleration for every effect", "tolerations", spec(func(s *corev1.PodSpec) {
			s.Tolerations = []corev1.Toleration{{Key: "pool", Operator: corev1.TolerationOpEqual, Value: "sandboxes"}}
		})},
		{"the selected label with another value", "node-selector", spec(func(s *corev1.PodSpec) { s.NodeSelector = map[string]string{"pool": "system"} })},
		{"another node label", "node-selector", spec(func(s *corev1.PodSpec) {
			s.NodeSelector = map[string]string{"pool": "sandboxes", "kubernetes.io/hostname": "kwok-node-0"}
		})},
		{"a claim over the bound", "claim-size", func(sb *v1beta1.Sandbox) {
			sb.Spec.VolumeClaimTemplates[0].Spec.Resources.Requests[corev1.ResourceStorage] = resource.MustParse("11Gi")
		}},
		{"three claims", "claim-size", func(sb *v1beta1.Sandbox) {
			for _, n := range []string{"b", "c"} {
				cl := *sb.Spec.VolumeClaimTemplates[0].DeepCopy()
				cl.Name = n
				sb.Spec.VolumeClaimTemplates = append(sb.Spec.VolumeClaimTemplates, cl)
			}
		}},
		{"a storage class not listed", "storage-class", func(sb *v1beta1.Sandbox) {
			sb.Spec.VolumeClaimTemplates[0].Spec.StorageClassName = ptr.To("slow")
		}},
	} {
		if err := create(func(sb *v1beta1.Sandbox) { allowed(sb); tc.mutate(sb) }); !refusedBy(err, boundary.PolicySandbox, tc.rule) {
			t.Errorf("%s: want refused [%s], got %v", tc.name, tc.rule, err)
		}
	}
}
