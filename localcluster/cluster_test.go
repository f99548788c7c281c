package localcluster_test

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/agent-sandbox/api/v1beta1"

	"github.com/hiloop/hiloop/internal/e2e"
	"github.com/hiloop/hiloop/internal/eventually"
	"github.com/hiloop/hiloop/localcluster"
)

// TestUpstreamSandboxLifecycle checks the local cluster does what the real
// agent-sandbox controller does on a real cluster: one Ready pod per Sandbox,
// Suspended removes it, Running replaces it, delete collects it.
func TestUpstreamSandboxLifecycle(t *testing.T) {
	c := e2e.NewCluster(t)
	ctx := context.Background()
	sandboxes := c.Clients.Sandbox.AgentsV1beta1().Sandboxes(c.Namespace)
	pods := c.Clients.Kube.CoreV1().Pods(c.Namespace)

	sb := &v1beta1.Sandbox{
		ObjectMeta: metav1.ObjectMeta{Name: "sbx-smoke", Namespace: c.Namespace},
		Spec: v1beta1.SandboxSpec{SandboxBlueprint: v1beta1.SandboxBlueprint{PodTemplate: v1beta1.PodTemplate{
			Spec: corev1.PodSpec{
				// Requests and limits stated, as hiloop states them: the
				// namespace's quota refuses a pod without them.
				Containers: []corev1.Container{{Name: "workload", Image: "busybox", Resources: corev1.ResourceRequirements{
					Requests: corev1.ResourceList{"cpu": resource.MustParse("10m"), "memory": resource.MustParse("16Mi")},
					Limits:   corev1.ResourceList{"cpu": resource.MustParse("1"), "memory": resource.MustParse("64Mi")}}}},
				RestartPolicy:                corev1.RestartPolicyNever,
				RuntimeClassName:             ptr.To(localcluster.RuntimeClass),
				AutomountServiceAccountToken: ptr.To(false),
			},
		}}},
	}
	if _, err := sandboxes.Create(ctx, sb, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	var podUID string
	eventually.Within(t, "pod Running/Ready and Sandbox Ready=True", 60*time.Second, func() (bool, error) {
		p, err := pods.Get(ctx, "sbx-smoke", metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		got, err := sandboxes.Get(ctx, "sbx-smoke", metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		ready := meta.IsStatusConditionTrue(got.Status.Conditions, string(v1beta1.SandboxConditionReady))
		podUID = string(p.UID)
		return p.Status.Phase == corev1.PodRunning && podReady(p) && ready, fmt.Errorf("pod %s, sandbox conditions %v", p.Status.Phase, got.Status.Conditions)
	})
	list, err := pods.List(ctx, metav1.ListOptions{})
	if err != nil || len(list.Items) != 1 {
		t.Fatalf("want exactly one pod, got %d (%v)", len(list.Items), err)
	}
	if ip, err := netip.ParseAddr(list.Items[0].Status.PodIP); err != nil || !netip.MustParsePrefix(c.PodCIDR).Contains(ip) {
		t.Fatalf("pod IP %q is not in %s", list.Items[0].Status.PodIP, c.PodCIDR)
	}

	patch := func(mode v1beta1.SandboxOperatingMode) {
		t.Helper()
		body := fmt.Sprintf(`{"spec":{"operatingMode":%q}}`, mode)
		if _, err := sandboxes.Patch(ctx, "sbx-smoke", "application/merge-patch+json", []byte(body), metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	patch(v1beta1.SandboxOperatingModeSuspended)
	eventually.Within(t, "Suspended removes the pod", 60*time.Second, func() (bool, error) {
		_, err := pods.Get(ctx, "sbx-smoke", metav1.GetOptions{})
		return apierrors.IsNotFound(err), err
	})
	patch(v1beta1.SandboxOperatingModeRunning)
	eventually.Within(t, "Running creates a replacement pod", 60*time.Second, func() (bool, error) {
		p, err := pods.Get(ctx, "sbx-smoke", metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		return string(p.UID) != podUID && podReady(p), nil
	})

	if err := sandboxes.Delete(ctx, "sbx-smoke", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually.Within(t, "deleting the Sandbox collects its pod", 60*time.Second, func() (bool, error) {
		l, err := pods.List(ctx, metav1.ListOptions{})
		return err == nil && len(l.Items) == 0, err
	})
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// TestKilledRunLeavesNothing starts a cluster from a child process, kills
// that process with SIGKILL (no cleanup runs), and checks that the reaper
// ends every cluster process and removes the work directory.
func TestKilledRunLeavesNothing(t *testing.T) { killedRun(t, false) }

// TestKilledRealNodeLeavesNothing is TestKilledRunLeavesNothing with the
// real node and a pod running on it under gVisor: after the SIGKILL no
// process, mount, cgroup, bridge or changed sysctl of the node is left,
// its directory is gone, and the machine's real node lock is free.
func TestKilledRealNodeLeavesNothing(t *testing.T) {
	if os.Getenv("HILOOP_K8STEST_CHILD") != "1" {
		if err := localcluster.RealNodeSupported(os.Getenv("HILOOP_CLUSTER_BIN")); err != nil {
			if os.Geteuid() != 0 {
				t.Skipf("no real node on this machine: %v", err)
			}
			t.Fatal(err)
		}
	}
	killedRun(t, true)
}

func killedRun(t *testing.T, real bool) {
	name := "^" + t.Name() + "$"
	if os.Getenv("HILOOP_K8STEST_CHILD") == "1" {
		ctx := context.Background()
		c, err := localcluster.Start(ctx, localcluster.Options{RealNode: real})
		if err != nil {
			fmt.Println("ERR", err)
			os.Exit(1)
		}
		if real {
			if out, err := c.Kubectl(ctx, "run", "probe", "--image=busybox", `--overrides={"spec":{"runtimeClassName":"gvisor"}}`); err != nil {
				fmt.Println("ERR", err, out)
				os.Exit(1)
			}
			if out, err := c.Kubectl(ctx, "wait", "--for=condition=Ready", "pod/probe", "--timeout=120s"); err != nil {
				fmt.Println("ERR", err, out)
				os.Exit(1)
			}
			fmt.Println("NODEDIR", c.NodeDir())
		}
		fmt.Println("WORKDIR", c.Workdir)
		time.Sleep(time.Hour)
		return
	}
	cmd := exec.Command(os.Args[0], "-test.run="+name)
	cmd.Env = append(os.Environ(), "HILOOP_K8STEST_CHILD=1")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var workdir, nodedir string
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		if w, ok := strings.CutPrefix(sc.Text(), "NODEDIR "); ok {
			nodedir = w
			continue
		}
		if w, ok := strings.CutPrefix(sc.Text(), "WORKDIR "); ok {
			workdir = w
			break
		}
		t.Log(sc.Text())
	}
	if workdir == "" {
		cmd.Process.Kill()
		cmd.Wait()
		t.Fatal("child did not start a cluster")
	}
	if n := processesMentioning(workdir); len(n) < 5 {
		t.Fatalf("expected the control plane running under %s, found %v", workdir, n)
	}
	// What the node found before it changed the machine's settings, and
	// must put back (another suite's node may have run before this one).
	var sysctls string
	if real {
		raw, err := os.ReadFile(filepath.Join(nodedir, "sysctl.saved"))
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(strings.TrimSpace(string(raw)), "\n") {
			key, value, _ := strings.Cut(line, " ")
			sysctls += key + "=" + value + " "
		}
		if n := processesMentioning(nodedir); len(n) < 4 {
			t.Fatalf("expected containerd, the kubelet and a pod's gVisor sandbox running under %s, found %v", nodedir, n)
		}
		if !exists("/sys/fs/cgroup/pids/hiloop-node") || !linkExists(localcluster.RealBridge) {
			t.Fatal("the node's cgroup or bridge is missing while it runs")
		}
	}
	cmd.Process.Signal(syscall.SIGKILL)
	cmd.Wait()
	eventually.Within(t, "no cluster process left after SIGKILL", 90*time.Second, func() (bool, error) {
		left := processesMentioning(workdir)
		if real {
			left = append(left, processesMentioning(nodedir)...)
		}
		return len(left) == 0, fmt.Errorf("still running: %v", left)
	})
	eventually.Within(t, "work directory removed", 30*time.Second, func() (bool, error) {
		_, err := os.Stat(workdir)
		return os.IsNotExist(err), err
	})
	if !real {
		return
	}
	// The reaper holds the machine's real-node lock until it has torn the
	// node down. Once this test holds the lock, the teardown is over, and
	// no other test process's node (another suite may run beside this one)
	// can be mistaken for what this one left.
	lock, err := os.OpenFile(filepath.Join(os.TempDir(), "hiloop-realnode.lock"), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Close()
	eventually.Within(t, "the real node's lock, released by the reaper", 30*time.Minute, func() (bool, error) {
		err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		return err == nil, err
	})
	defer syscall.Flock(int(lock.Fd()), syscall.LOCK_UN)
	cgroups, _ := filepath.Glob("/sys/fs/cgroup/*/hiloop-node")
	mounts, _ := os.ReadFile("/proc/self/mountinfo")
	switch {
	case exists(nodedir):
		t.Errorf("%s is there", nodedir)
	case len(cgroups) > 0:
		t.Errorf("cgroups left: %v", cgroups)
	case linkExists(localcluster.RealBridge):
		t.Errorf("bridge %s left", localcluster.RealBridge)
	case bytes.Contains(mounts, []byte(nodedir)):
		t.Errorf("mounts left under %s", nodedir)
	}
	if got := readSysctls(); got != sysctls {
		t.Errorf("sysctls after the node: %q, before it: %q", got, sysctls)
	}
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

func linkExists(name string) bool { return exec.Command("ip", "link", "show", name).Run() == nil }

// readSysctls are the settings the real node changes and restores.
func readSysctls() string {
	var b strings.Builder
	for _, s := range []string{"vm/overcommit_memory", "kernel/panic", "kernel/panic_on_oops", "net/ipv4/ip_forward"} {
		v, _ := os.ReadFile(filepath.Join("/proc/sys", s))
		fmt.Fprintf(&b, "%s=%s ", s, strings.TrimSpace(string(v)))
	}
	return b.String()
}

// processesMentioning lists the command lines of processes whose command
// line or environment names dir.
func processesMentioning(dir string) []string {
	var out []string
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		cmdline, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		environ, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "environ"))
		if bytes.Contains(cmdline, []byte(dir)) || bytes.Contains(environ, []byte("KWOK_WORKDIR="+dir)) {
			out = append(out, strings.ReplaceAll(string(cmdline), "\x00", " "))
		}
	}
	return out
}

// TestAssetsMatchModules: the embedded CRD and kwok stages are what gen.go
// makes from the pinned modules.
func TestAssetsMatchModules(t *testing.T) {
	out, err := exec.Command("go", "run", "gen.go", "-check").CombinedOutput()
	if err != nil {
		t.Fatalf("assets/ is not what go generate makes: %v\n%s", err, out)
	}
}
