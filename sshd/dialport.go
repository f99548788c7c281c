package sshd

import (
	"context"
	"errors"
	"net"
	"time"

	"github.com/hiloop/hiloop/control"
	"github.com/hiloop/hiloop/forward"
)

// DialPort opens a stream to port on the loopback of the session's sandbox
// (a forward session), over a connection of its own to the sandbox's
// session helper: the same leg, pin and destination policy as ssh -L. The
// connection and the stream end when the returned conn is closed or the
// session ends. The error's message may be shown to the caller; a
// *forward.OpenError is the helper's refusal of the open (nothing listens
// on the port).
func (g *Gateway) DialPort(sess *control.Session, port int) (net.Conn, error) {
	req, err := forward.EncodeOpen("127.0.0.1", uint32(port))
	if err != nil {
		return nil, err
	}
	if reason := forward.Loopback("127.0.0.1", uint32(port)); reason != "" {
		return nil, errors.New(reason)
	}
	log := g.log.With("sandbox", sess.SandboxID, "org", sess.OrgID, "preview", sess.Preview)
	mux, _, err := g.helperMux(sess, log, 1)
	if err != nil {
		return nil, err
	}
	ctx := sess.Context()
	stop := context.AfterFunc(ctx, func() { mux.Close() })
	octx, cancel := context.WithTimeout(ctx, g.o.HelperDialTimeout)
	st, err := mux.Open(octx.Done(), req)
	late := octx.Err() != nil && ctx.Err() == nil
	cancel()
	if err != nil {
		stop()
		mux.Close()
		var oe *forward.OpenError
		switch {
		case errors.As(err, &oe):
			return nil, oe
		case late:
			return nil, errors.New("the sandbox's session helper did not answer")
		}
		return nil, errors.New("the sandbox's session helper went away")
	}
	return &streamConn{Stream: st, mux: mux, stop: stop}, nil
}

// streamConn is a stream of a mux of its own as a net.Conn; closing it
// ends both. Deadlines are not supported: the stream ends with its
// session, and the HTTP server's own deadlines hold the client's side.
type streamConn struct {
	*forward.Stream
	mux  *forward.Mux
	stop func() bool
}

func (c *streamConn) Close() error {
	c.stop()
	c.Stream.Close()
	return c.mux.Close()
}

func (c *streamConn) LocalAddr() net.Addr              { return streamAddr{} }
func (c *streamConn) RemoteAddr() net.Addr             { return streamAddr{} }
func (c *streamConn) SetDeadline(time.Time) error      { return nil }
func (c *streamConn) SetReadDeadline(time.Time) error  { return nil }
func (c *streamConn) SetWriteDeadline(time.Time) error { return nil }

// streamAddr names a stream's ends.
type streamAddr struct{}

func (streamAddr) Network() string { return "hiloop-forward" }
func (streamAddr) String() string  { return "sandbox" }
