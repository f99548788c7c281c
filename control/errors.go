package control

import (
	"errors"
	"fmt"
	"time"

	"github.com/hiloop/hiloop/cluster"
	"github.com/hiloop/hiloop/receipt"
	"github.com/hiloop/hiloop/store"
)

// Sentinel errors. Every way in maps them to its own answer: server to HTTP
// statuses and codes in its one error map, the SSH gateway to messages.
// Errors from the record (store.ErrNotFound, store.ErrConflict,
// store.ErrQuota, store.ErrLastKey) pass through unchanged.
var (
	// ErrNotRunning: the sandbox exists but is not running, so nothing can
	// reach into it.
	ErrNotRunning = errors.New("sandbox is not running")
	// ErrQuarantined: the sandbox broke what its receipt promised; sessions
	// and exec are refused.
	ErrQuarantined = errors.New("sandbox is quarantined")
	// ErrSessionLimit: a per-sandbox or per-organization session limit is
	// reached.
	ErrSessionLimit = errors.New("session limit reached")
	// ErrTooManyWaits: the caller's key, or its organization's keys
	// together, have as many calls waiting for sandboxes to wake as they
	// may (see WaitLimitError).
	ErrTooManyWaits = errors.New("too many calls waiting for sandboxes to wake")
	// ErrUnsupported: the request asks for a capability this deployment does
	// not back.
	ErrUnsupported = errors.New("unsupported capability")
	// ErrClusterUnavailable: the cluster did not answer in time or could not
	// be reached; trying again later may work.
	ErrClusterUnavailable = cluster.ErrUnavailable
	// ErrClusterRejected: the cluster's admission refused the object (a
	// deployment policy, not a hiloop fault).
	ErrClusterRejected = cluster.ErrRejected
	// ErrClusterQuota: the cluster's own quota for sandboxes is exhausted.
	ErrClusterQuota = cluster.ErrQuota
	// ErrClusterForbidden: the cluster refused hiloop's own request for lack
	// of permission: an operator fault, never the caller's.
	ErrClusterForbidden = cluster.ErrForbidden
	// ErrNoExec: this deployment has no exec backend.
	ErrNoExec = errors.New("exec is not available")
	// ErrPodNotServing: the sandbox's pod is not the one the record
	// observed, or not Running and Ready now, so its address may be another
	// pod's and is not dialled. Trying again in a moment may work.
	ErrPodNotServing = errors.New("the sandbox's pod is not serving")

	// ErrUnauthenticated: the caller names no live key of its organization
	// (revoked, deleted, of no known kind, or none at all), so nothing is
	// admitted for it.
	ErrUnauthenticated = errors.New("the key is revoked, deleted or unknown")

	// Causes with which a live session ends.
	ErrShuttingDown = errors.New("hiloop is shutting down")
	ErrKeyRevoked   = errors.New("the key this session authenticated with was revoked")
	// ErrPreviewRevoked ends the connections of a preview revoked.
	ErrPreviewRevoked = errors.New("the preview was revoked")
	ErrSandboxChanged = errors.New("the sandbox stopped, was deleted or was quarantined")
	// ErrIdleStopped ends the sessions of a sandbox stopped for idleness.
	// Unlike ErrSandboxChanged it leaves their connections open: the next
	// session or -L channel on one wakes the sandbox.
	ErrIdleStopped = errors.New("the sandbox was stopped for idleness")

	// ErrExecTimeout: a command ran past the timeout its caller gave it.
	ErrExecTimeout = errors.New("the command ran past its timeout")
	// ErrCallerGone: the caller of an exec went away before it ended.
	ErrCallerGone = errors.New("the caller went away")
	// ErrStreamBroken: the stream to the sandbox broke before the command's
	// exit status arrived (see StreamError).
	ErrStreamBroken = errors.New("the stream to the sandbox broke before the command's exit status arrived")
)

// EndedError: a session was ended from outside while a command ran. Cause
// is ErrShuttingDown, ErrKeyRevoked, ErrSandboxChanged or ErrIdleStopped;
// Err is what the exec stream returned, for the log.
type EndedError struct {
	Cause error
	Err   error
}

func (e *EndedError) Error() string { return "the session ended: " + e.Cause.Error() }
func (e *EndedError) Unwrap() error { return e.Cause }

// StreamError is ErrStreamBroken with what broke it, which is logged and
// never sent (it can name the pod or the node).
type StreamError struct{ Err error }

func (e *StreamError) Error() string   { return ErrStreamBroken.Error() + ": " + e.Err.Error() }
func (e *StreamError) Unwrap() []error { return []error{ErrStreamBroken, e.Err} }

// FieldError is a request field the deployment cannot honour. Err is the
// sentinel it wraps (ErrUnsupported).
type FieldError struct {
	Field   string
	Message string
	Err     error
}

func (e *FieldError) Error() string { return e.Field + ": " + e.Message }
func (e *FieldError) Unwrap() error { return e.Err }

// StateError is ErrNotRunning with the state the record holds, so an answer
// can say what to do.
type StateError struct {
	State store.State
	Mode  store.Mode
	// StopCause is who asked it to stop, when it was asked to.
	StopCause store.StopCause
}

func (e *StateError) Error() string {
	switch {
	case e.Idle():
		return fmt.Sprintf("sandbox is %s for idleness, not running", e.State)
	case e.Mode == store.ModeStopped:
		return fmt.Sprintf("sandbox is %s (stopped by its owner), not running", e.State)
	}
	return fmt.Sprintf("sandbox is %s, not running", e.State)
}
func (e *StateError) Unwrap() error { return ErrNotRunning }

// Idle reports whether the sandbox was stopped for idleness, so a wake
// (Wake) would start it.
func (e *StateError) Idle() bool {
	return e.Mode == store.ModeStopped && e.StopCause == store.StopIdle
}

// stateError is the StateError of a record that is not running.
func stateError(sb store.Sandbox) *StateError {
	se := &StateError{State: sb.State, Mode: sb.DesiredMode}
	if sb.DesiredMode == store.ModeStopped {
		se.StopCause = sb.StopCause
	}
	return se
}

// WakeTimeoutError: a woken sandbox did not come up within the wake
// timeout. State is the state it was in then; it may still come up.
type WakeTimeoutError struct {
	State store.State
	After time.Duration
}

func (e *WakeTimeoutError) Error() string {
	return fmt.Sprintf("the sandbox did not come up within %s of being woken; it is %s", e.After, e.State)
}

// WaitLimitError is ErrTooManyWaits with whose bound refused the call:
// its key's (Limits.WakeWaitsPerKey) or, with Org, its organization's
// (Limits.WakeWaitsPerOrg). Nothing was started; a place frees as soon as
// another of the caller's waits ends.
type WaitLimitError struct {
	Org bool
	Max int
}

func (e *WaitLimitError) Error() string {
	whose := "this key"
	if e.Org {
		whose = "your organization's keys together"
	}
	return fmt.Sprintf("%d calls of %s already wait for sandboxes to wake, the most allowed; try again once one has woken", e.Max, whose)
}
func (e *WaitLimitError) Unwrap() error { return ErrTooManyWaits }

// limit names the bound for the metrics: per_key or per_org.
func (e *WaitLimitError) limit() string {
	if e.Org {
		return "per_org"
	}
	return "per_key"
}

// TransportError: the sandbox was not created with the transport a way in
// needs (its receipt does not list it).
type TransportError struct{ Transport receipt.Transport }

func (e *TransportError) Error() string {
	if e.Transport == receipt.TransportForward {
		return "the sandbox has no session helper: port forwarding needs the forward transport, asked for at create (--transport forward) and backed by the deployment"
	}
	return fmt.Sprintf("the sandbox was not created with the %s transport", e.Transport)
}

// ClusterError is a failed cluster call: Kind is one of the ErrCluster*
// sentinels, Err the cluster's own error, which is logged and never sent to
// a caller (it can name service accounts, pods and nodes). The cluster
// adapter classifies its failures (k8s.Classify).
type ClusterError = cluster.Error

// classify makes any error of a cluster call a ClusterError: one the
// adapter did not classify (a local failure before the call) is
// ErrClusterUnavailable.
func classify(err error) error {
	if err == nil {
		return nil
	}
	var ce *ClusterError
	if errors.As(err, &ce) {
		return err
	}
	return &ClusterError{Kind: ErrClusterUnavailable, Err: err, Ambiguous: true}
}

// ambiguous reports whether a failed create may still have been written
// (ClusterError.Ambiguous). A failure the adapter did not classify may
// have been too.
func ambiguous(err error) bool {
	var ce *ClusterError
	if errors.As(err, &ce) {
		return ce.Ambiguous
	}
	return true
}

// clusterFailed classifies a failed cluster call and counts it by verb and
// kind.
func (c *Control) clusterFailed(verb string, err error) error {
	err = classify(err)
	kind := "unavailable"
	switch {
	case errors.Is(err, ErrClusterRejected):
		kind = "rejected"
	case errors.Is(err, ErrClusterForbidden):
		kind = "forbidden"
	case errors.Is(err, ErrClusterQuota):
		kind = "quota"
	}
	c.o.Metrics.ClusterError(verb, kind)
	return err
}
