package server

import (
	"fmt"
	"net/http/httptest"
	"testing"
)

// TestLimitersBounded: a flood of distinct keys that authenticated, and of
// distinct client addresses, keeps each table of buckets at its bound.
func TestLimitersBounded(t *testing.T) {
	var l limiters
	lim := RateLimits{PerKey: 100, Burst: 200, PerAddress: 1, AddressBurst: 2}
	for i := range 3 * maxLimiters {
		key := fmt.Sprintf("%032x", i)
		l.addKey(lim, key, "org_x")
		if found, ok, _ := l.allowKey(lim, key, false); !found || !ok {
			t.Fatalf("a fresh key was refused at %d", i)
		}
		if ok, _ := l.allowAddress(lim, fmt.Sprintf("10.%d.%d.%d", i>>16&255, i>>8&255, i&255)); !ok {
			t.Fatalf("a fresh address was refused at %d", i)
		}
		if len(l.keys.m) > maxLimiters || len(l.addrs.m) > maxLimiters {
			t.Fatalf("%d key and %d address buckets after %d, bound %d", len(l.keys.m), len(l.addrs.m), i+1, maxLimiters)
		}
	}
	if len(l.orgs.m) != 1 {
		t.Errorf("%d organization buckets for one organization", len(l.orgs.m))
	}
}

// TestClientAddress: requests are counted per IPv4 address and per IPv6
// /64, from the connection, never from a header a client writes.
func TestClientAddress(t *testing.T) {
	for _, tc := range []struct{ remote, want string }{
		{"192.0.2.7:40000", "192.0.2.7"},
		{"[::ffff:192.0.2.7]:40000", "192.0.2.7"},
		{"[2001:db8:1:2:aaaa::1]:40000", "2001:db8:1:2::/64"},
		{"[2001:db8:1:2:ffff::9]:1", "2001:db8:1:2::/64"},
	} {
		r := httptest.NewRequest("GET", "/healthz", nil)
		r.RemoteAddr = tc.remote
		r.Header.Set("X-Forwarded-For", "203.0.113.9")
		if got := clientAddress(r); got != tc.want {
			t.Errorf("clientAddress(%s) = %q, want %q", tc.remote, got, tc.want)
		}
	}
}
