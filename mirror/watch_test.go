package mirror

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"reflect"
	"testing"
	"testing/iotest"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/agent-sandbox/api/v1beta1"

	"github.com/hiloop/hiloop/k8s"
	"github.com/hiloop/hiloop/sandbox"
	"github.com/hiloop/hiloop/store"
)

// TestSandboxDecoderKeepsTheView: a Sandbox read from a watch by
// sandboxDecoder, which decodes only part of it, gives the mirror the same
// view as the whole typed object; an error event gives the Status the
// reflector reads (a 410 makes it list again), and a bookmark keeps the
// annotation that ends a watch's initial events.
func TestSandboxDecoderKeepsTheView(t *testing.T) {
	var stream bytes.Buffer
	enc := json.NewEncoder(&stream)
	objs := objectVariants()
	for _, o := range objs {
		o.UID, o.ResourceVersion = "u-1", "42"
		o.OwnerReferences = []metav1.OwnerReference{{APIVersion: "agents.x-k8s.io/v1beta1", Kind: "SandboxClaim", Name: "c", UID: "u-2", Controller: ptr.To(true)}}
		o.ManagedFields = []metav1.ManagedFieldsEntry{{Manager: "hiloop", Operation: metav1.ManagedFieldsOperationUpdate}}
		o.Status.ServiceFQDN = "sbx.ns.svc"
		enc.Encode(map[string]any{"type": watch.Modified, "object": o})
	}
	gone := apierrors.NewResourceExpired("too old resource version")
	enc.Encode(map[string]any{"type": watch.Error, "object": &gone.ErrStatus})
	enc.Encode(map[string]any{"type": watch.Bookmark, "object": &v1beta1.Sandbox{ObjectMeta: metav1.ObjectMeta{
		ResourceVersion: "43", Annotations: map[string]string{metav1.InitialEventsAnnotationKey: "true"}}}})

	d := &sandboxDecoder{body: io.NopCloser(iotest.OneByteReader(&stream))}
	for i, o := range objs {
		typ, got, err := d.Decode()
		if err != nil || typ != watch.Modified {
			t.Fatalf("event %d: %v %v", i, typ, err)
		}
		// What client-go's decoder would give: the whole object, read back.
		whole := &v1beta1.Sandbox{}
		raw, _ := json.Marshal(o)
		if err := json.Unmarshal(raw, whole); err != nil {
			t.Fatal(err)
		}
		want, _ := compact(whole)
		view, _ := compact(got)
		if !reflect.DeepEqual(view, want) {
			t.Errorf("object %d: view from the watch\n%+v\nwant\n%+v", i, view, want)
		}
	}
	typ, got, err := d.Decode()
	if st, ok := got.(*metav1.Status); err != nil || typ != watch.Error || !ok || st.Code != http.StatusGone || st.Reason != metav1.StatusReasonExpired {
		t.Errorf("error event: %v %#v %v", typ, got, err)
	}
	typ, got, err = d.Decode()
	if sb, ok := got.(*v1beta1.Sandbox); err != nil || typ != watch.Bookmark || !ok || sb.ResourceVersion != "43" ||
		sb.Annotations[metav1.InitialEventsAnnotationKey] != "true" {
		t.Errorf("bookmark: %v %#v %v", typ, got, err)
	}
	if _, _, err := d.Decode(); err != io.EOF {
		t.Errorf("end of stream: %v, want EOF", err)
	}
}

// BenchmarkSandboxDecoder reads a watch of a Sandbox as hiloop renders it,
// with the managed fields and status of one the controller has made Ready,
// through sandboxDecoder and, as the baseline, through encoding/json's
// decoder into the same fields (the decoder before the scan). It reports
// the time per event of each and their ratio.
func BenchmarkSandboxDecoder(b *testing.B) {
	obj, err := k8s.Render(store.Sandbox{ID: "sbx_bench", OrgID: "org_bench", DesiredMode: store.ModeRunning, Spec: store.Spec{Image: "busybox"}},
		k8s.RenderOptions{Namespace: "ns", RuntimeClass: "gvisor", Transports: []sandbox.Transport{sandbox.TransportExec}})
	if err != nil {
		b.Fatal(err)
	}
	obj.UID, obj.ResourceVersion, obj.CreationTimestamp = "u-1", "42", metav1.Now()
	for _, m := range []string{"hiloop", "agent-sandbox-controller", "agent-sandbox-controller"} {
		obj.ManagedFields = append(obj.ManagedFields, metav1.ManagedFieldsEntry{Manager: m, Operation: metav1.ManagedFieldsOperationUpdate,
			APIVersion: "agents.x-k8s.io/v1beta1", FieldsType: "FieldsV1", FieldsV1: &metav1.FieldsV1{Raw: []byte(
				`{"f:metadata":{"f:labels":{".":{},"f:hiloop.dev/org":{},"f:hiloop.dev/sandbox":{}}},"f:spec":{".":{},"f:podTemplate":{".":{},"f:spec":{".":{},"f:containers":{}}}},"f:status":{".":{},"f:conditions":{}}}`)}})
	}
	obj.Status.Conditions = []metav1.Condition{{Type: string(v1beta1.SandboxConditionReady), Status: metav1.ConditionTrue, Reason: "DependenciesReady",
		Message: "Pod is Ready; Service Exists", LastTransitionTime: metav1.Now(), ObservedGeneration: 1}}
	obj.Status.ServiceFQDN, obj.Status.Service = "sbx-bench.ns.svc.cluster.local", "sbx-bench"
	const events = 1000
	var stream bytes.Buffer
	enc := json.NewEncoder(&stream)
	for range events {
		enc.Encode(map[string]any{"type": watch.Modified, "object": obj})
	}
	b.Logf("%d bytes an event", stream.Len()/events)
	per := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / events / 1000 }
	var scanned, whole time.Duration
	for range b.N {
		t0 := time.Now()
		d := &sandboxDecoder{body: io.NopCloser(bytes.NewReader(stream.Bytes()))}
		for range events {
			if _, _, err := d.Decode(); err != nil {
				b.Fatal(err)
			}
		}
		scanned += time.Since(t0)
		t0 = time.Now()
		dec := json.NewDecoder(bytes.NewReader(stream.Bytes()))
		for range events {
			var ev struct {
				Type   watch.EventType `json:"type"`
				Object liteSandbox     `json:"object"`
			}
			if err := dec.Decode(&ev); err != nil {
				b.Fatal(err)
			}
			if _, err := ev.Object.sandbox(); err != nil {
				b.Fatal(err)
			}
		}
		whole += time.Since(t0)
	}
	b.ReportMetric(per(scanned)/float64(b.N), "scan-us/event")
	b.ReportMetric(per(whole)/float64(b.N), "encoding-json-us/event")
	b.ReportMetric(float64(scanned)/float64(whole), "ratio")
}
