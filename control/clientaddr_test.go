package control_test

import (
	"testing"

	"github.com/hiloop/hiloop/control"
)

// TestSource: strangers are counted per IPv4 address and per IPv6 /64, so
// a host that holds a whole /64 counts as one source.
func TestSource(t *testing.T) {
	for _, tc := range []struct{ addr, want string }{
		{"192.0.2.7:2222", "192.0.2.7"},
		{"192.0.2.7", "192.0.2.7"},
		{"[::ffff:192.0.2.7]:2222", "192.0.2.7"},
		{"[2001:db8:1:2:aaaa::1]:2222", "2001:db8:1:2::/64"},
		{"[2001:db8:1:2:ffff:ffff:ffff:ffff]:40000", "2001:db8:1:2::/64"},
		{"[2001:db8:1:3::1]:2222", "2001:db8:1:3::/64"},
		{"2001:db8:1:3::1", "2001:db8:1:3::/64"},
		{"[fe80::1%eth0]:2222", "fe80::/64"},
		{"[fe80::aaaa:bbbb:cccc:dddd%eth0]:2222", "fe80::/64"},
	} {
		if got := control.Source(tc.addr); got != tc.want {
			t.Errorf("Source(%s) = %q, want %q", tc.addr, got, tc.want)
		}
	}
}
