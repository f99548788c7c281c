// Package forward is the part of ssh -L that the SSH gateway (package sshd)
// and the session helper in the sandbox pod (package agent) share: the
// direct-tcpip payload, the one rule for which destinations may be dialled,
// the ciphers the gateway offers its SSH clients, the copy loop between two
// streams, and the internal leg from the gateway to the helper.
//
// The internal leg is TLS 1.3 (tls.go) carrying a stream multiplexer
// (mux.go): one connection per client connection, one stream per -L
// channel. The helper shows a self-signed certificate of a key it makes at
// start, which the gateway pins per pod; the gateway shows one of the key
// it derives for the sandbox, names the sandbox as the server name, and
// the helper accepts it only if it names its own sandbox and the key is
// the one its pod was given. Each stream opens with the destination (host
// and port); the helper answers accept, or reject with an SSH reason and
// message that the gateway passes on to its client. The leg is TLS and not
// a second SSH connection because x/crypto's SSH copies each packet and
// writes each packet and window adjustment with its own system call;
// BenchmarkLeg measures the two (docs/benchmarks.md has the figures).
package forward

import (
	"fmt"
	"io"
	"sync"
)

// Ciphers the gateway offers its clients: AES-GCM only. The OpenSSH client
// takes the first of its own choices that the server offers, and its
// defaults put chacha20-poly1305 first and AES-CTR before AES-GCM.
// x/crypto's chacha20-poly1305 is much slower than AES-GCM on AES-NI
// machines, and AES-CTR brings HMAC-SHA2 with it (no umac in x/crypto),
// which is slower too (docs/benchmarks.md, SSH). Every OpenSSH since 6.2
// and x/crypto speak AES-GCM.
func Ciphers() []string { return []string{"aes128-gcm@openssh.com", "aes256-gcm@openssh.com"} }

// DirectTCPIP is the payload of a direct-tcpip channel open (RFC 4254 7.2).
type DirectTCPIP struct {
	Host       string
	Port       uint32
	OriginHost string
	OriginPort uint32
}

// Loopback reports why host:port may not be dialled inside the sandbox, or
// "" when it is loopback with a port in 1..65535. The gateway and the helper
// apply this same rule, each on its own side.
func Loopback(host string, port uint32) string {
	if port < 1 || port > 65535 {
		return fmt.Sprintf("port %d is outside 1..65535", port)
	}
	switch host {
	case "localhost", "127.0.0.1", "::1", "[::1]":
		return ""
	}
	return "only loopback inside the sandbox (localhost, 127.0.0.1, ::1) may be forwarded to"
}

// HalfCloser is a stream whose write side can be closed alone: an SSH
// channel, a TCP connection.
type HalfCloser interface {
	io.ReadWriteCloser
	CloseWrite() error
}

// Pipe copies both ways between two streams, passing each side's EOF on as a
// half-close, and closes both when both directions are done. It returns the
// bytes copied from a to b and from b to a. Each direction reads up to 64 KB
// at a time, twice io.Copy's 32 KB and the wrappers hide the TCP side's
// ReadFrom and WriteTo, which fall back to 32 KB: an SSH channel returns
// everything its buffer holds in one read and answers each read with a
// window adjustment, so fewer, larger reads mean fewer packets. Measured:
// about 8% more -L throughput.
func Pipe(a, b HalfCloser) (aToB, bToA int64) {
	var wg sync.WaitGroup
	wg.Add(2)
	half := func(dst, src HalfCloser, n *int64) {
		defer wg.Done()
		*n, _ = io.CopyBuffer(struct{ io.Writer }{dst}, struct{ io.Reader }{src}, make([]byte, 64<<10))
		dst.CloseWrite()
	}
	go half(b, a, &aToB)
	go half(a, b, &bToA)
	wg.Wait()
	a.Close()
	b.Close()
	return aToB, bToA
}
