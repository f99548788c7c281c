package e2e_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/hiloop/hiloop/api"
	"github.com/hiloop/hiloop/internal/e2e"
)

// codeBlock finds the fenced blocks of a language in Markdown.
var codeBlock = regexp.MustCompile("(?s)```(go|python)\n(.*?)```")

// TestSDKDocExamples runs the agent loops of docs/sdk.md as they stand
// there, the Go one with go run and the Python one with the installed SDK,
// against a live server: each prints its result and leaves no sandbox
// running.
func TestSDKDocExamples(t *testing.T) {
	doc, err := os.ReadFile(e2e.Path(t, "docs/sdk.md"))
	if err != nil {
		t.Fatal(err)
	}
	blocks := map[string]string{}
	for _, m := range codeBlock.FindAllStringSubmatch(string(doc), -1) {
		if _, ok := blocks[m[1]]; !ok {
			blocks[m[1]] = m[2]
		}
	}
	if blocks["go"] == "" || blocks["python"] == "" {
		t.Fatalf("docs/sdk.md lacks a Go or a Python block: %q", blocks)
	}
	in := e2e.Serve(t, filepath.Join(t.TempDir(), "h.db"), e2e.NewNamespace(t))
	env := append(os.Environ(), "HILOOP_URL="+in.URL, "HILOOP_TOKEN="+in.Token)

	// The Go program is built inside the module, as a user's program that
	// imports the api package would be; the directory's leading _ keeps it
	// out of ./... .
	dir, err := os.MkdirTemp(e2e.Path(t, "."), "_sdkdoc-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.WriteFile(filepath.Join(dir, "main.go"), []byte(blocks["go"]), 0o644); err != nil {
		t.Fatal(err)
	}
	goRun := exec.Command("go", "run", "./"+filepath.Base(dir))
	goRun.Dir, goRun.Env = e2e.Path(t, "."), env
	script := filepath.Join(t.TempDir(), "agent.py")
	os.WriteFile(script, []byte(blocks["python"]), 0o644)
	pyRun := exec.Command("python3", script)
	pyRun.Dir, pyRun.Env = t.TempDir(), append(env, "PYTHONPATH="+installPython(t))

	for name, cmd := range map[string]*exec.Cmd{"go": goRun, "python": pyRun} {
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
	if n != 2 {
		t.Errorf("the examples made %d sandboxes, want 2", n)
	}
}
