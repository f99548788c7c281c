package sshd_test

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package's tests when they leave goroutines behind: a
// gateway that is shut down and clients that left must take every
// connection, session, keepalive and upstream goroutine with them.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
