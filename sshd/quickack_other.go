//go:build !linux

package sshd

import "net"

// quickAck has no portable equivalent outside Linux.
func quickAck(net.Conn) bool { return false }
