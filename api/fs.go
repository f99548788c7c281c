package api

import (
	"context"
	"errors"
	"io/fs"
	"net/http"
	"net/url"
	"time"
	"unicode/utf8"
)

// File operations act on the workload container's file system the way
// file transfers do (one exec session each, as the image's own user):
// GET /v1/sandboxes/{id}/fs/list and /fs/stat, POST /fs/remove, /fs/mkdir
// and /fs/rename. They need a POSIX sh with stat (busybox's or GNU's) in
// the image, and rm, rmdir, mkdir and mv for the changes.

// Types of FileEntry.
const (
	FileTypeFile    = "file"
	FileTypeDir     = "dir"
	FileTypeSymlink = "symlink"
	// FileTypeOther is a device, a FIFO or a socket.
	FileTypeOther = "other"
)

// MaxListEntries caps the entries of one listing; a directory with more is
// listed Truncated.
const MaxListEntries = 10000

// FileEntry is one file in a sandbox, as lstat sees it: a symbolic link is
// itself, never what it points to.
type FileEntry struct {
	// Name is the file's name in its directory (/ for the root). A name
	// that is not valid UTF-8 has each invalid byte replaced by U+FFFD.
	Name string `json:"name"`
	// Path is the file's absolute path; in the answers about one file
	// (stat, mkdir, rename), not in a listing's entries.
	Path string `json:"path,omitempty"`
	// Type is file, dir, symlink or other.
	Type string `json:"type"`
	// Size is st_size in bytes: a file's length, a symbolic link's
	// target's length, what the file system says for a directory.
	Size int64 `json:"size"`
	// Mode is the permission bits, setuid, setgid and sticky included
	// (st_mode & 07777), as a number: 420 is 0644.
	Mode uint32 `json:"mode"`
	// MTime is the last modification, to the second, in UTC.
	MTime time.Time `json:"mtime"`
}

// FileMode is the entry's type and permission bits as an fs.FileMode.
func (e FileEntry) FileMode() fs.FileMode {
	m := fs.FileMode(e.Mode & 0o777)
	if e.Mode&0o4000 != 0 {
		m |= fs.ModeSetuid
	}
	if e.Mode&0o2000 != 0 {
		m |= fs.ModeSetgid
	}
	if e.Mode&0o1000 != 0 {
		m |= fs.ModeSticky
	}
	switch e.Type {
	case FileTypeDir:
		m |= fs.ModeDir
	case FileTypeSymlink:
		m |= fs.ModeSymlink
	case FileTypeOther:
		m |= fs.ModeIrregular
	}
	return m
}

// FileList is a directory's entries, sorted by name (byte order).
type FileList struct {
	Path    string      `json:"path"`
	Entries []FileEntry `json:"entries"`
	// Truncated says the directory has more than MaxListEntries entries,
	// of which Entries holds MaxListEntries (which ones is not defined).
	Truncated bool `json:"truncated"`
}

// RemoveRequest is the body of POST .../fs/remove.
type RemoveRequest struct {
	Path string `json:"path"`
	// Recursive removes a directory and everything in it; without it a
	// directory must be empty (409 directory_not_empty).
	Recursive bool `json:"recursive,omitempty"`
}

// MkdirRequest is the body of POST .../fs/mkdir.
type MkdirRequest struct {
	Path string `json:"path"`
}

// RenameRequest is the body of POST .../fs/rename.
type RenameRequest struct {
	From string `json:"from"`
	To   string `json:"to"`
	// Overwrite replaces what is at To: a file or a symbolic link, or an
	// empty directory when From is a directory. Without it a To that
	// exists is 409 path_conflict.
	Overwrite bool `json:"overwrite,omitempty"`
}

// FSTimeout bounds one file operation on the server; past it the
// operation is ended (504 exec_timeout), and part of it may be done.
const FSTimeout = 10 * time.Minute

// fsCall makes the file operation call of method and op in sandbox id,
// waking it unless c.NoWake, with query q.
func (c *Client) fsCall(ctx context.Context, method, id, op string, q url.Values, in, out any) error {
	if q == nil {
		q = url.Values{}
	}
	timeout := FSTimeout + callTimeout
	if c.wake(q) {
		timeout += wakeWait
	}
	p := sandboxPath(id, "/fs/"+op)
	if len(q) > 0 {
		p += "?" + q.Encode()
	}
	return c.do(ctx, request{method: method, path: p, in: in, timeout: timeout}, out)
}

// bodyPath refuses, as the server would a path it cannot take (400
// invalid_path), a path for a JSON body that is not UTF-8: encoding/json
// would send it as U+FFFD, which names another file. List and Stat take
// any bytes, since their paths go in the query.
func bodyPath(field, p string) error {
	if utf8.ValidString(p) {
		return nil
	}
	return &Error{Status: http.StatusBadRequest, ErrorDetail: ErrorDetail{Code: CodeInvalidPath, Field: field,
		Message: field + ": not valid UTF-8, which a JSON body cannot carry: remove or rename such a file with exec"}}
}

// List lists the directory at path (absolute) in the sandbox, or the
// directory a symbolic link there points to. A path that is not a
// directory is an *Error with code path_conflict; one that does not exist,
// file_not_found.
func (c *Client) List(ctx context.Context, id, path string) (FileList, error) {
	var l FileList
	err := c.fsCall(ctx, http.MethodGet, id, "list", url.Values{"path": {path}}, nil, &l)
	return l, err
}

// Stat answers what the file at path in the sandbox is; one that does not
// exist is an *Error with code file_not_found (see Exists).
func (c *Client) Stat(ctx context.Context, id, path string) (FileEntry, error) {
	var e FileEntry
	err := c.fsCall(ctx, http.MethodGet, id, "stat", url.Values{"path": {path}}, nil, &e)
	return e, err
}

// Exists reports whether anything (a dangling symbolic link too) is at
// path in the sandbox. Only file_not_found is false: a sandbox that is not
// found (not_found) or not running, like any other failure, is an error.
func (c *Client) Exists(ctx context.Context, id, path string) (bool, error) {
	_, err := c.Stat(ctx, id, path)
	var e *Error
	switch {
	case errors.As(err, &e) && e.Code == CodeFileNotFound:
		return false, nil
	case err != nil:
		return false, err
	}
	return true, nil
}

// Remove removes the file, symbolic link (never what it points to) or
// empty directory at path in the sandbox; with recursive, a directory and
// everything in it. A directory that is not empty without recursive is an
// *Error with code directory_not_empty, and nothing is removed.
func (c *Client) Remove(ctx context.Context, id, path string, recursive bool) error {
	if err := bodyPath("path", path); err != nil {
		return err
	}
	return c.fsCall(ctx, http.MethodPost, id, "remove", nil, RemoveRequest{Path: path, Recursive: recursive}, nil)
}

// Mkdir makes the directory at path in the sandbox, and its missing
// parents, as mkdir -p does, and answers its entry. A file in the way is
// an *Error with code path_conflict.
func (c *Client) Mkdir(ctx context.Context, id, path string) (FileEntry, error) {
	var e FileEntry
	if err := bodyPath("path", path); err != nil {
		return e, err
	}
	err := c.fsCall(ctx, http.MethodPost, id, "mkdir", nil, MkdirRequest{Path: path}, &e)
	return e, err
}

// Rename renames from to to in the sandbox, making to's missing parents,
// and answers to's entry. A to that exists is an *Error with code
// path_conflict unless overwrite (see RenameRequest).
func (c *Client) Rename(ctx context.Context, id, from, to string, overwrite bool) (FileEntry, error) {
	var e FileEntry
	if err := bodyPath("from", from); err != nil {
		return e, err
	}
	if err := bodyPath("to", to); err != nil {
		return e, err
	}
	err := c.fsCall(ctx, http.MethodPost, id, "rename", nil, RenameRequest{From: from, To: to, Overwrite: overwrite}, &e)
	return e, err
}
