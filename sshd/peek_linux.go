package sshd

import "syscall"

// peek reports whether bytes wait to be read on the socket fd, or it was
// closed by its peer, without reading them.
func peek(fd uintptr) bool {
	var b [1]byte
	n, _, err := syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
	return err == nil && n > 0
}
