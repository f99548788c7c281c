package k8s

import (
	"encoding/json"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/agent-sandbox/api/v1beta1"

	"github.com/hiloop/hiloop/store"
)

// Labels and annotations hiloop puts on the Sandbox and its pod template. The
// controller copies the template's onto the live pod.
const (
	LabelOrg          = "hiloop.dev/org"
	LabelSandbox      = "hiloop.dev/sandbox"
	LabelManagedBy    = "app.kubernetes.io/managed-by"
	ManagedBy         = "hiloop"
	AnnotationReceipt = "hiloop.dev/runtime-receipt"
	// WorkloadContainer is the name of the container that runs the image.
	WorkloadContainer = "workload"
)

// Deployment defaults, in one place: the CLI's flags, the local cluster and
// the install take them from here.
const (
	DefaultNamespace    = "hiloop-sandboxes"
	DefaultRuntimeClass = "gvisor"
)

// Selector selects every object hiloop made.
const Selector = LabelManagedBy + "=" + ManagedBy

// Receipt is what the control plane promised for one sandbox. It is written
// as a pod-template annotation, so the mirror can hold the live pod to it.
type Receipt struct {
	Version        int      `json:"v"`
	RuntimeClass   string   `json:"runtime_class"`
	ServiceAccount string   `json:"service_account"`
	Storage        []string `json:"storage"`
	Transports     []string `json:"transports"`
}

// ReceiptVersion is the receipt format this binary writes and reads.
const ReceiptVersion = 1

// ParseReceipt reads a receipt annotation, refusing anything it does not
// fully understand.
func ParseReceipt(s string) (Receipt, error) {
	var r Receipt
	dec := json.NewDecoder(strings.NewReader(s))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&r); err != nil {
		return Receipt{}, fmt.Errorf("receipt: %w", err)
	}
	if r.Version != ReceiptVersion || r.RuntimeClass == "" {
		return Receipt{}, fmt.Errorf("receipt: version %d, runtime class %q", r.Version, r.RuntimeClass)
	}
	return r, nil
}

// RenderOptions are the deployment's choices that shape every sandbox.
type RenderOptions struct {
	Namespace    string
	RuntimeClass string
	// Transports are the ways in that this deployment backs ("exec", ...).
	Transports []string
}

// ObjectName is the Kubernetes name of a sandbox: its id with the underscore
// made a dash, since ids are not DNS labels.
func ObjectName(id string) string { return strings.ReplaceAll(id, "_", "-") }

// ServiceAccountName is the organization's own service account.
func ServiceAccountName(orgID string) string { return "hiloop-" + strings.ReplaceAll(orgID, "_", "-") }

// NewReceipt is what a sandbox of the organization with this spec is
// promised under the options: the runtime class, the org's service account,
// its volumes with their storage classes, and the transports it asked for
// (every backed one when it asked for none).
func NewReceipt(orgID string, spec store.Spec, o RenderOptions) Receipt {
	r := Receipt{Version: ReceiptVersion, RuntimeClass: o.RuntimeClass, ServiceAccount: ServiceAccountName(orgID),
		Storage: []string{}, Transports: append([]string{}, o.Transports...)}
	if len(spec.Transports) > 0 {
		r.Transports = append([]string{}, spec.Transports...)
	}
	for _, v := range spec.Volumes {
		class := "default"
		if v.StorageClass != "" {
			class = v.StorageClass
		}
		r.Storage = append(r.Storage, v.Name+":"+class)
	}
	return r
}

// Render turns a sandbox record into the Sandbox object hiloop creates. It is
// a pure function of the record and the options; golden files pin its output.
// The receipt annotation is the record's own promise; a record older than
// stored receipts gets one made from the options.
func Render(sb store.Sandbox, o RenderOptions) (*v1beta1.Sandbox, error) {
	labels := map[string]string{LabelOrg: sb.OrgID, LabelSandbox: sb.ID, LabelManagedBy: ManagedBy}
	rj := []byte(sb.Receipt)
	if sb.Receipt == "" {
		var err error
		if rj, err = json.Marshal(NewReceipt(sb.OrgID, sb.Spec, o)); err != nil {
			return nil, err
		}
	}

	container := corev1.Container{Name: WorkloadContainer, Image: sb.Spec.Image}
	var err error
	if container.Resources, err = resources(sb.Spec); err != nil {
		return nil, err
	}
	var claims []v1beta1.PersistentVolumeClaimTemplate
	for _, v := range sb.Spec.Volumes {
		size, err := resource.ParseQuantity(v.Size)
		if err != nil {
			return nil, fmt.Errorf("volume %s: size: %w", v.Name, err)
		}
		claim := v1beta1.PersistentVolumeClaimTemplate{
			EmbeddedObjectMetadata: v1beta1.EmbeddedObjectMetadata{Name: v.Name, Labels: labels},
			Spec: corev1.PersistentVolumeClaimSpec{
				AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
				Resources:   corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: size}},
			},
		}
		if v.StorageClass != "" {
			claim.Spec.StorageClassName = ptr.To(v.StorageClass)
		}
		claims = append(claims, claim)
		container.VolumeMounts = append(container.VolumeMounts, corev1.VolumeMount{Name: v.Name, MountPath: v.MountPath})
	}
	obj := &v1beta1.Sandbox{
		TypeMeta:   metav1.TypeMeta{APIVersion: v1beta1.GroupVersion.String(), Kind: "Sandbox"},
		ObjectMeta: metav1.ObjectMeta{Name: ObjectName(sb.ID), Namespace: o.Namespace, Labels: labels},
		Spec: v1beta1.SandboxSpec{
			SandboxBlueprint: v1beta1.SandboxBlueprint{
				PodTemplate: v1beta1.PodTemplate{
					ObjectMeta: v1beta1.PodMetadata{Labels: labels, Annotations: map[string]string{AnnotationReceipt: string(rj)}},
					Spec: corev1.PodSpec{
						Containers:                   []corev1.Container{container},
						RestartPolicy:                corev1.RestartPolicyNever,
						AutomountServiceAccountToken: ptr.To(false),
						// Service links would inject environment variables into
						// the workload; its environment is the image's alone.
						EnableServiceLinks: ptr.To(false),
						RuntimeClassName:   ptr.To(o.RuntimeClass),
						ServiceAccountName: ServiceAccountName(sb.OrgID),
					},
				},
				VolumeClaimTemplates: claims,
				Service:              ptr.To(false),
			},
			OperatingMode: operatingMode(sb.DesiredMode),
		},
	}
	policy := v1beta1.ShutdownPolicyRetain
	if sb.Spec.ShutdownPolicy == "delete" {
		policy = v1beta1.ShutdownPolicyDelete
	}
	obj.Spec.ShutdownPolicy = &policy
	if sb.ExpiresAt != nil {
		obj.Spec.ShutdownTime = &metav1.Time{Time: sb.ExpiresAt.UTC().Truncate(time.Second)}
	}
	return obj, nil
}

func operatingMode(m store.Mode) v1beta1.SandboxOperatingMode {
	if m == store.ModeStopped {
		return v1beta1.SandboxOperatingModeSuspended
	}
	return v1beta1.SandboxOperatingModeRunning
}

func resources(s store.Spec) (corev1.ResourceRequirements, error) {
	var r corev1.ResourceRequirements
	for _, q := range []struct {
		list  *corev1.ResourceList
		name  corev1.ResourceName
		value string
	}{
		{&r.Requests, corev1.ResourceCPU, s.CPURequest},
		{&r.Requests, corev1.ResourceMemory, s.MemoryRequest},
		{&r.Limits, corev1.ResourceCPU, s.CPULimit},
		{&r.Limits, corev1.ResourceMemory, s.MemoryLimit},
	} {
		if q.value == "" {
			continue
		}
		v, err := resource.ParseQuantity(q.value)
		if err != nil {
			return r, fmt.Errorf("%s: %w", q.name, err)
		}
		if *q.list == nil {
			*q.list = corev1.ResourceList{}
		}
		(*q.list)[q.name] = v
	}
	return r, nil
}
