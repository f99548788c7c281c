package e2e_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/gorilla/websocket"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/hiloop/hiloop/api"
	"github.com/hiloop/hiloop/control"
	"github.com/hiloop/hiloop/internal/e2e"
	"github.com/hiloop/hiloop/k8s"
)

// hostileEnv are values a shell would read if it were given them: quotes,
// substitutions, globs, spaces, newlines, Unicode, a lone $ and $$.
var hostileEnv = map[string]string{
	"QUOTES":  `a "b" 'c' \d`,
	"SUBST":   "$(touch /tmp/hiloop-env-pwned) `touch /tmp/hiloop-env-pwned` ${HOME} $$ $",
	"KUBEREF": "$(QUOTES) $$(QUOTES)",
	"SPACES":  "  two  spaces  ",
	// Not LINES: busybox's stty size takes it over the terminal's own.
	"NEWLINES": "one\ntwo\n",
	"GLOB":     "* ? [a]",
	"UNICODE":  "h\u00e9llo \u4e16\u754c \U0001F600",
	"EMPTY":    "",
	"DASHES":   "--",
}

// envArgs are env as repeated --env flags.
func envArgs(env map[string]string) []string {
	var out []string
	for k, v := range env {
		out = append(out, "--env", k+"="+v)
	}
	return out
}

// environ parses `env -0`.
func environ(out string) map[string]string {
	got := map[string]string{}
	for _, kv := range strings.Split(strings.TrimSuffix(out, "\x00"), "\x00") {
		k, v, _ := strings.Cut(kv, "=")
		got[k] = v
	}
	return got
}

// checkEnv reports each variable of want whose value got does not hold
// exactly.
func checkEnv(t *testing.T, how string, got, want map[string]string) {
	t.Helper()
	for k, v := range want {
		if g, ok := got[k]; !ok || g != v {
			t.Errorf("%s: %s = %q (set %v), want %q", how, k, g, ok, v)
		}
	}
}

// TestExecEnvAndCwd: a create's env is in the Sandbox, the pod and every
// command; an exec's and a run's env and cwd reach the command exactly,
// through the API (run, the stream with its command in the URL or in its
// first message), the Go client and the CLI, with nothing of them read by
// a shell. Commands here run on this machine (kwok's exec), so the
// directories are this machine's.
func TestExecEnvAndCwd(t *testing.T) {
	in := e2e.Serve(t, filepath.Join(t.TempDir(), "h.db"), e2e.NewNamespace(t))
	os.Remove("/tmp/hiloop-env-pwned")
	sb := in.Create(in.Token, append([]string{"busybox", "--wait"}, envArgs(hostileEnv)...)...)

	// The record returns it exactly.
	status, body := in.Call(in.Token, "GET", "/v1/sandboxes/"+sb.ID, "")
	var got api.Sandbox
	if err := json.Unmarshal([]byte(body), &got); status != 200 || err != nil {
		t.Fatalf("get: %d %s", status, body)
	}
	if diff := cmp.Diff(hostileEnv, got.Env); diff != "" {
		t.Errorf("GET env (-want +got):\n%s", diff)
	}
	// The Sandbox and its pod carry it as plain values, escaped for the
	// kubelet's $(...) expansion.
	admin := quietAdmin(t)
	obj, err := admin.Sandbox.AgentsV1beta1().Sandboxes(in.NS).Get(t.Context(), k8s.ObjectName(sb.ID), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pod, err := admin.Kube.CoreV1().Pods(in.NS).Get(t.Context(), k8s.ObjectName(sb.ID), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for what, c := range map[string]corev1.Container{"Sandbox": obj.Spec.PodTemplate.Spec.Containers[0], "pod": pod.Spec.Containers[0]} {
		if len(c.Env) != len(hostileEnv) || c.EnvFrom != nil {
			t.Errorf("%s env: %+v envFrom %+v", what, c.Env, c.EnvFrom)
		}
		for _, e := range c.Env {
			if e.ValueFrom != nil || e.Value != strings.ReplaceAll(hostileEnv[e.Name], "$", "$$") {
				t.Errorf("%s env %s: %+v", what, e.Name, e)
			}
		}
	}

	// kwok runs a command on this machine, not in the pod, so a create's
	// env reaches commands only on a real node (TestRealNode); here an
	// exec's own does, and so does the directory, which is this
	// machine's.
	dir := t.TempDir()
	want := map[string]string{"OWN": "exec's own $(id)", "NEWLINES": "\n\n"}
	for k, v := range hostileEnv {
		want[k+"_X"] = v
	}
	execEnv := want

	t.Run("run", func(t *testing.T) {
		req, _ := json.Marshal(api.ExecRunRequest{Command: []string{"env", "-0"}, Env: execEnv, Cwd: dir})
		status, body := in.Call(in.Token, "POST", "/v1/sandboxes/"+sb.ID+"/exec/run", string(req))
		var run api.ExecRunResponse
		json.Unmarshal([]byte(body), &run)
		if status != 200 || run.ExitCode == nil || *run.ExitCode != 0 || run.Encoding != api.EncodingUTF8 {
			t.Fatalf("run: %d %s", status, body)
		}
		checkEnv(t, "run", environ(run.Stdout), want)
		if _, ok := environ(run.Stdout)["HILOOP_SETUP_ARG"]; ok {
			t.Error("the set-up script's variable reached the command")
		}
		req, _ = json.Marshal(api.ExecRunRequest{Command: []string{"pwd"}, Cwd: dir})
		status, body = in.Call(in.Token, "POST", "/v1/sandboxes/"+sb.ID+"/exec/run", string(req))
		json.Unmarshal([]byte(body), &run)
		if status != 200 || run.Stdout != dir+"\n" {
			t.Fatalf("pwd: %d %s", status, body)
		}
	})
	t.Run("the Go client", func(t *testing.T) {
		c := sdk(in, in.Token)
		run, err := c.Run(t.Context(), sb.ID, api.ExecRunRequest{Command: []string{"env", "-0"}, Env: execEnv, Cwd: dir})
		if err != nil || run.ExitCode == nil || *run.ExitCode != 0 {
			t.Fatalf("Run: %+v %v", run, err)
		}
		checkEnv(t, "Run", environ(run.Stdout), want)
		var out bytes.Buffer
		st, err := c.Exec(t.Context(), sb.ID, api.ExecOptions{Command: []string{"sh", "-c", "pwd && env -0"}, Env: execEnv, Cwd: dir, Stdout: &out})
		if err != nil || st.Code != 0 {
			t.Fatalf("Exec: %+v %v", st, err)
		}
		pwd, env, _ := strings.Cut(out.String(), "\n")
		if pwd != dir {
			t.Errorf("Exec's directory: %q", pwd)
		}
		checkEnv(t, "Exec", environ(env), want)
	})
	t.Run("the CLI", func(t *testing.T) {
		out, errOut, code := cliExec(in, in.Token, "", append(append(envArgs(execEnv), "--cwd", dir, sb.ID, "--"), "env", "-0")...)
		if code != 0 {
			t.Fatalf("exec: %d %q", code, errOut)
		}
		checkEnv(t, "CLI", environ(out), want)
		if out, errOut, code := cliExec(in, in.Token, "", "--cwd", dir, sb.ID, "--", "pwd"); code != 0 || out != dir+"\n" {
			t.Fatalf("pwd: %d %q %q", code, out, errOut)
		}
	})
	t.Run("the stream, command in the URL", func(t *testing.T) {
		q := url.Values{"command": {"env", "-0"}, "cwd": {dir}}
		for k, v := range execEnv {
			q.Add("env", k+"="+v)
		}
		c := dialExec(t, in, sb.ID, q)
		var out bytes.Buffer
		for {
			_, b, err := c.ReadMessage()
			if err != nil {
				t.Fatalf("no exit frame: %v", err)
			}
			if len(b) > 0 && b[0] == api.ChanStdout {
				out.Write(b[1:])
			}
			if len(b) > 0 && b[0] == api.ChanExit {
				var f api.ExitFrame
				if json.Unmarshal(b[1:], &f); f.ExitCode == nil || *f.ExitCode != 0 {
					t.Fatalf("exit frame %s", b[1:])
				}
				break
			}
		}
		checkEnv(t, "stream", environ(out.String()), want)
	})
	t.Run("the ready line forged by the command or a value", func(t *testing.T) {
		// The set-up's ready line is what hides it from the caller: a
		// command that prints it itself, or a value that holds it, is
		// output like any other, and cannot make a directory the
		// sandbox lacks look entered.
		forged := map[string]string{"V": "x\n" + "hiloop-exec-ready" + "\ny", "W": "\nhiloop-exec-ready\r\n"}
		script := `echo hiloop-exec-ready; printf %s "$V"`
		req, _ := json.Marshal(api.ExecRunRequest{Command: []string{"sh", "-c", script}, Env: forged, Cwd: dir})
		status, body := in.Call(in.Token, "POST", "/v1/sandboxes/"+sb.ID+"/exec/run", string(req))
		var run api.ExecRunResponse
		json.Unmarshal([]byte(body), &run)
		if status != 200 || run.ExitCode == nil || *run.ExitCode != 0 || run.Stdout != "hiloop-exec-ready\n"+forged["V"] {
			t.Errorf("run: %d %s", status, body)
		}
		req, _ = json.Marshal(api.ExecRunRequest{Command: []string{"sh", "-c", script}, Env: forged, Cwd: "/nonexistent/hiloop"})
		status, body = in.Call(in.Token, "POST", "/v1/sandboxes/"+sb.ID+"/exec/run", string(req))
		var e api.ErrorBody
		json.Unmarshal([]byte(body), &e)
		if status != 404 || e.Error.Code != api.CodeFileNotFound || e.Error.Field != "cwd" {
			t.Errorf("run in a missing directory: %d %s", status, body)
		}
		var out bytes.Buffer
		st, err := sdk(in, in.Token).Exec(t.Context(), sb.ID, api.ExecOptions{Command: []string{"sh", "-c", script}, Env: forged, Cwd: dir, Stdout: &out})
		if err != nil || st.Code != 0 || out.String() != "hiloop-exec-ready\n"+forged["V"] {
			t.Errorf("Exec: %+v %v %q", st, err, out.String())
		}
	})
	if _, err := os.Stat("/tmp/hiloop-env-pwned"); err == nil {
		t.Error("a value was run by a shell")
	}
}

// TestCreateEnvAtTheLimits: a create's env of the most variables and bytes
// the API takes, names that differ only in case, and values full of the
// kubelet's $(...) and $$, is admitted by the cluster's policy, rendered
// as plain values (every $ doubled, so the Sandbox holds nearly twice the
// bytes) and returned exactly.
func TestCreateEnvAtTheLimits(t *testing.T) {
	in := e2e.Serve(t, filepath.Join(t.TempDir(), "h.db"), e2e.NewNamespace(t))
	env := map[string]string{"PATH": "", "Path": ""}
	for i := range control.MaxEnvVars - 2 {
		env[fmt.Sprintf("V%02d", i)] = ""
	}
	room := control.MaxEnvBytes
	for k := range env {
		room -= len(k) + 2
	}
	i := 0
	for k := range env {
		n := room / control.MaxEnvVars
		if i == 0 {
			n += room % control.MaxEnvVars
		}
		env[k] = (strings.Repeat("$(PATH)$$", n/9+1) + "$")[:n]
		i++
	}
	if err := control.ValidateEnv("env", env); err != nil {
		t.Fatal(err)
	}
	req, _ := json.Marshal(api.CreateSandboxRequest{Image: "busybox", Env: env})
	status, body := in.Call(in.Token, "POST", "/v1/sandboxes", string(req))
	var sb api.Sandbox
	if err := json.Unmarshal([]byte(body), &sb); status != 201 || err != nil {
		t.Fatalf("create: %d %.300s", status, body)
	}
	in.WaitState(in.Token, sb.ID, "running")
	status, body = in.Call(in.Token, "GET", "/v1/sandboxes/"+sb.ID, "")
	var got api.Sandbox
	if err := json.Unmarshal([]byte(body), &got); status != 200 || err != nil {
		t.Fatalf("get: %d %.300s", status, body)
	}
	if diff := cmp.Diff(env, got.Env); diff != "" {
		t.Errorf("env (-want +got):\n%s", diff)
	}
	pod, err := quietAdmin(t).Kube.CoreV1().Pods(in.NS).Get(t.Context(), k8s.ObjectName(sb.ID), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if c := pod.Spec.Containers[0]; len(c.Env) != len(env) {
		t.Fatalf("the pod's env: %d variables", len(c.Env))
	}
	for _, e := range pod.Spec.Containers[0].Env {
		if e.ValueFrom != nil || e.Value != strings.ReplaceAll(env[e.Name], "$", "$$") {
			t.Errorf("the pod's %s: %.80q", e.Name, e.Value)
		}
	}
	// One byte more is refused, and nothing is made.
	env["PATH"] += "x"
	req, _ = json.Marshal(api.CreateSandboxRequest{Image: "busybox", Env: env})
	status, body = in.Call(in.Token, "POST", "/v1/sandboxes", string(req))
	var e api.ErrorBody
	if json.Unmarshal([]byte(body), &e); status != 400 || e.Error.Code != api.CodeInvalidEnv {
		t.Errorf("one byte more: %d %.300s", status, body)
	}
}

// TestExecEnvRefused: every bad env and cwd, of a create, a run and a
// stream, is refused with its code and field, and nothing is created or
// run; a directory the sandbox lacks, or one that is not a directory, is
// an error of its own, not an exit code; another organization's sandbox
// is not_found, as an absent one.
func TestExecEnvRefused(t *testing.T) {
	in := e2e.Serve(t, filepath.Join(t.TempDir(), "h.db"), e2e.NewNamespace(t))
	other := in.NewOrg("other", 10, 10)
	sb := in.Create(in.Token, "busybox", "--wait")
	marker := filepath.Join(t.TempDir(), "ran")
	bad := []struct {
		name  string
		env   string // JSON
		cwd   string // JSON
		code  string
		field string
	}{
		{"reserved name", `{"HILOOP_TOKEN":"x"}`, "", "invalid_env", "env"},
		{"reserved name in lower case", `{"hiloop_x":"x"}`, "", "invalid_env", "env"},
		{"name with a dash", `{"A-B":"x"}`, "", "invalid_env", "env"},
		{"name with =", `{"A=B":"x"}`, "", "invalid_env", "env"},
		{"leading digit", `{"1A":"x"}`, "", "invalid_env", "env"},
		{"empty name", `{"":"x"}`, "", "invalid_env", "env"},
		{"NUL in a value", `{"A":"x\u0000y"}`, "", "invalid_env", "env.A"},
		{"too many", `{` + func() string {
			var s []string
			for i := range 65 {
				s = append(s, `"V`+strings.Repeat("X", i)+`":""`)
			}
			return strings.Join(s, ",")
		}() + `}`, "", "invalid_env", "env"},
		{"too large", `{"A":"` + strings.Repeat("x", 32<<10) + `"}`, "", "invalid_env", "env"},
		{"not an object", `["A=1"]`, "", "invalid_field", "env"},
		{"relative cwd", "", `"tmp"`, "invalid_path", "cwd"},
		{"unclean cwd", "", `"/tmp/../etc"`, "invalid_path", "cwd"},
		{"cwd with a newline", "", `"/tmp\n"`, "invalid_path", "cwd"},
		{"cwd too long", "", `"/` + strings.Repeat("a", 4096) + `"`, "invalid_path", "cwd"},
	}
	body := func(field, env, cwd string) string {
		var parts []string
		if field != "" {
			parts = append(parts, field)
		}
		if env != "" {
			parts = append(parts, `"env":`+env)
		}
		if cwd != "" {
			parts = append(parts, `"cwd":`+cwd)
		}
		return "{" + strings.Join(parts, ",") + "}"
	}
	countSandboxes := func() int {
		_, list := in.Call(in.Token, "GET", "/v1/sandboxes", "")
		var l api.SandboxList
		json.Unmarshal([]byte(list), &l)
		return len(l.Items)
	}
	before := countSandboxes()
	for _, tc := range bad {
		t.Run(tc.name, func(t *testing.T) {
			check := func(how string, status int, body string) {
				t.Helper()
				var e api.ErrorBody
				json.Unmarshal([]byte(body), &e)
				if status != 400 || e.Error.Code != tc.code || e.Error.Field != tc.field {
					t.Errorf("%s: %d %.300s; want 400 %s naming %q", how, status, body, tc.code, tc.field)
				}
			}
			run := body(`"command":["touch",`+strconvQuote(marker)+`]`, tc.env, tc.cwd)
			status, resp := in.Call(in.Token, "POST", "/v1/sandboxes/"+sb.ID+"/exec/run", run)
			check("run", status, resp)
			if tc.env != "" {
				status, resp := in.Call(in.Token, "POST", "/v1/sandboxes", body(`"image":"busybox"`, tc.env, ""))
				check("create", status, resp)
			}
			// The stream reads its first message after the upgrade: the
			// refusal is its exit frame.
			c := dialExec(t, in, sb.ID, url.Values{})
			c.WriteMessage(websocket.TextMessage, []byte(body(`"command":["touch",`+strconvQuote(marker)+`]`, tc.env, tc.cwd)))
			f := readExit(t, c)
			wantCode := tc.code
			if tc.code == "invalid_field" {
				wantCode = "invalid_frame" // not a StartFrame at all
			}
			if f.Error == nil || f.Error.Code != wantCode {
				t.Errorf("stream: exit frame %+v, want %s", f, wantCode)
			}
		})
	}
	if n := countSandboxes(); n != before {
		t.Errorf("%d sandboxes after the refused creates, %d before", n, before)
	}
	if _, err := os.Stat(marker); err == nil {
		t.Error("a refused command ran")
	}
	// In the URL: the same refusals, before the upgrade (each with its
	// code: a request that is no WebSocket one is 400 too); env and cwd
	// only beside a command there.
	for _, tc := range []struct {
		q    url.Values
		code string
	}{
		{url.Values{"command": {"true"}, "env": {"HILOOP_X=1"}}, api.CodeInvalidEnv},
		{url.Values{"command": {"true"}, "env": {"NOEQUALS"}}, api.CodeInvalidEnv},
		{url.Values{"command": {"true"}, "env": {"A=1", "A=2"}}, api.CodeInvalidEnv},
		{url.Values{"command": {"true"}, "cwd": {"rel"}}, api.CodeInvalidPath},
		{url.Values{"command": {"true"}, "cwd": {"/a", "/b"}}, api.CodeInvalidPath},
		// Not UTF-8: the kubelet's runtime API would refuse it, and the
		// refusal would read as the cluster's failure.
		{url.Values{"command": {"true"}, "env": {"A=\xff"}}, api.CodeInvalidEnv},
		{url.Values{"command": {"true"}, "cwd": {"/tmp/\xff"}}, api.CodeInvalidPath},
		{url.Values{"command": {"echo", "\xe4\xb8"}}, api.CodeInvalidField},
		{url.Values{"env": {"A=1"}}, api.CodeInvalidField},
		{url.Values{"cwd": {"/tmp"}}, api.CodeInvalidField},
	} {
		status, body := in.Call(in.Token, "GET", "/v1/sandboxes/"+sb.ID+"/exec?"+tc.q.Encode(), "")
		var e api.ErrorBody
		if json.Unmarshal([]byte(body), &e); status != 400 || e.Error.Code != tc.code {
			t.Errorf("stream ?%s: %d %s, want 400 %s", tc.q.Encode(), status, body, tc.code)
		}
	}

	// Directories the sandbox (here, this machine) cannot enter.
	file := filepath.Join(t.TempDir(), "file")
	os.WriteFile(file, nil, 0o644)
	for _, tc := range []struct {
		cwd, code string
		status    int
	}{
		{"/nonexistent/hiloop", "file_not_found", 404},
		{file, "path_conflict", 409},
	} {
		req, _ := json.Marshal(api.ExecRunRequest{Command: []string{"touch", marker}, Cwd: tc.cwd})
		status, resp := in.Call(in.Token, "POST", "/v1/sandboxes/"+sb.ID+"/exec/run", string(req))
		var e api.ErrorBody
		json.Unmarshal([]byte(resp), &e)
		if status != tc.status || e.Error.Code != tc.code || e.Error.Field != "cwd" || !strings.Contains(e.Error.Message, tc.cwd) {
			t.Errorf("run in %s: %d %s", tc.cwd, status, resp)
		}
		_, errOut, code := cliExec(in, in.Token, "", "--cwd", tc.cwd, sb.ID, "--", "touch", marker)
		if code != 255 || !strings.Contains(errOut, tc.code) {
			t.Errorf("CLI in %s: exit %d %q", tc.cwd, code, errOut)
		}
	}
	if _, err := os.Stat(marker); err == nil {
		t.Error("a command ran in a directory it could not enter")
	}

	// Another organization: not_found, as for an absent sandbox.
	run := `{"command":["true"],"env":{"A":"1"},"cwd":"/tmp"}`
	fs, foreign := in.Call(other, "POST", "/v1/sandboxes/"+sb.ID+"/exec/run", run)
	as, absent := in.Call(other, "POST", "/v1/sandboxes/sbx_aaaaaaaaaaaaaaaa/exec/run", run)
	if fs != 404 || as != 404 || e2e.WithoutRequestID(foreign) != e2e.WithoutRequestID(absent) {
		t.Errorf("foreign %d %q, absent %d %q", fs, foreign, as, absent)
	}
	if _, errOut, code := cliExec(in, other, "", "--env", "A=1", "--cwd", "/tmp", sb.ID, "--", "true"); code != 255 || !strings.Contains(errOut, "not_found") {
		t.Errorf("CLI as another organization: %d %q", code, errOut)
	}
}

// TestRunOutputBinary: output that is not UTF-8 comes back byte for byte,
// in base64, both streams alike; UTF-8 output is text as before; output
// cut by the cap in the middle of a character stays text, cut back to the
// last whole one.
func TestRunOutputBinary(t *testing.T) {
	in := e2e.Serve(t, filepath.Join(t.TempDir(), "h.db"), e2e.NewNamespace(t))
	sb := in.Create(in.Token, "busybox", "--wait")
	var all bytes.Buffer
	for i := range 256 {
		all.WriteByte(byte(i))
	}
	src := filepath.Join(t.TempDir(), "bytes")
	if err := os.WriteFile(src, all.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	run := func(cmd ...string) api.ExecRunResponse {
		t.Helper()
		req, _ := json.Marshal(api.ExecRunRequest{Command: cmd})
		status, body := in.Call(in.Token, "POST", "/v1/sandboxes/"+sb.ID+"/exec/run", string(req))
		var r api.ExecRunResponse
		if err := json.Unmarshal([]byte(body), &r); status != 200 || err != nil || r.ExitCode == nil || *r.ExitCode != 0 {
			t.Fatalf("%v: %d %.300s", cmd, status, body)
		}
		return r
	}
	r := run("sh", "-c", `cat "$1"; echo caf`+"\u00e9"+` >&2`, "sh", src)
	if r.Encoding != api.EncodingBase64 {
		t.Fatalf("encoding %q", r.Encoding)
	}
	stdout, err1 := base64.StdEncoding.DecodeString(r.Stdout)
	stderr, err2 := base64.StdEncoding.DecodeString(r.Stderr)
	if err1 != nil || err2 != nil || !bytes.Equal(stdout, all.Bytes()) || string(stderr) != "caf\u00e9\n" {
		t.Fatalf("decoded %q %q (%v %v)", stdout, stderr, err1, err2)
	}
	// The Go client decodes it.
	got, err := sdk(in, in.Token).Run(context.Background(), sb.ID, api.ExecRunRequest{Command: []string{"cat", src}})
	if err != nil || got.Stdout != all.String() || got.Encoding != api.EncodingBase64 {
		t.Fatalf("Run: %q %q %v", got.Stdout, got.Encoding, err)
	}
	// UTF-8 stays text.
	if r := run("printf", "h\u00e9llo \u4e16\u754c"); r.Encoding != api.EncodingUTF8 || r.Stdout != "h\u00e9llo \u4e16\u754c" {
		t.Fatalf("UTF-8: %q %q", r.Encoding, r.Stdout)
	}
	// "é\n" is three bytes: the cap (a multiple of none of them) cuts
	// the last é in two.
	r = run("sh", "-c", "yes \u00e9 | head -c 3000000")
	if r.Encoding != api.EncodingUTF8 || !r.StdoutTruncated || len(r.Stdout) != api.MaxRunOutput-1 || !strings.HasSuffix(r.Stdout, "\u00e9\n") {
		t.Fatalf("cut output: %q truncated %v, %d bytes ending %q", r.Encoding, r.StdoutTruncated, len(r.Stdout), r.Stdout[len(r.Stdout)-4:])
	}
}

func strconvQuote(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}
