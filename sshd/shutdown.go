package sshd

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"

	"github.com/gliderlabs/ssh"
)

// The gateway stops by itself rather than through gliderlabs'
// Server.Shutdown: that waits on a WaitGroup which each connection joins
// only once its handshake is done, so a handshake that ends while Shutdown
// waits joins a group already being waited on (a race, and a connection
// Shutdown does not wait for). The gateway instead keeps every connection
// from accept to close, and every listener it serves.

// served is what the gateway serves, for Shutdown.
type served struct {
	mu        sync.Mutex
	closing   bool
	listeners map[net.Listener]bool
	conns     map[*heldConn]bool
	// drained is closed once closing and no connection is left.
	drained chan struct{}
}

// addListener keeps ln; false once the gateway is shutting down.
func (o *served) addListener(ln net.Listener) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.closing {
		return false
	}
	if o.listeners == nil {
		o.listeners = map[net.Listener]bool{}
	}
	o.listeners[ln] = true
	return true
}

// add keeps c; false once the gateway is shutting down.
func (o *served) add(c *heldConn) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.closing {
		return false
	}
	if o.conns == nil {
		o.conns = map[*heldConn]bool{}
	}
	o.conns[c] = true
	return true
}

// remove forgets a closed connection.
func (o *served) remove(c *heldConn) {
	o.mu.Lock()
	defer o.mu.Unlock()
	delete(o.conns, c)
	if o.closing && len(o.conns) == 0 {
		o.drain()
	}
}

func (o *served) drain() {
	select {
	case <-o.drained:
	default:
		close(o.drained)
	}
}

// close starts the shutdown: it refuses what comes after, and returns the
// listeners, the connections, and what is closed when the last
// connection is.
func (o *served) close() (listeners []net.Listener, conns []*heldConn, drained <-chan struct{}) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if !o.closing {
		o.closing = true
		o.drained = make(chan struct{})
	}
	for ln := range o.listeners {
		listeners = append(listeners, ln)
	}
	for c := range o.conns {
		conns = append(conns, c)
	}
	if len(o.conns) == 0 {
		o.drain()
	}
	return listeners, conns, o.drained
}

func (o *served) isClosing() bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.closing
}

// Serve accepts connections on ln until Shutdown.
func (g *Gateway) Serve(ln net.Listener) error {
	if !g.served.addListener(ln) {
		ln.Close()
		return nil
	}
	err := g.srv.Serve(ln)
	if errors.Is(err, ssh.ErrServerClosed) || g.served.isClosing() {
		return nil
	}
	return err
}

// Shutdown stops accepting connections and waits up to ctx for the open
// ones to end; their sessions end through control.Close, each with a
// message and a non-zero exit status. A connection still logging in holds
// no session and is closed at once. Whatever is left when ctx ends is
// closed.
func (g *Gateway) Shutdown(ctx context.Context) error {
	listeners, conns, drained := g.served.close()
	for _, ln := range listeners {
		ln.Close()
	}
	for _, c := range conns {
		if c.loggingIn() {
			c.Close()
		}
	}
	select {
	case <-drained:
		return nil
	case <-ctx.Done():
	}
	// ctx may have ended with nothing open (or as the last connection
	// closed): only a connection still held is an error.
	_, conns, _ = g.served.close()
	if len(conns) == 0 {
		return nil
	}
	for _, c := range conns {
		c.Close()
	}
	return fmt.Errorf("sshd: connections still open at shutdown")
}
