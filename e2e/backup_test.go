package e2e_test

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hiloop/hiloop/internal/e2e"
	"github.com/hiloop/hiloop/internal/eventually"
	"github.com/hiloop/hiloop/k8s"
)

// TestBackupAndRestore takes an online backup while serve runs, changes the
// cluster after it, and restores it as docs/operations.md says (stop, copy
// into place, start): the mirror reports the object the backup never knew
// as an orphan, a record whose object vanished becomes lost, and the API
// key, the SSH key and the SSH host key survive.
func TestBackupAndRestore(t *testing.T) {
	requireSSH(t)
	in := e2e.ServeInProcess(t, filepath.Join(t.TempDir(), "h.db"), e2e.NewNamespace(t))
	kept := in.Create(in.Token, "busybox", "--wait")
	gone := in.Create(in.Token, "busybox", "--wait")
	u := newSSHUser(t, in, in.Token)
	hostKey := func(in *e2e.Instance) string {
		_, body := in.Call(in.Token, "GET", "/v1/ssh/host-key", "")
		var hk struct{ Fingerprint string }
		json.Unmarshal([]byte(body), &hk)
		return hk.Fingerprint
	}
	fp := hostKey(in)

	backup := filepath.Join(t.TempDir(), "backup.db")
	if out := in.MustCLI("", "backup", "--db", in.DB, backup); !strings.Contains(out, "integrity ok") {
		t.Fatalf("backup: %s", out)
	}
	// The same to stdout, as `kubectl exec` takes it out of a pod whose
	// image has no tar; the restore below uses this copy.
	streamed, errOut, code := in.CLI("", "backup", "--db", in.DB, "-")
	if code != 0 || !strings.HasPrefix(streamed, "SQLite format 3\x00") || !strings.Contains(errOut, "integrity ok") {
		t.Fatalf("backup to stdout: exit %d, %d bytes, %q", code, len(streamed), errOut)
	}
	// After the backup: a sandbox it does not know, and one whose object
	// goes behind hiloop's back.
	orphan := in.Create(in.Token, "busybox", "--wait")
	e2e.Kubectl(t, "delete", "sandbox", "-n", in.NS, k8s.ObjectName(gone.ID), "--wait=false")
	in.Stop()

	for _, f := range []string{in.DB, in.DB + "-wal", in.DB + "-shm"} {
		os.Remove(f)
	}
	if err := os.WriteFile(in.DB, []byte(streamed), 0o600); err != nil {
		t.Fatal(err)
	}
	again := e2e.ServeInProcess(t, in.DB, in.NS)
	if again.NewKey {
		t.Fatal("the restored record issued a new admin key")
	}
	again.Token = in.Token
	again.WaitState(in.Token, kept.ID, "running")
	again.WaitState(in.Token, gone.ID, "lost")
	eventually.Within(t, "the orphan reported", 10*time.Second, func() (bool, error) {
		out := again.Out.String()
		return strings.Contains(out, "no record knows") && strings.Contains(out, k8s.ObjectName(orphan.ID)), fmt.Errorf("log:\n%s", out)
	})
	if got := hostKey(again); got != fp || fp == "" {
		t.Fatalf("host key %q after restore, was %q", got, fp)
	}
	u.in = again
	if out, errOut, code := u.run(kept.ID, "echo restored"); code != 0 || out != "restored\n" {
		t.Fatalf("ssh after restore with the pinned host key: %d %q %q", code, out, errOut)
	}
}
