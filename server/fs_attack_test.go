package server

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/hiloop/hiloop/api"
	"github.com/hiloop/hiloop/cluster"
	"github.com/hiloop/hiloop/control"
	"github.com/hiloop/hiloop/control/controltest"
	"github.com/hiloop/hiloop/internal/eventually"
	"github.com/hiloop/hiloop/store"
)

// TestFSRefusedAttacks: what a stranger sends to reach past the paths a
// file operation takes, or to confuse the decoder, is a 4xx with a stable
// code, and nothing runs in the sandbox: / spelled otherwise (//, /., a
// .. back to it), a rename into itself spelled otherwise, a key given
// twice or in another case with / last (the decoder keeps the last, and
// the check sees what the operation would), values of the wrong JSON
// type, a body past the cap, NUL or an escape in a query, and a query
// parameter given twice.
func TestFSRefusedAttacks(t *testing.T) {
	var argvs [][]string
	ts, id := filesServer(t, os.Getenv("PATH"), &argvs)
	for _, tc := range []struct {
		op, body string
		status   int
		code     string
	}{
		{"remove", `{"path":"//","recursive":true}`, 400, api.CodeInvalidPath},
		{"remove", `{"path":"/.","recursive":true}`, 400, api.CodeInvalidPath},
		{"remove", `{"path":"/tmp/..","recursive":true}`, 400, api.CodeInvalidPath},
		{"remove", `{"path":"/tmp/x","path":"/","recursive":true}`, 400, api.CodeInvalidPath},
		{"remove", `{"path":"/tmp/x","PATH":"/","recursive":true}`, 400, api.CodeInvalidPath},
		{"remove", `{"path":"/tmp/x\u0000/","recursive":true}`, 400, api.CodeInvalidPath},
		{"remove", `{"path":"/tmp/\u001b[2J"}`, 400, api.CodeInvalidPath},
		{"remove", `{"path":["/"],"recursive":true}`, 400, api.CodeInvalidField},
		{"remove", `{"path":"/tmp/x","recursive":"true"}`, 400, api.CodeInvalidField},
		{"remove", `{"path":"/tmp/x","recursive":1}`, 400, api.CodeInvalidField},
		{"remove", `{"path":null}`, 400, api.CodeInvalidPath},
		{"remove", `["/"]`, 400, api.CodeInvalidField},
		{"remove", `"/"`, 400, api.CodeInvalidField},
		{"remove", `{"path":"/tmp/x"} {"path":"/"}`, 400, api.CodeInvalidJSON},
		{"remove", ``, 400, api.CodeInvalidJSON},
		{"mkdir", `{"path":"/tmp/x/../../etc"}`, 400, api.CodeInvalidPath},
		{"mkdir", `{"path":{"$ne":""}}`, 400, api.CodeInvalidField},
		{"rename", `{"from":"//","to":"/x"}`, 400, api.CodeInvalidPath},
		{"rename", `{"from":"/x","to":"//"}`, 400, api.CodeInvalidPath},
		{"rename", `{"from":"/x","to":"/x/./y"}`, 400, api.CodeInvalidPath},
		{"rename", `{"from":"/x","to":"/x//y"}`, 400, api.CodeInvalidPath},
		{"rename", `{"from":"/x/","to":"/x/y"}`, 400, api.CodeInvalidPath},
		{"rename", `{"from":"/x","to":"/y","to":"/x/y"}`, 400, api.CodeInvalidPath},
		{"rename", `{"from":"/x","to":"/y","from":"/"}`, 400, api.CodeInvalidPath},
		{"rename", `{"from":"/x","to":"/y","overwrite":"yes"}`, 400, api.CodeInvalidField},
		{"rename", `{"from":"/x"}`, 400, api.CodeInvalidPath},
		{"mkdir", `{"path":"/` + strings.Repeat("a", int(MaxBodyBytes)) + `"}`, 413, api.CodeBodyTooLarge},
	} {
		if code, body := ts.fsPost(id, tc.op, tc.body); code != tc.status || codeOf(body) != tc.code {
			t.Errorf("%s %.80s: %d %.300s, want %d %s", tc.op, tc.body, code, body, tc.status, tc.code)
		}
	}
	for _, q := range []string{"path=/tmp%00", "path=/tmp%1b%5d0;x%07", "path=%2F%2F", "path=/tmp&path=/", "path=/tmp/%2E%2E",
		"path=/tmp&wake=maybe", "path=/tmp&wake=true&wake=false"} {
		for _, op := range []string{"list", "stat"} {
			rec := ts.do("GET", "/v1/sandboxes/"+id+"/fs/"+op+"?"+q, "")
			if rec.Code != 400 {
				t.Errorf("%s ?%s: %d %s, want 400", op, q, rec.Code, rec.Body.String())
			}
		}
	}
	if len(argvs) != 0 {
		t.Errorf("refused input ran commands: %q", argvs)
	}
}

// TestFSHostileExitStatus: a stat that exits with a status the scripts
// give a meaning, saying nothing, is still answered with a message, never
// an empty one, and never a 5xx.
func TestFSHostileExitStatus(t *testing.T) {
	dir := t.TempDir()
	for _, code := range []string{"92", "93", "94", "95", "126", "127", "1", "255"} {
		ts, id := filesServer(t, hostileBin(t, `case "$*" in *--*) exit `+code+`;; esac`), nil)
		for _, op := range []string{"stat", "list"} {
			status, body := ts.fsGet(id, op, dir)
			var b api.ErrorBody
			json.Unmarshal([]byte(body), &b)
			if op == "list" && status == 200 {
				continue // a listing drops what stat did not answer
			}
			if status < 400 || status >= 500 || b.Error.Code == "" || strings.TrimSpace(b.Error.Message) == "" {
				t.Errorf("%s with stat exiting %s: %d %s", op, code, status, body)
			}
		}
	}
}

// TestFSClientLeavingEndsTheCommand: a stat that never ends is ended when
// the client goes away, rather than holding a session slot until the
// operation's deadline: the handler returns (it waits for the command)
// with no 5xx, and no session is left open.
func TestFSClientLeavingEndsTheCommand(t *testing.T) {
	marks := t.TempDir()
	bin := hostileBin(t, `case "$*" in *--*) : > `+marks+`/started; exec sleep 100000;; esac`)
	if full, err := exec.LookPath("sleep"); err == nil {
		os.Symlink(full, filepath.Join(bin, "sleep"))
	}
	ts, id := filesServer(t, bin, nil)
	ctx, cancel := context.WithCancel(context.Background())
	req := httptest.NewRequestWithContext(ctx, "GET", "/v1/sandboxes/"+id+"/fs/stat?path=/tmp", nil)
	req.Header.Set("Authorization", "Bearer "+ts.token)
	rec := httptest.NewRecorder()
	done := make(chan struct{})
	go func() { ts.srv.ServeHTTP(rec, req); close(done) }()
	eventually.True(t, "the stat started", func() bool {
		_, err := os.Stat(marks + "/started")
		return err == nil
	})
	cancel()
	<-done
	if rec.Code >= 500 && rec.Code != 499 {
		t.Errorf("a client that left was answered %d %s", rec.Code, rec.Body.String())
	}
	var org api.Org
	if rec := ts.do("GET", "/v1/org", ""); json.Unmarshal(rec.Body.Bytes(), &org) != nil || org.Sessions == nil || org.Sessions.Open != 0 {
		t.Errorf("sessions open once the handler returned: %s", rec.Body.String())
	}
}

// TestFSHostileStatCannotFrame: a stat that prints the listing's own
// framing (a NUL, names each ended by one, an empty name, then records of
// them) adds no entry the shell did not find: its output reaches the
// listing without a NUL.
func TestFSHostileStatCannotFrame(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "real"), nil, 0o644)
	ts, id := filesServer(t, hostileBin(t, `case "$*" in *--*)
  printf '81a4 1 1 real\n\000planted\000\000'; printf '81a4 7 7 planted\n\000other\000\000'; printf '81a4 7 7 other\n';; esac`), nil)
	code, body := ts.fsGet(id, "list", dir)
	var l api.FileList
	if json.Unmarshal([]byte(body), &l); code != 200 {
		t.Fatalf("list: %d %s", code, body)
	}
	for _, e := range l.Entries {
		if e.Name != "real" {
			t.Errorf("a lying stat added %q: %s", e.Name, body)
		}
	}
}

// TestFSRenameOntoItself: a rename onto the very same directory spelled
// through a symbolic link, with overwrite, removes nothing: it is the
// rename(2) of a file onto itself, which does nothing.
func TestFSRenameOntoItself(t *testing.T) {
	ts, id := filesServer(t, os.Getenv("PATH"), nil)
	dir := t.TempDir()
	os.MkdirAll(filepath.Join(dir, "real", "empty"), 0o755)
	os.WriteFile(filepath.Join(dir, "real", "f"), []byte("keep"), 0o644)
	os.Symlink("real", filepath.Join(dir, "l"))
	for _, name := range []string{"empty", "f"} {
		code, body := ts.fsPost(id, "rename", `{"from":`+jsonString(dir+"/l/"+name)+`,"to":`+jsonString(dir+"/real/"+name)+`,"overwrite":true}`)
		if code != 200 {
			t.Errorf("rename of %s onto itself: %d %s", name, code, body)
		}
		if _, err := os.Stat(filepath.Join(dir, "real", name)); err != nil {
			t.Errorf("a rename of %s onto itself removed it: %v", name, err)
		}
	}
}

// TestFSBodyNotUTF8: a path in a POST body that is not UTF-8 (raw bytes
// that are not, or a lone surrogate escape such as Python writes for a
// name it read as bytes) is refused with nothing run, rather than decoded
// to U+FFFD and so naming another file: the file named with U+FFFD stays.
func TestFSBodyNotUTF8(t *testing.T) {
	var argvs [][]string
	ts, id := filesServer(t, os.Getenv("PATH"), &argvs)
	dir := t.TempDir()
	keep := filepath.Join(dir, "\uFFFD")
	os.WriteFile(keep, []byte("keep"), 0o644)
	for _, body := range []string{
		`{"path":"` + dir + "/\xff" + `"}`,
		`{"path":"` + dir + `/\udcff"}`,
		`{"path":"` + dir + `/\ud83d"}`,
		`{"path":"` + dir + `/\ud83dx"}`,
		`{"path":"` + dir + `/\ude00\ud83d"}`,
	} {
		if code, resp := ts.fsPost(id, "remove", body); code != 400 || codeOf(resp) != api.CodeInvalidJSON {
			t.Errorf("remove %q: %d %s, want 400 invalid_json", body, code, resp)
		}
	}
	if code, resp := ts.fsPost(id, "rename", `{"from":"`+dir+`/\udcff","to":"`+dir+`/x"}`); code != 400 || codeOf(resp) != api.CodeInvalidJSON {
		t.Errorf("rename: %d %s", code, resp)
	}
	if len(argvs) != 0 {
		t.Errorf("a body that is not UTF-8 ran commands: %q", argvs)
	}
	if _, err := os.Stat(keep); err != nil {
		t.Errorf("the file named U+FFFD was removed: %v", err)
	}
	// A pair of surrogates is a character, and an escaped backslash
	// before a u is no escape: both are paths as any other.
	for _, body := range []string{`{"path":"` + dir + `/\ud83d\ude00"}`, `{"path":"` + dir + `/\\udcff"}`} {
		if code, resp := ts.fsPost(id, "remove", body); code != 404 || codeOf(resp) != api.CodeFileNotFound {
			t.Errorf("remove %q: %d %s, want 404 file_not_found", body, code, resp)
		}
	}
}

// FuzzFSRequests: no query or body of a file operation, whatever the
// sandbox prints and exits with, panics the server or gets a 5xx.
func FuzzFSRequests(f *testing.F) {
	for _, seed := range []string{"path=/tmp", "path=%ff", "path=/a/../b", "path=/&wake=true", `{"path":"/tmp/x","recursive":true}`,
		`{"from":"/a","to":"/b","overwrite":true}`, `{"path":"/\udcff"}`, "\xff", `{"path":1}`} {
		f.Add(0, seed, []byte("81a4 1 1 /tmp\n"), int8(0))
		f.Add(2, seed, []byte("a\x00\x00"+"81a4 1 1 a\n\x00"), int8(0))
		f.Add(4, seed, []byte(nil), int8(93))
	}
	var out []byte
	var code int
	ts := newTestServer(f, &controltest.Cluster{}, func(_ *Options, co *control.Options) {
		co.Exec = controltest.Exec{Run: func(_ context.Context, req cluster.ExecRequest) (cluster.ExitStatus, error) {
			req.Stdout.Write(out)
			return cluster.ExitStatus{Code: code}, nil
		}}
	})
	id := ts.create(`{"image":"busybox"}`)
	ts.db.Observe(context.Background(), id, store.Observation{State: store.StateRunning})
	ops := []string{"list", "stat", "remove", "mkdir", "rename"}
	f.Fuzz(func(t *testing.T, op int, input string, stdout []byte, exit int8) {
		out, code = stdout, int(exit)
		name := ops[(op%len(ops)+len(ops))%len(ops)]
		var req *http.Request
		if name == "list" || name == "stat" {
			req = httptest.NewRequest("GET", "/", nil)
			req.URL.Path, req.URL.RawQuery = "/v1/sandboxes/"+id+"/fs/"+name, input
		} else {
			req = httptest.NewRequest("POST", "/v1/sandboxes/"+id+"/fs/"+name, strings.NewReader(input))
		}
		req.Header.Set("Authorization", "Bearer "+ts.token)
		rec := httptest.NewRecorder()
		ts.srv.ServeHTTP(rec, req)
		if rec.Code >= 500 {
			t.Fatalf("%s %q with %q exit %d: %d %s", name, input, stdout, exit, rec.Code, rec.Body.String())
		}
	})
}
