package control

import (
	"bytes"
	"errors"
	"io"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/hiloop/hiloop/api"
	"github.com/hiloop/hiloop/cluster"
)

// A command given an environment or a working directory (ExecRequest's Env
// and Cwd) runs through setupScript, a fixed script run by sh: the
// directory and the NAME=VALUE pairs are its arguments, then "--", then the
// command's own argv, and nothing of the caller's is ever parsed by a
// shell. Kubernetes' exec has neither, so a shell in the image does it;
// a command with neither runs as it is, and needs no shell.
//
// The script says on stdout, at the end of a line, that the command is
// about to start (setupReady), then execs it. The line never reaches the
// caller. A set-up that fails exits with a status of its own (92 to 95,
// `command export` keeping a refused variable from ending the shell
// before it can say so), and without the ready line such a status is the
// script's, not the command's: the command never ran. That way a missing
// directory is an error of its own, never mistaken for a command's exit
// code. Any other status is the command's even without the line, which
// can be lost: a kubelet's terminal can drop all output when stdin closes
// at once, and a sh the workload replaced may say nothing; what was
// written before the line never came is dropped.
//
// The loop variable is in the reserved prefix, so no variable of the
// caller's can be the one the loop writes.
const setupScript = `[ -z "$1" ] || cd "$1" 2>/dev/null || { [ -e "$1" ] || exit 92; [ -d "$1" ] || exit 93; exit 94; }
shift
for HILOOP_SETUP_ARG in "$@"; do
  shift
  [ "$HILOOP_SETUP_ARG" = -- ] && break
  command export "$HILOOP_SETUP_ARG" || exit 95
done
echo ` + setupReady + `
exec "$@"`

// setupReady is the line setupScript writes once the command is set up.
const setupReady = "hiloop-exec-ready"

// The exit statuses setupScript gives for a working directory it cannot
// enter, and for a variable its sh refused to set.
const (
	exitCwdMissing = 92
	exitCwdNotDir  = 93
	exitCwdDenied  = 94
	exitEnvRefused = 95
)

// maxSetupOutput caps what the set-up said before it failed that is kept
// for the error.
const maxSetupOutput = 4 << 10

// Why a command's set-up failed (SetupError.Kind).
var (
	// ErrCwdNotFound: the working directory does not exist in the sandbox.
	ErrCwdNotFound = errors.New("no such directory in the sandbox")
	// ErrCwdNotDir: the working directory is not a directory.
	ErrCwdNotDir = errors.New("not a directory in the sandbox")
	// ErrCwdDenied: the working directory cannot be entered (permissions).
	ErrCwdDenied = errors.New("the directory cannot be entered (permission denied)")
	// ErrSetupNoShell: the image has no POSIX sh, which an environment or
	// a working directory needs.
	ErrSetupNoShell = errors.New("the sandbox's image has no POSIX sh, which env and cwd need")
	// ErrEnvRefused: the sandbox's sh refused to set a variable (one it
	// keeps read-only, say); Output says what it said.
	ErrEnvRefused = errors.New("the sandbox's sh could not set up the command's environment")
)

// SetupError is a command that never ran because its working directory or
// environment could not be set up in the sandbox. Cwd is the directory
// asked for; Code the script's exit status (-1 when sh could not be
// started); Output what the script wrote before it failed, made printable,
// trimmed and at most a few KiB, which is fit to send: the sandbox is the
// caller's own.
type SetupError struct {
	Kind   error
	Cwd    string
	Code   int
	Output string
}

func (e *SetupError) Error() string {
	msg := e.Kind.Error()
	if e.Cwd != "" && (e.Kind == ErrCwdNotFound || e.Kind == ErrCwdNotDir || e.Kind == ErrCwdDenied) {
		msg = "cwd " + e.Cwd + ": " + msg
	}
	if e.Output != "" {
		msg += ": " + e.Output
	}
	return msg
}
func (e *SetupError) Unwrap() error { return e.Kind }

// execSetup is a command on its way through setupScript: it reads the
// ready line off the command's stdout and keeps what came before it.
type execSetup struct {
	cwd    string
	ready  atomic.Bool
	mu     sync.Mutex
	said   []byte
	stdout io.Writer
	// line is the end of the stdout line being read, up to the ready
	// line's length and one byte more.
	line []byte
}

// withSetup returns req to run through setupScript, and its set-up, or req
// unchanged and nil when it asks for no environment and no directory.
func withSetup(req cluster.ExecRequest) (cluster.ExecRequest, *execSetup) {
	if len(req.Env) == 0 && req.Cwd == "" {
		req.Env, req.Cwd = nil, ""
		return req, nil
	}
	s := &execSetup{cwd: req.Cwd, stdout: req.Stdout}
	if s.stdout == nil {
		s.stdout = io.Discard
	}
	argv := []string{"sh", "-c", setupScript, "sh", req.Cwd}
	for _, k := range slices.Sorted(maps.Keys(req.Env)) {
		argv = append(argv, k+"="+req.Env[k])
	}
	argv = append(argv, "--")
	req.Command = append(argv, req.Command...)
	req.Stdout = (*setupStdout)(s)
	if req.Stderr != nil {
		req.Stderr = &setupStderr{s: s, w: req.Stderr}
	}
	req.Env, req.Cwd = nil, ""
	return req, s
}

// keep records what the set-up said, up to maxSetupOutput.
func (s *execSetup) keep(p []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if room := maxSetupOutput - len(s.said); room > 0 {
		s.said = append(s.said, p[:min(room, len(p))]...)
	}
}

// failed is the error of a command whose script exited with one of its
// own statuses without saying it was ready, or nil when st is the
// command's.
func (s *execSetup) failed(st cluster.ExitStatus) error {
	if s.ready.Load() {
		return nil
	}
	e := &SetupError{Cwd: s.cwd, Code: st.Code}
	switch st.Code {
	case exitCwdMissing:
		e.Kind = ErrCwdNotFound
	case exitCwdNotDir:
		e.Kind = ErrCwdNotDir
	case exitCwdDenied:
		e.Kind = ErrCwdDenied
	case exitEnvRefused:
		s.mu.Lock()
		e.Kind, e.Output = ErrEnvRefused, strings.TrimSpace(api.Printable(string(s.said)))
		s.mu.Unlock()
	default:
		return nil
	}
	return e
}

// setupStdout is the command's stdout while its set-up runs: it passes on
// nothing up to and including the ready line, and everything after it.
type setupStdout execSetup

func (w *setupStdout) Write(p []byte) (int, error) {
	s := (*execSetup)(w)
	if s.ready.Load() {
		return s.stdout.Write(p)
	}
	n := len(p)
	for len(p) > 0 {
		i := bytes.IndexByte(p, '\n')
		if i < 0 {
			s.addLine(p)
			s.keep(p)
			return n, nil
		}
		s.addLine(p[:i])
		// A terminal writes the line's end as \r\n, and echoes what is
		// typed ahead before the line: the line ends with the ready text.
		if bytes.HasSuffix(bytes.TrimSuffix(s.line, []byte("\r")), []byte(setupReady)) {
			s.ready.Store(true)
			if rest := p[i+1:]; len(rest) > 0 {
				if _, err := s.stdout.Write(rest); err != nil {
					return 0, err
				}
			}
			return n, nil
		}
		s.keep(p[:i+1])
		s.line = s.line[:0]
		p = p[i+1:]
	}
	return n, nil
}

// addLine adds p to the end of the line being read.
func (s *execSetup) addLine(p []byte) {
	s.line = append(s.line, p...)
	if keep := len(setupReady) + 1; len(s.line) > keep {
		s.line = append(s.line[:0], s.line[len(s.line)-keep:]...)
	}
}

// setupStderr passes the command's stderr on as it comes, and keeps a copy
// of its start until the command is ready, for the error of a set-up that
// failed. Nothing of it is held back: with separate streams, a command's
// first words on stderr may come before the ready line on stdout.
type setupStderr struct {
	s *execSetup
	w io.Writer
}

func (w *setupStderr) Write(p []byte) (int, error) {
	if !w.s.ready.Load() {
		w.s.keep(p)
	}
	return w.w.Write(p)
}
