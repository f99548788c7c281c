package server

import (
	"encoding/json"
	"errors"
	"net/http"

	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/hiloop/hiloop/store"
)

// Error codes. They are stable: clients switch on them.
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
	CodeIdempotencyConflict   = "idempotency_conflict"
	CodeUnsupportedCapability = "unsupported_capability"
	CodeQuotaExceeded         = "quota_exceeded"
	CodeClusterRejected       = "cluster_rejected"
	CodeClusterUnavailable    = "cluster_unavailable"
	CodeNotReady              = "not_ready"
	CodeInternal              = "internal"
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

// errNotFound is the one answer for an absent sandbox and for another
// organization's: the two must be indistinguishable.
var errNotFound = newError(http.StatusNotFound, CodeNotFound, "no such sandbox")

// toAPIError maps any error to its status and code, in this one place.
func toAPIError(err error) *apiError {
	var ae *apiError
	switch {
	case errors.As(err, &ae):
		return ae
	case errors.Is(err, store.ErrNotFound):
		return errNotFound
	case errors.Is(err, store.ErrQuota):
		return newError(http.StatusTooManyRequests, CodeQuotaExceeded, err.Error())
	case errors.Is(err, store.ErrConflict):
		return newError(http.StatusConflict, CodeConflict, err.Error())
	case apierrors.IsForbidden(err) || apierrors.IsInvalid(err) || apierrors.IsBadRequest(err):
		// The API server's admission refused the object: a deployment policy,
		// not a hiloop fault, and the record says so.
		return newError(http.StatusUnprocessableEntity, CodeClusterRejected, "the cluster refused the sandbox: "+apiMessage(err))
	case isClusterError(err):
		return newError(http.StatusServiceUnavailable, CodeClusterUnavailable, "the cluster did not accept the write; try again")
	default:
		return newError(http.StatusInternalServerError, CodeInternal, "internal error")
	}
}

func apiMessage(err error) string {
	var se apierrors.APIStatus
	if errors.As(err, &se) {
		return se.Status().Message
	}
	return err.Error()
}

// isClusterError reports whether err came from talking to the API server.
func isClusterError(err error) bool {
	var se apierrors.APIStatus
	if errors.As(err, &se) {
		return true
	}
	var ce *clusterError
	return errors.As(err, &ce)
}

// clusterError marks a failed cluster write that is not an API status
// (a refused connection, a timeout).
type clusterError struct{ err error }

func (e *clusterError) Error() string { return e.err.Error() }
func (e *clusterError) Unwrap() error { return e.err }

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.Encode(v)
}

// writeError writes err as the JSON envelope. 5xx details are logged, never
// sent.
func (s *Server) writeError(w http.ResponseWriter, r *http.Request, err error) {
	ae := toAPIError(err)
	if ae.status >= 500 {
		s.log.Error("request failed", "method", r.Method, "path", r.URL.Path, "status", ae.status, "err", err)
	} else {
		s.log.Debug("request refused", "method", r.Method, "path", r.URL.Path, "status", ae.status, "code", ae.detail.Code)
	}
	writeJSON(w, ae.status, ErrorBody{Error: ae.detail})
}
