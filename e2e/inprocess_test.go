package e2e_test

import (
	"net"
	"path/filepath"
	"testing"

	"go.uber.org/goleak"

	"github.com/hiloop/hiloop/internal/e2e"
)

// TestServeInProcessStops: an in-process hiloop serves its API and its SSH
// gateway on the addresses it returns, with the admin key it bootstrapped,
// and Stop drains it as serve does on SIGINT: once Stop returns, no
// goroutine of it is left. Idle HTTP connections are the only ones
// allowed: client-go keeps its transport to the API server (HTTP/2) for the
// whole process, and the test's own client keeps its connections too.
func TestServeInProcessStops(t *testing.T) {
	ns := e2e.NewNamespace(t)
	ignore := []goleak.Option{goleak.IgnoreCurrent(),
		goleak.IgnoreAnyFunction("net/http.(*persistConn).readLoop"),
		goleak.IgnoreAnyFunction("net/http.(*persistConn).writeLoop"),
		goleak.IgnoreAnyFunction("golang.org/x/net/http2.(*ClientConn).readLoop")}
	in := e2e.ServeInProcess(t, filepath.Join(t.TempDir(), "h.db"), ns)
	if in.Cmd != nil || in.Token == "" || !in.NewKey {
		t.Fatalf("in-process hiloop: process %v, key %q (new %v)", in.Cmd, in.Token, in.NewKey)
	}
	status, body := in.Call(in.Token, "POST", "/v1/sandboxes", `{"image":"busybox"}`)
	if status != 201 {
		t.Fatalf("create: %d %s", status, body)
	}
	conn, err := net.Dial("tcp", in.SSHAddr)
	if err != nil {
		t.Fatalf("the SSH gateway at %q: %v", in.SSHAddr, err)
	}
	banner := make([]byte, 4)
	if _, err := conn.Read(banner); err != nil || string(banner) != "SSH-" {
		t.Errorf("the SSH gateway at %s says %q (%v)", in.SSHAddr, banner, err)
	}
	conn.Close()
	in.Stop()
	if _, err := net.Dial("tcp", in.SSHAddr); err == nil {
		t.Error("the SSH gateway still accepts connections after Stop")
	}
	goleak.VerifyNone(t, ignore...)
}
