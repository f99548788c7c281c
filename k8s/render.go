package k8s

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/agent-sandbox/api/v1beta1"

	"github.com/hiloop/hiloop/cluster"
	"github.com/hiloop/hiloop/receipt"
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
	// AnnotationGatewayKey carries the SSH gateway's public key to the
	// session helper, through a downwardAPI volume.
	AnnotationGatewayKey = "hiloop.dev/gateway-key"
	// WorkloadContainer is the name of the container that runs the image.
	WorkloadContainer = "workload"
	// HelperContainer is the session helper (`hiloop agent`), rendered for
	// sandboxes that have the forward transport.
	HelperContainer = "session-helper"
	// DefaultSessionPort is the port the session helper listens on.
	DefaultSessionPort = 2223
	// HelperUser is the uid the session helper runs as.
	HelperUser = 65532
	// ReservedVolumePrefix starts the names of the pod volumes rendered
	// for hiloop itself (cluster.ReservedVolumePrefix, which the core
	// refuses in a sandbox's own volumes).
	ReservedVolumePrefix = cluster.ReservedVolumePrefix
	// GatewayKeyVolume is the pod volume that projects the gateway-key
	// annotation into the helper.
	GatewayKeyVolume = ReservedVolumePrefix + "gateway-key"
	// HelperSandboxEnv carries the sandbox id to the helper, from the pod's
	// sandbox label through the downward API: the helper refuses a login
	// under any other user name.
	HelperSandboxEnv = "HILOOP_AGENT_SANDBOX"
	// gatewayKeyDir is where the helper finds the gateway's key, and
	// gatewayKeyFile the file in it.
	gatewayKeyDir  = "/var/run/hiloop"
	gatewayKeyFile = "gateway.pub"
)

// Deployment defaults, in one place: the CLI's flags, the local cluster and
// the install take them from here.
const (
	DefaultNamespace    = "hiloop-sandboxes"
	DefaultRuntimeClass = "gvisor"
)

// Selector selects every object hiloop made.
const Selector = LabelManagedBy + "=" + ManagedBy

// RenderOptions are the deployment's choices that shape every sandbox.
type RenderOptions struct {
	Namespace    string
	RuntimeClass string
	// NoGVisor renders sandboxes without a runtime class, and says so in
	// their receipts (serve --insecure-no-gvisor).
	NoGVisor bool
	// Transports are the ways in that this deployment backs.
	Transports []receipt.Transport
	// AgentImage runs the session helper of sandboxes that have the forward
	// transport; the binary is /hiloop in it.
	AgentImage string
	// SessionPort is the helper's port; DefaultSessionPort when zero.
	SessionPort int
	// GatewayKey is the gateway's public key (authorized_keys form), which
	// the helper accepts.
	GatewayKey string
	// DefaultCPULimit and DefaultMemoryLimit are the workload's limits when
	// the spec sets none (serve --default-cpu-limit, --default-memory-limit);
	// DefaultCPULimit and DefaultMemoryLimit of this package when empty.
	DefaultCPULimit, DefaultMemoryLimit string
}

// The workload's resources when its spec states none. Every container
// states requests and limits, so that the sandbox namespace's quota, which
// bounds their totals, counts it: the quota refuses a pod that states none.
// Requests default to the least a sandbox may ask for; a request above the
// default limit raises the limit to it.
const (
	DefaultCPURequest    = "10m"
	DefaultMemoryRequest = "16Mi"
	DefaultCPULimit      = "2"
	DefaultMemoryLimit   = "4Gi"
)

func (o RenderOptions) sessionPort() int {
	if o.SessionPort == 0 {
		return DefaultSessionPort
	}
	return o.SessionPort
}

// ObjectName is the Kubernetes name of a sandbox: its id with the underscore
// made a dash, since ids are not DNS labels. IDFromName is its inverse.
func ObjectName(id string) string { return strings.ReplaceAll(id, "_", "-") }

// IDFromName maps a Kubernetes object name back to a sandbox id, reporting
// whether the name is one ObjectName makes.
func IDFromName(name string) (string, bool) {
	rest, ok := strings.CutPrefix(name, "sbx-")
	if !ok || rest == "" {
		return "", false
	}
	return "sbx_" + rest, true
}

// ServiceAccountName is the organization's own service account.
func ServiceAccountName(orgID string) string { return "hiloop-" + strings.ReplaceAll(orgID, "_", "-") }

// NewReceipt is what a sandbox of the organization with this spec is
// promised under the options: the runtime class, the org's service account,
// its volumes with their storage classes, and the transports it asked for
// (every backed one when it asked for none).
func NewReceipt(orgID string, spec store.Spec, o RenderOptions) receipt.Receipt {
	r := receipt.Receipt{Version: receipt.Version, RuntimeClass: o.RuntimeClass, ServiceAccount: ServiceAccountName(orgID),
		Storage: []string{}, Transports: append([]receipt.Transport{}, o.Transports...)}
	if o.NoGVisor {
		r.RuntimeClass, r.Insecure = "", receipt.InsecureNoGVisor
	}
	if len(spec.Transports) > 0 {
		r.Transports = append([]receipt.Transport{}, spec.Transports...)
	}
	if r.Has(receipt.TransportForward) {
		r.SessionPort = o.sessionPort()
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
	promise := NewReceipt(sb.OrgID, sb.Spec, o)
	rj := promise.Encode()
	if sb.Receipt != "" {
		var err error
		rj = sb.Receipt
		if promise, err = receipt.Parse(sb.Receipt); err != nil {
			return nil, err
		}
	}

	container := corev1.Container{Name: WorkloadContainer, Image: sb.Spec.Image, Env: renderEnv(sb.Spec.Env)}
	var err error
	if container.Resources, err = resources(sb.Spec, o); err != nil {
		return nil, err
	}
	claims, mounts, err := volumeClaims(sb.Spec.Volumes, labels)
	if err != nil {
		return nil, err
	}
	container.VolumeMounts = mounts
	annotations := map[string]string{AnnotationReceipt: rj}
	containers := []corev1.Container{container}
	var volumes []corev1.Volume
	if promise.SessionPort > 0 {
		if o.AgentImage == "" || o.GatewayKey == "" {
			return nil, fmt.Errorf("render: the forward transport needs an agent image and the gateway's key")
		}
		annotations[AnnotationGatewayKey] = o.GatewayKey
		containers = append(containers, Helper(o.AgentImage, promise.SessionPort))
		volumes = append(volumes, gatewayKeyVolume())
	}
	obj := &v1beta1.Sandbox{
		TypeMeta:   metav1.TypeMeta{APIVersion: v1beta1.GroupVersion.String(), Kind: "Sandbox"},
		ObjectMeta: metav1.ObjectMeta{Name: ObjectName(sb.ID), Namespace: o.Namespace, Labels: labels},
		Spec: v1beta1.SandboxSpec{
			SandboxBlueprint: v1beta1.SandboxBlueprint{
				PodTemplate: v1beta1.PodTemplate{
					ObjectMeta: v1beta1.PodMetadata{Labels: labels, Annotations: annotations},
					Spec: corev1.PodSpec{
						Containers:                   containers,
						Volumes:                      volumes,
						RestartPolicy:                corev1.RestartPolicyNever,
						AutomountServiceAccountToken: ptr.To(false),
						// Service links would inject environment variables into
						// the workload; its environment is the image's alone.
						EnableServiceLinks: ptr.To(false),
						RuntimeClassName:   runtimeClassName(promise),
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

// volumeClaims renders each volume as a claim template, labelled as the
// sandbox is, and the workload's mount of it.
func volumeClaims(vols []store.Volume, labels map[string]string) ([]v1beta1.PersistentVolumeClaimTemplate, []corev1.VolumeMount, error) {
	var claims []v1beta1.PersistentVolumeClaimTemplate
	var mounts []corev1.VolumeMount
	for _, v := range vols {
		size, err := resource.ParseQuantity(v.Size)
		if err != nil {
			return nil, nil, fmt.Errorf("volume %s: size: %w", v.Name, err)
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
		mounts = append(mounts, corev1.VolumeMount{Name: v.Name, MountPath: v.MountPath})
	}
	return claims, mounts, nil
}

// gatewayKeyVolume is the downward-API volume through which the session
// helper reads the gateway's key from the pod's own annotation.
func gatewayKeyVolume() corev1.Volume {
	return corev1.Volume{Name: GatewayKeyVolume, VolumeSource: corev1.VolumeSource{DownwardAPI: &corev1.DownwardAPIVolumeSource{
		Items: []corev1.DownwardAPIVolumeFile{{Path: gatewayKeyFile, FieldRef: &corev1.ObjectFieldSelector{FieldPath: gatewayKeyField}}}}}}
}

// renderEnv is a sandbox's environment as the workload container's env:
// plain values in name order, never a reference. The kubelet expands
// $(NAME) in a value to another variable's and $$ to $, so every $ is
// doubled: the container sees each value exactly as the caller gave it.
func renderEnv(env map[string]string) []corev1.EnvVar {
	if len(env) == 0 {
		return nil
	}
	out := make([]corev1.EnvVar, 0, len(env))
	for _, k := range slices.Sorted(maps.Keys(env)) {
		out = append(out, corev1.EnvVar{Name: k, Value: strings.ReplaceAll(env[k], "$", "$$")})
	}
	return out
}

// runtimeClassName is the receipt's runtime class; none when the receipt
// says the sandbox runs without gVisor.
func runtimeClassName(r receipt.Receipt) *string {
	if r.RuntimeClass == "" {
		return nil
	}
	return ptr.To(r.RuntimeClass)
}

func operatingMode(m store.Mode) v1beta1.SandboxOperatingMode {
	if m == store.ModeStopped {
		return v1beta1.SandboxOperatingModeSuspended
	}
	return v1beta1.SandboxOperatingModeRunning
}

// resources are the workload's requests and limits: the spec's, and for
// what it leaves out, the defaults. A limit alone is also the request, as
// the API server would make it.
func resources(s store.Spec, o RenderOptions) (corev1.ResourceRequirements, error) {
	r := corev1.ResourceRequirements{Requests: corev1.ResourceList{}, Limits: corev1.ResourceList{}}
	for _, q := range []struct {
		name                                 corev1.ResourceName
		request, limit, defRequest, defLimit string
	}{
		{corev1.ResourceCPU, s.CPURequest, s.CPULimit, DefaultCPURequest, cmp.Or(o.DefaultCPULimit, DefaultCPULimit)},
		{corev1.ResourceMemory, s.MemoryRequest, s.MemoryLimit, DefaultMemoryRequest, cmp.Or(o.DefaultMemoryLimit, DefaultMemoryLimit)},
	} {
		parse := func(v string) (resource.Quantity, error) {
			qv, err := resource.ParseQuantity(v)
			if err != nil {
				return qv, fmt.Errorf("%s: %w", q.name, err)
			}
			return qv, nil
		}
		switch {
		case q.limit != "":
			limit, err := parse(q.limit)
			if err != nil {
				return r, err
			}
			request := limit
			if q.request != "" {
				if request, err = parse(q.request); err != nil {
					return r, err
				}
			}
			r.Requests[q.name], r.Limits[q.name] = request, limit
		default:
			request, err := parse(cmp.Or(q.request, q.defRequest))
			if err != nil {
				return r, err
			}
			limit, err := parse(q.defLimit)
			if err != nil {
				return r, err
			}
			if request.Cmp(limit) > 0 {
				limit = request
			}
			r.Requests[q.name], r.Limits[q.name] = request, limit
		}
	}
	return r, nil
}

// gatewayKeyField is the downward API field the key volume projects.
const gatewayKeyField = "metadata.annotations['" + AnnotationGatewayKey + "']"

// Helper is the session helper container: `hiloop agent` on the session
// port, hardened (read-only root filesystem, no capabilities, no privilege
// escalation, RuntimeDefault seccomp, non-root) with small requests and
// limits. It shares the pod's network namespace, which is the point. Its
// sandbox id comes from the pod's label as an environment variable, which
// the kubelet resolves once, when the container starts: the id cannot
// change within the helper's life, and the key volume stays one item.
func Helper(image string, port int) corev1.Container {
	return corev1.Container{
		Name:  HelperContainer,
		Image: image,
		Command: []string{"/hiloop", "agent", "--listen", fmt.Sprintf(":%d", port),
			"--authorized-keys", gatewayKeyDir + "/" + gatewayKeyFile},
		Env: []corev1.EnvVar{{Name: HelperSandboxEnv, ValueFrom: &corev1.EnvVarSource{
			FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.labels['" + LabelSandbox + "']"}}}},
		Ports: []corev1.ContainerPort{{Name: "session", ContainerPort: int32(port), Protocol: corev1.ProtocolTCP}},
		Resources: corev1.ResourceRequirements{
			Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("10m"), corev1.ResourceMemory: resource.MustParse("16Mi")},
			Limits:   corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("500m"), corev1.ResourceMemory: resource.MustParse("64Mi")},
		},
		VolumeMounts: []corev1.VolumeMount{{Name: GatewayKeyVolume, MountPath: gatewayKeyDir, ReadOnly: true}},
		SecurityContext: &corev1.SecurityContext{
			ReadOnlyRootFilesystem:   ptr.To(true),
			AllowPrivilegeEscalation: ptr.To(false),
			RunAsNonRoot:             ptr.To(true),
			RunAsUser:                ptr.To(int64(HelperUser)),
			Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
			SeccompProfile:           &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
		},
	}
}

// HelperHardened says how a helper container falls short of Helper's
// hardening, or "" when it does not.
func HelperHardened(c corev1.Container) string {
	sc := c.SecurityContext
	switch {
	case sc == nil:
		return "the session helper has no security context"
	case sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem:
		return "the session helper's root filesystem is writable"
	case sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation:
		return "the session helper may escalate privileges"
	case sc.Privileged != nil && *sc.Privileged:
		return "the session helper is privileged"
	case sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot || (sc.RunAsUser != nil && *sc.RunAsUser == 0):
		return "the session helper may run as root"
	case sc.Capabilities == nil || !slices.Contains(sc.Capabilities.Drop, "ALL") || len(sc.Capabilities.Add) > 0:
		return "the session helper keeps capabilities"
	case sc.SeccompProfile == nil || sc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault:
		return "the session helper runs without the RuntimeDefault seccomp profile"
	}
	return ""
}

// HelperKeySource says how the session helper's gateway key does not come
// from where Render put it, or "" when it does: the helper mounts only the
// key volume, read-only, at the key directory, and the pod's volume of that
// name is a downwardAPI volume whose one item is the gateway-key
// annotation. Any other source (a claim of the same name, say) hands the
// helper a key file the workload may write, and rotations stop reaching it.
func HelperKeySource(helper corev1.Container, volumes []corev1.Volume) string {
	if len(helper.VolumeMounts) != 1 {
		return fmt.Sprintf("the session helper has %d volume mounts, not the gateway key alone", len(helper.VolumeMounts))
	}
	m := helper.VolumeMounts[0]
	if m.Name != GatewayKeyVolume || m.MountPath != gatewayKeyDir || !m.ReadOnly || m.SubPath != "" || m.SubPathExpr != "" ||
		(m.MountPropagation != nil && *m.MountPropagation != corev1.MountPropagationNone) {
		return "the session helper's key mount is not the one hiloop rendered"
	}
	found := false
	for _, v := range volumes {
		if v.Name != GatewayKeyVolume {
			continue
		}
		found = true
		d := v.DownwardAPI
		if d == nil {
			return "the gateway key volume is not the downwardAPI volume hiloop rendered"
		}
		if len(d.Items) != 1 || d.Items[0].Path != gatewayKeyFile || d.Items[0].ResourceFieldRef != nil ||
			d.Items[0].FieldRef == nil || d.Items[0].FieldRef.FieldPath != gatewayKeyField {
			return "the gateway key volume projects something other than the gateway key annotation"
		}
	}
	if !found {
		return "the gateway key volume is missing"
	}
	return ""
}
