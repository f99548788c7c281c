package api

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
)

// TestFSPathsNotUTF8: a path of a remove, mkdir or rename that is not
// UTF-8 is refused before anything is sent: JSON would carry it as U+FFFD,
// which names another file.
func TestFSPathsNotUTF8(t *testing.T) {
	var asked atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		asked.Add(1)
		w.WriteHeader(http.StatusNoContent)
	}))
	defer srv.Close()
	c := NewClient(srv.URL, "hl_test")
	ctx := context.Background()
	bad := "/tmp/\xff"
	for name, err := range map[string]error{
		"remove":      c.Remove(ctx, "sbx_1", bad, true),
		"mkdir":       func() error { _, err := c.Mkdir(ctx, "sbx_1", bad); return err }(),
		"rename from": func() error { _, err := c.Rename(ctx, "sbx_1", bad, "/tmp/x", true); return err }(),
		"rename to":   func() error { _, err := c.Rename(ctx, "sbx_1", "/tmp/x", bad, true); return err }(),
	} {
		if ErrorCode(err) != CodeInvalidPath {
			t.Errorf("%s of a path that is not UTF-8: %v, want %s", name, err, CodeInvalidPath)
		}
	}
	if n := asked.Load(); n != 0 {
		t.Errorf("%d requests sent", n)
	}
	if err := c.Remove(ctx, "sbx_1", "/tmp/ü", false); err != nil {
		t.Errorf("a UTF-8 path: %v", err)
	}
}
