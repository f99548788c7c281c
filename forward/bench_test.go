package forward_test

import (
	"crypto/ed25519"
	"crypto/rand"
	"crypto/tls"
	"io"
	"net"
	"testing"

	gossh "golang.org/x/crypto/ssh"

	"github.com/hiloop/hiloop/forward"
)

// BenchmarkLeg: one stream pushed one way across the gateway's internal
// leg on loopback, in-process, each end on its own goroutines, the
// receiver reading 64 KB at a time as forward.Pipe does: the SSH leg
// (x/crypto client and server, AES-GCM, one direct-tcpip channel) against
// TLS 1.3 (AES-GCM, ed25519 certificates both ways) carrying the mux, and
// bare TLS as the ceiling of either.
func BenchmarkLeg(b *testing.B) {
	for _, size := range []int{32 << 10, 64 << 10, 256 << 10} {
		name := func(s string) string { return s + "/write-" + itoa(size>>10) + "K" }
		b.Run(name("ssh"), func(b *testing.B) { benchPush(b, sshLeg(b), size) })
		b.Run(name("tls-mux"), func(b *testing.B) { benchPush(b, muxLeg(b), size) })
		b.Run(name("tls"), func(b *testing.B) { benchPush(b, tlsLeg(b), size) })
	}
}

func itoa(n int) string {
	if n < 10 {
		return string(rune('0' + n))
	}
	return itoa(n/10) + string(rune('0'+n%10))
}

// leg is a connected pair: what the sender writes, what the receiver
// reads.
type leg struct {
	w io.WriteCloser
	r io.Reader
}

func benchPush(b *testing.B, l leg, size int) {
	done := make(chan int64)
	go func() {
		n, _ := io.CopyBuffer(io.Discard, struct{ io.Reader }{l.r}, make([]byte, 64<<10))
		done <- n
	}()
	buf := make([]byte, size)
	rand.Read(buf)
	b.SetBytes(int64(size))
	b.ResetTimer()
	for range b.N {
		if _, err := l.w.Write(buf); err != nil {
			b.Fatal(err)
		}
	}
	l.w.Close()
	if n := <-done; n != int64(b.N*size) {
		b.Fatalf("received %d of %d bytes", n, b.N*size)
	}
}

func tcpPair(b testing.TB) (client, server net.Conn) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	acc := make(chan net.Conn)
	go func() {
		c, _ := ln.Accept()
		acc <- c
	}()
	client, err = net.Dial("tcp", ln.Addr().String())
	if err != nil {
		b.Fatal(err)
	}
	server = <-acc
	b.Cleanup(func() { client.Close(); server.Close() })
	return client, server
}

func sshLeg(b *testing.B) leg {
	c, s := tcpPair(b)
	_, hostPriv, _ := ed25519.GenerateKey(rand.Reader)
	_, userPriv, _ := ed25519.GenerateKey(rand.Reader)
	host, _ := gossh.NewSignerFromKey(hostPriv)
	user, _ := gossh.NewSignerFromKey(userPriv)
	scfg := &gossh.ServerConfig{NoClientAuth: true}
	scfg.Ciphers = forward.Ciphers()
	scfg.AddHostKey(host)
	chs := make(chan gossh.Channel, 1)
	go func() {
		_, nchans, reqs, err := gossh.NewServerConn(s, scfg)
		if err != nil {
			return
		}
		go gossh.DiscardRequests(reqs)
		for nc := range nchans {
			ch, creqs, _ := nc.Accept()
			go gossh.DiscardRequests(creqs)
			chs <- ch
		}
	}()
	cc, nchans, reqs, err := gossh.NewClientConn(c, "x", &gossh.ClientConfig{User: "u", Auth: []gossh.AuthMethod{gossh.PublicKeys(user)},
		HostKeyCallback: gossh.InsecureIgnoreHostKey(), Config: gossh.Config{Ciphers: forward.Ciphers()}})
	if err != nil {
		b.Fatal(err)
	}
	client := gossh.NewClient(cc, nchans, reqs)
	ch, creqs, err := client.OpenChannel("direct-tcpip", gossh.Marshal(forward.DirectTCPIP{Host: "localhost", Port: 1}))
	if err != nil {
		b.Fatal(err)
	}
	go gossh.DiscardRequests(creqs)
	return leg{w: closeWriter{ch}, r: <-chs}
}

// closeWriter closes the write side only, so the reader sees EOF.
type closeWriter struct{ forward.HalfCloser }

func (c closeWriter) Close() error { return c.CloseWrite() }

// tlsPair is the two ends of TLS over c and s (a new TCP pair when nil), as
// the gateway and the helper make them (forward.Client, forward.Server).
func tlsPair(b testing.TB, c, s net.Conn) (client, server *forward.Conn) {
	if c == nil {
		c, s = tcpPair(b)
	}
	_, hostPriv, _ := ed25519.GenerateKey(rand.Reader)
	_, userPriv, _ := ed25519.GenerateKey(rand.Reader)
	hostCert, _ := forward.Certificate(hostPriv)
	userCert, _ := forward.Certificate(userPriv)
	server = forward.Server(s, &tls.Config{MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{hostCert},
		ClientAuth: tls.RequireAnyClientCert, NextProtos: []string{forward.Protocol}})
	client = forward.Client(c, &tls.Config{MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{userCert},
		InsecureSkipVerify: true, ServerName: "sbx", NextProtos: []string{forward.Protocol}})
	errc := make(chan error, 1)
	go func() { errc <- server.Handshake() }()
	if err := client.Handshake(); err != nil {
		b.Fatal(err)
	}
	if err := <-errc; err != nil {
		b.Fatal(err)
	}
	return client, server
}

func tlsLeg(b *testing.B) leg {
	c, s := tlsPair(b, nil, nil)
	return leg{w: closeWriter{c}, r: s}
}

func muxLeg(b *testing.B) leg {
	c, s := tlsPair(b, nil, nil)
	cm, sm := forward.NewMux(c, forward.MuxOptions{}), forward.NewMux(s, forward.MuxOptions{Server: true})
	b.Cleanup(func() { cm.Close(); sm.Close() })
	acc := make(chan *forward.Stream, 1)
	go func() {
		st, err := sm.Accept()
		if err == nil {
			st.Accept()
		}
		acc <- st
	}()
	req, _ := forward.EncodeOpen("localhost", 1)
	st, err := cm.Open(nil, req)
	if err != nil {
		b.Fatal(err)
	}
	return leg{w: closeWriter{st}, r: <-acc}
}
