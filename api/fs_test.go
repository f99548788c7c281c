package api

import (
	"context"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"testing"
)

// TestExists: only file_not_found is false; a sandbox that is not found
// (not_found, the same status) and any other failure are errors.
func TestExists(t *testing.T) {
	for _, tc := range []struct {
		status int
		body   string
		want   bool
		code   string
	}{
		{200, `{"name":"f","type":"file"}`, true, ""},
		{404, `{"error":{"code":"file_not_found","message":"no such file or directory in the sandbox"}}`, false, ""},
		{404, `{"error":{"code":"not_found","message":"no such sandbox"}}`, false, CodeNotFound},
		{409, `{"error":{"code":"sandbox_not_running","message":"sandbox is stopped"}}`, false, CodeSandboxNotRunning},
	} {
		var got *http.Request
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			got = r
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(tc.status)
			w.Write([]byte(tc.body))
		}))
		ok, err := (&Client{URL: srv.URL, Token: "hl_x"}).Exists(context.Background(), "sbx_a", "/a b/c")
		srv.Close()
		if ok != tc.want || ErrorCode(err) != tc.code || tc.code == "" && err != nil {
			t.Errorf("%d %s: %v %v", tc.status, tc.body, ok, err)
		}
		if got.URL.Path != "/v1/sandboxes/sbx_a/fs/stat" || got.URL.Query().Get("path") != "/a b/c" || got.URL.Query().Get("wake") != "true" {
			t.Errorf("asked %s", got.URL)
		}
	}
}

// TestFileMode: an entry's type and bits as an fs.FileMode.
func TestFileMode(t *testing.T) {
	for _, tc := range []struct {
		e    FileEntry
		want fs.FileMode
	}{
		{FileEntry{Type: FileTypeFile, Mode: 0o644}, 0o644},
		{FileEntry{Type: FileTypeDir, Mode: 0o1777}, fs.ModeDir | fs.ModeSticky | 0o777},
		{FileEntry{Type: FileTypeSymlink, Mode: 0o777}, fs.ModeSymlink | 0o777},
		{FileEntry{Type: FileTypeFile, Mode: 0o6755}, fs.ModeSetuid | fs.ModeSetgid | 0o755},
		{FileEntry{Type: FileTypeOther, Mode: 0o600}, fs.ModeIrregular | 0o600},
	} {
		if got := tc.e.FileMode(); got != tc.want {
			t.Errorf("%+v: %v, want %v", tc.e, got, tc.want)
		}
	}
}
