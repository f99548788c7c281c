package control

import (
	"context"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/hiloop/hiloop/cluster"
	"github.com/hiloop/hiloop/control/controltest"
	"github.com/hiloop/hiloop/internal/eventually"
	"github.com/hiloop/hiloop/store"
)

// Attacks on background processes from inside the sandbox and from the
// way a session ends, run against this machine's sh as procSession does.

// alive reports whether process pid exists and is not a zombie.
func alive(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i >= 0 && len(s) > i+2 && s[i+2] != 'Z'
}

func readPid(t *testing.T, id, name string) int {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(procRoot, id, name))
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 1 {
		t.Fatalf("%s: %q", name, b)
	}
	return pid
}

// TestProcessSupervisorKilledEndsItsCommand: when something in the
// sandbox kills only a process's supervisor, the record says the process
// ended (state_lost), and nothing can signal it through hiloop after:
// so its command and the holder of its stdin are ended too, and "ended"
// is true.
func TestProcessSupervisorKilledEndsItsCommand(t *testing.T) {
	c, s, _, who := procSession(t)
	ctx := context.Background()
	p, err := s.StartProcess(ctx, []string{"sleep", "300"}, nil, "")
	if err != nil {
		t.Fatal(err)
	}
	cmd, keeper, sup := readPid(t, p.ID, "pid"), readPid(t, p.ID, "keeper"), readPid(t, p.ID, "sup")
	if err := syscall.Kill(sup, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	out, err := s.ProcessOutput(ctx, p.ID, 0, true)
	if err == nil {
		_, cerr := io.Copy(io.Discard, out)
		_, err = out.Done(cerr)
		out.Close()
	}
	if !errors.Is(err, ErrOutputGone) {
		t.Fatalf("follow of a process without its supervisor: %v; want %v", err, ErrOutputGone)
	}
	info, err := c.Process(ctx, who, s.SandboxID, p.ID)
	if err != nil || info.State != store.ProcessEnded || info.Reason != store.EndStateLost {
		t.Fatalf("process %+v, %v; want ended, state_lost", info, err)
	}
	eventually.True(t, "the command of a process recorded ended is gone", func() bool { return !alive(cmd) })
	eventually.True(t, "the holder of its stdin is gone", func() bool { return !alive(keeper) })
}

// detachedExec runs a command on this machine that outlives its exec: the
// exec returns when ctx ends and leaves the command running, as a runtime
// may when an exec's stream is cut.
func detachedExec(t *testing.T) func(context.Context, cluster.ExecRequest) (cluster.ExitStatus, error) {
	return func(ctx context.Context, req cluster.ExecRequest) (cluster.ExitStatus, error) {
		cmd := exec.Command(req.Command[0], req.Command[1:]...)
		cmd.Stdin, cmd.Stdout, cmd.Stderr = req.Stdin, req.Stdout, req.Stderr
		if err := cmd.Start(); err != nil {
			return cluster.ExitStatus{}, err
		}
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		t.Cleanup(func() { cmd.Process.Kill() })
		select {
		case err := <-done:
			var ee *exec.ExitError
			if errors.As(err, &ee) {
				return cluster.ExitStatus{Code: ee.ExitCode()}, nil
			}
			return cluster.ExitStatus{}, err
		case <-ctx.Done():
			return cluster.ExitStatus{}, ctx.Err()
		}
	}
}

// TestProcessOutputReaderEndsWithItsSession: a follow whose session is
// ended from outside (its key revoked) has its reader in the sandbox
// ended, even where the runtime leaves a cut exec's command running: no
// reader polls on for a caller who is gone.
func TestProcessOutputReaderEndsWithItsSession(t *testing.T) {
	c, s, db, who := procSession(t)
	ctx := context.Background()
	p, err := s.StartProcess(ctx, []string{"sleep", "300"}, nil, "")
	if err != nil {
		t.Fatal(err)
	}
	c.o.Exec = controltest.Exec{Run: detachedExec(t)}
	out, err := s.ProcessOutput(s.Context(), p.ID, 0, true)
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	readers := func() []string {
		m, _ := filepath.Glob(filepath.Join(procRoot, p.ID, "r.*"))
		return m
	}
	if len(readers()) != 1 {
		t.Fatalf("readers %v; want one", readers())
	}
	reader := readPid(t, p.ID, filepath.Base(readers()[0]))
	liveCaller(t, db, who.OrgID) // the organization keeps a live key
	if err := db.RevokeKey(ctx, who.OrgID, who.KeyID, false); err != nil {
		t.Fatal(err)
	}
	c.sweep(ctx)
	_, cerr := io.Copy(io.Discard, out)
	if _, err := out.Done(cerr); !errors.Is(err, ErrKeyRevoked) {
		t.Fatalf("a follow whose key was revoked: %v; want %v", err, ErrKeyRevoked)
	}
	eventually.True(t, "the reader in the sandbox ended", func() bool { return !alive(reader) && len(readers()) == 0 })
}

// TestProcessNumbersParsedStrictly: an exit status or a byte count from a
// sandbox is read only as the scripts write it.
func TestProcessNumbersParsedStrictly(t *testing.T) {
	for in, want := range map[string]int{"0": 0, "7": 7, "143": 143, "255": 255, "007": 7} {
		if n, ok := exitStatus(in); !ok || n != want {
			t.Errorf("exitStatus(%q) = %d, %v; want %d", in, n, ok, want)
		}
	}
	for _, in := range []string{"", "256", "-1", "+7", " 7", "7 ", "0x7", "1e2", "seven", "1000", "99999999999999999999"} {
		if n, ok := exitStatus(in); ok {
			t.Errorf("exitStatus(%q) = %d; want refused", in, n)
		}
	}
	if n, ok := byteCount("9223372036854775807"); !ok || n != 1<<63-1 {
		t.Errorf("byteCount of the largest int64: %d %v", n, ok)
	}
	for _, in := range []string{"", "-5", "+5", "9223372036854775808", "1e3", "0x10", " 1"} {
		if n, ok := byteCount(in); ok {
			t.Errorf("byteCount(%q) = %d; want refused", in, n)
		}
	}
}

// TestProcessScriptsTakeNoPidOneFromTheSandbox: a pid file the workload
// rewrote to 1, 0 or not a number is no process to signal or close: a
// signal to the group -1 would reach every process of the sandbox. The
// test sends signal 0, which reaches nothing either way, and sees the
// script refuse (exit 92) where it would have sent it.
func TestProcessScriptsTakeNoPidOneFromTheSandbox(t *testing.T) {
	id := "proc_pidone" + strconv.Itoa(os.Getpid())
	d := filepath.Join(procRoot, id)
	if err := os.MkdirAll(d, 0o700); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(d) })
	for _, pid := range []string{"1", "0", "-1", "1 2", ""} {
		if err := os.WriteFile(filepath.Join(d, "pid"), []byte(pid+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		err := exec.Command("sh", "-c", signalScript, "sh", id, "0").Run()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 92 {
			t.Errorf("signal with pid file %q: %v, want exit 92", pid, err)
		}
	}
}
