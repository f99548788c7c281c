package agent

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package's tests when they leave goroutines behind: a
// helper that is closed and gateways that left must take every handshake,
// mux, stream and dial goroutine with them.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
