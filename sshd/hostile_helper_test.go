package sshd_test

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	gossh "golang.org/x/crypto/ssh"

	fwd "github.com/hiloop/hiloop/forward"
	"github.com/hiloop/hiloop/internal/eventually"
	"github.com/hiloop/hiloop/receipt"
	"github.com/hiloop/hiloop/sshd"
	"github.com/hiloop/hiloop/store"
)

// A tenant can stop the session helper in its pod and listen on its port
// itself, so the gateway may be talking to a program that shows any key
// first (which it then pins) and speaks the protocol as it likes. These
// tests run such a program: whatever it does ends that client's upstream
// at worst, never the gateway, another client, or the pin.

// Frame types and header of the mux (forward/mux.go), spelt out as a
// hostile helper would.
const (
	fOpen byte = iota + 1
	fAccept
	fReject
	fData
	fWindow
	fFin
	fReset
)

func frame(typ byte, id uint32, payload []byte) []byte {
	b := make([]byte, 9, 9+len(payload))
	b[0] = typ
	binary.BigEndian.PutUint32(b[1:], id)
	binary.BigEndian.PutUint32(b[5:], uint32(len(payload)))
	return append(b, payload...)
}

// readFrame reads one frame's type and stream id, dropping its payload.
func readFrame(c io.Reader) (byte, uint32, error) {
	var hdr [9]byte
	if _, err := io.ReadFull(c, hdr[:]); err != nil {
		return 0, 0, err
	}
	_, err := io.CopyN(io.Discard, c, int64(binary.BigEndian.Uint32(hdr[5:])))
	return hdr[0], binary.BigEndian.Uint32(hdr[1:]), err
}

// impostor serves the helper's port with the helper's TLS side but a
// behaviour of the test's: behave gets the n-th connection (from 0) after
// the ready byte, and the key it showed is keyFor(n). It accepts any
// gateway certificate; the test ends every connection.
func impostor(t *testing.T, keyFor func(n int) ed25519.PrivateKey, behave func(n int, c *tls.Conn)) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu    sync.Mutex
		conns []net.Conn
		wg    sync.WaitGroup
	)
	wg.Add(1)
	go func() {
		defer wg.Done()
		for n := 0; ; n++ {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			cert, err := fwd.Certificate(keyFor(n))
			if err != nil {
				t.Error(err)
				c.Close()
				continue
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				tc := tls.Server(c, fwd.ServerConfig(cert, func(tls.ConnectionState) error { return nil }))
				if err := tc.Handshake(); err != nil {
					return
				}
				if _, err := tc.Write([]byte{fwd.Ready}); err != nil {
					return
				}
				behave(n, tc)
			}()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return ln.Addr().(*net.TCPAddr).Port
}

func sameKey(t *testing.T) func(int) ed25519.PrivateKey {
	_, k, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return func(int) ed25519.PrivateKey { return k }
}

// echoHelper serves c as a well-behaved helper whose every stream echoes.
func echoHelper(c *tls.Conn) {
	m := fwd.NewMux(c, fwd.MuxOptions{Server: true})
	defer m.Close()
	for {
		st, err := m.Accept()
		if err != nil {
			return
		}
		st.Accept()
		go func() { io.Copy(st, st); st.CloseWrite() }()
	}
}

// openWithin opens a -L channel, failing the test if the open is not
// answered within d.
func openWithin(t *testing.T, c *gossh.Client, d time.Duration) (gossh.Channel, error) {
	t.Helper()
	type res struct {
		ch  gossh.Channel
		err error
	}
	got := make(chan res, 1)
	go func() {
		ch, err := forward(c, "127.0.0.1", 8080)
		got <- res{ch, err}
	}()
	select {
	case r := <-got:
		return r.ch, r.err
	case <-time.After(d):
		t.Fatalf("a -L channel open not answered within %v", d)
		return nil, nil
	}
}

func echoes(t *testing.T, ch gossh.Channel, what string) {
	t.Helper()
	go func() { ch.Write([]byte("ping")); ch.CloseWrite() }()
	if got, err := io.ReadAll(ch); err != nil || string(got) != "ping" {
		t.Fatalf("%s: %q, %v", what, got, err)
	}
	ch.Close()
}

// TestForwardHelperNeverAnswersOpen: a helper that reads the stream's open
// and never answers holds the -L channel open only until
// HelperDialTimeout.
func TestForwardHelperNeverAnswersOpen(t *testing.T) {
	port := impostor(t, sameKey(t), func(_ int, c *tls.Conn) { io.Copy(io.Discard, c) })
	g, _ := limited(t, setup{sessionPort: port}, func(o *sshd.Options) { o.HelperDialTimeout = time.Second })
	org := g.org("a")
	key, _ := g.key(org)
	id := g.sandbox(org, receipt.TransportSSH, receipt.TransportForward)
	c := g.login(id, key)
	defer c.Close()
	_, err := openWithin(t, c, 20*time.Second)
	var oce *gossh.OpenChannelError
	if !errors.As(err, &oce) || oce.Reason != gossh.ConnectionFailed || !strings.Contains(oce.Message, "did not answer") {
		t.Fatalf("-L through a helper that never answers: %v, want connection failed, did not answer", err)
	}
}

// TestForwardHostileHelperFrames: a helper that answers a stream's open
// with a frame that breaks the protocol (a length near 2^32, an open of
// its own toward the gateway, a window update near 2^32, a reject after
// its accept) ends its upstream: the channel fails or ends, the forward
// session ends, and the client's next channel dials again and works with
// a helper that behaves.
func TestForwardHostileHelperFrames(t *testing.T) {
	hostile := []func(c *tls.Conn, id uint32){
		func(c *tls.Conn, id uint32) { c.Write([]byte{fData, 0, 0, 0, 1, 0xff, 0xff, 0xff, 0xff}) },
		func(c *tls.Conn, id uint32) {
			req, _ := fwd.EncodeOpen("10.0.0.1", 22)
			c.Write(frame(fOpen, 1, req))
		},
		func(c *tls.Conn, id uint32) {
			c.Write(append(frame(fAccept, id, nil), frame(fWindow, id, []byte{0xff, 0xff, 0xff, 0xff})...))
		},
		func(c *tls.Conn, id uint32) {
			c.Write(append(frame(fAccept, id, nil), frame(fReject, id, []byte{1})...))
		},
	}
	port := impostor(t, sameKey(t), func(n int, c *tls.Conn) {
		if n >= len(hostile) {
			echoHelper(c)
			return
		}
		typ, id, err := readFrame(c)
		if err != nil || typ != fOpen {
			return
		}
		hostile[n](c, id)
		io.Copy(io.Discard, c)
	})
	g, _ := limited(t, setup{sessionPort: port}, func(o *sshd.Options) { o.HelperDialTimeout = 5 * time.Second })
	org := g.org("a")
	key, _ := g.key(org)
	id := g.sandbox(org, receipt.TransportSSH, receipt.TransportForward)
	c := g.login(id, key)
	defer c.Close()
	for i := range hostile {
		ch, err := openWithin(t, c, 20*time.Second)
		if err == nil {
			// Accepted before it broke the protocol: the channel ends.
			go ch.Write(make([]byte, 1<<16))
			read := make(chan struct{})
			go func() { io.Copy(io.Discard, ch); close(read) }()
			select {
			case <-read:
			case <-time.After(20 * time.Second):
				t.Errorf("hostile helper %d: the channel did not end", i)
			}
			ch.Close()
		}
		eventually.True(t, "the hostile helper's session ended", func() bool { return g.core.Sessions() == 0 })
	}
	ch, err := openWithin(t, c, 20*time.Second)
	if err != nil {
		t.Fatalf("-L once the helper behaves: %v", err)
	}
	echoes(t, ch, "-L once the helper behaves")
}

// TestForwardHelperNeverReads: a helper that accepts a stream and then
// reads nothing stalls that client's channel only: another client's -L
// through another upstream moves, and the stuck client's leaving ends its
// session and upstream.
func TestForwardHelperNeverReads(t *testing.T) {
	block := make(chan struct{})
	port := impostor(t, sameKey(t), func(n int, c *tls.Conn) {
		if n > 0 {
			echoHelper(c)
			return
		}
		typ, id, err := readFrame(c)
		if err != nil || typ != fOpen {
			return
		}
		c.Write(frame(fAccept, id, nil))
		<-block
	})
	t.Cleanup(func() { close(block) })
	g, _ := limited(t, setup{sessionPort: port}, func(o *sshd.Options) { o.HelperDialTimeout = 5 * time.Second })
	org := g.org("a")
	key, _ := g.key(org)
	id := g.sandbox(org, receipt.TransportSSH, receipt.TransportForward)

	stuck := g.login(id, key)
	ch, err := openWithin(t, stuck, 20*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	// More than the stream's window and the TCP buffers between.
	go func() {
		buf := make([]byte, 1<<20)
		for range 64 {
			if _, err := ch.Write(buf); err != nil {
				return
			}
		}
	}()

	other := g.login(id, key)
	defer other.Close()
	och, err := openWithin(t, other, 20*time.Second)
	if err != nil {
		t.Fatalf("another client while one upstream is stuck: %v", err)
	}
	echoes(t, och, "another client while one upstream is stuck")
	och2, err := openWithin(t, other, 20*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	echoes(t, och2, "another channel while one upstream is stuck")

	stuck.Close()
	eventually.True(t, "the stuck client's session ended", func() bool { return g.core.Sessions() == 1 })
	other.Close()
	eventually.True(t, "every session ended", func() bool { return g.core.Sessions() == 0 })
}

// TestForwardHelperKeyChange: within one pod's life, a helper that shows
// another key than the one the gateway pinned (a tenant's program that
// took the port over) is refused and recorded; the first key still gets
// in.
func TestForwardHelperKeyChange(t *testing.T) {
	_, k1, _ := ed25519.GenerateKey(rand.Reader)
	_, k2, _ := ed25519.GenerateKey(rand.Reader)
	var mu sync.Mutex
	current := k1
	port := impostor(t, func(int) ed25519.PrivateKey {
		mu.Lock()
		defer mu.Unlock()
		return current
	}, func(_ int, c *tls.Conn) { echoHelper(c) })
	g, _ := limited(t, setup{sessionPort: port}, func(o *sshd.Options) { o.HelperDialTimeout = 5 * time.Second })
	org := g.org("a")
	key, _ := g.key(org)
	id := g.sandbox(org, receipt.TransportSSH, receipt.TransportForward)

	c := g.login(id, key)
	ch, err := openWithin(t, c, 20*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	echoes(t, ch, "-L through the first key")
	c.Close()
	eventually.True(t, "the first session ended", func() bool { return g.core.Sessions() == 0 })

	mu.Lock()
	current = k2
	mu.Unlock()
	c = g.login(id, key)
	_, err = openWithin(t, c, 20*time.Second)
	var oce *gossh.OpenChannelError
	if !errors.As(err, &oce) || oce.Reason != gossh.ConnectionFailed {
		t.Fatalf("-L through a changed key: %v, want connection failed", err)
	}
	if !strings.Contains(g.logs.String(), "host key changed") {
		t.Error("the key change was not logged")
	}
	c.Close()
	eventually.True(t, "the refused session ended", func() bool { return g.core.Sessions() == 0 })

	mu.Lock()
	current = k1
	mu.Unlock()
	c = g.login(id, key)
	defer c.Close()
	ch, err = openWithin(t, c, 20*time.Second)
	if err != nil {
		t.Fatalf("-L through the pinned key again: %v", err)
	}
	echoes(t, ch, "-L through the pinned key again")
}

// TestForwardHelperKeyChangeStallsOnlyItsDial: recording a changed helper
// key is a write to the store, and the writer can be busy (here another
// connection holds SQLite's write lock). While that write waits, a new
// connection to another sandbox still dials its helper, has its key
// checked against the pin and carries bytes: the gateway's pins are not
// locked across the write.
func TestForwardHelperKeyChangeStallsOnlyItsDial(t *testing.T) {
	port, swap := changedKeyHelper(t)
	g, _ := limited(t, setup{sessionPort: port}, func(o *sshd.Options) { o.HelperDialTimeout = 30 * time.Second })
	org := g.org("a")
	key, _ := g.key(org)
	changed := g.sandbox(org, receipt.TransportSSH, receipt.TransportForward)
	other := g.sandbox(org, receipt.TransportSSH, receipt.TransportForward)
	pinFirstKey(t, g, changed, key)
	swap()

	// The other sandbox is in use already (a forward open on a connection
	// of its own): a use that begins while one is open writes nothing, so
	// the other connection's dial needs no write of its own.
	inUse := g.login(other, key)
	defer inUse.Close()
	ch, err := openWithin(t, inUse, 20*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	echoes(t, ch, "-L of the other sandbox")
	changedC, otherC := g.login(changed, key), g.login(other, key)
	defer changedC.Close()
	defer otherC.Close()

	// Another connection takes the write lock and keeps it until the
	// other sandbox's bytes went through.
	release := holdWriter(t, g, other)
	refused := make(chan error, 1)
	go func() {
		_, err := openWithin(t, changedC, 40*time.Second)
		refused <- err
	}()
	eventually.True(t, "the changed key's check waiting on the store", func() bool {
		return strings.Count(g.logs.String(), "host key against the record") == 3
	})

	och, err := openWithin(t, otherC, 20*time.Second)
	if err != nil {
		t.Fatalf("-L of another sandbox while the changed key is recorded: %v", err)
	}
	echoes(t, och, "-L of another sandbox while the changed key is recorded")
	select {
	case err := <-refused:
		t.Fatalf("the changed key's dial ended (%v) before the write it waits on could be made", err)
	default:
	}
	release()
	wantRefused(t, <-refused)
	changeRecorded(t, g, changed)
}

// TestForwardHelperStopsReading: a helper that answers a client's opens
// and then reads nothing more, so that what the gateway writes fills the
// connection's buffers, has its upstream ended within HelperDialTimeout of
// a write it did not take in: every channel of it ends and its session
// with them, while the client stays connected and its next channel dials
// again.
func TestForwardHelperStopsReading(t *testing.T) {
	const channels = 16
	block := make(chan struct{})
	port := impostor(t, sameKey(t), func(n int, c *tls.Conn) {
		if n > 0 {
			echoHelper(c)
			return
		}
		// A small receive buffer, so the gateway's writes fill it and
		// the socket's soon, whatever the host's autotuning allows.
		c.NetConn().(*net.TCPConn).SetReadBuffer(4 << 10)
		for opened := 0; opened < channels; {
			typ, id, err := readFrame(c)
			if err != nil {
				return
			}
			if typ == fOpen {
				c.Write(frame(fAccept, id, nil))
				opened++
			}
		}
		<-block
	})
	t.Cleanup(func() { close(block) })
	g, _ := limited(t, setup{sessionPort: port}, func(o *sshd.Options) {
		o.HelperDialTimeout = time.Second
		o.MaxChannelsPerConn = channels + 1
	})
	org := g.org("a")
	key, _ := g.key(org)
	id := g.sandbox(org, receipt.TransportSSH, receipt.TransportForward)
	c := g.login(id, key)
	defer c.Close()
	ended := make(chan struct{}, channels)
	var chs []gossh.Channel
	for range channels {
		ch, err := openWithin(t, c, 20*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		chs = append(chs, ch)
	}
	for _, ch := range chs {
		// Each stream's window, a MiB, and more: 16 MiB in all, past
		// what the sockets between hold.
		go func() {
			buf := make([]byte, 1<<20)
			for range 2 {
				if _, err := ch.Write(buf); err != nil {
					break
				}
			}
		}()
		go func() { io.Copy(io.Discard, ch); ch.Close(); ended <- struct{}{} }()
	}
	for i := range channels {
		select {
		case <-ended:
		case <-time.After(30 * time.Second):
			t.Fatalf("%d of %d channels to a helper that stopped reading still open", channels-i, channels)
		}
	}
	eventually.True(t, "the stuck upstream's session ended", func() bool { return g.core.Sessions() == 0 })
	ch, err := openWithin(t, c, 20*time.Second)
	if err != nil {
		t.Fatalf("-L after the stuck upstream ended: %v", err)
	}
	echoes(t, ch, "-L after the stuck upstream ended")
}

// TestForwardEndEndsUpstream: a key deleted, the sandbox stopped, or the
// core closed for shutdown ends the client connection's one upstream to
// the helper (the helper sees its connection close), not only the client's
// channels.
func TestForwardEndEndsUpstream(t *testing.T) {
	for _, tc := range []struct {
		name string
		end  func(t *testing.T, g *gateway, org store.Org, keyID, id string)
	}{
		{"key deleted", func(t *testing.T, g *gateway, org store.Org, keyID, _ string) {
			if err := g.core.DeleteSSHKey(context.Background(), g.admin(org), keyID); err != nil {
				t.Fatal(err)
			}
		}},
		{"sandbox stopped", func(t *testing.T, g *gateway, org store.Org, _, id string) {
			if _, err := g.core.SetMode(context.Background(), g.admin(org), id, store.ModeStopped); err != nil {
				t.Fatal(err)
			}
		}},
		{"shutdown", func(t *testing.T, g *gateway, _ store.Org, _, _ string) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if err := g.core.Close(ctx); err != nil {
				t.Fatal(err)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			upstreams := make(chan struct{}, 4)
			port := impostor(t, sameKey(t), func(_ int, c *tls.Conn) {
				echoHelper(c)
				upstreams <- struct{}{}
			})
			g := start(t, setup{sessionPort: port})
			org := g.org("a")
			key, sshKey := g.key(org)
			id := g.sandbox(org, receipt.TransportSSH, receipt.TransportForward)
			c := g.login(id, key)
			defer c.Close()
			ch, err := openWithin(t, c, 20*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			echoes(t, ch, "-L before the end")
			held, err := openWithin(t, c, 20*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			defer held.Close()
			tc.end(t, g, org, sshKey.ID, id)
			select {
			case <-upstreams:
			case <-time.After(20 * time.Second):
				t.Fatal("the upstream to the helper outlived the end")
			}
			eventually.True(t, "the forward session ended", func() bool { return g.core.Sessions() == 0 })
		})
	}
}

// TestForwardConcurrentChannelsOneUpstream: channels a client opens all at
// once, before any upstream exists, share one connection to the helper.
func TestForwardConcurrentChannelsOneUpstream(t *testing.T) {
	var mu sync.Mutex
	dialled := 0
	port := impostor(t, sameKey(t), func(_ int, c *tls.Conn) {
		mu.Lock()
		dialled++
		mu.Unlock()
		echoHelper(c)
	})
	g := start(t, setup{sessionPort: port})
	org := g.org("a")
	key, _ := g.key(org)
	id := g.sandbox(org, receipt.TransportSSH, receipt.TransportForward)
	c := g.login(id, key)
	defer c.Close()
	const n = 8
	errs := make(chan error, n)
	for range n {
		go func() {
			ch, err := forward(c, "127.0.0.1", 8080)
			if err == nil {
				defer ch.Close()
				go func() { ch.Write([]byte("ping")); ch.CloseWrite() }()
				if got, rerr := io.ReadAll(ch); rerr != nil || string(got) != "ping" {
					err = fmt.Errorf("a concurrent channel: %q, %v", got, rerr)
				}
			}
			errs <- err
		}()
	}
	for range n {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if dialled != 1 {
		t.Errorf("%d connections to the helper for one client connection, want 1", dialled)
	}
}
