package mirror

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"reflect"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/agent-sandbox/api/v1beta1"
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

	d := &sandboxDecoder{body: io.NopCloser(&stream)}
	d.dec = json.NewDecoder(d.body)
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
