package server

import (
	"context"
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/gorilla/websocket"
	gossh "golang.org/x/crypto/ssh"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/hiloop/hiloop/api"
	"github.com/hiloop/hiloop/cluster"
	"github.com/hiloop/hiloop/control"
	"github.com/hiloop/hiloop/control/controltest"
	"github.com/hiloop/hiloop/internal/eventually"
	"github.com/hiloop/hiloop/receipt"
	"github.com/hiloop/hiloop/store"
)

// leaky is what a cluster error can carry that no answer may repeat: a
// service account, a pod and a node.
const leaky = `User "system:serviceaccount:hiloop-sandboxes:hiloop-org-x" cannot patch pod sbx-abc on node kwok-node-0`

type testServer struct {
	t     testing.TB
	srv   *Server
	db    *store.Store
	ctl   *control.Control
	fc    *controltest.Cluster
	org   store.Org
	token string
	keyID string
	ready func(context.Context) error
}

func newTestServer(t testing.TB, fc *controltest.Cluster, opts ...func(*Options, *control.Options)) *testServer {
	t.Helper()
	db, err := store.Open(context.Background(), store.Options{Path: filepath.Join(t.TempDir(), "s.db")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	co := control.Options{Store: db, Cluster: fc, Exec: controltest.Exec{}, Log: log, ClusterTimeout: time.Second,
		Caps: control.Capabilities{Transports: []receipt.Transport{receipt.TransportExec}, StorageClasses: []string{"fast"}}}
	so := Options{Log: log}
	for _, o := range opts {
		o(&so, &co)
	}
	ctl, err := control.New(co)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ctl.Close(context.Background()) })
	so.Control = ctl
	srv, err := New(so)
	if err != nil {
		t.Fatal(err)
	}
	org, secret, err := db.Bootstrap(context.Background(), "admin")
	if err != nil {
		t.Fatal(err)
	}
	k, _ := db.Authenticate(context.Background(), secret)
	return &testServer{t: t, srv: srv, db: db, ctl: ctl, fc: fc, org: org, token: secret, keyID: k.ID}
}

// do makes one request and returns the recorder.
func (ts *testServer) do(method, path, body string, headers ...string) *httptest.ResponseRecorder {
	ts.t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req := httptest.NewRequest(method, path, rd)
	req.Header.Set("Authorization", "Bearer "+ts.token)
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	rec := httptest.NewRecorder()
	ts.srv.ServeHTTP(rec, req)
	if strings.Contains(rec.Body.String(), "system:serviceaccount") || strings.Contains(rec.Body.String(), "kwok-node-0") ||
		strings.Contains(rec.Body.String(), "sbx-abc") {
		ts.t.Errorf("%s %s answered with cluster details: %s", method, path, rec.Body.String())
	}
	return rec
}

// create makes a sandbox and returns its id.
func (ts *testServer) create(body string) string {
	ts.t.Helper()
	rec := ts.do("POST", "/v1/sandboxes", body)
	if rec.Code != http.StatusCreated {
		ts.t.Fatalf("create: %d %s", rec.Code, rec.Body.String())
	}
	return decodeSandbox(ts.t, rec).ID
}

func decodeSandbox(t testing.TB, rec *httptest.ResponseRecorder) api.Sandbox {
	t.Helper()
	var sb api.Sandbox
	if err := json.Unmarshal(rec.Body.Bytes(), &sb); err != nil {
		t.Fatalf("decode %q: %v", rec.Body.String(), err)
	}
	return sb
}

func errCode(t testing.TB, rec *httptest.ResponseRecorder) string {
	t.Helper()
	var b api.ErrorBody
	if err := json.Unmarshal(rec.Body.Bytes(), &b); err != nil {
		t.Fatalf("decode error %q: %v", rec.Body.String(), err)
	}
	return b.Error.Code
}

func (ts *testServer) record(id string) store.Sandbox {
	ts.t.Helper()
	sb, err := ts.db.SandboxAnyOrg(context.Background(), id)
	if err != nil {
		ts.t.Fatal(err)
	}
	return sb
}

var (
	errTimeout   = apierrors.NewTimeoutError("request did not complete within the allotted timeout "+leaky, 1)
	errForbidden = apierrors.NewForbidden(schema.GroupResource{Group: "agents.x-k8s.io", Resource: "sandboxes"}, "sbx-abc", errors.New(leaky))
	errInvalid   = apierrors.NewInvalid(schema.GroupKind{Group: "agents.x-k8s.io", Kind: "Sandbox"}, "sbx-abc", nil)
)

// TestErrorMap drives each cluster failure through the API and checks the
// status, the code, Retry-After on 503, and what the record holds after.
func TestErrorMap(t *testing.T) {
	t.Run("mode change restored on cluster failure", func(t *testing.T) {
		ts := newTestServer(t, &controltest.Cluster{})
		id := ts.create(`{"image":"busybox"}`)
		ts.fc.Set(func(f *controltest.Cluster) { f.ModeErr = errTimeout })
		rec := ts.do("POST", "/v1/sandboxes/"+id+"/stop", "")
		if rec.Code != 503 || errCode(t, rec) != api.CodeClusterUnavailable || rec.Header().Get("Retry-After") == "" {
			t.Fatalf("stop with the cluster away: %d %s %q", rec.Code, rec.Body.String(), rec.Header().Get("Retry-After"))
		}
		if got := ts.record(id).DesiredMode; got != store.ModeRunning {
			t.Fatalf("desired mode after a failed stop: %s, want running", got)
		}
	})
	t.Run("expiry restored on cluster failure", func(t *testing.T) {
		ts := newTestServer(t, &controltest.Cluster{})
		id := ts.create(`{"image":"busybox","ttl":"1h"}`)
		before := ts.record(id)
		ts.fc.Set(func(f *controltest.Cluster) { f.ExpiryErr = errTimeout })
		rec := ts.do("PATCH", "/v1/sandboxes/"+id, `{"ttl":"5h","idle_timeout":"7m"}`)
		if rec.Code != 503 || errCode(t, rec) != api.CodeClusterUnavailable {
			t.Fatalf("ttl with the cluster away: %d %s", rec.Code, rec.Body.String())
		}
		after := ts.record(id)
		if !after.ExpiresAt.Equal(*before.ExpiresAt) || after.Spec.TTLSeconds != before.Spec.TTLSeconds || after.IdleTimeout != before.IdleTimeout {
			t.Fatalf("expiry and idle timeout after a failed change: %v %d %v, want %v %d %v", after.ExpiresAt, after.Spec.TTLSeconds, after.IdleTimeout,
				before.ExpiresAt, before.Spec.TTLSeconds, before.IdleTimeout)
		}
		// A sandbox without expiry gets none back.
		id2 := ts.create(`{"image":"busybox"}`)
		ts.do("PATCH", "/v1/sandboxes/"+id2, `{"ttl":"5h","idle_timeout":"7m"}`)
		if got := ts.record(id2); got.ExpiresAt != nil || got.Spec.TTLSeconds != 0 || got.IdleTimeout != 0 {
			t.Fatalf("expiry or idle timeout appeared after a failed change: %v %v", got.ExpiresAt, got.IdleTimeout)
		}
	})
	t.Run("conflict", func(t *testing.T) {
		ts := newTestServer(t, &controltest.Cluster{})
		id := ts.create(`{"image":"busybox"}`)
		ts.db.Observe(context.Background(), id, store.Observation{State: store.StateLost})
		rec := ts.do("POST", "/v1/sandboxes/"+id+"/start", "")
		if rec.Code != 409 || errCode(t, rec) != api.CodeConflict {
			t.Fatalf("start a lost sandbox: %d %s", rec.Code, rec.Body.String())
		}
	})
	t.Run("forbidden is an operator fault", func(t *testing.T) {
		ts := newTestServer(t, &controltest.Cluster{CreateErr: errForbidden})
		rec := ts.do("POST", "/v1/sandboxes", `{"image":"busybox"}`)
		if rec.Code != 500 || errCode(t, rec) != api.CodeClusterMisconfigured {
			t.Fatalf("create refused for permissions: %d %s", rec.Code, rec.Body.String())
		}
		list := ts.do("GET", "/v1/sandboxes", "")
		if !strings.Contains(list.Body.String(), `"failed"`) {
			t.Fatalf("record after a definite refusal: %s", list.Body.String())
		}
	})
	t.Run("admission refusal", func(t *testing.T) {
		ts := newTestServer(t, &controltest.Cluster{CreateErr: errInvalid})
		rec := ts.do("POST", "/v1/sandboxes", `{"image":"busybox"}`)
		if rec.Code != 422 || errCode(t, rec) != api.CodeClusterRejected {
			t.Fatalf("create refused by admission: %d %s", rec.Code, rec.Body.String())
		}
	})
	t.Run("not ready, bounded, without details", func(t *testing.T) {
		hung := make(chan struct{})
		t.Cleanup(func() { close(hung) })
		ts := newTestServer(t, &controltest.Cluster{}, func(o *Options, _ *control.Options) {
			o.ReadyTimeout = 200 * time.Millisecond
			o.Ready = func(ctx context.Context) error {
				<-hung // a hung API server that ignores ctx, until the test ends
				return nil
			}
		})
		done := make(chan *httptest.ResponseRecorder, 1)
		go func() { done <- ts.do("GET", "/readyz", "") }()
		select {
		case rec := <-done:
			if rec.Code != 503 || errCode(t, rec) != api.CodeNotReady || rec.Header().Get("Retry-After") == "" {
				t.Fatalf("readyz: %d %s", rec.Code, rec.Body.String())
			}
		case <-time.After(30 * time.Second):
			t.Fatal("readyz did not answer while the check hung")
		}
		ts2 := newTestServer(t, &controltest.Cluster{}, func(o *Options, _ *control.Options) {
			o.Ready = func(context.Context) error { return errors.New(leaky) }
		})
		if rec := ts2.do("GET", "/readyz", ""); rec.Code != 503 {
			t.Fatalf("readyz: %d", rec.Code)
		}
	})
}

// TestAmbiguousCreate: a create whose cluster write timed out after the
// object was written is accepted, stays pending, and is resolved by
// adopting the object: never failed, never created twice.
func TestAmbiguousCreate(t *testing.T) {
	ts := newTestServer(t, &controltest.Cluster{CreateErr: errTimeout, CreateWrites: true})
	rec := ts.do("POST", "/v1/sandboxes", `{"image":"busybox"}`, "Idempotency-Key", "k1")
	if rec.Code != http.StatusAccepted {
		t.Fatalf("ambiguous create: %d %s", rec.Code, rec.Body.String())
	}
	sb := decodeSandbox(t, rec)
	if sb.State != api.StatePending {
		t.Fatalf("state %s, want pending", sb.State)
	}
	eventually.True(t, "adoption", func() bool { return contains(ts.fc.Calls(), "exists "+sb.ID) })
	creates := 0
	for _, c := range ts.fc.Calls() {
		if strings.HasPrefix(c, "create ") {
			creates++
		}
	}
	if creates != 1 {
		t.Fatalf("creates %d, want 1 (the object existed): %v", creates, ts.fc.Calls())
	}
	if got := ts.record(sb.ID).State; got != store.StatePending {
		t.Fatalf("record %s, want pending until the mirror observes the object", got)
	}
	// A retry with the key finds the same sandbox.
	again := ts.do("POST", "/v1/sandboxes", `{"image":"busybox"}`, "Idempotency-Key", "k1")
	if again.Code != 200 || decodeSandbox(t, again).ID != sb.ID {
		t.Fatalf("retry: %d %s", again.Code, again.Body.String())
	}
}

// TestAmbiguousCreateNotWritten: when the timed-out write did not land, the
// resolution creates the object once the cluster answers.
func TestAmbiguousCreateNotWritten(t *testing.T) {
	ts := newTestServer(t, &controltest.Cluster{CreateErr: errTimeout})
	rec := ts.do("POST", "/v1/sandboxes", `{"image":"busybox"}`)
	if rec.Code != http.StatusAccepted {
		t.Fatalf("ambiguous create: %d %s", rec.Code, rec.Body.String())
	}
	id := decodeSandbox(t, rec).ID
	ts.fc.Set(func(f *controltest.Cluster) { f.CreateErr = nil })
	eventually.True(t, "object created", func() bool { return ts.fc.Has(id) })
	if got := ts.record(id).State; got == store.StateFailed {
		t.Fatal("an ambiguous create was failed")
	}
}

// TestStartStopAfterOutOfBandMode: the cluster is written whatever the
// record's desired mode was.
func TestStartStopAfterOutOfBandMode(t *testing.T) {
	ts := newTestServer(t, &controltest.Cluster{})
	id := ts.create(`{"image":"busybox"}`)
	// Suspended outside hiloop: desired stays running, the mirror sees
	// stopped.
	ts.db.Observe(context.Background(), id, store.Observation{State: store.StateStopped})
	if rec := ts.do("POST", "/v1/sandboxes/"+id+"/start", ""); rec.Code != 200 {
		t.Fatalf("start: %d %s", rec.Code, rec.Body.String())
	}
	if !contains(ts.fc.Calls(), "mode "+id+" running") {
		t.Fatalf("start wrote nothing to the cluster: %v", ts.fc.Calls())
	}
	// And the other way round: stopped through the API, resumed outside.
	ts.do("POST", "/v1/sandboxes/"+id+"/stop", "")
	ts.db.Observe(context.Background(), id, store.Observation{State: store.StateRunning})
	before := len(ts.fc.Calls())
	if rec := ts.do("POST", "/v1/sandboxes/"+id+"/stop", ""); rec.Code != 200 {
		t.Fatalf("stop: %d %s", rec.Code, rec.Body.String())
	}
	if !contains(ts.fc.Calls()[before:], "mode "+id+" stopped") {
		t.Fatalf("second stop wrote nothing: %v", ts.fc.Calls())
	}
}

// TestDeleteTerminalDeletesObject: deleting a failed, lost or exited
// sandbox deletes whatever carries its name and records the delete.
func TestDeleteTerminalDeletesObject(t *testing.T) {
	for _, st := range []store.State{store.StateFailed, store.StateLost, store.StateExited} {
		ts := newTestServer(t, &controltest.Cluster{})
		id := ts.create(`{"image":"busybox"}`)
		if st == store.StateFailed {
			ts.db.Fail(context.Background(), id, "x")
		} else {
			ts.db.Observe(context.Background(), id, store.Observation{State: st})
		}
		rec := ts.do("DELETE", "/v1/sandboxes/"+id, "")
		if rec.Code != 200 || decodeSandbox(t, rec).Desired != api.ModeDeleted {
			t.Fatalf("%s: delete %d %s", st, rec.Code, rec.Body.String())
		}
		if !contains(ts.fc.Calls(), "delete "+id) {
			t.Fatalf("%s: no cluster delete: %v", st, ts.fc.Calls())
		}
	}
}

// TestIdempotencyCanonical: the same request with its keys reordered and
// other whitespace is a replay, not a conflict.
func TestIdempotencyCanonical(t *testing.T) {
	ts := newTestServer(t, &controltest.Cluster{})
	a := ts.do("POST", "/v1/sandboxes", `{"image":"busybox","labels":{"a":"1","b":"2"},"ttl":"1h"}`, "Idempotency-Key", "k")
	b := ts.do("POST", "/v1/sandboxes", "{ \"ttl\": \"1h\",\n \"labels\": {\"b\":\"2\", \"a\":\"1\"}, \"image\": \"busybox\" }", "Idempotency-Key", "k")
	if a.Code != 201 || b.Code != 200 || decodeSandbox(t, a).ID != decodeSandbox(t, b).ID {
		t.Fatalf("reordered retry: %d %d %s", a.Code, b.Code, b.Body.String())
	}
	c := ts.do("POST", "/v1/sandboxes", `{"image":"busybox","ttl":"2h"}`, "Idempotency-Key", "k")
	if c.Code != 409 || errCode(t, c) != api.CodeIdempotencyConflict {
		t.Fatalf("other request, same key: %d %s", c.Code, c.Body.String())
	}
}

// TestValidationBounds: sha512 digests are images; absurdly small resources
// are refused with the minimum named.
func TestValidationBounds(t *testing.T) {
	ts := newTestServer(t, &controltest.Cluster{})
	ts.create(`{"image":"busybox@sha512:` + strings.Repeat("a", 128) + `"}`)
	for _, tc := range []struct{ body, field, says string }{
		{`{"image":"busybox","resources":{"memory_limit":"1"}}`, "resources.memory_limit", "minimum 16Mi"},
		{`{"image":"busybox","resources":{"cpu_request":"1n"}}`, "resources.cpu_request", "minimum 10m"},
		{`{"image":"busybox","volumes":[{"name":"d","size":"1","mount_path":"/d"}]}`, "volumes[0].size", "minimum 1Mi"},
		{`{"image":"busybox@sha512:abc"}`, "image", "not a valid image"},
		{`{"image":"busybox","transports":["Bad Name"]}`, "transports[0]", "not a transport"},
	} {
		rec := ts.do("POST", "/v1/sandboxes", tc.body)
		var b api.ErrorBody
		json.Unmarshal(rec.Body.Bytes(), &b)
		if rec.Code != 400 || b.Error.Field != tc.field || !strings.Contains(b.Error.Message, tc.says) {
			t.Errorf("%s: %d %s", tc.body, rec.Code, rec.Body.String())
		}
	}
	rec := ts.do("POST", "/v1/sandboxes", `{"image":"busybox","transports":["ssh"]}`)
	if rec.Code != 422 || errCode(t, rec) != api.CodeUnsupportedCapability {
		t.Errorf("unbacked transport: %d %s", rec.Code, rec.Body.String())
	}
	rec = ts.do("POST", "/v1/sandboxes", `{"image":"busybox","transports":["exec","exec"]}`)
	if rec.Code != 201 || strings.Join(decodeSandbox(t, rec).Transports, ",") != "exec" {
		t.Errorf("transports recorded: %d %s", rec.Code, rec.Body.String())
	}
}

// TestReservedVolumeName: a sandbox's own volume may not take a name of
// the pod volumes hiloop renders (the controller would put the claim in
// place of the session helper's key volume); the refusal names the field,
// and nothing is created.
func TestReservedVolumeName(t *testing.T) {
	ts := newTestServer(t, &controltest.Cluster{})
	for _, name := range []string{"hiloop-gateway-key", "hiloop-x"} {
		rec := ts.do("POST", "/v1/sandboxes", `{"image":"busybox","transports":["exec"],"volumes":[`+
			`{"name":"data","size":"1Gi","mount_path":"/data"},{"name":"`+name+`","size":"1Gi","mount_path":"/k"}]}`)
		var b api.ErrorBody
		json.Unmarshal(rec.Body.Bytes(), &b)
		if rec.Code != 400 || b.Error.Code != api.CodeInvalidField || b.Error.Field != "volumes[1].name" || !strings.Contains(b.Error.Message, `names starting with "hiloop-" are hiloop's`) {
			t.Errorf("volume %q: %d %s", name, rec.Code, rec.Body.String())
		}
	}
	if calls := ts.fc.Calls(); len(calls) != 0 {
		t.Errorf("refused creates reached the cluster: %v", calls)
	}
	ts.create(`{"image":"busybox","volumes":[{"name":"my-hiloop-data","size":"1Gi","mount_path":"/data"}]}`)
}

// TestRevokeLastKey: the API refuses to revoke an organization's last live
// key, and a revoke ends the sessions opened with the key.
func TestRevokeLastKey(t *testing.T) {
	ts := newTestServer(t, &controltest.Cluster{})
	rec := ts.do("DELETE", "/v1/keys/"+ts.keyID, "")
	if rec.Code != 409 || errCode(t, rec) != api.CodeLastKey {
		t.Fatalf("revoke the last key: %d %s", rec.Code, rec.Body.String())
	}
	if rec := ts.do("GET", "/v1/org", ""); rec.Code != 200 {
		t.Fatalf("the key no longer works: %d", rec.Code)
	}
}

// TestSessionsEndOnRevoke: a live exec ends as soon as its key is revoked,
// and session bookkeeping drops to nothing.
func TestSessionsEndOnRevoke(t *testing.T) {
	ts := newTestServer(t, &controltest.Cluster{})
	id := ts.create(`{"image":"busybox"}`)
	ts.db.Observe(context.Background(), id, store.Observation{State: store.StateRunning})
	second := ts.do("POST", "/v1/keys", `{"name":"second"}`)
	var ck api.CreatedKey
	json.Unmarshal(second.Body.Bytes(), &ck)
	done := make(chan *httptest.ResponseRecorder, 1)
	go func() {
		done <- ts.do("POST", "/v1/sandboxes/"+id+"/exec/run", `{"command":["sleep","1000"],"timeout":"1h"}`)
	}()
	eventually.True(t, "session live", func() bool { return ts.ctl.Sessions() == 1 })
	// Revoke the key the session runs under, with the other key.
	other := *ts
	other.token = ck.Secret
	if rec := other.do("DELETE", "/v1/keys/"+ts.keyID, ""); rec.Code != 204 {
		t.Fatalf("revoke: %d %s", rec.Code, rec.Body.String())
	}
	select {
	case rec := <-done:
		if rec.Code != 409 || errCode(t, rec) != api.CodeSessionEnded {
			t.Fatalf("exec after revoke: %d %s", rec.Code, rec.Body.String())
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the session outlived its key")
	}
	eventually.True(t, "no session", func() bool { return ts.ctl.Sessions() == 0 })
}

// TestExecClusterUnreachable: an exec that cannot reach the cluster is 503
// cluster_unavailable, not a command that timed out.
func TestExecClusterUnreachable(t *testing.T) {
	ts := newTestServer(t, &controltest.Cluster{}, func(_ *Options, co *control.Options) {
		co.Exec = controltest.Exec{Err: &cluster.ConnectError{Err: errors.New("dial tcp: " + leaky)}}
	})
	id := ts.create(`{"image":"busybox"}`)
	ts.db.Observe(context.Background(), id, store.Observation{State: store.StateRunning})
	rec := ts.do("POST", "/v1/sandboxes/"+id+"/exec/run", `{"command":["true"]}`)
	if rec.Code != 503 || errCode(t, rec) != api.CodeClusterUnavailable || rec.Header().Get("Retry-After") == "" {
		t.Fatalf("exec with the cluster away: %d %s", rec.Code, rec.Body.String())
	}
	ts2 := newTestServer(t, &controltest.Cluster{}, func(_ *Options, co *control.Options) {
		co.Exec = controltest.Exec{Err: errors.New("stream reset: " + leaky)}
	})
	id = ts2.create(`{"image":"busybox"}`)
	ts2.db.Observe(context.Background(), id, store.Observation{State: store.StateRunning})
	if rec := ts2.do("POST", "/v1/sandboxes/"+id+"/exec/run", `{"command":["true"]}`); rec.Code != 502 || errCode(t, rec) != api.CodeExecFailed {
		t.Fatalf("broken exec: %d %s", rec.Code, rec.Body.String())
	}
}

// TestEveryCodeDocumented: every code of the API is in the OpenAPI
// document and in docs/api.md.
func TestEveryCodeDocumented(t *testing.T) {
	src, err := os.ReadFile("../api/errors.go")
	if err != nil {
		t.Fatal(err)
	}
	codes := regexp.MustCompile(`Code[A-Za-z]+ += "([a-z_]+)"`).FindAllStringSubmatch(string(src), -1)
	if len(codes) < 20 {
		t.Fatalf("found only %d codes in api/errors.go", len(codes))
	}
	spec, _ := os.ReadFile("openapi.yaml")
	doc, err := os.ReadFile("../docs/api.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range codes {
		if !regexp.MustCompile(`\b` + c[1] + `\b`).Match(spec) {
			t.Errorf("code %s is not in openapi.yaml", c[1])
		}
		if !strings.Contains(string(doc), "`"+c[1]+"`") {
			t.Errorf("code %s is not in docs/api.md", c[1])
		}
	}
}

// TestExecArgvInFirstMessage: without command in the URL the argv is the
// first (text) message; a bad first message ends the session with an error
// frame, and the argv never appears in the URL.
func TestExecArgvInFirstMessage(t *testing.T) {
	got := make(chan []string, 1)
	ts := newTestServer(t, &controltest.Cluster{}, func(_ *Options, co *control.Options) {
		co.Exec = controltest.Exec{Run: func(_ context.Context, req cluster.ExecRequest) (cluster.ExitStatus, error) {
			got <- req.Command
			return cluster.ExitStatus{Code: 7}, nil
		}}
	})
	id := ts.create(`{"image":"busybox"}`)
	ts.db.Observe(context.Background(), id, store.Observation{State: store.StateRunning})
	hs := httptest.NewServer(ts.srv)
	defer hs.Close()
	dial := func() *websocket.Conn {
		d := websocket.Dialer{Subprotocols: []string{api.ExecSubprotocol}}
		c, _, err := d.Dial("ws"+strings.TrimPrefix(hs.URL, "http")+"/v1/sandboxes/"+id+"/exec", http.Header{"Authorization": {"Bearer " + ts.token}})
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	exit := func(c *websocket.Conn) api.ExitFrame {
		for {
			_, b, err := c.ReadMessage()
			if err != nil {
				t.Fatalf("no exit frame: %v", err)
			}
			if len(b) > 0 && b[0] == api.ChanExit {
				var f api.ExitFrame
				json.Unmarshal(b[1:], &f)
				return f
			}
		}
	}
	c := dial()
	c.WriteMessage(websocket.TextMessage, []byte(`{"command":["sh","-c","exit 7"]}`))
	if f := exit(c); f.ExitCode == nil || *f.ExitCode != 7 {
		t.Fatalf("exit frame %+v", f)
	}
	c.Close()
	if argv := <-got; strings.Join(argv, " ") != "sh -c exit 7" {
		t.Fatalf("argv %q", argv)
	}
	for _, bad := range []struct {
		mt   int
		body string
	}{{websocket.BinaryMessage, "\x00x"}, {websocket.TextMessage, `{"command":[]}`}, {websocket.TextMessage, `{"argv":["true"]}`}} {
		c := dial()
		c.WriteMessage(bad.mt, []byte(bad.body))
		if f := exit(c); f.Error == nil || f.ExitCode != nil {
			t.Errorf("first message %q: exit frame %+v", bad.body, f)
		}
		c.Close()
	}
}

// TestAccessLogAndRequestIDs: every request gets an id, in the header and
// in error bodies, and one access-log line with its route pattern, status
// and organization; no key reaches the log, whatever the request carried.
func TestAccessLogAndRequestIDs(t *testing.T) {
	var buf logBuffer
	ts := newTestServer(t, &controltest.Cluster{}, func(o *Options, _ *control.Options) {
		o.Log = slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
	})
	id := ts.create(`{"image":"busybox"}`)
	rec := ts.do("GET", "/v1/sandboxes/"+id, "", RequestIDHeader, "client-chosen-1")
	if rec.Header().Get(RequestIDHeader) != "client-chosen-1" {
		t.Fatalf("request id %q, want the client's", rec.Header().Get(RequestIDHeader))
	}
	bad := ts.do("GET", "/v1/sandboxes/sbx_none", "", RequestIDHeader, "not ok\nforged")
	var body api.ErrorBody
	json.Unmarshal(bad.Body.Bytes(), &body)
	if rid := bad.Header().Get(RequestIDHeader); rid == "" || rid == "not ok\nforged" || body.Error.RequestID != rid {
		t.Fatalf("error body id %q, header %q", body.Error.RequestID, rid)
	}
	wrong := httptest.NewRequest("GET", "/v1/org", nil)
	wrong.Header.Set("Authorization", "Bearer hl_thisisnotakeybutlookslikeone")
	ts.srv.ServeHTTP(httptest.NewRecorder(), wrong)

	var found bool
	for _, line := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
		var l map[string]any
		if err := json.Unmarshal([]byte(line), &l); err != nil {
			t.Fatalf("log line %q: %v", line, err)
		}
		if l["msg"] == "request" && l["route"] == "GET /v1/sandboxes/{id}" && l["request_id"] == "client-chosen-1" {
			found = l["org"] == ts.org.ID && l["status"] == float64(200) && l["duration_ms"] != nil
		}
	}
	if !found {
		t.Fatalf("no access-log line for the GET:\n%s", buf.String())
	}
	for _, secret := range []string{ts.token, "hl_thisisnotakeybutlookslikeone"} {
		if strings.Contains(buf.String(), secret) {
			t.Errorf("the log carries %q", secret)
		}
	}
}

// TestStorageUnavailable: when the record refuses writes, writes answer 503
// storage_unavailable with Retry-After (never 500), reads keep answering,
// /readyz turns red, and writes resume when storage does.
func TestStorageUnavailable(t *testing.T) {
	var db *store.Store
	ts := newTestServer(t, &controltest.Cluster{}, func(o *Options, co *control.Options) {
		db = co.Store
		o.Ready = func(ctx context.Context) error { return co.Store.Probe(ctx) }
	})
	id := ts.create(`{"image":"busybox"}`)
	ctx := context.Background()
	if err := db.SetReadOnly(ctx, true); err != nil {
		t.Fatal(err)
	}
	for _, w := range []struct{ method, path, body string }{
		{"POST", "/v1/sandboxes", `{"image":"busybox"}`},
		{"POST", "/v1/sandboxes/" + id + "/stop", ""},
		{"PATCH", "/v1/sandboxes/" + id, `{"ttl":"1h"}`},
		{"POST", "/v1/keys", `{"name":"k"}`},
	} {
		rec := ts.do(w.method, w.path, w.body)
		if rec.Code != 503 || errCode(t, rec) != api.CodeStorageUnavailable || rec.Header().Get("Retry-After") == "" {
			t.Errorf("%s %s with storage read-only: %d %s", w.method, w.path, rec.Code, rec.Body.String())
		}
	}
	if rec := ts.do("GET", "/v1/sandboxes/"+id, ""); rec.Code != 200 {
		t.Fatalf("read with storage read-only: %d", rec.Code)
	}
	if rec := ts.do("GET", "/readyz", ""); rec.Code != 503 {
		t.Fatalf("readyz with storage read-only: %d", rec.Code)
	}
	if err := db.SetReadOnly(ctx, false); err != nil {
		t.Fatal(err)
	}
	ts.create(`{"image":"busybox"}`)
	if rec := ts.do("GET", "/readyz", ""); rec.Code != 200 {
		t.Fatalf("readyz after storage came back: %d", rec.Code)
	}
}

// TestRateLimits: a key past its rate gets 429 rate_limited with
// Retry-After, creates have their own tighter bucket, and another key of
// the same organization is not slowed.
func TestRateLimits(t *testing.T) {
	var logs logBuffer
	ts := newTestServer(t, &controltest.Cluster{}, func(o *Options, _ *control.Options) {
		o.RateLimits = RateLimits{PerKey: 1, Burst: 10, Creates: 0.5, CreateBurst: 2}
		o.Log = slog.New(slog.NewTextHandler(&logs, nil))
	})
	other := ts.do("POST", "/v1/keys", `{"name":"b"}`)
	var ck api.CreatedKey
	json.Unmarshal(other.Body.Bytes(), &ck)
	creates := 0
	for range 4 {
		if rec := ts.do("POST", "/v1/sandboxes", `{"image":"busybox"}`); rec.Code == 201 {
			creates++
		} else if rec.Code != 429 || errCode(t, rec) != api.CodeRateLimited || rec.Header().Get("Retry-After") == "" {
			t.Fatalf("create past the create rate: %d %s", rec.Code, rec.Body.String())
		}
	}
	if creates != 2 {
		t.Fatalf("%d creates got through a burst of 2", creates)
	}
	limited := 0
	for range 20 {
		if rec := ts.do("GET", "/v1/sandboxes", ""); rec.Code == 429 {
			limited++
		}
	}
	if limited == 0 {
		t.Fatal("20 quick requests past a burst of 10 were all served")
	}
	// Refusals get no access-log line each: one summary line per key per
	// reportEvery, and no secret.
	out := logs.String()
	if n := strings.Count(out, "status=429"); n != 0 {
		t.Errorf("%d access-log lines for refused requests:\n%s", n, out)
	}
	if n := strings.Count(out, `msg="rate limited"`); n != 1 || strings.Contains(out, ts.token) || strings.Contains(out, ts.token[3:15]) {
		t.Errorf("%d rate-limit summaries (want 1, without the secret):\n%s", n, out)
	}
	b := *ts
	b.token = ck.Secret
	if rec := b.do("GET", "/v1/sandboxes", ""); rec.Code != 200 {
		t.Fatalf("another key after the first was limited: %d", rec.Code)
	}
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

// TestNotHardened: while the self-check fails, creates and starts answer
// 503 cluster_not_hardened naming the objects, and /readyz stays 200 naming
// only the boundary's state; before the first check they are refused too;
// reads and stops go on; a passing check lifts it. A policy refusal names the policy and the chart's rule,
// and a cluster quota refusal is its own 429.
func TestNotHardened(t *testing.T) {
	var checks atomic.Pointer[[]cluster.Check]
	set := func(c ...cluster.Check) { checks.Store(&c) }
	ok := cluster.Check{Name: "quota", Object: "ResourceQuota ns/hiloop-sandboxes", OK: true}
	set(ok)
	ts := newTestServer(t, &controltest.Cluster{}, func(_ *Options, co *control.Options) {
		co.Boundary = func(context.Context) []cluster.Check { return *checks.Load() }
	})
	readyz := func(state string) {
		t.Helper()
		// Ready whatever the boundary; the body names its state alone.
		rec := ts.do("GET", "/readyz", "")
		var body map[string]string
		json.Unmarshal(rec.Body.Bytes(), &body)
		if rec.Code != 200 || len(body) != 2 || body["status"] != "ready" || body["boundary"] != state {
			t.Errorf("readyz: %d %q, want boundary %s", rec.Code, rec.Body.String(), state)
		}
	}
	if rec := ts.do("POST", "/v1/sandboxes", `{"image":"busybox"}`); rec.Code != 503 || errCode(t, rec) != api.CodeClusterNotHardened ||
		!strings.Contains(rec.Body.String(), "has not run yet") {
		t.Fatalf("create before the first check: %d %s", rec.Code, rec.Body.String())
	}
	readyz("not_hardened")
	ts.ctl.CheckBoundary(context.Background())
	id := ts.create(`{"image":"busybox"}`)

	set(ok, cluster.Check{Name: "admission_binding", Object: "ValidatingAdmissionPolicyBinding hiloop-sandbox-isolation", Problem: "missing",
		Detail: "validatingadmissionpolicybindings is forbidden: User \"system:serviceaccount:x:y\" cannot get"},
		cluster.Check{Name: "runtime_class", Object: "RuntimeClass (none)", Allowed: true, Problem: "no gVisor"})
	ts.ctl.CheckBoundary(context.Background())
	rec := ts.do("POST", "/v1/sandboxes", `{"image":"busybox"}`)
	if rec.Code != 503 || errCode(t, rec) != api.CodeClusterNotHardened || rec.Header().Get("Retry-After") == "" ||
		!strings.Contains(rec.Body.String(), "ValidatingAdmissionPolicyBinding hiloop-sandbox-isolation: missing") ||
		strings.Contains(rec.Body.String(), "RuntimeClass") || strings.Contains(rec.Body.String(), "serviceaccount") {
		t.Errorf("create while not hardened: %d %s", rec.Code, rec.Body.String())
	}
	readyz("not_hardened")
	if rec := ts.do("POST", "/v1/sandboxes/"+id+"/stop", ""); rec.Code != 200 {
		t.Fatalf("stop while not hardened: %d %s", rec.Code, rec.Body.String())
	}
	if rec := ts.do("POST", "/v1/sandboxes/"+id+"/start", ""); rec.Code != 503 || errCode(t, rec) != api.CodeClusterNotHardened {
		t.Errorf("start while not hardened: %d %s", rec.Code, rec.Body.String())
	}
	if rec := ts.do("GET", "/v1/sandboxes/"+id, ""); rec.Code != 200 {
		t.Errorf("read while not hardened: %d", rec.Code)
	}

	// An allowed failure alone is insecure; a warning refuses nothing.
	set(ok, cluster.Check{Name: "runtime_class", Object: "RuntimeClass (none)", Allowed: true, Problem: "no gVisor"},
		cluster.Check{Name: cluster.CheckForeignSandboxes, Object: "Sandboxes in namespace ns that hiloop did not make", Warning: true, Count: 1, Problem: "1 Sandboxes: x"})
	ts.ctl.CheckBoundary(context.Background())
	readyz("insecure")
	if rec := ts.do("POST", "/v1/sandboxes/"+id+"/start", ""); rec.Code != 200 {
		t.Errorf("start once hardened: %d %s", rec.Code, rec.Body.String())
	}

	set(ok)
	ts.ctl.CheckBoundary(context.Background())
	readyz("hardened")

	denied := apierrors.NewInvalid(schema.GroupKind{Group: "agents.x-k8s.io", Kind: "Sandbox"}, "sbx-abc", field.ErrorList{field.Invalid(nil, nil,
		"ValidatingAdmissionPolicy 'hiloop-sandbox-isolation' with binding 'hiloop-sandbox-isolation' denied request: [runtime-class] a sandbox must run under the gvisor runtime class")})
	ts.fc.Set(func(f *controltest.Cluster) { f.CreateErr = denied })
	rec = ts.do("POST", "/v1/sandboxes", `{"image":"busybox"}`)
	if rec.Code != 422 || errCode(t, rec) != api.CodeClusterRejected ||
		!strings.Contains(rec.Body.String(), "admission policy hiloop-sandbox-isolation refused the sandbox: [runtime-class] a sandbox must run under the gvisor runtime class") {
		t.Errorf("policy refusal: %d %s", rec.Code, rec.Body.String())
	}
	quota := apierrors.NewForbidden(schema.GroupResource{Group: "agents.x-k8s.io", Resource: "sandboxes"}, "sbx-abc",
		errors.New("exceeded quota: hiloop-sandboxes, requested: count/sandboxes.agents.x-k8s.io=1, used: 2, limited: 2"))
	ts.fc.Set(func(f *controltest.Cluster) { f.CreateErr = quota })
	rec = ts.do("POST", "/v1/sandboxes", `{"image":"busybox"}`)
	if rec.Code != 429 || errCode(t, rec) != api.CodeClusterQuotaExceeded || strings.Contains(rec.Body.String(), "limited") {
		t.Errorf("cluster quota: %d %s", rec.Code, rec.Body.String())
	}
	uncounted := apierrors.NewForbidden(schema.GroupResource{Group: "agents.x-k8s.io", Resource: "sandboxes"}, "sbx-abc",
		errors.New("status unknown for quota: hiloop-sandboxes, resources: count/sandboxes.agents.x-k8s.io"))
	ts.fc.Set(func(f *controltest.Cluster) { f.CreateErr = uncounted })
	rec = ts.do("POST", "/v1/sandboxes", `{"image":"busybox"}`)
	if rec.Code != 503 || errCode(t, rec) != api.CodeClusterUnavailable || rec.Header().Get("Retry-After") == "" {
		t.Errorf("a quota not yet counted: %d %s", rec.Code, rec.Body.String())
	}
}

// TestLongPoll: GET /v1/sandboxes/{id}?while=STATE answers when the state
// changes, when the wait is up (still in STATE), and at once when the state
// is already another; its parameters are checked; and another
// organization's key gets 404 from it, as from a plain GET.
func TestLongPoll(t *testing.T) {
	ts := newTestServer(t, &controltest.Cluster{})
	id := ts.create(`{"image":"busybox"}`)
	ctx := context.Background()

	done := make(chan *httptest.ResponseRecorder, 1)
	go func() { done <- ts.do("GET", "/v1/sandboxes/"+id+"?while=pending&wait=1m", "") }()
	eventually.True(t, "the long poll waiting", func() bool { return ts.db.Waiting() == 1 })
	select {
	case rec := <-done:
		t.Fatalf("the long poll answered before any change: %d %s", rec.Code, rec.Body.String())
	default:
	}
	if _, err := ts.db.Observe(ctx, id, store.Observation{State: store.StateStarting}); err != nil {
		t.Fatal(err)
	}
	select {
	case rec := <-done:
		if rec.Code != 200 || decodeSandbox(t, rec).State != api.StateStarting {
			t.Fatalf("long poll after the change: %d %s", rec.Code, rec.Body.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the long poll did not answer the state change")
	}

	if rec := ts.do("GET", "/v1/sandboxes/"+id+"?while=starting&wait=20ms", ""); rec.Code != 200 || decodeSandbox(t, rec).State != api.StateStarting {
		t.Errorf("long poll whose wait is up: %d %s", rec.Code, rec.Body.String())
	}
	if rec := ts.do("GET", "/v1/sandboxes/"+id+"?while=running", ""); rec.Code != 200 || decodeSandbox(t, rec).State != api.StateStarting {
		t.Errorf("long poll in another state already: %d %s", rec.Code, rec.Body.String())
	}
	if n := ts.db.Waiting(); n != 0 {
		t.Errorf("%d sandboxes still waited on after every long poll answered", n)
	}

	for q, code := range map[string]string{
		"?while=nope":               api.CodeInvalidField,
		"?wait=5s":                  api.CodeInvalidField,
		"?while=starting&wait=0s":   api.CodeInvalidField,
		"?while=starting&wait=2m":   api.CodeInvalidField,
		"?while=starting&wait=soon": api.CodeInvalidField,
		"?while=starting&wait=":     api.CodeInvalidField,
		"?state=running":            api.CodeUnknownField,
	} {
		if rec := ts.do("GET", "/v1/sandboxes/"+id+q, ""); rec.Code != 400 || errCode(t, rec) != code {
			t.Errorf("GET %s: %d %s, want 400 %s", q, rec.Code, rec.Body.String(), code)
		}
	}

	org, err := ts.db.CreateOrg(ctx, "other", 10, 10)
	if err != nil {
		t.Fatal(err)
	}
	_, secret, err := ts.db.CreateKey(ctx, org.ID, "k")
	if err != nil {
		t.Fatal(err)
	}
	other := *ts
	other.token = secret
	for _, q := range []string{"", "?while=starting&wait=50ms", "?while=running"} {
		if rec := other.do("GET", "/v1/sandboxes/"+id+q, ""); rec.Code != 404 {
			t.Errorf("another organization's GET %q: %d %s, want 404", q, rec.Code, rec.Body.String())
		}
	}
	theirs := other.create(`{"image":"busybox"}`)
	if rec := ts.do("GET", "/v1/sandboxes/"+theirs+"?while=pending&wait=50ms", ""); rec.Code != 404 {
		t.Errorf("a long poll on another organization's sandbox: %d %s, want 404", rec.Code, rec.Body.String())
	}
}

// TestLongPollsHoldNoReadSlot: long polls waiting do not take the key's
// read slots, so its other reads still answer; past WaitsPerKey a long
// poll answers at once, as a plain GET.
func TestLongPollsHoldNoReadSlot(t *testing.T) {
	const waitsInFlight = readsInFlight + 2
	ts := newTestServer(t, &controltest.Cluster{}, func(so *Options, _ *control.Options) {
		so.RateLimits = RateLimits{PerKey: 1000, Burst: 2000, WaitsPerKey: waitsInFlight}
	})
	id := ts.create(`{"image":"busybox"}`)
	done := make(chan int, waitsInFlight)
	for range waitsInFlight {
		go func() { done <- ts.do("GET", "/v1/sandboxes/"+id+"?while=pending&wait=1m", "").Code }()
	}
	eventually.True(t, "every long poll waiting", func() bool {
		ts.srv.limiters.mu.Lock()
		defer ts.srv.limiters.mu.Unlock()
		n := 0
		for _, k := range ts.srv.limiters.keys.m {
			n += len(k.waits)
		}
		return n == waitsInFlight && ts.db.Waiting() == 1
	})
	for _, path := range []string{"/v1/sandboxes/" + id, "/v1/sandboxes", "/v1/org"} {
		got := make(chan *httptest.ResponseRecorder, 1)
		go func() { got <- ts.do("GET", path, "") }()
		select {
		case rec := <-got:
			if rec.Code != 200 {
				t.Errorf("GET %s with long polls waiting: %d %s", path, rec.Code, rec.Body.String())
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("GET %s stalled behind the long polls", path)
		}
	}
	rec := ts.do("GET", "/v1/sandboxes/"+id+"?while=pending&wait=1m", "")
	if rec.Code != 200 || decodeSandbox(t, rec).State != api.StatePending {
		t.Errorf("a long poll past the key's limit: %d %s, want the sandbox at once", rec.Code, rec.Body.String())
	}
	if _, err := ts.db.Observe(context.Background(), id, store.Observation{State: store.StateStarting}); err != nil {
		t.Fatal(err)
	}
	for range waitsInFlight {
		if code := <-done; code != 200 {
			t.Errorf("long poll: %d", code)
		}
	}
}

// TestClientWait: Client.Wait follows each state change through the long
// poll, with progress at each, and says how far the sandbox got when its
// time is up.
func TestClientWait(t *testing.T) {
	ts := newTestServer(t, &controltest.Cluster{})
	hs := httptest.NewServer(ts.srv)
	defer hs.Close()
	c := &api.Client{URL: hs.URL, Token: ts.token, HTTP: hs.Client()}
	id := ts.create(`{"image":"busybox"}`)

	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	_, err := c.Wait(ctx, id, api.StateRunning)
	if err == nil || !strings.Contains(err.Error(), "timed out waiting for running; sandbox is pending") {
		t.Errorf("wait that runs out of time: %v", err)
	}

	// The server lets go of a long poll whose client went away.
	eventually.True(t, "the timed-out long poll let go", func() bool { return ts.db.Waiting() == 0 })

	// Each state is observed only once the client has reported the one
	// before it: a long poll that has not yet let go still counts as
	// waiting, and the next observation would otherwise overtake it.
	seen := make(chan api.State, 3)
	done := make(chan error, 1)
	go func() {
		_, err := c.WaitProgress(context.Background(), id, api.StateRunning, func(sb api.Sandbox) { seen <- sb.State })
		done <- err
	}()
	next := func() api.State {
		t.Helper()
		select {
		case st := <-seen:
			return st
		case <-time.After(30 * time.Second):
			t.Fatal("no progress reported")
			return ""
		}
	}
	if st := next(); st != api.StatePending {
		t.Fatalf("first progress %s, want pending", st)
	}
	for _, st := range []store.State{store.StateStarting, store.StateRunning} {
		eventually.True(t, "a long poll waiting", func() bool { return ts.db.Waiting() == 1 })
		if _, err := ts.db.Observe(context.Background(), id, store.Observation{State: st}); err != nil {
			t.Fatal(err)
		}
		if got := next(); string(got) != string(st) {
			t.Fatalf("progress %s, want %s", got, st)
		}
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("wait did not end at running")
	}
}

// TestSSHKeyTakenByAnotherOrganization: an organization registering
// another's public key neither blocks it nor learns that it is registered:
// both get 201, and each gets the same 409 for registering it twice in its
// own organization.
func TestSSHKeyTakenByAnotherOrganization(t *testing.T) {
	ts := newTestServer(t, &controltest.Cluster{})
	ctx := context.Background()
	orgB, err := ts.db.CreateOrg(ctx, "b", 10, 10)
	if err != nil {
		t.Fatal(err)
	}
	_, secretB, err := ts.db.CreateKey(ctx, orgB.ID, "b")
	if err != nil {
		t.Fatal(err)
	}
	b := *ts
	b.token = secretB
	body := sshKeyBody(t)
	for _, who := range []*testServer{&b, ts} {
		if rec := who.do("POST", "/v1/ssh-keys", body); rec.Code != http.StatusCreated {
			t.Fatalf("registering the key: %d %s", rec.Code, rec.Body.String())
		}
	}
	var msgs []string
	for _, who := range []*testServer{&b, ts} {
		rec := who.do("POST", "/v1/ssh-keys", body)
		if rec.Code != http.StatusConflict || errCode(t, rec) != api.CodeSSHKeyRegistered {
			t.Fatalf("registering the key twice: %d %s", rec.Code, rec.Body.String())
		}
		var eb api.ErrorBody
		json.Unmarshal(rec.Body.Bytes(), &eb)
		msgs = append(msgs, eb.Error.Message)
	}
	if msgs[0] != msgs[1] || strings.Contains(msgs[0], orgB.ID) || strings.Contains(msgs[0], ts.org.ID) {
		t.Errorf("the 409s say %q and %q: want one message naming no organization", msgs[0], msgs[1])
	}
}

// sshKeyBody is the body of POST /v1/ssh-keys for a new public key.
func sshKeyBody(t *testing.T) string {
	t.Helper()
	pub, _, err := ed25519.GenerateKey(nil)
	if err != nil {
		t.Fatal(err)
	}
	key, err := gossh.NewPublicKey(pub)
	if err != nil {
		t.Fatal(err)
	}
	return `{"public_key":` + strconv.Quote(strings.TrimSpace(string(gossh.MarshalAuthorizedKey(key)))) + `}`
}

// TestOrgShowsSessions: GET /v1/org shows the organization its live
// sessions against the session limits, and its busiest sandbox against
// the limit per sandbox, so a platform can see how close it runs.
func TestOrgShowsSessions(t *testing.T) {
	ts := newTestServer(t, &controltest.Cluster{}, func(_ *Options, co *control.Options) {
		co.Limits = control.Limits{PerSandbox: 3, PerOrg: 10}
	})
	ctx := context.Background()
	ids := []string{ts.create(`{"image":"busybox"}`), ts.create(`{"image":"busybox"}`)}
	for _, id := range ids {
		ts.db.Observe(ctx, id, store.Observation{State: store.StateRunning})
	}
	who := control.Caller{OrgID: ts.org.ID, KeyID: ts.keyID}
	for _, id := range []string{ids[0], ids[0], ids[1]} {
		s, err := ts.ctl.Admit(ctx, who, id, receipt.TransportExec)
		if err != nil {
			t.Fatal(err)
		}
		defer s.End()
	}
	rec := ts.do("GET", "/v1/org", "")
	var org api.Org
	if err := json.Unmarshal(rec.Body.Bytes(), &org); err != nil || org.Sessions == nil {
		t.Fatalf("GET /v1/org: %d %s", rec.Code, rec.Body.String())
	}
	if diff := cmp.Diff(api.OrgSessions{Open: 3, MaxPerOrg: 10, BusiestSandbox: 2, MaxPerSandbox: 3}, *org.Sessions); diff != "" {
		t.Errorf("sessions (-want +got):\n%s", diff)
	}
}
