package api

import (
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode"
)

// Error codes. They are stable: clients switch on them. Every code is listed
// in the OpenAPI document and in docs/api.md, and a test holds them to it.
const (
	CodeInvalidJSON            = "invalid_json"
	CodeUnknownField           = "unknown_field"
	CodeInvalidField           = "invalid_field"
	CodeBodyTooLarge           = "body_too_large"
	CodeUnsupportedMediaType   = "unsupported_media_type"
	CodeUnauthorized           = "unauthorized"
	CodeNotFound               = "not_found"
	CodeMethodNotAllowed       = "method_not_allowed"
	CodeConflict               = "conflict"
	CodeLastKey                = "last_key"
	CodeKeyLimit               = "key_limit"
	CodeIdempotencyConflict    = "idempotency_conflict"
	CodeUnsupportedCapability  = "unsupported_capability"
	CodeQuotaExceeded          = "quota_exceeded"
	CodeClusterRejected        = "cluster_rejected"
	CodeClusterQuotaExceeded   = "cluster_quota_exceeded"
	CodeClusterNotHardened     = "cluster_not_hardened"
	CodeClusterUnavailable     = "cluster_unavailable"
	CodeClusterMisconfigured   = "cluster_misconfigured"
	CodeNotReady               = "not_ready"
	CodeInternal               = "internal"
	CodeWebSocketRequired      = "websocket_required"
	CodeSandboxNotRunning      = "sandbox_not_running"
	CodeSandboxQuarantined     = "sandbox_quarantined"
	CodeExecLimit              = "exec_limit"
	CodeExecFailed             = "exec_failed"
	CodeExecUnavailable        = "exec_unavailable"
	CodeExecTimeout            = "exec_timeout"
	CodeInvalidFrame           = "invalid_frame"
	CodeSessionEnded           = "session_ended"
	CodeSSHKeyRegistered       = "ssh_key_registered"
	CodeTransportNotEnabled    = "transport_not_enabled"
	CodeStorageUnavailable     = "storage_unavailable"
	CodeRateLimited            = "rate_limited"
	CodeWakeTimeout            = "wake_timeout"
	CodeTooManyWaits           = "too_many_waits"
	CodeInvalidPath            = "invalid_path"
	CodeLengthRequired         = "length_required"
	CodeFileTooLarge           = "file_too_large"
	CodeFileNotFound           = "file_not_found"
	CodePathConflict           = "path_conflict"
	CodeTarUnavailable         = "tar_unavailable"
	CodeShellUnavailable       = "shell_unavailable"
	CodeUploadIncomplete       = "upload_incomplete"
	CodeFileOperationFailed    = "file_operation_failed"
	CodeProcessLimit           = "process_limit"
	CodeProcessNotRunning      = "process_not_running"
	CodeOutputGone             = "output_gone"
	CodeProcessOperationFailed = "process_operation_failed"
	CodeDirectoryNotEmpty      = "directory_not_empty"
	CodeInvalidEnv             = "invalid_env"
	CodePreviewsDisabled       = "previews_disabled"
	CodePreviewLimit           = "preview_limit"
	CodePreviewUnreachable     = "preview_unreachable"
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

// Error is an error the API answered. Find it with errors.As and switch on
// Code; RequestID finds the request in the server's log.
type Error struct {
	// Status is the HTTP status; 0 for an error in a streaming exec's
	// exit frame.
	Status int
	ErrorDetail
	// RetryAfter is what the server's Retry-After asked for, if anything.
	RetryAfter time.Duration
}

// Error is the message, its code and the request's id, each made
// Printable: the message may quote what a sandbox wrote, and all three
// are whatever the server answered.
func (e *Error) Error() string {
	msg := fmt.Sprintf("%s (%s)", Printable(e.Message), Printable(e.Code))
	if e.RequestID != "" {
		msg += " [request " + Printable(e.RequestID) + "]"
	}
	return msg
}

// ErrorCode is the API's code for err, or "" when err is not an answer of
// the API.
func ErrorCode(err error) string {
	var e *Error
	if errors.As(err, &e) {
		return e.Code
	}
	return ""
}

// Printable is s without control characters, C0 and C1 (U+0080 to
// U+009F, which some terminals obey as escapes) and DEL, but for newlines
// and tabs; invalid UTF-8 becomes U+FFFD. Text that may come from a
// sandbox goes through it before it reaches a terminal.
func Printable(s string) string {
	return strings.Map(func(r rune) rune {
		if unicode.IsControl(r) && r != '\n' && r != '\t' {
			return -1
		}
		return r
	}, strings.ToValidUTF8(s, "\uFFFD"))
}
