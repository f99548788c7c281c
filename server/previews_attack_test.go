package server

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/textproto"
	"net/url"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hiloop/hiloop/api"
	"github.com/hiloop/hiloop/control"
)

// TestPreviewRefererCarriesNoToken: a page reached by a POST with the token
// in its query keeps the token in the browser's address bar, and the
// browser sends that URL as the Referer of the page's own requests; the
// app never sees the token there.
func TestPreviewRefererCarriesNoToken(t *testing.T) {
	e := newPreviewEnv(t)
	p := e.createPreview(t, e.testServer, `{"port":3000}`)
	home := bare(t, p.URL)
	for _, ref := range []string{
		p.URL,
		home + "page?a=1&" + previewTokenParam + "=" + p.Token + "#frag",
		"https://elsewhere.example/?" + previewTokenParam + "=" + p.Token,
	} {
		res, body := e.visit(t, home+"asset", "Cookie", previewCookie+"="+p.Token, "Referer", ref)
		var got seen
		json.Unmarshal([]byte(body), &got)
		if res.StatusCode != http.StatusOK || strings.Contains(got.Referer, p.Token) || strings.Contains(got.Referer, previewTokenParam) {
			t.Errorf("Referer %q: %d, the app saw Referer %q", ref, res.StatusCode, got.Referer)
		}
	}
	res, body := e.visit(t, home+"asset", "Cookie", previewCookie+"="+p.Token, "Referer", home+"page?a=1")
	var got seen
	json.Unmarshal([]byte(body), &got)
	if res.StatusCode != http.StatusOK || got.Referer != home+"page?a=1" {
		t.Errorf("a Referer without the token: %d, the app saw %q", res.StatusCode, got.Referer)
	}
}

// TestPreviewRedirectStaysOnHost: the redirect that takes the token out of
// the address bar goes to the same preview host whatever the path, never
// to another host (a path of //evil.example/ is not a host).
func TestPreviewRedirectStaysOnHost(t *testing.T) {
	e := newPreviewEnv(t)
	p := e.createPreview(t, e.testServer, `{"port":3000}`)
	home := strings.TrimSuffix(bare(t, p.URL), "/")
	for _, path := range []string{"//evil.example/", "//evil.example", "///evil.example/x", "/%2F/evil.example", "/%5Cevil.example"} {
		res, _ := e.visit(t, home+path+"?"+previewTokenParam+"="+p.Token)
		loc := res.Header.Get("Location")
		u, err := url.Parse(loc)
		if res.StatusCode != http.StatusSeeOther || err != nil || u.Host != "" || !strings.HasPrefix(loc, "/") ||
			strings.HasPrefix(loc, "//") || strings.HasPrefix(loc, `/\`) || strings.Contains(loc, p.Token) {
			t.Errorf("path %s: %d Location %q, want 303 to a path of the same host", path, res.StatusCode, loc)
		}
		// The browser resolves it against the preview's URL: the same host.
		base, _ := url.Parse(home + path)
		if r := base.ResolveReference(u); r.Host != base.Host {
			t.Errorf("path %s: Location %q resolves to host %q", path, loc, r.Host)
		}
	}
}

// TestPreviewAppCookiesStayOnItsHost: a sandbox's app can set cookies only
// for its own preview host: a Domain attribute (the preview domain, or a
// parent of it) is taken out, so one organization's app can neither read
// another's cookies nor plant cookies in another preview; and no
// Set-Cookie that a browser would take as hiloop's cookie passes, parsed
// by Go or not.
func TestPreviewAppCookiesStayOnItsHost(t *testing.T) {
	e := newPreviewEnv(t)
	p := e.createPreview(t, e.testServer, `{"port":3000}`)
	home := bare(t, p.URL)
	for _, tc := range []struct{ sc, want string }{
		{"sess=1; Domain=preview.test; Path=/; HttpOnly", "sess=1; Path=/; HttpOnly"},
		{"sess=1; Path=/; domain=.PREVIEW.test", "sess=1; Path=/"},
		{"sess=1;Domain=test;Secure", "sess=1;Secure"},
		{"sess=1; Path=/", "sess=1; Path=/"},
		{previewCookie + `="a"b"; Path=/`, ""},
		{previewCookie + "; Domain=preview.test", ""},
		{" " + previewCookie + "=x; Domain=preview.test", ""},
		{previewCookie + " =x; Path=/", ""},
		{previewCookie + "=x", ""},
	} {
		res, _ := e.visit(t, home+"set-cookie?"+url.Values{"sc": {tc.sc}}.Encode(), "Cookie", previewCookie+"="+p.Token)
		got := strings.Join(res.Header.Values("Set-Cookie"), "|")
		if res.StatusCode != http.StatusOK || got != tc.want {
			t.Errorf("the app's Set-Cookie %q: %d, the visitor got %q, want %q", tc.sc, res.StatusCode, got, tc.want)
		}
	}
}

// TestPreviewTossedCookies: another preview host's app (or its script) can
// set cookies named as hiloop's for the whole preview domain, at deeper
// paths, which a browser sends before the preview's own; however many
// there are, the preview's own cookie still lets its visitor in, and a
// stranger's pile of them lets nobody in.
func TestPreviewTossedCookies(t *testing.T) {
	e := newPreviewEnv(t)
	p := e.createPreview(t, e.testServer, `{"port":3000}`)
	other := e.createPreview(t, e.testServer, `{"port":3001}`)
	home := bare(t, p.URL)
	var tossed []string
	for i := 0; i < 40; i++ {
		tossed = append(tossed, previewCookie+"=hlp_"+strings.Repeat(string(rune('a'+i%26)), 43))
	}
	tossed = append(tossed, previewCookie+"="+other.Token)
	res, body := e.visit(t, home+"a/b/c", "Cookie", strings.Join(append(tossed, previewCookie+"="+p.Token), "; "))
	if res.StatusCode != http.StatusOK {
		t.Errorf("the preview's cookie after %d tossed ones: %d %s", len(tossed), res.StatusCode, body)
	}
	var got seen
	json.Unmarshal([]byte(body), &got)
	if strings.Contains(got.Cookie, "hlp_") {
		t.Errorf("the app saw hiloop's cookies: %q", got.Cookie)
	}
	res, body = e.visit(t, home, "Cookie", strings.Join(tossed, "; "))
	wantNoPreview(t, "tossed cookies only", res, body)
}

// openStream starts a request to the app's endless /stream through the
// preview at base and returns its body once the first line is through.
func (e *previewEnv) openStream(t *testing.T, base string, headers ...string) io.ReadCloser {
	t.Helper()
	req, err := http.NewRequest("GET", strings.Replace(base, "https://", "http://", 1)+"stream", nil)
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
	t.Cleanup(func() { res.Body.Close() })
	line, err := bufio.NewReader(res.Body).ReadString('\n')
	if res.StatusCode != http.StatusOK || line != "tick\n" {
		t.Fatalf("stream: %d %q %v", res.StatusCode, line, err)
	}
	return res.Body
}

// wantEnded waits for body to end, and fails if it is still open after a
// minute.
func wantEnded(t *testing.T, what string, body io.ReadCloser) {
	t.Helper()
	done := make(chan struct{})
	go func() { io.Copy(io.Discard, body); close(done) }()
	select {
	case <-done:
	case <-time.After(time.Minute):
		t.Errorf("%s: an answer in flight outlived it", what)
		body.Close()
	}
}

// TestPreviewEndsAnswersInFlight: an answer streaming through a preview
// (server-sent events, a long download) ends when the preview is revoked,
// when the key that made a token preview is revoked, and when the key of a
// key preview's visitor is revoked; not only the next request is refused.
func TestPreviewEndsAnswersInFlight(t *testing.T) {
	e := newPreviewEnv(t)
	ctx := context.Background()

	p := e.createPreview(t, e.testServer, `{"port":3000}`)
	body := e.openStream(t, bare(t, p.URL), "Cookie", previewCookie+"="+p.Token)
	if rec := e.do("DELETE", "/v1/sandboxes/"+e.id+"/previews/"+p.ID, ""); rec.Code != http.StatusNoContent {
		t.Fatalf("revoke: %d %s", rec.Code, rec.Body.String())
	}
	wantEnded(t, "the preview's revoke", body)

	k2, secret2, err := e.db.CreateKey(ctx, e.org.ID, "maker")
	if err != nil {
		t.Fatal(err)
	}
	maker := *e.testServer
	maker.token = secret2
	p2 := e.createPreview(t, &maker, `{"port":3000}`)
	body = e.openStream(t, bare(t, p2.URL), "Authorization", "Bearer "+p2.Token)
	if rec := e.do("DELETE", "/v1/keys/"+k2.ID, ""); rec.Code != http.StatusNoContent {
		t.Fatalf("revoke the key: %d %s", rec.Code, rec.Body.String())
	}
	wantEnded(t, "the revoke of the key that made the preview", body)

	kp := e.createPreview(t, e.testServer, `{"port":3000,"auth":"key"}`)
	k3, secret3, err := e.db.CreateKey(ctx, e.org.ID, "visitor")
	if err != nil {
		t.Fatal(err)
	}
	body = e.openStream(t, kp.URL, "Authorization", "Bearer "+secret3)
	if rec := e.do("DELETE", "/v1/keys/"+k3.ID, ""); rec.Code != http.StatusNoContent {
		t.Fatalf("revoke the visitor's key: %d %s", rec.Code, rec.Body.String())
	}
	wantEnded(t, "the revoke of the visitor's key", body)
	res, b := e.visit(t, kp.URL, "Authorization", "Bearer "+secret3)
	wantNoPreview(t, "a revoked visitor key", res, b)
	if res, b := e.visit(t, kp.URL, "Authorization", "Bearer "+e.token); res.StatusCode != http.StatusOK {
		t.Errorf("another live key of the organization after the revoke: %d %s", res.StatusCode, b)
	}
}

// raw sends req, as written, on a new connection to the server and returns
// the answer.
func (e *previewEnv) raw(t *testing.T, req string) (*http.Response, string) {
	t.Helper()
	c, err := net.Dial("tcp", e.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := io.WriteString(c, req); err != nil {
		t.Fatal(err)
	}
	res, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("%q: %v", req, err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res, string(b)
}

// TestPreviewHosts: only a request whose host (the Host header, or the
// host of an absolute request URI) is a preview host of the domain reaches
// a sandbox, whatever its case, port or trailing dot; any other host is
// the API's, an X-Forwarded-Host notwithstanding; and no request on a
// preview host reaches an API route, with an API key or without.
func TestPreviewHosts(t *testing.T) {
	e := newPreviewEnv(t)
	p := e.createPreview(t, e.testServer, `{"port":3000}`)
	kp := e.createPreview(t, e.testServer, `{"port":3000,"auth":"key"}`)
	host := strings.TrimSuffix(strings.TrimPrefix(bare(t, p.URL), "https://"), "/")
	cookie := "Cookie: " + previewCookie + "=" + p.Token + "\r\n"
	app := func(what string, res *http.Response, body string) {
		t.Helper()
		var got seen
		if res.StatusCode != http.StatusOK || json.Unmarshal([]byte(body), &got) != nil || got.Path == "" {
			t.Errorf("%s: %d %s, want the app's answer", what, res.StatusCode, body)
		}
	}
	api := func(what string, res *http.Response, body string) {
		t.Helper()
		if strings.Contains(body, `"path"`) || !strings.Contains(body, `"error"`) || strings.Contains(body, "no such preview") {
			t.Errorf("%s: %d %s, want the API's answer", what, res.StatusCode, body)
		}
	}
	before := e.app.dials.Load()
	for _, h := range []string{strings.ToUpper(host), host + ":8443", host + ".", strings.ToUpper(host) + ".:80"} {
		res, body := e.raw(t, "GET /x HTTP/1.1\r\nHost: "+h+"\r\n"+cookie+"Connection: close\r\n\r\n")
		app("Host "+h, res, body)
	}
	res, body := e.raw(t, "GET http://"+host+"/x HTTP/1.1\r\nHost: api.example\r\n"+cookie+"Connection: close\r\n\r\n")
	app("an absolute URI of the preview host", res, body)
	if n := e.app.dials.Load() - before; n != 5 {
		t.Errorf("the app was dialled %d times, want 5", n)
	}

	before = e.app.dials.Load()
	for what, req := range map[string]string{
		"a host under the preview host's":      "GET / HTTP/1.1\r\nHost: " + host + ".evil\r\n" + cookie + "\r\n",
		"X-Forwarded-Host":                     "GET / HTTP/1.1\r\nHost: api.example\r\nX-Forwarded-Host: " + host + "\r\n" + cookie + "\r\n",
		"Forwarded":                            "GET / HTTP/1.1\r\nHost: api.example\r\nForwarded: host=" + host + "\r\n" + cookie + "\r\n",
		"HTTP/1.0 without a Host":              "GET / HTTP/1.0\r\n" + cookie + "\r\n",
		"an absolute URI of another host":      "GET http://api.example/ HTTP/1.1\r\nHost: " + host + "\r\n" + cookie + "\r\n",
		"the preview domain itself":            "GET / HTTP/1.1\r\nHost: preview.test\r\n" + cookie + "\r\n",
		"an API route with the preview's host": "GET /v1/sandboxes HTTP/1.1\r\nHost: api.example\r\nX-Forwarded-Host: " + host + "\r\n\r\n",
	} {
		res, body := e.raw(t, req)
		api(what, res, body)
	}
	res, _ = e.raw(t, "GET / HTTP/1.1\r\nHost: "+host+"\r\nHost: api.example\r\n"+cookie+"\r\n")
	if res.StatusCode != http.StatusBadRequest {
		t.Errorf("two Host headers: %d, want 400", res.StatusCode)
	}
	if n := e.app.dials.Load() - before; n != 0 {
		t.Errorf("the app was dialled %d times by requests of other hosts", n)
	}

	// An API route on a preview host is the app's path, or no preview.
	kpHost := strings.TrimSuffix(strings.TrimPrefix(kp.URL, "https://"), "/")
	res, body = e.raw(t, "GET /v1/sandboxes HTTP/1.1\r\nHost: "+host+"\r\nAuthorization: Bearer "+e.token+"\r\n\r\n")
	wantNoPreview(t, "an API key on a token preview's host", res, body)
	res, body = e.raw(t, "GET /v1/sandboxes HTTP/1.1\r\nHost: "+kpHost+"\r\nAuthorization: Bearer "+e.token+"\r\n\r\n")
	var got seen
	if json.Unmarshal([]byte(body), &got); res.StatusCode != 200 || got.Path != "/v1/sandboxes" || strings.Contains(body, e.id) {
		t.Errorf("an API route on a key preview's host: %d %s, want the app's", res.StatusCode, body)
	}
}

// TestPreviewHostileApp: an app that answers with something other than
// HTTP, with headers past the bound, with a protocol switch nobody asked
// for, or with nothing at all is 502 preview_unreachable, naming nothing
// of the cluster.
func TestPreviewHostileApp(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	answers := map[string]string{
		"/garbage":      "HELLO WORLD\r\n\r\n",
		"/bad-status":   "HTTP/1.1 2000000 OK\r\n\r\n",
		"/huge-headers": "HTTP/1.1 200 OK\r\nX-Big: " + strings.Repeat("a", 300<<10) + "\r\n\r\n",
		"/switch":       "HTTP/1.1 101 Switching Protocols\r\nUpgrade: evil\r\nConnection: Upgrade\r\n\r\n",
		"/nothing":      "",
	}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				req, err := http.ReadRequest(bufio.NewReader(c))
				if err != nil {
					return
				}
				io.WriteString(c, answers[req.URL.Path])
			}()
		}
	}()
	e := newPreviewEnv(t, func(o *Options, _ *control.Options) {
		o.Previews.Dial = func(*control.Session, int) (net.Conn, error) { return net.Dial("tcp", ln.Addr().String()) }
	})
	p := e.createPreview(t, e.testServer, `{"port":3000}`)
	for path := range answers {
		res, body := e.visit(t, bare(t, p.URL)+strings.TrimPrefix(path, "/"), "Cookie", previewCookie+"="+p.Token)
		if res.StatusCode != http.StatusBadGateway || !strings.Contains(body, `"`+api.CodePreviewUnreachable+`"`) ||
			strings.Contains(body, "127.0.0.1") || strings.Contains(body, "aaaa") {
			t.Errorf("an app answering %s: %d %.300s, want 502 %s", path, res.StatusCode, body, api.CodePreviewUnreachable)
		}
	}
}

// TestPreviewBearerSpellings: an API key or a preview token in an
// Authorization of any spelling of the Bearer scheme (the scheme's case
// does not matter, nor the blanks around the credential) never reaches
// the app, on a token preview or a key preview.
func TestPreviewBearerSpellings(t *testing.T) {
	e := newPreviewEnv(t)
	p := e.createPreview(t, e.testServer, `{"port":3000}`)
	kp := e.createPreview(t, e.testServer, `{"port":3000,"auth":"key"}`)
	for _, secret := range []string{e.token, p.Token} {
		for _, auth := range []string{"bearer " + secret, "BEARER " + secret, "Bearer  " + secret, "Bearer\t" + secret, "Bearer " + secret + " "} {
			// An API key on a token preview's host is a key visit, refused.
			want := http.StatusOK
			if secret == e.token {
				want = http.StatusNotFound
			}
			res, body := e.visit(t, bare(t, p.URL), "Cookie", previewCookie+"="+p.Token, "Authorization", auth)
			if res.StatusCode != want || strings.Contains(body, secret) {
				t.Errorf("a token visit with Authorization %q: %d, the app saw %s", auth, res.StatusCode, body)
			}
			res, body = e.visit(t, kp.URL, "Authorization", "Bearer "+e.token, "Authorization", auth)
			if res.StatusCode != http.StatusOK || strings.Contains(body, secret) {
				t.Errorf("a key visit with another Authorization %q: %d, the app saw %s", auth, res.StatusCode, body)
			}
		}
	}
}

// TestPreviewInformational: an app's informational answers (103 Early
// Hints, 100 Continue) set no cookie, and do not cost a POST with the token
// in its query the cookie hiloop sets on the final answer.
func TestPreviewInformational(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				req, err := http.ReadRequest(bufio.NewReader(c))
				if err != nil {
					return
				}
				io.Copy(io.Discard, req.Body)
				io.WriteString(c, "HTTP/1.1 103 Early Hints\r\nSet-Cookie: "+previewCookie+"=hlp_evil; Domain=preview.test; Path=/\r\nSet-Cookie: sess=1; Domain=preview.test\r\nLink: </a.css>; rel=preload\r\n\r\n"+
					"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
			}()
		}
	}()
	e := newPreviewEnv(t, func(o *Options, _ *control.Options) {
		o.Previews.Dial = func(*control.Session, int) (net.Conn, error) { return net.Dial("tcp", ln.Addr().String()) }
	})
	p := e.createPreview(t, e.testServer, `{"port":3000}`)
	var early []string
	var mu sync.Mutex
	trace := &httptrace.ClientTrace{Got1xxResponse: func(code int, h textproto.MIMEHeader) error {
		mu.Lock()
		defer mu.Unlock()
		early = append(early, h.Values("Set-Cookie")...)
		return nil
	}}
	req, err := http.NewRequestWithContext(httptrace.WithClientTrace(context.Background(), trace), "POST",
		strings.Replace(p.URL, "https://", "http://", 1), strings.NewReader("form=data"))
	if err != nil {
		t.Fatal(err)
	}
	res, err := e.client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	mu.Lock()
	defer mu.Unlock()
	if len(early) != 0 {
		t.Errorf("an informational answer set cookies: %q", early)
	}
	got := res.Header.Values("Set-Cookie")
	if res.StatusCode != http.StatusOK || len(got) != 1 || !strings.HasPrefix(got[0], previewCookie+"="+p.Token+";") {
		t.Errorf("the final answer: %d Set-Cookie %q, want hiloop's cookie alone", res.StatusCode, got)
	}
}

// TestPreviewRefusalsAlike: an unknown preview, a wrong token, a revoked
// preview, an expired one, a token on a key preview's host and another
// organization's key all get the same answer, header for header, but for
// the request id.
func TestPreviewRefusalsAlike(t *testing.T) {
	var now atomic.Int64
	now.Store(time.Now().UnixNano())
	e := newPreviewEnv(t, func(_ *Options, co *control.Options) { co.Now = func() time.Time { return time.Unix(0, now.Load()) } })
	live := e.createPreview(t, e.testServer, `{"port":3000}`)
	revoked := e.createPreview(t, e.testServer, `{"port":3000}`)
	expiring := e.createPreview(t, e.testServer, `{"port":3000,"ttl":"1m"}`)
	kp := e.createPreview(t, e.testServer, `{"port":3000,"auth":"key"}`)
	if rec := e.do("DELETE", "/v1/sandboxes/"+e.id+"/previews/"+revoked.ID, ""); rec.Code != http.StatusNoContent {
		t.Fatalf("revoke: %d", rec.Code)
	}
	now.Add(int64(time.Minute))
	orgB, err := e.db.CreateOrg(context.Background(), "b", 10, 10)
	if err != nil {
		t.Fatal(err)
	}
	_, secretB, err := e.db.CreateKey(context.Background(), orgB.ID, "b")
	if err != nil {
		t.Fatal(err)
	}
	cookie := func(tok string) []string { return []string{"Cookie", previewCookie + "=" + tok} }
	cases := []struct {
		what, u string
		h       []string
	}{
		{"an unknown preview", strings.Replace(bare(t, live.URL), "pv-", "pv-a", 1), cookie(live.Token)},
		{"a wrong token", bare(t, live.URL), cookie("hlp_" + strings.Repeat("x", 43))},
		{"a revoked preview", bare(t, revoked.URL), cookie(revoked.Token)},
		{"an expired preview", bare(t, expiring.URL), cookie(expiring.Token)},
		{"a token on a key preview", kp.URL, []string{"Authorization", "Bearer " + live.Token}},
		{"another organization's key", kp.URL, []string{"Authorization", "Bearer " + secretB}},
		{"an unknown API key", kp.URL, []string{"Authorization", "Bearer hl_" + strings.Repeat("x", 43)}},
	}
	shape := func(res *http.Response, body string) string {
		var b api.ErrorBody
		json.Unmarshal([]byte(body), &b)
		b.Error.RequestID = ""
		var keys []string
		for k := range res.Header {
			if k != "Date" && k != "X-Request-Id" {
				keys = append(keys, k+"="+strings.Join(res.Header[k], ","))
			}
		}
		slices.Sort(keys)
		return fmt.Sprintf("%d %+v %v", res.StatusCode, b, keys)
	}
	var first string
	for _, c := range cases {
		res, body := e.visit(t, c.u, c.h...)
		wantNoPreview(t, c.what, res, body)
		if s := shape(res, body); first == "" {
			first = s
		} else if s != first {
			t.Errorf("%s: %s, unlike %s: %s", c.what, s, cases[0].what, first)
		}
	}
}
