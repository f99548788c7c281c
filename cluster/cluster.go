// Package cluster is the vocabulary the core (control) and the cluster
// adapter (k8s) share: a command to run in a sandbox and how it ended, how
// a cluster call failed, and the findings of the isolation self-check. It
// names nothing of Kubernetes: control speaks it without importing the
// adapter, and package k8s translates the API server's answers into it.
package cluster

import (
	"errors"
	"time"
)

// Kinds of a failed cluster call (Error.Kind).
var (
	// ErrUnavailable: the cluster did not answer in time or could not be
	// reached; trying again later may work.
	ErrUnavailable = errors.New("the cluster is unavailable")
	// ErrRejected: the cluster's admission refused the object (a
	// deployment policy, not a hiloop fault).
	ErrRejected = errors.New("the cluster refused the sandbox")
	// ErrQuota: the cluster's own quota for sandboxes is exhausted.
	ErrQuota = errors.New("the cluster's sandbox quota is exhausted")
	// ErrForbidden: the cluster refused hiloop's own request for lack of
	// permission: an operator fault, never the caller's.
	ErrForbidden = errors.New("the cluster refused hiloop's request (permissions)")
)

// ReservedVolumePrefix starts the names of the pod volumes the adapter
// renders for hiloop itself: a sandbox's own volumes may not use it, or
// the controller would put the claim in place of hiloop's volume of the
// same name.
const ReservedVolumePrefix = "hiloop-"

// DefaultTimeout bounds each call to the cluster (HILOOP_CLUSTER_TIMEOUT):
// serve's, doctor's and a key rotation's.
const DefaultTimeout = 10 * time.Second

// Error is a failed cluster call: Kind is one of the kinds above, Err the
// cluster's own error, which is logged and never sent to a caller (it can
// name service accounts, pods and nodes).
type Error struct {
	Kind error
	Err  error
	// Policy names the admission policy that refused the object, and Rule
	// is that policy's message when it is one of hiloop's own rules
	// ("[runtime-class] ..."); both are fit to send.
	Policy, Rule string
	// NotFound: the object the call was about does not exist.
	NotFound bool
	// Ambiguous: a write may have been made all the same (a timeout, or a
	// server-side failure after the request was sent). A refusal, or a
	// connection that was never made, is definite.
	Ambiguous bool
}

func (e *Error) Error() string   { return e.Kind.Error() + ": " + e.Err.Error() }
func (e *Error) Unwrap() []error { return []error{e.Kind, e.Err} }

// IsNotFound reports whether a cluster call failed because its object does
// not exist.
func IsNotFound(err error) bool {
	var ce *Error
	return errors.As(err, &ce) && ce.NotFound
}

// PodNotServingError says why a sandbox's pod is not one whose address may
// be dialled now, in words fit to send: Reason names no pod, node or
// cluster message.
type PodNotServingError struct{ Reason string }

func (e *PodNotServingError) Error() string { return "the sandbox's pod is not serving: " + e.Reason }

// Check is one finding of the isolation self-check.
type Check struct {
	// Name is a fixed name, fit for a metric label.
	Name string `json:"name"`
	// Object is the cluster object checked ("Namespace hiloop-sandboxes"),
	// fixed for a deployment, fit for a metric label.
	Object string `json:"object"`
	OK     bool   `json:"ok"`
	// Allowed marks a failure this deployment accepts (--insecure-no-gvisor).
	Allowed bool `json:"allowed,omitempty"`
	// Warning marks a finding that is reported (log, metric, doctor) but
	// refuses nothing: Sandboxes hiloop did not make.
	Warning bool   `json:"warning,omitempty"`
	Problem string `json:"problem,omitempty"`
	Fix     string `json:"fix,omitempty"`
	// Count is how many objects a warning is about.
	Count int `json:"count,omitempty"`
	// Detail is the cluster's own error when the object could not be read.
	// It can name hiloop's service account, so it goes to the log and to
	// `hiloop doctor`, never into an API answer.
	Detail string `json:"-"`
}

// Failed reports whether the check fails and the failure is not allowed.
func (c Check) Failed() bool { return !c.OK && !c.Allowed && !c.Warning }

// CheckForeignSandboxes names the finding of Sandboxes in the namespace
// that hiloop did not make: reported, never a failure.
const CheckForeignSandboxes = "foreign_sandboxes"
