package e2e_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os/exec"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/hiloop/hiloop/internal/e2e"
	"github.com/hiloop/hiloop/internal/eventually"
)

// previewApp is the app the tests run in a sandbox: python3's HTTP server
// answering GET with what reached it, and echoing a WebSocket on /ws
// (the handshake and frames by hand: the standard library has none).
const previewApp = `
import base64, hashlib, http.server, json, struct, sys
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def log_message(self, *a):
        pass
    def do_GET(self):
        if self.path == "/ws":
            return self.ws()
        body = json.dumps({"page": "hello from the sandbox", "path": self.path, "host": self.headers.get("Host", ""),
            "authorization": self.headers.get("Authorization", ""), "cookie": self.headers.get("Cookie", "")}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def ws(self):
        self.close_connection = True
        key = self.headers["Sec-WebSocket-Key"] + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
        self.send_response(101)
        self.send_header("Upgrade", "websocket")
        self.send_header("Connection", "Upgrade")
        self.send_header("Sec-WebSocket-Accept", base64.b64encode(hashlib.sha1(key.encode()).digest()).decode())
        self.end_headers()
        self.wfile.flush()
        while True:
            h = self.rfile.read(2)
            if len(h) < 2:
                return
            op, n = h[0] & 15, h[1] & 127
            if n == 126:
                n = struct.unpack(">H", self.rfile.read(2))[0]
            elif n == 127:
                n = struct.unpack(">Q", self.rfile.read(8))[0]
            mask = self.rfile.read(4) if h[1] & 128 else bytes(4)
            data = bytes(b ^ mask[i % 4] for i, b in enumerate(self.rfile.read(n)))
            if op == 8:
                return
            if op in (1, 2):
                size = bytes([n]) if n < 126 else struct.pack(">BH", 126, n)
                self.wfile.write(bytes([128 | op]) + size + data)
                self.wfile.flush()
http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
`

// previewServe serves with previews on preview.localhost (http URLs),
// the forward transport and metrics.
func previewServe(t *testing.T) (*e2e.Instance, string) {
	t.Helper()
	return idleServe(t, "--preview-domain", "preview.localhost")
}

// runPreviewApp runs previewApp in the sandbox, listening on the
// sandbox's loopback, and returns its port.
func runPreviewApp(t *testing.T, in *e2e.Instance, id string) string {
	t.Helper()
	_, port, _ := net.SplitHostPort(e2e.FreeAddr(t))
	cmd := exec.Command(e2e.Binary(t), "sandbox", "exec", id, "--", "python3", "-c", previewApp, port, "hiloop-preview-app")
	cmd.Env = in.Env(in.Token)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	out := &e2e.SyncBuffer{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
		e2e.KillExecProcs(t, regexp.MustCompile(`hiloop-preview-app$`))
		if t.Failed() {
			t.Logf("the app's output:\n%s", out.String())
		}
	})
	return port
}

// previewClient reaches serve's listener whatever host a URL names (the
// preview's, pv-ID.preview.localhost) and follows no redirect.
func previewClient(in *e2e.Instance) *http.Client {
	addr := strings.TrimPrefix(in.URL, "http://")
	return &http.Client{
		Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "tcp", addr)
		}},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		Timeout:       2 * time.Minute,
	}
}

// visitPreview GETs u with headers in pairs.
func visitPreview(t *testing.T, in *e2e.Instance, u string, headers ...string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest("GET", u, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Add(headers[i], headers[i+1])
	}
	res, err := previewClient(in).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res, string(b)
}

// previewWS opens a WebSocket to the app's /ws through the preview.
func previewWS(t *testing.T, in *e2e.Instance, base string, h http.Header) *websocket.Conn {
	t.Helper()
	addr := strings.TrimPrefix(in.URL, "http://")
	d := websocket.Dialer{NetDialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "tcp", addr)
	}, HandshakeTimeout: time.Minute}
	c, res, err := d.Dial(strings.Replace(base, "http://", "ws://", 1)+"ws", h)
	if err != nil {
		status := 0
		if res != nil {
			status = res.StatusCode
		}
		t.Fatalf("WebSocket through the preview: %v (%d)", err, status)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// echoes checks that the WebSocket echoes msg.
func echoes(t *testing.T, c *websocket.Conn, msg string) {
	t.Helper()
	c.SetWriteDeadline(time.Now().Add(time.Minute))
	c.SetReadDeadline(time.Now().Add(time.Minute))
	if err := c.WriteMessage(websocket.TextMessage, []byte(msg)); err != nil {
		t.Fatal(err)
	}
	if _, got, err := c.ReadMessage(); err != nil || string(got) != msg {
		t.Fatalf("echo: %q %v", got, err)
	}
	c.SetReadDeadline(time.Time{})
}

// cut waits for the WebSocket to end, as an event: a read that fails for
// any reason but its own deadline.
func cut(t *testing.T, c *websocket.Conn, what string) {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(time.Minute))
	_, _, err := c.ReadMessage()
	var ne net.Error
	if err == nil || errors.As(err, &ne) && ne.Timeout() {
		t.Fatalf("the WebSocket outlived %s: %v", what, err)
	}
}

type previewJSON struct {
	ID    string `json:"id"`
	URL   string `json:"url"`
	Token string `json:"token"`
}

// createPreview makes a preview through the CLI, as a user does.
func createPreview(t *testing.T, in *e2e.Instance, id, port string, args ...string) previewJSON {
	t.Helper()
	out := in.MustCLI(in.Token, append([]string{"sandbox", "preview", "-o", "json", id, port}, args...)...)
	var p previewJSON
	if err := json.Unmarshal([]byte(out), &p); err != nil {
		t.Fatalf("sandbox preview -o json: %q", out)
	}
	return p
}

func withoutQuery(u string) string {
	pu, _ := url.Parse(u)
	pu.RawQuery = ""
	return pu.String()
}

func wantGone(t *testing.T, what string, res *http.Response, body string) {
	t.Helper()
	if res.StatusCode != http.StatusNotFound || !strings.Contains(body, "no such preview") {
		t.Errorf("%s: %d %s, want 404 no such preview", what, res.StatusCode, body)
	}
}

// TestPreview: a page and a WebSocket of an app in a sandbox, through its
// preview URL: the token URL sets a cookie and redirects; the app sees
// none of hiloop's credentials; a missing or wrong token is refused; a
// revoke ends an open WebSocket and the next request; a key preview takes
// the organization's key and nothing else; another organization gets 404
// for everything; an expiry cuts an open WebSocket.
func TestPreview(t *testing.T) {
	in, dir := previewServe(t)
	sb := in.Create(in.Token, "busybox", "--transport", "exec", "--transport", "forward", "--wait")
	waitHelper(t, in, dir, sb.ID)
	port := runPreviewApp(t, in, sb.ID)

	url := strings.TrimSpace(in.MustCLI(in.Token, "sandbox", "preview", sb.ID, port))
	if !regexp.MustCompile(`^http://pv-[a-z2-7]{16}\.preview\.localhost/\?hiloop_preview_token=hlp_[A-Za-z0-9_-]{43}$`).MatchString(url) {
		t.Fatalf("sandbox preview printed %q", url)
	}
	res, _ := visitPreview(t, in, url)
	if res.StatusCode != http.StatusSeeOther || res.Header.Get("Location") != "/" || len(res.Cookies()) != 1 {
		t.Fatalf("the token URL: %d Location %q cookies %v", res.StatusCode, res.Header.Get("Location"), res.Cookies())
	}
	cookie := res.Cookies()[0].Name + "=" + res.Cookies()[0].Value
	base := withoutQuery(url)
	// The app starts in the background: the preview answers 502 until it
	// listens.
	var body string
	eventually.Within(t, "the app through the preview", time.Minute, func() (bool, error) {
		res, body = visitPreview(t, in, base+"index?x=1", "Cookie", "theirs=1; "+cookie)
		return res.StatusCode == http.StatusOK, fmt.Errorf("%d %s", res.StatusCode, body)
	})
	var seen struct{ Page, Path, Host, Authorization, Cookie string }
	json.Unmarshal([]byte(body), &seen)
	host := strings.TrimSuffix(strings.TrimPrefix(base, "http://"), "/")
	if seen.Page != "hello from the sandbox" || seen.Path != "/index?x=1" || seen.Host != host || seen.Cookie != "theirs=1" || seen.Authorization != "" {
		t.Errorf("the app saw %+v", seen)
	}
	for what, h := range map[string][]string{"no token": nil, "a wrong token": {"Cookie", "hiloop_preview_token=hlp_x"},
		"the API key": {"Authorization", "Bearer " + in.Token}} {
		res, body := visitPreview(t, in, base, h...)
		wantGone(t, what, res, body)
	}

	ws := previewWS(t, in, base, http.Header{"Cookie": {cookie}})
	echoes(t, ws, "hello")
	echoes(t, ws, strings.Repeat("x", 1000))
	list := in.MustCLI(in.Token, "sandbox", "previews", sb.ID)
	id := regexp.MustCompile(`pv_[a-z2-7]{16}`).FindString(list)
	if id == "" || strings.Contains(list, "hlp_") {
		t.Fatalf("sandbox previews:\n%s", list)
	}
	in.MustCLI(in.Token, "sandbox", "preview-revoke", sb.ID, id)
	cut(t, ws, "the revoke")
	res, body = visitPreview(t, in, base, "Cookie", cookie)
	wantGone(t, "revoked", res, body)

	// A key preview.
	kp := createPreview(t, in, sb.ID, port, "--auth", "key")
	if kp.Token != "" || strings.Contains(kp.URL, "?") {
		t.Fatalf("a key preview has a token: %+v", kp)
	}
	res, body = visitPreview(t, in, kp.URL)
	wantGone(t, "a key preview without a key", res, body)
	res, body = visitPreview(t, in, kp.URL, "Authorization", "Bearer "+in.Token)
	json.Unmarshal([]byte(body), &seen)
	if res.StatusCode != http.StatusOK || seen.Authorization != "" {
		t.Errorf("a key preview with the key: %d %s", res.StatusCode, body)
	}

	// Another organization.
	other := in.NewOrg("preview-other", 10, 10)
	res, body = visitPreview(t, in, kp.URL, "Authorization", "Bearer "+other)
	wantGone(t, "another organization's key", res, body)
	for _, rq := range []struct{ method, path, body string }{
		{"POST", "/v1/sandboxes/" + sb.ID + "/previews", `{"port":` + port + `}`},
		{"GET", "/v1/sandboxes/" + sb.ID + "/previews", ""},
		{"DELETE", "/v1/sandboxes/" + sb.ID + "/previews/" + kp.ID, ""},
	} {
		if status, body := in.Call(other, rq.method, rq.path, rq.body); status != 404 || !strings.Contains(body, `"not_found"`) {
			t.Errorf("%s %s by another organization: %d %s", rq.method, rq.path, status, body)
		}
	}
	otherSB := in.Create(other, "busybox", "--transport", "exec", "--transport", "forward")
	status, out := in.Call(other, "POST", "/v1/sandboxes/"+otherSB.ID+"/previews", `{"port":`+port+`}`)
	var op previewJSON
	json.Unmarshal([]byte(out), &op)
	if status != 201 || op.Token == "" {
		t.Fatalf("the other organization's preview: %d %s", status, out)
	}
	res, body = visitPreview(t, in, base, "Cookie", "hiloop_preview_token="+op.Token)
	wantGone(t, "another organization's token on this host", res, body)

	// Bad requests.
	for body, field := range map[string]string{`{"port":0}`: "port", `{"port":80,"auth":"basic"}`: "auth", `{"port":80,"ttl":"forever"}`: "ttl"} {
		status, out := in.Call(in.Token, "POST", "/v1/sandboxes/"+sb.ID+"/previews", body)
		if status != 400 || !strings.Contains(out, `"invalid_field"`) || !strings.Contains(out, `"field": "`+field+`"`) {
			t.Errorf("%s: %d %s", body, status, out)
		}
	}

	// An expiry ends an open WebSocket, and the next request.
	short := createPreview(t, in, sb.ID, port, "--ttl", "5s")
	ws = previewWS(t, in, withoutQuery(short.URL), http.Header{"Cookie": {"hiloop_preview_token=" + short.Token}})
	echoes(t, ws, "before it expires")
	cut(t, ws, "the preview's expiry")
	res, body = visitPreview(t, in, withoutQuery(short.URL), "Cookie", "hiloop_preview_token="+short.Token)
	wantGone(t, "expired", res, body)
}

// TestPreviewWakes: a visit to a preview of a sandbox stopped for
// idleness wakes it as an ssh -L channel does, and is answered once it
// runs; an open WebSocket keeps it running past its idle timeout.
func TestPreviewWakes(t *testing.T) {
	in, dir := previewServe(t)
	// In the local cluster a pod's loopback is this machine's.
	app := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/ws" {
			up := websocket.Upgrader{}
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
		io.WriteString(w, "awake")
	}))
	t.Cleanup(app.Close)
	_, port, _ := net.SplitHostPort(app.Listener.Addr().String())
	sb := in.Create(in.Token, "busybox", "--idle-timeout", "0", "--transport", "forward", "--wait")
	waitHelper(t, in, dir, sb.ID)
	p := createPreview(t, in, sb.ID, port)
	cookie := "hiloop_preview_token=" + p.Token
	base := withoutQuery(p.URL)

	before := getIdle(t, in, in.Token, sb.ID).LastActivityAt
	ws := previewWS(t, in, base, http.Header{"Cookie": {cookie}})
	echoes(t, ws, "open")
	eventually.Within(t, "the WebSocket counted as use", 20*time.Second, func() (bool, error) {
		return getIdle(t, in, in.Token, sb.ID).LastActivityAt.After(before), nil
	})
	in.MustCLI(in.Token, "sandbox", "idle-timeout", sb.ID, "2s")
	waitIdleStopped(t, in, in.Token, in.Create(in.Token, "busybox", "--idle-timeout", "6s", "--wait").ID)
	stillRunning(t, in, in.Token, map[string]string{sb.ID: "an open WebSocket through a preview"})
	ws.Close()

	waitIdleStopped(t, in, in.Token, sb.ID)
	res, body := visitPreview(t, in, base, "Cookie", cookie)
	if res.StatusCode != http.StatusOK || body != "awake" {
		t.Fatalf("a visit to the idle sandbox: %d %s", res.StatusCode, body)
	}
	if s := getIdle(t, in, in.Token, sb.ID); s.State != "running" {
		t.Errorf("after the visit woke it: %s", s.State)
	}
	if n := metric(t, in, `hiloop_wakes_total{trigger="preview"}`); n != 1 {
		t.Errorf(`hiloop_wakes_total{trigger="preview"} %v, want 1`, n)
	}

	// A sandbox its owner stopped is not woken.
	in.MustCLI(in.Token, "sandbox", "stop", sb.ID)
	in.WaitState(in.Token, sb.ID, "stopped")
	res, body = visitPreview(t, in, base, "Cookie", cookie)
	if res.StatusCode != http.StatusConflict || !strings.Contains(body, "sandbox_not_running") {
		t.Errorf("a visit to a sandbox its owner stopped: %d %s", res.StatusCode, body)
	}
}
