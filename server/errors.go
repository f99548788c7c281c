package server

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"

	"github.com/hiloop/hiloop/api"
	"github.com/hiloop/hiloop/control"
	"github.com/hiloop/hiloop/store"
)

// apiError is an error that already knows its HTTP status and code.
type apiError struct {
	status int
	detail api.ErrorDetail
	// retryAfter is the Retry-After of an answer other than a 503 (which
	// always carries retryAfter), in seconds; none when empty.
	retryAfter string
}

func (e *apiError) Error() string { return e.detail.Message }

func newError(status int, code, msg string) *apiError {
	return &apiError{status: status, detail: api.ErrorDetail{Code: code, Message: msg}}
}

func fieldError(field, msg string) *apiError {
	return &apiError{status: http.StatusBadRequest, detail: api.ErrorDetail{Code: api.CodeInvalidField, Message: field + ": " + msg, Field: field}}
}

// truncate keeps input echoed in a message short, as control's messages do.
func truncate(s string) string { return control.Truncate(s) }

var (
	// errNotFound is the one answer for an absent sandbox and for another
	// organization's: the two must be indistinguishable.
	errNotFound = newError(http.StatusNotFound, api.CodeNotFound, "no such sandbox")
	errNotReady = newError(http.StatusServiceUnavailable, api.CodeNotReady, "hiloop is not ready yet")
)

// toAPIError maps any error to its status and code, in this one place. The
// message of a 5xx and of a cluster refusal is fixed: what the cluster said
// can name service accounts, pods and nodes, so it is logged, never sent.
func toAPIError(err error) *apiError {
	var ae *apiError
	if errors.As(err, &ae) {
		return ae
	}
	// The families are tried in this order, and the cases within each in
	// theirs: an error that matches two answers as the first.
	for _, family := range []func(error) *apiError{fieldAPIError, recordAPIError, sandboxStateAPIError, callerLimitAPIError, deploymentAPIError} {
		if ae := family(err); ae != nil {
			return ae
		}
	}
	return newError(http.StatusInternalServerError, api.CodeInternal, "internal error")
}

// fieldAPIError answers a request field the core refused, or nil.
func fieldAPIError(err error) *apiError {
	var fe *control.FieldError
	switch {
	case errors.As(err, &fe) && errors.Is(err, control.ErrInvalidEnv):
		return &apiError{status: http.StatusBadRequest, detail: api.ErrorDetail{Code: api.CodeInvalidEnv, Field: fe.Field, Message: fe.Error()}}
	case errors.As(err, &fe) && errors.Is(err, control.ErrInvalidPath):
		return &apiError{status: http.StatusBadRequest, detail: api.ErrorDetail{Code: api.CodeInvalidPath, Field: fe.Field, Message: fe.Error()}}
	case errors.As(err, &fe) && errors.Is(err, control.ErrInvalid):
		return &apiError{status: http.StatusBadRequest, detail: api.ErrorDetail{Code: api.CodeInvalidField, Field: fe.Field, Message: fe.Error()}}
	case errors.As(err, &fe) && errors.Is(err, control.ErrUnsupported):
		return &apiError{status: http.StatusUnprocessableEntity, detail: api.ErrorDetail{Code: api.CodeUnsupportedCapability, Field: fe.Field, Message: fe.Message}}
	}
	return nil
}

// recordAPIError answers what the record refused: a revoked key, a missing
// sandbox, a quota, a key or preview limit, a conflict; or nil.
func recordAPIError(err error) *apiError {
	var kl *store.KeyLimitError
	switch {
	case errors.Is(err, control.ErrUnauthenticated):
		// The key was revoked between its authentication and the core's
		// own look at it.
		return newError(http.StatusUnauthorized, api.CodeUnauthorized, "invalid or revoked key")
	case errors.Is(err, store.ErrNotFound):
		return errNotFound
	case errors.Is(err, store.ErrQuota):
		return newError(http.StatusTooManyRequests, api.CodeQuotaExceeded, err.Error())
	case errors.As(err, &kl):
		verb := "revoke"
		if kl.Kind == "SSH" {
			verb = "delete"
		}
		return newError(http.StatusConflict, api.CodeKeyLimit, fmt.Sprintf("your organization has %d %s, the most it may have; %s one first", kl.Max, kl.Keys(), verb))
	case errors.Is(err, store.ErrPreviewLimit):
		return newError(http.StatusConflict, api.CodePreviewLimit, "the sandbox has as many live previews as it may have (hiloop serve --max-previews-per-sandbox); revoke one first")
	case errors.Is(err, store.ErrLastKey):
		return newError(http.StatusConflict, api.CodeLastKey, "this is the organization's last live key; create another key first")
	case errors.Is(err, store.ErrConflict):
		return newError(http.StatusConflict, api.CodeConflict, err.Error())
	}
	return nil
}

// sandboxStateAPIError answers a call the sandbox's state refuses
// (quarantined, not running, not woken in time, transport not enabled),
// or nil.
func sandboxStateAPIError(err error) *apiError {
	var se *control.StateError
	var wt *control.WakeTimeoutError
	var te *control.TransportError
	switch {
	case errors.Is(err, control.ErrQuarantined):
		return newError(http.StatusConflict, api.CodeSandboxQuarantined, "the sandbox is quarantined; exec is refused")
	case errors.As(err, &se) && se.Idle():
		return newError(http.StatusConflict, api.CodeSandboxNotRunning, se.Error()+
			"; wake it by calling again with ?wake=true (or by ssh), or start it with POST /v1/sandboxes/{id}/start")
	case errors.As(err, &se):
		return newError(http.StatusConflict, api.CodeSandboxNotRunning, se.Error())
	case errors.As(err, &wt):
		return newError(http.StatusGatewayTimeout, api.CodeWakeTimeout, wt.Error())
	case errors.As(err, &te):
		return newError(http.StatusConflict, api.CodeTransportNotEnabled, te.Error())
	}
	return nil
}

// callerLimitAPIError answers a caller over its limit of waits or exec
// sessions, or nil.
func callerLimitAPIError(err error) *apiError {
	switch {
	case errors.Is(err, control.ErrTooManyWaits):
		// A place frees when another of the caller's waits ends, which
		// is when the sandbox it waits for runs, or gives up.
		return &apiError{status: http.StatusTooManyRequests, detail: api.ErrorDetail{Code: api.CodeTooManyWaits, Message: err.Error()}, retryAfter: waitRetryAfter}
	case errors.Is(err, control.ErrSessionLimit):
		return newError(http.StatusTooManyRequests, api.CodeExecLimit, err.Error())
	}
	return nil
}

// deploymentAPIError answers what this deployment cannot do now: it is
// shutting down, has no exec backend, or its cluster or storage refused or
// did not answer; or nil.
func deploymentAPIError(err error) *apiError {
	var nh *control.NotHardenedError
	var ce *control.ClusterError
	switch {
	case errors.Is(err, control.ErrShuttingDown):
		// A wake waiting when hiloop began to shut down, or asked for
		// after: nothing broke, and the next hiloop may answer.
		return newError(http.StatusServiceUnavailable, api.CodeNotReady, "hiloop is shutting down; try again")
	case errors.Is(err, control.ErrNoExec):
		return newError(http.StatusServiceUnavailable, api.CodeExecUnavailable, "this deployment has no exec backend")
	case errors.As(err, &nh):
		return newError(http.StatusServiceUnavailable, api.CodeClusterNotHardened, nh.Error()+"; creates and starts are refused until the operator fixes it (hiloop doctor)")
	case errors.Is(err, control.ErrClusterRejected):
		msg := "the cluster's admission refused the sandbox"
		if errors.As(err, &ce) && ce.Policy != "" {
			msg = "the cluster's admission policy " + ce.Policy + " refused the sandbox"
			if ce.Rule != "" {
				msg += ": " + ce.Rule
			}
		}
		return newError(http.StatusUnprocessableEntity, api.CodeClusterRejected, msg)
	case errors.Is(err, control.ErrClusterQuota):
		return newError(http.StatusTooManyRequests, api.CodeClusterQuotaExceeded, "the cluster's quota for sandboxes in hiloop's namespace is exhausted; delete sandboxes or ask the operator to raise it")
	case errors.Is(err, control.ErrClusterForbidden):
		return newError(http.StatusInternalServerError, api.CodeClusterMisconfigured, "the cluster refused hiloop's own request; the operator has to fix hiloop's permissions")
	case store.Unavailable(err):
		return newError(http.StatusServiceUnavailable, api.CodeStorageUnavailable, "the product record cannot be written now; try again")
	case errors.Is(err, control.ErrClusterUnavailable):
		return newError(http.StatusServiceUnavailable, api.CodeClusterUnavailable, "the cluster did not answer; try again")
	}
	return nil
}

// retryAfter is the Retry-After of every 503, in seconds.
const retryAfter = "5"

// waitRetryAfter is the Retry-After of 429 too_many_waits, in seconds:
// about how soon a wake under way may be over (a pod's start).
const waitRetryAfter = "2"

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	if status == http.StatusServiceUnavailable {
		w.Header().Set("Retry-After", retryAfter)
	}
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.Encode(v)
}

// writeError writes err as the JSON envelope. The full error of a 5xx or a
// cluster refusal is logged, never sent.
func (s *Server) writeError(w http.ResponseWriter, r *http.Request, err error) {
	ae := toAPIError(err)
	ri := info(r)
	switch {
	case ae.status >= 500:
		s.log.Error("request failed", "method", r.Method, "route", ri.route, "status", ae.status, "code", ae.detail.Code, "request_id", ri.id, "err", err)
	case ae.detail.Code == api.CodeClusterRejected || errors.Is(err, control.ErrClusterQuota):
		s.log.Warn("cluster refused a request", "method", r.Method, "route", ri.route, "status", ae.status, "request_id", ri.id, "err", err)
	default:
		s.log.Debug("request refused", "method", r.Method, "route", ri.route, "status", ae.status, "code", ae.detail.Code, "request_id", ri.id)
	}
	d := ae.detail
	d.RequestID = ri.id
	if ae.retryAfter != "" {
		w.Header().Set("Retry-After", ae.retryAfter)
	}
	writeJSON(w, ae.status, api.ErrorBody{Error: d})
}
