package mirror

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"sigs.k8s.io/agent-sandbox/api/v1beta1"
)

// Sandboxes are a custom resource, so the API server sends them as JSON,
// and client-go's decoder reads every watch event four times over (the
// kind of the event, the event, the kind of the object, the object) into a
// whole typed Sandbox, pod template and managed fields included, only for
// the informer's transform to keep a few fields of it, the largest of
// serve's costs while sandboxes are created (docs/benchmarks.md). So the
// mirror lists and watches Sandboxes itself and decodes each event in one
// pass, into only what its view keeps (liteSandbox), then a typed Sandbox
// that has those fields alone.

// sandboxListWatch lists and watches the Sandboxes of namespace ns that
// match selector, through rc, the Sandbox group's REST client.
func sandboxListWatch(rc rest.Interface, ns, selector string) *cache.ListWatch {
	req := func(opts *metav1.ListOptions) *rest.Request {
		opts.LabelSelector = selector
		r := rc.Get().Namespace(ns).Resource("sandboxes").VersionedParams(opts, metav1.ParameterCodec)
		if opts.TimeoutSeconds != nil {
			r = r.Timeout(time.Duration(*opts.TimeoutSeconds) * time.Second)
		}
		return r
	}
	return &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
			raw, err := req(&opts).Do(ctx).Raw()
			if err != nil {
				return nil, err
			}
			var list struct {
				Metadata metav1.ListMeta `json:"metadata"`
				Items    []liteSandbox   `json:"items"`
			}
			if err := json.Unmarshal(raw, &list); err != nil {
				return nil, fmt.Errorf("decode sandbox list: %w", err)
			}
			out := &v1beta1.SandboxList{ListMeta: list.Metadata, Items: make([]v1beta1.Sandbox, len(list.Items))}
			for i := range list.Items {
				sb, err := list.Items[i].sandbox()
				if err != nil {
					return nil, err
				}
				out.Items[i] = *sb
			}
			return out, nil
		},
		WatchFuncWithContext: func(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
			opts.Watch = true
			body, err := req(&opts).Stream(ctx)
			if err != nil {
				return nil, err
			}
			return watch.NewStreamWatcher(&sandboxDecoder{body: body, dec: json.NewDecoder(body)},
				apierrors.NewClientErrorReporter(http.StatusInternalServerError, "GET", "ClientWatchDecoding")), nil
		},
	}
}

// liteSandbox is what the mirror reads of a Sandbox's JSON: what
// compactSandbox keeps, and the annotations, which also carry the mark of
// the end of a watch's initial events. Its status stays raw: a watch's
// error event has a Status for its object, whose status is a string
// (sandboxDecoder).
type liteSandbox struct {
	Metadata struct {
		Name              string                  `json:"name"`
		Namespace         string                  `json:"namespace"`
		UID               types.UID               `json:"uid"`
		ResourceVersion   string                  `json:"resourceVersion"`
		Generation        int64                   `json:"generation"`
		CreationTimestamp metav1.Time             `json:"creationTimestamp"`
		DeletionTimestamp *metav1.Time            `json:"deletionTimestamp"`
		Labels            map[string]string       `json:"labels"`
		Annotations       map[string]string       `json:"annotations"`
		OwnerReferences   []metav1.OwnerReference `json:"ownerReferences"`
	} `json:"metadata"`
	Spec struct {
		OperatingMode v1beta1.SandboxOperatingMode `json:"operatingMode"`
		ShutdownTime  *metav1.Time                 `json:"shutdownTime"`
	} `json:"spec"`
	Status json.RawMessage `json:"status"`
}

func (l *liteSandbox) sandbox() (*v1beta1.Sandbox, error) {
	m := &l.Metadata
	out := &v1beta1.Sandbox{ObjectMeta: metav1.ObjectMeta{Name: m.Name, Namespace: m.Namespace, UID: m.UID,
		ResourceVersion: m.ResourceVersion, Generation: m.Generation, CreationTimestamp: m.CreationTimestamp, DeletionTimestamp: m.DeletionTimestamp,
		Labels: m.Labels, Annotations: m.Annotations, OwnerReferences: m.OwnerReferences}}
	out.Spec.OperatingMode, out.Spec.ShutdownTime = l.Spec.OperatingMode, l.Spec.ShutdownTime
	if len(l.Status) > 0 {
		var st struct {
			Conditions []metav1.Condition `json:"conditions"`
		}
		if err := json.Unmarshal(l.Status, &st); err != nil {
			return nil, fmt.Errorf("decode sandbox %s status: %w", m.Name, err)
		}
		out.Status.Conditions = st.Conditions
	}
	return out, nil
}

// sandboxDecoder reads a Sandbox watch's events: each a JSON object of a
// type and an object, a Sandbox, or a Status for an error. Each event is
// decoded in one pass, into the fields of both.
type sandboxDecoder struct {
	body io.ReadCloser
	dec  *json.Decoder
}

func (d *sandboxDecoder) Decode() (watch.EventType, runtime.Object, error) {
	var ev struct {
		Type   watch.EventType `json:"type"`
		Object struct {
			liteSandbox
			// A Status's own fields; its status is liteSandbox's.
			Code    int32                 `json:"code"`
			Reason  metav1.StatusReason   `json:"reason"`
			Message string                `json:"message"`
			Details *metav1.StatusDetails `json:"details"`
		} `json:"object"`
	}
	if err := d.dec.Decode(&ev); err != nil {
		return "", nil, err
	}
	switch ev.Type {
	case watch.Added, watch.Modified, watch.Deleted, watch.Bookmark:
		sb, err := ev.Object.sandbox()
		if err != nil {
			return "", nil, err
		}
		return ev.Type, sb, nil
	case watch.Error:
		o := &ev.Object
		st := &metav1.Status{Code: o.Code, Reason: o.Reason, Message: o.Message, Details: o.Details}
		if err := json.Unmarshal(o.Status, &st.Status); err != nil {
			return "", nil, fmt.Errorf("decode sandbox watch error: %w", err)
		}
		return ev.Type, st, nil
	}
	return "", nil, fmt.Errorf("sandbox watch: event of unknown type %q", ev.Type)
}

func (d *sandboxDecoder) Close() { d.body.Close() }
