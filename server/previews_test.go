package server

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/hiloop/hiloop/api"
	"github.com/hiloop/hiloop/control"
	"github.com/hiloop/hiloop/control/controltest"
	"github.com/hiloop/hiloop/receipt"
	"github.com/hiloop/hiloop/store"
)

// previewApp is what runs in the sandbox in these tests: it answers what
// it was sent, and echoes a WebSocket on /ws.
type previewApp struct {
	srv *httptest.Server
	// dials counts the streams the preview opened to it, ports the ports
	// it asked for.
	dials atomic.Int64
	mu    sync.Mutex
	ports []int
}

// seen is what the app answers: what reached it.
type seen struct {
	Path          string `json:"path"`
	Query         string `json:"query"`
	Host          string `json:"host"`
	Authorization string `json:"authorization"`
	Cookie        string `json:"cookie"`
	Referer       string `json:"referer,omitempty"`
	Body          string `json:"body,omitempty"`
}

func newPreviewApp(t *testing.T) *previewApp {
	a := &previewApp{}
	up := websocket.Upgrader{CheckOrigin: func(*http.Request) bool { return true }}
	a.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/ws" {
			c, err := up.Upgrade(w, r, nil)
			if err != nil {
				return
			}
			defer c.Close()
			for {
				typ, msg, err := c.ReadMessage()
				if err != nil {
					return
				}
				c.WriteMessage(typ, msg)
			}
		}
		// /stream answers a line and then holds the answer open until the
		// request ends.
		if r.URL.Path == "/stream" {
			io.WriteString(w, "tick\n")
			w.(http.Flusher).Flush()
			<-r.Context().Done()
			return
		}
		// /set-cookie answers with the Set-Cookie lines its sc parameters
		// name, as a hostile app would.
		if r.URL.Path == "/set-cookie" {
			for _, sc := range r.URL.Query()["sc"] {
				w.Header().Add("Set-Cookie", sc)
			}
			return
		}
		// The app tries to take the preview cookie over; hiloop drops it.
		http.SetCookie(w, &http.Cookie{Name: previewCookie, Value: "app", Path: "/"})
		http.SetCookie(w, &http.Cookie{Name: "app", Value: "1", Path: "/"})
		body, _ := io.ReadAll(io.LimitReader(r.Body, 1<<20))
		json.NewEncoder(w).Encode(seen{Path: r.URL.Path, Query: r.URL.RawQuery, Host: r.Host,
			Authorization: r.Header.Get("Authorization"), Cookie: strings.Join(r.Header.Values("Cookie"), "|"), Referer: r.Header.Get("Referer"), Body: string(body)})
	}))
	t.Cleanup(a.srv.Close)
	return a
}

func (a *previewApp) dial(_ *control.Session, port int) (net.Conn, error) {
	a.dials.Add(1)
	a.mu.Lock()
	a.ports = append(a.ports, port)
	a.mu.Unlock()
	return net.Dial("tcp", a.srv.Listener.Addr().String())
}

// previewEnv is a server with previews on preview.test, served on a real
// listener, a running sandbox with the forward transport, and its app.
type previewEnv struct {
	*testServer
	app  *previewApp
	addr string
	id   string
}

func newPreviewEnv(t *testing.T, opts ...func(*Options, *control.Options)) *previewEnv {
	app := newPreviewApp(t)
	fc := &controltest.Cluster{Transports: []receipt.Transport{receipt.TransportExec, receipt.TransportForward}, SessionPort: 2223}
	opts = append([]func(*Options, *control.Options){func(o *Options, co *control.Options) {
		co.Caps.Transports = append(co.Caps.Transports, receipt.TransportForward)
		o.Previews = Previews{Domain: "preview.test", Scheme: "https", Dial: app.dial}
	}}, opts...)
	ts := newTestServer(t, fc, opts...)
	hs := httptest.NewServer(ts.srv)
	t.Cleanup(hs.Close)
	id := ts.create(`{"image":"busybox","transports":["exec","forward"]}`)
	ts.db.Observe(context.Background(), id, store.Observation{State: store.StateRunning})
	return &previewEnv{testServer: ts, app: app, addr: hs.Listener.Addr().String(), id: id}
}

// client is an HTTP client that reaches the server whatever host a URL
// names (no resolver knows preview.test), and follows no redirect.
func (e *previewEnv) client() *http.Client {
	return &http.Client{
		Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "tcp", e.addr)
		}},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
}

// visit GETs u over plain HTTP (the listener's), with headers in pairs.
func (e *previewEnv) visit(t *testing.T, u string, headers ...string) (*http.Response, string) {
	t.Helper()
	u = strings.Replace(u, "https://", "http://", 1)
	req, err := http.NewRequest("GET", u, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Add(headers[i], headers[i+1])
	}
	res, err := e.client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res, string(b)
}

func (e *previewEnv) createPreview(t *testing.T, ts *testServer, body string) api.Preview {
	t.Helper()
	rec := ts.do("POST", "/v1/sandboxes/"+e.id+"/previews", body)
	if rec.Code != http.StatusCreated {
		t.Fatalf("create preview %s: %d %s", body, rec.Code, rec.Body.String())
	}
	var p api.Preview
	if err := json.Unmarshal(rec.Body.Bytes(), &p); err != nil {
		t.Fatal(err)
	}
	return p
}

// bare is a preview URL without its query.
func bare(t *testing.T, u string) string {
	t.Helper()
	pu, err := url.Parse(u)
	if err != nil {
		t.Fatal(err)
	}
	pu.RawQuery = ""
	return pu.String()
}

func wantNoPreview(t *testing.T, what string, res *http.Response, body string) {
	t.Helper()
	if res.StatusCode != http.StatusNotFound || !strings.Contains(body, `"not_found"`) || !strings.Contains(body, "no such preview") {
		t.Errorf("%s: %d %s, want 404 not_found no such preview", what, res.StatusCode, body)
	}
}

// TestPreviewToken: a token preview's URL sets a host-only cookie and
// redirects to itself without the token; with the cookie (or the token as
// a bearer) the sandbox's app answers, and neither the token, the cookie
// nor the parameter reaches it; its own cookies, bearer and query do. A
// missing or wrong token, and the token on another preview's host, are
// 404, the same answer.
func TestPreviewToken(t *testing.T) {
	e := newPreviewEnv(t)
	p := e.createPreview(t, e.testServer, `{"port":3000}`)
	if p.Auth != "token" || p.Port != 3000 || p.Token == "" || !strings.HasPrefix(p.URL, "https://pv-") ||
		!strings.Contains(p.URL, ".preview.test/?hiloop_preview_token="+p.Token) || p.SandboxID != e.id {
		t.Fatalf("preview: %+v", p)
	}
	if d := p.ExpiresAt.Sub(p.CreatedAt); d != 24*time.Hour {
		t.Errorf("default ttl %s, want 24h", d)
	}

	res, _ := e.visit(t, p.URL+"&x=1")
	if res.StatusCode != http.StatusSeeOther || res.Header.Get("Location") != "/?x=1" {
		t.Fatalf("the token URL: %d Location %q, want 303 /?x=1", res.StatusCode, res.Header.Get("Location"))
	}
	cookies := res.Cookies()
	if len(cookies) != 1 || cookies[0].Name != previewCookie || cookies[0].Value != p.Token || cookies[0].Domain != "" ||
		!cookies[0].HttpOnly || !cookies[0].Secure || cookies[0].SameSite != http.SameSiteLaxMode {
		t.Fatalf("cookie: %+v", cookies)
	}
	if e.app.dials.Load() != 0 {
		t.Error("the redirect reached the app")
	}

	home := bare(t, p.URL)
	res, body := e.visit(t, home+"page?q=1", "Cookie", "a=b; "+previewCookie+"="+p.Token+"; c=d", "Authorization", "Bearer the-apps-own")
	if res.StatusCode != http.StatusOK {
		t.Fatalf("with the cookie: %d %s", res.StatusCode, body)
	}
	var got seen
	json.Unmarshal([]byte(body), &got)
	host := strings.TrimSuffix(strings.TrimPrefix(home, "https://"), "/")
	want := seen{Path: "/page", Query: "q=1", Host: host, Authorization: "Bearer the-apps-own", Cookie: "a=b; c=d"}
	if got != want {
		t.Errorf("the app saw %+v, want %+v", got, want)
	}
	for _, sc := range res.Header.Values("Set-Cookie") {
		if strings.HasPrefix(sc, previewCookie+"=") {
			t.Errorf("the app's answer set hiloop's cookie: %s", sc)
		}
	}
	if !strings.Contains(strings.Join(res.Header.Values("Set-Cookie"), ";"), "app=1") {
		t.Error("the app's own cookie was dropped")
	}
	e.app.mu.Lock()
	if e.app.ports[0] != 3000 {
		t.Errorf("dialled port %d, want 3000", e.app.ports[0])
	}
	e.app.mu.Unlock()

	res, body = e.visit(t, home, "Authorization", "Bearer "+p.Token)
	json.Unmarshal([]byte(body), &got)
	if res.StatusCode != http.StatusOK || got.Authorization != "" {
		t.Errorf("with the token as bearer: %d, the app saw Authorization %q", res.StatusCode, got.Authorization)
	}

	// A POST's body reaches the app; a token in a POST's query sets the
	// cookie and goes on without a redirect, and without the token.
	post, err := http.NewRequest("POST", strings.Replace(p.URL, "https://", "http://", 1), strings.NewReader("form=data"))
	if err != nil {
		t.Fatal(err)
	}
	res, err = e.client().Do(post)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(res.Body)
	res.Body.Close()
	got = seen{}
	json.Unmarshal(b, &got)
	if res.StatusCode != http.StatusOK || got.Body != "form=data" || got.Query != "" || len(res.Cookies()) == 0 {
		t.Errorf("a POST with the token in its query: %d %s", res.StatusCode, b)
	}

	other := e.createPreview(t, e.testServer, `{"port":3001}`)
	for what, h := range map[string][]string{
		"no token":     nil,
		"wrong token":  {"Cookie", previewCookie + "=hlp_wrong"},
		"wrong bearer": {"Authorization", "Bearer hlp_wrong"},
		"api key":      {"Authorization", "Bearer " + e.token},
		"other token":  {"Cookie", previewCookie + "=" + other.Token},
	} {
		res, body := e.visit(t, home, h...)
		wantNoPreview(t, what, res, body)
	}
	res, body = e.visit(t, strings.Replace(home, "pv-", "pv-x", 1), "Cookie", previewCookie+"="+p.Token)
	wantNoPreview(t, "unknown preview host", res, body)
	res, body = e.visit(t, strings.Replace(home, "pv-", "xx-", 1), "Cookie", previewCookie+"="+p.Token)
	wantNoPreview(t, "malformed preview host", res, body)
}

// TestPreviewRevoke: a revoked preview's token stops at the next request,
// and a WebSocket open through it ends; the list shows live previews
// without tokens.
func TestPreviewRevoke(t *testing.T) {
	e := newPreviewEnv(t)
	p := e.createPreview(t, e.testServer, `{"port":8000,"ttl":"1h"}`)
	keep := e.createPreview(t, e.testServer, `{"port":8001,"auth":"key"}`)

	rec := e.do("GET", "/v1/sandboxes/"+e.id+"/previews", "")
	var list api.PreviewList
	json.Unmarshal(rec.Body.Bytes(), &list)
	if rec.Code != 200 || len(list.Items) != 2 || list.Items[0].ID != p.ID || list.Items[0].Token != "" ||
		list.Items[0].URL != bare(t, p.URL) || strings.Contains(rec.Body.String(), p.Token) {
		t.Fatalf("list: %d %s", rec.Code, rec.Body.String())
	}

	ws := e.dialWS(t, bare(t, p.URL), http.Header{"Cookie": {previewCookie + "=" + p.Token}})
	if err := ws.WriteMessage(websocket.TextMessage, []byte("hello")); err != nil {
		t.Fatal(err)
	}
	if _, msg, err := ws.ReadMessage(); err != nil || string(msg) != "hello" {
		t.Fatalf("echo: %q %v", msg, err)
	}

	if rec := e.do("DELETE", "/v1/sandboxes/"+e.id+"/previews/"+p.ID, ""); rec.Code != http.StatusNoContent {
		t.Fatalf("revoke: %d %s", rec.Code, rec.Body.String())
	}
	ws.SetReadDeadline(time.Now().Add(time.Minute))
	var ne net.Error
	if _, _, err := ws.ReadMessage(); err == nil || errors.As(err, &ne) && ne.Timeout() {
		t.Fatalf("the WebSocket outlived the revoke: %v", err)
	}
	res, body := e.visit(t, bare(t, p.URL), "Cookie", previewCookie+"="+p.Token)
	wantNoPreview(t, "revoked", res, body)
	if rec := e.do("DELETE", "/v1/sandboxes/"+e.id+"/previews/"+p.ID, ""); rec.Code != http.StatusNotFound || errCode(t, rec) != api.CodeNotFound {
		t.Errorf("revoke twice: %d %s", rec.Code, rec.Body.String())
	}
	rec = e.do("GET", "/v1/sandboxes/"+e.id+"/previews", "")
	json.Unmarshal(rec.Body.Bytes(), &list)
	if len(list.Items) != 1 || list.Items[0].ID != keep.ID {
		t.Errorf("list after the revoke: %s", rec.Body.String())
	}
}

func (e *previewEnv) dialWS(t *testing.T, u string, h http.Header) *websocket.Conn {
	t.Helper()
	d := websocket.Dialer{NetDialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "tcp", e.addr)
	}}
	u = strings.Replace(u, "https://", "ws://", 1) + "ws"
	c, res, err := d.Dial(u, h)
	if err != nil {
		status := 0
		if res != nil {
			status = res.StatusCode
		}
		t.Fatalf("WebSocket %s: %v (%d)", u, err, status)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// TestPreviewKey: a key preview takes an API key of its organization, which
// does not reach the app, and nothing else; another organization's key,
// its create, list and revoke all answer 404.
func TestPreviewKey(t *testing.T) {
	e := newPreviewEnv(t)
	p := e.createPreview(t, e.testServer, `{"port":8080,"auth":"key"}`)
	if p.Token != "" || strings.Contains(p.URL, "?") {
		t.Fatalf("a key preview has a token: %+v", p)
	}
	res, body := e.visit(t, p.URL)
	wantNoPreview(t, "without a key", res, body)
	res, body = e.visit(t, p.URL, "Authorization", "Bearer "+e.token)
	var got seen
	json.Unmarshal([]byte(body), &got)
	if res.StatusCode != http.StatusOK || got.Authorization != "" {
		t.Fatalf("with the key: %d %s", res.StatusCode, body)
	}

	ctx := context.Background()
	orgB, err := e.db.CreateOrg(ctx, "b", 10, 10)
	if err != nil {
		t.Fatal(err)
	}
	_, secretB, err := e.db.CreateKey(ctx, orgB.ID, "b")
	if err != nil {
		t.Fatal(err)
	}
	b := *e.testServer
	b.token = secretB
	res, body = e.visit(t, p.URL, "Authorization", "Bearer "+secretB)
	wantNoPreview(t, "another organization's key", res, body)
	for _, rq := range [][2]string{{"POST", "/v1/sandboxes/" + e.id + "/previews"}, {"GET", "/v1/sandboxes/" + e.id + "/previews"},
		{"DELETE", "/v1/sandboxes/" + e.id + "/previews/" + p.ID}} {
		body := ""
		if rq[0] == "POST" {
			body = `{"port":8080}`
		}
		if rec := b.do(rq[0], rq[1], body); rec.Code != http.StatusNotFound || errCode(t, rec) != api.CodeNotFound {
			t.Errorf("%s %s by another organization: %d %s", rq[0], rq[1], rec.Code, rec.Body.String())
		}
	}
	// Organization b's own sandbox, and a token preview of it: its token
	// does not open a's preview host.
	idB := b.create(`{"image":"busybox","transports":["exec","forward"]}`)
	rec := b.do("POST", "/v1/sandboxes/"+idB+"/previews", `{"port":8080}`)
	var pb api.Preview
	json.Unmarshal(rec.Body.Bytes(), &pb)
	res, body = e.visit(t, p.URL, "Cookie", previewCookie+"="+pb.Token)
	wantNoPreview(t, "another organization's token", res, body)

	// A preview works only while the key that made it is live.
	k2, secret2, err := e.db.CreateKey(ctx, e.org.ID, "second")
	if err != nil {
		t.Fatal(err)
	}
	second := *e.testServer
	second.token = secret2
	p2 := e.createPreview(t, &second, `{"port":8080}`)
	if res, body := e.visit(t, bare(t, p2.URL), "Authorization", "Bearer "+p2.Token); res.StatusCode != 200 {
		t.Fatalf("the second key's preview: %d %s", res.StatusCode, body)
	}
	if rec := e.do("DELETE", "/v1/keys/"+k2.ID, ""); rec.Code != http.StatusNoContent {
		t.Fatalf("revoke the key: %d %s", rec.Code, rec.Body.String())
	}
	res, body = e.visit(t, bare(t, p2.URL), "Authorization", "Bearer "+p2.Token)
	wantNoPreview(t, "a preview of a revoked key", res, body)
}

// TestPreviewExpiry: an expired preview is refused at the next request
// like an unknown one, and is no longer listed.
func TestPreviewExpiry(t *testing.T) {
	var now atomic.Int64
	now.Store(time.Now().UnixNano())
	e := newPreviewEnv(t, func(_ *Options, co *control.Options) { co.Now = func() time.Time { return time.Unix(0, now.Load()) } })
	p := e.createPreview(t, e.testServer, `{"port":80,"ttl":"1m"}`)
	if res, body := e.visit(t, bare(t, p.URL), "Cookie", previewCookie+"="+p.Token); res.StatusCode != 200 {
		t.Fatalf("before it expires: %d %s", res.StatusCode, body)
	}
	now.Add(int64(time.Minute))
	res, body := e.visit(t, bare(t, p.URL), "Cookie", previewCookie+"="+p.Token)
	wantNoPreview(t, "expired", res, body)
	if rec := e.do("GET", "/v1/sandboxes/"+e.id+"/previews", ""); strings.Contains(rec.Body.String(), p.ID) {
		t.Errorf("the expired preview is listed: %s", rec.Body.String())
	}
}

// TestPreviewAdmission: each visit is a session of the core: an open
// WebSocket holds one of the organization's places, so a visit past the
// limit is refused (429 exec_limit), and a sandbox its owner stopped is
// not woken (409 sandbox_not_running).
func TestPreviewAdmission(t *testing.T) {
	e := newPreviewEnv(t, func(_ *Options, co *control.Options) { co.Limits.PerOrg = 1 })
	p := e.createPreview(t, e.testServer, `{"port":80}`)
	cookie := previewCookie + "=" + p.Token
	ws := e.dialWS(t, bare(t, p.URL), http.Header{"Cookie": {cookie}})
	res, body := e.visit(t, bare(t, p.URL), "Cookie", cookie)
	if res.StatusCode != http.StatusTooManyRequests || !strings.Contains(body, api.CodeExecLimit) {
		t.Errorf("a visit past the session limit: %d %s", res.StatusCode, body)
	}
	ws.Close()
	if rec := e.do("POST", "/v1/sandboxes/"+e.id+"/stop", ""); rec.Code != 200 {
		t.Fatalf("stop: %d %s", rec.Code, rec.Body.String())
	}
	e.db.Observe(context.Background(), e.id, store.Observation{State: store.StateStopped})
	res, body = e.visit(t, bare(t, p.URL), "Cookie", cookie)
	if res.StatusCode != http.StatusConflict || !strings.Contains(body, api.CodeSandboxNotRunning) {
		t.Errorf("a visit to a stopped sandbox: %d %s", res.StatusCode, body)
	}
	if n := e.ctl.Sessions(); n != 0 {
		t.Errorf("%d sessions left open", n)
	}
}

// TestPreviewRequests: what a create may ask for, each refusal with its
// stable code and nothing recorded; the per-sandbox cap.
func TestPreviewRequests(t *testing.T) {
	e := newPreviewEnv(t, func(_ *Options, co *control.Options) { co.Limits.PreviewsPerSandbox = 2 })
	for body, want := range map[string][2]string{
		`{"port":0}`:                    {api.CodeInvalidField, "port"},
		`{"port":65536}`:                {api.CodeInvalidField, "port"},
		`{}`:                            {api.CodeInvalidField, "port"},
		`{"port":80,"auth":"basic"}`:    {api.CodeInvalidField, "auth"},
		`{"port":80,"ttl":"soon"}`:      {api.CodeInvalidField, "ttl"},
		`{"port":80,"ttl":"0s"}`:        {api.CodeInvalidField, "ttl"},
		`{"port":80,"ttl":"721h"}`:      {api.CodeInvalidField, "ttl"},
		`{"port":80,"ttl":"-1h"}`:       {api.CodeInvalidField, "ttl"},
		`{"port":"80"}`:                 {api.CodeInvalidField, "port"},
		`{"port":80,"host":"10.0.0.1"}`: {api.CodeUnknownField, "host"},
		`{"port":80} {}`:                {api.CodeInvalidJSON, ""},
	} {
		rec := e.do("POST", "/v1/sandboxes/"+e.id+"/previews", body)
		var eb api.ErrorBody
		json.Unmarshal(rec.Body.Bytes(), &eb)
		if rec.Code != http.StatusBadRequest || eb.Error.Code != want[0] || eb.Error.Field != want[1] {
			t.Errorf("%s: %d %s, want 400 %s field %q", body, rec.Code, rec.Body.String(), want[0], want[1])
		}
	}
	if rec := e.do("POST", "/v1/sandboxes/sbx_nope/previews", `{"port":80}`); rec.Code != 404 || errCode(t, rec) != api.CodeNotFound {
		t.Errorf("an absent sandbox: %d %s", rec.Code, rec.Body.String())
	}
	execOnly := e.create(`{"image":"busybox","transports":["exec"]}`)
	if rec := e.do("POST", "/v1/sandboxes/"+execOnly+"/previews", `{"port":80}`); rec.Code != 409 || errCode(t, rec) != api.CodeTransportNotEnabled {
		t.Errorf("a sandbox without the forward transport: %d %s", rec.Code, rec.Body.String())
	}
	e.createPreview(t, e.testServer, `{"port":80}`)
	e.createPreview(t, e.testServer, `{"port":81,"auth":"key","ttl":"1s"}`)
	if rec := e.do("POST", "/v1/sandboxes/"+e.id+"/previews", `{"port":82}`); rec.Code != 409 || errCode(t, rec) != api.CodePreviewLimit {
		t.Errorf("past the cap: %d %s", rec.Code, rec.Body.String())
	}
	if ps, _ := e.db.Previews(context.Background(), e.org.ID, e.id, time.Now()); len(ps) != 2 {
		t.Errorf("%d previews recorded, want 2", len(ps))
	}

	off := newTestServer(t, &controltest.Cluster{})
	id := off.create(`{"image":"busybox"}`)
	for _, rq := range [][2]string{{"POST", "/v1/sandboxes/" + id + "/previews"}, {"GET", "/v1/sandboxes/" + id + "/previews"},
		{"DELETE", "/v1/sandboxes/" + id + "/previews/pv_x"}} {
		if rec := off.do(rq[0], rq[1], `{"port":80}`); rec.Code != 404 || errCode(t, rec) != api.CodePreviewsDisabled {
			t.Errorf("%s without --preview-domain: %d %s", rq[0], rec.Code, rec.Body.String())
		}
	}
}

// TestPreviewRate: a preview's visits are held to a key's rate of their
// own.
func TestPreviewRate(t *testing.T) {
	e := newPreviewEnv(t, func(o *Options, _ *control.Options) {
		// The API key's two tokens make the sandbox and the preview.
		o.RateLimits = RateLimits{PerKey: 0.001, Burst: 2, PerOrg: 1000, OrgBurst: 1000}
	})
	p := e.createPreview(t, e.testServer, `{"port":80}`)
	cookie := previewCookie + "=" + p.Token
	for i := range 2 {
		if res, body := e.visit(t, bare(t, p.URL), "Cookie", cookie); res.StatusCode != 200 {
			t.Fatalf("visit %d: %d %s", i+1, res.StatusCode, body)
		}
	}
	if res, body := e.visit(t, bare(t, p.URL), "Cookie", cookie); res.StatusCode != http.StatusTooManyRequests || !strings.Contains(body, api.CodeRateLimited) {
		t.Errorf("a visit past the preview's rate: %d %s", res.StatusCode, body)
	}
}

// FuzzPreviewVisit: no request on a preview host, whatever its host
// label, query, cookies and Authorization, panics the server, gets a 500,
// or reaches the sandbox without the preview's token ($TOKEN in a seed is
// the real one).
func FuzzPreviewVisit(f *testing.F) {
	for _, seed := range [][4]string{
		{"pv-$ID", "hiloop_preview_token=$TOKEN", "", ""},
		{"pv-$ID", "", "hiloop_preview_token=$TOKEN", ""},
		{"pv-$ID", "", "", "Bearer $TOKEN"},
		{"pv-$ID", "", "", "Bearer hl_x"},
		{"pv-$ID", "a=b", "hiloop_preview_token=hlp_x; hiloop_preview_token=hlp_y", "Bearer x"},
		{"pv-", "%zz", "=;;=", "Bearer "},
		{"PV-$ID", "hiloop_preview_token=%00", "", ""},
		{"pv-a.pv-b", "", "", ""},
	} {
		f.Add(seed[0], seed[1], seed[2], seed[3])
	}
	app := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "app") }))
	f.Cleanup(app.Close)
	var dials atomic.Int64
	fc := &controltest.Cluster{Transports: []receipt.Transport{receipt.TransportExec, receipt.TransportForward}, SessionPort: 2223}
	ts := newTestServer(f, fc, func(o *Options, co *control.Options) {
		co.Caps.Transports = append(co.Caps.Transports, receipt.TransportForward)
		o.Previews = Previews{Domain: "preview.test", Scheme: "https", Dial: func(*control.Session, int) (net.Conn, error) {
			dials.Add(1)
			return net.Dial("tcp", app.Listener.Addr().String())
		}}
	})
	id := ts.create(`{"image":"busybox"}`)
	ts.db.Observe(context.Background(), id, store.Observation{State: store.StateRunning})
	rec := ts.do("POST", "/v1/sandboxes/"+id+"/previews", `{"port":80}`)
	var p api.Preview
	json.Unmarshal(rec.Body.Bytes(), &p)
	pid := strings.TrimPrefix(p.ID, "pv_")
	f.Fuzz(func(t *testing.T, label, query, cookie, authorization string) {
		fill := strings.NewReplacer("$ID", pid, "$TOKEN", p.Token)
		label, query, cookie, authorization = fill.Replace(label), fill.Replace(query), fill.Replace(cookie), fill.Replace(authorization)
		if _, err := url.ParseRequestURI("/?" + query); err != nil || !fieldValue(cookie) || !fieldValue(authorization) || !fieldValue(label) {
			return // the listener refuses such a request before any handler sees it
		}
		req := httptest.NewRequest("GET", "/", nil)
		req.Host = label + ".preview.test"
		req.URL.RawQuery = query
		req.Header.Set("Cookie", cookie)
		req.Header.Set("Authorization", authorization)
		before := dials.Load()
		rec := httptest.NewRecorder()
		ts.srv.ServeHTTP(rec, req)
		if rec.Code >= 500 {
			t.Fatalf("%q %q %q %q: %d %s", label, query, cookie, authorization, rec.Code, rec.Body.String())
		}
		if dials.Load() != before && !strings.Contains(query+cookie+authorization, p.Token) {
			t.Fatalf("%q %q %q %q reached the sandbox without the token", label, query, cookie, authorization)
		}
	})
}

// fieldValue reports whether s may be a header field's value as the HTTP
// server reads one: no control characters but tab.
func fieldValue(s string) bool {
	for _, c := range []byte(s) {
		if c < ' ' && c != '\t' || c == 0x7f {
			return false
		}
	}
	return true
}
