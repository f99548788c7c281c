package server

import (
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/gorilla/websocket"

	"github.com/hiloop/hiloop/api"
	"github.com/hiloop/hiloop/cluster"
	"github.com/hiloop/hiloop/control/controltest"
)

// bodyRoutes are the routes that take a JSON body.
var bodyRoutes = []struct{ method, path string }{
	{"POST", "/v1/sandboxes"},
	{"PATCH", "/v1/sandboxes/sbx_x"},
	{"POST", "/v1/sandboxes/sbx_x/exec/run"},
	{"POST", "/v1/keys"},
	{"POST", "/v1/ssh-keys"},
	{"POST", "/v1/sandboxes/sbx_x/stop"},
}

// FuzzBodies: no body, on any route that takes one, panics the server or
// gets a 5xx.
func FuzzBodies(f *testing.F) {
	for i := range bodyRoutes {
		for _, seed := range []string{``, `{}`, `{"image":"busybox"}`, `{"image":"busybox","resources":{"cpu_request":"1"},"volumes":[{"name":"d","size":"1Gi","mount_path":"/d"}]}`,
			`{"ttl":"1h"}`, `{"command":["true"],"stdin":"x","timeout":"1s"}`, `{"name":"k"}`, `{"public_key":"ssh-ed25519 AAAA"}`, `[`, `{"image":1}`, "\x00", `{"labels":{"a":"b"}}`} {
			f.Add(i, seed)
		}
	}
	ts := newTestServer(f, &controltest.Cluster{})
	f.Fuzz(func(t *testing.T, route int, body string) {
		if route < 0 {
			route = -route
		}
		rt := bodyRoutes[route%len(bodyRoutes)]
		req := httptest.NewRequest(rt.method, rt.path, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+ts.token)
		rec := httptest.NewRecorder()
		ts.srv.ServeHTTP(rec, req)
		if rec.Code >= 500 {
			t.Fatalf("%s %s %q: %d %s", rt.method, rt.path, body, rec.Code, rec.Body.String())
		}
	})
}

// FuzzQuery: no query string on the list and exec endpoints panics the
// server or gets a 5xx.
func FuzzQuery(f *testing.F) {
	for _, seed := range []string{"", "state=running", "label=a=b&label=c=d", "limit=0", "limit=1001", "after=sbx_x", "command=true&tty=true&stdin=true",
		"timeout=1h", "%zz", "label=%00", "state=nope&x=1"} {
		f.Add(false, seed)
		f.Add(true, seed)
	}
	ts := newTestServer(f, &controltest.Cluster{})
	f.Fuzz(func(t *testing.T, exec bool, q string) {
		path := "/v1/sandboxes"
		if exec {
			path = "/v1/sandboxes/sbx_x/exec"
		}
		req := httptest.NewRequest("GET", "/", nil)
		req.URL.Path, req.URL.RawQuery = path, q
		req.Header.Set("Authorization", "Bearer "+ts.token)
		rec := httptest.NewRecorder()
		ts.srv.ServeHTTP(rec, req)
		if rec.Code >= 500 {
			t.Fatalf("GET %s?%s: %d %s", path, q, rec.Code, rec.Body.String())
		}
	})
}

// FuzzFrames: no client message of the exec protocol panics the server;
// each is applied or refused.
func FuzzFrames(f *testing.F) {
	for _, seed := range [][]byte{{}, {api.ChanStdin, 'x'}, {api.ChanCloseIn, api.ChanStdin}, {api.ChanCloseIn}, {api.ChanResize}, append([]byte{api.ChanResize}, `{"width":80,"height":24}`...),
		append([]byte{api.ChanResize}, `{"width":0}`...), {9}, {api.ChanExit}} {
		f.Add(websocket.BinaryMessage, seed, true)
		f.Add(websocket.TextMessage, seed, false)
	}
	s := &Server{}
	f.Fuzz(func(t *testing.T, mt int, frame []byte, tty bool) {
		resize := make(chan cluster.TerminalSize, 1)
		s.handleFrame(mt, frame, nil, resize, tty)
	})
}

// FuzzSSHKey: no public-key line panics the parser.
func FuzzSSHKey(f *testing.F) {
	for _, seed := range []string{"", "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGatewayKeyForTheGoldenFileOnly0000000000 x", "ssh-rsa AAAA", "from=\"x\" ssh-ed25519 AAAA", "a\nb"} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, line string) {
		parseSSHKey(line)
	})
}
