package server

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/gorilla/websocket"

	"github.com/hiloop/hiloop/api"
	"github.com/hiloop/hiloop/cluster"
	"github.com/hiloop/hiloop/control"
	"github.com/hiloop/hiloop/receipt"
)

// stallGrace is how long a message to the client of a stream whose
// session was ended from outside may stay blocked before the connection is
// closed under it: the client has stopped reading. Only a blocked write
// counts, never the handler's own pace, so a loaded machine that is slow to
// write the final frame still delivers it.
const stallGrace = 3 * time.Second

// startFrameWait is how long a stream opened without a command waits for
// its first message.
const startFrameWait = 30 * time.Second

// boolQuery reads a query parameter that is true or false; absent is
// false, and given twice is invalid_field.
func boolQuery(q url.Values, name string) (bool, error) {
	if len(q[name]) > 1 {
		// Which of two values holds would be the reader's choice.
		return false, fieldError(name, "given more than once")
	}
	switch q.Get(name) {
	case "", "false", "0":
		return false, nil
	case "true", "1":
		return true, nil
	}
	return false, fieldError(name, "must be true or false")
}

// startQuery reads the command, env and cwd of a stream's URL. Without a
// command there, the command is the first message, and so are its env
// and cwd.
func startQuery(q url.Values) (api.StartFrame, error) {
	start := api.StartFrame{Command: q["command"], Cwd: q.Get("cwd")}
	if len(start.Command) == 0 {
		if q.Has("env") || q.Has("cwd") {
			return start, fieldError("command", "env and cwd go where the command goes: in the URL with it, or in the first message")
		}
		return start, nil
	}
	if len(q["cwd"]) > 1 {
		return start, &control.FieldError{Field: "cwd", Message: "given more than once", Err: control.ErrInvalidPath}
	}
	env, err := envQuery(q)
	if err != nil {
		return start, err
	}
	start.Env = env
	return start, validateStart(start)
}

// envQuery reads the env parameters of a stream's URL, each NAME=VALUE,
// into a map: nil when there are none.
func envQuery(q url.Values) (map[string]string, error) {
	if len(q["env"]) == 0 {
		return nil, nil
	}
	env := map[string]string{}
	for _, kv := range q["env"] {
		k, v, ok := strings.Cut(kv, "=")
		if !ok {
			return nil, &control.FieldError{Field: "env", Message: fmt.Sprintf("%q is not NAME=VALUE", truncate(kv)), Err: control.ErrInvalidEnv}
		}
		if _, dup := env[k]; dup {
			return nil, &control.FieldError{Field: "env", Message: fmt.Sprintf("%q given twice", truncate(k)), Err: control.ErrInvalidEnv}
		}
		env[k] = v
	}
	return env, nil
}

func validateArgv(argv []string) error {
	var ae *control.ArgvError
	if err := control.CheckArgv(argv); errors.As(err, &ae) {
		return fieldError("command", ae.Problem)
	}
	return nil
}

func parseTimeout(s string) (time.Duration, error) {
	if s == "" {
		return api.DefaultExecTimeout, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d <= 0 || d > api.MaxExecTimeout {
		return 0, fieldError("timeout", fmt.Sprintf("%q is not a duration from 1ns to %s", truncate(s), api.MaxExecTimeout))
	}
	return d, nil
}

// execFailed maps how the core says an exec ended, other than with an exit
// status, to the API's answer. What broke is logged by writeError, never
// sent: it can name the pod or the node.
func execFailed(err error) error {
	var ee *control.EndedError
	var se *control.StreamError
	switch {
	case errors.As(err, &ee):
		status := http.StatusConflict
		if errors.Is(ee.Cause, control.ErrShuttingDown) {
			status = http.StatusServiceUnavailable
		}
		return &wrappedAPIError{apiError: newError(status, api.CodeSessionEnded, ee.Error()), err: err}
	case errors.As(err, &se):
		return &wrappedAPIError{apiError: newError(http.StatusBadGateway, api.CodeExecFailed, control.ErrStreamBroken.Error()), err: err}
	}
	return setupFailed(err)
}

// setupFailed maps a command whose environment or working directory the
// sandbox could not set up to the answer: a directory it lacks is
// file_not_found, as for a file; the message is the core's, which quotes
// only what the caller's own sandbox said.
func setupFailed(err error) error {
	var sf *control.SetupError
	if !errors.As(err, &sf) {
		return err
	}
	detail := func(status int, code, field string) error {
		return &apiError{status: status, detail: api.ErrorDetail{Code: code, Field: field, Message: sf.Error()}}
	}
	switch sf.Kind {
	case control.ErrCwdNotFound:
		return detail(http.StatusNotFound, api.CodeFileNotFound, "cwd")
	case control.ErrCwdNotDir, control.ErrCwdDenied:
		return detail(http.StatusConflict, api.CodePathConflict, "cwd")
	case control.ErrSetupNoShell:
		return detail(http.StatusUnprocessableEntity, api.CodeShellUnavailable, "")
	}
	return detail(http.StatusUnprocessableEntity, api.CodeInvalidEnv, "env")
}

// wrappedAPIError is an apiError that keeps the error behind it for the log.
type wrappedAPIError struct {
	*apiError
	err error
}

func (e *wrappedAPIError) Error() string { return e.apiError.Error() + ": " + e.err.Error() }
func (e *wrappedAPIError) Unwrap() error { return e.apiError }

// capWriter keeps the first max bytes and counts what it drops.
type capWriter struct {
	max       int
	buf       []byte
	truncated bool
}

func (c *capWriter) Write(p []byte) (int, error) {
	room := c.max - len(c.buf)
	if room < len(p) {
		c.truncated = true
		if room > 0 {
			c.buf = append(c.buf, p[:room]...)
		}
		return len(p), nil
	}
	c.buf = append(c.buf, p...)
	return len(p), nil
}

func (s *Server) execRun(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	var req api.ExecRunRequest
	if err := decodeLimit(w, r, &req, api.MaxRunBody); err != nil {
		s.writeError(w, r, err)
		return
	}
	if err := validateArgv(req.Command); err != nil {
		s.writeError(w, r, err)
		return
	}
	if err := control.ValidateExecSetup(req.Env, req.Cwd); err != nil {
		s.writeError(w, r, err)
		return
	}
	timeout, err := parseTimeout(req.Timeout)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	sess, ok := s.admitExec(w, r, id, "exec")
	if !ok {
		return
	}
	defer sess.End()

	ctx, cancel := context.WithTimeout(sess.Context(), timeout)
	defer cancel()
	stdout, stderr := &capWriter{max: api.MaxRunOutput}, &capWriter{max: api.MaxRunOutput}
	ereq := cluster.ExecRequest{Command: req.Command, Env: req.Env, Cwd: req.Cwd, Stdout: stdout, Stderr: stderr}
	if req.Stdin != nil {
		ereq.Stdin = strings.NewReader(*req.Stdin)
	}
	start := time.Now()
	st, err := sess.Exec(ctx, ereq)
	in := 0
	if req.Stdin != nil {
		in = len(*req.Stdin)
	}
	sess.Moved(int64(in), int64(len(stdout.buf)+len(stderr.buf)))
	resp := api.ExecRunResponse{StdoutTruncated: stdout.truncated, StderrTruncated: stderr.truncated, DurationMS: time.Since(start).Milliseconds()}
	resp.Stdout, resp.Stderr, resp.Encoding = encodeOutput(stdout, stderr)
	switch {
	case errors.Is(err, control.ErrExecTimeout):
		resp.TimedOut = true
	case err != nil:
		s.writeError(w, r, execFailed(err))
		return
	default:
		resp.ExitCode, resp.Signal = &st.Code, st.Signal
	}
	writeJSON(w, http.StatusOK, resp)
}

// encodeOutput is what a run printed as the answer carries it: text when
// both stdout and stderr are valid UTF-8, else both in base64, so that
// every byte comes back as it was. Output cut at MaxRunOutput is first cut
// back to the last whole character, when that is all that keeps it from
// being text: the answer says it was truncated anyway.
func encodeOutput(stdout, stderr *capWriter) (string, string, string) {
	out, errOut := stdout.text(), stderr.text()
	if utf8.Valid(out) && utf8.Valid(errOut) {
		return string(out), string(errOut), api.EncodingUTF8
	}
	return base64.StdEncoding.EncodeToString(stdout.buf), base64.StdEncoding.EncodeToString(stderr.buf), api.EncodingBase64
}

// text is what the writer kept, without a character that the cap cut
// in two.
func (c *capWriter) text() []byte {
	b := c.buf
	if !c.truncated {
		return b
	}
	// A cut character is an incomplete sequence of at most three bytes
	// at the end, after the last byte that can start one.
	for i := len(b) - 1; i >= 0 && i >= len(b)-3; i-- {
		if utf8.RuneStart(b[i]) {
			if !utf8.FullRune(b[i:]) {
				return b[:i]
			}
			break
		}
	}
	return b
}

// admitExec admits an exec session for the request's caller, or answers
// why not. With ?wake=true a sandbox stopped for idleness is started first
// and waited for (control.AdmitWaking); without it, it is refused as not
// running, with a message that says how to wake it. trigger names the way
// in for the wake metrics: exec or files.
func (s *Server) admitExec(w http.ResponseWriter, r *http.Request, id, trigger string) (*control.Session, bool) {
	wake, err := boolQuery(r.URL.Query(), "wake")
	if err != nil {
		s.writeError(w, r, err)
		return nil, false
	}
	var sess *control.Session
	if wake {
		sess, err = s.o.Control.AdmitWaking(r.Context(), caller(r), id, control.WakeOptions{Transport: receipt.TransportExec, Trigger: trigger})
	} else {
		sess, err = s.o.Control.Admit(r.Context(), caller(r), id, receipt.TransportExec)
	}
	switch {
	case err != nil && r.Context().Err() != nil:
		// The client went away, as a client stops waiting for a wake:
		// nobody is there to answer, and it is no server error.
		return nil, false
	case err != nil:
		s.writeError(w, r, err)
		return nil, false
	}
	return sess, true
}

var upgrader = websocket.Upgrader{
	Subprotocols: []string{api.ExecSubprotocol},
	// Only bearer-token clients can call this endpoint (browsers cannot set
	// the header on a WebSocket), so the origin carries no authority.
	CheckOrigin:     func(*http.Request) bool { return true },
	ReadBufferSize:  32 << 10,
	WriteBufferSize: 256 << 10,
}

func (s *Server) execStream(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	p, err := streamQuery(r.URL.Query())
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	if !websocket.IsWebSocketUpgrade(r) {
		s.writeError(w, r, newError(http.StatusBadRequest, api.CodeWebSocketRequired, "this endpoint speaks WebSocket ("+api.ExecSubprotocol+"); use POST .../exec/run for a one-shot command"))
		return
	}
	sess, ok := s.admitExec(w, r, id, "exec")
	if !ok {
		return
	}
	defer sess.End()
	conn, err := upgrader.Upgrade(w, r, nil)
	if err != nil {
		return // the upgrader answered the client
	}
	defer conn.Close()
	conn.SetReadLimit(api.MaxFrameSize)
	log := s.log.With("sandbox", id, "org", sess.OrgID)
	// Output is one message per chunk and blocks on the client: a slow
	// reader slows the command down instead of growing a buffer.
	cc := api.NewChannelConn(conn)
	handlerDone := make(chan struct{})
	defer close(handlerDone)
	defer cutOnSessionEnd(sess, cc, conn, len(p.start.Command) == 0, handlerDone)()

	// The session's context ends on a revoke, a stop or delete of the
	// sandbox, or shutdown; the timeout bounds the command.
	ctx, cancel := context.WithTimeout(sess.Context(), p.timeout)
	defer cancel()
	sendExit := func(f api.ExitFrame) {
		b, _ := json.Marshal(f)
		cc.Send(api.ChanExit, b)
		conn.WriteControl(websocket.CloseMessage, websocket.FormatCloseMessage(websocket.CloseNormalClosure, ""), time.Now().Add(time.Second))
	}
	if len(p.start.Command) == 0 {
		var ferr *apiError
		p.start, ferr = readStart(conn)
		// From here a session's end reaches the handler through ctx, which
		// ends the command and then the stream, whatever the read does.
		conn.SetReadDeadline(time.Time{})
		if ferr != nil {
			if cause := sess.Ended(); cause != nil {
				ferr = toAPIError(execFailed(&control.EndedError{Cause: cause}))
			}
			sendExit(api.ExitFrame{Error: &ferr.detail})
			return
		}
	}
	ereq := cluster.ExecRequest{Command: p.start.Command, Env: p.start.Env, Cwd: p.start.Cwd, TTY: p.tty, Stdout: sess.Out(cc.Writer(api.ChanStdout)), Stderr: sess.Out(cc.Writer(api.ChanStderr))}
	var stdinR *io.PipeReader
	var stdinW *io.PipeWriter
	if p.stdin {
		stdinR, stdinW = io.Pipe()
		ereq.Stdin = sess.In(stdinR)
	}
	resize := make(chan cluster.TerminalSize, 4)
	if ereq.TTY {
		ereq.Resize = resize
	}
	frames := &frameReader{conn: conn, stdin: stdinW, resize: resize, tty: ereq.TTY, cancel: cancel, done: make(chan struct{})}
	go s.readFrames(frames)

	st, err := sess.Exec(ctx, ereq)
	if stdinR != nil {
		stdinR.Close() // unblocks a stdin write nobody will read
	}
	if f, ok := streamExit(log, frames.err(), err, st, p.timeout); ok {
		sendExit(f)
	}
	conn.Close()
	<-frames.done
}

// streamParams are what an exec stream's query asks for.
type streamParams struct {
	// start is the command, its env and cwd; no command when the first
	// message brings them.
	start      api.StartFrame
	stdin, tty bool
	timeout    time.Duration
}

// streamQuery reads and checks an exec stream's query.
func streamQuery(q url.Values) (streamParams, error) {
	var p streamParams
	if err := knownQuery(q, "command", "env", "cwd", "stdin", "tty", "timeout", "wake"); err != nil {
		return p, err
	}
	var err error
	if p.start, err = startQuery(q); err != nil {
		return p, err
	}
	if p.stdin, err = boolQuery(q, "stdin"); err != nil {
		return p, err
	}
	if p.tty, err = boolQuery(q, "tty"); err != nil {
		return p, err
	}
	// A terminal without input is of no use (and some runtimes fail on it).
	if p.tty && !p.stdin {
		return p, fieldError("tty", "a terminal needs stdin (stdin=true)")
	}
	p.timeout = api.MaxExecTimeout
	if t := q.Get("timeout"); t != "" {
		if p.timeout, err = parseTimeout(t); err != nil {
			return p, err
		}
	}
	return p, nil
}

// cutOnSessionEnd makes a session ended from outside (its key revoked, its
// sandbox stopped, deleted or quarantined, shutdown) end the stream even
// while it waits for its first message or on a client that stopped
// reading: the read is cut short at once, and from then on a message the
// client leaves blocked for stallGrace closes the connection under it. It
// returns what stops watching.
func cutOnSessionEnd(sess *control.Session, cc *api.ChannelConn, conn *websocket.Conn, waitFirst bool, handlerDone <-chan struct{}) func() bool {
	// The wait for the first message is bounded before the session-end
	// cut below can run, so that the cut always comes later and wins.
	if waitFirst {
		conn.SetReadDeadline(time.Now().Add(startFrameWait))
	}
	return context.AfterFunc(sess.Context(), func() {
		if sess.Ended() == nil {
			return
		}
		conn.NetConn().SetReadDeadline(time.Now())
		go closeWhenStalled(cc, conn, handlerDone)
	})
}

// frameReader is the reading side of an exec stream: the client's stdin,
// resizes and protocol violations.
type frameReader struct {
	conn   *websocket.Conn
	stdin  *io.PipeWriter // nil without stdin
	resize chan cluster.TerminalSize
	tty    bool
	cancel context.CancelFunc
	done   chan struct{} // closed once the reading ends

	mu sync.Mutex
	// bad is a protocol violation by the client; it ends the session.
	bad error
}

func (f *frameReader) err() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.bad
}

// readFrames reads the client's messages until the connection ends (the
// client went away: Ctrl-C, or a lost connection) or a message breaks the
// protocol; either ends the command.
func (s *Server) readFrames(f *frameReader) {
	defer close(f.done)
	defer close(f.resize)
	for {
		mt, b, err := f.conn.ReadMessage()
		if err != nil {
			f.cancel()
			if f.stdin != nil {
				f.stdin.CloseWithError(io.ErrUnexpectedEOF)
			}
			return
		}
		if ferr := s.handleFrame(mt, b, f.stdin, f.resize, f.tty); ferr != nil {
			f.mu.Lock()
			f.bad = ferr
			f.mu.Unlock()
			f.cancel()
			return
		}
	}
}

// streamExit is the exit message of a stream whose command ended with st
// and err, or whose client broke the protocol (ferr); false when the
// client left and nobody listens for it.
func streamExit(log *slog.Logger, ferr, err error, st cluster.ExitStatus, timeout time.Duration) (api.ExitFrame, bool) {
	switch {
	case ferr != nil:
		log.Info("exec session refused a frame", "err", ferr)
		return api.ExitFrame{Error: &api.ErrorDetail{Code: api.CodeInvalidFrame, Message: ferr.Error()}}, true
	case errors.Is(err, control.ErrExecTimeout):
		return api.ExitFrame{Error: &api.ErrorDetail{Code: api.CodeExecTimeout, Message: "the command ran past its timeout of " + timeout.String()}}, true
	case errors.Is(err, control.ErrCallerGone):
		return api.ExitFrame{}, false
	case err != nil:
		// A directory or environment the sandbox could not set up is the
		// caller's to fix, not the stream's failure.
		var sf *control.SetupError
		if !errors.As(err, &sf) {
			log.Warn("exec ended without an exit status", "err", err)
		}
		d := toAPIError(execFailed(err)).detail
		return api.ExitFrame{Error: &d}, true
	}
	return api.ExitFrame{ExitCode: &st.Code, Signal: st.Signal}, true
}

// closeWhenStalled closes conn once a message to it has been blocked for
// stallGrace, or returns when the handler is done.
func closeWhenStalled(cc *api.ChannelConn, conn *websocket.Conn, done <-chan struct{}) {
	t := time.NewTicker(stallGrace / 8)
	defer t.Stop()
	for {
		select {
		case <-done:
			return
		case <-t.C:
			if cc.Stalled(stallGrace) {
				conn.NetConn().Close()
				return
			}
		}
	}
}

// readStart reads the StartFrame of a stream opened without a command.
// Its deadline (startFrameWait) is set by the caller.
func readStart(conn *websocket.Conn) (api.StartFrame, *apiError) {
	var f api.StartFrame
	mt, b, err := conn.ReadMessage()
	if err != nil {
		return f, newError(http.StatusBadRequest, api.CodeInvalidFrame, "no command: neither in the URL nor in a first message")
	}
	if mt != websocket.TextMessage {
		return f, newError(http.StatusBadRequest, api.CodeInvalidFrame, `the first message must be a text message {"command":[...]} when the URL has no command`)
	}
	dec := json.NewDecoder(strings.NewReader(string(b)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&f); err != nil {
		return f, newError(http.StatusBadRequest, api.CodeInvalidFrame, `the first message must be {"command":[...]}, with "env":{...} and "cwd":"..." if wanted`)
	}
	if err := validateStart(f); err != nil {
		return f, toAPIError(err)
	}
	return f, nil
}

// validateStart checks a stream's command, env and cwd.
func validateStart(f api.StartFrame) error {
	if err := validateArgv(f.Command); err != nil {
		return err
	}
	return control.ValidateExecSetup(f.Env, f.Cwd)
}

// handleFrame applies one client message, or says why it is invalid.
func (s *Server) handleFrame(mt int, b []byte, stdin *io.PipeWriter, resize chan<- cluster.TerminalSize, tty bool) error {
	if mt != websocket.BinaryMessage || len(b) == 0 {
		return errors.New("messages must be binary with a channel byte")
	}
	switch b[0] {
	case api.ChanStdin:
		if stdin == nil {
			return errors.New("stdin was not requested")
		}
		if _, err := stdin.Write(b[1:]); err != nil {
			return nil // the command no longer reads stdin
		}
	case api.ChanCloseIn:
		if len(b) != 2 || b[1] != api.ChanStdin {
			return errors.New("close frame must name stdin")
		}
		if stdin != nil {
			stdin.Close()
		}
	case api.ChanResize:
		if !tty {
			return errors.New("resize without a tty")
		}
		var f api.ResizeFrame
		dec := json.NewDecoder(strings.NewReader(string(b[1:])))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&f); err != nil || f.Width == 0 || f.Height == 0 {
			return errors.New(`resize frame must be {"width":W,"height":H} with both above 0`)
		}
		select {
		case resize <- cluster.TerminalSize{Width: f.Width, Height: f.Height}:
		default: // a burst of resizes: the latest that fits is enough
		}
	default:
		return fmt.Errorf("unknown channel %d", b[0])
	}
	return nil
}
