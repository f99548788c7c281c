package k8s

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"time"

	"golang.org/x/sync/singleflight"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/agent-sandbox/api/v1beta1"

	"github.com/hiloop/hiloop/cluster"
	"github.com/hiloop/hiloop/receipt"
	"github.com/hiloop/hiloop/store"
)

// Writer is hiloop's whole write vocabulary against the cluster: create a
// Sandbox (and the org's service account it runs as), merge-patch its mode
// and expiry, annotate it, and delete it. It never server-side applies, so
// it never owns a field the controller manages. It is the core's cluster
// (control.Cluster): the methods the core calls fail with a
// *cluster.Error (Classify).
type Writer struct {
	c    *Clients
	opts RenderOptions

	mu       sync.Mutex
	accounts map[string]bool // service accounts known to exist
	// written is, for each Sandbox hiloop patched, the object's uid and
	// the generation its latest patch produced (see Written).
	written map[string]writtenAt
	// creating makes one create call per service account however many
	// sandbox creates of a new organization arrive at once.
	creating singleflight.Group
}

// NewWriter returns a Writer for the sandbox namespace of opts.
func NewWriter(c *Clients, opts RenderOptions) (*Writer, error) {
	if c == nil || opts.Namespace == "" || opts.RuntimeClass == "" {
		return nil, fmt.Errorf("k8s writer: clients, namespace and runtime class are required")
	}
	return &Writer{c: c, opts: opts, accounts: map[string]bool{}, written: map[string]writtenAt{}}, nil
}

// writtenAt is a Sandbox object's uid and a generation of it.
type writtenAt struct {
	uid        types.UID
	generation int64
}

// maxWritten bounds Writer.written: past it, the record starts over. A
// sandbox it forgets loses only the hold described at Written.
const maxWritten = 100_000

// Written is the uid of sandbox id's object and the generation hiloop's
// latest patch of it produced, as the API server answered it; "" and 0 when
// hiloop has not patched it since it started. The mirror holds its decisions
// about the sandbox until its watch shows that generation of that object,
// for a few seconds at most: it watches Sandboxes and pods as two streams,
// so without the hold it could see the pod of a start before the Sandbox
// that asked for it, and record for a moment a mode changed outside hiloop.
func (w *Writer) Written(id string) (uid string, generation int64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	at := w.written[id]
	return string(at.uid), at.generation
}

// wrote records that a patch of sandbox id's object produced obj.
func (w *Writer) wrote(id string, obj *v1beta1.Sandbox) {
	if obj == nil {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if at, ok := w.written[id]; ok && at.uid == obj.UID && at.generation >= obj.Generation {
		return // a later patch answered first
	}
	if len(w.written) >= maxWritten {
		clear(w.written)
	}
	w.written[id] = writtenAt{uid: obj.UID, generation: obj.Generation}
}

// Create renders and creates the Sandbox of a record. gatewayKey is the
// gateway's current public key (authorized_keys form), which a session
// helper accepts; it is needed only when the record's receipt has one. A
// Sandbox that already exists for the same id counts as created, so
// start-up can finish a create interrupted by a crash.
func (w *Writer) Create(ctx context.Context, sb store.Sandbox, gatewayKey string) error {
	return Classify(w.create(ctx, sb, gatewayKey))
}

func (w *Writer) create(ctx context.Context, sb store.Sandbox, gatewayKey string) error {
	opts := w.opts
	opts.GatewayKey = gatewayKey
	obj, err := Render(sb, opts)
	if err != nil {
		return err
	}
	if err := w.ensureServiceAccount(ctx, sb.OrgID); err != nil {
		return err
	}
	err = w.post(ctx, obj)
	if apierrors.IsAlreadyExists(err) {
		existing, gerr := w.c.Sandbox.AgentsV1beta1().Sandboxes(w.opts.Namespace).Get(ctx, obj.Name, metav1.GetOptions{})
		if gerr == nil && existing.Labels[LabelSandbox] == sb.ID {
			return nil
		}
	}
	if err != nil {
		return fmt.Errorf("create sandbox: %w", err)
	}
	return nil
}

// post creates obj. The typed client would decode the created object it is
// answered with, all of it, as JSON, and nothing here reads it: the create
// goes through the REST client, and only an error's body is read. (A fake
// clientset, in unit tests, has no REST client; it gets the typed call.)
func (w *Writer) post(ctx context.Context, obj *v1beta1.Sandbox) error {
	if rc, ok := w.c.Sandbox.AgentsV1beta1().RESTClient().(*rest.RESTClient); ok && rc != nil {
		return rc.Post().Namespace(w.opts.Namespace).Resource("sandboxes").Body(obj).Do(ctx).Error()
	}
	_, err := w.c.Sandbox.AgentsV1beta1().Sandboxes(w.opts.Namespace).Create(ctx, obj, metav1.CreateOptions{})
	return err
}

// Receipt is what a sandbox of the organization with this spec is promised
// under this deployment's options; the control plane stores it in the
// record at create time.
func (w *Writer) Receipt(orgID string, spec store.Spec) receipt.Receipt {
	return NewReceipt(orgID, spec, w.opts)
}

// Exists asks the API server whether a sandbox's object exists and carries
// its id.
func (w *Writer) Exists(ctx context.Context, id string) (bool, error) {
	obj, err := w.c.Sandbox.AgentsV1beta1().Sandboxes(w.opts.Namespace).Get(ctx, ObjectName(id), metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return false, nil
	}
	if err != nil {
		return false, Classify(fmt.Errorf("get sandbox: %w", err))
	}
	return obj.Labels[LabelSandbox] == id, nil
}

// ensureServiceAccount creates the organization's service account, with
// token automount disabled, the first time one of its sandboxes is created.
func (w *Writer) ensureServiceAccount(ctx context.Context, orgID string) error {
	name := ServiceAccountName(orgID)
	w.mu.Lock()
	known := w.accounts[name]
	w.mu.Unlock()
	if known {
		return nil
	}
	_, err, _ := w.creating.Do(name, func() (any, error) {
		sa := &corev1.ServiceAccount{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: w.opts.Namespace,
				Labels: map[string]string{LabelOrg: orgID, LabelManagedBy: ManagedBy}},
			AutomountServiceAccountToken: ptr.To(false),
		}
		_, err := w.c.Kube.CoreV1().ServiceAccounts(w.opts.Namespace).Create(ctx, sa, metav1.CreateOptions{})
		if err != nil && !apierrors.IsAlreadyExists(err) {
			return nil, fmt.Errorf("create service account: %w", err)
		}
		w.mu.Lock()
		w.accounts[name] = true
		w.mu.Unlock()
		return nil, nil
	})
	return err
}

// SetMode patches operatingMode: Suspended to stop, Running to start.
func (w *Writer) SetMode(ctx context.Context, id string, mode store.Mode) error {
	return Classify(w.patch(ctx, id, map[string]any{"spec": map[string]any{"operatingMode": operatingMode(mode)}}))
}

// SetExpiry patches shutdownTime.
func (w *Writer) SetExpiry(ctx context.Context, id string, at time.Time) error {
	return Classify(w.patch(ctx, id, map[string]any{"spec": map[string]any{"shutdownTime": at.UTC().Truncate(time.Second).Format(time.RFC3339)}}))
}

// Annotate sets one pod-template annotation; the controller re-propagates
// it onto the live pod.
func (w *Writer) Annotate(ctx context.Context, id, key, value string) error {
	return w.patch(ctx, id, map[string]any{"spec": map[string]any{"podTemplate": map[string]any{
		"metadata": map[string]any{"annotations": map[string]string{key: value}}}}})
}

// Delete deletes the Sandbox; the garbage collector removes its pod and
// claims. A Sandbox already gone is not an error.
func (w *Writer) Delete(ctx context.Context, id string) error {
	err := w.c.Sandbox.AgentsV1beta1().Sandboxes(w.opts.Namespace).Delete(ctx, ObjectName(id), metav1.DeleteOptions{
		PropagationPolicy: ptr.To(metav1.DeletePropagationBackground),
	})
	if err != nil && !apierrors.IsNotFound(err) {
		return Classify(fmt.Errorf("delete sandbox: %w", err))
	}
	w.mu.Lock()
	delete(w.written, id)
	w.mu.Unlock()
	return nil
}

func (w *Writer) patch(ctx context.Context, id string, body map[string]any) error {
	data, err := json.Marshal(body)
	if err != nil {
		return err
	}
	obj, err := w.c.Sandbox.AgentsV1beta1().Sandboxes(w.opts.Namespace).Patch(ctx, ObjectName(id), types.MergePatchType, data, metav1.PatchOptions{})
	if err != nil {
		return fmt.Errorf("patch sandbox: %w", err)
	}
	w.wrote(id, obj)
	return nil
}

// PodAddr is the IP of a sandbox's pod (the controller names it after the
// Sandbox), asked of the API server now. It answers only for the pod whose
// uid the mirror observed, carrying the sandbox's label, and only while it
// serves: phase Running, Ready, and not being deleted. Anything else is a
// *cluster.PodNotServingError. A pod's status.podIP is its own only while it runs:
// a Failed pod keeps it after the network has handed the address to another
// pod, so without these checks a record that lags could send a dial into
// another tenant's pod.
func (w *Writer) PodAddr(ctx context.Context, id, uid string) (string, error) {
	if uid == "" {
		return "", &cluster.PodNotServingError{Reason: "no pod has been observed yet"}
	}
	pod, err := w.c.Kube.CoreV1().Pods(w.opts.Namespace).Get(ctx, ObjectName(id), metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return "", &cluster.PodNotServingError{Reason: "the pod is gone"}
	}
	if err != nil {
		return "", Classify(fmt.Errorf("get pod: %w", err))
	}
	var reason string
	switch {
	case string(pod.UID) != uid:
		reason = "the pod was replaced since it was last observed"
	case pod.Labels[LabelSandbox] != id:
		reason = "the pod does not carry the sandbox's label"
	case pod.DeletionTimestamp != nil:
		reason = "the pod is being deleted"
	case pod.Status.Phase != corev1.PodRunning:
		reason = fmt.Sprintf("the pod is %q, not Running", pod.Status.Phase)
	case !PodReady(pod):
		reason = "the pod is not Ready"
	case pod.Status.PodIP == "":
		reason = "the pod has no address yet"
	default:
		return pod.Status.PodIP, nil
	}
	return "", &cluster.PodNotServingError{Reason: reason}
}

// PodReady reports whether a pod is Running with its Ready condition True.
func PodReady(p *corev1.Pod) bool {
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

// RotateGatewayKey writes a new gateway key into the pod template of every
// Sandbox that has a session helper: key gives the one for each sandbox id
// (each sandbox has its own, derived from the gateway's). The controller
// re-propagates template annotations to the live pod, the kubelet refreshes
// the projected file, and the helper reads it at the next login. A Sandbox
// whose label does not name the id of its name is left alone. It returns
// how many were patched.
// Each call to the API server (the list, each patch) is bounded by
// callTimeout.
func (w *Writer) RotateGatewayKey(ctx context.Context, callTimeout time.Duration, key func(id string) (string, error)) (int, error) {
	lctx, cancel := context.WithTimeout(ctx, callTimeout)
	list, err := w.c.Sandbox.AgentsV1beta1().Sandboxes(w.opts.Namespace).List(lctx, metav1.ListOptions{LabelSelector: Selector})
	cancel()
	if err != nil {
		return 0, fmt.Errorf("list sandboxes: %w", err)
	}
	n := 0
	for _, sb := range list.Items {
		if _, ok := sb.Spec.PodTemplate.ObjectMeta.Annotations[AnnotationGatewayKey]; !ok {
			continue
		}
		id, ok := IDFromName(sb.Name)
		if !ok || sb.Labels[LabelSandbox] != id {
			// Its identity is contradicted (the mirror holds it in
			// attention): no helper key is derived for a guess.
			continue
		}
		line, err := key(id)
		if err != nil {
			return n, fmt.Errorf("sandbox %s: %w", id, err)
		}
		actx, cancel := context.WithTimeout(ctx, callTimeout)
		err = w.Annotate(actx, id, AnnotationGatewayKey, line)
		cancel()
		if err != nil {
			return n, err
		}
		n++
	}
	return n, nil
}
