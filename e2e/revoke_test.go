package e2e_test

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hiloop/hiloop/internal/e2e"
	"github.com/hiloop/hiloop/internal/eventually"
)

// TestSSHControlMasterRevoked: an OpenSSH master connection
// (ControlMaster, ControlPersist) outlives every command it runs, and would
// be a way in for as long as it stays open. Deleting its key through the
// CLI closes it: `ssh -O check` fails, and a new ssh through the control
// path is refused.
func TestSSHControlMasterRevoked(t *testing.T) {
	requireSSH(t)
	// Keepalives every minute: the master is closed by the gateway on the
	// delete, long before keepalives could notice anything.
	in := e2e.ServeInProcess(t, filepath.Join(t.TempDir(), "h.db"), e2e.NewNamespace(t), "--ssh-keepalive", "1m")
	sb := in.Create(in.Token, "busybox", "--wait")
	u := newSSHUser(t, in, in.Token)

	// A socket path must fit in sun_path (108 bytes).
	dir, err := os.MkdirTemp("", "cm")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	mux := func(extra ...string) []string {
		return u.args(append([]string{"-o", "ControlPath=" + filepath.Join(dir, "m"), "-o", "ControlPersist=yes"}, extra...)...)
	}
	check := func() (string, int) {
		_, errOut, code := u.ssh("", mux("-O", "check", sb.ID+"@127.0.0.1")...)
		return errOut, code
	}

	out, errOut, code := u.ssh("", mux("-o", "ControlMaster=yes", sb.ID+"@127.0.0.1", "echo first")...)
	if code != 0 || out != "first\n" {
		t.Fatalf("the first command through the new master: code %d out %q err %q", code, out, errOut)
	}
	status, code := check()
	m := regexp.MustCompile(`Master running \(pid=(\d+)\)`).FindStringSubmatch(status)
	if code != 0 || m == nil {
		t.Fatalf("ssh -O check after the first command: %d %q", code, status)
	}
	pid, _ := strconv.Atoi(m[1])
	// Whatever happens, the master does not outlive the test.
	t.Cleanup(func() { syscall.Kill(pid, syscall.SIGKILL) })
	out, errOut, code = u.ssh("", mux("-o", "ControlMaster=no", sb.ID+"@127.0.0.1", "echo second")...)
	if code != 0 || out != "second\n" {
		t.Fatalf("a second command through the master: code %d out %q err %q", code, out, errOut)
	}

	deleted := time.Now()
	in.MustCLI(in.Token, "ssh-key", "delete", keyID(t, in, in.Token, u.key))
	eventually.Within(t, "the master connection closed", 20*time.Second, func() (bool, error) {
		status, code := check()
		return code != 0, fmt.Errorf("ssh -O check: %d %q", code, status)
	})
	t.Logf("the master connection was gone %v after the delete", time.Since(deleted).Round(10*time.Millisecond))

	_, errOut, code = u.ssh("", mux("-o", "ControlMaster=no", sb.ID+"@127.0.0.1", "echo third")...)
	if code != 255 || !strings.Contains(errOut, "Permission denied") {
		t.Fatalf("a new ssh through the control path after the delete: code %d err %q", code, errOut)
	}
	if !regexp.MustCompile(`msg="ssh connection closed by the core" .*sandbox=` + sb.ID + ` .*cause="` + regexp.QuoteMeta("the key this session authenticated with was revoked")).MatchString(in.Out.String()) {
		t.Errorf("serve did not log why it closed the connection:\n%s", in.Out.String())
	}
}
