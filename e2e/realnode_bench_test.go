package e2e_test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hiloop/hiloop/internal/e2e"
)

// BenchmarkRealNode measures hiloop on the real node's gVisor pods, each
// figure beside a baseline of plain Kubernetes measured in the same run,
// rounds of the two interleaved:
//
//   - create to running: `hiloop sandbox create busybox --wait` against
//     `kubectl run` of the same image under gVisor then `kubectl wait` for
//     the pod's Ready condition, the evidence hiloop's running waits for
//     too (hiloop's side also passes through the Sandbox controller);
//   - exec `true`: `hiloop sandbox exec` against `kubectl exec`, each a
//     process as a user runs it;
//   - a 16 MiB file in, and out: `hiloop sandbox cp` against `kubectl cp`;
//   - wake: `ssh` to a sandbox stopped for idleness, which wakes it and
//     runs `true`, against what a user does without wake, `hiloop sandbox
//     start --wait` of a stopped sandbox then the same `ssh`;
//   - memory per idle sandbox: the pod's memory cgroup on the node.
func BenchmarkRealNode(b *testing.B) {
	requireSSH(b)
	c := e2e.NewRealCluster(b)
	in := e2e.ServeOn(b, c, filepath.Join(b.TempDir(), "h.db"), e2e.NamespaceOn(b, c),
		"--transports", "exec,ssh", "--agent-image", c.AgentImage())
	kubectl := func(args ...string) {
		b.Helper()
		if out, err := c.Kubectl(b.Context(), args...); err != nil {
			b.Fatalf("%v: %s", err, out)
		}
	}
	// The floor's pods live in a namespace of their own, without hiloop's
	// quota or policies.
	plain := "floor-" + strconv.FormatInt(time.Now().UnixNano()%1e6, 10)
	kubectl("create", "namespace", plain)
	timed := func(fn func()) time.Duration {
		start := time.Now()
		fn()
		return time.Since(start)
	}
	const rounds = 3
	var hl, floor []time.Duration
	var ids []string
	for i := range rounds {
		floor = append(floor, timed(func() {
			pod := "floor-" + strconv.Itoa(i)
			kubectl("run", "-n", plain, pod, "--image=busybox", `--overrides={"spec":{"runtimeClassName":"gvisor"}}`)
			kubectl("wait", "-n", plain, "--for=condition=Ready", "pod/"+pod, "--timeout=120s")
		}))
		// Each node is the machine's two CPUs, and each gVisor pod
		// requests the RuntimeClass's 100m: the floor's pods make room.
		kubectl("delete", "pod", "-n", plain, "floor-"+strconv.Itoa(i), "--wait=false")
		hl = append(hl, timed(func() { ids = append(ids, in.Create(in.Token, "busybox", "--wait").ID) }))
	}
	report := func(what string, hl, floor []time.Duration) {
		h, f := percentile(hl, 50), percentile(floor, 50)
		b.ReportMetric(float64(h.Milliseconds()), what+"-hiloop-p50-ms")
		b.ReportMetric(float64(f.Milliseconds()), what+"-floor-p50-ms")
		b.ReportMetric(float64(h)/float64(f), what+"-ratio")
	}
	report("create", hl, floor)

	sb := ids[0]
	pod := "sbx-" + strings.TrimPrefix(sb, "sbx_")
	hl, floor = nil, nil
	for range 20 {
		floor = append(floor, timed(func() { kubectl("exec", "-n", in.NS, pod, "-c", "workload", "--", "true") }))
		hl = append(hl, timed(func() { in.MustCLI(in.Token, "sandbox", "exec", sb, "--", "true") }))
	}
	report("exec", hl, floor)

	file := filepath.Join(b.TempDir(), "f.bin")
	if err := exec.Command("dd", "if=/dev/urandom", "of="+file, "bs=1M", "count=16").Run(); err != nil {
		b.Fatal(err)
	}
	hl, floor = nil, nil
	for i := range rounds {
		floor = append(floor, timed(func() { kubectl("cp", "-c", "workload", file, in.NS+"/"+pod+":/tmp/k"+strconv.Itoa(i)) }))
		hl = append(hl, timed(func() { in.MustCLI(in.Token, "sandbox", "cp", file, sb+":/tmp/h"+strconv.Itoa(i)) }))
	}
	report("file-in", hl, floor)
	hl, floor = nil, nil
	for i := range rounds {
		out := b.TempDir()
		floor = append(floor, timed(func() {
			kubectl("cp", "-c", "workload", in.NS+"/"+pod+":/tmp/k"+strconv.Itoa(i), filepath.Join(out, "k"))
		}))
		hl = append(hl, timed(func() { in.MustCLI(in.Token, "sandbox", "cp", sb+":/tmp/h"+strconv.Itoa(i), filepath.Join(out, "h")) }))
	}
	report("file-out", hl, floor)

	// Wake against start-then-ssh, on a sandbox of its own with the ssh
	// transport (its session helper is in the pod): each side ends when
	// ssh's `true` has run in the sandbox.
	u := newSSHUser(b, in, in.Token)
	w := in.Create(in.Token, "busybox", "--transport", "exec", "--transport", "ssh", "--wait").ID
	sshTrue := func() {
		b.Helper()
		if out, errOut, code := u.run(w, "true"); code != 0 {
			b.Fatalf("ssh: %d %q %q", code, out, errOut)
		}
	}
	hl, floor = nil, nil
	for range rounds {
		in.MustCLI(in.Token, "sandbox", "idle-timeout", w, "0")
		in.MustCLI(in.Token, "sandbox", "stop", w)
		in.WaitState(in.Token, w, "stopped")
		floor = append(floor, timed(func() {
			in.MustCLI(in.Token, "sandbox", "start", w, "--wait")
			sshTrue()
		}))
		in.MustCLI(in.Token, "sandbox", "idle-timeout", w, "2s")
		in.WaitState(in.Token, w, "stopped")
		hl = append(hl, timed(sshTrue))
	}
	report("wake", hl, floor)
	in.MustCLI(in.Token, "sandbox", "delete", w)

	// What an idle sandbox holds: its pod's memory cgroup (the sentry, the
	// gofer and the workload's processes are charged there).
	var total float64
	for _, id := range ids {
		uid, err := c.Kubectl(b.Context(), "get", "pod", "-n", in.NS, "sbx-"+strings.TrimPrefix(id, "sbx_"), "-o", "jsonpath={.metadata.uid}")
		if err != nil {
			b.Fatal(err)
		}
		matches, _ := filepath.Glob("/sys/fs/cgroup/memory/hiloop-node/kubepods/*/pod" + uid + "/memory.usage_in_bytes")
		if len(matches) != 1 {
			b.Fatalf("no memory cgroup of pod %s: %v", uid, matches)
		}
		raw, err := os.ReadFile(matches[0])
		if err != nil {
			b.Fatal(err)
		}
		n, err := strconv.ParseFloat(strings.TrimSpace(string(raw)), 64)
		if err != nil {
			b.Fatal(err)
		}
		total += n
	}
	b.ReportMetric(total/float64(len(ids))/(1<<20), "idle-sandbox-MiB")
	fmt.Fprintf(os.Stderr, "real node: %d sandboxes measured\n", len(ids))
}
