package server

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"
	"k8s.io/client-go/rest"

	"github.com/hiloop/hiloop/api"
	"github.com/hiloop/hiloop/control"
	"github.com/hiloop/hiloop/control/controltest"
	"github.com/hiloop/hiloop/internal/hungtest"
	"github.com/hiloop/hiloop/k8s"
	"github.com/hiloop/hiloop/store"
)

// TestExecTimeoutBeforeTheStreamOpened: a caller's timeout that passes
// while the stream to the cluster is still being opened (a hung API
// server) is 503 cluster_unavailable with Retry-After from exec/run, and
// cluster_unavailable in the streaming exit frame: no command ran, so none
// timed out. A command that ran and outlived its timeout stays timed_out
// (exec_timeout in the frame).
func TestExecTimeoutBeforeTheStreamOpened(t *testing.T) {
	for _, hang := range []bool{true, false} {
		ts := newTestServer(t, &controltest.Cluster{}, func(_ *Options, co *control.Options) {
			co.Exec = controltest.Exec{Hang: hang}
		})
		id := ts.create(`{"image":"busybox"}`)
		ts.db.Observe(context.Background(), id, store.Observation{State: store.StateRunning})

		rec := ts.do("POST", "/v1/sandboxes/"+id+"/exec/run", `{"command":["true"],"timeout":"20ms"}`)
		var run api.ExecRunResponse
		json.Unmarshal(rec.Body.Bytes(), &run)
		switch {
		case hang && (rec.Code != 503 || errCode(t, rec) != api.CodeClusterUnavailable || rec.Header().Get("Retry-After") == ""):
			t.Errorf("exec/run whose stream never opened: %d %s", rec.Code, rec.Body.String())
		case !hang && (rec.Code != 200 || !run.TimedOut):
			t.Errorf("exec/run of a command past its timeout: %d %s", rec.Code, rec.Body.String())
		}

		hs := httptest.NewServer(ts.srv)
		d := websocket.Dialer{Subprotocols: []string{api.ExecSubprotocol}}
		c, _, err := d.Dial("ws"+strings.TrimPrefix(hs.URL, "http")+"/v1/sandboxes/"+id+"/exec?command=true&timeout=20ms",
			http.Header{"Authorization": {"Bearer " + ts.token}})
		if err != nil {
			t.Fatal(err)
		}
		var f api.ExitFrame
		for {
			_, b, err := c.ReadMessage()
			if err != nil {
				t.Fatalf("no exit frame: %v", err)
			}
			if len(b) > 0 && b[0] == api.ChanExit {
				json.Unmarshal(b[1:], &f)
				break
			}
		}
		c.Close()
		hs.Close()
		want := api.CodeExecTimeout
		if hang {
			want = api.CodeClusterUnavailable
		}
		if f.Error == nil || f.Error.Code != want || f.ExitCode != nil {
			t.Errorf("stream (stream opens: %v): exit frame %+v, want error %s", !hang, f, want)
		}
	}
}

// hungAPIServer is an address that accepts connections and never answers
// what it reads, as the kernel does for an API server stopped with
// SIGSTOP; with refuseWebSocket it answers a WebSocket handshake with a
// refusal first, as an API server that speaks only SPDY does.
func hungAPIServer(t *testing.T, refuseWebSocket bool) string {
	return hungtest.Server(t, func(_ int, line string) (string, bool) {
		if refuseWebSocket && strings.HasPrefix(line, "GET ") {
			return "HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n", false
		}
		return "", false
	})
}

// TestExecAnswersWhileTheAPIServerHangs: with the real cluster adapter in
// front of an API server that accepts connections and never answers,
// exec/run with the default timeout, far longer than the cluster's,
// answers 503 cluster_unavailable with Retry-After once the cluster's
// timeout passes, while the server still hangs, over WebSocket and over
// SPDY alike.
func TestExecAnswersWhileTheAPIServerHangs(t *testing.T) {
	for _, spdyOnly := range []bool{false, true} {
		clients, err := k8s.NewClients(&rest.Config{Host: "http://" + hungAPIServer(t, spdyOnly)})
		if err != nil {
			t.Fatal(err)
		}
		ts := newTestServer(t, &controltest.Cluster{}, func(_ *Options, co *control.Options) {
			co.Exec = &k8s.Execer{Clients: clients, Namespace: "ns", ConnectTimeout: 100 * time.Millisecond}
		})
		id := ts.create(`{"image":"busybox"}`)
		ts.db.Observe(context.Background(), id, store.Observation{State: store.StateRunning})
		done := make(chan *httptest.ResponseRecorder, 1)
		go func() { done <- ts.do("POST", "/v1/sandboxes/"+id+"/exec/run", `{"command":["true"]}`) }()
		select {
		case rec := <-done:
			if rec.Code != 503 || errCode(t, rec) != api.CodeClusterUnavailable || rec.Header().Get("Retry-After") == "" {
				t.Fatalf("exec/run while the API server hangs (SPDY only: %v): %d %s", spdyOnly, rec.Code, rec.Body.String())
			}
		case <-time.After(api.DefaultExecTimeout): // a hang, not a slow answer
			t.Fatalf("exec/run waits on the hung API server (SPDY only: %v)", spdyOnly)
		}
	}
}
