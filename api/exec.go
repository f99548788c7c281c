package api

import (
	"encoding/base64"
	"fmt"
	"io"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/gorilla/websocket"
)

// Exec limits and defaults.
const (
	// MaxArgvBytes caps the total size of a command line.
	MaxArgvBytes = 128 << 10
	// MaxArgs caps the number of arguments.
	MaxArgs = 4096
	// MaxRunOutput caps each of stdout and stderr of exec/run; beyond it the
	// output is discarded (the command still runs to the end) and the
	// response says it was truncated.
	MaxRunOutput = 1 << 20
	// MaxRunBody caps the exec/run request, stdin included.
	MaxRunBody = 1 << 20
	// DefaultExecTimeout and MaxExecTimeout bound a command's run time.
	DefaultExecTimeout = 60 * time.Second
	MaxExecTimeout     = 24 * time.Hour
	// ExecSubprotocol is the WebSocket subprotocol of the streaming endpoint.
	ExecSubprotocol = "hiloop.exec.v1"
	// MaxFrameSize caps one message of the streaming endpoint.
	MaxFrameSize = 1 << 20
)

// Channels of the streaming exec protocol: the first byte of every binary
// WebSocket message. See docs/api.md.
const (
	ChanStdin   = 0
	ChanStdout  = 1
	ChanStderr  = 2
	ChanExit    = 3
	ChanResize  = 4
	ChanCloseIn = 255
)

// ExecRunRequest is the body of POST /v1/sandboxes/{id}/exec/run.
type ExecRunRequest struct {
	// Command is the argv; it is not run through a shell.
	Command []string `json:"command"`
	// Stdin is written to the command, then closed. Without it the command
	// gets no stdin at all.
	Stdin *string `json:"stdin,omitempty"`
	// Timeout bounds the run, as a Go duration; 60s by default, 24h at most.
	Timeout string `json:"timeout,omitempty"`
	// Env is added to the command's environment, exactly: no shell reads
	// the names or the values. Names are letters, digits and _, not
	// starting with a digit, and not starting with HILOOP_; at most 64,
	// and 32 KiB in all.
	Env map[string]string `json:"env,omitempty"`
	// Cwd is the absolute, clean directory the command runs in; the
	// container's own when empty. A directory the sandbox lacks is 404
	// file_not_found, and the command does not run.
	Cwd string `json:"cwd,omitempty"`
}

// notUTF8 is the server's refusal of a command line, an env or a cwd that
// is not UTF-8 (which no cluster can carry to a command), given before the
// request is sent: JSON would send such bytes as U+FFFD, and the command
// would run with text other than what it was given.
func notUTF8(command []string, env map[string]string, cwd string) error {
	bad := func(code, field, msg string) error {
		return &Error{Status: 400, ErrorDetail: ErrorDetail{Code: code, Field: field, Message: msg}}
	}
	for _, a := range command {
		if !utf8.ValidString(a) {
			return bad(CodeInvalidField, "command", "command arguments must be UTF-8")
		}
	}
	for _, k := range slices.Sorted(maps.Keys(env)) {
		switch {
		case !utf8.ValidString(k):
			return bad(CodeInvalidEnv, "env", "an environment variable's name must be UTF-8")
		case !utf8.ValidString(env[k]):
			return bad(CodeInvalidEnv, "env."+k, "a value must be UTF-8")
		}
	}
	if !utf8.ValidString(cwd) {
		return bad(CodeInvalidPath, "cwd", "must be UTF-8")
	}
	return nil
}

// Encodings of ExecRunResponse's Stdout and Stderr.
const (
	// EncodingUTF8: both are the output itself, which is valid UTF-8.
	EncodingUTF8 = "utf-8"
	// EncodingBase64: both are the output in standard base64, since one
	// of them is not valid UTF-8.
	EncodingBase64 = "base64"
)

// ExecRunResponse is how the command ended and what it printed.
type ExecRunResponse struct {
	// ExitCode is the command's exit code; absent when it timed out.
	ExitCode *int `json:"exit_code,omitempty"`
	// Signal names the signal that killed it, when the runtime said so.
	Signal   string `json:"signal,omitempty"`
	TimedOut bool   `json:"timed_out"`
	// Stdout and Stderr are what the command printed. On the wire they are
	// text when Encoding is utf-8, and base64 when it is base64 (when
	// either is not valid UTF-8). Client.Run decodes them: what it returns
	// holds the bytes themselves, whatever Encoding says.
	Stdout string `json:"stdout"`
	Stderr string `json:"stderr"`
	// Encoding is EncodingUTF8 or EncodingBase64, for both Stdout and
	// Stderr. An answer without it (an older server) is utf-8.
	Encoding string `json:"encoding,omitempty"`
	// StdoutTruncated and StderrTruncated say output beyond MaxRunOutput
	// bytes was dropped.
	StdoutTruncated bool  `json:"stdout_truncated"`
	StderrTruncated bool  `json:"stderr_truncated"`
	DurationMS      int64 `json:"duration_ms"`
}

// decodeOutput makes Stdout and Stderr the bytes themselves when they
// came in base64.
func (r *ExecRunResponse) decodeOutput() error {
	if r.Encoding != EncodingBase64 {
		return nil
	}
	for _, f := range []*string{&r.Stdout, &r.Stderr} {
		b, err := base64.StdEncoding.DecodeString(*f)
		if err != nil {
			return fmt.Errorf("exec/run: the answer's output is not base64: %w", err)
		}
		*f = string(b)
	}
	return nil
}

// ExitFrame is the payload of the final ChanExit message.
type ExitFrame struct {
	ExitCode *int         `json:"exit_code,omitempty"`
	Signal   string       `json:"signal,omitempty"`
	Error    *ErrorDetail `json:"error,omitempty"`
}

// ResizeFrame is the payload of a ChanResize message.
type ResizeFrame struct {
	Width  uint16 `json:"width"`
	Height uint16 `json:"height"`
}

// StartFrame is the first client message of a stream opened without a
// command in its URL: the argv travels in the message, so it stays out of
// proxy and access logs. It is a text message.
type StartFrame struct {
	Command []string `json:"command"`
	// Env and Cwd are as in ExecRunRequest.
	Env map[string]string `json:"env,omitempty"`
	Cwd string            `json:"cwd,omitempty"`
}

// ChannelConn writes the channel-prefixed binary messages of hiloop's exec
// protocol: each message is one channel byte followed by the payload. It
// serialises writers.
type ChannelConn struct {
	mu   sync.Mutex
	conn *websocket.Conn
	// since is when the message being written began (Unix nanoseconds),
	// or 0 between messages.
	since atomic.Int64
}

// NewChannelConn wraps a WebSocket connection.
func NewChannelConn(conn *websocket.Conn) *ChannelConn { return &ChannelConn{conn: conn} }

// Send writes one message on channel ch. It blocks until the connection takes
// it, so a slow peer slows the sender instead of growing a buffer.
func (c *ChannelConn) Send(ch byte, p []byte) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.since.Store(time.Now().UnixNano())
	defer c.since.Store(0)
	w, err := c.conn.NextWriter(websocket.BinaryMessage)
	if err != nil {
		return err
	}
	if _, err := w.Write([]byte{ch}); err != nil {
		return err
	}
	if _, err := w.Write(p); err != nil {
		return err
	}
	return w.Close()
}

// Stalled reports whether the message being written has been blocked for
// longer than d: the peer has stopped reading.
func (c *ChannelConn) Stalled(d time.Duration) bool {
	since := c.since.Load()
	return since != 0 && time.Since(time.Unix(0, since)) > d
}

// Writer returns an io.Writer whose every Write is one message on ch.
func (c *ChannelConn) Writer(ch byte) io.Writer {
	return channelWriter{c, ch}
}

type channelWriter struct {
	c  *ChannelConn
	ch byte
}

func (w channelWriter) Write(p []byte) (int, error) {
	if err := w.c.Send(w.ch, p); err != nil {
		return 0, err
	}
	return len(p), nil
}
