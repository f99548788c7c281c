package sshd

import (
	"net"
	"sync/atomic"
)

// quickAckConn acknowledges at once every read of a connection that has not
// yet authenticated, where the kernel would delay the ACK (40 ms on Linux).
//
// The OpenSSH client sets TCP_NODELAY only once its session channel is
// open, so during the handshake Nagle's algorithm holds each small packet
// it writes right after another until the first is acknowledged: its
// SSH2_MSG_KEX_ECDH_INIT after its KEXINIT, and its service request after
// its NEWKEYS. The gateway answers neither of the first two, so nothing
// carries the ACK but the delayed-ACK timer: two stalls of about 40 ms in
// every login, measured with strace on the client (docs/benchmarks.md).
// Once the connection is authenticated, reads no longer ask: bulk
// transfers keep the kernel's delayed ACKs.
type quickAckConn struct {
	net.Conn
	done atomic.Bool
}

// quickAckKey keeps a connection's *quickAckConn in its ssh.Context.
type quickAckKey struct{}

func (c *quickAckConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if n > 0 && !c.done.Load() && !quickAck(c.Conn) {
		c.done.Store(true) // not a TCP connection: nothing to ask
	}
	return n, err
}

// stop ends the quick ACKs.
func (c *quickAckConn) stop() { c.done.Store(true) }
