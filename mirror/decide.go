package mirror

import (
	"fmt"
	"reflect"
	"regexp"
	"sort"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/agent-sandbox/api/v1beta1"

	"github.com/hiloop/hiloop/k8s"
	"github.com/hiloop/hiloop/receipt"
	"github.com/hiloop/hiloop/store"
)

// Named anomalies (state attention) and contradictions (state quarantined).
const (
	AnomalyMultiplePods = "multiple_pods"
	// AnomalyOrgLabelUnparseable: the org label is not an organization id at
	// all. Records written before org_label_mismatch existed may carry it
	// for a valid but different org too.
	AnomalyOrgLabelUnparseable = "org_label_unparseable"
	// AnomalyOrgLabelMismatch: the org label names another organization.
	AnomalyOrgLabelMismatch  = "org_label_mismatch"
	AnomalyIdentityMissing   = "identity_missing"
	AnomalyReceiptUnreadable = "receipt_unreadable"
	// AnomalyHelperHostKey: the pod's session helper showed the gateway
	// another host key within the pod's life.
	AnomalyHelperHostKey = "helper_host_key_changed"

	ContradictionRuntimeClass   = "runtime_class_mismatch"
	ContradictionHostNamespaces = "host_namespaces"
	ContradictionTokenMounted   = "service_account_token_mounted"
	ContradictionServiceAccount = "service_account_mismatch"
	// ContradictionReceipt: the pod's receipt annotation differs from what
	// the record says was promised.
	ContradictionReceipt = "receipt_mismatch"
	// ContradictionStorage: the pod's volumes are not the promised ones (a
	// promised claim is missing, another claim or a host path is mounted).
	ContradictionStorage = "storage_mismatch"
	// ContradictionHelper: the promised session helper is missing or no
	// longer hardened.
	ContradictionHelper = "helper_not_hardened"
	// ContradictionHelperKey: the session helper's gateway key does not
	// come from the downwardAPI volume hiloop rendered (a volume of the same
	// name replaced it), so the workload may write what the helper trusts.
	ContradictionHelperKey = "helper_key_not_projected"
	// ContradictionRuntime: a probe inside the pod read another kernel
	// than gVisor's (runtime attestation): the pod runs outside the
	// promised runtime, whatever its spec says.
	ContradictionRuntime = "runtime_not_gvisor"
)

// Reasons the mirror gives for transitions, naming the evidence.
const (
	ReasonPodDeleted        = "pod deleted"
	ReasonPodReplaced       = "pod replaced"
	ReasonModeOutside       = "mode changed outside hiloop"
	ReasonBeingDeleted      = "being deleted"
	ReasonLabelChanged      = "label changed"
	ReasonDeletedThroughAPI = "deleted through the API"
	// ReasonIdle: hiloop stopped the sandbox because nobody used it for
	// its idle timeout.
	ReasonIdle = "idle"
)

// orgIDPattern is the shape of an organization id (store.NewID("org")).
var orgIDPattern = regexp.MustCompile(`^org_[A-Za-z0-9]+$`)

// Decide maps what the cluster shows for one sandbox to the state the record
// should hold. obj is nil when no Sandbox object is observed; pods are the
// live pods that belong to it; parse reads a receipt (receipt.Parse, or
// the mirror's memo of it, receiptCache). With a pure parse it is a pure
// function of its arguments. It implements the state table of docs/states.md.
func Decide(obj *v1beta1.Sandbox, pods []*corev1.Pod, rec store.Sandbox, now time.Time, parse func(string) (receipt.Receipt, error)) store.Observation {
	if obj == nil {
		switch {
		case rec.DesiredMode == store.ModeDeleted:
			return store.Observation{State: store.StateDeleted, Reason: ReasonDeletedThroughAPI}
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
	if o, bad := checkIdentity("", obj.Labels, rec); bad {
		return o
	}
	live := livePods(pods)
	if len(live) > 1 {
		return attention(AnomalyMultiplePods, fmt.Sprintf("%d live pods", len(live)))
	}
	podUID := ""
	if len(live) == 1 {
		if o, bad := checkPod(live[0], rec, parse); bad {
			return o
		}
		podUID = string(live[0].UID)
		if podUID != "" && rec.HelperKeyChangedPod == podUID {
			o := attention(AnomalyHelperHostKey, "the session helper's host key changed within this pod's life")
			o.PodUID = podUID
			return o
		}
	}
	o := decideLive(obj, pods, live, rec, now)
	o.PodUID = podUID
	if o.Reason == "" {
		o.Reason = why(o.State, podUID, rec)
	}
	return o
}

// decideLive is Decide for an object whose identity and pod checked out.
func decideLive(obj *v1beta1.Sandbox, pods, live []*corev1.Pod, rec store.Sandbox, now time.Time) store.Observation {
	if obj.DeletionTimestamp != nil || rec.DesiredMode == store.ModeDeleted {
		// Never running while a delete is under way, whatever the pod says.
		return store.Observation{State: store.StateStopping, Reason: ReasonBeingDeleted}
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
	if len(live) == 1 && k8s.PodReady(live[0]) {
		return store.Observation{State: store.StateRunning}
	}
	return store.Observation{State: store.StateStarting}
}

// why names the evidence behind a state when Decide had nothing more
// specific to say: an idle stop, the pod went or was replaced, or the mode
// differs from what the API asked for.
func why(state store.State, podUID string, rec store.Sandbox) string {
	switch {
	case (state == store.StateStopping || state == store.StateStopped) && rec.IdleStopped():
		return ReasonIdle
	case (state == store.StateStopping || state == store.StateStopped) && rec.DesiredMode == store.ModeRunning:
		return ReasonModeOutside
	case (state == store.StateStarting || state == store.StateRunning) && rec.DesiredMode == store.ModeStopped:
		return ReasonModeOutside
	case rec.PodUID != "" && podUID == "" && state == store.StateStarting:
		return ReasonPodDeleted
	case rec.PodUID != "" && podUID != "" && podUID != rec.PodUID:
		return ReasonPodReplaced
	case rec.PodUID != "" && podUID == rec.PodUID && state == rec.State:
		return rec.Reason // the same evidence as before: keep what was said
	}
	return ""
}

// checkIdentity holds an object's labels to the record. what is "" for the
// Sandbox and "pod " for its pod.
func checkIdentity(what string, labels map[string]string, rec store.Sandbox) (store.Observation, bool) {
	if id := labels[k8s.LabelSandbox]; id != rec.ID {
		return attention(AnomalyIdentityMissing, fmt.Sprintf("%s: %ssandbox label is %q", ReasonLabelChanged, what, id)), true
	}
	switch org := labels[k8s.LabelOrg]; {
	case org == rec.OrgID:
		return store.Observation{}, false
	case !orgIDPattern.MatchString(org):
		return attention(AnomalyOrgLabelUnparseable, fmt.Sprintf("%s: %sorg label %q is not an organization id", ReasonLabelChanged, what, org)), true
	default:
		return attention(AnomalyOrgLabelMismatch, fmt.Sprintf("%s: %sorg label names another organization, %q", ReasonLabelChanged, what, org)), true
	}
}

// receiptCache memoizes receipt.Parse, a pure function, for the
// decisions of one Mirror: the receipts of thousands of sandboxes are a
// handful of distinct strings, and parsing two on every decision is a
// cost serve would pay on every watch event (docs/benchmarks.md). It holds
// at most maxReceipts, each at most maxReceiptLen long (a receipt is a few
// hundred bytes; a longer one is parsed every time, so an edited annotation
// cannot fill memory), and starts over when full. Decide never changes a
// receipt it is given. The zero value is an empty cache.
type receiptCache struct {
	mu sync.Mutex
	m  map[string]parsedReceipt
}

type parsedReceipt struct {
	r   receipt.Receipt
	err error
}

const (
	maxReceipts   = 1024
	maxReceiptLen = 4096
)

// parse is receipt.Parse through the cache.
func (c *receiptCache) parse(raw string) (receipt.Receipt, error) {
	if len(raw) > maxReceiptLen {
		return receipt.Parse(raw)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if p, ok := c.m[raw]; ok {
		return p.r, p.err
	}
	if len(c.m) >= maxReceipts || c.m == nil {
		c.m = map[string]parsedReceipt{}
	}
	r, err := receipt.Parse(raw)
	c.m[raw] = parsedReceipt{r, err}
	return r, err
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

// checkPod holds the live pod to the identity labels and to what the record
// says was promised. The pod's receipt annotation must be there, readable,
// and the same promise: someone who edits both the runtime class and the
// annotation does not escape quarantine.
func checkPod(p *corev1.Pod, rec store.Sandbox, parse func(string) (receipt.Receipt, error)) (store.Observation, bool) {
	if o, bad := checkIdentity("pod ", p.Labels, rec); bad {
		return o, true
	}
	raw, ok := p.Annotations[k8s.AnnotationReceipt]
	if !ok {
		return attention(AnomalyReceiptUnreadable, "pod carries no runtime receipt"), true
	}
	annotated, err := parse(raw)
	if err != nil {
		return attention(AnomalyReceiptUnreadable, err.Error()), true
	}
	promised := annotated
	var contradictions, reasons []string
	if rec.Receipt != "" {
		if promised, err = parse(rec.Receipt); err != nil {
			return attention(AnomalyReceiptUnreadable, "record: "+err.Error()), true
		}
		if !reflect.DeepEqual(promised, annotated) {
			contradictions = append(contradictions, ContradictionReceipt)
			reasons = append(reasons, "the pod's receipt annotation differs from the promise on record")
		}
	}
	if rec.RuntimePod != "" && rec.RuntimePod == string(p.UID) && rec.RuntimeObserved == receipt.RuntimeNotGVisor && promised.Insecure == "" {
		contradictions = append(contradictions, ContradictionRuntime)
		reasons = append(reasons, fmt.Sprintf("the pod was seen running outside gVisor (kernel %q)", rec.RuntimeRelease))
	}
	if rc := ptrString(p.Spec.RuntimeClassName); rc != promised.RuntimeClass {
		contradictions = append(contradictions, ContradictionRuntimeClass)
		reasons = append(reasons, fmt.Sprintf("runtime class %q, receipt promised %q", rc, promised.RuntimeClass))
	}
	if p.Spec.HostNetwork || p.Spec.HostPID || p.Spec.HostIPC {
		contradictions = append(contradictions, ContradictionHostNamespaces)
		reasons = append(reasons, "pod shares a host namespace")
	}
	if tokenMounted(p) {
		contradictions = append(contradictions, ContradictionTokenMounted)
		reasons = append(reasons, "a service-account token is mounted")
	}
	if p.Spec.ServiceAccountName != "" && p.Spec.ServiceAccountName != promised.ServiceAccount {
		contradictions = append(contradictions, ContradictionServiceAccount)
		reasons = append(reasons, fmt.Sprintf("service account %q, receipt promised %q", p.Spec.ServiceAccountName, promised.ServiceAccount))
	}
	if reason := storageMismatch(p, promised); reason != "" {
		contradictions = append(contradictions, ContradictionStorage)
		reasons = append(reasons, reason)
	}
	if helper, reason := helperMismatch(p, promised); reason != "" {
		contradictions = append(contradictions, ContradictionHelper)
		reasons = append(reasons, reason)
	} else if helper != nil {
		if reason := k8s.HelperKeySource(*helper, p.Spec.Volumes); reason != "" {
			contradictions = append(contradictions, ContradictionHelperKey)
			reasons = append(reasons, reason)
		}
	}
	if len(contradictions) == 0 {
		return store.Observation{}, false
	}
	return store.Observation{State: store.StateQuarantined, Anomaly: strings.Join(contradictions, ","), Reason: strings.Join(reasons, "; ")}, true
}

// helperMismatch is the pod's promised session helper and how its hardening
// breaks the promise, "" when it keeps it; no helper when none was promised.
func helperMismatch(p *corev1.Pod, promised receipt.Receipt) (*corev1.Container, string) {
	if promised.SessionPort == 0 {
		return nil, ""
	}
	for i, c := range p.Spec.Containers {
		if c.Name == k8s.HelperContainer {
			return &p.Spec.Containers[i], k8s.HelperHardened(c)
		}
	}
	return nil, "the promised session helper is missing"
}

// storageMismatch says how the pod's persistent and host volumes differ from
// the promised storage ("name:class" entries), or "" when they match. The
// controller mounts claim template NAME of Sandbox S as volume NAME backed by
// claim NAME-S; the class is the claim's, which the pod does not show.
func storageMismatch(p *corev1.Pod, promised receipt.Receipt) string {
	want := map[string]bool{}
	for _, s := range promised.Storage {
		name, _, _ := strings.Cut(s, ":")
		want[name] = true
	}
	seen := map[string]bool{}
	for _, v := range p.Spec.Volumes {
		switch {
		case v.HostPath != nil:
			return fmt.Sprintf("volume %q mounts a host path", v.Name)
		case v.PersistentVolumeClaim != nil:
			owner := ""
			if ref := metav1.GetControllerOfNoCopy(p); ref != nil {
				owner = ref.Name
			}
			if !want[v.Name] || (owner != "" && v.PersistentVolumeClaim.ClaimName != v.Name+"-"+owner) {
				return fmt.Sprintf("volume %q mounts claim %q, which was not promised", v.Name, v.PersistentVolumeClaim.ClaimName)
			}
			seen[v.Name] = true
		}
	}
	for name := range want {
		if !seen[name] {
			return fmt.Sprintf("promised volume %q is not mounted", name)
		}
	}
	return ""
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

// workloadEnded says the pod's workload container has terminated.
func workloadEnded(p *corev1.Pod) bool {
	for _, cs := range p.Status.ContainerStatuses {
		if cs.Name == k8s.WorkloadContainer && cs.State.Terminated != nil {
			return true
		}
	}
	return false
}

// exited reports the newest finished pod's workload exit code and reason.
// A pod is finished when it ended, or when its workload did: the session
// helper beside it keeps such a pod running, and the pod never restarts
// its workload. A pod being deleted does not count: it finished because it
// was told to stop (a stop's pod that a kubelet has not yet removed when
// the sandbox starts again), not on its own.
func exited(pods []*corev1.Pod) (store.Observation, bool) {
	var done []*corev1.Pod
	for _, p := range pods {
		if p.DeletionTimestamp == nil && (p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed || workloadEnded(p)) {
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
