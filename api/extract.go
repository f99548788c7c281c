package api

import (
	"archive/tar"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// What comes out of a sandbox is hostile: a directory's tar stream is
// written by whatever runs in the sandbox, which chooses its entries'
// names, kinds, modes and declared sizes. ExtractTar trusts none of them.

// DefaultMaxTarEntries is the default cap on the entries of a tar stream
// that ExtractTar writes.
const DefaultMaxTarEntries = 100_000

// MaxTarDepth is how many directories deep a tar entry's name may go.
// Each file written is opened one directory at a time, never through a
// link, so a stream of deep names would cost time in proportion to their
// depth.
const MaxTarDepth = 128

// Errors of ExtractTar, each wrapped with what it found: switch on them
// with errors.Is.
var (
	// ErrDestinationExists: the directory to extract into exists, and
	// ExtractOptions.Overwrite was not given, or a file the stream names
	// exists there.
	ErrDestinationExists = errors.New("already exists")
	// ErrExtractLimit: the stream wrote more bytes or had more entries
	// than ExtractOptions allow.
	ErrExtractLimit = errors.New("past the extraction limit")
	// ErrUnsafeEntry: an entry names a path outside the directory, or one
	// longer than MaxPathBytes or deeper than MaxTarDepth, or is a sparse file (whose declared holes
	// would write far more than the stream's own size).
	ErrUnsafeEntry = errors.New("unsafe tar entry")
)

// ExtractOptions say how ExtractTar may write.
type ExtractOptions struct {
	// Overwrite extracts into the directory even when it exists, adding
	// to what is there and replacing the files the stream names. Each is
	// replaced whole by a rename, never written through a link; a refused
	// or broken stream leaves what it added so far. Without it, the
	// directory must not exist. A directory that does not exist (with
	// Overwrite or without) is extracted into a fresh directory beside
	// it, renamed into place once complete, so a refused or broken stream
	// leaves nothing behind.
	Overwrite bool
	// MaxBytes caps the bytes written, counted as they are written,
	// whatever the entries declare; 0 means DefaultMaxFileBytes.
	MaxBytes int64
	// MaxEntries caps the number of entries, counting as one more each
	// directory that an entry's name makes on its way (a/b/c makes a and
	// a/b), so that a few deep names make no more directories than as
	// many entries would; 0 means DefaultMaxTarEntries.
	MaxEntries int
}

// ExtractTar writes the directories and regular files of a tar stream
// into dir. Links, devices and other kinds are skipped, and sparse files
// and entries that would land outside dir are refused. Files and
// directories get the stream's permission bits less the umask, without
// setuid, setgid or sticky bits, and no ownership. Nothing is written
// outside dir, through a link that was there before or one the stream
// tried to make. Its errors are Printable, whatever names the stream
// chose.
func ExtractTar(r io.Reader, dir string, o ExtractOptions) error {
	if o.MaxBytes <= 0 {
		o.MaxBytes = DefaultMaxFileBytes
	}
	if o.MaxEntries <= 0 {
		o.MaxEntries = DefaultMaxTarEntries
	}
	if _, err := os.Lstat(dir); err == nil {
		if o.Overwrite {
			return extractInto(r, dir, o)
		}
		return fmt.Errorf("%s %w: a sandbox's directory is never merged into a local one", dir, ErrDestinationExists)
	} else if !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	if o.Overwrite {
		if err := os.MkdirAll(filepath.Dir(dir), 0o777); err != nil {
			return err
		}
	}
	tmp := filepath.Join(filepath.Dir(dir), tempName())
	if err := os.Mkdir(tmp, 0o777); err != nil {
		return err
	}
	if err := extractInto(r, tmp, o); err != nil {
		os.RemoveAll(tmp)
		return err
	}
	if err := os.Rename(tmp, dir); err != nil {
		os.RemoveAll(tmp)
		return err
	}
	return nil
}

// extractInto extracts into the directory dir, which exists. Its errors
// are made Printable: they may quote the names of entries.
func extractInto(r io.Reader, dir string, o ExtractOptions) error {
	if err := extractRoot(r, dir, o); err != nil {
		return printableError{err}
	}
	return nil
}

// printableError is an error whose text is made Printable.
type printableError struct{ error }

func (e printableError) Error() string { return Printable(e.error.Error()) }
func (e printableError) Unwrap() error { return e.error }

func extractRoot(r io.Reader, dir string, o ExtractOptions) error {
	root, err := os.OpenRoot(dir)
	if err != nil {
		return err
	}
	defer root.Close()
	left := o.MaxBytes
	tr := tar.NewReader(r)
	made := dirTree{}
	for entries := 0; ; entries++ {
		h, err := tr.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		if entries >= o.MaxEntries {
			return fmt.Errorf("more than %d entries: %w", o.MaxEntries, ErrExtractLimit)
		}
		name := filepath.Clean(strings.TrimPrefix(h.Name, "./"))
		switch {
		case name == ".":
			continue
		case len(h.Name) > MaxPathBytes:
			return fmt.Errorf("tar entry %.64q... is longer than %d bytes: %w", h.Name, MaxPathBytes, ErrUnsafeEntry)
		case !filepath.IsLocal(name):
			return fmt.Errorf("tar entry %q lands outside %s: %w", h.Name, dir, ErrUnsafeEntry)
		case strings.Count(name, string(filepath.Separator)) > MaxTarDepth:
			return fmt.Errorf("tar entry %.64q... is deeper than %d directories: %w", h.Name, MaxTarDepth, ErrUnsafeEntry)
		case sparse(h):
			return fmt.Errorf("tar entry %q is a sparse file: %w", h.Name, ErrUnsafeEntry)
		}
		perm := fs.FileMode(h.Mode) & fs.ModePerm
		switch h.Typeflag {
		case tar.TypeDir:
			n := made.add(name)
			if n == 0 {
				continue
			}
			// The directory the entry names is the entry itself.
			if entries += n - 1; entries >= o.MaxEntries {
				return fmt.Errorf("more than %d entries: %w", o.MaxEntries, ErrExtractLimit)
			}
			if err := root.MkdirAll(name, perm|0o700); err != nil {
				return err
			}
		case tar.TypeReg:
			if n := made.add(filepath.Dir(name)); n > 0 {
				if entries += n; entries >= o.MaxEntries {
					return fmt.Errorf("more than %d entries: %w", o.MaxEntries, ErrExtractLimit)
				}
				if err := root.MkdirAll(filepath.Dir(name), 0o777); err != nil {
					return err
				}
			}
			n, err := createFile(root, name, tr, perm, left, o.Overwrite)
			left -= n
			if err != nil {
				return err
			}
		}
	}
}

// dirTree is the directories an extraction made or found, as a tree of
// names: each is counted once, and looked up without a system call.
type dirTree map[dirKey]int

// dirKey is a directory's name in its parent's, 0 being the root.
type dirKey struct {
	parent int
	name   string
}

// add records the directory name (local and clean) and its parents,
// reporting how many were not recorded before.
func (t dirTree) add(name string) int {
	if name == "." {
		return 0
	}
	n, parent := 0, 0
	for _, part := range strings.Split(name, string(filepath.Separator)) {
		k := dirKey{parent, part}
		id, ok := t[k]
		if !ok {
			id = len(t) + 1
			k.name = strings.Clone(part)
			t[k] = id
			n++
		}
		parent = id
	}
	return n
}

// sparse reports whether h is a sparse file, of the old GNU kind or of
// the PAX one.
func sparse(h *tar.Header) bool {
	if h.Typeflag == tar.TypeGNUSparse {
		return true
	}
	for k := range h.PAXRecords {
		if strings.HasPrefix(k, "GNU.sparse.") {
			return true
		}
	}
	return false
}

// createFile writes r to the new file name in root, with perm less the
// umask, and at most max bytes: one more is ErrExtractLimit. With replace
// the file is written beside name and renamed over it, so whatever was at
// name (a file, a link) is replaced, never written through; without it an
// existing name is ErrDestinationExists. It returns the bytes written.
func createFile(root *os.Root, name string, r io.Reader, perm fs.FileMode, max int64, replace bool) (int64, error) {
	at := name
	if replace {
		at = filepath.Join(filepath.Dir(name), tempName())
	}
	f, err := root.OpenFile(at, os.O_WRONLY|os.O_CREATE|os.O_EXCL, perm)
	if errors.Is(err, fs.ErrExist) {
		return 0, fmt.Errorf("%q %w", name, ErrDestinationExists)
	}
	if err != nil {
		return 0, err
	}
	n, err := io.Copy(f, io.LimitReader(r, max+1))
	if err == nil && n > max {
		err = fmt.Errorf("more than %d bytes: %w", max, ErrExtractLimit)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil && replace {
		err = root.Rename(at, name)
	}
	if err != nil && replace {
		root.Remove(at)
	}
	return n, err
}

// SaveFile writes r to the local file path, replacing whatever is there
// (a file, or a link, never written through) once every byte arrived: a
// cut transfer leaves path as it was. The file gets mode 0666 less the
// umask. More than maxBytes from r is ErrExtractLimit, and leaves path as
// it was too. A path that ends in a separator, . or .. names no file, and
// is an error.
func SaveFile(r io.Reader, path string, maxBytes int64) error {
	dir, name := filepath.Split(path)
	if name == "" || name == "." || name == ".." {
		return fmt.Errorf("%s names a directory, not a file", path)
	}
	if dir == "" {
		dir = "."
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		return err
	}
	defer root.Close()
	_, err = createFile(root, name, r, 0o666, maxBytes, true)
	return err
}

// tempName is a name for a file or directory being written: short, so
// that it fits wherever the name it stands in for fits.
func tempName() string {
	b := make([]byte, 8)
	rand.Read(b)
	return ".hiloop-" + hex.EncodeToString(b)
}
