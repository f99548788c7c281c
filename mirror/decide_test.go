package mirror

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/agent-sandbox/api/v1beta1"

	"github.com/hiloop/hiloop/k8s"
	"github.com/hiloop/hiloop/receipt"
	"github.com/hiloop/hiloop/store"
)

var now = time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)

var renderOpts = k8s.RenderOptions{Namespace: "ns", RuntimeClass: "gvisor", Transports: []receipt.Transport{receipt.TransportExec}}

// withHelper is a record that has the forward transport, and so a helper.
func withHelper(s *store.Sandbox) {
	s.Spec.Transports = []receipt.Transport{receipt.TransportForward}
	b, _ := json.Marshal(k8s.NewReceipt("org_a", s.Spec, renderOpts))
	s.Receipt = string(b)
}

// helperPod is the pod of record(withHelper) as Render makes it: the
// hardened helper, its gateway key volume, and the matching receipt.
func helperPod(mut ...func(*corev1.Pod)) *corev1.Pod {
	return helperPodOf(record(withHelper), mut...)
}

// helperPodOf is helperPod for another record with a helper.
func helperPodOf(r store.Sandbox, mut ...func(*corev1.Pod)) *corev1.Pod {
	o := renderOpts
	o.AgentImage, o.GatewayKey = "img", "ssh-ed25519 AAAAkey"
	obj, err := k8s.Render(r, o)
	if err != nil {
		panic(err)
	}
	return pod(append([]func(*corev1.Pod){func(p *corev1.Pod) {
		p.Annotations = map[string]string{k8s.AnnotationReceipt: r.Receipt}
		p.Spec = *obj.Spec.PodTemplate.Spec.DeepCopy()
	}}, mut...)...)
}

// keyVolume is the pod's gateway key volume.
func keyVolume(p *corev1.Pod) *corev1.Volume {
	for i := range p.Spec.Volumes {
		if p.Spec.Volumes[i].Name == k8s.GatewayKeyVolume {
			return &p.Spec.Volumes[i]
		}
	}
	panic("no gateway key volume")
}

// tenantKeyVolume is a record with a helper whose own volume took the
// gateway key volume's name, as one could before such names were refused.
func tenantKeyVolume(s *store.Sandbox) {
	s.Spec.Transports = []receipt.Transport{receipt.TransportForward}
	s.Spec.Volumes = []store.Volume{{Name: k8s.GatewayKeyVolume, Size: "1Gi", MountPath: "/data"}}
	s.Receipt = promise(s.Spec)
}

// promise is the receipt a record holds, as control stores it at create.
func promise(spec store.Spec) string {
	b, err := json.Marshal(k8s.NewReceipt("org_a", spec, renderOpts))
	if err != nil {
		panic(err)
	}
	return string(b)
}

func record(mut ...func(*store.Sandbox)) store.Sandbox {
	sb := store.Sandbox{ID: "sbx_a", OrgID: "org_a", DesiredMode: store.ModeRunning, State: store.StateStarting,
		Spec: store.Spec{Image: "busybox", ShutdownPolicy: "retain"}}
	sb.Receipt = promise(sb.Spec)
	for _, m := range mut {
		m(&sb)
	}
	return sb
}

func object(mut ...func(*v1beta1.Sandbox)) *v1beta1.Sandbox {
	obj, err := k8s.Render(record(), renderOpts)
	if err != nil {
		panic(err)
	}
	for _, m := range mut {
		m(obj)
	}
	return obj
}

func pod(mut ...func(*corev1.Pod)) *corev1.Pod {
	obj := object()
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: obj.Name, Labels: obj.Spec.PodTemplate.ObjectMeta.Labels,
			Annotations: obj.Spec.PodTemplate.ObjectMeta.Annotations, CreationTimestamp: metav1.NewTime(now)},
		Spec: *obj.Spec.PodTemplate.Spec.DeepCopy(),
		Status: corev1.PodStatus{Phase: corev1.PodRunning,
			Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}},
	}
	for _, m := range mut {
		m(p)
	}
	return p
}

func TestDecide(t *testing.T) {
	code := func(c int) *int { return &c }
	pending := func(p *corev1.Pod) { p.Status = corev1.PodStatus{Phase: corev1.PodPending} }
	terminated := func(phase corev1.PodPhase, c int32, reason string) func(*corev1.Pod) {
		return func(p *corev1.Pod) {
			p.Status = corev1.PodStatus{Phase: phase, ContainerStatuses: []corev1.ContainerStatus{{Name: k8s.WorkloadContainer,
				State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: c, Reason: reason}}}}}
		}
	}
	suspended := func(o *v1beta1.Sandbox) { o.Spec.OperatingMode = v1beta1.SandboxOperatingModeSuspended }
	past := metav1.NewTime(now.Add(-time.Minute))
	tests := []struct {
		name string
		obj  *v1beta1.Sandbox
		pods []*corev1.Pod
		rec  store.Sandbox
		want store.Observation
	}{
		{"not yet observed", nil, nil, record(func(s *store.Sandbox) { s.State = store.StatePending }), store.Observation{State: store.StatePending}},
		{"object, no pod", object(), nil, record(), store.Observation{State: store.StateStarting}},
		{"pod not ready", object(), []*corev1.Pod{pod(pending)}, record(), store.Observation{State: store.StateStarting}},
		{"pod ready", object(), []*corev1.Pod{pod()}, record(), store.Observation{State: store.StateRunning}},
		{"suspended with pod", object(suspended), []*corev1.Pod{pod()}, record(func(s *store.Sandbox) { s.DesiredMode = store.ModeStopped }),
			store.Observation{State: store.StateStopping}},
		{"suspended without pod", object(suspended), nil, record(func(s *store.Sandbox) { s.DesiredMode = store.ModeStopped }),
			store.Observation{State: store.StateStopped}},
		{"stopping for idleness", object(suspended), []*corev1.Pod{pod()},
			record(func(s *store.Sandbox) { s.DesiredMode, s.StopCause = store.ModeStopped, store.StopIdle }),
			store.Observation{State: store.StateStopping, Reason: ReasonIdle}},
		{"stopped for idleness", object(suspended), nil,
			record(func(s *store.Sandbox) { s.DesiredMode, s.StopCause = store.ModeStopped, store.StopIdle }),
			store.Observation{State: store.StateStopped, Reason: ReasonIdle}},
		{"suspended outside hiloop", object(suspended), []*corev1.Pod{pod()}, record(),
			store.Observation{State: store.StateStopping, Reason: ReasonModeOutside}},
		{"resumed outside hiloop", object(), nil, record(func(s *store.Sandbox) { s.DesiredMode = store.ModeStopped; s.State = store.StateStopped }),
			store.Observation{State: store.StateStarting, Reason: ReasonModeOutside}},
		{"pod deleted behind hiloop's back", object(), nil, record(func(s *store.Sandbox) { s.State = store.StateRunning; s.PodUID = "u1" }),
			store.Observation{State: store.StateStarting, Reason: ReasonPodDeleted}},
		{"pod replaced behind hiloop's back", object(), []*corev1.Pod{pod(pending, func(p *corev1.Pod) { p.UID = "u2" })},
			record(func(s *store.Sandbox) { s.State = store.StateRunning; s.PodUID = "u1" }),
			store.Observation{State: store.StateStarting, Reason: ReasonPodReplaced, PodUID: "u2"}},
		{"never running while deleting", object(), []*corev1.Pod{pod()}, record(func(s *store.Sandbox) { s.DesiredMode = store.ModeDeleted }),
			store.Observation{State: store.StateStopping, Reason: ReasonBeingDeleted}},
		{"pod failed", object(), []*corev1.Pod{pod(terminated(corev1.PodFailed, 42, "Error"))}, record(),
			store.Observation{State: store.StateExited, ExitCode: code(42), Reason: "Error"}},
		{"pod succeeded", object(), []*corev1.Pod{pod(terminated(corev1.PodSucceeded, 0, "Completed"))}, record(),
			store.Observation{State: store.StateExited, ExitCode: code(0), Reason: "Completed"}},
		{"a stopped pod a kubelet still removes, as the sandbox starts again", object(), []*corev1.Pod{pod(terminated(corev1.PodSucceeded, 0, "Completed"),
			func(p *corev1.Pod) { p.DeletionTimestamp = &past })}, record(),
			store.Observation{State: store.StateStarting}},
		{"the workload ended while the session helper runs", object(), []*corev1.Pod{helperPod(func(p *corev1.Pod) {
			p.Status.ContainerStatuses = []corev1.ContainerStatus{
				{Name: k8s.WorkloadContainer, State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 0, Reason: "Completed"}}},
				{Name: k8s.HelperContainer, Ready: true, State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}}}
			p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionFalse}}
		})}, record(withHelper), store.Observation{State: store.StateExited, ExitCode: code(0), Reason: "Completed"}},
		{"expired, pod still there", object(func(o *v1beta1.Sandbox) { o.Spec.ShutdownTime = &past }), []*corev1.Pod{pod()}, record(),
			store.Observation{State: store.StateStopping, Reason: "expiring"}},
		{"expired", object(func(o *v1beta1.Sandbox) { o.Spec.ShutdownTime = &past }), nil, record(),
			store.Observation{State: store.StateExpired, Reason: "shutdown time passed"}},
		{"gone after API delete", nil, nil, record(func(s *store.Sandbox) { s.DesiredMode = store.ModeDeleted }),
			store.Observation{State: store.StateDeleted, Reason: "deleted through the API"}},
		{"gone after expiry with policy delete", nil, nil, record(func(s *store.Sandbox) {
			s.Spec.ShutdownPolicy = "delete"
			s.ExpiresAt = &past.Time
		}), store.Observation{State: store.StateDeleted, Reason: "expired with shutdown policy delete"}},
		{"gone otherwise", nil, nil, record(func(s *store.Sandbox) { s.State = store.StateRunning }),
			store.Observation{State: store.StateLost, Reason: "sandbox object vanished without a delete through the API"}},
		{"two live pods", object(), []*corev1.Pod{pod(), pod(func(p *corev1.Pod) { p.Name += "-2" })}, record(),
			store.Observation{State: store.StateAttention, Anomaly: AnomalyMultiplePods, Reason: "2 live pods"}},
		{"a finished pod beside a live one is not two", object(), []*corev1.Pod{pod(), pod(terminated(corev1.PodFailed, 1, ""))}, record(),
			store.Observation{State: store.StateExited, ExitCode: code(1), Reason: "Failed"}},
		{"org label mangled", object(func(o *v1beta1.Sandbox) { o.Labels[k8s.LabelOrg] = "garbage" }), nil, record(),
			store.Observation{State: store.StateAttention, Anomaly: AnomalyOrgLabelUnparseable, Reason: `label changed: org label "garbage" is not an organization id`}},
		{"org label of another org", object(func(o *v1beta1.Sandbox) { o.Labels[k8s.LabelOrg] = "org_b" }), nil, record(),
			store.Observation{State: store.StateAttention, Anomaly: AnomalyOrgLabelMismatch, Reason: `label changed: org label names another organization, "org_b"`}},
		{"pod org label of another org", object(), []*corev1.Pod{pod(func(p *corev1.Pod) { p.Labels = map[string]string{k8s.LabelSandbox: "sbx_a", k8s.LabelOrg: "org_b"} })}, record(),
			store.Observation{State: store.StateAttention, Anomaly: AnomalyOrgLabelMismatch, Reason: `label changed: pod org label names another organization, "org_b"`}},
		{"sandbox label missing", object(func(o *v1beta1.Sandbox) { delete(o.Labels, k8s.LabelSandbox) }), nil, record(),
			store.Observation{State: store.StateAttention, Anomaly: AnomalyIdentityMissing, Reason: `label changed: sandbox label is ""`}},
		{"service account swapped", object(), []*corev1.Pod{pod(func(p *corev1.Pod) { p.Spec.ServiceAccountName = "default" })}, record(),
			store.Observation{State: store.StateQuarantined, Anomaly: ContradictionServiceAccount, Reason: `service account "default", receipt promised "hiloop-org-a"`}},
		{"receipt and runtime class edited together", object(), []*corev1.Pod{pod(func(p *corev1.Pod) {
			p.Spec.RuntimeClassName = ptr.To("runc")
			r := k8s.NewReceipt("org_a", store.Spec{}, k8s.RenderOptions{RuntimeClass: "runc", Transports: []receipt.Transport{receipt.TransportExec}})
			b, _ := json.Marshal(r)
			p.Annotations = map[string]string{k8s.AnnotationReceipt: string(b)}
		})}, record(), store.Observation{State: store.StateQuarantined, Anomaly: ContradictionReceipt + "," + ContradictionRuntimeClass,
			Reason: `the pod's receipt annotation differs from the promise on record; runtime class "runc", receipt promised "gvisor"`}},
		{"legacy record without a stored receipt holds the pod to its annotation", object(), []*corev1.Pod{pod()},
			record(func(s *store.Sandbox) { s.Receipt = "" }), store.Observation{State: store.StateRunning}},
		{"helper host key changed in this pod", object(), []*corev1.Pod{helperPod(func(p *corev1.Pod) { p.UID = "u1" })},
			record(withHelper, func(s *store.Sandbox) { s.HelperKeyChangedPod = "u1" }),
			store.Observation{State: store.StateAttention, Anomaly: AnomalyHelperHostKey, Reason: "the session helper's host key changed within this pod's life", PodUID: "u1"}},
		{"helper host key changed in an earlier pod", object(), []*corev1.Pod{helperPod(func(p *corev1.Pod) { p.UID = "u2" })},
			record(withHelper, func(s *store.Sandbox) { s.HelperKeyChangedPod = "u1"; s.PodUID = "u2"; s.State = store.StateRunning }),
			store.Observation{State: store.StateRunning, PodUID: "u2"}},
		{"hardened helper", object(), []*corev1.Pod{helperPod()}, record(withHelper), store.Observation{State: store.StateRunning}},
		{"helper missing", object(), []*corev1.Pod{helperPod(func(p *corev1.Pod) { p.Spec.Containers = p.Spec.Containers[:1] })}, record(withHelper),
			store.Observation{State: store.StateQuarantined, Anomaly: ContradictionHelper, Reason: "the promised session helper is missing"}},
		{"helper writable", object(), []*corev1.Pod{helperPod(func(p *corev1.Pod) { p.Spec.Containers[1].SecurityContext.ReadOnlyRootFilesystem = ptr.To(false) })}, record(withHelper),
			store.Observation{State: store.StateQuarantined, Anomaly: ContradictionHelper, Reason: "the session helper's root filesystem is writable"}},
		{"helper privileged", object(), []*corev1.Pod{helperPod(func(p *corev1.Pod) { p.Spec.Containers[1].SecurityContext.Privileged = ptr.To(true) })}, record(withHelper),
			store.Observation{State: store.StateQuarantined, Anomaly: ContradictionHelper, Reason: "the session helper is privileged"}},
		{"helper key volume replaced by the tenant's claim", object(), []*corev1.Pod{helperPodOf(record(tenantKeyVolume), func(p *corev1.Pod) {
			// What the controller does with a claim template of the same name.
			keyVolume(p).VolumeSource = corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: k8s.GatewayKeyVolume + "-sbx-a"}}
		})}, record(tenantKeyVolume),
			store.Observation{State: store.StateQuarantined, Anomaly: ContradictionHelperKey, Reason: "the gateway key volume is not the downwardAPI volume hiloop rendered"}},
		{"helper key volume projects another field", object(), []*corev1.Pod{helperPod(func(p *corev1.Pod) {
			keyVolume(p).DownwardAPI.Items[0].FieldRef.FieldPath = "metadata.annotations['other']"
		})}, record(withHelper),
			store.Observation{State: store.StateQuarantined, Anomaly: ContradictionHelperKey, Reason: "the gateway key volume projects something other than the gateway key annotation"}},
		{"helper key volume projects more", object(), []*corev1.Pod{helperPod(func(p *corev1.Pod) {
			d := keyVolume(p).DownwardAPI
			d.Items = append(d.Items, corev1.DownwardAPIVolumeFile{Path: "more", FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.name"}})
		})}, record(withHelper),
			store.Observation{State: store.StateQuarantined, Anomaly: ContradictionHelperKey, Reason: "the gateway key volume projects something other than the gateway key annotation"}},
		{"helper key mounted writable", object(), []*corev1.Pod{helperPod(func(p *corev1.Pod) { p.Spec.Containers[1].VolumeMounts[0].ReadOnly = false })}, record(withHelper),
			store.Observation{State: store.StateQuarantined, Anomaly: ContradictionHelperKey, Reason: "the session helper's key mount is not the one hiloop rendered"}},
		{"helper mounts another volume", object(), []*corev1.Pod{helperPod(func(p *corev1.Pod) {
			p.Spec.Containers[1].VolumeMounts = append(p.Spec.Containers[1].VolumeMounts, corev1.VolumeMount{Name: "x", MountPath: "/x"})
		})}, record(withHelper),
			store.Observation{State: store.StateQuarantined, Anomaly: ContradictionHelperKey, Reason: "the session helper has 2 volume mounts, not the gateway key alone"}},
		{"helper key volume missing", object(), []*corev1.Pod{helperPod(func(p *corev1.Pod) { p.Spec.Volumes = nil })}, record(withHelper),
			store.Observation{State: store.StateQuarantined, Anomaly: ContradictionHelperKey, Reason: "the gateway key volume is missing"}},
		{"host path mounted", object(), []*corev1.Pod{pod(func(p *corev1.Pod) {
			p.Spec.Volumes = append(p.Spec.Volumes, corev1.Volume{Name: "h", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/"}}})
		})}, record(), store.Observation{State: store.StateQuarantined, Anomaly: ContradictionStorage, Reason: `volume "h" mounts a host path`}},
		{"claim not promised", object(), []*corev1.Pod{pod(func(p *corev1.Pod) {
			p.Spec.Volumes = append(p.Spec.Volumes, corev1.Volume{Name: "x", VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: "x-other"}}})
		})}, record(), store.Observation{State: store.StateQuarantined, Anomaly: ContradictionStorage, Reason: `volume "x" mounts claim "x-other", which was not promised`}},
		{"promised claim missing", object(), []*corev1.Pod{pod(func(p *corev1.Pod) {
			r := k8s.NewReceipt("org_a", store.Spec{Volumes: []store.Volume{{Name: "data"}}}, renderOpts)
			b, _ := json.Marshal(r)
			p.Annotations = map[string]string{k8s.AnnotationReceipt: string(b)}
		})}, record(func(s *store.Sandbox) { s.Receipt = promise(store.Spec{Volumes: []store.Volume{{Name: "data"}}}) }),
			store.Observation{State: store.StateQuarantined, Anomaly: ContradictionStorage, Reason: `promised volume "data" is not mounted`}},
		{"receipt missing on pod", object(), []*corev1.Pod{pod(func(p *corev1.Pod) { p.Annotations = nil })}, record(),
			store.Observation{State: store.StateAttention, Anomaly: AnomalyReceiptUnreadable, Reason: "pod carries no runtime receipt"}},
		{"receipt garbled", object(), []*corev1.Pod{pod(func(p *corev1.Pod) { p.Annotations = map[string]string{k8s.AnnotationReceipt: "{"} })}, record(),
			store.Observation{State: store.StateAttention, Anomaly: AnomalyReceiptUnreadable, Reason: "receipt: unexpected EOF"}},
		{"runtime class swapped", object(), []*corev1.Pod{pod(func(p *corev1.Pod) { p.Spec.RuntimeClassName = ptr.To("runc") })}, record(),
			store.Observation{State: store.StateQuarantined, Anomaly: ContradictionRuntimeClass, Reason: `runtime class "runc", receipt promised "gvisor"`}},
		{"host network", object(), []*corev1.Pod{pod(func(p *corev1.Pod) { p.Spec.HostNetwork = true })}, record(),
			store.Observation{State: store.StateQuarantined, Anomaly: ContradictionHostNamespaces, Reason: "pod shares a host namespace"}},
		{"token mounted", object(), []*corev1.Pod{pod(func(p *corev1.Pod) { p.Spec.AutomountServiceAccountToken = nil })}, record(),
			store.Observation{State: store.StateQuarantined, Anomaly: ContradictionTokenMounted, Reason: "a service-account token is mounted"}},
		{"pod seen outside gVisor", object(), []*corev1.Pod{pod(func(p *corev1.Pod) { p.UID = "u1" })},
			record(func(s *store.Sandbox) {
				s.RuntimePod, s.RuntimeObserved, s.RuntimeRelease = "u1", receipt.RuntimeNotGVisor, "6.1.0-28-amd64"
			}),
			store.Observation{State: store.StateQuarantined, Anomaly: ContradictionRuntime, Reason: `the pod was seen running outside gVisor (kernel "6.1.0-28-amd64")`}},
		{"an earlier pod seen outside gVisor", object(), []*corev1.Pod{pod(func(p *corev1.Pod) { p.UID = "u2" })},
			record(func(s *store.Sandbox) {
				s.RuntimePod, s.RuntimeObserved, s.RuntimeRelease = "u1", receipt.RuntimeNotGVisor, "6.1.0-28-amd64"
			}),
			store.Observation{State: store.StateRunning, PodUID: "u2"}},
		{"pod seen under gVisor", object(), []*corev1.Pod{pod(func(p *corev1.Pod) { p.UID = "u1" })},
			record(func(s *store.Sandbox) {
				s.RuntimePod, s.RuntimeObserved, s.RuntimeRelease = "u1", receipt.RuntimeGVisor, "4.19.0-gvisor"
			}),
			store.Observation{State: store.StateRunning, PodUID: "u1"}},
		{"pod whose runtime is unknown", object(), []*corev1.Pod{pod(func(p *corev1.Pod) { p.UID = "u1" })},
			record(func(s *store.Sandbox) { s.RuntimePod, s.RuntimeObserved = "u1", receipt.RuntimeUnknown }),
			store.Observation{State: store.StateRunning, PodUID: "u1"}},
		{"quarantine outranks running", object(), []*corev1.Pod{pod(func(p *corev1.Pod) {
			p.Spec.RuntimeClassName = nil
			p.Spec.HostPID = true
		})}, record(), store.Observation{State: store.StateQuarantined, Anomaly: ContradictionRuntimeClass + "," + ContradictionHostNamespaces,
			Reason: `runtime class "", receipt promised "gvisor"; pod shares a host namespace`}},
	}
	var receipts receiptCache
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := Decide(tc.obj, tc.pods, tc.rec, now, receipts.parse)
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("Decide (-want +got):\n%s", diff)
			}
		})
	}
}

// trim is what the cache keeps of an object, as the typed object Decide
// reads: compact, then rebuilt.
func trim(obj any) any {
	switch o := obj.(type) {
	case *v1beta1.Sandbox:
		return compactSandbox(o).object()
	case *corev1.Pod:
		return compactPod(o).object()
	}
	return obj
}

// TestTrimKeepsWhatDecideReads: deciding on what the cache keeps (the
// compact views, rebuilt) gives the same answer as on full objects, for the
// cases of TestDecide's kind, with and without a session helper.
// objectVariants are a Sandbox and variants of it, each different in a
// field Decide reads.
func objectVariants() []*v1beta1.Sandbox {
	past := metav1.NewTime(now.Add(-time.Minute))
	return []*v1beta1.Sandbox{object(), object(func(o *v1beta1.Sandbox) { o.Spec.ShutdownTime = &past }),
		object(func(o *v1beta1.Sandbox) { o.Spec.OperatingMode = v1beta1.SandboxOperatingModeSuspended }),
		object(func(o *v1beta1.Sandbox) { o.Labels[k8s.LabelOrg] = "x" }),
		object(func(o *v1beta1.Sandbox) { delete(o.Labels, k8s.LabelSandbox) }),
		object(func(o *v1beta1.Sandbox) { o.DeletionTimestamp = &past }),
		object(func(o *v1beta1.Sandbox) {
			o.Status.Conditions = []metav1.Condition{{Type: string(v1beta1.SandboxConditionReady), Status: metav1.ConditionFalse, Reason: v1beta1.SandboxReasonExpired}}
		})}
}

// podVariants are sets of a sandbox's pods: none, one, and variants of it,
// each different in a field Decide reads.
func podVariants() [][]*corev1.Pod {
	past := metav1.NewTime(now.Add(-time.Minute))
	return [][]*corev1.Pod{nil, {pod()}, {pod(func(p *corev1.Pod) { p.Spec.RuntimeClassName = ptr.To("runc") })},
		{pod(func(p *corev1.Pod) { p.Spec.RuntimeClassName = nil })},
		{pod(func(p *corev1.Pod) { p.Spec.AutomountServiceAccountToken = nil })},
		{pod(func(p *corev1.Pod) { p.Spec.HostPID = true; p.Spec.ServiceAccountName = "other" })},
		{pod(func(p *corev1.Pod) { delete(p.Annotations, k8s.AnnotationReceipt) })},
		{pod(func(p *corev1.Pod) { p.Annotations[k8s.AnnotationReceipt] = "" })},
		{pod(func(p *corev1.Pod) { p.Status.Conditions = nil })},
		{pod(func(p *corev1.Pod) { p.DeletionTimestamp = &past })},
		{pod(func(p *corev1.Pod) {
			p.Spec.Volumes = []corev1.Volume{{Name: "tok", VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{
				Sources: []corev1.VolumeProjection{{ServiceAccountToken: &corev1.ServiceAccountTokenProjection{Path: "t"}}}}}}}
		})},
		{pod(func(p *corev1.Pod) {
			p.Spec.Volumes = []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: "x"}}}}
		})},
		{pod(func(p *corev1.Pod) {
			p.Status = corev1.PodStatus{Phase: corev1.PodFailed, ContainerStatuses: []corev1.ContainerStatus{{Name: k8s.WorkloadContainer,
				State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 9, Reason: "OOMKilled", Message: "long"}}}}}
		})},
		{helperPod()},
		{helperPod(func(p *corev1.Pod) {
			p.Spec.Containers[len(p.Spec.Containers)-1].SecurityContext.ReadOnlyRootFilesystem = ptr.To(false)
		})},
		{helperPod(func(p *corev1.Pod) {
			keyVolume(p).VolumeSource = corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: "c"}}
		})},
		{helperPod(func(p *corev1.Pod) {
			keyVolume(p).VolumeSource = corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}
		})},
		{helperPod(func(p *corev1.Pod) { keyVolume(p).DownwardAPI.Items[0].Path = "other" })},
		{helperPod(func(p *corev1.Pod) { p.Spec.Containers[len(p.Spec.Containers)-1].VolumeMounts[0].MountPath = "/tmp" })},
		{pod(), pod(func(p *corev1.Pod) { p.Name += "-2" })}}
}

func TestTrimKeepsWhatDecideReads(t *testing.T) {
	objs, pods := objectVariants(), podVariants()
	var receipts receiptCache
	for _, rec := range []store.Sandbox{record(), record(withHelper)} {
		for i, o := range objs {
			for j, ps := range pods {
				var trimmed []*corev1.Pod
				for _, p := range ps {
					trimmed = append(trimmed, trim(p.DeepCopy()).(*corev1.Pod))
				}
				want := Decide(o, ps, rec, now, receipts.parse)
				got := Decide(trim(o.DeepCopy()).(*v1beta1.Sandbox), trimmed, rec, now, receipts.parse)
				if diff := cmp.Diff(want, got); diff != "" {
					t.Errorf("record %v, object %d, pods %d: trimmed decision differs (-full +trimmed):\n%s", rec.Spec.Transports, i, j, diff)
				}
			}
		}
	}
}

// TestChanged: an update that changes only what Decide does not read is
// not worth a decision; one that changes what it reads is, and so is a
// resync.
func TestChanged(t *testing.T) {
	version := func(rv string) func(metav1.Object) { return func(o metav1.Object) { o.SetResourceVersion(rv) } }
	viewOf := func(o runtime.Object, mut ...func(metav1.Object)) any {
		o = o.DeepCopyObject()
		for _, m := range mut {
			m(o.(metav1.Object))
		}
		v, _ := compact(o)
		return v
	}
	sbView := func(o *v1beta1.Sandbox, mut ...func(metav1.Object)) any { return viewOf(o, mut...) }
	podView := func(p *corev1.Pod, mut ...func(metav1.Object)) any { return viewOf(p, mut...) }
	base := object()
	if changed(sbView(base, version("1")), sbView(base, version("1"))) != true {
		t.Error("a resync of a Sandbox (same version) should count as a change")
	}
	quiet := object(func(o *v1beta1.Sandbox) {
		o.Status.ServiceFQDN = "sbx.ns.svc"
		o.Status.Conditions = append(o.Status.Conditions, metav1.Condition{Type: "Other", Status: metav1.ConditionTrue})
		o.Spec.PodTemplate.Spec.Containers[0].Image = "other"
	})
	if changed(sbView(base, version("1")), sbView(quiet, version("2"))) {
		t.Error("a Sandbox update outside the view should not count as a change")
	}
	for i, o := range objectVariants()[1:] {
		if !changed(sbView(base, version("1")), sbView(o, version("2"))) {
			t.Errorf("Sandbox variant %d: not counted as a change", i+1)
		}
	}
	p := pod()
	if changed(podView(p, version("1")), podView(p, version("1"))) != true {
		t.Error("a resync of a pod (same version) should count as a change")
	}
	bound := pod(func(p *corev1.Pod) {
		p.Spec.NodeName = "kwok-node"
		p.Status.PodIP = "10.0.0.1"
		p.Status.Conditions = append(p.Status.Conditions, corev1.PodCondition{Type: corev1.PodScheduled, Status: corev1.ConditionTrue})
	})
	if changed(podView(p, version("1")), podView(bound, version("2"))) {
		t.Error("a pod update outside the view should not count as a change")
	}
	for i, ps := range podVariants()[2:] { // after none and the pod itself
		if len(ps) == 1 && !changed(podView(p, version("1")), podView(ps[0], version("2"))) {
			t.Errorf("pod variant %d: not counted as a change", i+2)
		}
	}
	if !changed(sbView(base, version("1")), podView(p, version("2"))) {
		t.Error("views of different kinds should count as a change")
	}
}

// TestDeadline: the next moment time alone changes a decision is the
// earlier of the object's shutdown time and the record's expiry.
func TestDeadline(t *testing.T) {
	soon, later := now.Add(time.Minute), now.Add(time.Hour)
	at := func(t time.Time) *metav1.Time { m := metav1.NewTime(t); return &m }
	for _, c := range []struct {
		obj  *v1beta1.Sandbox
		rec  store.Sandbox
		want time.Time
	}{
		{object(), record(), time.Time{}},
		{nil, record(), time.Time{}},
		{object(func(o *v1beta1.Sandbox) { o.Spec.ShutdownTime = at(soon) }), record(), soon},
		{nil, record(func(s *store.Sandbox) { s.ExpiresAt = &later }), later},
		{object(func(o *v1beta1.Sandbox) { o.Spec.ShutdownTime = at(later) }), record(func(s *store.Sandbox) { s.ExpiresAt = &soon }), soon},
		{object(func(o *v1beta1.Sandbox) { o.Spec.ShutdownTime = at(soon) }), record(func(s *store.Sandbox) { s.ExpiresAt = &later }), soon},
	} {
		if got := deadline(c.obj, c.rec); !got.Equal(c.want) {
			t.Errorf("deadline = %v, want %v", got, c.want)
		}
	}
}

// TestReceiptCache: the memo answers what the parser answers, a receipt or
// an error, and stays bounded: a receipt too long to keep is parsed and not
// kept, and a full memo starts over.
func TestReceiptCache(t *testing.T) {
	var c receiptCache
	raws := []string{record().Receipt, record(withHelper).Receipt, `{"v":99}`, "not json",
		strings.Repeat(" ", maxReceiptLen) + record().Receipt}
	for _, raw := range raws {
		want, wantErr := receipt.Parse(raw)
		for range 2 { // parsed, then remembered
			got, err := c.parse(raw)
			if diff := cmp.Diff(want, got); diff != "" || fmt.Sprint(err) != fmt.Sprint(wantErr) {
				t.Errorf("parse(%.40q): error %v, want %v; receipt (-want +got):\n%s", raw, err, wantErr, diff)
			}
		}
	}
	if len(c.m) != len(raws)-1 {
		t.Errorf("the memo holds %d receipts, want %d: all but the long one", len(c.m), len(raws)-1)
	}
	for i := range maxReceipts {
		c.parse(fmt.Sprintf(`{"v":%d}`, i))
	}
	if len(c.m) > maxReceipts {
		t.Errorf("the memo holds %d receipts, more than %d", len(c.m), maxReceipts)
	}
}
