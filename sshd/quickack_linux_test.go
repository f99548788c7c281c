package sshd

import (
	"net"
	"syscall"
	"testing"
)

// quickAckMode reads whether c's socket is in quick-ACK mode.
func quickAckMode(t *testing.T, c *net.TCPConn) int {
	t.Helper()
	rc, err := c.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var v int
	var serr error
	rc.Control(func(fd uintptr) {
		v, serr = syscall.GetsockoptInt(int(fd), syscall.IPPROTO_TCP, syscall.TCP_QUICKACK)
	})
	if serr != nil {
		t.Fatal(serr)
	}
	return v
}

// TestQuickAckConn: until stop, each read of a TCP connection leaves its
// socket acknowledging at once, even in an exchange of requests and answers,
// where the kernel would otherwise delay its ACKs to carry them on the
// answers; a connection that is not TCP reads as usual and stops asking.
func TestQuickAckConn(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	client, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	server, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer server.Close()
	qc := &quickAckConn{Conn: server}
	buf := make([]byte, 16)
	for i := range 8 {
		client.Write([]byte("request"))
		if _, err := qc.Read(buf); err != nil {
			t.Fatal(err)
		}
		if got := quickAckMode(t, server.(*net.TCPConn)); got != 1 {
			t.Fatalf("TCP_QUICKACK after read %d: %d, want 1", i, got)
		}
		server.Write([]byte("answer"))
		if _, err := client.Read(buf); err != nil {
			t.Fatal(err)
		}
	}
	qc.stop()
	if !qc.done.Load() {
		t.Fatal("stop did not stop")
	}

	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	pc := &quickAckConn{Conn: a}
	go b.Write([]byte("x"))
	if n, err := pc.Read(buf); n != 1 || err != nil {
		t.Fatalf("read over a pipe: %d, %v", n, err)
	}
	if !pc.done.Load() {
		t.Fatal("a connection that is not TCP still asks for quick ACKs")
	}
}
