package server

import (
	"bufio"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"path"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hiloop/hiloop/api"
	"github.com/hiloop/hiloop/cluster"
	"github.com/hiloop/hiloop/control"
)

// Files move through the exec path: only it sees the workload container's
// own filesystem, as the image's own user, and everything that admits and
// limits an exec (organization, transports, session limits, quarantine)
// admits and limits a file. Each transfer is one command, a fixed script
// run by sh; the path and sizes are its arguments ($1, $2, ...), never
// text in the script, so nothing of the caller's is ever parsed by a
// shell.
//
// The scripts exit with these codes for what they found, and 127 (as sh
// does for a command it cannot find) when the image lacks a utility they
// need; any other code is the failure of a command the script ran
// (permissions, a full disk), told with its stderr.
const (
	exitNoTar      = 90
	exitShort      = 91
	exitNotFound   = 92
	exitConflict   = 93
	exitWriteError = 94
)

// putFileScript writes stdin to $1 through a temporary file $4 beside it,
// renamed over $1 only once exactly $2 bytes arrived, with mode $3. It
// reads exactly $2 bytes (head -c) rather than to EOF, since not every
// cluster delivers stdin's EOF to an exec'd command; fewer bytes (a cut
// upload, where EOF is delivered) leave $1 as it was and remove $4.
//
// It opens $4 once, and says so with a line on stdout before it reads: a
// cut upload whose command had not said so yet waits for $4 to appear
// before it removes it (cleanUp), since a command that outlives its stream
// (kwok's sees neither EOF nor a kill) may still make it.
const putFileScript = `for c in head wc mkdir chmod mv rm; do command -v $c >/dev/null 2>&1 || exit 127; done
[ -d "$1" ] && { echo "$1 is a directory" >&2; exit 93; }
d=${1%/*}
mkdir -p "${d:-/}" || exit 94
trap 'rm -f "$4"' EXIT
trap 'exit 129' HUP
trap 'exit 130' INT
trap 'exit 143' TERM
exec 3>"$4" || exit 94
echo opened
head -c "$2" >&3 || exit 94
exec 3>&-
n=$(wc -c <"$4") || exit 94
[ $n -eq "$2" ] || exit 91
chmod "$3" "$4" && mv -f "$4" "$1"`

// putTarScript extracts exactly $2 bytes of a tar stream from stdin into
// the directory $1, made if missing.
const putTarScript = `for c in head mkdir; do command -v $c >/dev/null 2>&1 || exit 127; done
command -v tar >/dev/null 2>&1 || exit 90
[ -e "$1" ] && [ ! -d "$1" ] && { echo "$1 is not a directory" >&2; exit 93; }
mkdir -p "$1" || exit 94
head -c "$2" | tar -x -f - -C "$1"`

// getScript writes a first line saying what $1 is, "f SIZE" for a regular
// file or "d" for a directory, then the file's SIZE bytes or the
// directory as a tar stream.
const getScript = `for c in head wc; do command -v $c >/dev/null 2>&1 || exit 127; done
if [ -d "$1" ]; then
  command -v tar >/dev/null 2>&1 || exit 90
  echo d
  exec tar -c -f - -C "$1" .
elif [ -f "$1" ]; then
  n=$(wc -c <"$1") || exit 94
  echo "f $n"
  exec head -c $n "$1"
elif [ -e "$1" ] || [ -L "$1" ]; then
  echo "$1 is not a regular file or a directory" >&2
  exit 93
fi
exit 92`

// cleanupScript removes an upload's temporary file $1 after the upload was
// cut, first waiting up to $2 seconds for it to appear: where the cluster
// never delivers stdin's EOF, putFileScript is left waiting for bytes that
// will not come, and may not have opened the file yet.
const cleanupScript = `i=0
while [ ! -e "$1" ] && [ $i -lt "$2" ]; do sleep 1; i=$((i+1)); done
rm -f "$1"`

// cleanupWaitSeconds bounds how long cleanupScript waits for a temporary
// file that its command had not said it opened.
const cleanupWaitSeconds = 10

// maxFileStderr caps what of a failed transfer's stderr is kept for the
// answer.
const maxFileStderr = 4 << 10

// fileTimeout bounds one transfer, as it bounds an exec stream; a stalled
// client is cut sooner by the I/O deadlines.
const fileTimeout = api.MaxExecTimeout

var fileMode = regexp.MustCompile(`^0?[0-7]{3}$`)

// validatePath refuses a path that is not absolute and clean, that is
// longer than api.MaxPathBytes, or that holds a NUL or another control
// character: paths reach the sandbox only as arguments, but a control
// character in a path is never what a caller meant, and would garble logs
// and listings.
func validatePath(p string) error {
	bad := func(msg string) error {
		return &apiError{status: http.StatusBadRequest, detail: api.ErrorDetail{Code: api.CodeInvalidPath, Field: "path", Message: "path: " + msg}}
	}
	switch {
	case p == "":
		return bad("is required")
	case len(p) > api.MaxPathBytes:
		return bad(fmt.Sprintf("longer than %d bytes", api.MaxPathBytes))
	case !strings.HasPrefix(p, "/"):
		return bad("must be absolute")
	case strings.IndexFunc(p, func(r rune) bool { return r < 0x20 || r == 0x7f }) >= 0:
		return bad("must not contain NUL or other control characters")
	case path.Clean(p) != p:
		return bad(fmt.Sprintf("must be clean (no '.', '..', '//' or trailing '/'): %q", truncate(path.Clean(p))))
	}
	return nil
}

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

	ctx, cancel := context.WithTimeout(sess.Context(), fileTimeout)
	defer cancel()
	var argv []string
	var tmp string
	if tar {
		argv = []string{"sh", "-c", putTarScript, "sh", p, strconv.FormatInt(size, 10)}
	} else {
		// The temporary name is short, so that any name that fits in the
		// directory fits beside it.
		tmp = path.Join(path.Dir(p), ".hiloop-"+randomSuffix())
		argv = []string{"sh", "-c", putFileScript, "sh", p, strconv.FormatInt(size, 10), mode, tmp}
	}
	sum := sha256.New()
	opened := &said{}
	body := &uploadBody{r: io.TeeReader(io.LimitReader(r.Body, size), sum), cancel: cancel,
		rc: http.NewResponseController(w), idle: s.o.FileIdleTimeout}
	stderr := &capWriter{max: maxFileStderr}
	st, err := sess.Exec(ctx, cluster.ExecRequest{Command: argv, Stdin: sess.In(body), Stdout: opened, Stderr: stderr})
	switch {
	case body.err != nil:
		// The upload was cut: nobody may be listening, but the sandbox is
		// left as it was, without the temporary file.
		if tmp != "" {
			s.cleanUp(sess, tmp, opened.any.Load())
		}
		s.writeError(w, r, newError(http.StatusBadRequest, api.CodeUploadIncomplete, fmt.Sprintf("the upload ended after %d of %d bytes; %s was not changed", body.n, size, p)))
	case err != nil:
		s.writeError(w, r, fileExecFailed(err))
	case st.Code != 0:
		if tmp != "" && st.Code >= 128 {
			s.cleanUp(sess, tmp, opened.any.Load())
		}
		s.writeError(w, r, fileExitError(st.Code, stderr.buf))
	default:
		writeJSON(w, http.StatusOK, api.FileInfo{Path: p, Size: size, SHA256: hex.EncodeToString(sum.Sum(nil))})
	}
}

// cleanUp removes an upload's temporary file, within the session's slot
// but past its request, which a cut upload has usually ended. A command
// that had not said it opened the file yet may still open it: one that
// outlives its stream (kwok's) does, late on a loaded machine. Then the
// script waits a bounded time for the file to appear before it removes it.
func (s *Server) cleanUp(sess *control.Session, tmp string, opened bool) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(sess.Context()), 30*time.Second)
	defer cancel()
	wait := "0"
	if !opened {
		wait = strconv.Itoa(cleanupWaitSeconds)
	}
	if st, err := sess.Exec(ctx, cluster.ExecRequest{Command: []string{"sh", "-c", cleanupScript, "sh", tmp, wait}, Stdout: io.Discard, Stderr: io.Discard}); err != nil || st.Code != 0 {
		s.log.Warn("could not remove a cut upload's temporary file", "sandbox", sess.SandboxID, "exit", st.Code, "err", err)
	}
}

// said is a writer that records whether anything was written to it: the
// file script's line saying it opened its temporary file.
type said struct{ any atomic.Bool }

func (s *said) Write(p []byte) (int, error) {
	if len(p) > 0 {
		s.any.Store(true)
	}
	return len(p), nil
}

func randomSuffix() string {
	b := make([]byte, 8)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// uploadBody is an upload's body on its way into the sandbox. A read that
// fails (the client went away, or sent fewer bytes than it announced) ends
// the command, and is remembered. Each read that brings bytes moves the
// connection's read deadline idle ahead, so an upload may take as long as
// it keeps moving.
type uploadBody struct {
	r      io.Reader
	cancel context.CancelFunc
	rc     *http.ResponseController
	idle   time.Duration
	// moved is when the deadline was last moved: at most once a second.
	moved time.Time
	n     int64
	err   error
}

func (b *uploadBody) Read(p []byte) (int, error) {
	if now := time.Now(); b.idle > 0 && now.Sub(b.moved) >= time.Second {
		b.rc.SetReadDeadline(now.Add(b.idle))
		b.moved = now
	}
	n, err := b.r.Read(p)
	b.n += int64(n)
	if err != nil && err != io.EOF {
		b.err = err
		b.cancel()
	}
	return n, err
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
	ctx, cancel := context.WithTimeout(sess.Context(), fileTimeout)
	defer cancel()

	// The command writes into a pipe the answer reads from: a slow client
	// slows the command down instead of growing a buffer.
	pr, pw := io.Pipe()
	stderr := &capWriter{max: maxFileStderr}
	type result struct {
		st  cluster.ExitStatus
		err error
	}
	done := make(chan result, 1)
	go func() {
		st, err := sess.Exec(ctx, cluster.ExecRequest{Command: []string{"sh", "-c", getScript, "sh", p}, Stdout: sess.Out(pw), Stderr: stderr})
		pw.Close()
		done <- result{st, err}
	}()
	ended := sync.OnceValue(func() result { return <-done })
	// Whatever happens, the command ends before the handler returns.
	defer func() {
		cancel()
		pr.CloseWithError(errAnswered)
		ended()
	}()
	out := bufio.NewReaderSize(pr, 64<<10)
	kind, size, herr := readFileHeader(out)
	if herr != nil {
		pr.CloseWithError(errAnswered)
		res := ended()
		switch {
		case res.err != nil:
			s.writeError(w, r, fileExecFailed(res.err))
		case res.st.Code != 0:
			s.writeError(w, r, fileExitError(res.st.Code, stderr.buf))
		default:
			s.writeError(w, r, fmt.Errorf("files: unreadable answer from the sandbox: %w", herr))
		}
		return
	}
	max := s.o.MaxFileBytes
	if size > max {
		s.writeError(w, r, newError(http.StatusRequestEntityTooLarge, api.CodeFileTooLarge, fmt.Sprintf("%s has %d bytes, more than the %d a download may have", p, size, max)))
		return
	}
	limit := size
	if kind == 'd' {
		w.Header().Set("Content-Type", api.TarMediaType)
		limit = max + 1
	} else {
		w.Header().Set("Content-Type", "application/octet-stream")
		w.Header().Set("Content-Length", strconv.FormatInt(size, 10))
	}
	w.WriteHeader(http.StatusOK)
	n, cerr := io.CopyBuffer(w, io.LimitReader(out, limit), make([]byte, 256<<10))
	if kind == 'd' && n > max {
		cerr = fmt.Errorf("the tar stream passed the cap of %d bytes", max)
	}
	if cerr != nil {
		cancel()
	}
	res := ended()
	// A file's answer must have exactly its announced length, and a
	// directory's tar must end with the command's success: anything else
	// cuts the connection, so the client sees a broken transfer, never a
	// short one that looks whole.
	if cerr != nil || res.err != nil || res.st.Code != 0 || n != limit && kind == 'f' {
		s.log.Info("download cut", "sandbox", id, "bytes", n, "exit", res.st.Code, "err", errors.Join(cerr, res.err), "request_id", info(r).id)
		panic(http.ErrAbortHandler)
	}
}

// errAnswered ends the command's output once the answer no longer reads it.
var errAnswered = errors.New("files: the answer is done")

// readFileHeader reads getScript's first line: 'f' and the file's size, or
// 'd' for a directory.
func readFileHeader(r *bufio.Reader) (kind byte, size int64, err error) {
	line, err := r.ReadSlice('\n')
	if err != nil {
		return 0, 0, err
	}
	f := strings.Fields(string(line))
	switch {
	case len(f) == 1 && f[0] == "d":
		return 'd', 0, nil
	case len(f) == 2 && f[0] == "f":
		n, err := strconv.ParseInt(f[1], 10, 64)
		if err != nil || n < 0 {
			return 0, 0, fmt.Errorf("size %q", f[1])
		}
		return 'f', n, nil
	}
	return 0, 0, fmt.Errorf("first line %q", truncate(string(line)))
}

// fileExitError maps a script's exit code to the answer.
func fileExitError(code int, stderr []byte) error {
	msg := strings.TrimSpace(api.Printable(string(stderr)))
	switch code {
	case exitNoTar:
		return newError(http.StatusUnprocessableEntity, api.CodeTarUnavailable, "the sandbox's image has no tar, which a directory needs; copy single files instead")
	case exitShort:
		return newError(http.StatusBadRequest, api.CodeUploadIncomplete, "the sandbox received fewer bytes than announced; the file was not changed")
	case exitNotFound:
		return newError(http.StatusNotFound, api.CodeFileNotFound, "no such file or directory in the sandbox")
	case exitConflict:
		return newError(http.StatusConflict, api.CodePathConflict, msg)
	case 126, 127:
		return errNoShell
	}
	if msg == "" {
		msg = fmt.Sprintf("the command in the sandbox exited %d", code)
	}
	return newError(http.StatusUnprocessableEntity, api.CodeFileOperationFailed, "the sandbox refused: "+msg)
}

// errNoShell answers a transfer in an image without sh, or without the few
// utilities the scripts run.
var errNoShell = newError(http.StatusUnprocessableEntity, api.CodeShellUnavailable, "the sandbox's image has no POSIX sh with head and wc, which copying files needs")

// fileExecFailed maps an exec that ended without an exit status. A runtime
// that could not start sh says so in its refusal (kubelets answer "executable
// file not found", kwok "no such file or directory").
func fileExecFailed(err error) error {
	var re *cluster.RemoteError
	if errors.As(err, &re) && (strings.Contains(re.Message, "executable file not found") || strings.Contains(re.Message, "no such file or directory")) {
		return errNoShell
	}
	return execFailed(err)
}
