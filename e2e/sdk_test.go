package e2e_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hiloop/hiloop/api"
	"github.com/hiloop/hiloop/internal/e2e"
	"github.com/hiloop/hiloop/internal/eventually"
	"github.com/hiloop/hiloop/localcluster"
)

// noTarNamespace returns the namespace whose pods' commands run without tar
// on their PATH, made on first use.
func noTarNamespace(t testing.TB) string {
	t.Helper()
	c := e2e.SharedCluster(t)
	noTarMu.Lock()
	defer noTarMu.Unlock()
	if !noTarMade {
		if err := c.AddSandboxNamespace(context.Background(), localcluster.NoTarNamespace); err != nil {
			t.Fatal(err)
		}
		noTarMade = true
	}
	return localcluster.NoTarNamespace
}

var (
	noTarMu   sync.Mutex
	noTarMade bool
)

// sdk is a Go client of in with key token.
func sdk(in *e2e.Instance, token string) *api.Client {
	return &api.Client{URL: in.URL, Token: token}
}

// runningSandbox creates a sandbox through the SDK and waits for it.
func runningSandbox(t *testing.T, c *api.Client) api.Sandbox {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	sb, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{Image: "busybox", TTL: "1h"}, "")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.DeleteSandbox(context.Background(), sb.ID) })
	sb, err = c.Wait(ctx, sb.ID, api.StateRunning)
	if err != nil {
		t.Fatal(err)
	}
	return sb
}

// randomReader is size reproducible bytes from seed.
func randomReader(seed uint64, size int64) io.Reader {
	return io.LimitReader(rand.NewChaCha8([32]byte{byte(seed)}), size)
}

func sha(r io.Reader) (string, int64, error) {
	h := sha256.New()
	n, err := io.Copy(h, r)
	return hex.EncodeToString(h.Sum(nil)), n, err
}

// TestGoSDK drives a sandbox through package api against the local
// cluster: create and wait, one-shot commands and their exact exit codes
// (0, 3, 137 for a SIGKILL, a timeout), a streaming exec, a 100 MiB file
// in and out, a directory in and out, an upload cut halfway, and another
// organization's sandbox, which is not found either way.
func TestGoSDK(t *testing.T) {
	in := e2e.ServeInProcess(t, filepath.Join(t.TempDir(), "h.db"), e2e.NewNamespace(t))
	c := sdk(in, in.Token)
	ctx := context.Background()
	sb := runningSandbox(t, c)
	work := t.TempDir()

	t.Run("run", func(t *testing.T) {
		for _, tc := range []struct {
			script string
			code   int
			signal string
		}{{"echo out; echo err >&2", 0, ""}, {"exit 3", 3, ""}, {"kill -9 $$", 137, "killed"}} {
			res, err := c.Run(ctx, sb.ID, api.ExecRunRequest{Command: []string{"sh", "-c", tc.script}})
			if err != nil || res.ExitCode == nil || *res.ExitCode != tc.code || res.Signal != tc.signal || res.TimedOut {
				t.Errorf("%q: %+v %v, want exit %d", tc.script, res, err, tc.code)
			}
			if tc.code == 0 && (res.Stdout != "out\n" || res.Stderr != "err\n") {
				t.Errorf("output %q %q", res.Stdout, res.Stderr)
			}
		}
		res, err := c.Run(ctx, sb.ID, api.ExecRunRequest{Command: []string{"sleep", "30"}, Timeout: "1s"})
		if err != nil || !res.TimedOut || res.ExitCode != nil {
			t.Errorf("a command past its timeout: %+v %v", res, err)
		}
	})

	t.Run("exec", func(t *testing.T) {
		var out, errOut bytes.Buffer
		st, err := c.Exec(ctx, sb.ID, api.ExecOptions{Command: []string{"sh", "-c", "for i in 1 2 3; do echo $i; done; echo e >&2; exit 3"}, Stdout: &out, Stderr: &errOut})
		if err != nil || st.Code != 3 || out.String() != "1\n2\n3\n" || errOut.String() != "e\n" {
			t.Errorf("exec: %+v %v, stdout %q stderr %q", st, err, out.String(), errOut.String())
		}
		_, err = c.Exec(ctx, sb.ID, api.ExecOptions{Command: []string{"sleep", "30"}, Timeout: time.Second})
		if api.ErrorCode(err) != api.CodeExecTimeout {
			t.Errorf("exec past its timeout: %v", err)
		}
	})

	t.Run("100MiB", func(t *testing.T) {
		const size = 100 << 20
		p := work + "/big.bin"
		want, _, _ := sha(randomReader(1, size))
		fi, err := c.WriteFile(ctx, sb.ID, p, randomReader(1, size), size, 0o600)
		if err != nil || fi.Size != size || fi.SHA256 != want {
			t.Fatalf("write: %+v %v, want sha256 %s", fi, err, want)
		}
		fr, err := c.ReadFile(ctx, sb.ID, p)
		if err != nil {
			t.Fatal(err)
		}
		defer fr.Close()
		got, n, err := sha(fr)
		if err != nil || n != size || got != want || fr.Size != size || fr.Dir {
			t.Errorf("read back %d bytes (announced %d), sha256 %s, %v; want %s", n, fr.Size, got, err, want)
		}
	})

	t.Run("cli progress", func(t *testing.T) {
		// On a terminal, a large copy shows a progress bar on stderr.
		out := filepath.Join(t.TempDir(), "big.bin")
		term := e2e.Tmux(t, 120, 20, fmt.Sprintf("HILOOP_URL=%s HILOOP_TOKEN=%s %s sandbox cp %s:%s %s; echo EXIT=$?; sleep 60",
			in.URL, in.Token, e2e.Binary(t), sb.ID, work+"/big.bin", out))
		eventually.Within(t, "the copy to end", 2*time.Minute, func() (bool, error) {
			screen := term.Screen()
			return strings.Contains(screen, "EXIT="), errors.New(screen)
		})
		screen := term.Screen()
		if !strings.Contains(screen, "EXIT=0") || !strings.Contains(screen, "download big.bin [") || !strings.Contains(screen, "100%") || !strings.Contains(screen, "MiB/s") {
			t.Errorf("no progress bar on the terminal:\n%s", screen)
		}
	})

	t.Run("directory", func(t *testing.T) {
		local := t.TempDir()
		files := map[string]string{"a.txt": "a", "sub/b.txt": "bee", "sub/deeper/c.py": "print(1)\n", "empty": ""}
		for name, content := range files {
			os.MkdirAll(filepath.Join(local, filepath.Dir(name)), 0o755)
			os.WriteFile(filepath.Join(local, name), []byte(content), 0o644)
		}
		if _, err := c.UploadDir(ctx, sb.ID, local, work+"/tree"); err != nil {
			t.Fatal(err)
		}
		back := filepath.Join(t.TempDir(), "back")
		if err := c.DownloadDir(ctx, sb.ID, work+"/tree", back, api.ExtractOptions{}); err != nil {
			t.Fatal(err)
		}
		for name, content := range files {
			got, err := os.ReadFile(filepath.Join(back, name))
			if err != nil || string(got) != content {
				t.Errorf("%s came back as %q (%v), want %q", name, got, err, content)
			}
		}
		if _, err := c.ReadFile(ctx, sb.ID, work+"/nothing"); api.ErrorCode(err) != api.CodeFileNotFound {
			t.Errorf("read of nothing: %v", err)
		}
	})

	t.Run("cut upload", func(t *testing.T) {
		p := work + "/keep.txt"
		old := strings.Repeat("old ", 1000)
		if _, err := c.WriteFile(ctx, sb.ID, p, strings.NewReader(old), int64(len(old)), 0); err != nil {
			t.Fatal(err)
		}
		cutUpload(t, in.URL, in.Token, sb.ID, p, func() bool {
			res, err := c.Run(ctx, sb.ID, api.ExecRunRequest{Command: []string{"ls", "-a", work}})
			return err == nil && strings.Contains(res.Stdout, ".hiloop-")
		})
		eventually.Within(t, "the cut upload's temporary file removed", 20*time.Second, func() (bool, error) {
			res, err := c.Run(ctx, sb.ID, api.ExecRunRequest{Command: []string{"ls", "-a", work}})
			return err == nil && !strings.Contains(res.Stdout, ".hiloop-"), fmt.Errorf("%q %v", res.Stdout, err)
		})
		fr, err := c.ReadFile(ctx, sb.ID, p)
		if err != nil {
			t.Fatal(err)
		}
		got, _ := io.ReadAll(fr)
		fr.Close()
		if string(got) != old {
			t.Errorf("after a cut upload the file holds %d bytes, want the old %d", len(got), len(old))
		}
	})

	t.Run("other organization", func(t *testing.T) {
		b := sdk(in, in.NewOrg("sdk-b", 5, 5))
		sbB := runningSandbox(t, b)
		for _, tc := range []struct {
			who *api.Client
			id  string
		}{{b, sb.ID}, {c, sbB.ID}} {
			_, werr := tc.who.WriteFile(ctx, tc.id, work+"/x", strings.NewReader("x"), 1, 0)
			_, rerr := tc.who.ReadFile(ctx, tc.id, work+"/big.bin")
			_, xerr := tc.who.Run(ctx, tc.id, api.ExecRunRequest{Command: []string{"true"}})
			for _, err := range []error{werr, rerr, xerr} {
				if api.ErrorCode(err) != api.CodeNotFound {
					t.Errorf("another organization's sandbox: %v, want not_found", err)
				}
			}
		}
	})

	t.Run("cli cp", func(t *testing.T) {
		local := filepath.Join(t.TempDir(), "in.txt")
		os.WriteFile(local, []byte("through the CLI\n"), 0o644)
		out := filepath.Join(t.TempDir(), "out.txt")
		dir := filepath.Join(t.TempDir(), "d")
		for _, args := range [][]string{
			{local, sb.ID + ":" + work + "/cli/in.txt"},
			{sb.ID + ":" + work + "/cli/in.txt", out},
			{"-r", sb.ID + ":" + work + "/cli", dir},
		} {
			if stdout, stderr, code := in.CLI(in.Token, append([]string{"sandbox", "cp"}, args...)...); code != 0 {
				t.Fatalf("hiloop sandbox cp %q: exit %d\n%s%s", args, code, stdout, stderr)
			}
		}
		if got, _ := os.ReadFile(out); string(got) != "through the CLI\n" {
			t.Errorf("file through the CLI: %q", got)
		}
		if got, _ := os.ReadFile(filepath.Join(dir, "in.txt")); string(got) != "through the CLI\n" {
			t.Errorf("directory through the CLI: %q", got)
		}
		if _, errOut, code := in.CLI(in.Token, "sandbox", "cp", local, sb.ID+":relative"); code == 0 {
			t.Errorf("cp to a relative path: exit 0 %s", errOut)
		}
	})
}

// cutUpload starts an upload to p that announces more bytes than it
// sends, and cuts it once underway() says it reached the sandbox.
func cutUpload(t *testing.T, url, token, id, p string, underway func() bool) {
	t.Helper()
	conn, err := net.Dial("tcp", strings.TrimPrefix(url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(conn, "PUT /v1/sandboxes/%s/files?path=%s HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nContent-Length: 2000000\r\n\r\n", id, p, token)
	conn.Write(bytes.Repeat([]byte("new "), 250000))
	eventually.True(t, "the upload under way in the sandbox", underway)
	conn.Close()
}

// TestFilesWithoutTar: in a sandbox whose image has no tar, a directory is
// refused (422 tar_unavailable) both ways, while a single file goes
// through, through the Go and the Python SDK. The local cluster stands such an image in with the namespace
// whose commands run with a PATH without tar (localcluster.NoTarNamespace).
func TestFilesWithoutTar(t *testing.T) {
	in := e2e.ServeInProcess(t, filepath.Join(t.TempDir(), "h.db"), noTarNamespace(t))
	c := sdk(in, in.Token)
	ctx := context.Background()
	sb := runningSandbox(t, c)
	work := t.TempDir()
	if _, err := c.WriteFile(ctx, sb.ID, work+"/f", strings.NewReader("x"), 1, 0); err != nil {
		t.Errorf("a single file without tar: %v", err)
	}
	if _, err := c.UploadDir(ctx, sb.ID, t.TempDir(), work+"/d"); api.ErrorCode(err) != api.CodeTarUnavailable {
		t.Errorf("a directory up without tar: %v", err)
	}
	if _, err := c.ReadFile(ctx, sb.ID, work); api.ErrorCode(err) != api.CodeTarUnavailable {
		t.Errorf("a directory down without tar: %v", err)
	}
	if _, err := os.Stat(work + "/d"); err == nil {
		t.Error("the refused directory upload made its directory")
	}
	// The Python SDK meets the same refusal.
	out := unittest(t, installPython(t), "HILOOP_URL="+in.URL, "HILOOP_TOKEN="+in.Token, "HILOOP_TEST_NO_TAR=1")
	if !strings.Contains(out, "test_directory_refused_file_accepted") || strings.Contains(out, "test_directory_refused_file_accepted (test_sdk.NoTarTest.test_directory_refused_file_accepted) ... skipped") {
		t.Errorf("the Python no-tar test did not run:\n%s", out)
	}
}
