package e2e_test

import (
	"io"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/hiloop/hiloop/internal/e2e"
)

// firstByte is the time from starting `ssh id 'echo hi'` to the first byte
// of its output.
func firstByte(b *testing.B, u *sshUser, id string) time.Duration {
	b.Helper()
	cmd := exec.Command("ssh", u.args(id+"@127.0.0.1", "echo hi")...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	out, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	errOut := &e2e.SyncBuffer{}
	cmd.Stderr = errOut
	start := time.Now()
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	if _, err := io.ReadFull(out, make([]byte, 1)); err != nil {
		cmd.Wait()
		b.Fatalf("ssh %s: no output: %v\n%s", id, err, errOut.String())
	}
	d := time.Since(start)
	io.Copy(io.Discard, out)
	if err := cmd.Wait(); err != nil {
		b.Fatalf("ssh %s: %v\n%s", id, err, errOut.String())
	}
	return d
}

// BenchmarkWakeOnSSH: the time from `ssh id 'echo hi'` to its first byte of
// output on a sandbox stopped for idleness, which the gateway wakes, against
// `hiloop sandbox start --wait` followed by the same ssh on a sandbox its
// owner stopped, measured alternately in the same run. wake/start is the
// ratio of the medians (target at most 1.1): a wake should cost no more than
// starting by hand.
func BenchmarkWakeOnSSH(b *testing.B) {
	requireSSH(b)
	in := e2e.Serve(b, filepath.Join(b.TempDir(), "h.db"), e2e.NewNamespace(b))
	u := newSSHUser(b, in, in.Token)
	idle := in.Create(in.Token, "busybox", "--idle-timeout", "1s", "--wait").ID
	owned := in.Create(in.Token, "busybox", "--idle-timeout", "0", "--wait").ID
	const rounds = 5
	b.ResetTimer()
	for range b.N {
		var wake, start []time.Duration
		for range rounds {
			waitIdleStopped(b, in, in.Token, idle)
			wake = append(wake, firstByte(b, u, idle))

			in.MustCLI(in.Token, "sandbox", "stop", owned)
			in.WaitState(in.Token, owned, "stopped")
			t0 := time.Now()
			in.MustCLI(in.Token, "sandbox", "start", "--wait", owned)
			started := time.Since(t0)
			start = append(start, started+firstByte(b, u, owned))
		}
		ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
		b.ReportMetric(ms(percentile(wake, 50)), "wake-ttfb-p50-ms")
		b.ReportMetric(ms(percentile(start, 50)), "start-wait-ssh-ttfb-p50-ms")
		b.ReportMetric(float64(percentile(wake, 50))/float64(percentile(start, 50)), "wake/start")
	}
}
