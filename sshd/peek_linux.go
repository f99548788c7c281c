package sshd

import (
	"syscall"

	"golang.org/x/sys/unix"
)

// peek reports whether bytes wait to be read on the socket fd, or it was
// closed by its peer, without reading them.
func peek(fd uintptr) bool {
	var b [1]byte
	n, _, err := syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
	return err == nil && n > 0
}

// hungUp reports whether the peer of the socket fd closed its side or
// reset the connection, even with bytes it sent still unread, without
// waiting.
func hungUp(fd uintptr) bool {
	fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLRDHUP}}
	n, err := unix.Poll(fds, 0)
	return err == nil && n > 0 && fds[0].Revents&(unix.POLLRDHUP|unix.POLLHUP|unix.POLLERR) != 0
}
