package mirror

import (
	"reflect"
	"unique"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/agent-sandbox/api/v1beta1"

	"github.com/hiloop/hiloop/k8s"
)

// The informer caches hold compact views of Sandboxes and pods, not typed
// objects: a *corev1.Pod is 1.2 KB and a *v1beta1.Sandbox 1 KB before a
// single field is set (each carries a whole PodSpec), and their label and
// annotation maps a few hundred bytes more each. A view keeps only what
// Decide reads, flat, and object rebuilds the typed object Decide takes.
// compact is the informers' transform: it runs before an object enters the
// cache, and passes anything that is not a typed Sandbox or pod (a view
// already) through unchanged.
func compact(obj any) (any, error) {
	switch o := obj.(type) {
	case *v1beta1.Sandbox:
		return compactSandbox(o), nil
	case *corev1.Pod:
		return compactPod(o), nil
	}
	return obj, nil
}

// view is the identity and metadata a Sandbox's or pod's view keeps:
// hiloop's labels, the receipt, the controller reference and the deletion
// mark. An absent label and an empty one are the same to Decide; an absent
// receipt and an empty one are not. Strings that many objects share are
// interned: one copy for all of them.
type view struct {
	name, namespace, uid, resourceVersion string
	generation                            int64
	org, sandbox, managedBy               string
	receipt                               string
	hasReceipt                            bool
	created                               metav1.Time
	deleted                               *metav1.Time
	owner                                 *metav1.OwnerReference
}

func newView(m *metav1.ObjectMeta) view {
	v := view{name: m.Name, namespace: intern(m.Namespace), uid: string(m.UID), resourceVersion: m.ResourceVersion, generation: m.Generation,
		org: intern(m.Labels[k8s.LabelOrg]), sandbox: m.Labels[k8s.LabelSandbox], managedBy: intern(m.Labels[k8s.LabelManagedBy]),
		created: m.CreationTimestamp, deleted: m.DeletionTimestamp}
	v.receipt, v.hasReceipt = m.Annotations[k8s.AnnotationReceipt]
	v.receipt = intern(v.receipt)
	if ref := metav1.GetControllerOfNoCopy(m); ref != nil {
		v.owner = &metav1.OwnerReference{APIVersion: intern(ref.APIVersion), Kind: intern(ref.Kind), Name: ref.Name, UID: ref.UID, Controller: ref.Controller}
	}
	return v
}

// GetObjectMeta gives the informer's key function and update check the
// name, namespace and resource version.
func (v *view) GetObjectMeta() metav1.Object {
	return &metav1.ObjectMeta{Name: v.name, Namespace: v.namespace, UID: types.UID(v.uid), ResourceVersion: v.resourceVersion}
}

func (v *view) meta() metav1.ObjectMeta {
	m := metav1.ObjectMeta{Name: v.name, Namespace: v.namespace, UID: types.UID(v.uid), ResourceVersion: v.resourceVersion, Generation: v.generation,
		CreationTimestamp: v.created, DeletionTimestamp: v.deleted}
	for _, l := range [...]struct{ k, v string }{{k8s.LabelOrg, v.org}, {k8s.LabelSandbox, v.sandbox}, {k8s.LabelManagedBy, v.managedBy}} {
		if l.v != "" {
			if m.Labels == nil {
				m.Labels = make(map[string]string, 3)
			}
			m.Labels[l.k] = l.v
		}
	}
	if v.hasReceipt {
		m.Annotations = map[string]string{k8s.AnnotationReceipt: v.receipt}
	}
	if v.owner != nil {
		m.OwnerReferences = []metav1.OwnerReference{*v.owner}
	}
	return m
}

// changed reports whether an update from old to obj can change what Decide
// says. Most of a sandbox's updates cannot: the controller's status fields,
// the node a pod is bound to and the like are not in the view, and a view
// that differs from the one before only in its resource version decides as
// it did. A resync, which delivers the same version again, always counts.
func changed(old, obj any) bool {
	switch o := old.(type) {
	case *sandboxView:
		if n, ok := obj.(*sandboxView); ok {
			return differs(*o, *n, func(v *sandboxView) *view { return &v.view })
		}
	case *podView:
		if n, ok := obj.(*podView); ok {
			return differs(*o, *n, func(v *podView) *view { return &v.view })
		}
	}
	return true
}

// differs compares two views of one object but for their resource
// versions; the same version counts as a difference (see changed).
func differs[T any](a, b T, base func(*T) *view) bool {
	if base(&a).resourceVersion == base(&b).resourceVersion {
		return true
	}
	base(&a).resourceVersion, base(&b).resourceVersion = "", ""
	return !reflect.DeepEqual(a, b)
}

// intern returns the one shared copy of s.
func intern(s string) string { return unique.Make(s).Value() }

// sandboxView is what the cache keeps of a Sandbox: its operating mode,
// shutdown time and Ready condition.
type sandboxView struct {
	view
	mode        v1beta1.SandboxOperatingMode
	shutdown    *metav1.Time
	hasReady    bool
	readyStatus metav1.ConditionStatus
	readyReason string
}

func compactSandbox(o *v1beta1.Sandbox) *sandboxView {
	s := &sandboxView{view: newView(&o.ObjectMeta), mode: o.Spec.OperatingMode, shutdown: o.Spec.ShutdownTime}
	for _, c := range o.Status.Conditions {
		if c.Type == string(v1beta1.SandboxConditionReady) {
			s.hasReady, s.readyStatus, s.readyReason = true, metav1.ConditionStatus(intern(string(c.Status))), intern(c.Reason)
		}
	}
	return s
}

func (s *sandboxView) object() *v1beta1.Sandbox {
	out := &v1beta1.Sandbox{ObjectMeta: s.meta()}
	out.Spec.OperatingMode = s.mode
	out.Spec.ShutdownTime = s.shutdown
	if s.hasReady {
		out.Status.Conditions = []metav1.Condition{{Type: string(v1beta1.SandboxConditionReady), Status: s.readyStatus, Reason: s.readyReason}}
	}
	return out
}

// podView is what the cache keeps of a pod: what the receipt check reads
// (runtime class, host namespaces, service account and its token, the
// claims, host paths and token volumes, the session helper's security
// context and where its gateway key comes from), its phase and readiness,
// and the workload's exit.
type podView struct {
	view
	runtimeClass    string
	hasRuntimeClass bool
	hostNetwork     bool
	hostPID         bool
	hostIPC         bool
	automountSet    bool
	automount       bool
	serviceAccount  string
	hasHelper       bool
	helper          *corev1.SecurityContext
	helperMounts    []corev1.VolumeMount
	volumes         []corev1.Volume
	phase           corev1.PodPhase
	reason          string
	hasReady        bool
	readyStatus     corev1.ConditionStatus
	exited          bool
	exitCode        int32
	exitReason      string
}

func compactPod(p *corev1.Pod) *podView {
	out := &podView{view: newView(&p.ObjectMeta), hostNetwork: p.Spec.HostNetwork, hostPID: p.Spec.HostPID, hostIPC: p.Spec.HostIPC,
		serviceAccount: intern(p.Spec.ServiceAccountName), phase: corev1.PodPhase(intern(string(p.Status.Phase))), reason: p.Status.Reason}
	if rc := p.Spec.RuntimeClassName; rc != nil {
		out.runtimeClass, out.hasRuntimeClass = intern(*rc), true
	}
	if a := p.Spec.AutomountServiceAccountToken; a != nil {
		out.automount, out.automountSet = *a, true
	}
	// Of the containers, only the session helper's hardening and mounts are
	// checked.
	for _, c := range p.Spec.Containers {
		if c.Name == k8s.HelperContainer {
			out.hasHelper, out.helper, out.helperMounts = true, c.SecurityContext, c.VolumeMounts
		}
	}
	// Only the volumes Decide holds to the receipt matter: claims, host
	// paths, those that carry a service-account token, and the gateway key
	// volume, whatever its source.
	for _, v := range p.Spec.Volumes {
		kept := corev1.Volume{Name: v.Name, VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: v.PersistentVolumeClaim, HostPath: v.HostPath}}
		if v.Projected != nil {
			for _, src := range v.Projected.Sources {
				if src.ServiceAccountToken != nil {
					kept.Projected = &corev1.ProjectedVolumeSource{Sources: []corev1.VolumeProjection{{ServiceAccountToken: src.ServiceAccountToken}}}
					break
				}
			}
		}
		if v.Name == k8s.GatewayKeyVolume {
			kept.DownwardAPI = v.DownwardAPI
		} else if kept.PersistentVolumeClaim == nil && kept.HostPath == nil && kept.Projected == nil {
			continue
		}
		out.volumes = append(out.volumes, kept)
	}
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			out.hasReady, out.readyStatus = true, corev1.ConditionStatus(intern(string(c.Status)))
		}
	}
	for _, cs := range p.Status.ContainerStatuses {
		if cs.Name == k8s.WorkloadContainer && cs.State.Terminated != nil {
			out.exited, out.exitCode, out.exitReason = true, cs.State.Terminated.ExitCode, cs.State.Terminated.Reason
		}
	}
	return out
}

func (v *podView) object() *corev1.Pod {
	out := &corev1.Pod{ObjectMeta: v.meta()}
	out.Spec = corev1.PodSpec{HostNetwork: v.hostNetwork, HostPID: v.hostPID, HostIPC: v.hostIPC,
		ServiceAccountName: v.serviceAccount, Volumes: v.volumes}
	if v.hasRuntimeClass {
		out.Spec.RuntimeClassName = ptr.To(v.runtimeClass)
	}
	if v.automountSet {
		out.Spec.AutomountServiceAccountToken = ptr.To(v.automount)
	}
	if v.hasHelper {
		out.Spec.Containers = []corev1.Container{{Name: k8s.HelperContainer, SecurityContext: v.helper, VolumeMounts: v.helperMounts}}
	}
	out.Status.Phase, out.Status.Reason = v.phase, v.reason
	if v.hasReady {
		out.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: v.readyStatus}}
	}
	if v.exited {
		out.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: k8s.WorkloadContainer,
			State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: v.exitCode, Reason: v.exitReason}}}}
	}
	return out
}
