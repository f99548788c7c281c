//go:build !linux

package sshd

// peek cannot tell here whether bytes wait on fd, so no connection is
// taken for silent and none loses its place to another.
func peek(uintptr) bool { return true }
