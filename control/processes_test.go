package control

import (
	"bytes"
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

// localExec runs every command on this machine, as the local cluster's
// kwok does: the process scripts run against this machine's sh and
// utilities, and their processes outlive the exec as they do in a pod.
func localExec(ctx context.Context, req cluster.ExecRequest) (cluster.ExitStatus, error) {
	cmd := exec.CommandContext(ctx, req.Command[0], req.Command[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = req.Stdin, req.Stdout, req.Stderr
	err := cmd.Run()
	var ee *exec.ExitError
	if errors.As(err, &ee) && ctx.Err() == nil {
		return cluster.ExitStatus{Code: ee.ExitCode()}, nil
	}
	if err != nil {
		return cluster.ExitStatus{}, err
	}
	return cluster.ExitStatus{}, nil
}

// procSession is an exec session into a running sandbox whose commands
// run on this machine, and a cleanup that kills the processes it started
// and removes their state.
func procSession(t *testing.T) (*Control, *Session, *store.Store, Caller) {
	t.Helper()
	c, db, org := newControl(t, &controltest.Cluster{})
	c.o.Exec = controltest.Exec{Run: localExec}
	who := liveCaller(t, db, org.ID)
	sb := runningSandbox(t, c, db, who)
	s, err := c.Admit(context.Background(), who, sb.ID, "exec")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		s.End()
		ps, _ := db.Processes(context.Background(), who.OrgID, sb.ID)
		for _, p := range ps {
			killLocal(p.ID)
		}
	})
	return c, s, db, who
}

// killLocal kills what is left of a process started on this machine and
// removes its state.
func killLocal(id string) {
	d := filepath.Join(procRoot, id)
	if b, err := os.ReadFile(filepath.Join(d, "pid")); err == nil {
		if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && pid > 1 {
			syscall.Kill(-pid, syscall.SIGKILL)
		}
	}
	if b, err := os.ReadFile(filepath.Join(d, "keeper")); err == nil {
		if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && pid > 1 {
			syscall.Kill(pid, syscall.SIGKILL)
		}
	}
	os.RemoveAll(d)
}

// follow reads a process's output from offset to its end.
func follow(t *testing.T, s *Session, id string, offset int64) (string, OutputEnd) {
	t.Helper()
	out, err := s.ProcessOutput(context.Background(), id, offset, true)
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	var buf bytes.Buffer
	_, cerr := io.Copy(&buf, out)
	end, err := out.Done(cerr)
	if err != nil {
		t.Fatal(err)
	}
	return buf.String(), end
}

// TestProcessLifecycle: a process started detached takes stdin, its
// output is read from any offset, and following it ends with its exact
// exit status, which the record keeps.
func TestProcessLifecycle(t *testing.T) {
	c, s, _, who := procSession(t)
	ctx := context.Background()
	p, err := s.StartProcess(ctx, []string{"sh", "-c", `echo hello; read l; echo "got $l" >&2; exit 7`}, nil, "")
	if err != nil {
		t.Fatal(err)
	}
	if p.State != store.ProcessRunning || !strings.HasPrefix(p.ID, "proc_") {
		t.Fatalf("started %+v", p)
	}
	// Its output is there to read while it runs, not only once it ended.
	eventually.True(t, "the first line read while the process waits for stdin", func() bool {
		out, err := s.ProcessOutput(ctx, p.ID, 0, false)
		if err != nil {
			return false
		}
		defer out.Close()
		b, cerr := io.ReadAll(out)
		end, err := out.Done(cerr)
		return err == nil && string(b) == "hello\n" && !end.Exited
	})
	if err := s.WriteStdin(ctx, p.ID, 4, strings.NewReader("abc\n"), false); err != nil {
		t.Fatal(err)
	}
	got, end := follow(t, s, p.ID, 0)
	if got != "hello\ngot abc\n" || !end.Exited || end.ExitCode != 7 || !end.Complete || end.Offset != 14 {
		t.Fatalf("output %q, end %+v; want hello, got abc, exit 7 at 14", got, end)
	}
	if got, _ := follow(t, s, p.ID, 6); got != "got abc\n" {
		t.Errorf("from offset 6: %q", got)
	}
	info, err := c.Process(ctx, who, s.SandboxID, p.ID)
	if err != nil || info.State != store.ProcessExited || info.ExitCode == nil || *info.ExitCode != 7 {
		t.Fatalf("process %+v, %v; want exited 7", info, err)
	}
	if err := s.SignalProcess(ctx, p.ID, "TERM"); !errors.Is(err, ErrProcessNotRunning) {
		t.Errorf("signal after exit: %v; want %v", err, ErrProcessNotRunning)
	}
}

// TestProcessSignal: a signal reaches the process's group, the exit it
// causes is reported, and a process the sandbox says exited is recorded
// so on a look.
func TestProcessSignal(t *testing.T) {
	c, s, _, who := procSession(t)
	ctx := context.Background()
	p, err := s.StartProcess(ctx, []string{"sh", "-c", `sleep 300 & wait`}, nil, "")
	if err != nil {
		t.Fatal(err)
	}
	if err := s.SignalProcess(ctx, p.ID, "TERM"); err != nil {
		t.Fatal(err)
	}
	if _, end := follow(t, s, p.ID, 0); !end.Exited || end.ExitCode != 143 {
		t.Fatalf("end %+v; want exited 143", end)
	}
	if err := s.SignalProcess(ctx, p.ID, "SEGV"); err == nil {
		t.Error("a signal off the list was sent")
	}
	q, err := s.StartProcess(ctx, []string{"sh", "-c", "exit 3"}, nil, "")
	if err != nil {
		t.Fatal(err)
	}
	// Nobody follows it: a look asks the sandbox.
	eventually.True(t, "the look sees the exit", func() bool {
		info, err := c.Process(ctx, who, s.SandboxID, q.ID)
		return err == nil && info.State == store.ProcessExited && *info.ExitCode == 3
	})
}

// TestProcessOutputGone: the sandbox keeps only the newest chunks of a
// process's output; an offset older than them is ErrOutputGone, and one
// within them reads to the end.
func TestProcessOutputGone(t *testing.T) {
	_, s, _, _ := procSession(t)
	ctx := context.Background()
	total := 7*procChunk + 123
	p, err := s.StartProcess(ctx, []string{"head", "-c", strconv.Itoa(total), "/dev/zero"}, nil, "")
	if err != nil {
		t.Fatal(err)
	}
	got, end := follow(t, s, p.ID, int64(total-10))
	if len(got) != 10 || end.ExitCode != 0 || end.Offset != int64(total) {
		t.Fatalf("read %d bytes, end %+v", len(got), end)
	}
	if _, err := s.ProcessOutput(ctx, p.ID, 0, false); !errors.Is(err, ErrOutputGone) {
		t.Fatalf("offset 0: %v; want %v", err, ErrOutputGone)
	}
	// At least the newest (procChunks-1) chunks' worth is kept.
	from := int64(total - (procChunks-1)*procChunk)
	out, err := s.ProcessOutput(ctx, p.ID, from, false)
	if err != nil {
		t.Fatal(err)
	}
	n, cerr := io.Copy(io.Discard, out)
	if _, err := out.Done(cerr); err != nil || n != int64(total)-from {
		t.Fatalf("from %d: %d bytes, %v; want %d", from, n, err, int64(total)-from)
	}
	out.Close()
	if len(chunkFiles(t, p.ID)) > procChunks {
		t.Errorf("more than %d chunks kept: %v", procChunks, chunkFiles(t, p.ID))
	}
}

func chunkFiles(t *testing.T, id string) []string {
	t.Helper()
	m, err := filepath.Glob(filepath.Join(procRoot, id, "out.*"))
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// TestProcessStdinClose: closing stdin gives the process end of file.
func TestProcessStdinClose(t *testing.T) {
	_, s, _, _ := procSession(t)
	ctx := context.Background()
	p, err := s.StartProcess(ctx, []string{"cat"}, nil, "")
	if err != nil {
		t.Fatal(err)
	}
	if err := s.WriteStdin(ctx, p.ID, 3, strings.NewReader("one"), false); err != nil {
		t.Fatal(err)
	}
	if err := s.WriteStdin(ctx, p.ID, 4, strings.NewReader(" two"), true); err != nil {
		t.Fatal(err)
	}
	if got, end := follow(t, s, p.ID, 0); got != "one two" || end.ExitCode != 0 {
		t.Fatalf("output %q, end %+v", got, end)
	}
	if err := s.WriteStdin(ctx, p.ID, 1, strings.NewReader("x"), false); !errors.Is(err, ErrProcessNotRunning) {
		t.Errorf("stdin after exit: %v", err)
	}
}

// TestProcessScriptsSpellTheLimits: the scripts' M and K are procChunk
// and procChunks.
func TestProcessScriptsSpellTheLimits(t *testing.T) {
	for _, s := range []string{supervisorScript, outputScript} {
		if !strings.Contains(s, "M="+strconv.Itoa(procChunk)) {
			t.Errorf("a script does not spell M=%d", procChunk)
		}
	}
	if !strings.Contains(supervisorScript, "\nK="+strconv.Itoa(procChunks)+"\n") {
		t.Errorf("the supervisor does not spell K=%d", procChunks)
	}
}

// TestProcessSupervisorKilled: a process whose supervisor something in
// the sandbox killed (kill -9 -1 takes it along) can never report its
// exit: a follow of it ends, and it is recorded ended (state_lost), never
// left running.
func TestProcessSupervisorKilled(t *testing.T) {
	c, s, _, who := procSession(t)
	ctx := context.Background()
	p, err := s.StartProcess(ctx, []string{"sleep", "300"}, nil, "")
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(procRoot, p.ID, "sup"))
	if err != nil {
		t.Fatal(err)
	}
	sup, _ := strconv.Atoi(strings.TrimSpace(string(b)))
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
}

// TestProcessLookIsNoUse: asking the sandbox for its processes' state is
// no use of it: its idle clock runs on.
func TestProcessLookIsNoUse(t *testing.T) {
	c, s, db, who := procSession(t)
	ctx := context.Background()
	p, err := s.StartProcess(ctx, []string{"sleep", "300"}, nil, "")
	if err != nil {
		t.Fatal(err)
	}
	s.End()
	sb, err := db.Sandbox(ctx, who.OrgID, s.SandboxID)
	if err != nil {
		t.Fatal(err)
	}
	before, busy := c.activity.idleSince(sb.ID, sb.LastActivityAt)
	if busy {
		t.Fatal("busy with no session open")
	}
	info, err := c.Process(ctx, who, sb.ID, p.ID)
	if err != nil || info.OutputBytes == nil {
		t.Fatalf("the look did not ask the sandbox: %+v %v", info, err)
	}
	if after, busy := c.activity.idleSince(sb.ID, sb.LastActivityAt); busy || !after.Equal(before) {
		t.Fatalf("the look moved the idle clock from %v to %v (busy %v)", before, after, busy)
	}
}
