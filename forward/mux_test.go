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
