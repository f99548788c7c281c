// Package eventually waits, in tests, for a condition that another
// goroutine or process makes true. It is the one polling loop the tests
// share; it imports testing, so the hiloop binary never links it
// (internal/layers checks).
package eventually

import (
	"testing"
	"time"
)

// Patience is how long True waits. It bounds a hang, not a speed: a
// condition that comes true at all comes true long before it.
const Patience = 30 * time.Second

// True polls cond until it holds, and fails t with what if Patience passes
// first.
func True(t testing.TB, what string, cond func() bool) {
	t.Helper()
	Within(t, what, Patience, func() (bool, error) { return cond(), nil })
}

// Within polls cond until it holds, and fails t with what and the last
// error cond returned if timeout passes first. The polls start a
// millisecond apart and slow to 100ms, so that a quick condition is seen
// at once and a slow one (a cluster's) is not asked for in a busy loop.
func Within(t testing.TB, what string, timeout time.Duration, cond func() (bool, error)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	var last error
	for pause := time.Millisecond; ; pause = min(2*pause, 100*time.Millisecond) {
		ok, err := cond()
		if ok {
			return
		}
		last = err
		if time.Now().After(deadline) {
			break
		}
		time.Sleep(pause)
	}
	if last != nil {
		t.Fatalf("%s: not within %s (last: %v)", what, timeout, last)
	}
	t.Fatalf("%s: not within %s", what, timeout)
}
