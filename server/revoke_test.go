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

	"github.com/hiloop/hiloop/api"
	"github.com/hiloop/hiloop/cluster"
	"github.com/hiloop/hiloop/control"
	"github.com/hiloop/hiloop/control/controltest"
	"github.com/hiloop/hiloop/internal/eventually"
	"github.com/hiloop/hiloop/store"
)

// revokeStream is a test server whose exec writes stdout until a write
// fails, as a stream whose command never stops printing: it ends only when
// its connection does. secret is a second key that revokes the first.
func revokeStream(t *testing.T) (ts *testServer, url, id, secret string) {
	t.Helper()
	chunk := []byte(strings.Repeat("x", 32<<10))
	ts = newTestServer(t, &controltest.Cluster{}, func(_ *Options, co *control.Options) {
		co.Exec = controltest.Exec{Run: func(_ context.Context, req cluster.ExecRequest) (cluster.ExitStatus, error) {
			for {
				if _, err := req.Stdout.Write(chunk); err != nil {
					return cluster.ExitStatus{}, err
				}
			}
		}}
	})
	id = ts.create(`{"image":"busybox"}`)
	ts.db.Observe(context.Background(), id, store.Observation{State: store.StateRunning})
	rec := ts.do("POST", "/v1/keys", `{"name":"second"}`)
	var ck api.CreatedKey
	json.Unmarshal(rec.Body.Bytes(), &ck)
	hs := httptest.NewServer(ts.srv)
	t.Cleanup(hs.Close)
	return ts, "ws" + strings.TrimPrefix(hs.URL, "http") + "/v1/sandboxes/" + id + "/exec", id, ck.Secret
}

// revoke revokes the test server's first key with the second.
func revoke(t *testing.T, ts *testServer, secret string) {
	t.Helper()
	other := *ts
	other.token = secret
	if rec := other.do("DELETE", "/v1/keys/"+ts.keyID, ""); rec.Code != 204 {
		t.Fatalf("revoke: %d %s", rec.Code, rec.Body.String())
	}
}

// TestExecStreamEndsOnRevoke: a WebSocket exec stream whose key is revoked
// ends with a session_ended frame and a closed connection, also while it
// still waits for its first message, and also when its client stopped
// reading (the connection is closed under the blocked write).
func TestExecStreamEndsOnRevoke(t *testing.T) {
	t.Run("waiting for the command", func(t *testing.T) {
		ts, url, _, secret := revokeStream(t)
		d := websocket.Dialer{Subprotocols: []string{api.ExecSubprotocol}}
		c, _, err := d.Dial(url, http.Header{"Authorization": {"Bearer " + ts.token}})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		eventually.True(t, "session live", func() bool { return ts.ctl.Sessions() == 1 })
		revoke(t, ts, secret)
		// Well inside the 30s a stream waits for its first message, so
		// only the revoke can have ended it.
		c.SetReadDeadline(time.Now().Add(20 * time.Second))
		_, b, err := c.ReadMessage()
		if err != nil || len(b) == 0 || b[0] != api.ChanExit {
			t.Fatalf("after the revoke: %q, %v; want the exit frame", b, err)
		}
		var f api.ExitFrame
		if err := json.Unmarshal(b[1:], &f); err != nil || f.Error == nil || f.Error.Code != api.CodeSessionEnded {
			t.Fatalf("exit frame %s, want %s", b[1:], api.CodeSessionEnded)
		}
		if _, _, err := c.ReadMessage(); err == nil {
			t.Fatal("the connection stayed open after the exit frame")
		}
		eventually.True(t, "no session", func() bool { return ts.ctl.Sessions() == 0 })
	})
	t.Run("client not reading", func(t *testing.T) {
		ts, url, _, secret := revokeStream(t)
		d := websocket.Dialer{Subprotocols: []string{api.ExecSubprotocol}}
		c, _, err := d.Dial(url+"?command=yes", http.Header{"Authorization": {"Bearer " + ts.token}})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		eventually.True(t, "session live", func() bool { return ts.ctl.Sessions() == 1 })
		revoke(t, ts, secret)
		// The client reads nothing: only closing the connection unblocks
		// the command's write and ends the session.
		eventually.True(t, "no session", func() bool { return ts.ctl.Sessions() == 0 })
	})
}

// TestLongPollAfterRevoke: a long poll whose key is revoked while it
// waits answers 401 when it wakes, not the sandbox as it stands after the
// revoke: a read after the revoke is a read by a revoked key. Its
// organization's other key still reads the change.
func TestLongPollAfterRevoke(t *testing.T) {
	ts := newTestServer(t, &controltest.Cluster{})
	id := ts.create(`{"image":"busybox"}`)
	rec := ts.do("POST", "/v1/keys", `{"name":"second"}`)
	var ck api.CreatedKey
	if err := json.Unmarshal(rec.Body.Bytes(), &ck); err != nil || ck.Secret == "" {
		t.Fatalf("create key: %d %s", rec.Code, rec.Body.String())
	}
	done := make(chan *httptest.ResponseRecorder, 1)
	go func() { done <- ts.do("GET", "/v1/sandboxes/"+id+"?while=pending&wait=1m", "") }()
	eventually.True(t, "the long poll waiting", func() bool { return ts.db.Waiting() == 1 })
	revoke(t, ts, ck.Secret)
	if _, err := ts.db.Observe(context.Background(), id, store.Observation{State: store.StateStarting}); err != nil {
		t.Fatal(err)
	}
	select {
	case rec := <-done:
		if rec.Code != http.StatusUnauthorized || errCode(t, rec) != api.CodeUnauthorized {
			t.Errorf("the revoked key's long poll after the change: %d %s, want 401", rec.Code, rec.Body.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the long poll did not answer the state change")
	}
	second := *ts
	second.token = ck.Secret
	if rec := second.do("GET", "/v1/sandboxes/"+id+"?while=pending&wait=1m", ""); rec.Code != 200 || decodeSandbox(t, rec).State != api.StateStarting {
		t.Errorf("the live key's long poll: %d %s", rec.Code, rec.Body.String())
	}
}
