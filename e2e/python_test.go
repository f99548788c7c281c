package e2e_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/hiloop/hiloop/internal/e2e"
)

// installPython installs the Python SDK as a user would (pip, from the
// tree, without an index) into a directory of its own, and returns it.
func installPython(t testing.TB) string {
	t.Helper()
	target := t.TempDir()
	cmd := exec.Command("python3", "-m", "pip", "install", "--quiet", "--no-deps", "--no-index", "--target", target, e2e.Path(t, "sdk/python"))
	cmd.Dir = t.TempDir()
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("pip install ./sdk/python: %v\n%s", err, out)
	}
	return target
}

// unittest runs the Python SDK's suite (sdk/python/tests) with the
// installed SDK and env, and fails t with its output when it fails.
func unittest(t *testing.T, sdk string, env ...string) string {
	t.Helper()
	tests := e2e.Path(t, "sdk/python/tests")
	cmd := exec.Command("python3", "-m", "unittest", "discover", "-v", "-s", tests, "-t", tests)
	cmd.Dir = t.TempDir() // so the tree's own copy is not what is imported
	cmd.Env = append(os.Environ(), append([]string{"PYTHONPATH=" + sdk, "PYTHONDONTWRITEBYTECODE=1"}, env...)...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("python3 -m unittest: %v\n%s", err, out)
	}
	return string(out)
}

// TestPythonSDK runs the Python SDK's unittest suite against a live
// hiloop serve on the local cluster, with previews on (the forward
// transport, preview.localhost: HILOOP_TEST_PREVIEWS) and a second
// organization's key for the isolation tests.
func TestPythonSDK(t *testing.T) {
	sdk := installPython(t)
	if got, err := os.ReadDir(filepath.Join(sdk, "hiloop")); err != nil || len(got) == 0 {
		t.Fatalf("pip installed no package hiloop: %v", err)
	}
	e2e.Helpers(t)
	in := e2e.ServeInProcess(t, filepath.Join(t.TempDir(), "h.db"), e2e.NewNamespace(t),
		append(previewServeFlags(t), "--agent-image", "hiloop-agent:local")...)
	out := unittest(t, sdk, "HILOOP_URL="+in.URL, "HILOOP_TOKEN="+in.Token, "HILOOP_TEST_TOKEN_B="+in.NewOrg("py-b", 5, 5),
		"HILOOP_TEST_PREVIEWS=1")
	if strings.Contains(out, "skipped 'needs a live hiloop (HILOOP_URL") {
		t.Errorf("the live tests were skipped:\n%s", out)
	}
	t.Log(out)
}
