package forward_test

import (
	"crypto/ed25519"
	"crypto/rand"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hiloop/hiloop/forward"
)

// A Conn keeps the TLS records of a Write and writes them to the
// connection under it at the Write's end. These tests hold it to what
// crypto/tls promises for its own writes, against a peer that stops
// reading (a program of the tenant's in the helper's place).

// smallPair is a TCP pair with small socket buffers, so a peer that stops
// reading stalls its writer within a few records.
func smallPair(t *testing.T) (client, server net.Conn) {
	t.Helper()
	client, server = tcpPair(t)
	for _, c := range []net.Conn{client, server} {
		tc := c.(*net.TCPConn)
		if err := tc.SetWriteBuffer(4 << 10); err != nil {
			t.Fatal(err)
		}
		if err := tc.SetReadBuffer(4 << 10); err != nil {
			t.Fatal(err)
		}
	}
	return client, server
}

// fillUntilTimeout writes 64 KiB at a time to c, whose peer does not read,
// until a Write fails on the write deadline.
func fillUntilTimeout(t *testing.T, c *forward.Conn) {
	t.Helper()
	c.SetWriteDeadline(time.Now().Add(200 * time.Millisecond))
	p := make([]byte, 64<<10)
	for range 1 << 12 {
		if _, err := c.Write(p); err != nil {
			if !errors.Is(err, os.ErrDeadlineExceeded) {
				t.Fatalf("a write to a peer that does not read: %v, want the deadline", err)
			}
			return
		}
	}
	t.Fatal("256 MiB written to a peer that does not read")
}

// TestConnWriteFailsAfterFailedWrite: once a Write failed (here on its
// deadline, part of its records out), every later Write fails too, as
// crypto/tls has it: the records lost or cut short leave a stream the
// other end cannot decrypt, so a later Write that reported success would
// report bytes that never reach it.
func TestConnWriteFailsAfterFailedWrite(t *testing.T) {
	c, s := smallPair(t)
	client, server := tlsPair(t, c, s)
	defer server.Close()
	defer client.Close()
	fillUntilTimeout(t, client)
	read := make(chan error, 1)
	go func() {
		_, err := io.Copy(io.Discard, server)
		read <- err
	}()
	client.SetWriteDeadline(time.Now().Add(10 * time.Second))
	if _, err := client.Write([]byte("after")); err == nil {
		client.Close()
		t.Errorf("a write after a failed one succeeded; the other end read: %v", <-read)
	}
}

// TestConnWriteFailsAfterDeadlinePassed: the same with nothing of the
// failed Write out: its deadline had passed before it began.
func TestConnWriteFailsAfterDeadlinePassed(t *testing.T) {
	client, server := tlsPair(t, nil, nil)
	defer server.Close()
	defer client.Close()
	client.SetWriteDeadline(time.Now().Add(-time.Second))
	if _, err := client.Write([]byte("lost")); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("a write past its deadline: %v", err)
	}
	client.SetWriteDeadline(time.Time{})
	if _, err := client.Write([]byte("after")); err == nil {
		t.Error("a write after a failed one succeeded")
	}
}

// TestConnConcurrentWritesFail: Writes from several goroutines to a
// connection whose every write fails each fail; none returns before its
// records were written, so none reports success for records a later
// Write then failed to send.
func TestConnConcurrentWritesFail(t *testing.T) {
	c, s := tcpPair(t)
	client, server := tlsPair(t, c, s)
	defer server.Close()
	defer client.Close()
	if err := c.(*net.TCPConn).CloseWrite(); err != nil {
		t.Fatal(err)
	}
	var ok atomic.Int64
	var wg sync.WaitGroup
	p := make([]byte, 8<<10)
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 500 {
				if _, err := client.Write(p); err == nil {
					ok.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	if n := ok.Load(); n > 0 {
		t.Errorf("%d of 2000 writes to a connection that takes none succeeded", n)
	}
}

// TestConnWriteHandshakes: a Write before the handshake runs it, as
// crypto/tls's does, its messages sent as they come rather than kept for
// the Write's end, which the handshake would wait for.
func TestConnWriteHandshakes(t *testing.T) {
	c, s := tcpPair(t)
	deadline := time.Now().Add(10 * time.Second)
	c.SetDeadline(deadline)
	s.SetDeadline(deadline)
	_, hostPriv, _ := ed25519.GenerateKey(rand.Reader)
	_, userPriv, _ := ed25519.GenerateKey(rand.Reader)
	hostCert, _ := forward.Certificate(hostPriv)
	userCert, _ := forward.Certificate(userPriv)
	server := forward.Server(s, &tls.Config{MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{hostCert},
		ClientAuth: tls.RequireAnyClientCert, NextProtos: []string{forward.Protocol}})
	client := forward.Client(c, &tls.Config{MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{userCert},
		InsecureSkipVerify: true, ServerName: "sbx", NextProtos: []string{forward.Protocol}})
	defer server.Close()
	defer client.Close()
	got := make(chan []byte, 1)
	go func() {
		b := make([]byte, 5)
		n, _ := io.ReadFull(server, b)
		got <- b[:n]
	}()
	if _, err := client.Write([]byte("hello")); err != nil {
		t.Fatalf("a write before the handshake: %v", err)
	}
	if b := <-got; string(b) != "hello" {
		t.Errorf("the other end read %q", b)
	}
}

// TestMuxWriteTimeoutOverConn: the gateway's mux on a Conn, as it runs
// (TCP, TLS, the records of each frame kept to its end): a helper that
// accepts a stream and then stops reading ends the mux within
// WriteTimeout, and the stream's write with it, rather than holding them.
func TestMuxWriteTimeoutOverConn(t *testing.T) {
	c, s := smallPair(t)
	gw, helper := tlsPair(t, c, s)
	defer helper.Close()
	m := forward.NewMux(gw, forward.MuxOptions{WriteTimeout: 200 * time.Millisecond})
	defer m.Close()
	// The helper reads the open and accepts it, and then reads nothing.
	go func() {
		hdr := make([]byte, 9)
		if _, err := io.ReadFull(helper, hdr); err != nil {
			return
		}
		if _, err := io.ReadFull(helper, make([]byte, binary.BigEndian.Uint32(hdr[5:]))); err != nil {
			return
		}
		accept := make([]byte, 9)
		accept[0] = 2 // accept
		copy(accept[1:5], hdr[1:5])
		helper.Write(accept)
	}()
	req, _ := forward.EncodeOpen("localhost", 80)
	st, err := m.Open(nil, req)
	if err != nil {
		t.Fatal(err)
	}
	wrote := make(chan error, 1)
	go func() {
		_, err := st.Write(make([]byte, forward.Window))
		wrote <- err
	}()
	select {
	case <-m.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the mux outlived a helper that stopped reading")
	}
	if err := within(t, wrote, "a stream's write outlived its mux"); !errors.Is(err, forward.ErrMuxClosed) {
		t.Errorf("a stream's write to a helper that stopped reading: %v", err)
	}
}

// within is what errc gives within 10 s; the test fails with what when
// nothing comes.
func within(t *testing.T, errc <-chan error, what string) error {
	t.Helper()
	select {
	case err := <-errc:
		return err
	case <-time.After(10 * time.Second):
		t.Fatal(what)
		return nil
	}
}

// writeStarts tells when a write of at least min bytes reaches the
// connection under it.
type writeStarts struct {
	net.Conn
	min     int
	started chan struct{}
	once    sync.Once
}

func (w *writeStarts) Write(p []byte) (int, error) {
	if len(p) >= w.min {
		w.once.Do(func() { close(w.started) })
	}
	return w.Conn.Write(p)
}

// TestConnCloseEndsStuckWrite: Close of a Conn whose Write waits on a peer
// that stopped reading closes the connection under it at once, ending that
// Write with net.ErrClosed, as crypto/tls does for a Write of its own in
// flight, rather than queue a close_notify behind the Write and wait out
// crypto/tls's 5 s bound on it.
func TestConnCloseEndsStuckWrite(t *testing.T) {
	c, s := smallPair(t)
	w := &writeStarts{Conn: c, min: 64 << 10, started: make(chan struct{})}
	client, server := tlsPair(t, w, s)
	defer server.Close()
	wrote := make(chan error, 1)
	go func() {
		_, err := client.Write(make([]byte, 64<<10))
		wrote <- err
	}()
	select {
	case <-w.started:
	case err := <-wrote:
		t.Fatalf("a write of 64 KiB to a peer that does not read and 8 KiB buffers ended: %v", err)
	}
	closed := make(chan struct{})
	go func() { client.Close(); close(closed) }()
	if err := within(t, wrote, "a write stuck on a peer that does not read outlived Close"); !errors.Is(err, net.ErrClosed) {
		t.Errorf("a write stuck on a peer that does not read, after Close: %v, want net.ErrClosed", err)
	}
	<-closed
}

// largestWrite records the longest write that reaches a connection.
type largestWrite struct {
	net.Conn
	max atomic.Int64
}

func (l *largestWrite) Write(p []byte) (int, error) {
	if n := int64(len(p)); n > l.max.Load() {
		l.max.Store(n)
	}
	return l.Conn.Write(p)
}

// TestConnGathersBounded: however long a Write, what a Conn keeps before
// it writes stays within 96 KiB and one TLS record, and the other end
// reads every byte in order.
func TestConnGathersBounded(t *testing.T) {
	c, s := tcpPair(t)
	l := &largestWrite{Conn: c}
	client, server := tlsPair(t, l, s)
	got := make(chan []byte, 1)
	go func() {
		b, _ := io.ReadAll(server)
		got <- b
	}()
	var want []byte
	for _, n := range []int{4 << 20, 96<<10 - 1, 96 << 10, 96<<10 + 1, 1, 1 << 20} {
		p := make([]byte, n)
		rand.Read(p)
		want = append(want, p...)
		if _, err := client.Write(p); err != nil {
			t.Fatal(err)
		}
	}
	client.Close()
	if b := <-got; string(b) != string(want) {
		t.Fatalf("read %d bytes, not the %d written", len(b), len(want))
	}
	// A TLS 1.3 record: 16 KiB of data, its type byte, a 16-byte tag and a
	// 5-byte header.
	if m := l.max.Load(); m > 96<<10+16<<10+1+16+5 {
		t.Errorf("a write of %d bytes reached the connection", m)
	}
}
