package e2e_test

import (
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hiloop/hiloop/internal/e2e"
	"github.com/hiloop/hiloop/internal/eventually"
)

// TestRuntimeAttestationQuarantinesKwok turns runtime attestation on for one
// serve against the simulated cluster. kwok's pods run exec commands on this
// machine, so the probe reads this host's /proc/version: exactly what a pod
// running outside gVisor shows. The sandbox is quarantined
// runtime_not_gvisor, exec and ssh are refused, and runtime_observed says
// not-gvisor with this host's kernel release. Its next pod, after a stop
// and a start, is attested again.
func TestRuntimeAttestationQuarantinesKwok(t *testing.T) {
	requireSSH(t)
	out, err := exec.Command("uname", "-r").Output()
	if err != nil {
		t.Fatal(err)
	}
	release := strings.TrimSpace(string(out))
	in := e2e.ServeInProcess(t, filepath.Join(t.TempDir(), "h.db"), e2e.NewNamespace(t), "--runtime-attestation", "--metrics-listen", "127.0.0.1:0")
	u := newSSHUser(t, in, in.Token)

	sb := in.Create(in.Token, "busybox")
	got := in.WaitState(in.Token, sb.ID, "quarantined")
	check := func(got e2e.Sandbox) {
		t.Helper()
		if got.Anomaly != "runtime_not_gvisor" || got.RuntimeObserved != "not-gvisor" || got.KernelRelease != release || got.Isolation != "gvisor" {
			t.Fatalf("quarantined %q (%s), runtime_observed %q, kernel_release %q, isolation %q; want runtime_not_gvisor, not-gvisor, %q, gvisor",
				got.Anomaly, got.Reason, got.RuntimeObserved, got.KernelRelease, got.Isolation, release)
		}
		if !strings.Contains(got.Reason, release) {
			t.Fatalf("reason %q does not name the kernel %q", got.Reason, release)
		}
	}
	check(got)

	status, body := in.Call(in.Token, "POST", "/v1/sandboxes/"+sb.ID+"/exec/run", `{"command":["true"]}`)
	if status != 409 || errorCode(t, body) != "sandbox_quarantined" {
		t.Fatalf("exec into a sandbox seen outside gVisor: %d %s", status, body)
	}
	if _, errOut, code := u.run(sb.ID, "true"); code != 255 || !strings.Contains(errOut, "quarantined") {
		t.Fatalf("ssh into a sandbox seen outside gVisor: exit %d %q", code, errOut)
	}
	shown := in.MustCLI(in.Token, "sandbox", "get", sb.ID)
	if want := "not-gvisor (kernel " + release + ")"; !strings.Contains(shown, want) {
		t.Fatalf("sandbox get does not show %q:\n%s", want, shown)
	}

	// A stop and a start make a new pod, which is attested in turn: the
	// quarantine held only the old pod.
	in.MustCLI(in.Token, "sandbox", "stop", sb.ID)
	in.WaitState(in.Token, sb.ID, "stopped")
	in.MustCLI(in.Token, "sandbox", "start", sb.ID)
	check(in.WaitState(in.Token, sb.ID, "quarantined"))
	eventually.Within(t, "two attestations counted", 30*time.Second, func() (bool, error) {
		resp, err := http.Get(in.MetricsURL)
		if err != nil {
			return false, err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			return false, err
		}
		want := `hiloop_runtime_attestations_total{result="not-gvisor"} 2`
		return strings.Contains(string(b), want), fmt.Errorf("no %s in the metrics", want)
	})
}
