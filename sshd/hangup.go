package sshd

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/gliderlabs/ssh"
	gossh "golang.org/x/crypto/ssh"

	"github.com/hiloop/hiloop/control"
)

// hangUpGrace bounds how long a connection the core closes waits for its
// session channels to print why they ended and send their exit status.
const hangUpGrace = time.Second

// link is an authenticated connection as the core knows it: registered
// under its key and sandbox, so that a revoke, a stop or delete, a
// quarantine or shutdown closes the connection itself and not only its
// sessions. It counts the connection's session channels, which get to say
// why they ended before the connection closes under them.
type link struct {
	mu sync.Mutex
	// open counts the session channels being served.
	open int
	// channels counts the channels being served, sessions and -L
	// channels alike; at most max.
	channels, max int
	// cause is why the core hung up; nil until it did. From then on no
	// session channel is accepted.
	cause error
	// idle is closed once the core hung up and no session channel is open.
	idle     chan struct{}
	idleDone bool
}

// linkKey keeps a connection's *link in its ssh.Context.
type linkKey struct{}

// register makes the connection that conn's client authenticated as who a
// control.Conn, which the core closes when it must, and keeps the link in
// ctx for the channel handlers. The registration ends when the connection
// closes. A connection that cannot be closed from outside is refused.
func (g *Gateway) register(ctx ssh.Context, md gossh.ConnMetadata, who control.Caller) error {
	conn, ok := md.(gossh.Conn)
	if !ok {
		g.log.Error("ssh login refused: the connection cannot be closed from outside", "type", fmt.Sprintf("%T", md))
		return errors.New("permission denied")
	}
	l := &link{idle: make(chan struct{}), max: g.o.MaxChannelsPerConn}
	reg, err := g.o.Control.Connect(ctx, who, md.User(), func(cause error) { g.hangUp(l, conn, who, cause) })
	if err != nil {
		return err
	}
	context.AfterFunc(ctx, reg.Release)
	ctx.SetValue(linkKey{}, l)
	return nil
}

// linkOf is the connection's link; nil for one that never authenticated.
func linkOf(ctx ssh.Context) *link {
	l, _ := ctx.Value(linkKey{}).(*link)
	return l
}

// hangUp closes the connection for cause once its session channels have
// ended, or after hangUpGrace: the core has already ended their sessions,
// so each only has its last line and exit status left to send.
func (g *Gateway) hangUp(l *link, conn gossh.Conn, who control.Caller, cause error) {
	g.log.Info("ssh connection closed by the core", "sandbox", conn.User(), "org", who.OrgID, "key", who.KeyID,
		"remote", conn.RemoteAddr().String(), "cause", cause.Error())
	l.mu.Lock()
	l.cause = cause
	l.settle()
	l.mu.Unlock()
	go func() {
		t := time.NewTimer(hangUpGrace)
		defer t.Stop()
		select {
		case <-l.idle:
		case <-t.C:
		}
		conn.Close()
	}()
}

// open counts a new channel of an authenticated connection in, or rejects
// it and says why: the core hung up on the connection, or it has
// MaxChannelsPerConn channels open. The caller calls leave once the channel
// is done.
func (g *Gateway) open(ctx ssh.Context, nc gossh.NewChannel, session bool) (*link, bool) {
	l := linkOf(ctx)
	if l == nil {
		nc.Reject(gossh.Prohibited, "not authenticated")
		return nil, false
	}
	err := l.enter(session)
	var tooMany errChannels
	switch {
	case errors.As(err, &tooMany):
		g.o.Metrics.SSHRefused(refusedChannels)
		g.log.Info("ssh channel refused: too many open on the connection", "type", nc.ChannelType(), "sandbox", ctx.User(), "max", int(tooMany))
		nc.Reject(gossh.ResourceShortage, err.Error())
		return nil, false
	case err != nil:
		nc.Reject(gossh.Prohibited, err.Error())
		return nil, false
	}
	return l, true
}

// errChannels refuses a channel past MaxChannelsPerConn.
type errChannels int

func (e errChannels) Error() string {
	return fmt.Sprintf("too many channels open on this connection (at most %d); close one, or open another connection", int(e))
}

// enter counts a channel in, a session or not; it refuses one past max
// with errChannels and, once the core hung up, any with the reason.
func (l *link) enter(session bool) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.cause != nil {
		return l.cause
	}
	if l.channels >= l.max {
		return errChannels(l.max)
	}
	l.channels++
	if session {
		l.open++
	}
	return nil
}

// leave counts a channel out.
func (l *link) leave(session bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.channels--
	if session {
		l.open--
	}
	l.settle()
}

// settle closes idle once the core hung up and no session channel is open.
// l.mu is held.
func (l *link) settle() {
	if l.cause != nil && l.open == 0 && !l.idleDone {
		l.idleDone = true
		close(l.idle)
	}
}
