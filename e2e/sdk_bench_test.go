package e2e_test

import (
	"context"
	"crypto/rand"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hiloop/hiloop/api"
	"github.com/hiloop/hiloop/internal/e2e"
	"github.com/hiloop/hiloop/k8s"
)

// BenchmarkFileTransfer compares `hiloop sandbox cp` of a 128 MiB file into
// and out of a sandbox with kubectl moving the same file into and out of
// the same pod, interleaved, 3 runs each way. Out, the baseline is
// `kubectl cp`. In, `kubectl cp` never ends in the local cluster: it runs
// tar in the pod, which waits for the end of its stdin, which kwok never
// delivers. The baseline in is what kubectl can do there, and what hiloop
// does: `kubectl exec -i POD -- sh -c 'head -c SIZE > FILE'` fed the file.
func BenchmarkFileTransfer(b *testing.B) {
	in := e2e.Serve(b, filepath.Join(b.TempDir(), "h.db"), e2e.NewNamespace(b), "--rate-limit", "0", "--org-rate-limit", "0")
	sb := in.Create(in.Token, "busybox", "--wait")
	env := []string{"HILOOP_URL=" + in.URL, "HILOOP_TOKEN=" + in.Token}
	kubectl := []string{"kubectl", "--kubeconfig", e2e.SharedCluster(b).Kubeconfig}
	pod := in.NS + "/" + k8s.ObjectName(sb.ID)
	const size = 128 << 20
	local := b.TempDir()
	blob := filepath.Join(local, "blob")
	f, err := os.Create(blob)
	if err != nil {
		b.Fatal(err)
	}
	if _, err := io.CopyN(f, rand.Reader, size); err != nil {
		b.Fatal(err)
	}
	f.Close()
	remote := b.TempDir() // where the pod's commands run, on this machine
	mbps := func(d time.Duration) float64 { return float64(size) / (1 << 20) / d.Seconds() }
	b.ResetTimer()
	for range b.N {
		var hlIn, kcIn, hlOut, kcOut []time.Duration
		for i := range 3 {
			n := strconv.Itoa(i)
			hlIn = append(hlIn, timeCmd(b, env, e2e.Binary(b), "sandbox", "cp", blob, sb.ID+":"+remote+"/hl"+n))
			kcIn = append(kcIn, timeCmdIn(b, blob, kubectl[0], append(kubectl[1:], "exec", "-i", "-n", in.NS, k8s.ObjectName(sb.ID), "--",
				"sh", "-c", `head -c "$1" > "$2"`, "sh", strconv.Itoa(size), remote+"/kc"+n)...))
			hlOut = append(hlOut, timeCmd(b, env, e2e.Binary(b), "sandbox", "cp", sb.ID+":"+remote+"/hl"+n, local+"/hl-back"+n))
			kcOut = append(kcOut, timeCmd(b, nil, kubectl[0], append(kubectl[1:], "cp", pod+":"+remote+"/kc"+n, local+"/kc-back"+n)...))
		}
		b.ReportMetric(mbps(percentile(hlIn, 50)), "hiloop-in-MB/s")
		b.ReportMetric(mbps(percentile(kcIn, 50)), "kubectl-in-MB/s")
		b.ReportMetric(mbps(percentile(hlIn, 50))/mbps(percentile(kcIn, 50)), "in-ratio")
		b.ReportMetric(mbps(percentile(hlOut, 50)), "hiloop-out-MB/s")
		b.ReportMetric(mbps(percentile(kcOut, 50)), "kubectl-out-MB/s")
		b.ReportMetric(mbps(percentile(hlOut, 50))/mbps(percentile(kcOut, 50)), "out-ratio")
	}
}

// timeCmdIn is timeCmd with stdin read from the file in.
func timeCmdIn(b *testing.B, in, name string, args ...string) time.Duration {
	f, err := os.Open(in)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	cmd := exec.Command(name, args...)
	cmd.Stdin, cmd.Stdout = f, io.Discard
	var stderr strings.Builder
	cmd.Stderr = &stderr
	t0 := time.Now()
	if err := cmd.Run(); err != nil {
		b.Fatalf("%s %v: %v %s", name, args, err, stderr.String())
	}
	return time.Since(t0)
}

// BenchmarkSDKRunRoundTrip compares a one-shot `true` through the Go SDK's
// Run and through the Python SDK's run with the CLI's `exec -- true`, on
// the same sandbox, 30 runs each.
func BenchmarkSDKRunRoundTrip(b *testing.B) {
	in := e2e.Serve(b, filepath.Join(b.TempDir(), "h.db"), e2e.NewNamespace(b), "--rate-limit", "0", "--org-rate-limit", "0")
	sb := in.Create(in.Token, "busybox", "--wait")
	env := []string{"HILOOP_URL=" + in.URL, "HILOOP_TOKEN=" + in.Token}
	c := sdk(in, in.Token)
	pySDK := installPython(b)
	const runs = 30
	pyLoop := `import sys, time, hiloop
sb = hiloop.Sandbox(hiloop.Client(), {"id": sys.argv[1], "state": "running"})
ts = []
for _ in range(int(sys.argv[2])):
    t0 = time.perf_counter(); sb.run(["true"]); ts.append(time.perf_counter() - t0)
print(sorted(ts)[len(ts) // 2] * 1000)
`
	b.ResetTimer()
	for range b.N {
		var goSDK, cli []time.Duration
		for range runs {
			t0 := time.Now()
			if res, err := c.Run(context.Background(), sb.ID, api.ExecRunRequest{Command: []string{"true"}}); err != nil || *res.ExitCode != 0 {
				b.Fatalf("run: %+v %v", res, err)
			}
			goSDK = append(goSDK, time.Since(t0))
			cli = append(cli, timeCmd(b, env, e2e.Binary(b), "sandbox", "exec", sb.ID, "--", "true"))
		}
		cmd := exec.Command("python3", "-c", pyLoop, sb.ID, strconv.Itoa(runs))
		cmd.Env = append(os.Environ(), append(env, "PYTHONPATH="+pySDK)...)
		out, err := cmd.CombinedOutput()
		if err != nil {
			b.Fatalf("python: %v\n%s", err, out)
		}
		pyMS, err := strconv.ParseFloat(strings.TrimSpace(string(out)), 64)
		if err != nil {
			b.Fatalf("python printed %q", out)
		}
		cliMS := float64(percentile(cli, 50).Microseconds()) / 1000
		goMS := float64(percentile(goSDK, 50).Microseconds()) / 1000
		b.ReportMetric(goMS, "go-sdk-p50-ms")
		b.ReportMetric(pyMS, "python-sdk-p50-ms")
		b.ReportMetric(cliMS, "cli-exec-p50-ms")
		b.ReportMetric(goMS/cliMS, "go-sdk/cli")
		b.ReportMetric(pyMS/cliMS, "python-sdk/cli")
	}
}
