package control

import (
	"net"
	"strings"
)

// Source is the client a network address (host:port, or a bare host) is
// counted under by the limits on what strangers can open, the HTTP API's
// and the SSH gateway's alike: an IPv4 address, or the /64 of an IPv6 one,
// since one IPv6 host commonly holds a whole /64 and could otherwise open a
// limit's worth from each of its addresses.
func Source(addr string) string {
	host := addr
	if h, _, err := net.SplitHostPort(addr); err == nil {
		host = h
	}
	// A link-local address comes with its zone (fe80::1%eth0), which
	// ParseIP refuses: without it, each address of the /64 would be a
	// source of its own.
	host, _, _ = strings.Cut(host, "%")
	ip := net.ParseIP(host)
	switch {
	case ip == nil:
		return host
	case ip.To4() != nil:
		return ip.To4().String()
	default:
		return ip.Mask(net.CIDRMask(64, 128)).String() + "/64"
	}
}
