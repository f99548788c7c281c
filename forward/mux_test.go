package forward_test

import (
	"bytes"
	"io"
	"net"
	"testing"

	"github.com/hiloop/hiloop/forward"
)

// muxPair is a mux on each end of a pipe, the server's streams accepted
// and handed to serve.
func muxPair(t *testing.T, o forward.MuxOptions, serve func(*forward.Stream)) *forward.Mux {
	t.Helper()
	c, s := net.Pipe()
	o.Server = true
	sm := forward.NewMux(s, o)
	o.Server = false
	cm := forward.NewMux(c, o)
	t.Cleanup(func() { cm.Close(); sm.Close() })
	go func() {
		for {
			st, err := sm.Accept()
			if err != nil {
				return
			}
			go serve(st)
		}
	}()
	return cm
}

func TestMuxBasic(t *testing.T) {
	cm := muxPair(t, forward.MuxOptions{}, func(st *forward.Stream) {
		st.Accept()
		b, _ := io.ReadAll(st)
		st.Write(b)
		st.CloseWrite()
	})
	req, _ := forward.EncodeOpen("localhost", 1)
	st, err := cm.Open(nil, req)
	if err != nil {
		t.Fatal(err)
	}
	msg := bytes.Repeat([]byte("x"), 3<<20)
	go func() { st.Write(msg); st.CloseWrite() }()
	got, err := io.ReadAll(st)
	if err != nil || !bytes.Equal(got, msg) {
		t.Fatalf("%d bytes back, %v", len(got), err)
	}
}

// TestMuxSlowStream: a stream whose reader never reads stalls only
// itself once its window is full; another stream on the same connection
// still moves data both ways.
func TestMuxSlowStream(t *testing.T) {
	stalled := make(chan struct{})
	t.Cleanup(func() { close(stalled) })
	cm := muxPair(t, forward.MuxOptions{}, func(st *forward.Stream) {
		st.Accept()
		host, _, _ := forward.DecodeOpen(st.Request())
		if host == "slow" {
			<-stalled
			return
		}
		io.Copy(st, st)
		st.CloseWrite()
	})
	open := func(host string) *forward.Stream {
		req, _ := forward.EncodeOpen(host, 1)
		st, err := cm.Open(nil, req)
		if err != nil {
			t.Fatal(err)
		}
		return st
	}
	slow := open("slow")
	wrote := make(chan int)
	go func() {
		n, _ := slow.Write(make([]byte, 3*forward.Window))
		wrote <- n
	}()
	fast := open("fast")
	msg := bytes.Repeat([]byte("y"), 2*forward.Window)
	go func() { fast.Write(msg); fast.CloseWrite() }()
	got, err := io.ReadAll(fast)
	if err != nil || !bytes.Equal(got, msg) {
		t.Fatalf("the other stream: %d bytes back, %v", len(got), err)
	}
	select {
	case n := <-wrote:
		t.Fatalf("wrote %d bytes to a stream nobody reads, past its window", n)
	default:
	}
	slow.Close()
	if n := <-wrote; n > forward.Window {
		t.Errorf("wrote %d bytes to a stream nobody reads, past its window of %d", n, forward.Window)
	}
}

// TestMuxReset: closing a stream ends the other side's reads and blocked
// writes at once, while a half-close lets the other side go on sending.
func TestMuxReset(t *testing.T) {
	ended := make(chan error, 1)
	cm := muxPair(t, forward.MuxOptions{}, func(st *forward.Stream) {
		st.Accept()
		buf := make([]byte, 64<<10)
		for {
			if _, err := st.Write(buf); err != nil {
				ended <- err
				return
			}
		}
	})
	req, _ := forward.EncodeOpen("localhost", 1)
	st, err := cm.Open(nil, req)
	if err != nil {
		t.Fatal(err)
	}
	st.CloseWrite()
	if _, err := io.ReadFull(st, make([]byte, 3*forward.Window)); err != nil {
		t.Fatalf("reading after a half-close: %v", err)
	}
	st.Close()
	if err := <-ended; err == nil {
		t.Fatal("the writer did not end")
	}
	if n := cm.Streams(); n != 0 {
		t.Errorf("%d streams left", n)
	}
}

// TestMuxConcurrentOpens: streams opened at once from many goroutines all
// open, and the connection stays up: their ids reach the other side in
// the order they were given, where a later id's open frame overtaking an
// earlier one's ended the connection as "stream id reused".
func TestMuxConcurrentOpens(t *testing.T) {
	cm := muxPair(t, forward.MuxOptions{}, func(st *forward.Stream) {
		st.Accept()
		st.Close()
	})
	req, _ := forward.EncodeOpen("localhost", 1)
	errs := make(chan error, 200)
	for range 200 {
		go func() {
			st, err := cm.Open(nil, req)
			if err == nil {
				st.Close()
			}
			errs <- err
		}()
	}
	for range 200 {
		if err := <-errs; err != nil {
			t.Fatalf("open: %v (the mux: %v)", err, cm.Err())
		}
	}
}
