package forward_test

import (
	"testing"

	"github.com/hiloop/hiloop/forward"
)

// TestLoopback: only loopback names and addresses, as exact strings, with a
// port in 1..65535.
func TestLoopback(t *testing.T) {
	for _, tc := range []struct {
		host string
		port uint32
		ok   bool
	}{
		{"localhost", 8080, true}, {"127.0.0.1", 1, true}, {"::1", 65535, true}, {"[::1]", 22, true},
		{"127.0.0.2", 80, false}, {"0.0.0.0", 80, false}, {"10.0.0.1", 80, false}, {"example.com", 80, false},
		{"LOCALHOST", 80, false}, {"localhost.", 80, false}, {"127.0.0.1 ", 80, false}, {"", 80, false},
		{"localhost", 0, false}, {"localhost", 65536, false}, {"127.0.0.1", 70000, false},
	} {
		if got := forward.Loopback(tc.host, tc.port) == ""; got != tc.ok {
			t.Errorf("Loopback(%q, %d) allowed %v, want %v", tc.host, tc.port, got, tc.ok)
		}
	}
}
