package e2e_test

import (
	"bytes"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"

	"github.com/hiloop/hiloop/internal/e2e"
)

// nonLoopback is an address of this machine that is not a loopback one.
func nonLoopback(t *testing.T) string {
	t.Helper()
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && !n.IP.IsLoopback() && n.IP.To4() != nil && n.IP.IsGlobalUnicast() {
			return n.IP.String()
		}
	}
	t.Skip("this machine has no non-loopback IPv4 address")
	return ""
}

// TestCLIRefusesPlainHTTP runs the CLI as a user does against an API on a
// non-loopback address over plain http://: every command that would send
// the key refuses before sending anything, and says how to override it;
// with --insecure-http, or HILOOP_INSECURE_HTTP, the request goes out.
func TestCLIRefusesPlainHTTP(t *testing.T) {
	ln, err := net.Listen("tcp", nonLoopback(t)+":0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var seen []string // the Authorization header of every request
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen = append(seen, r.Header.Get("Authorization"))
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusUnauthorized)
		w.Write([]byte(`{"error":{"code":"unauthorized","message":"no"}}`))
	})}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	requests := func() []string {
		mu.Lock()
		defer mu.Unlock()
		return append([]string{}, seen...)
	}
	run := func(env []string, args ...string) (string, int) {
		t.Helper()
		cmd := exec.Command(e2e.Binary(t), args...)
		cmd.Env = append(os.Environ(), append([]string{"HILOOP_URL=http://" + ln.Addr().String(), "HILOOP_TOKEN=hl_secret"}, env...)...)
		var errOut bytes.Buffer
		cmd.Stderr = &errOut
		err := cmd.Run()
		if _, ok := err.(*exec.ExitError); err != nil && !ok {
			t.Fatal(err)
		}
		return errOut.String(), cmd.ProcessState.ExitCode()
	}
	for _, args := range [][]string{
		{"sandbox", "list"},
		{"sandbox", "create", "busybox"},
		{"sandbox", "exec", "sbx_x", "--", "true"},
		{"sandbox", "ssh", "sbx_x"},
		{"ssh-config"},
		{"key", "list"},
	} {
		errOut, code := run(nil, args...)
		if code == 0 || !strings.Contains(errOut, "refusing to send the API key over plain http://") || !strings.Contains(errOut, "--insecure-http") {
			t.Errorf("hiloop %s: exit %d, %q", strings.Join(args, " "), code, errOut)
		}
	}
	if got := requests(); len(got) != 0 {
		t.Fatalf("refused commands sent %d requests: %q", len(got), got)
	}
	// Told to, it sends (and the stand-in API refuses the key).
	if errOut, code := run(nil, "sandbox", "list", "--insecure-http"); code == 0 || !strings.Contains(errOut, "unauthorized") {
		t.Fatalf("with --insecure-http: exit %d, %q", code, errOut)
	}
	if errOut, code := run([]string{"HILOOP_INSECURE_HTTP=true"}, "sandbox", "exec", "sbx_x", "--", "true"); code == 0 || !strings.Contains(errOut, "unauthorized") {
		t.Fatalf("with HILOOP_INSECURE_HTTP=true: exit %d, %q", code, errOut)
	}
	if got := requests(); len(got) != 2 || got[0] != "Bearer hl_secret" || got[1] != "Bearer hl_secret" {
		t.Fatalf("requests with the override: %q", got)
	}
}
