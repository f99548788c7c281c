package forward

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/hiloop/hiloop/internal/eventually"
)

// The gateway's mux facing a helper that does not follow the protocol: the
// tenant can replace the helper in its pod with a program of its own, so
// whatever frames it sends must end in a refusal of that connection alone,
// never in a panic, unbounded memory or goroutines in the gateway.

// rawFrame is one frame as it goes on the wire.
func rawFrame(typ byte, id uint32, payload []byte) []byte {
	b := make([]byte, headerSize, headerSize+len(payload))
	b[0] = typ
	binary.BigEndian.PutUint32(b[1:], id)
	binary.BigEndian.PutUint32(b[5:], uint32(len(payload)))
	return append(b, payload...)
}

// readRaw reads one frame from the helper's end.
func readRaw(t *testing.T, c net.Conn) (typ byte, id uint32, payload []byte) {
	t.Helper()
	hdr := make([]byte, headerSize)
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.ReadFull(c, hdr); err != nil {
		t.Fatalf("read a frame: %v", err)
	}
	payload = make([]byte, binary.BigEndian.Uint32(hdr[5:]))
	if _, err := io.ReadFull(c, payload); err != nil {
		t.Fatalf("read a frame's payload: %v", err)
	}
	return hdr[0], binary.BigEndian.Uint32(hdr[1:]), payload
}

func writeRaw(t *testing.T, c net.Conn, frames ...[]byte) {
	t.Helper()
	c.SetWriteDeadline(time.Now().Add(10 * time.Second))
	for _, f := range frames {
		if _, err := c.Write(f); err != nil {
			t.Fatalf("write a frame: %v", err)
		}
	}
}

// hostile is a gateway-side mux whose other end the test speaks raw
// frames on, as a tenant's own program on the helper port would.
func hostile(t *testing.T) (*Mux, net.Conn) {
	t.Helper()
	t.Cleanup(func() { goleak.VerifyNone(t, goleak.IgnoreCurrent()) })
	g, h := net.Pipe()
	m := NewMux(g, MuxOptions{MaxStreams: 4})
	t.Cleanup(func() {
		h.Close()
		m.Close()
	})
	return m, h
}

// openRaw opens a stream from the gateway's side and answers it accept
// from the raw side, returning the stream and its id.
func openRaw(t *testing.T, m *Mux, h net.Conn) (*Stream, uint32) {
	t.Helper()
	type opened struct {
		st  *Stream
		err error
	}
	got := make(chan opened, 1)
	go func() {
		req, _ := EncodeOpen("localhost", 80)
		st, err := m.Open(nil, req)
		got <- opened{st, err}
	}()
	typ, id, _ := readRaw(t, h)
	if typ != frameOpen {
		t.Fatalf("frame type %d, want open", typ)
	}
	writeRaw(t, h, rawFrame(frameAccept, id, nil))
	o := <-got
	if o.err != nil {
		t.Fatal(o.err)
	}
	return o.st, id
}

// ended waits for m to end and returns why.
func ended(t *testing.T, m *Mux, what string) error {
	t.Helper()
	select {
	case <-m.Done():
		return m.Err()
	case <-time.After(10 * time.Second):
		t.Fatalf("%s: the gateway's mux still runs", what)
		return nil
	}
}

// drain reads and drops whatever the gateway sends, so its writes never
// block the test.
func drain(h net.Conn) {
	go io.Copy(io.Discard, h)
}

// TestMuxHostileProtocolBreaks: each frame a helper may not send ends its
// connection (and only it) with an error, without a panic or an
// allocation of the length it claims: a length near 2^32, a window update
// near 2^32 or past the window, an open sent to the opening side, data
// past the window, data after fin, an empty reject, a second answer to
// one open.
func TestMuxHostileProtocolBreaks(t *testing.T) {
	for _, tc := range []struct {
		name  string
		send  func(t *testing.T, m *Mux, h net.Conn)
		cause string
	}{
		{"a frame length near 2^32", func(t *testing.T, m *Mux, h net.Conn) {
			writeRaw(t, h, []byte{frameData, 0, 0, 0, 1, 0xff, 0xff, 0xff, 0xff})
		}, "frame of 4294967295 bytes"},
		{"a frame one byte past the largest", func(t *testing.T, m *Mux, h net.Conn) {
			writeRaw(t, h, []byte{frameWindow, 0, 0, 0, 9, 0, 1, 0, 1})
		}, "frame of 65537 bytes"},
		{"a window update near 2^32", func(t *testing.T, m *Mux, h net.Conn) {
			_, id := openRaw(t, m, h)
			writeRaw(t, h, rawFrame(frameWindow, id, []byte{0xff, 0xff, 0xff, 0xff}))
		}, "window update past the window"},
		{"a window update of one byte before any data", func(t *testing.T, m *Mux, h net.Conn) {
			_, id := openRaw(t, m, h)
			writeRaw(t, h, rawFrame(frameWindow, id, []byte{0, 0, 0, 1}))
		}, "window update past the window"},
		{"a malformed window update", func(t *testing.T, m *Mux, h net.Conn) {
			_, id := openRaw(t, m, h)
			writeRaw(t, h, rawFrame(frameWindow, id, []byte{0, 0, 1}))
		}, "malformed window update"},
		{"an open sent to the gateway", func(t *testing.T, m *Mux, h net.Conn) {
			req, _ := EncodeOpen("10.0.0.1", 22)
			writeRaw(t, h, rawFrame(frameOpen, 1, req))
		}, "open sent to the opening side"},
		{"data past the window", func(t *testing.T, m *Mux, h net.Conn) {
			_, id := openRaw(t, m, h)
			chunk := make([]byte, maxFrame)
			for range Window / maxFrame {
				writeRaw(t, h, rawFrame(frameData, id, chunk))
			}
			writeRaw(t, h, rawFrame(frameData, id, []byte{1}))
		}, "window exceeded"},
		{"data after fin", func(t *testing.T, m *Mux, h net.Conn) {
			_, id := openRaw(t, m, h)
			writeRaw(t, h, rawFrame(frameFin, id, nil), rawFrame(frameData, id, []byte("x")))
		}, "data after fin"},
		{"an empty reject", func(t *testing.T, m *Mux, h net.Conn) {
			go func() {
				req, _ := EncodeOpen("localhost", 80)
				m.Open(nil, req)
			}()
			_, id, _ := readRaw(t, h)
			writeRaw(t, h, rawFrame(frameReject, id, nil))
		}, "empty reject"},
		{"a reject after the accept", func(t *testing.T, m *Mux, h net.Conn) {
			_, id := openRaw(t, m, h)
			writeRaw(t, h, rawFrame(frameReject, id, []byte{ConnectionFailed}))
		}, "answered twice"},
		{"a second accept", func(t *testing.T, m *Mux, h net.Conn) {
			_, id := openRaw(t, m, h)
			writeRaw(t, h, rawFrame(frameAccept, id, nil))
		}, "answered twice"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, h := hostile(t)
			tc.send(t, m, h)
			drain(h)
			err := ended(t, m, tc.name)
			if !errors.Is(err, ErrMuxClosed) || !strings.Contains(err.Error(), tc.cause) {
				t.Errorf("the mux ended with %v, want %q", err, tc.cause)
			}
		})
	}
}

// TestMuxHostileStrayFrames: frames for streams the gateway never opened
// or already closed, and frames of unknown types for them, are read and
// dropped: the connection goes on, no stream appears, and a stream opened
// afterwards works.
func TestMuxHostileStrayFrames(t *testing.T) {
	m, h := hostile(t)
	closed, closedID := openRaw(t, m, h)
	go closed.Close()
	if typ, id, _ := readRaw(t, h); typ != frameReset || id != closedID {
		t.Fatalf("frame %d for %d, want reset for %d", typ, id, closedID)
	}
	for _, id := range []uint32{closedID, 0, 7, 1 << 31, 0xffffffff} {
		writeRaw(t, h,
			rawFrame(frameData, id, make([]byte, maxFrame)),
			rawFrame(frameWindow, id, []byte{0xff, 0xff, 0xff, 0xff}),
			rawFrame(frameAccept, id, nil),
			rawFrame(frameReject, id, nil),
			rawFrame(frameFin, id, nil),
			rawFrame(frameData, id, []byte("after fin")),
			rawFrame(frameReset, id, nil),
			rawFrame(0, id, nil), rawFrame(200, id, []byte("?")))
	}
	if n := m.Streams(); n != 0 {
		t.Errorf("%d streams after stray frames", n)
	}
	st, id := openRaw(t, m, h)
	writeRaw(t, h, rawFrame(frameData, id, []byte("still here")), rawFrame(frameFin, id, nil))
	got, err := io.ReadAll(st)
	if err != nil || string(got) != "still here" {
		t.Fatalf("a stream after stray frames read %q, %v", got, err)
	}
	if err := m.Err(); err != nil {
		t.Fatalf("the mux ended: %v", err)
	}
}

// TestMuxHostileSmallFrames: data in frames of sizes chosen to waste the
// receive buffers (one byte, then a whole frame, over and over) holds at
// most about twice the window, and a stream the gateway never reads holds
// no more.
func TestMuxHostileSmallFrames(t *testing.T) {
	m, h := hostile(t)
	st, id := openRaw(t, m, h)
	sent := 0
	full := make([]byte, maxFrame)
	for sent+1+maxFrame <= Window {
		writeRaw(t, h, rawFrame(frameData, id, []byte{1}), rawFrame(frameData, id, full))
		sent += 1 + maxFrame
	}
	for sent < Window {
		writeRaw(t, h, rawFrame(frameData, id, []byte{1}))
		sent++
	}
	var held, queued int
	eventually.True(t, fmt.Sprintf("%d bytes queued", Window), func() bool {
		st.mu.Lock()
		defer st.mu.Unlock()
		held = 0
		for _, b := range st.rq {
			held += cap(b)
		}
		queued = st.rqLen
		return queued == Window
	})
	if held > 2*Window+2*maxFrame {
		t.Errorf("%d bytes of buffers hold a window of %d", held, Window)
	}
}

// TestMuxHostileNeverReads: a helper that never reads blocks the gateway's
// writes on its own connection only: another connection's streams still
// move, and closing the stuck one ends its blocked writes at once.
func TestMuxHostileNeverReads(t *testing.T) {
	stuck, h := hostile(t)
	st, _ := openRaw(t, stuck, h)
	wrote := make(chan error, 1)
	go func() {
		_, err := st.Write(make([]byte, 4*maxFrame))
		wrote <- err
	}()

	c, s := net.Pipe()
	other := NewMux(c, MuxOptions{})
	peer := NewMux(s, MuxOptions{Server: true})
	defer other.Close()
	defer peer.Close()
	go func() {
		for {
			ps, err := peer.Accept()
			if err != nil {
				return
			}
			ps.Accept()
			go func() { io.Copy(ps, ps); ps.CloseWrite() }()
		}
	}()
	req, _ := EncodeOpen("localhost", 1)
	os, err := other.Open(nil, req)
	if err != nil {
		t.Fatal(err)
	}
	go func() { os.Write([]byte("moves")); os.CloseWrite() }()
	if got, err := io.ReadAll(os); err != nil || string(got) != "moves" {
		t.Fatalf("another connection while one is stuck: %q, %v", got, err)
	}

	select {
	case err := <-wrote:
		t.Fatalf("a write to a helper that never reads returned %v", err)
	default:
	}
	closed := make(chan struct{})
	go func() { stuck.Close(); close(closed) }()
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		t.Fatal("closing a mux whose helper never reads did not return")
	}
	select {
	case err := <-wrote:
		if err == nil {
			t.Error("a blocked write succeeded after the close")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a blocked write outlived its mux's close")
	}
	if _, err := st.Read(make([]byte, 1)); !errors.Is(err, ErrMuxClosed) {
		t.Errorf("a read after the close: %v", err)
	}
}

// TestMuxWriteTimeout: with WriteTimeout, a frame the other side does not
// take in within it ends the mux, and with it the writes and opens waiting
// behind that frame.
func TestMuxWriteTimeout(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t, goleak.IgnoreCurrent()) })
	g, h := net.Pipe()
	defer h.Close()
	m := NewMux(g, MuxOptions{WriteTimeout: 200 * time.Millisecond})
	defer m.Close()
	req, _ := EncodeOpen("localhost", 80)
	opened := make(chan error, 2)
	for range 2 {
		go func() {
			_, err := m.Open(nil, req)
			opened <- err
		}()
	}
	for range 2 {
		select {
		case err := <-opened:
			if !errors.Is(err, ErrMuxClosed) {
				t.Errorf("an open to a side that never reads: %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("an open to a side that never reads did not end")
		}
	}
	ended(t, m, "a side that never reads")
}
