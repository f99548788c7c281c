package e2e_test

import (
	"github.com/hiloop/hiloop/internal/e2e"

	"bytes"
	"crypto/sha256"
	"encoding/json"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/hiloop/hiloop/api"
	"github.com/hiloop/hiloop/internal/eventually"
	"github.com/hiloop/hiloop/k8s"
)

// cliExec runs `hiloop sandbox exec` with stdin and returns what it printed
// and its exit code.
func cliExec(in *e2e.Instance, token string, stdin string, args ...string) (string, string, int) {
	return in.CLIInput(token, stdin, append([]string{"sandbox", "exec"}, args...)...)
}

func TestExecThroughAPIAndCLI(t *testing.T) {
	in := e2e.ServeInProcess(t, filepath.Join(t.TempDir(), "h.db"), e2e.NewNamespace(t))
	sb := in.Create(in.Token, "busybox", "--wait")

	if out, errOut, code := cliExec(in, in.Token, "", sb.ID, "--", "echo", "hello", "sandbox"); code != 0 || out != "hello sandbox\n" {
		t.Fatalf("echo: %d %q %q", code, out, errOut)
	}
	for _, want := range []int{0, 1, 42, 255} {
		if _, errOut, code := cliExec(in, in.Token, "", sb.ID, "--", "sh", "-c", "exit "+strconv.Itoa(want)); code != want {
			t.Errorf("exit %d came back as %d (%s)", want, code, errOut)
		}
	}
	// The fake kubelet wraps a signal death into an error text; it still
	// comes back as 128+9.
	if _, errOut, code := cliExec(in, in.Token, "", sb.ID, "--", "sh", "-c", "kill -KILL $$"); code != 137 {
		t.Errorf("signal death: exit %d (%s)", code, errOut)
	}
	// Stdin round trip (the fake kubelet never delivers stdin EOF, so the
	// command stops reading by itself; EOF is covered in k8s/exec_test.go).
	if out, errOut, code := cliExec(in, in.Token, "first line\nsecond\n", "-i", sb.ID, "--", "head", "-n", "1"); code != 0 || out != "first line\n" {
		t.Fatalf("stdin: %d %q %q", code, out, errOut)
	}
	// Large output arrives complete and in order.
	want, _ := exec.Command("seq", "1", "2000000").Output()
	out, errOut, code := cliExec(in, in.Token, "", sb.ID, "--", "seq", "1", "2000000")
	if code != 0 || len(out) != len(want) || sha256.Sum256([]byte(out)) != sha256.Sum256(want) {
		t.Fatalf("seq 1 2000000: exit %d, %d bytes (want %d) %s", code, len(out), len(want), errOut)
	}

	// The one-shot endpoint.
	status, body := in.Call(in.Token, "POST", "/v1/sandboxes/"+sb.ID+"/exec/run",
		`{"command":["sh","-c","read x; echo out:$x; echo err >&2; exit 3"],"stdin":"typed\n"}`)
	var run api.ExecRunResponse
	json.Unmarshal([]byte(body), &run)
	if status != 200 || run.ExitCode == nil || *run.ExitCode != 3 || run.Stdout != "out:typed\n" || run.Stderr != "err\n" {
		t.Fatalf("exec/run: %d %s", status, body)
	}
	status, body = in.Call(in.Token, "POST", "/v1/sandboxes/"+sb.ID+"/exec/run", `{"command":["sh","-c","head -c 3000000 /dev/zero"]}`)
	json.Unmarshal([]byte(body), &run)
	if status != 200 || !run.StdoutTruncated || len(run.Stdout) != api.MaxRunOutput || *run.ExitCode != 0 {
		t.Fatalf("exec/run over the cap: %d truncated=%v len=%d", status, run.StdoutTruncated, len(run.Stdout))
	}
	status, body = in.Call(in.Token, "POST", "/v1/sandboxes/"+sb.ID+"/exec/run", `{"command":["sleep","5"],"timeout":"500ms"}`)
	run = api.ExecRunResponse{}
	json.Unmarshal([]byte(body), &run)
	if status != 200 || !run.TimedOut || run.ExitCode != nil {
		t.Fatalf("exec/run timeout: %d %s", status, body)
	}
}

func TestExecRefused(t *testing.T) {
	in := e2e.ServeInProcess(t, filepath.Join(t.TempDir(), "h.db"), e2e.NewNamespace(t), "--self-check-interval", "1h")
	other := in.NewOrg("other", 10, 10)
	running := in.Create(in.Token, "busybox", "--wait")
	stopped := in.Create(in.Token, "busybox", "--wait")
	in.MustCLI(in.Token, "sandbox", "stop", stopped.ID)
	in.WaitState(in.Token, stopped.ID, "stopped")
	quarantined := in.Create(in.Token, "busybox", "--wait")
	restore := e2e.WithoutAdmission(t, in.NS)
	e2e.Kubectl(t, "patch", "sandbox", "-n", in.NS, k8s.ObjectName(quarantined.ID), "--type=merge",
		"-p", `{"spec":{"podTemplate":{"spec":{"runtimeClassName":"runc"}}}}`)
	e2e.Kubectl(t, "apply", "-f", writeTemp(t, "apiVersion: node.k8s.io/v1\nkind: RuntimeClass\nmetadata: {name: runc}\nhandler: runc\n"))
	e2e.Kubectl(t, "delete", "pod", "-n", in.NS, k8s.ObjectName(quarantined.ID), "--wait=false")
	in.WaitState(in.Token, quarantined.ID, "quarantined")
	restore()

	run := `{"command":["true"]}`
	for _, tc := range []struct {
		name, token, id string
		status          int
		code            string
	}{
		{"stopped", in.Token, stopped.ID, 409, "sandbox_not_running"},
		{"quarantined", in.Token, quarantined.ID, 409, "sandbox_quarantined"},
		{"foreign", other, running.ID, 404, "not_found"},
		{"absent", other, "sbx_aaaaaaaaaaaaaaaa", 404, "not_found"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			status, body := in.Call(tc.token, "POST", "/v1/sandboxes/"+tc.id+"/exec/run", run)
			if status != tc.status || errorCode(t, body) != tc.code {
				t.Fatalf("exec/run: %d %s", status, body)
			}
			_, errOut, code := cliExec(in, tc.token, "", tc.id, "--", "true")
			if code != 255 || !strings.Contains(errOut, tc.code) || strings.Count(strings.TrimSpace(errOut), "\n") != 0 {
				t.Fatalf("cli: exit %d, stderr %q; want 255 and one line naming %s", code, errOut, tc.code)
			}
		})
	}
	// A foreign sandbox and an absent one are indistinguishable.
	_, foreign := in.Call(other, "POST", "/v1/sandboxes/"+running.ID+"/exec/run", run)
	_, absent := in.Call(other, "POST", "/v1/sandboxes/sbx_aaaaaaaaaaaaaaaa/exec/run", run)
	if e2e.WithoutRequestID(foreign) != e2e.WithoutRequestID(absent) {
		t.Fatalf("foreign %q differs from absent %q", foreign, absent)
	}
}

func writeTemp(t *testing.T, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "f.yaml")
	if err := writeFile(p, content); err != nil {
		t.Fatal(err)
	}
	return p
}

// dialExec opens the streaming endpoint with a raw WebSocket client.
func dialExec(t *testing.T, in *e2e.Instance, id string, q url.Values) *websocket.Conn {
	t.Helper()
	u := strings.Replace(in.URL, "http://", "ws://", 1) + "/v1/sandboxes/" + id + "/exec?" + q.Encode()
	c, resp, err := websocket.DefaultDialer.Dial(u, http.Header{"Authorization": {"Bearer " + in.Token}})
	if err != nil {
		t.Fatalf("dial: %v (%v)", err, resp)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// readExit reads messages until the exit frame.
func readExit(t *testing.T, c *websocket.Conn) api.ExitFrame {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(30 * time.Second))
	for {
		_, b, err := c.ReadMessage()
		if err != nil {
			t.Fatalf("no exit frame: %v", err)
		}
		if len(b) > 0 && b[0] == api.ChanExit {
			var f api.ExitFrame
			if err := json.Unmarshal(b[1:], &f); err != nil {
				t.Fatal(err)
			}
			return f
		}
	}
}

func TestExecBadInput(t *testing.T) {
	in := e2e.ServeInProcess(t, filepath.Join(t.TempDir(), "h.db"), e2e.NewNamespace(t))
	sb := in.Create(in.Token, "busybox", "--wait")
	huge := `{"command":["echo"` + strings.Repeat(`,"`+strings.Repeat("x", 1000)+`"`, 200) + `]}`
	for _, tc := range []struct {
		name, body string
		status     int
		code       string
	}{
		{"empty argv", `{"command":[]}`, 400, "invalid_field"},
		{"missing argv", `{}`, 400, "invalid_field"},
		{"empty program", `{"command":[""]}`, 400, "invalid_field"},
		{"enormous argv", huge, 400, "invalid_field"},
		{"NUL in argv", `{"command":["echo","a\u0000b"]}`, 400, "invalid_field"},
		{"bad timeout", `{"command":["true"],"timeout":"soon"}`, 400, "invalid_field"},
		{"negative timeout", `{"command":["true"],"timeout":"-1s"}`, 400, "invalid_field"},
		{"unknown field", `{"command":["true"],"user":"root"}`, 400, "unknown_field"},
		{"stdin not a string", `{"command":["true"],"stdin":5}`, 400, "invalid_field"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			status, body := in.Call(in.Token, "POST", "/v1/sandboxes/"+sb.ID+"/exec/run", tc.body)
			if status != tc.status || errorCode(t, body) != tc.code {
				t.Fatalf("%d %s", status, body)
			}
		})
	}
	// The streaming endpoint refuses bad parameters before upgrading.
	for _, q := range []string{"", "command=", "command=true&tty=maybe", "command=true&timeout=x", "command=true&shell=1", "command=true&tty=true"} {
		status, body := in.Call(in.Token, "GET", "/v1/sandboxes/"+sb.ID+"/exec?"+q, "")
		if status != 400 {
			t.Errorf("stream ?%s: %d %s", q, status, body)
		}
	}
	if status, body := in.Call(in.Token, "GET", "/v1/sandboxes/"+sb.ID+"/exec?command=true", ""); status != 400 || errorCode(t, body) != "websocket_required" {
		t.Errorf("plain GET: %d %s", status, body)
	}
	// Bad frames end the session with an error frame, never a crash.
	tty := url.Values{"command": {"sleep", "20"}, "tty": {"true"}, "stdin": {"true"}}
	plain := url.Values{"command": {"sleep", "20"}}
	for name, tc := range map[string]struct {
		q     url.Values
		frame []byte
	}{
		"bad resize json":  {tty, append([]byte{api.ChanResize}, []byte(`{"width":`)...)},
		"zero resize":      {tty, append([]byte{api.ChanResize}, []byte(`{"width":0,"height":0}`)...)},
		"unknown channel":  {tty, []byte{9, 1, 2}},
		"empty message":    {tty, []byte{}},
		"stdin not wanted": {plain, []byte{api.ChanStdin, 'x'}},
		"resize, no tty":   {plain, append([]byte{api.ChanResize}, []byte(`{"width":80,"height":24}`)...)},
	} {
		t.Run(name, func(t *testing.T) {
			c := dialExec(t, in, sb.ID, tc.q)
			frame := tc.frame
			c.WriteMessage(websocket.BinaryMessage, frame)
			f := readExit(t, c)
			if f.Error == nil || f.Error.Code != "invalid_frame" {
				t.Fatalf("exit frame %+v", f)
			}
		})
	}
	// The server is still fine.
	if out, _, code := cliExec(in, in.Token, "", sb.ID, "--", "echo", "ok"); code != 0 || out != "ok\n" {
		t.Fatalf("after bad frames: %d %q", code, out)
	}
}

func TestExecLimitsAndCancel(t *testing.T) {
	in := e2e.ServeInProcess(t, filepath.Join(t.TempDir(), "h.db"), e2e.NewNamespace(t), "--exec-per-sandbox", "1", "--exec-per-org", "2")
	a := in.Create(in.Token, "busybox", "--wait")
	b := in.Create(in.Token, "busybox", "--wait")
	c := in.Create(in.Token, "busybox", "--wait")
	hold := dialExec(t, in, a.ID, url.Values{"command": {"sleep", "30"}})
	status, body := in.Call(in.Token, "POST", "/v1/sandboxes/"+a.ID+"/exec/run", `{"command":["true"]}`)
	if status != 429 || errorCode(t, body) != "exec_limit" {
		t.Fatalf("second exec on a sandbox with limit 1: %d %s", status, body)
	}
	hold2 := dialExec(t, in, b.ID, url.Values{"command": {"sleep", "30"}})
	if status, body := in.Call(in.Token, "POST", "/v1/sandboxes/"+c.ID+"/exec/run", `{"command":["true"]}`); status != 429 {
		t.Fatalf("third exec in an org with limit 2: %d %s", status, body)
	}
	hold.Close()
	hold2.Close()
	eventually.Within(t, "slots released", 10*time.Second, func() (bool, error) {
		s, _ := in.Call(in.Token, "POST", "/v1/sandboxes/"+c.ID+"/exec/run", `{"command":["true"]}`)
		return s == 200, nil
	})

	// Ctrl-C without -t cancels the remote command: the session closes and
	// the command dies on its next write (the fake kubelet runs it as a
	// local process, so it can be looked for).
	marker := "marker-" + strconv.Itoa(os.Getpid())
	cmd := exec.Command(e2e.Binary(t), "sandbox", "exec", c.ID, "--", "yes", marker)
	cmd.Env = append(os.Environ(), "HILOOP_URL="+in.URL, "HILOOP_TOKEN="+in.Token)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	eventually.Within(t, "remote command started", 10*time.Second, func() (bool, error) { return len(processesRunning("yes\x00"+marker)) > 0, nil })
	cmd.Process.Signal(syscall.SIGINT)
	err := cmd.Wait()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 130 {
		t.Fatalf("Ctrl-C: %v, want exit 130", err)
	}
	eventually.Within(t, "remote command cancelled", 10*time.Second, func() (bool, error) { return len(processesRunning("yes\x00"+marker)) == 0, nil })
}

// processesRunning lists pids whose command line starts with s.
func processesRunning(s string) []string {
	var out []string
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		b, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if bytes.HasPrefix(b, []byte(s)) {
			out = append(out, e.Name())
		}
	}
	return out
}

// rssKB reads a process's resident set size.
func rssKB(t testing.TB, pid int) int {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "status"))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) >= 2 && f[0] == "VmRSS:" {
			n, _ := strconv.Atoi(f[1])
			return n
		}
	}
	t.Fatal("no VmRSS")
	return 0
}

// TestExecSlowReaderBoundedMemory: a client that stops reading while the
// command writes 400 MB does not make the server buffer it.
func TestExecSlowReaderBoundedMemory(t *testing.T) {
	in := e2e.Serve(t, filepath.Join(t.TempDir(), "h.db"), e2e.NewNamespace(t))
	sb := in.Create(in.Token, "busybox", "--wait")
	const total = 400 << 20
	before := rssKB(t, in.Cmd.Process.Pid)
	c := dialExec(t, in, sb.ID, url.Values{"command": {"sh", "-c", "head -c " + strconv.Itoa(total) + " /dev/zero"}})
	time.Sleep(3 * time.Second) // the command writes; nobody reads
	stalled := rssKB(t, in.Cmd.Process.Pid)
	var got int64
	c.SetReadDeadline(time.Now().Add(2 * time.Minute))
	for {
		_, b, err := c.ReadMessage()
		if err != nil {
			t.Fatalf("after %d bytes: %v", got, err)
		}
		if b[0] == api.ChanStdout {
			got += int64(len(b) - 1)
		}
		if b[0] == api.ChanExit {
			break
		}
	}
	if got != total {
		t.Fatalf("read %d bytes, want %d", got, total)
	}
	if grew := stalled - before; grew > 64<<10 {
		t.Fatalf("server RSS grew by %d KB while the reader stalled on a %d MB stream", grew, total>>20)
	}
}

// TestExecTTYInTerminal runs `hiloop sandbox exec -t` in a real terminal
// (tmux): the remote side sees the local window's size, and a resize of the
// window reaches it.
func TestExecTTYInTerminal(t *testing.T) {
	in := e2e.ServeInProcess(t, filepath.Join(t.TempDir(), "h.db"), e2e.NewNamespace(t))
	sb := in.Create(in.Token, "busybox", "--wait")
	shell := "HILOOP_URL=" + in.URL + " HILOOP_TOKEN=" + in.Token + " " + e2e.Binary(t) +
		" sandbox exec -t " + sb.ID + ` -- sh -c 'while :; do stty size; sleep 0.2; done'`
	// kwok's exec does not end a command whose stream closed.
	t.Cleanup(func() { e2e.KillExecProcs(t, regexp.MustCompile("while :; do stty size")) })
	term := e2e.Tmux(t, 100, 30, shell)
	eventually.Within(t, "remote sees 30 rows, 100 columns", 20*time.Second, func() (bool, error) {
		return strings.Contains(term.Screen(), "30 100"), nil
	})
	term.Resize(120, 40)
	eventually.Within(t, "remote sees the resize", 20*time.Second, func() (bool, error) {
		return strings.Contains(term.Screen(), "40 120"), nil
	})
}
