package e2e_test

import (
	"bufio"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"testing"
	"time"

	"github.com/hiloop/hiloop/api"
	"github.com/hiloop/hiloop/internal/e2e"
	"github.com/hiloop/hiloop/k8s"
)

// firstLine starts cmd and returns once its stdout printed want, then
// kills it: the time to a long-running command's first output.
func firstLine(b *testing.B, cmd *exec.Cmd, want string) {
	b.Helper()
	out, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	sc := bufio.NewScanner(out)
	got := sc.Scan() && sc.Text() == want
	cmd.Process.Kill()
	cmd.Wait()
	if !got {
		b.Fatalf("%v: no %q on stdout (%v)", cmd.Args, want, sc.Err())
	}
}

// BenchmarkProcessFirstOutput compares starting a long-running command in
// the background and attaching to its first output, as a user does it
// with the CLI (`hiloop sandbox process start`, then `hiloop sandbox
// process logs -f` until the first line), with `kubectl exec POD -- CMD`
// of the same command until the same line, interleaved on the same pod,
// 20 runs each. Both are whole processes; hiloop's side is two of them.
func BenchmarkProcessFirstOutput(b *testing.B) {
	in := e2e.Serve(b, filepath.Join(b.TempDir(), "h.db"), e2e.NewNamespace(b), "--create-rate-limit", "0", "--rate-limit", "0", "--org-create-rate-limit", "0", "--org-rate-limit", "0")
	sb := in.Create(in.Token, "busybox", "--wait")
	reapProcesses(b, in, in.Token, sb.ID)
	env := append(os.Environ(), "HILOOP_URL="+in.URL, "HILOOP_TOKEN="+in.Token)
	// kwok runs the commands on this machine and ends none: the sleeps
	// are short and reaped.
	command := []string{"sh", "-c", "echo ready; exec sleep 29"}
	b.Cleanup(func() { e2e.KillExecProcs(b, regexp.MustCompile(`^sleep 29$`)) })
	b.ResetTimer()
	for range b.N {
		var hl, kc []time.Duration
		for range 20 {
			t0 := time.Now()
			start := exec.Command(e2e.Binary(b), append([]string{"sandbox", "process", "start", "-o", "json", sb.ID, "--"}, command...)...)
			start.Env = env
			out, err := start.Output()
			var p api.Process
			if err != nil || json.Unmarshal(out, &p) != nil {
				b.Fatalf("process start: %v %s", err, out)
			}
			logs := exec.Command(e2e.Binary(b), "sandbox", "process", "logs", "-f", sb.ID, p.ID)
			logs.Env = env
			firstLine(b, logs, "ready")
			hl = append(hl, time.Since(t0))
			b.StopTimer()
			if status, body := in.Call(in.Token, "DELETE", "/v1/sandboxes/"+sb.ID+"/processes/"+p.ID, ""); status != 200 {
				b.Fatalf("kill: %d %s", status, body)
			}
			b.StartTimer()

			t0 = time.Now()
			firstLine(b, exec.Command("kubectl", append([]string{"--kubeconfig", e2e.SharedCluster(b).Kubeconfig, "exec", "-n", in.NS,
				k8s.ObjectName(sb.ID), "--"}, command...)...), "ready")
			kc = append(kc, time.Since(t0))
		}
		b.ReportMetric(float64(percentile(hl, 50).Microseconds())/1000, "hiloop-p50-ms")
		b.ReportMetric(float64(percentile(kc, 50).Microseconds())/1000, "kubectl-p50-ms")
		b.ReportMetric(float64(percentile(hl, 50))/float64(percentile(kc, 50)), "p50-ratio")
	}
}
