package sshd

import (
	"net"
	"syscall"
)

// quickAck puts c's socket in quick-ACK mode, which also sends an ACK that
// was being delayed; the kernel may leave the mode again on its own, so it
// is asked after every read. It reports whether c is a TCP connection that
// took it.
func quickAck(c net.Conn) bool {
	tc, ok := c.(*net.TCPConn)
	if !ok {
		return false
	}
	rc, err := tc.SyscallConn()
	if err != nil {
		return false
	}
	var serr error
	if err := rc.Control(func(fd uintptr) {
		serr = syscall.SetsockoptInt(int(fd), syscall.IPPROTO_TCP, syscall.TCP_QUICKACK, 1)
	}); err != nil {
		return false
	}
	return serr == nil
}
