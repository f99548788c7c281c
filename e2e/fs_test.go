package e2e_test

import (
	"context"
	"encoding/json"
	"errors"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/hiloop/hiloop/api"
	"github.com/hiloop/hiloop/internal/e2e"
)

// hostileNames are names a workload may give its files: each must list
// as itself.
var hostileNames = []string{"new\nline", `it's "quoted"`, "-rf", "--help", "ünï cødé ✓", "a b c", " lead", "*", "$(id)", `back\slash`, "tab\there"}

// makeHostile makes a file of each of hostileNames in dir, from inside the
// sandbox, each holding its own name: no API path may carry a newline.
func makeHostile(t *testing.T, c *api.Client, id, dir string) {
	t.Helper()
	script := `cd "$1" || exit 1; shift; for n; do printf %s "$n" > "./$n" || exit 1; done`
	res, err := c.Run(context.Background(), id, api.ExecRunRequest{Command: append([]string{"sh", "-c", script, "sh", dir}, hostileNames...)})
	if err != nil || res.ExitCode == nil || *res.ExitCode != 0 {
		t.Fatalf("making the names: %+v %v", res, err)
	}
}

// TestFileOperations: list, stat, exists, remove, mkdir and rename through
// the Go SDK and the CLI against the local cluster: each works, hostile
// names list and stat as themselves, a directory is removed recursively
// only when asked, bad input has its code with nothing run, and another
// organization gets the not-found of an absent sandbox for every one.
func TestFileOperations(t *testing.T) {
	in := e2e.Serve(t, filepath.Join(t.TempDir(), "h.db"), e2e.NewNamespace(t))
	c := sdk(in, in.Token)
	ctx := context.Background()
	sb := runningSandbox(t, c)
	work := t.TempDir()

	t.Run("mkdir, list and stat hostile names", func(t *testing.T) {
		d, err := c.Mkdir(ctx, sb.ID, work+"/names/deep")
		if err != nil || d.Type != api.FileTypeDir || d.Path != work+"/names/deep" || d.Name != "deep" {
			t.Fatalf("mkdir: %+v %v", d, err)
		}
		if _, err := c.Mkdir(ctx, sb.ID, work+"/names/deep"); err != nil {
			t.Errorf("mkdir of a directory that exists: %v", err)
		}
		makeHostile(t, c, sb.ID, work+"/names")
		l, err := c.List(ctx, sb.ID, work+"/names")
		if err != nil || l.Truncated || l.Path != work+"/names" {
			t.Fatalf("list: %+v %v", l, err)
		}
		var got []string
		for _, e := range l.Entries {
			got = append(got, e.Name)
			if e.Name == "deep" {
				if e.Type != api.FileTypeDir {
					t.Errorf("deep: %+v", e)
				}
				continue
			}
			if e.Type != api.FileTypeFile || e.Size != int64(len(e.Name)) || e.Mode&0o777 == 0 || e.MTime.IsZero() || e.Path != "" {
				t.Errorf("%q: %+v", e.Name, e)
			}
		}
		want := append(slices.Clone(hostileNames), "deep")
		slices.Sort(want)
		if !slices.Equal(got, want) {
			t.Errorf("listed %q, want %q", got, want)
		}
		for _, n := range hostileNames {
			if strings.ContainsAny(n, "\n\t") {
				continue // no path may hold a control character
			}
			e, err := c.Stat(ctx, sb.ID, work+"/names/"+n)
			if err != nil || e.Name != n || e.Path != work+"/names/"+n || e.Size != int64(len(n)) {
				t.Errorf("stat %q: %+v %v", n, e, err)
			}
		}
	})

	t.Run("exists", func(t *testing.T) {
		if ok, err := c.Exists(ctx, sb.ID, work+"/names/-rf"); !ok || err != nil {
			t.Errorf("an existing file: %v %v", ok, err)
		}
		if ok, err := c.Exists(ctx, sb.ID, work+"/none"); ok || err != nil {
			t.Errorf("nothing: %v %v", ok, err)
		}
		if ok, err := c.Exists(ctx, "sbx_aaaaaaaaaaaaaaaa", work); ok || api.ErrorCode(err) != api.CodeNotFound {
			t.Errorf("in a sandbox that does not exist: %v %v, want the error not_found", ok, err)
		}
	})

	t.Run("rename", func(t *testing.T) {
		c.Mkdir(ctx, sb.ID, work+"/mv")
		c.WriteFile(ctx, sb.ID, work+"/mv/a", strings.NewReader("a"), 1, 0o600)
		c.WriteFile(ctx, sb.ID, work+"/mv/b", strings.NewReader("bb"), 2, 0)
		if _, err := c.Rename(ctx, sb.ID, work+"/mv/a", work+"/mv/b", false); api.ErrorCode(err) != api.CodePathConflict {
			t.Errorf("onto a file without overwrite: %v", err)
		}
		e, err := c.Rename(ctx, sb.ID, work+"/mv/a", work+"/mv/b", true)
		if err != nil || e.Size != 1 || e.Mode != 0o600 || e.Path != work+"/mv/b" {
			t.Errorf("with overwrite: %+v %v", e, err)
		}
		if e, err := c.Rename(ctx, sb.ID, work+"/mv/b", work+"/mv/new/parents/c", false); err != nil || e.Name != "c" {
			t.Errorf("into missing parents: %+v %v", e, err)
		}
		if _, err := c.Rename(ctx, sb.ID, work+"/mv/b", work+"/mv/d", false); api.ErrorCode(err) != api.CodeFileNotFound {
			t.Errorf("of nothing: %v", err)
		}
		if _, err := c.Rename(ctx, sb.ID, work+"/mv", work+"/mv/in", false); api.ErrorCode(err) != api.CodeInvalidPath {
			t.Errorf("into itself: %v", err)
		}
	})

	t.Run("remove is recursive only when asked", func(t *testing.T) {
		if err := c.Remove(ctx, sb.ID, work+"/mv", false); api.ErrorCode(err) != api.CodeDirectoryNotEmpty {
			t.Errorf("a directory that is not empty: %v", err)
		}
		if ok, _ := c.Exists(ctx, sb.ID, work+"/mv/new/parents/c"); !ok {
			t.Error("a refused remove removed")
		}
		if err := c.Remove(ctx, sb.ID, work+"/mv/new/parents/c", false); err != nil {
			t.Errorf("a file: %v", err)
		}
		if err := c.Remove(ctx, sb.ID, work+"/mv", true); err != nil {
			t.Errorf("recursive: %v", err)
		}
		if ok, err := c.Exists(ctx, sb.ID, work+"/mv"); ok || err != nil {
			t.Errorf("after a recursive remove: %v %v", ok, err)
		}
		if err := c.Remove(ctx, sb.ID, work+"/mv", true); api.ErrorCode(err) != api.CodeFileNotFound {
			t.Errorf("nothing: %v", err)
		}
		if err := c.Remove(ctx, sb.ID, "/", true); api.ErrorCode(err) != api.CodeInvalidPath {
			t.Errorf("/: %v", err)
		}
	})

	t.Run("bad input", func(t *testing.T) {
		for _, tc := range []struct{ method, path, body, code string }{
			{"GET", "/fs/list?path=rel", "", api.CodeInvalidPath},
			{"GET", "/fs/stat?path=/a/../b", "", api.CodeInvalidPath},
			{"GET", "/fs/list", "", api.CodeInvalidPath},
			{"GET", "/fs/list?path=/tmp&x=1", "", api.CodeUnknownField},
			{"GET", "/fs/stat?path=" + work + "/names", "", ""},
			{"GET", "/fs/list?path=" + work + "/names/-rf", "", api.CodePathConflict},
			{"POST", "/fs/remove", `{"path":"/a\nb"}`, api.CodeInvalidPath},
			{"POST", "/fs/remove", `{"path":"/tmp","force":true}`, api.CodeUnknownField},
			{"POST", "/fs/mkdir", `{"path":"` + work + `/names/-rf/x"}`, api.CodePathConflict},
			{"POST", "/fs/mkdir", `[]`, api.CodeInvalidField},
			{"POST", "/fs/mkdir", `{"path":`, api.CodeInvalidJSON},
			{"POST", "/fs/rename", `{"from":"/a"}`, api.CodeInvalidPath},
			{"POST", "/fs/rename", `{"from":"/","to":"/b"}`, api.CodeInvalidPath},
		} {
			status, body := in.Call(in.Token, tc.method, "/v1/sandboxes/"+sb.ID+tc.path, tc.body)
			if tc.code == "" && status != 200 || tc.code != "" && errorCode(t, body) != tc.code {
				t.Errorf("%s %s %s: %d %s, want %q", tc.method, tc.path, tc.body, status, body, tc.code)
			}
		}
	})

	t.Run("another organization", func(t *testing.T) {
		other := sdk(in, in.NewOrg("other", 10, 10))
		absent := "sbx_aaaaaaaaaaaaaaaa"
		for name, call := range map[string]func(id string) error{
			"list":   func(id string) error { _, err := other.List(ctx, id, work); return err },
			"stat":   func(id string) error { _, err := other.Stat(ctx, id, work); return err },
			"exists": func(id string) error { _, err := other.Exists(ctx, id, work); return err },
			"remove": func(id string) error { return other.Remove(ctx, id, work+"/names", true) },
			"mkdir":  func(id string) error { _, err := other.Mkdir(ctx, id, work+"/theirs"); return err },
			"rename": func(id string) error { _, err := other.Rename(ctx, id, work+"/names", work+"/moved", true); return err },
		} {
			theirs, none := call(sb.ID), call(absent)
			var te, ne *api.Error
			if !errors.As(theirs, &te) || !errors.As(none, &ne) || te.Status != 404 || te.Code != api.CodeNotFound || te.Message != ne.Message {
				t.Errorf("%s in another organization's sandbox: %v; in an absent one: %v", name, theirs, none)
			}
		}
		if l, err := c.List(ctx, sb.ID, work+"/names"); err != nil || len(l.Entries) != len(hostileNames)+1 {
			t.Errorf("after the other organization's tries: %d entries, %v", len(l.Entries), err)
		}
	})

	t.Run("cli", func(t *testing.T) {
		remote := sb.ID + ":" + work
		out, errOut, code := in.CLI(in.Token, "sandbox", "fs", "ls", remote+"/names")
		if code != 0 || !strings.Contains(out, `"new\nline"`) || !strings.Contains(out, `"tab\there"`) || !strings.Contains(out, " -rf\n") ||
			strings.Count(out, "\n") != len(hostileNames)+2 || !strings.Contains(out, "drwx") {
			t.Errorf("fs ls: %d %q %q", code, out, errOut)
		}
		out, errOut, code = in.CLI(in.Token, "sandbox", "fs", "ls", "-o", "json", remote+"/names")
		var l api.FileList
		if err := json.Unmarshal([]byte(out), &l); code != 0 || err != nil || len(l.Entries) != len(hostileNames)+1 {
			t.Errorf("fs ls -o json: %d %q %q", code, out, errOut)
		}
		if _, errOut, code := in.CLI(in.Token, "sandbox", "fs", "stat", remote+"/none"); code != 1 || !strings.Contains(errOut, api.CodeFileNotFound) {
			t.Errorf("fs stat of nothing: %d %q", code, errOut)
		}
		if out, errOut, code := in.CLI(in.Token, "sandbox", "fs", "mkdir", remote+"/cli/a"); code != 0 || !strings.Contains(out, work+"/cli/a") {
			t.Errorf("fs mkdir: %d %q %q", code, out, errOut)
		}
		in.MustCLI(in.Token, "sandbox", "fs", "mkdir", remote+"/cli/b")
		if _, errOut, code := in.CLI(in.Token, "sandbox", "fs", "mv", remote+"/cli/a", work+"/cli/b"); code != 1 || !strings.Contains(errOut, "--overwrite") {
			t.Errorf("fs mv onto a directory: %d %q", code, errOut)
		}
		if out, errOut, code := in.CLI(in.Token, "sandbox", "fs", "mv", "--overwrite", remote+"/cli/a", remote+"/cli/b"); code != 0 || !strings.Contains(out, work+"/cli/b") {
			t.Errorf("fs mv --overwrite: %d %q %q", code, out, errOut)
		}
		if _, errOut, code := in.CLI(in.Token, "sandbox", "fs", "mv", remote+"/cli/b", "sbx_other:/x"); code != 2 {
			t.Errorf("fs mv to another sandbox: %d %q", code, errOut)
		}
		if _, errOut, code := in.CLI(in.Token, "sandbox", "fs", "rm", remote+"/cli"); code != 1 || !strings.Contains(errOut, "directory_not_empty") || !strings.Contains(errOut, "-r") {
			t.Errorf("fs rm of a directory: %d %q", code, errOut)
		}
		if _, errOut, code := in.CLI(in.Token, "sandbox", "fs", "rm", "-r", remote+"/cli"); code != 0 {
			t.Errorf("fs rm -r: %d %q", code, errOut)
		}
		if _, errOut, code := in.CLI(in.Token, "sandbox", "fs", "stat", remote+"/cli"); code != 1 {
			t.Errorf("after fs rm -r: %d %q", code, errOut)
		}
		if _, errOut, code := in.CLI(in.Token, "sandbox", "fs", "ls", sb.ID); code != 2 || !strings.Contains(errOut, "SANDBOX:/abs/path") {
			t.Errorf("fs ls without a path: %d %q", code, errOut)
		}
	})
}

// TestFileOperationsTruncated: a directory past the listing's cap answers
// the cap's worth of entries, marked truncated.
func TestFileOperationsTruncated(t *testing.T) {
	in := e2e.Serve(t, filepath.Join(t.TempDir(), "h.db"), e2e.NewNamespace(t))
	c := sdk(in, in.Token)
	ctx := context.Background()
	sb := runningSandbox(t, c)
	dir := t.TempDir()
	n := api.MaxListEntries + 5
	script := `cd "$1" && i=0; while [ $i -lt "$2" ]; do : > "f$i"; i=$((i+1)); done`
	if res, err := c.Run(ctx, sb.ID, api.ExecRunRequest{Command: []string{"sh", "-c", script, "sh", dir, strconv.Itoa(n)}, Timeout: "5m"}); err != nil || *res.ExitCode != 0 {
		t.Fatalf("making %d files: %+v %v", n, res, err)
	}
	l, err := c.List(ctx, sb.ID, dir)
	if err != nil || !l.Truncated || len(l.Entries) != api.MaxListEntries {
		t.Fatalf("%d entries, truncated %v, %v; want %d, true", len(l.Entries), l.Truncated, err, api.MaxListEntries)
	}
	seen := map[string]bool{}
	for _, e := range l.Entries {
		if seen[e.Name] || !strings.HasPrefix(e.Name, "f") || e.Type != api.FileTypeFile {
			t.Fatalf("entry %+v", e)
		}
		seen[e.Name] = true
	}
	t.Logf("%d of %d entries listed", len(l.Entries), n)
}
