package api

import (
	"archive/tar"
	"context"
	"fmt"
	"io"
	"io/fs"
	"mime"
	"net/http"
	"net/url"
	"os"
)

// Files move in and out of a sandbox through the exec path, as the image's
// own user in the workload container: PUT and GET
// /v1/sandboxes/{id}/files?path=/abs/path. A single file needs a POSIX sh
// (with head and wc) in the image; a directory travels as a tar stream and
// needs tar.
const (
	// TarMediaType is the Content-Type of a directory in either direction.
	TarMediaType = "application/x-tar"
	// MaxPathBytes caps a file's path.
	MaxPathBytes = 4096
	// DefaultMaxFileBytes is the default cap on one upload or download
	// (serve --max-file-size).
	DefaultMaxFileBytes = 1 << 30
)

// FileInfo is what an upload wrote: the path, and the size and SHA-256 of
// the bytes the server received and the sandbox took (for a directory,
// those of the tar stream).
type FileInfo struct {
	Path   string `json:"path"`
	Size   int64  `json:"size"`
	SHA256 string `json:"sha256"`
}

// filesPath is the files endpoint for path p in sandbox id, waking the
// sandbox unless c.NoWake.
func (c *Client) filesPath(id, p string, extra url.Values) string {
	q := url.Values{"path": {p}}
	for k, v := range extra {
		q[k] = v
	}
	c.wake(q)
	return sandboxPath(id, "/files?"+q.Encode())
}

// WriteFile writes size bytes from r to the file at path (absolute) in the
// sandbox, atomically: the file is replaced only once every byte arrived,
// so a cut upload leaves the old file whole. Missing parent directories are
// made. mode is the file's permissions; 0 means 0644. The FileInfo's
// SHA256 is of what the server received, to compare with what was sent.
func (c *Client) WriteFile(ctx context.Context, id, path string, r io.Reader, size int64, mode fs.FileMode) (FileInfo, error) {
	q := url.Values{}
	if mode != 0 {
		q.Set("mode", fmt.Sprintf("%04o", mode.Perm()))
	}
	return c.upload(ctx, c.filesPath(id, path, q), "application/octet-stream", r, size)
}

// WriteTar extracts a tar stream of size bytes from r into the directory
// at path in the sandbox, made if missing. The sandbox's image needs tar
// (else an *Error with code tar_unavailable). Unlike a file, a directory is
// not replaced atomically: a cut upload leaves what was extracted so far.
func (c *Client) WriteTar(ctx context.Context, id, path string, r io.Reader, size int64) (FileInfo, error) {
	return c.upload(ctx, c.filesPath(id, path, nil), TarMediaType, r, size)
}

func (c *Client) upload(ctx context.Context, p, contentType string, r io.Reader, size int64) (FileInfo, error) {
	var fi FileInfo
	// A body of known length that can be read again is retried like
	// any call; a stream is sent once.
	rs, seekable := r.(io.ReadSeeker)
	rq := request{method: http.MethodPut, path: p, header: http.Header{"Content-Type": {contentType}},
		body: io.LimitReader(r, size), contentLength: size, once: !seekable, timeout: -1}
	if seekable {
		start, err := rs.Seek(0, io.SeekCurrent)
		if err != nil {
			return fi, err
		}
		rq.rewind = func() (io.Reader, error) {
			_, err := rs.Seek(start, io.SeekStart)
			return io.LimitReader(rs, size), err
		}
	}
	err := c.do(ctx, rq, &fi)
	return fi, err
}

// FileReader is a file or directory being read from a sandbox. Close it.
type FileReader struct {
	io.ReadCloser
	// Dir says the content is a tar stream of a directory.
	Dir bool
	// Size is the file's size; -1 for a directory, whose tar's size is
	// known only at its end.
	Size int64
}

// ReadFile opens the file or directory at path in the sandbox for reading:
// a file's bytes, or a directory as a tar stream. A transfer that breaks
// before its end is a read error, never a short read that looks whole.
func (c *Client) ReadFile(ctx context.Context, id, path string) (*FileReader, error) {
	if err := c.checkURL(); err != nil {
		return nil, err
	}
	resp, err := c.send(ctx, request{method: http.MethodGet, path: c.filesPath(id, path, nil)})
	if err != nil {
		return nil, err
	}
	fr := &FileReader{ReadCloser: resp.Body, Size: resp.ContentLength}
	if mt, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type")); mt == TarMediaType {
		fr.Dir, fr.Size = true, -1
	}
	return fr, nil
}

// UploadDir copies the local directory dir into the directory at path in
// the sandbox, as a tar stream of its regular files, directories and
// symbolic links. The tar is written to a temporary file first, since an
// upload announces its length. Its entries carry uid and gid 0 and no user
// or group names: who owns the files on this machine is none of the
// sandbox's business, and the sandbox's tar extracts them as its own user.
func (c *Client) UploadDir(ctx context.Context, id, dir, path string) (FileInfo, error) {
	f, err := os.CreateTemp("", "hiloop-upload-*.tar")
	if err != nil {
		return FileInfo{}, err
	}
	defer os.Remove(f.Name())
	defer f.Close()
	if err := writeTar(f, os.DirFS(dir)); err != nil {
		return FileInfo{}, fmt.Errorf("tar %s: %w", dir, err)
	}
	size, err := f.Seek(0, io.SeekCurrent)
	if err != nil {
		return FileInfo{}, err
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return FileInfo{}, err
	}
	return c.WriteTar(ctx, id, path, f, size)
}

// writeTar writes the regular files, directories and symbolic links of
// fsys to w as a tar stream owned by nobody in particular: uid and gid 0,
// no user or group names. Other kinds of file are an error, as in
// tar.Writer.AddFS.
func writeTar(w io.Writer, fsys fs.FS) error {
	tw := tar.NewWriter(w)
	err := fs.WalkDir(fsys, ".", func(name string, d fs.DirEntry, err error) error {
		if err != nil || name == "." {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		link := ""
		switch typ := d.Type(); {
		case typ == fs.ModeSymlink:
			if link, err = fs.ReadLink(fsys, name); err != nil {
				return err
			}
		case !typ.IsRegular() && !typ.IsDir():
			return fmt.Errorf("%s: not a regular file, directory or symbolic link", name)
		}
		h, err := tar.FileInfoHeader(fi, link)
		if err != nil {
			return err
		}
		h.Name = name
		if d.IsDir() {
			h.Name += "/"
		}
		h.Uid, h.Gid, h.Uname, h.Gname = 0, 0, "", ""
		h.Mode &= 0o777
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		if !d.Type().IsRegular() {
			return nil
		}
		f, err := fsys.Open(name)
		if err != nil {
			return err
		}
		defer f.Close()
		_, err = io.Copy(tw, f)
		return err
	})
	if err != nil {
		return err
	}
	return tw.Close()
}

// DownloadDir copies the directory at path in the sandbox to the local
// directory dir, as ExtractTar does with o: by default dir must not exist,
// and appears only once the whole directory arrived.
func (c *Client) DownloadDir(ctx context.Context, id, path, dir string, o ExtractOptions) error {
	fr, err := c.ReadFile(ctx, id, path)
	if err != nil {
		return err
	}
	defer fr.Close()
	if !fr.Dir {
		return fmt.Errorf("%s in %s is a file, not a directory", path, id)
	}
	return ExtractTar(fr, dir, o)
}
