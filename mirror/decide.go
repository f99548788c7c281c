package mirror

import (
	"fmt"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"sigs.k8s.io/agent-sandbox/api/v1beta1"

	"github.com/hiloop/hiloop/k8s"
	"github.com/hiloop/hiloop/store"
)

// Named anomalies (state attention) and contradictions (state quarantined).
const (
	AnomalyMultiplePods        = "multiple_pods"
	AnomalyOrgLabelUnparseable = "org_label_unparseable"
	AnomalyIdentityMissing     = "identity_missing"
	AnomalyReceiptUnreadable   = "receipt_unreadable"

	ContradictionRuntimeClass   = "runtime_class_mismatch"
	ContradictionHostNamespaces = "host_namespaces"
	ContradictionTokenMounted   = "service_account_token_mounted"
	ContradictionServiceAccount = "service_account_mismatch"
)

// Decide maps what the cluster shows for one sandbox to the state the record
// should hold. obj is nil when no Sandbox object is observed; pods are the
// live pods that belong to it. It is a pure function of its arguments and
// implements the state table of docs/states.md.
func Decide(obj *v1beta1.Sandbox, pods []*corev1.Pod, rec store.Sandbox, now time.Time) store.Observation {
	if obj == nil {
		switch {
		case rec.DesiredMode == store.ModeDeleted:
			return store.Observation{State: store.StateDeleted, Reason: "deleted through the API"}
		case rec.State == store.StatePending:
			// Never observed yet: still pending (the create may be in flight).
			return store.Observation{State: store.StatePending}
		case rec.Spec.ShutdownPolicy == "delete" && rec.ExpiresAt != nil && !now.Before(*rec.ExpiresAt):
			return store.Observation{State: store.StateDeleted, Reason: "expired with shutdown policy delete"}
		default:
			return store.Observation{State: store.StateLost, Reason: "sandbox object vanished without a delete through the API"}
		}
	}

	// Identity: the object must say which sandbox and org it is.
	if id := obj.Labels[k8s.LabelSandbox]; id != rec.ID {
		return attention(AnomalyIdentityMissing, fmt.Sprintf("sandbox label is %q", id))
	}
	if org := obj.Labels[k8s.LabelOrg]; org != rec.OrgID {
		return attention(AnomalyOrgLabelUnparseable, fmt.Sprintf("org label is %q", org))
	}
	live := livePods(pods)
	if len(live) > 1 {
		return attention(AnomalyMultiplePods, fmt.Sprintf("%d live pods", len(live)))
	}
	if len(live) == 1 {
		if o, bad := checkPod(live[0], rec); bad {
			return o
		}
	}

	if obj.DeletionTimestamp != nil {
		return store.Observation{State: store.StateStopping, Reason: "being deleted"}
	}
	expired := obj.Spec.ShutdownTime != nil && !now.Before(obj.Spec.ShutdownTime.Time)
	if c := meta.FindStatusCondition(obj.Status.Conditions, string(v1beta1.SandboxConditionReady)); c != nil && c.Reason == v1beta1.SandboxReasonExpired {
		expired = true
	}
	if expired {
		if len(live) > 0 {
			return store.Observation{State: store.StateStopping, Reason: "expiring"}
		}
		return store.Observation{State: store.StateExpired, Reason: "shutdown time passed"}
	}

	// An exited workload stays exited until the sandbox is stopped.
	if len(pods) > 0 && obj.Spec.OperatingMode != v1beta1.SandboxOperatingModeSuspended {
		if o, ok := exited(pods); ok {
			return o
		}
	}
	if obj.Spec.OperatingMode == v1beta1.SandboxOperatingModeSuspended {
		if len(live) > 0 {
			return store.Observation{State: store.StateStopping}
		}
		return store.Observation{State: store.StateStopped}
	}
	if len(live) == 1 && podReady(live[0]) {
		return store.Observation{State: store.StateRunning}
	}
	return store.Observation{State: store.StateStarting}
}

func attention(anomaly, reason string) store.Observation {
	return store.Observation{State: store.StateAttention, Anomaly: anomaly, Reason: reason}
}

// livePods are the pods not being deleted and not finished.
func livePods(pods []*corev1.Pod) []*corev1.Pod {
	var live []*corev1.Pod
	for _, p := range pods {
		if p.DeletionTimestamp == nil && p.Status.Phase != corev1.PodSucceeded && p.Status.Phase != corev1.PodFailed {
			live = append(live, p)
		}
	}
	return live
}

// checkPod holds the live pod to the identity labels and the runtime receipt.
func checkPod(p *corev1.Pod, rec store.Sandbox) (store.Observation, bool) {
	if p.Labels[k8s.LabelSandbox] != rec.ID {
		return attention(AnomalyIdentityMissing, "pod sandbox label is "+fmt.Sprintf("%q", p.Labels[k8s.LabelSandbox])), true
	}
	if p.Labels[k8s.LabelOrg] != rec.OrgID {
		return attention(AnomalyOrgLabelUnparseable, fmt.Sprintf("pod org label is %q", p.Labels[k8s.LabelOrg])), true
	}
	raw, ok := p.Annotations[k8s.AnnotationReceipt]
	if !ok {
		return attention(AnomalyReceiptUnreadable, "pod carries no runtime receipt"), true
	}
	receipt, err := k8s.ParseReceipt(raw)
	if err != nil {
		return attention(AnomalyReceiptUnreadable, err.Error()), true
	}
	var contradictions []string
	var reasons []string
	if rc := ptrString(p.Spec.RuntimeClassName); rc != receipt.RuntimeClass {
		contradictions = append(contradictions, ContradictionRuntimeClass)
		reasons = append(reasons, fmt.Sprintf("runtime class %q, receipt promised %q", rc, receipt.RuntimeClass))
	}
	if p.Spec.HostNetwork || p.Spec.HostPID || p.Spec.HostIPC {
		contradictions = append(contradictions, ContradictionHostNamespaces)
		reasons = append(reasons, "pod shares a host namespace")
	}
	if tokenMounted(p) {
		contradictions = append(contradictions, ContradictionTokenMounted)
		reasons = append(reasons, "a service-account token is mounted")
	}
	if p.Spec.ServiceAccountName != "" && p.Spec.ServiceAccountName != receipt.ServiceAccount {
		contradictions = append(contradictions, ContradictionServiceAccount)
		reasons = append(reasons, fmt.Sprintf("service account %q, receipt promised %q", p.Spec.ServiceAccountName, receipt.ServiceAccount))
	}
	if len(contradictions) == 0 {
		return store.Observation{}, false
	}
	return store.Observation{State: store.StateQuarantined, Anomaly: strings.Join(contradictions, ","), Reason: strings.Join(reasons, "; ")}, true
}

func tokenMounted(p *corev1.Pod) bool {
	if p.Spec.AutomountServiceAccountToken == nil || *p.Spec.AutomountServiceAccountToken {
		return true
	}
	for _, v := range p.Spec.Volumes {
		if v.Projected == nil {
			continue
		}
		for _, s := range v.Projected.Sources {
			if s.ServiceAccountToken != nil {
				return true
			}
		}
	}
	return false
}

func ptrString(p *string) string {
	if p == nil {
		return ""
	}
	return *p
}

func podReady(p *corev1.Pod) bool {
	if p.Status.Phase != corev1.PodRunning {
		return false
	}
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// exited reports the newest finished pod's workload exit code and reason.
func exited(pods []*corev1.Pod) (store.Observation, bool) {
	var done []*corev1.Pod
	for _, p := range pods {
		if p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
			done = append(done, p)
		}
	}
	if len(done) == 0 {
		return store.Observation{}, false
	}
	sort.Slice(done, func(i, j int) bool { return done[i].CreationTimestamp.After(done[j].CreationTimestamp.Time) })
	p := done[0]
	o := store.Observation{State: store.StateExited, Reason: string(p.Status.Phase)}
	if p.Status.Reason != "" {
		o.Reason = p.Status.Reason
	}
	for _, cs := range p.Status.ContainerStatuses {
		if cs.Name != k8s.WorkloadContainer || cs.State.Terminated == nil {
			continue
		}
		code := int(cs.State.Terminated.ExitCode)
		o.ExitCode = &code
		if cs.State.Terminated.Reason != "" {
			o.Reason = cs.State.Terminated.Reason
		}
	}
	return o, true
}
