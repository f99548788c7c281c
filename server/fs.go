package server

import (
	"errors"
	"fmt"
	"net/http"

	"github.com/hiloop/hiloop/api"
	"github.com/hiloop/hiloop/control"
)

// File operations (list, stat, remove, mkdir, rename) are the core's
// (control/fsops.go): each handler checks its input, admits an exec
// session as a file transfer does, and writes what the core answered.

func (s *Server) fsList(w http.ResponseWriter, r *http.Request) {
	p, err := fileQuery(r, "path", "wake")
	s.fsRun(w, r, err, func(sess *control.Session) (any, error) {
		l, err := sess.List(sess.Context(), p)
		if err != nil {
			return nil, err
		}
		out := api.FileList{Path: p, Entries: make([]api.FileEntry, 0, len(l.Entries)), Truncated: l.Truncated}
		for _, e := range l.Entries {
			out.Entries = append(out.Entries, fileEntry(e, ""))
		}
		return out, nil
	})
}

func (s *Server) fsStat(w http.ResponseWriter, r *http.Request) {
	p, err := fileQuery(r, "path", "wake")
	s.fsRun(w, r, err, func(sess *control.Session) (any, error) {
		e, err := sess.Stat(sess.Context(), p)
		return fileEntry(e, p), err
	})
}

func (s *Server) fsRemove(w http.ResponseWriter, r *http.Request) {
	var req api.RemoveRequest
	err := fsBody(w, r, &req)
	if err == nil {
		err = control.CheckRemove(req.Path)
	}
	s.fsRun(w, r, err, func(sess *control.Session) (any, error) {
		return nil, sess.Remove(sess.Context(), req.Path, req.Recursive)
	})
}

func (s *Server) fsMkdir(w http.ResponseWriter, r *http.Request) {
	var req api.MkdirRequest
	err := fsBody(w, r, &req)
	if err == nil {
		err = control.ValidatePath("path", req.Path)
	}
	s.fsRun(w, r, err, func(sess *control.Session) (any, error) {
		e, err := sess.Mkdir(sess.Context(), req.Path)
		return fileEntry(e, req.Path), err
	})
}

func (s *Server) fsRename(w http.ResponseWriter, r *http.Request) {
	var req api.RenameRequest
	err := fsBody(w, r, &req)
	if err == nil {
		err = control.CheckRename(req.From, req.To)
	}
	s.fsRun(w, r, err, func(sess *control.Session) (any, error) {
		e, err := sess.Rename(sess.Context(), req.From, req.To, req.Overwrite)
		return fileEntry(e, req.To), err
	})
}

// fsRun answers a file operation whose input was read and checked with
// the error err: a refusal of it, or else op's answer in an exec session
// admitted as a file transfer's (nil is 204 No Content).
func (s *Server) fsRun(w http.ResponseWriter, r *http.Request, err error, op func(*control.Session) (any, error)) {
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	sess, ok := s.admitExec(w, r, r.PathValue("id"), "files")
	if !ok {
		return
	}
	defer sess.End()
	out, err := op(sess)
	switch {
	case err != nil:
		s.writeError(w, r, fsFailed(err))
	case out == nil:
		w.WriteHeader(http.StatusNoContent)
	default:
		writeJSON(w, http.StatusOK, out)
	}
}

// fsBody reads a file operation's JSON body, with wake its only query
// parameter.
func fsBody(w http.ResponseWriter, r *http.Request, v any) error {
	if err := knownQuery(r.URL.Query(), "wake"); err != nil {
		return err
	}
	return decode(w, r, v)
}

// fileEntry is the answer for one file; p is its path, "" in a listing.
func fileEntry(e control.FileStat, p string) api.FileEntry {
	return api.FileEntry{Name: e.Name, Path: p, Type: string(e.Type), Size: e.Size, Mode: e.Mode, MTime: e.MTime}
}

// fsFailed maps a file operation the core did not do to the answer: as a
// transfer's (fileFailed), and for what only file operations meet.
func fsFailed(err error) error {
	var fe *control.FileError
	switch {
	case errors.As(err, &fe) && fe.Kind == control.ErrNotEmpty:
		msg := fe.Stderr
		if msg == "" {
			msg = "the directory is not empty"
		}
		return newError(http.StatusConflict, api.CodeDirectoryNotEmpty, msg)
	case errors.As(err, &fe) && fe.Kind == control.ErrUnreadable:
		return newError(http.StatusUnprocessableEntity, api.CodeFileOperationFailed, "the sandbox answered what is not a stat record of the path: the image's stat must take -c FORMAT as busybox's and GNU's do")
	case errors.As(err, &fe) && fe.Kind == control.ErrNoShell:
		msg := "the sandbox's image lacks what file operations need: a POSIX sh with stat -c (and rm, rmdir, mkdir and mv to change files)"
		if fe.Stderr != "" {
			msg += "; " + fe.Stderr
		}
		return newError(http.StatusUnprocessableEntity, api.CodeShellUnavailable, msg)
	case errors.Is(err, control.ErrExecTimeout):
		return newError(http.StatusGatewayTimeout, api.CodeExecTimeout, fmt.Sprintf("the operation ran past %s and was ended; part of it may be done", control.FSTimeout))
	}
	return fileFailed(err)
}
