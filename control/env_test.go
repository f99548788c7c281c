package control

import (
	"bytes"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/hiloop/hiloop/api"
	"github.com/hiloop/hiloop/cluster"
)

// TestValidateEnvAndCwd holds the one validation of an environment and a
// working directory to its table: every refusal names its field and wraps
// its sentinel (ErrInvalidEnv, ErrInvalidPath), both ErrInvalid.
func TestValidateEnvAndCwd(t *testing.T) {
	many := map[string]string{}
	for i := range MaxEnvVars + 1 {
		many["V"+strings.Repeat("X", i)] = ""
	}
	for _, tc := range []struct {
		name  string
		env   map[string]string
		cwd   string
		field string // "" when valid
		kind  error
	}{
		{name: "nothing"},
		{name: "plain", env: map[string]string{"A": "1", "_b9": "", "PATH": "/bin"}, cwd: "/tmp"},
		{name: "values are any UTF-8 but NUL", env: map[string]string{"V": "$(rm -rf /) `id` \"'\n\t\u00e9\U0001F600\x7f\x1b"}},
		{name: "root", cwd: "/"},
		{name: "the most variables", env: func() map[string]string {
			m := map[string]string{}
			for i := range MaxEnvVars {
				m["V"+strings.Repeat("X", i)] = ""
			}
			return m
		}()},
		{name: "exactly the most bytes", env: map[string]string{"V": strings.Repeat("x", MaxEnvBytes-3)}},
		{name: "one byte more", env: map[string]string{"V": strings.Repeat("x", MaxEnvBytes-2)}, field: "env", kind: ErrInvalidEnv},
		{name: "too many", env: many, field: "env", kind: ErrInvalidEnv},
		{name: "empty name", env: map[string]string{"": "x"}, field: "env", kind: ErrInvalidEnv},
		{name: "leading digit", env: map[string]string{"1A": "x"}, field: "env", kind: ErrInvalidEnv},
		{name: "dash", env: map[string]string{"A-B": "x"}, field: "env", kind: ErrInvalidEnv},
		{name: "equals", env: map[string]string{"A=B": "x"}, field: "env", kind: ErrInvalidEnv},
		{name: "space", env: map[string]string{"A B": "x"}, field: "env", kind: ErrInvalidEnv},
		{name: "unicode", env: map[string]string{"\u00c9T\u00c9": "x"}, field: "env", kind: ErrInvalidEnv},
		{name: "reserved", env: map[string]string{"HILOOP_X": "x"}, field: "env", kind: ErrInvalidEnv},
		{name: "reserved in any case", env: map[string]string{"hiLoop_x": "x"}, field: "env", kind: ErrInvalidEnv},
		{name: "the prefix alone", env: map[string]string{"HILOOP_": "x"}, field: "env", kind: ErrInvalidEnv},
		{name: "NUL in a value", env: map[string]string{"A": "x\x00y"}, field: "env.A", kind: ErrInvalidEnv},
		// The kubelet's runtime API carries a command's arguments as
		// protobuf strings, which must be UTF-8: such a value could only
		// fail in the cluster.
		{name: "a value not UTF-8", env: map[string]string{"A": "x\xffy"}, field: "env.A", kind: ErrInvalidEnv},
		{name: "a value with half a character", env: map[string]string{"A": "\xe4\xb8"}, field: "env.A", kind: ErrInvalidEnv},
		{name: "cwd not UTF-8", cwd: "/tmp/\xff", field: "cwd", kind: ErrInvalidPath},
		{name: "relative", cwd: "tmp", field: "cwd", kind: ErrInvalidPath},
		{name: "dot", cwd: "/tmp/.", field: "cwd", kind: ErrInvalidPath},
		{name: "dot dot", cwd: "/tmp/../etc", field: "cwd", kind: ErrInvalidPath},
		{name: "trailing slash", cwd: "/tmp/", field: "cwd", kind: ErrInvalidPath},
		{name: "double slash", cwd: "//tmp", field: "cwd", kind: ErrInvalidPath},
		{name: "NUL", cwd: "/tmp\x00", field: "cwd", kind: ErrInvalidPath},
		{name: "newline", cwd: "/tmp\n", field: "cwd", kind: ErrInvalidPath},
		{name: "DEL", cwd: "/tmp\x7f", field: "cwd", kind: ErrInvalidPath},
		{name: "too long", cwd: "/" + strings.Repeat("a", api.MaxPathBytes), field: "cwd", kind: ErrInvalidPath},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := ValidateExecSetup(tc.env, tc.cwd)
			if tc.field == "" {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			var fe *FieldError
			if !errors.As(err, &fe) || fe.Field != tc.field || !errors.Is(err, tc.kind) || !errors.Is(err, ErrInvalid) {
				t.Fatalf("got %v, want a %v naming %s", err, tc.kind, tc.field)
			}
		})
	}
	// Create takes the same environment validation.
	if _, err := NewCreateRequest(api.CreateSandboxRequest{Image: "busybox", Env: map[string]string{"HILOOP_X": "1"}}, ""); !errors.Is(err, ErrInvalidEnv) {
		t.Errorf("create with a reserved name: %v", err)
	}
	cr, err := NewCreateRequest(api.CreateSandboxRequest{Image: "busybox", Env: map[string]string{"A": "1"}}, "")
	if err != nil || cr.Spec.Env["A"] != "1" {
		t.Errorf("create with env: %+v %v", cr.Spec.Env, err)
	}
}

// TestSetupStdout: the ready line never reaches the caller, however the
// output is cut into writes and whatever line end a terminal gives it;
// what follows it does, byte for byte; what came before it is kept for
// the error.
func TestSetupStdout(t *testing.T) {
	for _, tc := range []struct {
		name   string
		writes []string
		want   string
		ready  bool
		said   string
	}{
		{"alone", []string{setupReady + "\n"}, "", true, ""},
		{"with output", []string{setupReady + "\nhello\n"}, "hello\n", true, ""},
		{"byte by byte", strings.Split(setupReady+"\nab", ""), "ab", true, ""},
		{"a terminal's line end", []string{setupReady + "\r\n", "x"}, "x", true, ""},
		{"after other lines", []string{"noise\n", "more\n", setupReady + "\nz"}, "z", true, ""},
		{"after a terminal's echo of what was typed ahead", []string{"typed", " ahead" + setupReady[:4], setupReady[4:] + "\r\nz"}, "z", true, ""},
		{"a longer line", []string{setupReady + "x\n"}, "", false, setupReady + "x\n"},
		{"never ready", []string{"sh: export: PPID: is read only"}, "", false, "sh: export: PPID: is read only"},
		{"the ready line twice passes the second", []string{setupReady + "\n" + setupReady + "\n"}, setupReady + "\n", true, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out, errOut bytes.Buffer
			req, s := withSetup(cluster.ExecRequest{Command: []string{"true"}, Cwd: "/", Stdout: &out, Stderr: &errOut})
			for _, w := range tc.writes {
				if n, err := req.Stdout.Write([]byte(w)); n != len(w) || err != nil {
					t.Fatalf("write %q: %d %v", w, n, err)
				}
			}
			if got := out.String(); got != tc.want || s.ready.Load() != tc.ready || (!tc.ready && string(s.said) != tc.said) {
				t.Fatalf("passed %q ready %v kept %q; want %q %v %q", got, s.ready.Load(), s.said, tc.want, tc.ready, tc.said)
			}
		})
	}
}

// TestSetupScript runs the set-up script through every POSIX sh on this
// machine (dash or bash as sh, busybox's): the command gets exactly the
// environment and directory asked for, with nothing of them read by the
// shell, and a directory it cannot enter is an exit status of the script
// before any ready line.
func TestSetupScript(t *testing.T) {
	shells := map[string][]string{}
	for name, argv := range map[string][]string{"sh": {"sh"}, "bash": {"bash", "--posix"}, "busybox": {"busybox", "sh"}} {
		if _, err := exec.LookPath(argv[0]); err == nil {
			shells[name] = argv
		}
	}
	// The local cluster's busybox, which its images run.
	if b := os.Getenv("HILOOP_CLUSTER_BIN"); b != "" {
		shells["cluster busybox"] = []string{filepath.Join(b, "busybox"), "sh"}
	}
	if len(shells) == 0 {
		t.Skip("no sh on this machine")
	}
	env := map[string]string{
		"QUOTES": `a "b" 'c' \d`, "SUBST": "$(touch /tmp/hiloop-pwned) `id` ${HOME}", "SPACES": "  two  spaces ",
		"LINES": "one\ntwo\n", "UNICODE": "h\u00e9llo \u4e16\u754c", "EMPTY": "", "DASHES": "--", "IFS": "x",
		"n": "clobber", "PATH": "/usr/bin:/bin",
	}
	dir := t.TempDir()
	for name, shell := range shells {
		t.Run(name, func(t *testing.T) {
			run := func(req cluster.ExecRequest) (string, int, error) {
				var out, errOut bytes.Buffer
				req.Stdout, req.Stderr = &out, &errOut
				req, s := withSetup(req)
				cmd := exec.Command(shell[0], append(shell[1:], req.Command[1:]...)...)
				cmd.Stdout, cmd.Stderr, cmd.Env = req.Stdout, req.Stderr, []string{"PATH=/usr/bin:/bin", "HOME=/root"}
				code := 0
				if err := cmd.Run(); err != nil {
					var ee *exec.ExitError
					if !errors.As(err, &ee) {
						t.Fatal(err)
					}
					code = ee.ExitCode()
				}
				return out.String(), code, s.failed(cluster.ExitStatus{Code: code})
			}
			// The environment as a program reads it, NAME=VALUE and a NUL
			// each.
			names := []string{"DASHES", "EMPTY", "IFS", "LINES", "PATH", "QUOTES", "SPACES", "SUBST", "UNICODE", "n"}
			out, code, err := run(cluster.ExecRequest{Env: env, Cwd: dir, Command: []string{"env", "-0"}})
			if err != nil || code != 0 {
				t.Fatalf("exit %d, %v", code, err)
			}
			got := map[string]string{}
			for _, kv := range strings.Split(strings.TrimSuffix(out, "\x00"), "\x00") {
				k, v, _ := strings.Cut(kv, "=")
				got[k] = v
			}
			for _, k := range names {
				if got[k] != env[k] {
					t.Errorf("%s: got %q, want %q", k, got[k], env[k])
				}
			}
			if _, ok := got["HILOOP_SETUP_ARG"]; ok {
				t.Error("the script's own variable reached the command")
			}
			out, _, err = run(cluster.ExecRequest{Cwd: dir, Command: []string{"pwd"}})
			if err != nil || out != dir+"\n" {
				t.Errorf("pwd: %q %v", out, err)
			}
			// The command's argv is its own, a first "--" included.
			out, _, err = run(cluster.ExecRequest{Env: map[string]string{"A": "--"}, Command: []string{"printf", "%s|", "--", "-x", "a b"}})
			if diff := cmp.Diff("--|-x|a b|", out); diff != "" || err != nil {
				t.Errorf("argv (-want +got): %s %v", diff, err)
			}
			for _, tc := range []struct {
				cwd  string
				kind error
			}{
				{dir + "/missing", ErrCwdNotFound},
				{"/etc/passwd", ErrCwdNotDir},
			} {
				_, _, err := run(cluster.ExecRequest{Cwd: tc.cwd, Command: []string{"true"}})
				if !errors.Is(err, tc.kind) {
					t.Errorf("cwd %s: %v, want %v", tc.cwd, err, tc.kind)
				}
			}
			// bash keeps EUID read-only: `command export` keeps the
			// refusal from ending the shell, so the script says so with
			// its own status, and the command does not run.
			if name == "bash" {
				out, code, err := run(cluster.ExecRequest{Env: map[string]string{"EUID": "0"}, Command: []string{"echo", "ran"}})
				if !errors.Is(err, ErrEnvRefused) || code != exitEnvRefused || out != "" || !strings.Contains(err.Error(), "EUID") {
					t.Errorf("a read-only variable: exit %d %q %v", code, out, err)
				}
			}
			if _, err := os.Stat("/tmp/hiloop-pwned"); err == nil {
				t.Error("a value was run by the shell")
			}
		})
	}
}

// TestCheckArgvUTF8: a command line that is not UTF-8 is refused before
// anything runs, as the kubelet's runtime API could not carry it.
func TestCheckArgvUTF8(t *testing.T) {
	for _, argv := range [][]string{{"echo", "\xff"}, {"\xc3"}, {"sh", "-c", "echo \xe4\xb8"}} {
		var ae *ArgvError
		if err := CheckArgv(argv); !errors.As(err, &ae) {
			t.Errorf("%q: %v", argv, err)
		}
	}
	if err := CheckArgv([]string{"printf", "h\u00e9llo \U0001F600 \x1b\x7f"}); err != nil {
		t.Errorf("UTF-8 refused: %v", err)
	}
}

// TestSetupFailed: without the ready line, only the set-up script's own
// statuses say the command never ran; any other status is the command's,
// as the ready line can be lost (a terminal whose output the runtime drops
// when stdin closes at once) or never said (a sh the workload replaced).
func TestSetupFailed(t *testing.T) {
	for _, tc := range []struct {
		ready bool
		code  int
		kind  error // nil: the command's own status
	}{
		{true, 0, nil},
		{true, exitCwdMissing, nil},
		{true, exitEnvRefused, nil},
		{false, exitCwdMissing, ErrCwdNotFound},
		{false, exitCwdNotDir, ErrCwdNotDir},
		{false, exitCwdDenied, ErrCwdDenied},
		{false, exitEnvRefused, ErrEnvRefused},
		{false, 0, nil},
		{false, 1, nil},
		{false, 2, nil},
		{false, 127, nil},
		{false, 137, nil},
	} {
		_, s := withSetup(cluster.ExecRequest{Command: []string{"true"}, Env: map[string]string{"A": "1"}, Cwd: "/x"})
		if tc.ready {
			s.stdout = io.Discard
			(*setupStdout)(s).Write([]byte(setupReady + "\n"))
		}
		err := s.failed(cluster.ExitStatus{Code: tc.code})
		if (tc.kind == nil) != (err == nil) || (tc.kind != nil && !errors.Is(err, tc.kind)) {
			t.Errorf("ready %v, status %d: %v, want %v", tc.ready, tc.code, err, tc.kind)
		}
	}
}
