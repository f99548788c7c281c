//go:build !linux

package sshd

// peek cannot tell here whether bytes wait on fd, so no connection is
// taken for silent and none loses its place to another.
func peek(uintptr) bool { return true }

// hungUp cannot tell here whether the peer of fd hung up, so a waiting
// connection keeps its place until its wait ends.
func hungUp(uintptr) bool { return false }
