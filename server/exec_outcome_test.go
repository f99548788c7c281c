package server

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/gorilla/websocket"

	"github.com/hiloop/hiloop/api"
	"github.com/hiloop/hiloop/control"
	"github.com/hiloop/hiloop/control/controltest"
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
