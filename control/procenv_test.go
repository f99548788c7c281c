package control

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/hiloop/hiloop/store"
)

// TestProcessEnvCwd: a process runs in the directory and with the
// variables it was started with, exactly as given (no shell reads them,
// and a variable named like one of the supervisor's changes nothing of
// it); a directory the sandbox lacks or cannot enter is a *SetupError and
// the process is recorded ended start_failed; a bad environment is
// refused before anything is recorded.
func TestProcessEnvCwd(t *testing.T) {
	c, s, _, who := procSession(t)
	ctx := context.Background()
	dir := filepath.Join(t.TempDir(), "a b $(x)")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{
		"A": `it's "quoted" $(echo no) ` + "`echo no`" + ` $HOME`,
		"B": "two\nlines ; exit 3",
		"d": "/nonexistent", "r": "x", "s": "y", "IFS": "x",
	}
	p, err := s.StartProcess(ctx, []string{"sh", "-c", `pwd; printf '%s|' "$A" "$B" "$d" "$r" "$s"`}, env, dir)
	if err != nil {
		t.Fatal(err)
	}
	got, end := follow(t, s, p.ID, 0)
	want := dir + "\n" + env["A"] + "|" + env["B"] + "|/nonexistent|x|y|"
	if got != want || !end.Exited || end.ExitCode != 0 {
		t.Fatalf("output %q, end %+v; want %q, exit 0", got, end, want)
	}

	file := filepath.Join(t.TempDir(), "f")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		cwd  string
		kind error
	}{{filepath.Join(dir, "missing"), ErrCwdNotFound}, {file, ErrCwdNotDir}} {
		_, err := s.StartProcess(ctx, []string{"touch", "/tmp/never"}, nil, tc.cwd)
		var se *SetupError
		if !errors.As(err, &se) || se.Kind != tc.kind || se.Cwd != tc.cwd {
			t.Fatalf("cwd %s: %v; want a SetupError %v", tc.cwd, err, tc.kind)
		}
	}
	ps, err := c.Processes(ctx, who, s.SandboxID)
	if err != nil {
		t.Fatal(err)
	}
	failed := 0
	for _, p := range ps {
		if p.State == store.ProcessEnded && p.Reason == store.EndStartFailed {
			failed++
		}
	}
	if len(ps) != 3 || failed != 2 {
		t.Fatalf("records %+v; want the process and two ended start_failed", ps)
	}

	var fe *FieldError
	for _, bad := range []map[string]string{{"HILOOP_X": "1"}, {"1A": "1"}, {"A": "a\x00b"}} {
		if _, err := s.StartProcess(ctx, []string{"true"}, bad, ""); !errors.As(err, &fe) || !errors.Is(err, ErrInvalidEnv) {
			t.Errorf("env %q: %v; want invalid_env", bad, err)
		}
	}
	if _, err := s.StartProcess(ctx, []string{"true"}, nil, "rel"); !errors.Is(err, ErrInvalidPath) {
		t.Errorf("relative cwd: %v; want invalid path", err)
	}
	if ps, _ := c.Processes(ctx, who, s.SandboxID); len(ps) != 3 {
		t.Errorf("%d records after refused starts; want 3", len(ps))
	}
}
