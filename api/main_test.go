package api_test

import (
	"flag"
	"os"
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package's tests when they leave goroutines behind: a
// client call or stream that ended must take its goroutines with it. A
// fuzzing run is left alone: the fuzzing engine's own goroutines outlive
// the inputs it runs.
func TestMain(m *testing.M) {
	flag.Parse()
	if f := flag.Lookup("test.fuzz"); f != nil && f.Value.String() != "" {
		os.Exit(m.Run())
	}
	if f := flag.Lookup("test.fuzzworker"); f != nil && f.Value.String() == "true" {
		os.Exit(m.Run())
	}
	goleak.VerifyTestMain(m)
}
