package server

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/hiloop/hiloop/api"
	"github.com/hiloop/hiloop/cluster"
	"github.com/hiloop/hiloop/control"
	"github.com/hiloop/hiloop/control/controltest"
	"github.com/hiloop/hiloop/internal/eventually"
	"github.com/hiloop/hiloop/store"
)

// localExec runs the command on this machine, as a container runtime would
// in the workload container, with PATH as given: the file scripts meet a
// real sh, head, wc and tar.
func localExec(path string, argvs *[][]string) controltest.Exec {
	return controltest.Exec{Run: func(ctx context.Context, req cluster.ExecRequest) (cluster.ExitStatus, error) {
		if argvs != nil {
			*argvs = append(*argvs, req.Command)
		}
		bin := lookPath(path, req.Command[0])
		if bin == "" {
			// What a kubelet answers for a command the image lacks.
			return cluster.ExitStatus{}, &cluster.RemoteError{Message: `OCI runtime exec failed: exec failed: unable to start container process: exec: "` + req.Command[0] + `": executable file not found in $PATH: unknown`}
		}
		cmd := exec.CommandContext(ctx, bin, req.Command[1:]...)
		cmd.Env = []string{"PATH=" + path}
		cmd.Stdin, cmd.Stdout, cmd.Stderr = req.Stdin, req.Stdout, req.Stderr
		err := cmd.Run()
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return cluster.ExitStatus{Code: ee.ExitCode()}, nil
		}
		return cluster.ExitStatus{}, err
	}}
}

func lookPath(path, name string) string {
	for _, dir := range filepath.SplitList(path) {
		if _, err := os.Stat(filepath.Join(dir, name)); err == nil {
			return filepath.Join(dir, name)
		}
	}
	return ""
}

// lingeringExec runs the command on this machine as kwok does: the command
// outlives its stream, which never closes its stdin, and is killed only
// when the test ends.
func lingeringExec(t *testing.T, path string) controltest.Exec {
	return controltest.Exec{Run: func(ctx context.Context, req cluster.ExecRequest) (cluster.ExitStatus, error) {
		cmd := exec.Command(lookPath(path, req.Command[0]), req.Command[1:]...)
		cmd.Env = []string{"PATH=" + path}
		cmd.Stdout, cmd.Stderr = req.Stdout, req.Stderr
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		if req.Stdin != nil {
			in, err := cmd.StdinPipe()
			if err != nil {
				return cluster.ExitStatus{}, err
			}
			go io.Copy(in, req.Stdin)
		}
		if err := cmd.Start(); err != nil {
			return cluster.ExitStatus{}, err
		}
		var err error
		done := make(chan struct{})
		go func() {
			err = cmd.Wait()
			close(done)
		}()
		t.Cleanup(func() {
			syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			<-done
		})
		select {
		case <-done:
			var ee *exec.ExitError
			if errors.As(err, &ee) {
				return cluster.ExitStatus{Code: ee.ExitCode()}, nil
			}
			return cluster.ExitStatus{}, err
		case <-ctx.Done():
			return cluster.ExitStatus{}, ctx.Err()
		}
	}}
}

// filesServer is a test server whose sandbox runs commands on this machine.
func filesServer(t *testing.T, path string, argvs *[][]string, opts ...func(*Options)) (*testServer, string) {
	ts := newTestServer(t, &controltest.Cluster{}, func(so *Options, co *control.Options) {
		co.Exec = localExec(path, argvs)
		for _, o := range opts {
			o(so)
		}
	})
	id := ts.create(`{"image":"busybox"}`)
	ts.db.Observe(context.Background(), id, store.Observation{State: store.StateRunning})
	return ts, id
}

func (ts *testServer) put(id, p string, body []byte, headers ...string) *httptest.ResponseRecorder {
	ts.t.Helper()
	return ts.do("PUT", "/v1/sandboxes/"+id+"/files?path="+urlEscape(p), string(body), append([]string{"Content-Type", "application/octet-stream"}, headers...)...)
}

func urlEscape(s string) string {
	var b strings.Builder
	for _, c := range []byte(s) {
		if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte("/-_.", c) >= 0 {
			b.WriteByte(c)
		} else {
			b.WriteString("%" + strings.ToUpper(hex.EncodeToString([]byte{c})))
		}
	}
	return b.String()
}

// TestFilePathsRefused: a path that is not absolute and clean, holds a
// control character, or is too long is refused with invalid_path before
// anything runs in the sandbox.
func TestFilePathsRefused(t *testing.T) {
	var argvs [][]string
	ts, id := filesServer(t, os.Getenv("PATH"), &argvs)
	for name, p := range map[string]string{
		"empty":       "",
		"relative":    "etc/passwd",
		"dot-dot":     "/tmp/../etc/passwd",
		"dot":         "/tmp/./x",
		"double":      "//tmp/x",
		"trailing":    "/tmp/x/",
		"NUL":         "/tmp/x\x00y",
		"newline":     "/tmp/x\ny",
		"escape":      "/tmp/\x1b[31mx",
		"leading -":   "-rf",
		"very long":   "/" + strings.Repeat("a", api.MaxPathBytes),
		"subshell":    "$(touch /tmp/pwned)",
		"quoted rel":  `'x'`,
		"dollar rel":  "`id`",
		"dot-dot end": "/tmp/..",
	} {
		for _, method := range []string{"PUT", "GET"} {
			rec := ts.do(method, "/v1/sandboxes/"+id+"/files?path="+urlEscape(p), "x", "Content-Type", "application/octet-stream")
			if rec.Code != http.StatusBadRequest || errCode(t, rec) != api.CodeInvalidPath {
				t.Errorf("%s %s (%q): %d %s, want 400 invalid_path", method, name, p, rec.Code, rec.Body.String())
			}
		}
	}
	if rec := ts.do("GET", "/v1/sandboxes/"+id+"/files?path=/a&path=/b", ""); errCode(t, rec) != api.CodeInvalidPath {
		t.Errorf("two paths: %d %s", rec.Code, rec.Body.String())
	}
	if len(argvs) != 0 {
		t.Errorf("refused paths ran commands: %q", argvs)
	}
}

// TestHostilePathsAreNames: quotes, $(...), backticks, spaces and a leading
// '-' in a path's components are written as the file's name, literally;
// nothing in them runs, since the path is an argument of the script, never
// part of it.
func TestHostilePathsAreNames(t *testing.T) {
	var argvs [][]string
	ts, id := filesServer(t, os.Getenv("PATH"), &argvs)
	dir := t.TempDir()
	canary := filepath.Join(dir, "pwned")
	for _, name := range []string{
		"$(touch " + canary + ")",
		"`touch " + canary + "`",
		`it's "quoted"; touch ` + canary,
		"-rf",
		"--help",
		"a b c",
		"*",
	} {
		p := filepath.Join(dir, name)
		body := []byte("content of " + name)
		if rec := ts.put(id, p, body); rec.Code != 200 {
			t.Errorf("put %q: %d %s", name, rec.Code, rec.Body.String())
			continue
		}
		got, err := os.ReadFile(p)
		if err != nil || !bytes.Equal(got, body) {
			t.Errorf("%q holds %q (%v)", name, got, err)
		}
		rec := ts.do("GET", "/v1/sandboxes/"+id+"/files?path="+urlEscape(p), "")
		if rec.Code != 200 || rec.Body.String() != string(body) {
			t.Errorf("get %q: %d %q", name, rec.Code, rec.Body.String())
		}
	}
	if _, err := os.Stat(canary); err == nil {
		t.Fatal("a path's text ran as a command")
	}
	for _, argv := range argvs {
		if argv[0] != "sh" || argv[1] != "-c" || strings.Contains(argv[2], dir) {
			t.Errorf("command %q: the script holds the path", argv)
		}
	}
}

// TestFileUploadRules: an upload needs a Content-Length (411) within the
// cap (413); mode is octal permissions, and only for a single file; what
// was written is answered with its size and sha256, and the file has the
// mode.
func TestFileUploadRules(t *testing.T) {
	ts, id := filesServer(t, os.Getenv("PATH"), nil, func(o *Options) { o.MaxFileBytes = 100 })
	dir := t.TempDir()
	p := filepath.Join(dir, "sub", "f.txt")

	req := httptest.NewRequest("PUT", "/v1/sandboxes/"+id+"/files?path="+p, strings.NewReader("abc"))
	req.ContentLength = -1
	req.Header.Set("Authorization", "Bearer "+ts.token)
	rec := httptest.NewRecorder()
	ts.srv.ServeHTTP(rec, req)
	if rec.Code != http.StatusLengthRequired || errCode(t, rec) != api.CodeLengthRequired {
		t.Errorf("no length: %d %s", rec.Code, rec.Body.String())
	}
	if rec := ts.put(id, p, bytes.Repeat([]byte("x"), 101)); rec.Code != http.StatusRequestEntityTooLarge || errCode(t, rec) != api.CodeFileTooLarge {
		t.Errorf("over the cap: %d %s", rec.Code, rec.Body.String())
	}
	for _, mode := range []string{"888", "u+x", "07777", "-1"} {
		rec := ts.do("PUT", "/v1/sandboxes/"+id+"/files?path="+p+"&mode="+urlEscape(mode), "a")
		if rec.Code != 400 || errCode(t, rec) != api.CodeInvalidField {
			t.Errorf("mode %q: %d %s", mode, rec.Code, rec.Body.String())
		}
	}
	if rec := ts.do("PUT", "/v1/sandboxes/"+id+"/files?path="+dir+"&mode=0644", "a", "Content-Type", api.TarMediaType); rec.Code != 400 || errCode(t, rec) != api.CodeInvalidField {
		t.Errorf("mode of a tar: %d %s", rec.Code, rec.Body.String())
	}

	body := []byte("hello, sandbox\n")
	rec = ts.do("PUT", "/v1/sandboxes/"+id+"/files?path="+p+"&mode=0750", string(body))
	var fi api.FileInfo
	json.Unmarshal(rec.Body.Bytes(), &fi)
	sum := sha256.Sum256(body)
	if rec.Code != 200 || fi.Path != p || fi.Size != int64(len(body)) || fi.SHA256 != hex.EncodeToString(sum[:]) {
		t.Fatalf("put: %d %s", rec.Code, rec.Body.String())
	}
	st, err := os.Stat(p)
	if err != nil || st.Mode().Perm() != 0o750 {
		t.Errorf("mode %v (%v), want 0750", st.Mode(), err)
	}
	if rec := ts.put(id, filepath.Dir(p), body); rec.Code != http.StatusConflict || errCode(t, rec) != api.CodePathConflict {
		t.Errorf("a file over a directory: %d %s", rec.Code, rec.Body.String())
	}
	if rec := ts.do("GET", "/v1/sandboxes/"+id+"/files?path="+dir+"/nothing", ""); rec.Code != 404 || errCode(t, rec) != api.CodeFileNotFound {
		t.Errorf("get of nothing: %d %s", rec.Code, rec.Body.String())
	}
	if rec := ts.do("GET", "/v1/sandboxes/"+id+"/files?path=/dev/null", ""); rec.Code != 409 || errCode(t, rec) != api.CodePathConflict {
		t.Errorf("get of a device: %d %s", rec.Code, rec.Body.String())
	}
	os.WriteFile(filepath.Join(dir, "big"), bytes.Repeat([]byte("x"), 101), 0o644)
	if rec := ts.do("GET", "/v1/sandboxes/"+id+"/files?path="+dir+"/big", ""); rec.Code != 413 || errCode(t, rec) != api.CodeFileTooLarge {
		t.Errorf("get over the cap: %d %s", rec.Code, rec.Body.String())
	}
}

// TestFilesWithoutTarOrShell: in an image without tar a directory is
// refused with tar_unavailable while a single file still goes through; in
// one without sh (or its utilities) every transfer is refused with
// shell_unavailable.
func TestFilesWithoutTarOrShell(t *testing.T) {
	bin := t.TempDir()
	for _, tool := range []string{"sh", "head", "ls", "mkdir", "chmod", "mv", "rm"} {
		full, err := exec.LookPath(tool)
		if err != nil {
			t.Fatal(err)
		}
		os.Symlink(full, filepath.Join(bin, tool))
	}
	ts, id := filesServer(t, bin, nil)
	dir := t.TempDir()
	if rec := ts.put(id, dir+"/f", []byte("x")); rec.Code != 200 {
		t.Errorf("a file without tar: %d %s", rec.Code, rec.Body.String())
	}
	if rec := ts.do("PUT", "/v1/sandboxes/"+id+"/files?path="+dir+"/d", "x", "Content-Type", api.TarMediaType); rec.Code != 422 || errCode(t, rec) != api.CodeTarUnavailable {
		t.Errorf("a tar without tar: %d %s", rec.Code, rec.Body.String())
	}
	if rec := ts.do("GET", "/v1/sandboxes/"+id+"/files?path="+dir, ""); rec.Code != 422 || errCode(t, rec) != api.CodeTarUnavailable {
		t.Errorf("a directory without tar: %d %s", rec.Code, rec.Body.String())
	}

	onlySh := t.TempDir()
	os.Symlink(filepath.Join(bin, "sh"), filepath.Join(onlySh, "sh"))
	for what, path := range map[string]string{"no sh": t.TempDir(), "sh alone": onlySh} {
		ts, id := filesServer(t, path, nil)
		if rec := ts.put(id, dir+"/g", []byte("x")); rec.Code != 422 || errCode(t, rec) != api.CodeShellUnavailable {
			t.Errorf("%s: put: %d %s", what, rec.Code, rec.Body.String())
		}
		if rec := ts.do("GET", "/v1/sandboxes/"+id+"/files?path="+dir+"/f", ""); rec.Code != 422 || errCode(t, rec) != api.CodeShellUnavailable {
			t.Errorf("%s: get: %d %s", what, rec.Code, rec.Body.String())
		}
	}
}

// TestFilesOtherOrganization: another organization's sandbox is not found
// for a file, either way, and nothing runs in it.
func TestFilesOtherOrganization(t *testing.T) {
	var argvs [][]string
	ts, id := filesServer(t, os.Getenv("PATH"), &argvs)
	ctx := context.Background()
	orgB, err := ts.db.CreateOrg(ctx, "b", 10, 10)
	if err != nil {
		t.Fatal(err)
	}
	_, secretB, err := ts.db.CreateKey(ctx, orgB.ID, "b")
	if err != nil {
		t.Fatal(err)
	}
	b := *ts
	b.token = secretB
	idB := b.create(`{"image":"busybox"}`)
	ts.db.Observe(ctx, idB, store.Observation{State: store.StateRunning})
	p := filepath.Join(t.TempDir(), "f")
	for _, c := range []struct {
		who *testServer
		id  string
	}{{&b, id}, {ts, idB}} {
		for _, rec := range []*httptest.ResponseRecorder{c.who.put(c.id, p, []byte("x")), c.who.do("GET", "/v1/sandboxes/"+c.id+"/files?path="+p, "")} {
			if rec.Code != 404 || errCode(t, rec) != api.CodeNotFound {
				t.Errorf("another organization's sandbox: %d %s", rec.Code, rec.Body.String())
			}
		}
	}
	if len(argvs) != 0 {
		t.Errorf("commands ran in another organization's sandbox: %q", argvs)
	}
}

// TestCutUploadLeavesFileWhole: an upload whose connection is cut halfway
// leaves the old file whole at its path, and no temporary file beside it.
func TestCutUploadLeavesFileWhole(t *testing.T) {
	ts, id := filesServer(t, os.Getenv("PATH"), nil)
	hs := httptest.NewServer(ts.srv)
	defer hs.Close()
	dir := t.TempDir()
	p := filepath.Join(dir, "f")
	old := bytes.Repeat([]byte("old "), 1000)
	if rec := ts.put(id, p, old); rec.Code != 200 {
		t.Fatalf("put: %d %s", rec.Code, rec.Body.String())
	}
	conn, err := net.Dial("tcp", strings.TrimPrefix(hs.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(conn, "PUT /v1/sandboxes/%s/files?path=%s HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nContent-Length: 1000000\r\n\r\n", id, p, ts.token)
	conn.Write(bytes.Repeat([]byte("new "), 100000))
	// Cut once the upload is under way in the sandbox: its temporary file
	// is there beside the old one.
	eventually.True(t, "the upload's temporary file made", func() bool {
		entries, _ := os.ReadDir(dir)
		return len(entries) == 2
	})
	conn.Close()
	eventually.True(t, "the cut upload's temporary file removed", func() bool {
		entries, _ := os.ReadDir(dir)
		return len(entries) == 1
	})
	got, err := os.ReadFile(p)
	if err != nil || !bytes.Equal(got, old) {
		t.Errorf("after a cut upload the file holds %d bytes (%v), want the old %d", len(got), err, len(old))
	}
}

// TestCutUploadCommandOutlivesStream: where the upload's command outlives
// its stream and never sees stdin's end (kwok), and is slow to open its
// temporary file, a cut upload still leaves no temporary file: the file is
// removed only after the command opened it.
func TestCutUploadCommandOutlivesStream(t *testing.T) {
	// mkdir is slow, and head says when it starts, which is after the
	// shell opened the temporary file.
	bin, dir := t.TempDir(), t.TempDir()
	for _, tool := range []string{"sh", "ls", "chmod", "mv", "rm", "sleep", "touch"} {
		if err := os.Symlink(lookPath(os.Getenv("PATH"), tool), filepath.Join(bin, tool)); err != nil {
			t.Fatal(err)
		}
	}
	started := filepath.Join(t.TempDir(), "head-started")
	os.WriteFile(filepath.Join(bin, "mkdir"), []byte("#!/bin/sh\nsleep 1\nexec "+lookPath(os.Getenv("PATH"), "mkdir")+` "$@"`+"\n"), 0o755)
	os.WriteFile(filepath.Join(bin, "head"), []byte("#!/bin/sh\ntouch "+started+"\nexec "+lookPath(os.Getenv("PATH"), "head")+` "$@"`+"\n"), 0o755)
	ts := newTestServer(t, &controltest.Cluster{}, func(so *Options, co *control.Options) {
		co.Exec = lingeringExec(t, bin)
	})
	id := ts.create(`{"image":"busybox"}`)
	ts.db.Observe(context.Background(), id, store.Observation{State: store.StateRunning})
	hs := httptest.NewServer(ts.srv)
	defer hs.Close()

	conn, err := net.Dial("tcp", strings.TrimPrefix(hs.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprintf(conn, "PUT /v1/sandboxes/%s/files?path=%s HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nContent-Length: 1000\r\n\r\n", id, filepath.Join(dir, "f"), ts.token)
	conn.Write([]byte("new "))
	conn.(*net.TCPConn).CloseWrite()
	// The answer comes once the cut upload was cleaned up.
	answer, err := io.ReadAll(conn)
	if err != nil || !bytes.Contains(answer, []byte(api.CodeUploadIncomplete)) {
		t.Fatalf("the cut upload's answer: %q %v", answer, err)
	}
	eventually.True(t, "the upload's command to open its temporary file", func() bool {
		_, err := os.Stat(started)
		return err == nil
	})
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Errorf("a cut upload left %v", entries)
	}
}

// TestFilesAdmittedAsExec: a file transfer is an exec session: refused in
// a sandbox that is not running or is quarantined, and past the session
// limit, as an exec is, with nothing run.
func TestFilesAdmittedAsExec(t *testing.T) {
	var argvs [][]string
	hold, held := make(chan struct{}), make(chan struct{})
	ts := newTestServer(t, &controltest.Cluster{}, func(so *Options, co *control.Options) {
		local := localExec(os.Getenv("PATH"), &argvs)
		co.Exec = controltest.Exec{Run: func(ctx context.Context, req cluster.ExecRequest) (cluster.ExitStatus, error) {
			if req.Command[0] == "hold" {
				close(held)
				<-hold
				return cluster.ExitStatus{}, nil
			}
			return local.Run(ctx, req)
		}}
		co.Limits = control.Limits{PerSandbox: 1, PerOrg: 10}
	})
	ctx := context.Background()
	p := filepath.Join(t.TempDir(), "f")
	stopped := ts.create(`{"image":"busybox"}`)
	if rec := ts.put(stopped, p, []byte("x")); rec.Code != 409 || errCode(t, rec) != api.CodeSandboxNotRunning {
		t.Errorf("a sandbox not running: %d %s", rec.Code, rec.Body.String())
	}
	quarantined := ts.create(`{"image":"busybox"}`)
	ts.db.Observe(ctx, quarantined, store.Observation{State: store.StateQuarantined, Anomaly: "foreign_pod"})
	if rec := ts.do("GET", "/v1/sandboxes/"+quarantined+"/files?path="+p, ""); rec.Code != 409 || errCode(t, rec) != api.CodeSandboxQuarantined {
		t.Errorf("a quarantined sandbox: %d %s", rec.Code, rec.Body.String())
	}
	busy := ts.create(`{"image":"busybox"}`)
	ts.db.Observe(ctx, busy, store.Observation{State: store.StateRunning})
	done := make(chan int)
	go func() {
		done <- ts.do("POST", "/v1/sandboxes/"+busy+"/exec/run", `{"command":["hold"]}`).Code
	}()
	<-held
	if rec := ts.put(busy, p, []byte("x")); rec.Code != 429 || errCode(t, rec) != api.CodeExecLimit {
		t.Errorf("past the session limit: %d %s", rec.Code, rec.Body.String())
	}
	close(hold)
	<-done
	if len(argvs) != 0 {
		t.Errorf("refused transfers ran commands: %q", argvs)
	}
	if rec := ts.put(busy, p, []byte("x")); rec.Code != 200 {
		t.Errorf("once the slot is free: %d %s", rec.Code, rec.Body.String())
	}
}
