package k8s_test

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package's tests when they leave goroutines behind: an
// exec stream that ended, however it ended, must take its copying and
// resize goroutines with it.
//
// One wait outlives its test by design: a SPDY set-up cut at its deadline
// leaves spdystream waiting out its 30 s for a stream's reply (it does not
// stop when the connection closes), and the goroutine of within that
// closes what that set-up opened once it ends.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		goleak.IgnoreTopFunction("github.com/moby/spdystream.(*Stream).WaitTimeout"),
		goleak.IgnoreTopFunction("github.com/hiloop/hiloop/k8s.within[...].func2"))
}
