package server

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hiloop/hiloop/api"
	"github.com/hiloop/hiloop/cluster"
	"github.com/hiloop/hiloop/control"
	"github.com/hiloop/hiloop/control/controltest"
	"github.com/hiloop/hiloop/receipt"
	"github.com/hiloop/hiloop/store"
)

// routeRequest is a request of the route with pattern p that passes every
// check but who may make it: its ids are ids, and its body and query are
// valid. Route patterns absent here fail the tests that use it, so a new
// route has to be added.
func routeRequest(t *testing.T, p string, ids map[string]string) *http.Request {
	t.Helper()
	method, path, _ := strings.Cut(p, " ")
	path = strings.NewReplacer("/v1/keys/{id}", "/v1/keys/"+ids["key"], "/v1/ssh-keys/{id}", "/v1/ssh-keys/"+ids["ssh-key"],
		"/previews/{pid}", "/previews/"+ids["preview"], "{id}", ids["sandbox"], "{pid}", ids["process"]).Replace(path)
	var body string
	headers := map[string]string{}
	switch p {
	case "POST /v1/keys":
		body = `{"name":"k"}`
	case "POST /v1/ssh-keys":
		body = sshKeyBody(t)
	case "POST /v1/sandboxes":
		body = `{"image":"busybox"}`
	case "PATCH /v1/sandboxes/{id}":
		body = `{"ttl":"1h","idle_timeout":"10m"}`
	case "POST /v1/sandboxes/{id}/exec/run":
		body = `{"command":["true"]}`
	case "GET /v1/sandboxes/{id}/exec":
		path += "?command=true"
		headers = map[string]string{"Connection": "Upgrade", "Upgrade": "websocket", "Sec-WebSocket-Version": "13",
			"Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==", "Sec-WebSocket-Protocol": api.ExecSubprotocol}
	case "PUT /v1/sandboxes/{id}/files":
		path += "?path=/tmp/f"
		body = "abc"
		headers["Content-Type"] = "application/octet-stream"
	case "GET /v1/sandboxes/{id}/files", "GET /v1/sandboxes/{id}/fs/list", "GET /v1/sandboxes/{id}/fs/stat":
		path += "?path=/tmp/f"
	case "POST /v1/sandboxes/{id}/processes":
		body = `{"command":["sleep","1"]}`
	case "POST /v1/sandboxes/{id}/processes/{pid}/signal":
		body = `{"signal":"TERM"}`
	case "POST /v1/sandboxes/{id}/processes/{pid}/stdin":
		body = "abc"
		headers["Content-Type"] = "application/octet-stream"
	case "GET /v1/sandboxes/{id}/processes/{pid}/output":
		path += "?offset=0"
	case "GET /v1/sandboxes/{id}/processes", "GET /v1/sandboxes/{id}/processes/{pid}", "DELETE /v1/sandboxes/{id}/processes/{pid}":
	case "POST /v1/sandboxes/{id}/fs/remove", "POST /v1/sandboxes/{id}/fs/mkdir":
		body = `{"path":"/tmp/f"}`
	case "POST /v1/sandboxes/{id}/fs/rename":
		body = `{"from":"/tmp/f","to":"/tmp/g"}`
	case "POST /v1/sandboxes/{id}/previews":
		body = `{"port":8080}`
	case "GET /healthz", "GET /readyz", "GET /v1/openapi.json", "GET /v1/org", "GET /v1/keys", "DELETE /v1/keys/{id}",
		"GET /v1/ssh-keys", "DELETE /v1/ssh-keys/{id}", "GET /v1/ssh/host-key", "GET /v1/sandboxes", "GET /v1/sandboxes/{id}",
		"DELETE /v1/sandboxes/{id}", "POST /v1/sandboxes/{id}/stop", "POST /v1/sandboxes/{id}/start",
		"POST /v1/sandboxes/{id}/touch", "GET /v1/sandboxes/{id}/events",
		"GET /v1/sandboxes/{id}/previews", "DELETE /v1/sandboxes/{id}/previews/{pid}":
	default:
		t.Fatalf("no request for route %s: add one", p)
	}
	req := httptest.NewRequest(method, path, strings.NewReader(body))
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	return req
}

// accessServer is a test server whose organization has a running
// sandbox, a second API key and an SSH key, and a second organization
// with its own key; ids names the first organization's records.
//
// Its commands end at once, and are counted in ran: no request of these
// tests may run one.
func accessServer(t *testing.T) (ts *testServer, ids map[string]string, otherSecret string, ran *atomic.Int64) {
	ran = &atomic.Int64{}
	fc := &controltest.Cluster{Transports: []receipt.Transport{receipt.TransportExec, receipt.TransportForward}, SessionPort: 2223}
	ts = newTestServer(t, fc, func(o *Options, co *control.Options) {
		co.Exec = controltest.Exec{Run: func(context.Context, cluster.ExecRequest) (cluster.ExitStatus, error) {
			ran.Add(1)
			return cluster.ExitStatus{}, nil
		}}
		co.Caps.Transports = append(co.Caps.Transports, receipt.TransportForward)
		o.Previews = Previews{Domain: "preview.test", Scheme: "https", Dial: func(*control.Session, int) (net.Conn, error) {
			ran.Add(1)
			return nil, errors.New("no sandbox app in this test")
		}}
	})
	ctx := context.Background()
	id := ts.create(`{"image":"busybox"}`)
	ts.db.Observe(ctx, id, store.Observation{State: store.StateRunning})
	k, _, err := ts.db.CreateKey(ctx, ts.org.ID, "second")
	if err != nil {
		t.Fatal(err)
	}
	rec := ts.do("POST", "/v1/ssh-keys", sshKeyBody(t))
	var sk api.SSHKey
	if rec.Code != http.StatusCreated || json.Unmarshal(rec.Body.Bytes(), &sk) != nil {
		t.Fatalf("add ssh key: %d %s", rec.Code, rec.Body.String())
	}
	orgB, err := ts.db.CreateOrg(ctx, "b", 10, 10)
	if err != nil {
		t.Fatal(err)
	}
	if _, otherSecret, err = ts.db.CreateKey(ctx, orgB.ID, "b"); err != nil {
		t.Fatal(err)
	}
	// A running process of the sandbox, in the record only.
	p, _, err := ts.db.StartProcess(ctx, ts.org.ID, store.Process{ID: store.NewID("proc"), SandboxID: id, Command: []string{"sleep", "1"}},
		store.ProcessLimits{Running: 1, Finished: 1})
	if err != nil {
		t.Fatal(err)
	}
	rec = ts.do("POST", "/v1/sandboxes/"+id+"/previews", `{"port":8080}`)
	var pv api.Preview
	if rec.Code != http.StatusCreated || json.Unmarshal(rec.Body.Bytes(), &pv) != nil {
		t.Fatalf("create preview: %d %s", rec.Code, rec.Body.String())
	}
	return ts, map[string]string{"sandbox": id, "key": k.ID, "ssh-key": sk.ID, "process": p.ID, "preview": pv.ID}, otherSecret, ran
}

func serve(ts *testServer, req *http.Request, token string) *httptest.ResponseRecorder {
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	rec := httptest.NewRecorder()
	ts.srv.ServeHTTP(rec, req)
	return rec
}

// unchanged fails the test when the first organization's records are not
// as accessServer left them: the sandbox running as created, both API
// keys and the SSH key in place.
func unchanged(t *testing.T, ts *testServer, ids map[string]string, what string) {
	t.Helper()
	ctx := context.Background()
	sb := ts.record(ids["sandbox"])
	if sb.DesiredMode != store.ModeRunning || sb.State != store.StateRunning || sb.ExpiresAt != nil {
		t.Errorf("%s changed the sandbox: mode %s, state %s, expires %v", what, sb.DesiredMode, sb.State, sb.ExpiresAt)
	}
	for _, kid := range []string{ts.keyID, ids["key"], ids["ssh-key"]} {
		if live, err := ts.db.KeyLive(ctx, ts.org.ID, kid); err != nil || !live {
			t.Errorf("%s: key %s is no longer live (%v)", what, kid, err)
		}
	}
	if _, err := ts.db.LivePreview(ctx, ts.org.ID, ids["preview"], time.Now()); err != nil {
		t.Errorf("%s: the preview is no longer live (%v)", what, err)
	}
}

// TestEveryKeyedRouteRefusesWithoutALiveKey: every route of the table
// that needs a key answers 401 unauthorized, and changes nothing, to a
// request without one, with a made-up one, and with a key revoked (or of
// an organization deleted in the record) — each route asked with a
// request that passes every other check. The routes that need no key
// answer without one.
func TestEveryKeyedRouteRefusesWithoutALiveKey(t *testing.T) {
	ts, ids, _, ran := accessServer(t)
	ctx := context.Background()
	_, revoked, err := ts.db.CreateKey(ctx, ts.org.ID, "revoked")
	if err != nil {
		t.Fatal(err)
	}
	rk, _ := ts.db.Authenticate(ctx, revoked)
	if err := ts.db.RevokeKey(ctx, ts.org.ID, rk.ID, false); err != nil {
		t.Fatal(err)
	}
	tokens := map[string]string{"no key": "", "made up": "hl_" + strings.Repeat("x", 43), "revoked": revoked,
		"not bearer": "", "empty bearer": ""}
	for _, rt := range ts.srv.routes() {
		for name, token := range tokens {
			req := routeRequest(t, rt.pattern, ids)
			switch name {
			case "not bearer":
				req.Header.Set("Authorization", "Basic "+ts.token)
			case "empty bearer":
				req.Header.Set("Authorization", "Bearer ")
			}
			rec := serve(ts, req, token)
			if rt.access != keyed {
				if rec.Code == http.StatusUnauthorized {
					t.Errorf("%s needs no key but refused %s: %d %s", rt.pattern, name, rec.Code, rec.Body.String())
				}
				continue
			}
			if rec.Code != http.StatusUnauthorized || errCode(t, rec) != api.CodeUnauthorized {
				t.Errorf("%s with %s: %d %s, want 401 unauthorized", rt.pattern, name, rec.Code, rec.Body.String())
			}
		}
		unchanged(t, ts, ids, rt.pattern)
	}
	if n := ran.Load(); n != 0 {
		t.Errorf("%d commands ran without a live key", n)
	}
}

// TestOtherOrganizationIsNotFound: another organization's key gets, on
// every route that names a sandbox, an API key or an SSH key of the
// first organization, the very answer it gets for an id that does not
// exist (404 not_found, the same message), and changes nothing; on the
// routes that name none it sees only its own organization.
func TestOtherOrganizationIsNotFound(t *testing.T) {
	ts, ids, other, ran := accessServer(t)
	absent := map[string]string{"sandbox": "sbx_00000000000000000000000000", "key": "key_00000000000000000000000000",
		"ssh-key": "sshk_00000000000000000000000000", "process": "proc_00000000000000000000000000", "preview": "pv_0000000000000000"}
	message := func(rec *httptest.ResponseRecorder) string {
		var b api.ErrorBody
		json.Unmarshal(rec.Body.Bytes(), &b)
		return b.Error.Code + ": " + b.Error.Message
	}
	for _, rt := range ts.srv.routes() {
		if rt.access != keyed {
			continue
		}
		if !strings.Contains(rt.pattern, "{id}") {
			if rt.pattern == "POST /v1/sandboxes" || rt.pattern == "POST /v1/keys" || rt.pattern == "POST /v1/ssh-keys" {
				continue // makes the other organization's own
			}
			rec := serve(ts, routeRequest(t, rt.pattern, ids), other)
			for what, id := range ids {
				if strings.Contains(rec.Body.String(), id) || strings.Contains(rec.Body.String(), ts.org.ID) {
					t.Errorf("%s by another organization shows the first's %s: %s", rt.pattern, what, rec.Body.String())
				}
			}
			continue
		}
		theirs := serve(ts, routeRequest(t, rt.pattern, ids), other)
		none := serve(ts, routeRequest(t, rt.pattern, absent), other)
		if theirs.Code != http.StatusNotFound || errCode(t, theirs) != api.CodeNotFound {
			t.Errorf("%s of another organization: %d %s, want 404 not_found", rt.pattern, theirs.Code, theirs.Body.String())
		}
		if message(theirs) != message(none) || theirs.Code != none.Code {
			t.Errorf("%s: another organization's answer %d %q differs from an absent id's %d %q",
				rt.pattern, theirs.Code, message(theirs), none.Code, message(none))
		}
		for what, id := range ids {
			if strings.Contains(theirs.Body.String(), id) {
				t.Errorf("%s answer names the %s id: %s", rt.pattern, what, theirs.Body.String())
			}
		}
		unchanged(t, ts, ids, rt.pattern)
	}
	if n := ran.Load(); n != 0 {
		t.Errorf("%d commands ran in another organization's sandbox", n)
	}
}

// TestRouteLoads: what each route is held to beyond its key's rate. A
// route's load decides whether it escapes the read slots and long-poll
// slots, so each is pinned here: a GET that is neither a session nor a
// long poll takes a read slot, only the sandbox create spends the create
// rate, and every route but the probes and the OpenAPI document needs a
// key.
func TestRouteLoads(t *testing.T) {
	ts := newTestServer(t, &controltest.Cluster{})
	sessions := regexp.MustCompile(`^(GET|PUT) /v1/sandboxes/\{id\}/(exec|files|processes/\{pid\}/output|fs/list|fs/stat)$`)
	for _, rt := range ts.srv.routes() {
		method, _, _ := strings.Cut(rt.pattern, " ")
		var access access
		var load load
		switch {
		case rt.pattern == "GET /healthz" || rt.pattern == "GET /readyz":
			access, load = probe, write
		case rt.pattern == "GET /v1/openapi.json":
			access, load = anyone, write
		case rt.pattern == "POST /v1/sandboxes":
			access, load = keyed, create
		case rt.pattern == "GET /v1/sandboxes/{id}":
			access, load = keyed, poll
		case sessions.MatchString(rt.pattern):
			access, load = keyed, session
		case method == http.MethodGet:
			access, load = keyed, read
		default:
			access, load = keyed, write
		}
		if rt.access != access || rt.load != load {
			t.Errorf("%s: access %d load %d, want access %d load %d", rt.pattern, rt.access, rt.load, access, load)
		}
	}
}
