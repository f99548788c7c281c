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
	// channels alike: at most MaxChannelsPerConn, and each holds a place
	// of org's among its MaxChannelsPerOrg.
	channels int
	g        *Gateway
	org      string
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
	l := &link{idle: make(chan struct{}), g: g, org: who.OrgID}
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
// MaxChannelsPerConn channels open, or its organization's connections
// MaxChannelsPerOrg. The caller calls leave once the channel is done.
func (g *Gateway) open(ctx ssh.Context, nc gossh.NewChannel, session bool) (*link, bool) {
	l := linkOf(ctx)
	if l == nil {
		nc.Reject(gossh.Prohibited, "not authenticated")
		return nil, false
	}
	err := l.enter(session)
	var tooMany *errChannels
	switch {
	case errors.As(err, &tooMany):
		g.o.Metrics.SSHRefused(tooMany.reason)
		g.log.Info("ssh channel refused: too many open", "type", nc.ChannelType(), "sandbox", ctx.User(), "org", l.org, "limit", tooMany.reason, "max", tooMany.max)
		nc.Reject(gossh.ResourceShortage, err.Error())
		return nil, false
	case err != nil:
		nc.Reject(gossh.Prohibited, err.Error())
		return nil, false
	}
	return l, true
}

// errChannels refuses a channel past MaxChannelsPerConn or
// MaxChannelsPerOrg.
type errChannels struct {
	reason string // refusedChannels or refusedOrgChannels
	max    int
}

func (e *errChannels) Error() string {
	if e.reason == refusedOrgChannels {
		return fmt.Sprintf("too many channels open on your organization's SSH connections (at most %d); close one", e.max)
	}
	return fmt.Sprintf("too many channels open on this connection (at most %d); close one, or open another connection", e.max)
}

// enter counts a channel in, a session or not; it refuses one past
// MaxChannelsPerConn or MaxChannelsPerOrg with an *errChannels and, once
// the core hung up, any with the reason.
func (l *link) enter(session bool) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.cause != nil {
		return l.cause
	}
	if l.channels >= l.g.o.MaxChannelsPerConn {
		return &errChannels{refusedChannels, l.g.o.MaxChannelsPerConn}
	}
	if !l.g.limits.takeChannel(l.org, l.g.o.MaxChannelsPerOrg) {
		return &errChannels{refusedOrgChannels, l.g.o.MaxChannelsPerOrg}
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
	l.g.limits.dropChannel(l.org)
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
