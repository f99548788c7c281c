package k8s

import (
	"errors"
	"net"
	"regexp"
	"strings"
	"syscall"

	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/hiloop/hiloop/cluster"
)

// Classify turns an error of a cluster call into a *cluster.Error of the
// right kind, from the API server's status and message: what the core
// reads of a failure, without reading Kubernetes. nil stays nil, and an
// error already classified is returned as it is. The Writer's methods that
// the core calls return their errors through it; a fake of the cluster may
// too, to fail as the API server does.
func Classify(err error) error {
	if err == nil {
		return nil
	}
	var ce *cluster.Error
	if errors.As(err, &ce) {
		return err
	}
	kind := cluster.ErrUnavailable
	switch {
	case apierrors.IsInvalid(err) || apierrors.IsBadRequest(err):
		kind = cluster.ErrRejected
	case apierrors.IsForbidden(err) && strings.Contains(err.Error(), "exceeded quota"):
		kind = cluster.ErrQuota
	case apierrors.IsForbidden(err) && strings.Contains(err.Error(), "status unknown for quota"):
		// A quota the controller has not counted yet: the cluster refuses
		// for now, and a retry in a moment succeeds.
		kind = cluster.ErrUnavailable
	case apierrors.IsForbidden(err) || apierrors.IsUnauthorized(err):
		kind = cluster.ErrForbidden
	}
	ce = &cluster.Error{Kind: kind, Err: err, NotFound: apierrors.IsNotFound(err), Ambiguous: ambiguous(err)}
	if kind == cluster.ErrRejected {
		if m := policyDenial.FindStringSubmatch(err.Error()); m != nil {
			ce.Policy = m[1]
			if strings.HasPrefix(m[2], "[") {
				ce.Rule = m[2]
			}
		}
	}
	return ce
}

// policyDenial reads the API server's message for a ValidatingAdmissionPolicy
// refusal.
var policyDenial = regexp.MustCompile(`ValidatingAdmissionPolicy '([^']+)' with binding '[^']+' denied request: ([^\n]*)`)

// ambiguous reports whether a failed write may still have been made: a
// timeout or a server-side failure after the request was sent. A refusal
// (an API status in the 4xx range other than a timeout) or a connection that
// was never made is definite.
func ambiguous(err error) bool {
	var se apierrors.APIStatus
	if errors.As(err, &se) {
		code := se.Status().Code
		if apierrors.IsTimeout(err) || apierrors.IsServerTimeout(err) {
			return true
		}
		return code == 0 || code >= 500
	}
	if errors.Is(err, syscall.ECONNREFUSED) {
		return false
	}
	var dns *net.DNSError
	if errors.As(err, &dns) {
		return false
	}
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "dial" {
		return false
	}
	return true
}
