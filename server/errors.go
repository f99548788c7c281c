package server

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"

	"github.com/hiloop/hiloop/control"
	"github.com/hiloop/hiloop/store"
)

// Error codes. They are stable: clients switch on them. Every code is listed
// in the OpenAPI document and in docs/api.md, and a test holds them to it.
const (
	CodeInvalidJSON           = "invalid_json"
	CodeUnknownField          = "unknown_field"
	CodeInvalidField          = "invalid_field"
	CodeBodyTooLarge          = "body_too_large"
	CodeUnsupportedMediaType  = "unsupported_media_type"
	CodeUnauthorized          = "unauthorized"
	CodeNotFound              = "not_found"
	CodeMethodNotAllowed      = "method_not_allowed"
	CodeConflict              = "conflict"
	CodeLastKey               = "last_key"
	CodeKeyLimit              = "key_limit"
	CodeIdempotencyConflict   = "idempotency_conflict"
	CodeUnsupportedCapability = "unsupported_capability"
	CodeQuotaExceeded         = "quota_exceeded"
	CodeClusterRejected       = "cluster_rejected"
	CodeClusterQuotaExceeded  = "cluster_quota_exceeded"
	CodeClusterNotHardened    = "cluster_not_hardened"
	CodeClusterUnavailable    = "cluster_unavailable"
	CodeClusterMisconfigured  = "cluster_misconfigured"
	CodeNotReady              = "not_ready"
	CodeInternal              = "internal"
	CodeWebSocketRequired     = "websocket_required"
	CodeSandboxNotRunning     = "sandbox_not_running"
	CodeSandboxQuarantined    = "sandbox_quarantined"
	CodeExecLimit             = "exec_limit"
	CodeExecFailed            = "exec_failed"
	CodeExecUnavailable       = "exec_unavailable"
	CodeExecTimeout           = "exec_timeout"
	CodeInvalidFrame          = "invalid_frame"
	CodeSessionEnded          = "session_ended"
	CodeSSHKeyRegistered      = "ssh_key_registered"
	CodeTransportNotEnabled   = "transport_not_enabled"
	CodeStorageUnavailable    = "storage_unavailable"
	CodeRateLimited           = "rate_limited"
)

// ErrorBody is the envelope of every error response.
type ErrorBody struct {
	Error ErrorDetail `json:"error"`
}

// ErrorDetail says what went wrong. Field names the request field at fault,
// when there is one.
type ErrorDetail struct {
	Code    string `json:"code"`
	Message string `json:"message"`
	Field   string `json:"field,omitempty"`
	// RequestID is the request's id (also in the X-Request-Id header), for
	// finding its log lines.
	RequestID string `json:"request_id,omitempty"`
}

// apiError is an error that already knows its HTTP status and code.
type apiError struct {
	status int
	detail ErrorDetail
}

func (e *apiError) Error() string { return e.detail.Message }

func newError(status int, code, msg string) *apiError {
	return &apiError{status: status, detail: ErrorDetail{Code: code, Message: msg}}
}

func fieldError(field, msg string) *apiError {
	return &apiError{status: http.StatusBadRequest, detail: ErrorDetail{Code: CodeInvalidField, Message: field + ": " + msg, Field: field}}
}

var (
	// errNotFound is the one answer for an absent sandbox and for another
	// organization's: the two must be indistinguishable.
	errNotFound = newError(http.StatusNotFound, CodeNotFound, "no such sandbox")
	errNotReady = newError(http.StatusServiceUnavailable, CodeNotReady, "hiloop is not ready yet")
)

// toAPIError maps any error to its status and code, in this one place. The
// message of a 5xx and of a cluster refusal is fixed: what the cluster said
// can name service accounts, pods and nodes, so it is logged, never sent.
func toAPIError(err error) *apiError {
	var ae *apiError
	var fe *control.FieldError
	var se *control.StateError
	var te *control.TransportError
	var nh *control.NotHardenedError
	var ce *control.ClusterError
	var kl *store.KeyLimitError
	switch {
	case errors.As(err, &ae):
		return ae
	case errors.As(err, &fe) && errors.Is(err, control.ErrUnsupported):
		return &apiError{status: http.StatusUnprocessableEntity, detail: ErrorDetail{Code: CodeUnsupportedCapability, Field: fe.Field, Message: fe.Message}}
	case errors.Is(err, control.ErrUnauthenticated):
		// The key was revoked between its authentication and the core's
		// own look at it.
		return newError(http.StatusUnauthorized, CodeUnauthorized, "invalid or revoked key")
	case errors.Is(err, store.ErrNotFound):
		return errNotFound
	case errors.Is(err, store.ErrQuota):
		return newError(http.StatusTooManyRequests, CodeQuotaExceeded, err.Error())
	case errors.As(err, &kl):
		verb := "revoke"
		if kl.Kind == "SSH" {
			verb = "delete"
		}
		return newError(http.StatusConflict, CodeKeyLimit, fmt.Sprintf("your organization has %d %s, the most it may have; %s one first", kl.Max, kl.Keys(), verb))
	case errors.Is(err, store.ErrLastKey):
		return newError(http.StatusConflict, CodeLastKey, "this is the organization's last live key; create another key first")
	case errors.Is(err, store.ErrConflict):
		return newError(http.StatusConflict, CodeConflict, err.Error())
	case errors.Is(err, control.ErrQuarantined):
		return newError(http.StatusConflict, CodeSandboxQuarantined, "the sandbox is quarantined; exec is refused")
	case errors.As(err, &se):
		return newError(http.StatusConflict, CodeSandboxNotRunning, se.Error())
	case errors.As(err, &te):
		return newError(http.StatusConflict, CodeTransportNotEnabled, te.Error())
	case errors.Is(err, control.ErrSessionLimit):
		return newError(http.StatusTooManyRequests, CodeExecLimit, err.Error())
	case errors.Is(err, control.ErrNoExec):
		return newError(http.StatusServiceUnavailable, CodeExecUnavailable, "this deployment has no exec backend")
	case errors.As(err, &nh):
		return newError(http.StatusServiceUnavailable, CodeClusterNotHardened, nh.Error()+"; creates and starts are refused until the operator fixes it (hiloop doctor)")
	case errors.Is(err, control.ErrClusterRejected):
		msg := "the cluster's admission refused the sandbox"
		if errors.As(err, &ce) && ce.Policy != "" {
			msg = "the cluster's admission policy " + ce.Policy + " refused the sandbox"
			if ce.Rule != "" {
				msg += ": " + ce.Rule
			}
		}
		return newError(http.StatusUnprocessableEntity, CodeClusterRejected, msg)
	case errors.Is(err, control.ErrClusterQuota):
		return newError(http.StatusTooManyRequests, CodeClusterQuotaExceeded, "the cluster's quota for sandboxes in hiloop's namespace is exhausted; delete sandboxes or ask the operator to raise it")
	case errors.Is(err, control.ErrClusterForbidden):
		return newError(http.StatusInternalServerError, CodeClusterMisconfigured, "the cluster refused hiloop's own request; the operator has to fix hiloop's permissions")
	case store.Unavailable(err):
		return newError(http.StatusServiceUnavailable, CodeStorageUnavailable, "the product record cannot be written now; try again")
	case errors.Is(err, control.ErrClusterUnavailable):
		return newError(http.StatusServiceUnavailable, CodeClusterUnavailable, "the cluster did not answer; try again")
	default:
		return newError(http.StatusInternalServerError, CodeInternal, "internal error")
	}
}

// retryAfter is the Retry-After of every 503, in seconds.
const retryAfter = "5"

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
	case ae.detail.Code == CodeClusterRejected || errors.Is(err, control.ErrClusterQuota):
		s.log.Warn("cluster refused a request", "method", r.Method, "route", ri.route, "status", ae.status, "request_id", ri.id, "err", err)
	default:
		s.log.Debug("request refused", "method", r.Method, "route", ri.route, "status", ae.status, "code", ae.detail.Code, "request_id", ri.id)
	}
	d := ae.detail
	d.RequestID = ri.id
	writeJSON(w, ae.status, ErrorBody{Error: d})
}
