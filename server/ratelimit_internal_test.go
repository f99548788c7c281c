package server

import (
	"fmt"
	"testing"
)

// TestLimitersBounded: a flood of distinct made-up secrets keeps the map of
// limiters at its bound.
func TestLimitersBounded(t *testing.T) {
	var l limiters
	lim := RateLimits{PerKey: 100, Burst: 200}
	for i := range 3 * maxLimiters {
		if ok, _ := l.allow(lim, fmt.Sprintf("key-%d", i), false); !ok {
			t.Fatalf("a fresh key was refused at %d", i)
		}
		if len(l.m) > maxLimiters {
			t.Fatalf("%d limiters after %d keys, bound %d", len(l.m), i+1, maxLimiters)
		}
	}
}
