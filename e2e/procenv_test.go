package e2e_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/hiloop/hiloop/api"
	"github.com/hiloop/hiloop/internal/e2e"
)

// testProcessEnvCwd: a process started with env and cwd (through the API,
// the Go SDK and the CLI) runs in that directory with those variables,
// exactly as given: quotes, $(...), spaces and newlines reach it as
// bytes, and a variable named like one of the scripts' changes nothing.
// A bad env or cwd is refused with its code before anything is recorded;
// a cwd the sandbox lacks or that is a file is refused with its code, and
// the process is recorded ended start_failed.
func testProcessEnvCwd(t *testing.T, in *e2e.Instance) {
	sb := in.Create(in.Token, "busybox", "--wait")
	reapProcesses(t, in, in.Token, sb.ID)
	base := "/v1/sandboxes/" + sb.ID + "/processes"
	// kwok runs the pod's commands on this machine: the directory is here.
	dir := filepath.Join(t.TempDir(), `it's "a" $(dir) `+"`x`")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{
		"A": `it's "quoted" $(echo no) ` + "`echo no`" + ` ${HOME} \n`,
		"B": "two\nlines ; exit 3 ",
		"d": "/nonexistent", "p": "1", "IFS": "x",
	}
	show := []string{"sh", "-c", `pwd; printf '%s|' "$A" "$B" "$d" "$p"`}
	want := dir + "\n" + env["A"] + "|" + env["B"] + "|/nonexistent|1|"
	client := &api.Client{URL: in.URL, Token: in.Token}
	ctx := context.Background()
	followed := func(t *testing.T, pid string) {
		t.Helper()
		stdout, stderr, code := in.CLI(in.Token, "sandbox", "process", "logs", "-f", sb.ID, pid)
		if code != 0 || stdout != want {
			t.Fatalf("output %q (exit %d, %s); want %q", stdout, code, stderr, want)
		}
	}

	t.Run("the API", func(t *testing.T) {
		b, _ := json.Marshal(api.StartProcessRequest{Command: show, Env: env, Cwd: dir})
		status, body := in.Call(in.Token, "POST", base, string(b))
		var p api.Process
		if status != http.StatusCreated || json.Unmarshal([]byte(body), &p) != nil {
			t.Fatalf("start: %d %s", status, body)
		}
		followed(t, p.ID)
	})
	t.Run("the Go SDK", func(t *testing.T) {
		p, err := client.StartProcessWith(ctx, sb.ID, api.StartProcessRequest{Command: show, Env: env, Cwd: dir})
		if err != nil {
			t.Fatal(err)
		}
		followed(t, p.ID)
	})
	t.Run("the CLI", func(t *testing.T) {
		args := []string{"sandbox", "process", "start", "-o", "json", "--cwd", dir}
		for k, v := range env {
			args = append(args, "--env", k+"="+v)
		}
		out := in.MustCLI(in.Token, append(append(args, sb.ID, "--"), show...)...)
		var p api.Process
		if err := json.Unmarshal([]byte(out), &p); err != nil {
			t.Fatalf("start: %q", out)
		}
		followed(t, p.ID)
	})

	file := filepath.Join(t.TempDir(), "f")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	marker := filepath.Join(t.TempDir(), "ran")
	for _, c := range []struct {
		name, body  string
		status      int
		code, field string
		recorded    bool
	}{
		{"missing cwd", `{"command":["touch",` + q(marker) + `],"cwd":` + q(filepath.Join(dir, "missing")) + `}`, 404, api.CodeFileNotFound, "cwd", true},
		{"cwd a file", `{"command":["touch",` + q(marker) + `],"cwd":` + q(file) + `}`, 409, api.CodePathConflict, "cwd", true},
		{"relative cwd", `{"command":["true"],"cwd":"tmp"}`, 400, api.CodeInvalidPath, "cwd", false},
		{"unclean cwd", `{"command":["true"],"cwd":"/tmp/../etc"}`, 400, api.CodeInvalidPath, "cwd", false},
		{"reserved name", `{"command":["true"],"env":{"HILOOP_X":"1"}}`, 400, api.CodeInvalidEnv, "env", false},
		{"bad name", `{"command":["true"],"env":{"A=B":"1"}}`, 400, api.CodeInvalidEnv, "env", false},
		{"NUL in a value", `{"command":["true"],"env":{"A":"a\u0000b"}}`, 400, api.CodeInvalidEnv, "env.A", false},
	} {
		t.Run(c.name, func(t *testing.T) {
			before := processCount(t, in, base)
			status, body := in.Call(in.Token, "POST", base, c.body)
			var e struct{ Error api.ErrorDetail }
			json.Unmarshal([]byte(body), &e)
			if status != c.status || e.Error.Code != c.code || e.Error.Field != c.field {
				t.Fatalf("%d %s; want %d %s field %s", status, body, c.status, c.code, c.field)
			}
			if c.recorded {
				l := processList(t, in, base)
				if len(l) != before+1 || l[0].State != api.ProcessEnded || l[0].Reason != api.EndStartFailed {
					t.Fatalf("newest record %+v; want ended start_failed", l[0])
				}
			} else if n := processCount(t, in, base); n != before {
				t.Fatalf("%d records after a refused start; want %d", n, before)
			}
		})
	}
	if _, err := os.Stat(marker); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a command whose cwd was refused ran: %v", err)
	}
	t.Run("the Go SDK's and the CLI's errors", func(t *testing.T) {
		_, err := client.StartProcessWith(ctx, sb.ID, api.StartProcessRequest{Command: []string{"true"}, Cwd: filepath.Join(dir, "missing")})
		var ae *api.Error
		if !errors.As(err, &ae) || ae.Code != api.CodeFileNotFound || ae.Field != "cwd" {
			t.Errorf("Go SDK: %v; want file_not_found", err)
		}
		_, stderr, code := in.CLI(in.Token, "sandbox", "process", "start", "--env", "NOEQUALS", sb.ID, "--", "true")
		if code == 0 || !strings.Contains(stderr, "--env") {
			t.Errorf("CLI --env without =: exit %d, %s", code, stderr)
		}
	})
}

// q is s as a JSON string.
func q(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

// processList is a sandbox's processes, newest first.
func processList(t *testing.T, in *e2e.Instance, base string) []api.Process {
	t.Helper()
	status, body := in.Call(in.Token, "GET", base, "")
	var l api.ProcessList
	if status != 200 || json.Unmarshal([]byte(body), &l) != nil {
		t.Fatalf("list: %d %s", status, body)
	}
	return l.Items
}

func processCount(t *testing.T, in *e2e.Instance, base string) int {
	t.Helper()
	return len(processList(t, in, base))
}
