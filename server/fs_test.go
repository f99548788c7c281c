package server

import (
	"context"
	"encoding/json"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hiloop/hiloop/api"
	"github.com/hiloop/hiloop/cluster"
	"github.com/hiloop/hiloop/control"
	"github.com/hiloop/hiloop/control/controltest"
	"github.com/hiloop/hiloop/store"
)

// fsGet is a GET of the file operation op of path p.
func (ts *testServer) fsGet(id, op, p string) (int, string) {
	ts.t.Helper()
	rec := ts.do("GET", "/v1/sandboxes/"+id+"/fs/"+op+"?path="+urlEscape(p), "")
	return rec.Code, rec.Body.String()
}

// fsPost is a POST of the file operation op with body.
func (ts *testServer) fsPost(id, op, body string) (int, string) {
	ts.t.Helper()
	rec := ts.do("POST", "/v1/sandboxes/"+id+"/fs/"+op, body)
	return rec.Code, rec.Body.String()
}

func codeOf(body string) string {
	var b api.ErrorBody
	json.Unmarshal([]byte(body), &b)
	return b.Error.Code
}

func jsonString(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

// TestFSOperations: each operation through the API, with this machine's
// sh and utilities standing in for the image's: the answers, and the
// codes of what the sandbox refused.
func TestFSOperations(t *testing.T) {
	ts, id := filesServer(t, os.Getenv("PATH"), nil)
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "f"), []byte("abc"), 0o640)

	code, body := ts.fsPost(id, "mkdir", `{"path":`+jsonString(dir+"/a/b/c")+`}`)
	var e api.FileEntry
	if json.Unmarshal([]byte(body), &e); code != 200 || e.Type != api.FileTypeDir || e.Name != "c" || e.Path != dir+"/a/b/c" {
		t.Fatalf("mkdir: %d %s", code, body)
	}
	if code, body := ts.fsPost(id, "mkdir", `{"path":`+jsonString(dir+"/a/b/c")+`}`); code != 200 {
		t.Errorf("mkdir of a directory that exists: %d %s", code, body)
	}
	if code, body := ts.fsPost(id, "mkdir", `{"path":`+jsonString(dir+"/f/x")+`}`); code != 409 || codeOf(body) != api.CodePathConflict {
		t.Errorf("mkdir through a file: %d %s", code, body)
	}
	code, body = ts.fsGet(id, "stat", dir+"/f")
	if json.Unmarshal([]byte(body), &e); code != 200 || e.Type != api.FileTypeFile || e.Size != 3 || e.Mode != 0o640 || e.Path != dir+"/f" {
		t.Errorf("stat: %d %s", code, body)
	}
	if code, body := ts.fsGet(id, "stat", dir+"/none"); code != 404 || codeOf(body) != api.CodeFileNotFound {
		t.Errorf("stat of nothing: %d %s", code, body)
	}
	if code, body := ts.fsGet(id, "list", dir+"/f"); code != 409 || codeOf(body) != api.CodePathConflict {
		t.Errorf("list of a file: %d %s", code, body)
	}
	code, body = ts.fsGet(id, "list", dir)
	var l api.FileList
	if json.Unmarshal([]byte(body), &l); code != 200 || len(l.Entries) != 2 || l.Entries[0].Name != "a" || l.Entries[1].Name != "f" || l.Truncated {
		t.Errorf("list: %d %s", code, body)
	}

	// Rename: a destination that exists only with overwrite.
	os.WriteFile(filepath.Join(dir, "g"), []byte("g"), 0o644)
	if code, body := ts.fsPost(id, "rename", `{"from":`+jsonString(dir+"/f")+`,"to":`+jsonString(dir+"/g")+`}`); code != 409 || codeOf(body) != api.CodePathConflict {
		t.Errorf("rename onto a file: %d %s", code, body)
	}
	code, body = ts.fsPost(id, "rename", `{"from":`+jsonString(dir+"/f")+`,"to":`+jsonString(dir+"/g")+`,"overwrite":true}`)
	if b, _ := os.ReadFile(filepath.Join(dir, "g")); code != 200 || string(b) != "abc" {
		t.Errorf("rename with overwrite: %d %s; g holds %q", code, body, b)
	}
	if code, body := ts.fsPost(id, "rename", `{"from":`+jsonString(dir+"/a")+`,"to":`+jsonString(dir+"/new/place")+`}`); code != 200 || !strings.Contains(body, `"type": "dir"`) {
		t.Errorf("rename into missing parents: %d %s", code, body)
	}
	if code, body := ts.fsPost(id, "rename", `{"from":`+jsonString(dir+"/f")+`,"to":`+jsonString(dir+"/h")+`}`); code != 404 || codeOf(body) != api.CodeFileNotFound {
		t.Errorf("rename of nothing: %d %s", code, body)
	}

	// Remove: recursive only when asked.
	if code, body := ts.fsPost(id, "remove", `{"path":`+jsonString(dir+"/new")+`}`); code != 409 || codeOf(body) != api.CodeDirectoryNotEmpty {
		t.Errorf("remove of a directory that is not empty: %d %s", code, body)
	}
	if _, err := os.Stat(dir + "/new/place/b/c"); err != nil {
		t.Errorf("a refused remove removed: %v", err)
	}
	if code, body := ts.fsPost(id, "remove", `{"path":`+jsonString(dir+"/new")+`,"recursive":true}`); code != 204 {
		t.Errorf("recursive remove: %d %s", code, body)
	}
	if code, body := ts.fsPost(id, "remove", `{"path":`+jsonString(dir+"/g")+`}`); code != 204 {
		t.Errorf("remove of a file: %d %s", code, body)
	}
	if code, body := ts.fsPost(id, "remove", `{"path":`+jsonString(dir+"/g")+`}`); code != 404 || codeOf(body) != api.CodeFileNotFound {
		t.Errorf("remove of nothing: %d %s", code, body)
	}
	if left, _ := os.ReadDir(dir); len(left) != 0 {
		t.Errorf("left behind: %v", left)
	}
}

// TestFSBadInput: input no sandbox is given is refused before anything
// runs: paths as for files, / to remove or rename, a directory into
// itself, unknown fields and query parameters.
func TestFSBadInput(t *testing.T) {
	var argvs [][]string
	ts, id := filesServer(t, os.Getenv("PATH"), &argvs)
	for _, p := range []string{"", "rel", "/a/../b", "/a/", "/a\nb", "/" + strings.Repeat("a", api.MaxPathBytes)} {
		for _, op := range []string{"list", "stat"} {
			if code, body := ts.fsGet(id, op, p); code != 400 || codeOf(body) != api.CodeInvalidPath {
				t.Errorf("%s %q: %d %s", op, p, code, body)
			}
		}
		for _, op := range []string{"remove", "mkdir"} {
			if code, body := ts.fsPost(id, op, `{"path":`+jsonString(p)+`}`); code != 400 || codeOf(body) != api.CodeInvalidPath {
				t.Errorf("%s %q: %d %s", op, p, code, body)
			}
		}
		if code, body := ts.fsPost(id, "rename", `{"from":"/a","to":`+jsonString(p)+`}`); code != 400 || codeOf(body) != api.CodeInvalidPath || !strings.Contains(body, `"field": "to"`) {
			t.Errorf("rename to %q: %d %s", p, code, body)
		}
	}
	for _, tc := range []struct{ op, body, code string }{
		{"remove", `{"path":"/"}`, api.CodeInvalidPath},
		{"remove", `{"path":"/","recursive":true}`, api.CodeInvalidPath},
		{"rename", `{"from":"/","to":"/x"}`, api.CodeInvalidPath},
		{"rename", `{"from":"/x","to":"/"}`, api.CodeInvalidPath},
		{"rename", `{"from":"/x","to":"/x/y"}`, api.CodeInvalidPath},
		{"remove", `{"path":"/x","force":true}`, api.CodeUnknownField},
		{"mkdir", `{"path":"/x","mode":"0700"}`, api.CodeUnknownField},
		{"mkdir", `{"path":`, api.CodeInvalidJSON},
	} {
		if code, body := ts.fsPost(id, tc.op, tc.body); code != 400 || codeOf(body) != tc.code {
			t.Errorf("%s %s: %d %s, want 400 %s", tc.op, tc.body, code, body, tc.code)
		}
	}
	if rec := ts.do("GET", "/v1/sandboxes/"+id+"/fs/list?path=/tmp&all=1", ""); rec.Code != 400 || errCode(t, rec) != api.CodeUnknownField {
		t.Errorf("unknown query parameter: %d %s", rec.Code, rec.Body.String())
	}
	if rec := ts.do("POST", "/v1/sandboxes/"+id+"/fs/mkdir?path=/tmp", `{"path":"/tmp"}`); rec.Code != 400 || errCode(t, rec) != api.CodeUnknownField {
		t.Errorf("path in a POST's query: %d %s", rec.Code, rec.Body.String())
	}
	if len(argvs) != 0 {
		t.Errorf("refused input ran commands: %q", argvs)
	}
}

// hostileBin is a PATH of this machine's sh and utilities, but for stat,
// which is the script given.
func hostileBin(t *testing.T, stat string) string {
	dir := t.TempDir()
	for _, tool := range []string{"sh", "printf", "head", "yes", "rm", "rmdir", "mkdir", "mv", "cat"} {
		if full, err := exec.LookPath(tool); err == nil {
			os.Symlink(full, filepath.Join(dir, tool))
		}
	}
	if stat != "" {
		os.WriteFile(filepath.Join(dir, "stat"), []byte("#!"+filepath.Join(dir, "sh")+"\n"+stat), 0o755)
	}
	return dir
}

// TestFSHostileStat: a stat on the sandbox's PATH that lies misleads about
// nothing but the sandbox's own files: records of names the shell did not
// find are dropped, endless output is cut (the listing truncated, the
// command ended), and a record that is not one is 422, never a 5xx.
func TestFSHostileStat(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "real"), nil, 0o644)
	for _, tc := range []struct {
		name, stat string
		listCode   int
		listCheck  func(api.FileList) bool
		statCode   int
		statErr    string
		statCheck  func(api.FileEntry) bool
		statSays   string
	}{
		{name: "plants names", stat: `printf '81a4 1 1 planted\n41ed 2 2 ../../etc\n'`,
			listCode: 200, listCheck: func(l api.FileList) bool { return len(l.Entries) == 0 },
			statCode: 422, statErr: api.CodeFileOperationFailed},
		{name: "lies about sizes", stat: `on=; for f; do [ -n "$on" ] && printf '81a4 9223372036854775807 99999999999999 %s\n' "$f"; [ "$f" = -- ] && on=1; done; true`,
			listCode: 200, listCheck: func(l api.FileList) bool {
				return len(l.Entries) == 1 && l.Entries[0].Size == 1<<63-1 && l.Entries[0].MTime.Year() == 9999
			},
			statCode: 200, statCheck: func(e api.FileEntry) bool { return e.Size == 1<<63-1 }},
		{name: "endless", stat: `case "$*" in *--*) yes 81a4;; esac`, listCode: 200, listCheck: func(l api.FileList) bool { return len(l.Entries) == 0 && l.Truncated },
			statCode: 422, statErr: api.CodeFileOperationFailed},
		{name: "binary", stat: `head -c 100000 /dev/urandom`, listCode: 200, listCheck: func(l api.FileList) bool { return len(l.Entries) == 0 },
			statCode: 422, statErr: api.CodeFileOperationFailed},
		{name: "fails", stat: `case "$*" in *--*) echo "stat: \033]0;owned\007refused" >&2; exit 3;; esac`, listCode: 200, listCheck: func(l api.FileList) bool { return len(l.Entries) == 0 },
			statCode: 422, statErr: api.CodeFileOperationFailed},
		{name: "missing", stat: "", listCode: 422, statCode: 422, statErr: api.CodeShellUnavailable, statSays: "the image has no stat"},
		{name: "without -c", stat: `echo "stat: unrecognized option: c" >&2; exit 1`, listCode: 422, statCode: 422, statErr: api.CodeShellUnavailable,
			statSays: "does not take -c FORMAT"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ts, id := filesServer(t, hostileBin(t, tc.stat), nil)
			code, body := ts.fsGet(id, "list", dir)
			var l api.FileList
			json.Unmarshal([]byte(body), &l)
			if code != tc.listCode || tc.listCheck != nil && !tc.listCheck(l) {
				t.Errorf("list: %d %.300s", code, body)
			}
			code, body = ts.fsGet(id, "stat", dir+"/real")
			var e api.FileEntry
			json.Unmarshal([]byte(body), &e)
			if code != tc.statCode || tc.statErr != "" && codeOf(body) != tc.statErr || tc.statCheck != nil && !tc.statCheck(e) || !strings.Contains(body, tc.statSays) {
				t.Errorf("stat: %d %.300s", code, body)
			}
			if strings.Contains(body, `\u001b`) || strings.Contains(body, `\u0007`) {
				t.Errorf("the answer carries the sandbox's escapes: %q", body)
			}
		})
	}
}

// TestFSWake: a file operation on a sandbox stopped for idleness is
// refused without ?wake=true, saying how to wake it, and with it wakes the
// sandbox, waits for it, and runs, as a file transfer does; the POSTs take
// wake in the query too.
func TestFSWake(t *testing.T) {
	ts, _ := filesServer(t, os.Getenv("PATH"), nil)
	dir := t.TempDir()
	for _, tc := range []struct{ method, path, body string }{
		{"GET", "/fs/list?path=" + dir, ""},
		{"GET", "/fs/stat?path=" + dir, ""},
		{"POST", "/fs/mkdir", `{"path":` + jsonString(dir+"/m") + `}`},
		{"POST", "/fs/rename", `{"from":` + jsonString(dir+"/m") + `,"to":` + jsonString(dir+"/n") + `}`},
		{"POST", "/fs/remove", `{"path":` + jsonString(dir+"/n") + `}`},
	} {
		id := ts.stopIdle(ts.runningIdle())
		if rec := ts.do(tc.method, "/v1/sandboxes/"+id+tc.path, tc.body); rec.Code != 409 || errCode(t, rec) != api.CodeSandboxNotRunning || !strings.Contains(rec.Body.String(), "wake=true") {
			t.Errorf("%s %s without wake: %d %s", tc.method, tc.path, rec.Code, rec.Body.String())
		}
		sep := "?"
		if strings.Contains(tc.path, "?") {
			sep = "&"
		}
		waiting := ts.db.Waiting()
		done := make(chan *httptest.ResponseRecorder, 1)
		go func() { done <- ts.do(tc.method, "/v1/sandboxes/"+id+tc.path+sep+"wake=true", tc.body) }()
		for ts.db.Waiting() == waiting {
			select {
			case rec := <-done:
				t.Fatalf("%s %s with wake answered %d %s before it waited", tc.method, tc.path, rec.Code, rec.Body.String())
			case <-time.After(time.Millisecond):
			}
		}
		ts.db.Observe(context.Background(), id, store.Observation{State: store.StateRunning})
		if rec := <-done; rec.Code != 200 && rec.Code != 204 {
			t.Errorf("%s %s with wake: %d %s", tc.method, tc.path, rec.Code, rec.Body.String())
		}
	}
	if _, err := os.Stat(dir + "/n"); err == nil {
		t.Error("the woken remove did not remove")
	}
}

// TestFSAdmittedAsExec: every file operation is an exec session: refused
// in a sandbox that is not running or is quarantined, and past the session
// limit, as an exec is, with nothing run.
func TestFSAdmittedAsExec(t *testing.T) {
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
	stopped := ts.create(`{"image":"busybox"}`)
	quarantined := ts.create(`{"image":"busybox"}`)
	ts.db.Observe(ctx, quarantined, store.Observation{State: store.StateQuarantined, Anomaly: "foreign_pod"})
	busy := ts.create(`{"image":"busybox"}`)
	ts.db.Observe(ctx, busy, store.Observation{State: store.StateRunning})
	done := make(chan int)
	go func() {
		done <- ts.do("POST", "/v1/sandboxes/"+busy+"/exec/run", `{"command":["hold"]}`).Code
	}()
	<-held
	ops := []struct{ method, path, body string }{
		{"GET", "/fs/list?path=/tmp", ""},
		{"GET", "/fs/stat?path=/tmp", ""},
		{"POST", "/fs/mkdir", `{"path":"/tmp/x"}`},
		{"POST", "/fs/rename", `{"from":"/tmp/x","to":"/tmp/y"}`},
		{"POST", "/fs/remove", `{"path":"/tmp/y"}`},
	}
	for _, op := range ops {
		for _, tc := range []struct {
			id     string
			status int
			code   string
		}{{stopped, 409, api.CodeSandboxNotRunning}, {quarantined, 409, api.CodeSandboxQuarantined}, {busy, 429, api.CodeExecLimit}} {
			if rec := ts.do(op.method, "/v1/sandboxes/"+tc.id+op.path, op.body); rec.Code != tc.status || errCode(t, rec) != tc.code {
				t.Errorf("%s %s: %d %s, want %d %s", op.method, op.path, rec.Code, rec.Body.String(), tc.status, tc.code)
			}
		}
	}
	close(hold)
	<-done
	if len(argvs) != 0 {
		t.Errorf("refused operations ran commands: %q", argvs)
	}
	if rec := ts.do("GET", "/v1/sandboxes/"+busy+"/fs/stat?path=/tmp", ""); rec.Code != 200 {
		t.Errorf("once the slot is free: %d %s", rec.Code, rec.Body.String())
	}
}
