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
// the informer's transform to keep a few fields of it. That was a quarter of
// serve's CPU while sandboxes were being created (perf). The mirror lists
// and watches Sandboxes itself and decodes each event in one pass, into only
// what its view keeps (liteSandbox), then a typed Sandbox that has those
// fields alone.

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
			return watch.NewStreamWatcher(&sandboxDecoder{body: body},
				apierrors.NewClientErrorReporter(http.StatusInternalServerError, "GET", "ClientWatchDecoding")), nil
		},
	}
}

// liteSandbox is what the mirror reads of a Sandbox's JSON: what
// compactSandbox keeps, and the annotations, which also carry the mark of
// the end of a watch's initial events. (A watch's error event, whose
// object is a Status, is decoded apart: sandboxDecoder.)
type liteSandbox struct {
	Metadata struct {
		Name              string                  `json:"name"`
		Namespace         string                  `json:"namespace"`
		UID               types.UID               `json:"uid"`
		ResourceVersion   string                  `json:"resourceVersion"`
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
	Status struct {
		Conditions []metav1.Condition `json:"conditions"`
	} `json:"status"`
}

func (l *liteSandbox) sandbox() (*v1beta1.Sandbox, error) {
	m := &l.Metadata
	out := &v1beta1.Sandbox{ObjectMeta: metav1.ObjectMeta{Name: m.Name, Namespace: m.Namespace, UID: m.UID,
		ResourceVersion: m.ResourceVersion, CreationTimestamp: m.CreationTimestamp, DeletionTimestamp: m.DeletionTimestamp,
		Labels: m.Labels, Annotations: m.Annotations, OwnerReferences: m.OwnerReferences}}
	out.Spec.OperatingMode, out.Spec.ShutdownTime = l.Spec.OperatingMode, l.Spec.ShutdownTime
	out.Status.Conditions = l.Status.Conditions
	return out, nil
}

// sandboxDecoder reads a Sandbox watch's events: each a JSON object of a
// type and an object, a Sandbox, or a Status for an error. encoding/json
// walks every byte of an event twice (once to find its end, once to
// decode it), managed fields and pod template included, though the view
// keeps a few fields of a few hundred bytes: that was most of the cost of
// the watch. The decoder finds the event's end, and the members the view
// keeps, with a scan that looks only at quotes and brackets (scan.go), and
// decodes those members alone, in one json.Unmarshal. An error event, rare,
// is decoded whole.
type sandboxDecoder struct {
	body io.ReadCloser
	// buf holds what was read of the stream; buf[off:] is not decoded yet.
	buf []byte
	off int
	// kept is reused to assemble the members of each event that the view
	// keeps.
	kept []byte
}

// readChunk is how much the decoder asks of the stream at a time, at
// least: an event is a few kilobytes.
const readChunk = 32 << 10

// next returns the next JSON value of the stream, which stays valid until
// the next call.
func (d *sandboxDecoder) next() ([]byte, error) {
	for {
		start := skipSpace(d.buf, d.off)
		if start < len(d.buf) {
			end, err := skipValue(d.buf, start)
			if err == nil {
				d.off = end
				return d.buf[start:end], nil
			}
			if err != errShort {
				return nil, err
			}
		}
		// Not all of it yet: move what is left to the front and read more.
		n := copy(d.buf, d.buf[start:])
		d.buf, d.off = d.buf[:n], 0
		if cap(d.buf)-n < readChunk {
			d.buf = append(d.buf, make([]byte, readChunk)...)[:n]
		}
		m, err := d.body.Read(d.buf[n:cap(d.buf)])
		d.buf = d.buf[:n+m]
		if m > 0 {
			continue
		}
		if err == io.EOF && n > 0 {
			err = io.ErrUnexpectedEOF
		}
		if err == nil {
			err = io.ErrNoProgress
		}
		return nil, err
	}
}

func (d *sandboxDecoder) Decode() (watch.EventType, runtime.Object, error) {
	raw, err := d.next()
	if err != nil {
		return "", nil, err
	}
	// The object is read as a Sandbox as it is scanned; an error event's,
	// a Status, is decoded whole below.
	var typ, object []byte
	d.kept = d.kept[:0]
	if _, err := walk(raw, 0, func(key, b []byte, i int) (int, error) {
		switch string(key) {
		case "object":
			var end int
			d.kept, end, err = keptMembers(d.kept, b, i)
			object = b[i:end]
			return end, err
		case "type":
			end, err := skipValue(b, i)
			typ = b[i:end]
			return end, err
		}
		return skipValue(b, i)
	}); err != nil {
		return "", nil, fmt.Errorf("sandbox watch: %w", err)
	}
	var t watch.EventType
	if err := json.Unmarshal(typ, &t); err != nil {
		return "", nil, fmt.Errorf("sandbox watch: event type: %w", err)
	}
	switch t {
	case watch.Added, watch.Modified, watch.Deleted, watch.Bookmark:
		var l liteSandbox
		if err := json.Unmarshal(d.kept, &l); err != nil {
			return "", nil, fmt.Errorf("sandbox watch: %w", err)
		}
		sb, err := l.sandbox()
		if err != nil {
			return "", nil, err
		}
		return t, sb, nil
	case watch.Error:
		st := &metav1.Status{}
		if err := json.Unmarshal(object, st); err != nil {
			return "", nil, fmt.Errorf("decode sandbox watch error: %w", err)
		}
		return t, st, nil
	}
	return "", nil, fmt.Errorf("sandbox watch: event of unknown type %q", t)
}

// viewKeeps names the members of a Sandbox that liteSandbox reads, by
// object: its top-level members are metadata, spec and status.
var viewKeeps = map[string]map[string]bool{
	"metadata": {"name": true, "namespace": true, "uid": true, "resourceVersion": true, "creationTimestamp": true,
		"deletionTimestamp": true, "labels": true, "annotations": true, "ownerReferences": true},
	"spec":   {"operatingMode": true, "shutdownTime": true},
	"status": {"conditions": true},
}

// keptMembers appends to dst a JSON object of only the members of the
// Sandbox that starts at b[i] that the view keeps (viewKeeps): managed
// fields, the pod template and the rest are skipped unread. It scans the
// Sandbox once, and returns the index just past it.
func keptMembers(dst, b []byte, i int) ([]byte, int, error) {
	dst = append(dst, '{')
	outer := 0
	end, err := walk(b, i, func(key, b []byte, i int) (int, error) {
		keep := viewKeeps[string(key)]
		if keep == nil || b[i] != '{' {
			return skipValue(b, i)
		}
		if outer > 0 {
			dst = append(dst, ',')
		}
		outer++
		dst = append(append(append(dst, '"'), key...), `":{`...)
		inner := 0
		end, err := walk(b, i, func(k, b []byte, i int) (int, error) {
			end, err := skipValue(b, i)
			if err == nil && keep[string(k)] {
				if inner > 0 {
					dst = append(dst, ',')
				}
				inner++
				dst = append(append(append(append(dst, '"'), k...), `":`...), b[i:end]...)
			}
			return end, err
		})
		dst = append(dst, '}')
		return end, err
	})
	return append(dst, '}'), end, err
}

func (d *sandboxDecoder) Close() { d.body.Close() }
