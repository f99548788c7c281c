package server

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"regexp"
	"strconv"

	"github.com/hiloop/hiloop/api"
	"github.com/hiloop/hiloop/control"
)

// The file-transfer protocol (the scripts, what their exit statuses mean,
// the atomic write, a cut upload's clean-up) is the core's
// (control/files.go): these handlers parse the request and write the
// answer.

var fileMode = regexp.MustCompile(`^0?[0-7]{3}$`)

// validatePath refuses a path that control.ValidatePath refuses, as the
// field path.
func validatePath(p string) error { return control.ValidatePath("path", p) }

// fileQuery reads the query of a files request.
func fileQuery(r *http.Request, known ...string) (string, error) {
	q := r.URL.Query()
	if err := knownQuery(q, known...); err != nil {
		return "", err
	}
	if len(q["path"]) > 1 {
		return "", &apiError{status: http.StatusBadRequest, detail: api.ErrorDetail{Code: api.CodeInvalidPath, Field: "path", Message: "path: given more than once"}}
	}
	p := q.Get("path")
	return p, validatePath(p)
}

func (s *Server) putFile(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	p, err := fileQuery(r, "path", "mode", "wake")
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	tar := false
	if ct := r.Header.Get("Content-Type"); ct != "" {
		mt, _, err := mime.ParseMediaType(ct)
		if err != nil {
			s.writeError(w, r, newError(http.StatusUnsupportedMediaType, api.CodeUnsupportedMediaType, "Content-Type: not a media type"))
			return
		}
		tar = mt == api.TarMediaType
	}
	mode := r.URL.Query().Get("mode")
	switch {
	case mode != "" && tar:
		s.writeError(w, r, fieldError("mode", "applies to a single file, not to a tar stream"))
		return
	case mode == "":
		mode = "0644"
	case !fileMode.MatchString(mode):
		s.writeError(w, r, fieldError("mode", "must be octal permissions such as 0644"))
		return
	}
	size := r.ContentLength
	switch {
	case size < 0:
		s.writeError(w, r, newError(http.StatusLengthRequired, api.CodeLengthRequired, "an upload needs a Content-Length: the sandbox reads exactly that many bytes"))
		return
	case size > s.o.MaxFileBytes:
		s.writeError(w, r, newError(http.StatusRequestEntityTooLarge, api.CodeFileTooLarge, fmt.Sprintf("%d bytes is more than the %d an upload may have", size, s.o.MaxFileBytes)))
		return
	}
	sess, ok := s.admitExec(w, r, id, "files")
	if !ok {
		return
	}
	defer sess.End()

	sum := sha256.New()
	// The body is held to the listener's one deadline policy (ConnLimits),
	// whose clock starts at this first read, once the sandbox is ready.
	body := io.TeeReader(io.LimitReader(r.Body, size), sum)
	if tar {
		err = sess.PutTar(sess.Context(), p, size, body)
	} else {
		err = sess.PutFile(sess.Context(), p, size, mode, body)
	}
	var cut *control.UploadCutError
	switch {
	case errors.As(err, &cut):
		s.writeError(w, r, newError(http.StatusBadRequest, api.CodeUploadIncomplete, fmt.Sprintf("the upload ended after %d of %d bytes; %s was not changed", cut.Got, cut.Want, p)))
	case err != nil:
		s.writeError(w, r, fileFailed(err))
	default:
		writeJSON(w, http.StatusOK, api.FileInfo{Path: p, Size: size, SHA256: hex.EncodeToString(sum.Sum(nil))})
	}
}

func (s *Server) getFile(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	p, err := fileQuery(r, "path", "wake")
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	sess, ok := s.admitExec(w, r, id, "files")
	if !ok {
		return
	}
	defer sess.End()
	max := s.o.MaxFileBytes
	dl, err := sess.GetFile(sess.Context(), p, max)
	var big *control.FileTooLargeError
	switch {
	case errors.As(err, &big):
		s.writeError(w, r, newError(http.StatusRequestEntityTooLarge, api.CodeFileTooLarge, fmt.Sprintf("%s has %d bytes, more than the %d a download may have", p, big.Size, big.Max)))
		return
	case err != nil:
		s.writeError(w, r, fileFailed(err))
		return
	}
	// Whatever happens, the command ends before the handler returns.
	defer dl.Close()
	if dl.Dir {
		w.Header().Set("Content-Type", api.TarMediaType)
	} else {
		w.Header().Set("Content-Type", "application/octet-stream")
		w.Header().Set("Content-Length", strconv.FormatInt(dl.Size, 10))
	}
	w.WriteHeader(http.StatusOK)
	n, cerr := io.CopyBuffer(w, dl, make([]byte, 256<<10))
	// A file's answer must have exactly its announced length, and a
	// directory's tar must end with the command's success: anything else
	// cuts the connection, so the client sees a broken transfer, never a
	// short one that looks whole.
	var short *control.DownloadCutError
	if errors.As(dl.Done(cerr), &short) {
		s.log.Info("download cut", "sandbox", id, "bytes", n, "exit", short.Exit, "err", short.Err, "request_id", info(r).id)
		panic(http.ErrAbortHandler)
	}
}

// fileFailed maps a transfer the core did not do to the answer.
func fileFailed(err error) error {
	var fe *control.FileError
	if !errors.As(err, &fe) {
		return execFailed(err)
	}
	switch fe.Kind {
	case control.ErrNoTar:
		return newError(http.StatusUnprocessableEntity, api.CodeTarUnavailable, "the sandbox's image has no tar, which a directory needs; copy single files instead")
	case control.ErrUploadShort:
		return newError(http.StatusBadRequest, api.CodeUploadIncomplete, "the sandbox received fewer bytes than announced; the file was not changed")
	case control.ErrFileNotFound:
		return newError(http.StatusNotFound, api.CodeFileNotFound, "no such file or directory in the sandbox")
	case control.ErrPathConflict:
		msg := fe.Stderr
		if msg == "" {
			// The sandbox said nothing of why; the answer still does.
			msg = "the path conflicts with what is in the sandbox (a file where a directory is needed, a directory where a file is, or something already there)"
		}
		return newError(http.StatusConflict, api.CodePathConflict, msg)
	case control.ErrNoShell:
		return errNoShell
	}
	msg := fe.Stderr
	if msg == "" {
		msg = fmt.Sprintf("the command in the sandbox exited %d", fe.Code)
	}
	return newError(http.StatusUnprocessableEntity, api.CodeFileOperationFailed, "the sandbox refused: "+msg)
}

// errNoShell answers a transfer in an image without sh, or without the few
// utilities the scripts run.
var errNoShell = newError(http.StatusUnprocessableEntity, api.CodeShellUnavailable, "the sandbox's image has no POSIX sh with head and wc, which copying files needs")
