package main

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/hiloop/hiloop/api"
)

// TestExecFrameWithoutCode: an exit frame with neither an exit code nor an
// error is hiloop's own failure (exit 255), not a crash.
func TestExecFrameWithoutCode(t *testing.T) {
	up := websocket.Upgrader{Subprotocols: []string{api.ExecSubprotocol}}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, err := up.Upgrade(w, r, nil)
		if err != nil {
			return
		}
		defer c.Close()
		c.ReadMessage() // the start frame
		c.WriteMessage(websocket.BinaryMessage, append([]byte{api.ChanExit}, "{}"...))
		c.WriteControl(websocket.CloseMessage, websocket.FormatCloseMessage(websocket.CloseNormalClosure, ""), time.Now().Add(time.Second))
	}))
	defer srv.Close()
	cmd := &SandboxExecCmd{Conn: Conn{URL: srv.URL, Token: "hl_x"}, ID: "sbx_x", Command: []string{"--", "true"}}
	err := cmd.Run(context.Background())
	var f execFailure
	if !errors.As(err, &f) || f.ExitCode() != 255 {
		t.Fatalf("Run = %v, want an execFailure (exit 255)", err)
	}
}
