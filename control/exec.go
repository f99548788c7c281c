package control

import (
	"context"
	"errors"

	"github.com/hiloop/hiloop/k8s"
)

// Context ends with the session; context.Cause(ctx) tells why.
func (s *Session) Context() context.Context { return s.ctx }

// Exec runs a command in the session's sandbox and classifies how it ended,
// once for every way in: nil with the command's exit status, or
//   - an *EndedError when the session was ended from outside (its key
//     revoked, its sandbox stopped, deleted or quarantined, shutdown);
//   - ErrCallerGone when ctx was cancelled by the caller;
//   - a *ClusterError (ErrClusterUnavailable) when the stream to the
//     sandbox never opened, even when ctx's deadline passed while it was
//     being opened: no command ran, so none timed out;
//   - ErrExecTimeout when ctx's deadline passed once the stream was open
//     (the command outlived the caller's timeout);
//   - a *StreamError when the stream broke before the exit status arrived.
//
// ctx should derive from Context.
func (s *Session) Exec(ctx context.Context, req k8s.ExecRequest) (k8s.ExitStatus, error) {
	if s.c.o.Exec == nil {
		return k8s.ExitStatus{}, ErrNoExec
	}
	st, err := s.c.o.Exec.Exec(ctx, s.SandboxID, req)
	if err == nil {
		return st, nil
	}
	var ce *k8s.ConnectError
	connect := errors.As(err, &ce)
	switch cause := s.Ended(); {
	case cause != nil:
		return st, &EndedError{Cause: cause, Err: err}
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
