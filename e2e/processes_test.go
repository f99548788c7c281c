package e2e_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hiloop/hiloop/api"
	"github.com/hiloop/hiloop/internal/e2e"
	"github.com/hiloop/hiloop/internal/eventually"
)

// procRoot is where a process keeps its state in its sandbox: on this
// machine, where kwok runs a pod's commands.
const procRoot = "/tmp/.hiloop/proc"

// reapProcesses kills, at the end of the test, what is left on this
// machine of the processes of sandbox id: kwok runs a pod's commands here
// and kills none of them when the pod goes, as a real node does.
func reapProcesses(t testing.TB, in *e2e.Instance, token, id string) {
	t.Cleanup(func() {
		status, body := in.Call(token, "GET", "/v1/sandboxes/"+id+"/processes", "")
		var l api.ProcessList
		if status != 200 || json.Unmarshal([]byte(body), &l) != nil {
			return
		}
		for _, p := range l.Items {
			d := filepath.Join(procRoot, p.ID)
			for _, f := range []string{"pid", "keeper", "sup"} {
				b, err := os.ReadFile(filepath.Join(d, f))
				pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
				if err != nil || pid <= 1 {
					continue
				}
				if f == "pid" {
					pid = -pid
				}
				syscall.Kill(pid, syscall.SIGKILL)
			}
			os.RemoveAll(d)
		}
	})
}

// startProc starts a background process through the API.
func startProc(t *testing.T, in *e2e.Instance, token, id string, command ...string) api.Process {
	t.Helper()
	b, _ := json.Marshal(api.StartProcessRequest{Command: command})
	status, body := in.Call(token, "POST", "/v1/sandboxes/"+id+"/processes", string(b))
	var p api.Process
	if status != http.StatusCreated || json.Unmarshal([]byte(body), &p) != nil {
		t.Fatalf("start %q: %d %s", command, status, body)
	}
	return p
}

// getProc reads a process through the API.
func getProc(t *testing.T, in *e2e.Instance, token, id, pid string) api.Process {
	t.Helper()
	status, body := in.Call(token, "GET", "/v1/sandboxes/"+id+"/processes/"+pid, "")
	var p api.Process
	if status != 200 || json.Unmarshal([]byte(body), &p) != nil {
		t.Fatalf("get %s: %d %s", pid, status, body)
	}
	return p
}

// output reads a process's output as a plain HTTP client does, and says
// whether the body ended whole.
func output(t *testing.T, in *e2e.Instance, token, id, pid, query string) (status int, h http.Header, body string, whole bool) {
	t.Helper()
	req, _ := http.NewRequest("GET", in.URL+"/v1/sandboxes/"+id+"/processes/"+pid+"/output?"+query, nil)
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, string(b), err == nil
}

// TestProcesses: a process started in the background outlives the call,
// is listed, takes stdin, and its output is read from any offset and
// followed to its end, after which it has its exact exit code; a signal
// and a kill end it, and what it is then is reported; its output past
// what the sandbox keeps is output_gone; bad input gets its codes; the
// Go SDK and the CLI do the same; another organization finds none of it;
// a stop of the sandbox ends every process, reported so; env and cwd
// reach a process exactly (testProcessEnvCwd).
func TestProcesses(t *testing.T) {
	in := e2e.Serve(t, filepath.Join(t.TempDir(), "h.db"), e2e.NewNamespace(t))
	t.Run("env and cwd", func(t *testing.T) { testProcessEnvCwd(t, in) })
	sb := in.Create(in.Token, "busybox", "--wait")
	reapProcesses(t, in, in.Token, sb.ID)
	base := "/v1/sandboxes/" + sb.ID + "/processes"

	p := startProc(t, in, in.Token, sb.ID, "sh", "-c", `echo started; read l; echo "got $l" >&2; exec sleep 300`)
	if p.State != api.ProcessRunning || !strings.HasPrefix(p.ID, "proc_") || p.SandboxID != sb.ID {
		t.Fatalf("started %+v", p)
	}
	t.Run("listed", func(t *testing.T) {
		status, body := in.Call(in.Token, "GET", base, "")
		var l api.ProcessList
		json.Unmarshal([]byte(body), &l)
		if status != 200 || len(l.Items) != 1 || l.Items[0].ID != p.ID || l.Items[0].State != api.ProcessRunning {
			t.Fatalf("list: %d %s", status, body)
		}
	})
	t.Run("stdin and output from any offset", func(t *testing.T) {
		status, body := in.Call(in.Token, "POST", base+"/"+p.ID+"/stdin", "hello\n", "Content-Type", "application/octet-stream")
		if status != http.StatusNoContent {
			t.Fatalf("stdin: %d %s", status, body)
		}
		eventually.Within(t, "the output", 30*time.Second, func() (bool, error) {
			status, h, body, whole := output(t, in, in.Token, sb.ID, p.ID, "offset=0")
			return status == 200 && whole && body == "started\ngot hello\n" && h.Get(api.OutputOffsetHeader) == "0",
				fmt.Errorf("%d %q whole=%v", status, body, whole)
		})
		status, h, body, whole := output(t, in, in.Token, sb.ID, p.ID, "offset=8")
		if status != 200 || !whole || body != "got hello\n" || h.Get(api.OutputOffsetHeader) != "8" {
			t.Fatalf("from offset 8: %d %q %v", status, body, h)
		}
		if got := getProc(t, in, in.Token, sb.ID, p.ID); got.OutputBytes == nil || *got.OutputBytes != 18 || got.State != api.ProcessRunning {
			t.Fatalf("process %+v; want running with 18 bytes of output", got)
		}
	})
	t.Run("TERM ends it, and the follow ends with its exit", func(t *testing.T) {
		status, body := in.Call(in.Token, "POST", base+"/"+p.ID+"/signal", `{"signal":"TERM"}`)
		if status != 200 {
			t.Fatalf("signal: %d %s", status, body)
		}
		status, _, out, whole := output(t, in, in.Token, sb.ID, p.ID, "offset=0&follow=true")
		if status != 200 || !whole || out != "started\ngot hello\n" {
			t.Fatalf("follow: %d %q whole=%v", status, out, whole)
		}
		if got := getProc(t, in, in.Token, sb.ID, p.ID); got.State != api.ProcessExited || got.ExitCode == nil || *got.ExitCode != 143 || got.EndedAt == nil {
			t.Fatalf("after TERM: %+v; want exited 143", got)
		}
		for _, c := range []struct{ method, path, body string }{
			{"POST", "/signal", `{"signal":"TERM"}`}, {"POST", "/stdin", "x"}, {"DELETE", "", ""}} {
			if status, body := in.Call(in.Token, c.method, base+"/"+p.ID+c.path, c.body); status != 409 || errorCode(t, body) != api.CodeProcessNotRunning {
				t.Errorf("%s %s after the exit: %d %s", c.method, c.path, status, body)
			}
		}
	})
	t.Run("the exact exit code, through the Go SDK", func(t *testing.T) {
		client := &api.Client{URL: in.URL, Token: in.Token}
		ctx := context.Background()
		q, err := client.StartProcess(ctx, sb.ID, []string{"sh", "-c", "echo seven; exit 7"})
		if err != nil {
			t.Fatal(err)
		}
		out, err := client.ProcessOutput(ctx, sb.ID, q.ID, 0, true)
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(out)
		out.Close()
		if err != nil || string(b) != "seven\n" || out.Offset != 6 {
			t.Fatalf("follow: %q %v, offset %d", b, err, out.Offset)
		}
		done, err := client.WaitProcess(ctx, sb.ID, q.ID)
		if err != nil || done.State != api.ProcessExited || *done.ExitCode != 7 {
			t.Fatalf("wait: %+v %v; want exited 7", done, err)
		}
	})
	t.Run("kill", func(t *testing.T) {
		q := startProc(t, in, in.Token, sb.ID, "sleep", "300")
		if status, body := in.Call(in.Token, "DELETE", base+"/"+q.ID, ""); status != 200 {
			t.Fatalf("kill: %d %s", status, body)
		}
		if status, _, _, whole := output(t, in, in.Token, sb.ID, q.ID, "follow=true"); status != 200 || !whole {
			t.Fatalf("follow after kill: %d whole=%v", status, whole)
		}
		if got := getProc(t, in, in.Token, sb.ID, q.ID); got.State != api.ProcessExited || *got.ExitCode != 137 {
			t.Fatalf("after kill: %+v; want exited 137", got)
		}
	})
	t.Run("output past what is kept is gone", func(t *testing.T) {
		const total = 7_000_000
		q := startProc(t, in, in.Token, sb.ID, "head", "-c", strconv.Itoa(total), "/dev/zero")
		status, _, out, whole := output(t, in, in.Token, sb.ID, q.ID, "follow=true&offset="+strconv.Itoa(total-100))
		if status != 200 || !whole || len(out) != 100 {
			t.Fatalf("the last 100 bytes: %d, %d bytes, whole=%v", status, len(out), whole)
		}
		if status, _, body, _ := output(t, in, in.Token, sb.ID, q.ID, "offset=0"); status != http.StatusGone || errorCode(t, body) != api.CodeOutputGone {
			t.Fatalf("offset 0 of 7 MB: %d %s", status, body)
		}
	})
	t.Run("the CLI", func(t *testing.T) {
		out := in.MustCLI(in.Token, "sandbox", "process", "start", "-o", "json", sb.ID, "--", "sh", "-c", "echo from the cli; exit 5")
		var q api.Process
		if err := json.Unmarshal([]byte(out), &q); err != nil {
			t.Fatalf("start: %q", out)
		}
		if stdout, stderr, code := in.CLI(in.Token, "sandbox", "process", "logs", "-f", sb.ID, q.ID); code != 5 || stdout != "from the cli\n" {
			t.Fatalf("logs -f: %d %q %q", code, stdout, stderr)
		}
		r := in.MustCLI(in.Token, "sandbox", "process", "start", "-o", "json", sb.ID, "--", "cat")
		json.Unmarshal([]byte(r), &q)
		if stdout, stderr, code := in.CLIInput(in.Token, "typed\n", "sandbox", "process", "stdin", "--close", sb.ID, q.ID); code != 0 {
			t.Fatalf("stdin: %d %q %q", code, stdout, stderr)
		}
		if stdout, stderr, code := in.CLI(in.Token, "sandbox", "process", "logs", "-f", sb.ID, q.ID); code != 0 || stdout != "typed\n" {
			t.Fatalf("logs -f of cat: %d %q %q", code, stdout, stderr)
		}
		r = in.MustCLI(in.Token, "sandbox", "process", "start", "-o", "json", sb.ID, "--", "sleep", "300")
		json.Unmarshal([]byte(r), &q)
		in.MustCLI(in.Token, "sandbox", "process", "kill", "-s", "TERM", sb.ID, q.ID)
		if _, _, code := in.CLI(in.Token, "sandbox", "process", "logs", "-f", sb.ID, q.ID); code != 143 {
			t.Fatalf("logs -f after kill -s TERM: exit %d", code)
		}
		if list := in.MustCLI(in.Token, "sandbox", "process", "list", sb.ID); !strings.Contains(list, q.ID) || !strings.Contains(list, "exited") {
			t.Fatalf("list:\n%s", list)
		}
	})
	t.Run("bad input", func(t *testing.T) {
		big := strings.Repeat("x", api.MaxProcessStdin+1)
		for _, c := range []struct {
			method, path, body string
			status             int
			code               string
		}{
			{"POST", base, `{"command":[]}`, 400, api.CodeInvalidField},
			{"POST", base, `{"command":["sh"],"nope":1}`, 400, api.CodeUnknownField},
			{"POST", base + "?nope=1", `{"command":["sh"]}`, 400, api.CodeUnknownField},
			{"POST", base + "/" + p.ID + "/signal", `{"signal":"SEGV"}`, 400, api.CodeInvalidField},
			{"GET", base + "/" + p.ID + "/output?offset=-1", "", 400, api.CodeInvalidField},
			{"GET", base + "/" + p.ID + "/output?follow=maybe", "", 400, api.CodeInvalidField},
			{"POST", base + "/" + p.ID + "/stdin", big, 413, api.CodeBodyTooLarge},
			{"GET", base + "/proc_nosuchprocess", "", 404, api.CodeNotFound},
			{"DELETE", base + "/proc_nosuchprocess", "", 404, api.CodeNotFound},
		} {
			if status, body := in.Call(in.Token, c.method, c.path, c.body); status != c.status || errorCode(t, body) != c.code {
				t.Errorf("%s %s %.40q: %d %s; want %d %s", c.method, c.path, c.body, status, body, c.status, c.code)
			}
		}
	})
	t.Run("another organization finds nothing", func(t *testing.T) {
		other := in.NewOrg("other", 5, 5)
		pp := base + "/" + p.ID
		for _, c := range []struct{ method, path, body string }{
			{"POST", base, `{"command":["true"]}`}, {"GET", base, ""}, {"GET", pp, ""}, {"DELETE", pp, ""},
			{"GET", pp + "/output", ""}, {"POST", pp + "/stdin", "x"}, {"POST", pp + "/signal", `{"signal":"KILL"}`}} {
			if status, body := in.Call(other, c.method, c.path, c.body); status != 404 || errorCode(t, body) != api.CodeNotFound || strings.Contains(body, p.ID) {
				t.Errorf("%s %s by another organization: %d %s", c.method, c.path, status, body)
			}
		}
	})
	t.Run("at most 32 running", func(t *testing.T) {
		running := 0
		status, body := in.Call(in.Token, "GET", base, "")
		var l api.ProcessList
		if status != 200 || json.Unmarshal([]byte(body), &l) != nil {
			t.Fatalf("list: %d %s", status, body)
		}
		for _, q := range l.Items {
			if q.State == api.ProcessRunning {
				running++
			}
		}
		for range 32 - running {
			startProc(t, in, in.Token, sb.ID, "sleep", "300")
		}
		if status, body := in.Call(in.Token, "POST", base, `{"command":["sleep","300"]}`); status != 429 || errorCode(t, body) != api.CodeProcessLimit {
			t.Fatalf("the 33rd: %d %s", status, body)
		}
	})
	t.Run("a stop ends every process", func(t *testing.T) {
		if status, body := in.Call(in.Token, "POST", "/v1/sandboxes/"+sb.ID+"/stop", ""); status != 200 {
			t.Fatalf("stop: %d %s", status, body)
		}
		eventually.Within(t, "no process running", 60*time.Second, func() (bool, error) {
			status, body := in.Call(in.Token, "GET", base, "")
			var l api.ProcessList
			json.Unmarshal([]byte(body), &l)
			for _, q := range l.Items {
				if q.State == api.ProcessRunning {
					return false, fmt.Errorf("%d: %s is running", status, q.ID)
				}
			}
			return status == 200, fmt.Errorf("%d %s", status, body)
		})
		got := getProc(t, in, in.Token, sb.ID, p.ID)
		if got.State != api.ProcessExited {
			t.Errorf("a process that exited before the stop: %+v", got)
		}
		status, body := in.Call(in.Token, "GET", base, "")
		var l api.ProcessList
		json.Unmarshal([]byte(body), &l)
		ended := 0
		for _, q := range l.Items {
			if q.State == api.ProcessEnded {
				if q.Reason != api.EndSandboxStopped || q.ExitCode != nil {
					t.Errorf("%s: %+v; want ended, sandbox_stopped", q.ID, q)
				}
				ended++
			}
		}
		if ended != 32 {
			t.Errorf("%d processes ended with the stop; want 32 (%d %s)", ended, status, body)
		}
		var q api.Process
		for _, q = range l.Items {
			if q.State == api.ProcessEnded {
				break
			}
		}
		if status, _, body, _ := output(t, in, in.Token, sb.ID, q.ID, "offset=0"); status != http.StatusGone || errorCode(t, body) != api.CodeOutputGone {
			t.Errorf("output of an ended process: %d %s", status, body)
		}
		if status, body := in.Call(in.Token, "DELETE", base+"/"+q.ID, ""); status != 409 || errorCode(t, body) != api.CodeProcessNotRunning {
			t.Errorf("kill of an ended process: %d %s", status, body)
		}
	})
}

// TestProcessesAreNoUse: a running process does not keep its sandbox in
// use: a sandbox whose process nobody reads stops for idleness, and the
// process ends with it.
func TestProcessesAreNoUse(t *testing.T) {
	in := e2e.Serve(t, filepath.Join(t.TempDir(), "h.db"), e2e.NewNamespace(t))
	sb := in.Create(in.Token, "busybox", "--idle-timeout", "3s", "--wait")
	reapProcesses(t, in, in.Token, sb.ID)
	p := startProc(t, in, in.Token, sb.ID, "sleep", "300")
	waitIdleStopped(t, in, in.Token, sb.ID)
	eventually.Within(t, "the process ended", 30*time.Second, func() (bool, error) {
		got := getProc(t, in, in.Token, sb.ID, p.ID)
		return got.State == api.ProcessEnded && got.Reason == api.EndSandboxStopped, fmt.Errorf("%+v", got)
	})
}
