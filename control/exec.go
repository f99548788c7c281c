package control

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/hiloop/hiloop/api"
	"github.com/hiloop/hiloop/cluster"
)

// ArgvError is a command line no sandbox is given: empty, with a NUL byte
// or an argument that is not UTF-8 (the kubelet's runtime API carries
// arguments only as UTF-8), or past api.MaxArgs arguments or
// api.MaxArgvBytes bytes.
type ArgvError struct{ Problem string }

func (e *ArgvError) Error() string { return "command " + e.Problem }

// CheckArgv holds a command line to the limits every way in shares (the
// API's exec and files, and the SSH gateway's sessions): Session.Exec
// checks it, and the API checks it before admission too, to answer 400.
func CheckArgv(argv []string) error {
	if len(argv) == 0 || argv[0] == "" {
		return &ArgvError{"must name a program"}
	}
	if len(argv) > api.MaxArgs {
		return &ArgvError{fmt.Sprintf("may have at most %d arguments", api.MaxArgs)}
	}
	total := 0
	for _, a := range argv {
		total += len(a) + 1
		if strings.ContainsRune(a, 0) {
			return &ArgvError{"arguments cannot contain NUL bytes"}
		}
		if !utf8.ValidString(a) {
			return &ArgvError{"arguments must be UTF-8"}
		}
	}
	if total > api.MaxArgvBytes {
		return &ArgvError{fmt.Sprintf("exceeds %d bytes", api.MaxArgvBytes)}
	}
	return nil
}

// Context ends with the session; context.Cause(ctx) tells why.
func (s *Session) Context() context.Context { return s.ctx }

// Exec runs a command in the session's sandbox and classifies how it ended,
// once for every way in: nil with the command's exit status, or
//   - an *ArgvError for a command line past the limits (CheckArgv), with
//     nothing run;
//   - an *EndedError when the session was ended from outside (its key
//     revoked, its sandbox stopped, deleted or quarantined, shutdown) by
//     the time the command ended, even with an exit status: a command the
//     stop of its sandbox killed ends with the stop, not its signal;
//   - ErrCallerGone when ctx was cancelled by the caller;
//   - a *ClusterError (ErrClusterUnavailable) when the stream to the
//     sandbox never opened, even when ctx's deadline passed while it was
//     being opened: no command ran, so none timed out;
//   - ErrExecTimeout when ctx's deadline passed once the stream was open
//     (the command outlived the caller's timeout);
//   - a *StreamError when the stream broke before the exit status arrived;
//   - a *SetupError when the request's Env or Cwd could not be set up in
//     the sandbox (a missing directory, an image without sh), with
//     nothing run. A *FieldError (ErrInvalidEnv, ErrInvalidPath) refuses
//     an Env or a Cwd past the limits (ValidateExecSetup) before anything
//     runs.
//
// ctx should derive from Context.
func (s *Session) Exec(ctx context.Context, req cluster.ExecRequest) (cluster.ExitStatus, error) {
	if s.c.o.Exec == nil {
		return cluster.ExitStatus{}, ErrNoExec
	}
	if err := CheckArgv(req.Command); err != nil {
		return cluster.ExitStatus{}, err
	}
	if err := ValidateExecSetup(req.Env, req.Cwd); err != nil {
		return cluster.ExitStatus{}, err
	}
	req, setup := withSetup(req)
	st, err := s.c.o.Exec.Exec(ctx, s.SandboxID, req)
	// The cause first, even over an exit status: a stop or delete ends
	// the session before it reaches the pod (applyMode), so a command that
	// the stop killed (143 for SIGTERM) reports the stop.
	if cause := s.Ended(); cause != nil {
		if err == nil {
			err = fmt.Errorf("the command ended with exit status %d", st.Code)
		}
		return st, &EndedError{Cause: cause, Err: err}
	}
	if err == nil {
		if setup != nil {
			if serr := setup.failed(st); serr != nil {
				return st, serr
			}
		}
		return st, nil
	}
	if setup != nil && noProgram(err) {
		return st, &SetupError{Kind: ErrSetupNoShell, Code: -1}
	}
	var ce *cluster.ConnectError
	connect := errors.As(err, &ce)
	switch {
	case errors.Is(ctx.Err(), context.Canceled):
		return st, ErrCallerGone
	case connect:
		s.c.o.Metrics.ClusterError("exec", "unavailable")
		return st, &ClusterError{Kind: ErrClusterUnavailable, Err: err}
	case errors.Is(ctx.Err(), context.DeadlineExceeded):
		return st, ErrExecTimeout
	}
	return st, &StreamError{Err: err}
}

// Ended reports why the session was ended from outside: ErrShuttingDown,
// ErrKeyRevoked, ErrSandboxChanged or ErrIdleStopped; nil while it is live
// or when only its caller's own context ended.
func (s *Session) Ended() error {
	cause := context.Cause(s.ctx)
	for _, c := range []error{ErrShuttingDown, ErrKeyRevoked, ErrSandboxChanged, ErrIdleStopped} {
		if errors.Is(cause, c) {
			return c
		}
	}
	return nil
}
