package sshd

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"sync"

	"github.com/gliderlabs/ssh"
	gossh "golang.org/x/crypto/ssh"

	"github.com/hiloop/hiloop/cluster"
	"github.com/hiloop/hiloop/control"
	"github.com/hiloop/hiloop/receipt"
	"github.com/hiloop/hiloop/store"
)

// shell runs the image's shell: bash when the image has it, else sh. $0 is
// the terminal type from the PTY request, exported as TERM (the exec API
// takes no environment).
const shell = `[ -n "$0" ] && [ "$0" != sh ] && export TERM="$0"; if command -v bash >/dev/null 2>&1; then exec bash; else exec sh; fi`

// command runs $1 through sh -c, as OpenSSH does, with TERM from $0.
const command = `[ -n "$0" ] && [ "$0" != sh ] && export TERM="$0"; exec /bin/sh -c "$1"`

// session is one session channel: it takes pty-req and window-change, then
// one shell or exec, and refuses everything else.
type session struct {
	g   *Gateway
	ch  gossh.Channel
	who control.Caller
	id  string

	mu      sync.Mutex
	started bool
	closed  bool
	tty     bool
	term    string
	// resize carries window changes to the exec stream; it is closed when
	// the channel's requests end, which ends the stream's resize loop.
	resize chan cluster.TerminalSize
}

// session handles a "session" channel.
func (g *Gateway) session(_ *ssh.Server, conn *gossh.ServerConn, nc gossh.NewChannel, ctx ssh.Context) {
	who, ok := caller(conn)
	if !ok {
		nc.Reject(gossh.Prohibited, "not authenticated")
		return
	}
	// Once the core closes the connection, it opens no more sessions.
	l, ok := g.open(ctx, nc, true)
	if !ok {
		return
	}
	defer l.leave(true)
	ch, reqs, err := nc.Accept()
	if err != nil {
		return
	}
	s := &session{g: g, ch: ch, who: who, id: conn.User(), resize: make(chan cluster.TerminalSize, 4)}
	log := g.log.With("sandbox", s.id, "org", who.OrgID, "key", who.KeyID)
	// The requests end when the channel closes: the client left, or the
	// session is over. Either way the command's context ends.
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer func() {
		s.mu.Lock()
		s.closed = true
		close(s.resize)
		s.mu.Unlock()
	}()
	for req := range reqs {
		ok := false
		// launch runs the shell or command once the request is answered:
		// a quick command would otherwise close the channel before the
		// answer, and a client that waits for it (x/crypto's Session.Run,
		// paramiko) would lose the exit status.
		var launch func()
		switch req.Type {
		case "pty-req":
			ok = s.ptyReq(req.Payload)
		case "window-change":
			s.windowChange(req.Payload)
			ok = true
		case "shell":
			launch = s.start(sctx, log, nil)
			ok = launch != nil
		case "exec":
			var p struct{ Command string }
			if gossh.Unmarshal(req.Payload, &p) == nil {
				launch = s.start(sctx, log, &p.Command)
				ok = launch != nil
			}
		default:
			// env (the sandbox gets the image's environment only),
			// auth-agent-req@openssh.com, x11-req, subsystem, signal, ...
			log.Debug("ssh session request refused", "type", req.Type)
		}
		if req.WantReply {
			req.Reply(ok, nil)
		}
		if launch != nil {
			go launch()
		}
	}
}

// ptyReq records the terminal: TERM, then width and height in characters.
func (s *session) ptyReq(payload []byte) bool {
	var p struct {
		Term          string
		Width, Height uint32
		PxW, PxH      uint32
		Modes         string
	}
	if gossh.Unmarshal(payload, &p) != nil {
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.started {
		return false
	}
	s.tty, s.term = true, p.Term
	s.queueResize(p.Width, p.Height)
	return true
}

func (s *session) windowChange(payload []byte) {
	if len(payload) < 8 {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.queueResize(binary.BigEndian.Uint32(payload), binary.BigEndian.Uint32(payload[4:]))
}

// queueResize passes a size on; in a burst the latest that fits is enough.
// s.mu is held.
func (s *session) queueResize(w, h uint32) {
	if s.closed || w == 0 || h == 0 || w > 0xffff || h > 0xffff {
		return
	}
	select {
	case s.resize <- cluster.TerminalSize{Width: uint16(w), Height: uint16(h)}:
	default:
	}
}

// start returns what admits the session through control and runs the
// shell (cmd nil) or the command in the sandbox, then sends its exit status
// and closes the channel. It returns nil for a second start.
func (s *session) start(ctx context.Context, log *slog.Logger, cmd *string) func() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.started {
		return nil
	}
	s.started = true
	tty, term := s.tty, s.term
	return func() {
		code := s.run(ctx, log, cmd, tty, term)
		if code >= 0 {
			s.ch.SendRequest("exit-status", false, gossh.Marshal(struct{ Status uint32 }{uint32(code)}))
		}
		s.ch.CloseWrite()
		s.ch.Close()
	}
}

// run runs the session and returns the exit status to send, or -1 when an
// exit-signal was sent instead. A sandbox stopped for idleness is woken
// first: one line on stderr says so, and the session waits for it.
func (s *session) run(ctx context.Context, log *slog.Logger, cmd *string, tty bool, term string) int {
	sess, err := s.g.o.Control.AdmitWaking(ctx, s.who, s.id, control.WakeOptions{Transport: receipt.TransportSSH,
		Waking: func() { fmt.Fprintf(s.ch.Stderr(), "waking %s\r\n", s.id) }})
	if err != nil {
		fmt.Fprintf(s.ch.Stderr(), "hiloop: %s\r\n", refusal(s.id, err))
		log.Info("ssh session refused", "err", err)
		return 255
	}
	defer sess.End()
	argv := []string{"/bin/sh", "-c", shell, term}
	if cmd != nil {
		argv = []string{"/bin/sh", "-c", command, term, *cmd}
	}
	if !tty {
		argv[3] = "sh" // no terminal, no TERM
	}
	req := cluster.ExecRequest{Command: argv, Stdin: sess.In(s.ch), Stdout: sess.Out(s.ch), Stderr: s.ch.Stderr(), TTY: tty}
	if tty {
		req.Resize = s.resize
	}
	st, err := sess.Exec(sess.Context(), req)
	if err != nil {
		log.Warn("ssh session ended without an exit status", "err", err)
		fmt.Fprintf(s.ch.Stderr(), "\r\nhiloop: %s\r\n", ended(err))
		return 255
	}
	if name, ok := signalNames[st.Code-128]; ok && st.Signal != "" {
		s.ch.SendRequest("exit-signal", false, gossh.Marshal(struct {
			Signal     string
			CoreDumped bool
			Message    string
			Lang       string
		}{name, false, st.Signal, ""}))
		return -1
	}
	return st.Code
}

// refusal is the one line a refused session prints: what is wrong and what
// to do about it.
func refusal(id string, err error) string {
	var se *control.StateError
	var we *control.WakeTimeoutError
	switch {
	case errors.As(err, &se) && se.Idle():
		return fmt.Sprintf("sandbox %s is %s for idleness and could not be woken; start it with: hiloop sandbox start %s", id, se.State, id)
	case errors.As(err, &se) && se.Mode == store.ModeStopped:
		return fmt.Sprintf("sandbox %s was stopped by its owner, so a connection does not wake it; start it with: hiloop sandbox start %s", id, id)
	case errors.As(err, &se) && (se.State == store.StateStopped || se.State == store.StateStopping):
		return fmt.Sprintf("sandbox %s is %s; start it with: hiloop sandbox start %s", id, se.State, id)
	case errors.As(err, &se) && (se.State == store.StatePending || se.State == store.StateStarting):
		return fmt.Sprintf("sandbox %s is %s, not running yet; wait with: hiloop sandbox wait %s", id, se.State, id)
	case errors.As(err, &se):
		return fmt.Sprintf("sandbox %s is %s; see: hiloop sandbox events %s", id, se.State, id)
	case errors.Is(err, control.ErrQuarantined):
		return fmt.Sprintf("sandbox %s is quarantined: it broke what its receipt promised, so sessions are refused; see: hiloop sandbox get %s", id, id)
	case errors.Is(err, control.ErrSessionLimit):
		return err.Error()
	case errors.Is(err, control.ErrTooManyWaits):
		return fmt.Sprintf("sandbox %s is not running yet, and this connection may not wait for it: %s", id, err)
	case errors.As(err, new(*control.TransportError)):
		return err.Error()
	case errors.Is(err, control.ErrUnauthenticated):
		return "the key this connection authenticated with was revoked or deleted"
	case errors.Is(err, store.ErrNotFound):
		return "no such sandbox"
	case errors.As(err, &we):
		return fmt.Sprintf("sandbox %s did not come up within %s of being woken (it is %s); see: hiloop sandbox events %s", id, we.After, we.State, id)
	case errors.Is(err, store.ErrQuota), errors.Is(err, control.ErrNotHardened):
		return fmt.Sprintf("sandbox %s could not be woken: %s", id, err)
	case errors.Is(err, control.ErrClusterUnavailable):
		return fmt.Sprintf("sandbox %s could not be woken: the cluster did not answer; try again", id)
	case errors.Is(err, control.ErrShuttingDown):
		return err.Error()
	default:
		return "the session could not start"
	}
}

// ended is the line a session whose command did not exit prints, from how
// the core classified it.
func ended(err error) string {
	var ee *control.EndedError
	var ce *control.ClusterError
	var ae *control.ArgvError
	switch {
	case errors.As(err, &ae):
		return "refused: " + ae.Error()
	case errors.As(err, &ee):
		return "session ended: " + ee.Cause.Error()
	case errors.As(err, &ce):
		return "the cluster did not answer; try again"
	case errors.Is(err, control.ErrCallerGone):
		return "the connection went away"
	}
	return control.ErrStreamBroken.Error()
}

// signalNames are the SSH names (RFC 4254) of the signals a command can die
// of, by number.
var signalNames = map[int]string{1: "HUP", 2: "INT", 3: "QUIT", 4: "ILL", 6: "ABRT", 8: "FPE", 9: "KILL",
	10: "USR1", 11: "SEGV", 12: "USR2", 13: "PIPE", 14: "ALRM", 15: "TERM"}
