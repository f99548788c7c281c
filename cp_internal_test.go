package main

import (
	"archive/tar"
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"

	"github.com/hiloop/hiloop/api"
)

// TestCpRefusesUncleanPath: a remote path whose last name is . or .. is
// refused before anything is asked, since the destination would be the
// local directory's parent, even from a server that would answer it.
func TestCpRefusesUncleanPath(t *testing.T) {
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	tw.WriteHeader(&tar.Header{Name: "planted", Typeflag: tar.TypeReg, Mode: 0o644, Size: 1})
	tw.Write([]byte("x"))
	tw.Close()
	asked := 0
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		asked++
		w.Header().Set("Content-Type", api.TarMediaType)
		w.Write(b.Bytes())
	}))
	defer srv.Close()
	parent := t.TempDir()
	out := filepath.Join(parent, "out")
	os.Mkdir(out, 0o755)
	for _, remote := range []string{"/work/..", "/work/../", "/work/.", "//work", "/work//x"} {
		cmd := &SandboxCpCmd{Conn: Conn{URL: srv.URL, Token: "hl_x"}, Recursive: true, Overwrite: true, Src: "sbx_x:" + remote, Dst: out}
		if err := cmd.Run(context.Background(), nil); err == nil {
			t.Errorf("%s: copied", remote)
		}
	}
	if asked != 0 {
		t.Errorf("the server was asked %d times", asked)
	}
	if got := listing(t, parent); len(got) != 1 {
		t.Errorf("the destination's parent holds %q, want out alone", got)
	}
}

// listing is every path under dir.
func listing(t *testing.T, dir string) []string {
	t.Helper()
	var got []string
	filepath.WalkDir(dir, func(p string, _ os.DirEntry, err error) error {
		if err == nil && p != dir {
			got = append(got, p)
		}
		return err
	})
	return got
}
