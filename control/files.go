package control

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"path"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hiloop/hiloop/api"
	"github.com/hiloop/hiloop/cluster"
)

// Files move through the exec path: only it sees the workload container's
// own filesystem, as the image's own user, and everything that admits and
// limits an exec (organization, transports, session limits, quarantine)
// admits and limits a file. Each transfer is one command, a fixed script
// run by sh; the path and sizes are its arguments ($1, $2, ...), never
// text in the script, so nothing of the caller's is ever parsed by a
// shell. A way in admits a session (AdmitExec) and calls PutFile, PutTar
// or GetFile on it; it checks the path first (absolute and clean).
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

// sizeFunc defines size, which prints a file's size from its metadata:
// the fifth field of POSIX ls -ln. wc -c would read the whole file again,
// as busybox's does, through the sandbox's file system.
const sizeFunc = `size() { set -f; set -- $(ls -ln -- "$1"); case $5 in ''|*[!0-9]*) return 1;; esac; echo "$5"; }
`

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
const putFileScript = sizeFunc + `for c in head ls mkdir chmod mv rm; do command -v $c >/dev/null 2>&1 || exit 127; done
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
n=$(size "$4") || exit 94
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
const getScript = sizeFunc + `for c in head ls; do command -v $c >/dev/null 2>&1 || exit 127; done
if [ -d "$1" ]; then
  command -v tar >/dev/null 2>&1 || exit 90
  echo d
  exec tar -c -f - -C "$1" .
elif [ -f "$1" ]; then
  n=$(size "$1") || exit 94
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

// FileTimeout bounds one transfer, as it bounds an exec stream; a way in
// may cut a stalled caller sooner.
const FileTimeout = api.MaxExecTimeout

// What a transfer found in the sandbox (FileError.Kind).
var (
	// ErrNoTar: the image has no tar, which a directory needs.
	ErrNoTar = errors.New("the sandbox's image has no tar, which a directory needs")
	// ErrUploadShort: the sandbox received fewer bytes than announced; the
	// file was not changed.
	ErrUploadShort = errors.New("the sandbox received fewer bytes than announced")
	// ErrFileNotFound: no such file or directory in the sandbox.
	ErrFileNotFound = errors.New("no such file or directory in the sandbox")
	// ErrPathConflict: the path is of the wrong kind (a directory where a
	// file goes, or neither a file nor a directory); Stderr says which.
	ErrPathConflict = errors.New("the path in the sandbox is of the wrong kind")
	// ErrNoShell: the image has no POSIX sh, or not the few utilities the
	// scripts run.
	ErrNoShell = errors.New("the sandbox's image has no POSIX sh with head and wc, which copying files needs")
	// ErrFileRefused: a command the script ran failed (permissions, a full
	// disk); Stderr tells how.
	ErrFileRefused = errors.New("the sandbox refused the transfer")
)

// FileError is a transfer that the sandbox did not do, by kind. Code is
// the script's exit status (-1 when sh could not be started at all), and
// Stderr what it printed (at most a few
// KiB, made printable and trimmed), which is fit to send: the sandbox is
// the caller's own.
type FileError struct {
	Kind   error
	Code   int
	Stderr string
}

func (e *FileError) Error() string {
	if e.Stderr != "" {
		return e.Kind.Error() + ": " + e.Stderr
	}
	return e.Kind.Error()
}
func (e *FileError) Unwrap() error { return e.Kind }

// UploadCutError: reading the upload failed (its caller went away, or
// sent fewer bytes than it announced) after Got of Want bytes. The
// sandbox is left as it was.
type UploadCutError struct {
	Got, Want int64
	Err       error
}

func (e *UploadCutError) Error() string {
	return fmt.Sprintf("the upload ended after %d of %d bytes: %v", e.Got, e.Want, e.Err)
}
func (e *UploadCutError) Unwrap() error { return e.Err }

// FileTooLargeError: the file to download has Size bytes, more than the
// Max the caller may take.
type FileTooLargeError struct{ Size, Max int64 }

func (e *FileTooLargeError) Error() string {
	return fmt.Sprintf("%d bytes is more than the %d a download may have", e.Size, e.Max)
}

// PutFile writes size bytes of body to the file p in the session's
// sandbox, with mode (octal, such as "0644"), atomically: through a
// temporary file beside p, renamed over it only once exactly size bytes
// arrived. It returns nil once p holds them, else an *UploadCutError (p
// unchanged), a *FileError, or an error of Exec. A cut upload's temporary
// file is removed.
func (s *Session) PutFile(ctx context.Context, p string, size int64, mode string, body io.Reader) error {
	// The temporary name is short, so that any name that fits in the
	// directory fits beside it.
	tmp := path.Join(path.Dir(p), ".hiloop-"+randomSuffix())
	return s.put(ctx, []string{"sh", "-c", putFileScript, "sh", p, strconv.FormatInt(size, 10), mode, tmp}, tmp, size, body)
}

// PutTar extracts size bytes of a tar stream from body into the directory
// dir of the session's sandbox, made if missing. Its errors are those of
// PutFile.
func (s *Session) PutTar(ctx context.Context, dir string, size int64, body io.Reader) error {
	return s.put(ctx, []string{"sh", "-c", putTarScript, "sh", dir, strconv.FormatInt(size, 10)}, "", size, body)
}

// put runs an upload's script, and removes its temporary file tmp, when it
// has one, after the upload was cut or its command killed.
func (s *Session) put(ctx context.Context, argv []string, tmp string, size int64, body io.Reader) error {
	ctx, cancel := context.WithTimeout(ctx, FileTimeout)
	defer cancel()
	opened := &said{}
	in := &cutReader{r: body, cancel: cancel}
	stderr := &capWriter{max: maxFileStderr}
	st, err := s.Exec(ctx, cluster.ExecRequest{Command: argv, Stdin: s.In(in), Stdout: opened, Stderr: stderr})
	switch {
	case in.err != nil:
		// The upload was cut: nobody may be listening, but the sandbox is
		// left as it was, without the temporary file.
		if tmp != "" {
			s.cleanUp(tmp, opened.any.Load())
		}
		return &UploadCutError{Got: in.n, Want: size, Err: in.err}
	case err != nil:
		return fileExecFailed(err)
	case st.Code != 0:
		if tmp != "" && st.Code >= 128 {
			s.cleanUp(tmp, opened.any.Load())
		}
		return fileExitError(st.Code, stderr.buf)
	}
	return nil
}

// cleanUp removes an upload's temporary file, within the session's slot
// but past its caller's context, which a cut upload has usually ended. A
// command that had not said it opened the file yet may still open it: one
// that outlives its stream (kwok's) does, late on a loaded machine. Then
// the script waits a bounded time for the file to appear before it
// removes it.
func (s *Session) cleanUp(tmp string, opened bool) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(s.Context()), 30*time.Second)
	defer cancel()
	wait := "0"
	if !opened {
		wait = strconv.Itoa(cleanupWaitSeconds)
	}
	if st, err := s.Exec(ctx, cluster.ExecRequest{Command: []string{"sh", "-c", cleanupScript, "sh", tmp, wait}, Stdout: io.Discard, Stderr: io.Discard}); err != nil || st.Code != 0 {
		s.c.log.Warn("could not remove a cut upload's temporary file", "sandbox", s.SandboxID, "exit", st.Code, "err", err)
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

// cutReader is an upload on its way into the sandbox. A read that fails
// ends the command, and is remembered with how many bytes came before.
type cutReader struct {
	r      io.Reader
	cancel context.CancelFunc
	n      int64
	err    error
}

func (b *cutReader) Read(p []byte) (int, error) {
	n, err := b.r.Read(p)
	b.n += int64(n)
	if err != nil && err != io.EOF {
		b.err = err
		b.cancel()
	}
	return n, err
}

// capWriter keeps the first max bytes.
type capWriter struct {
	max int
	buf []byte
}

func (c *capWriter) Write(p []byte) (int, error) {
	if room := c.max - len(c.buf); room < len(p) {
		if room > 0 {
			c.buf = append(c.buf, p[:room]...)
		}
		return len(p), nil
	}
	c.buf = append(c.buf, p...)
	return len(p), nil
}

// Download is a file or a directory on its way out of a sandbox
// (GetFile): it reads the file's Size bytes, or the directory as a tar
// stream of at most the cap GetFile was given and one byte more. The
// command writes into a pipe the reader reads from: a slow reader slows
// the command down instead of growing a buffer.
type Download struct {
	// Dir: a directory, as a tar stream; else a regular file of Size
	// bytes.
	Dir  bool
	Size int64

	out    io.Reader
	max, n int64
	cancel context.CancelFunc
	pr     *io.PipeReader
	ended  func() execResult
}

type execResult struct {
	st  cluster.ExitStatus
	err error
}

// GetFile starts reading the file or directory p of the session's sandbox,
// of at most max bytes. It answers a *FileTooLargeError for a file past
// max, a *FileError, an error of Exec, or a Download, which its caller
// reads and then ends with Done, and always Closes.
func (s *Session) GetFile(ctx context.Context, p string, max int64) (*Download, error) {
	ctx, cancel := context.WithTimeout(ctx, FileTimeout)
	pr, pw := io.Pipe()
	stderr := &capWriter{max: maxFileStderr}
	done := make(chan execResult, 1)
	go func() {
		st, err := s.Exec(ctx, cluster.ExecRequest{Command: []string{"sh", "-c", getScript, "sh", p}, Stdout: s.Out(pw), Stderr: stderr})
		pw.Close()
		done <- execResult{st, err}
	}()
	d := &Download{max: max, cancel: cancel, pr: pr, ended: sync.OnceValue(func() execResult { return <-done })}
	out := bufio.NewReaderSize(pr, 64<<10)
	kind, size, herr := readFileHeader(out)
	if herr != nil {
		pr.CloseWithError(errAnswered)
		res := d.ended()
		d.Close()
		switch {
		case res.err != nil:
			return nil, fileExecFailed(res.err)
		case res.st.Code != 0:
			return nil, fileExitError(res.st.Code, stderr.buf)
		}
		return nil, fmt.Errorf("files: unreadable answer from the sandbox: %w", herr)
	}
	if size > max {
		d.Close()
		return nil, &FileTooLargeError{Size: size, Max: max}
	}
	d.Dir, d.Size = kind == 'd', size
	limit := size
	if d.Dir {
		limit = max + 1
	}
	d.out = io.LimitReader(out, limit)
	return d, nil
}

// Read reads what the command writes.
func (d *Download) Read(p []byte) (int, error) {
	n, err := d.out.Read(p)
	d.n += int64(n)
	return n, err
}

// DownloadCutError: a download fell short of whole (Download.Done). Exit
// is the command's exit status, Err what failed, when anything did.
type DownloadCutError struct {
	Exit int
	Err  error
}

func (e *DownloadCutError) Error() string {
	return fmt.Sprintf("the download was cut (exit status %d): %v", e.Exit, e.Err)
}

// Done ends a download whose reading stopped, with cut the error that
// stopped it early (its caller could not pass on what it read), if any.
// It waits for the command and answers nil only when the reader got all
// of it: a file's exactly Size bytes, or a directory's whole tar stream
// within the cap, ended by the command's success. Anything else is a
// *DownloadCutError: a way in must not pass on a short transfer that
// looks whole.
func (d *Download) Done(cut error) error {
	if d.Dir && d.n > d.max {
		cut = fmt.Errorf("the tar stream passed the cap of %d bytes", d.max)
	}
	if cut != nil {
		d.cancel()
	}
	res := d.ended()
	if cut != nil || res.err != nil || res.st.Code != 0 || !d.Dir && d.n != d.Size {
		return &DownloadCutError{Exit: res.st.Code, Err: errors.Join(cut, res.err)}
	}
	return nil
}

// Close ends the command, when it still runs, and waits for it.
func (d *Download) Close() {
	d.cancel()
	d.pr.CloseWithError(errAnswered)
	d.ended()
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
	first := string(line)
	if len(first) > 64 {
		first = first[:64] + "..."
	}
	return 0, 0, fmt.Errorf("first line %q", first)
}

// fileExitError is the FileError of a script's exit status.
func fileExitError(code int, stderr []byte) error {
	e := &FileError{Code: code, Stderr: strings.TrimSpace(api.Printable(string(stderr)))}
	switch code {
	case exitNoTar:
		e.Kind = ErrNoTar
	case exitShort:
		e.Kind = ErrUploadShort
	case exitNotFound:
		e.Kind = ErrFileNotFound
	case exitConflict:
		e.Kind = ErrPathConflict
	case 126, 127:
		e.Kind = ErrNoShell
	default:
		e.Kind = ErrFileRefused
	}
	return e
}

// fileExecFailed is the error of an exec that ended without an exit
// status: ErrNoShell when the runtime could not start sh, which it says in
// its refusal (kubelets answer "executable file not found", kwok "no such
// file or directory"), else the error itself.
func fileExecFailed(err error) error {
	if noProgram(err) {
		return &FileError{Kind: ErrNoShell, Code: -1}
	}
	return err
}

// noProgram reports whether err is the runtime's refusal to start a
// command whose program the image does not have: kubelets answer
// "executable file not found", kwok "no such file or directory".
func noProgram(err error) bool {
	var re *cluster.RemoteError
	return errors.As(err, &re) && (strings.Contains(re.Message, "executable file not found") || strings.Contains(re.Message, "no such file or directory"))
}
