package e2e_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/hiloop/hiloop/api"
	"github.com/hiloop/hiloop/internal/e2e"
	"github.com/hiloop/hiloop/localcluster"
)

// codeBlock finds the fenced blocks of a language in Markdown.
var codeBlock = regexp.MustCompile("(?s)```(go|python|typescript)\n(.*?)```")

// TestSDKDocExamples runs the agent loops of docs/sdk.md as they stand
// there, the Go one with go run, each Python one (blocking and asyncio)
// with the installed SDK and each TypeScript one compiled with tsc against
// the packed SDK,
// against a live server on kwok's simulated pods (whose commands run on
// this host): each prints its result and leaves no sandbox running.
func TestSDKDocExamples(t *testing.T) {
	e2e.Helpers(t)
	in := e2e.ServeInProcess(t, filepath.Join(t.TempDir(), "h.db"), e2e.NewNamespace(t),
		append(previewServeFlags(t), "--agent-image", "hiloop-agent:local")...)
	runSDKDocExamples(t, in)
}

// TestSDKDocExamplesRealNode runs them against a server on the real node,
// where their image, hiloop.local/python:3.11, is the local cluster's
// Debian Python in a gVisor pod: the doc's programs run there as written.
// A sandbox of the image then shows what the doc says of it: Python 3.11
// under gVisor's kernel, every extension module of its standard library
// importable, and busybox's applets beside it.
func TestSDKDocExamplesRealNode(t *testing.T) {
	c := e2e.NewRealCluster(t)
	in := e2e.ServeInProcessOn(t, c, filepath.Join(t.TempDir(), "h.db"), e2e.NamespaceOn(t, c),
		append(previewServeFlags(t), "--agent-image", c.AgentImage())...)
	runSDKDocExamples(t, in)

	sb := in.Create(in.Token, localcluster.PythonImage, "--wait")
	const probe = `import importlib, os, platform, sys
d = os.path.join(sys.prefix, "lib", "python3.11", "lib-dynload")
mods = sorted(f.split(".")[0] for f in os.listdir(d))
for m in mods:
    importlib.import_module(m)
print(platform.python_version(), platform.release(), len(mods))
`
	out, errOut, code := cliExec(in, in.Token, "", sb.ID, "--", "python3", "-W", "ignore", "-c", probe)
	f := strings.Fields(out)
	if code != 0 || len(f) != 3 || !strings.HasPrefix(f[0], "3.11.") || !strings.Contains(f[1], "gvisor") || f[2] == "0" {
		t.Fatalf("python3 in %s: %d %q %q", localcluster.PythonImage, code, out, errOut)
	}
	t.Logf("python %s on %s, %s extension modules imported", f[0], f[1], f[2])
	if out, errOut, code := cliExec(in, in.Token, "", sb.ID, "--", "which", "python3", "tar", "head", "wc"); code != 0 ||
		strings.Join(strings.Fields(out), " ") != "/usr/bin/python3 /bin/tar /bin/head /bin/wc" {
		t.Errorf("the image's commands: %d %q %q", code, out, errOut)
	}
}

// previewServeFlags are serve's flags for the loops that fetch through a
// preview URL: the forward transport and previews on preview.localhost at
// the port of the API's listener, which they choose, so that the URLs a
// create answers reach this server (the machine resolves *.localhost to
// loopback: testdata/preview-dns.sh).
func previewServeFlags(t testing.TB) []string {
	t.Helper()
	addr := e2e.FreeAddr(t)
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatal(err)
	}
	return []string{"--listen", addr, "--transports", "exec,ssh,forward", "--preview-domain", "preview.localhost:" + port}
}

// runSDKDocExamples runs every Go, Python and TypeScript block of
// docs/sdk.md against in, each of which must print its result and delete
// its sandbox.
func runSDKDocExamples(t *testing.T, in *e2e.Instance) {
	t.Helper()
	doc, err := os.ReadFile(e2e.Path(t, "docs/sdk.md"))
	if err != nil {
		t.Fatal(err)
	}
	blocks := map[string][]string{}
	for _, m := range codeBlock.FindAllStringSubmatch(string(doc), -1) {
		blocks[m[1]] = append(blocks[m[1]], m[2])
	}
	if len(blocks["go"]) != 1 || len(blocks["python"]) == 0 || len(blocks["typescript"]) == 0 {
		t.Fatalf("docs/sdk.md has not one Go block, a Python one and a TypeScript one: %q", blocks)
	}
	env := append(os.Environ(), "HILOOP_URL="+in.URL, "HILOOP_TOKEN="+in.Token)

	// The Go program is built inside the module, as a user's program that
	// imports the api package would be; the directory's leading _ keeps it
	// out of ./... .
	dir, err := os.MkdirTemp(e2e.Path(t, "."), "_sdkdoc-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.WriteFile(filepath.Join(dir, "main.go"), []byte(blocks["go"][0]), 0o644); err != nil {
		t.Fatal(err)
	}
	goRun := exec.Command("go", "run", "./"+filepath.Base(dir))
	goRun.Dir, goRun.Env = e2e.Path(t, "."), env
	runs := map[string]*exec.Cmd{"go": goRun}
	sdkDir := installPython(t)
	for i, block := range blocks["python"] {
		script := filepath.Join(t.TempDir(), "agent.py")
		if err := os.WriteFile(script, []byte(block), 0o644); err != nil {
			t.Fatal(err)
		}
		pyRun := exec.Command("python3", script)
		pyRun.Dir, pyRun.Env = t.TempDir(), append(env, "PYTHONPATH="+sdkDir)
		runs[fmt.Sprintf("python #%d", i+1)] = pyRun
	}

	for i, block := range blocks["typescript"] {
		tsRun := exec.Command("node", append(nodeFlags(t), typeScriptProgram(t, block))...)
		tsRun.Dir, tsRun.Env = t.TempDir(), env
		runs[fmt.Sprintf("typescript #%d", i+1)] = tsRun
	}

	for name, cmd := range runs {
		out, err := cmd.CombinedOutput()
		if err != nil || !strings.Contains(string(out), "computed 10 squares") || !strings.Contains(string(out), `result: {"sum": 285}`) {
			t.Errorf("the %s example: %v\n%s", name, err, out)
		}
	}
	c := sdk(in, in.Token)
	n := 0
	for sb, err := range c.Sandboxes(context.Background(), api.ListOptions{}) {
		if err != nil {
			t.Fatal(err)
		}
		n++
		if sb.Desired != api.ModeDeleted {
			t.Errorf("the examples left %s %s", sb.ID, sb.Desired)
		}
	}
	if n != len(runs) {
		t.Errorf("the examples made %d sandboxes, want %d", n, len(runs))
	}
}

// typeScriptProgram compiles the TypeScript source src, as a user's ES
// module that imports the packed SDK, with the SDK's locked tsc in strict
// mode, and returns the JavaScript file to run.
func typeScriptProgram(t *testing.T, src string) string {
	t.Helper()
	sdk := installTypeScript(t)
	dir := t.TempDir()
	if err := os.Symlink(filepath.Join(sdk, "node_modules"), filepath.Join(dir, "node_modules")); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "agent.mts"), []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	tsc := exec.Command("node", filepath.Join(sdk, "node_modules", "typescript", "bin", "tsc"),
		"--strict", "--target", "es2022", "--module", "nodenext", "--moduleResolution", "nodenext", "--types", "node", "agent.mts")
	tsc.Dir = dir
	if out, err := tsc.CombinedOutput(); err != nil {
		t.Fatalf("tsc agent.mts (docs/sdk.md's TypeScript block): %v\n%s", err, out)
	}
	return filepath.Join(dir, "agent.mjs")
}
