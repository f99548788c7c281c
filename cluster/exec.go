package cluster

import (
	"errors"
	"io"
	"time"
)

// ExecRequest is one command to run in a sandbox.
type ExecRequest struct {
	Command []string
	// Env is added to the command's environment, and Cwd (absolute, or
	// empty for the container's own) is the directory it runs in. The
	// core applies them: it runs the command through a fixed sh script
	// that takes them as arguments, so an Executor never sees them set.
	Env map[string]string
	Cwd string
	// Stdin, when not nil, is copied to the command; its EOF is delivered
	// as the command's stdin EOF.
	Stdin io.Reader
	// Stdout and Stderr receive the command's output. With TTY, stderr is
	// merged into stdout by the terminal.
	Stdout, Stderr io.Writer
	TTY            bool
	// Resize carries terminal size changes (TTY only).
	Resize <-chan TerminalSize
	// ConnectTimeout bounds reaching the sandbox (the stream's set-up),
	// apart from how long the command may run; only ctx bounds it when zero.
	ConnectTimeout time.Duration
	// Helper runs the command in the session helper's container instead
	// of the workload's. No way in ever sets it: only hiloop's own runtime
	// probe does.
	Helper bool
}

// TerminalSize is a terminal's width and height in characters.
type TerminalSize struct {
	Width  uint16
	Height uint16
}

// ExitStatus is how a command ended, as the cluster's terminating status
// said.
type ExitStatus struct {
	// Code is the exit code; 128+n for a death by signal n.
	Code int
	// Signal names the signal that killed the command, when the status
	// says so.
	Signal string
}

// ErrNoStatus: the exec stream ended without a terminating status. Such a
// stream is never an exit code, least of all 0.
var ErrNoStatus = errors.New("exec stream ended without a status frame")

// ConnectError reports that the exec stream could not be set up: the
// cluster could not be reached, or refused the stream, or the caller's
// context or the set-up's deadline (ConnectTimeout) ended first (Err then
// wraps that context's error). No command ran.
type ConnectError struct{ Err error }

func (e *ConnectError) Error() string { return "exec: connect: " + e.Err.Error() }
func (e *ConnectError) Unwrap() error { return e.Err }

// RemoteError is a failure status that carries no exit code: the runtime
// could not run the command at all, for example.
type RemoteError struct{ Message string }

func (e *RemoteError) Error() string { return "remote: " + e.Message }
