// Package agent is the session helper, `hiloop agent`: a small server that
// runs as a hardened helper container in a sandbox pod, sharing the pod's
// network namespace, so the gateway can reach the sandbox's loopback under
// gVisor, where the runtime's port-forward cannot. The gateway connects
// over TLS 1.3 with a client certificate and multiplexes its client
// connection's -L channels as streams on that one connection (package
// forward). The helper accepts only a connection that names its own
// sandbox and shows the key the gateway derived for that sandbox (read
// from a file the kubelet projects from a pod annotation, re-read at every
// connection, so a rotation needs no restart), and dials only loopback. A
// gateway dial that lands on another sandbox's helper is refused either
// way.
package agent

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	gossh "golang.org/x/crypto/ssh"

	"github.com/hiloop/hiloop/forward"
)

// Options configure New.
type Options struct {
	// SandboxID is the sandbox whose pod the helper runs in, the only
	// server name it accepts.
	SandboxID string
	// AuthorizedKeysFile holds the gateway's public key(s) for this
	// sandbox, authorized_keys form.
	AuthorizedKeysFile string
	Log                *slog.Logger
	// DialTimeout bounds a dial to a loopback port; 5s when zero.
	DialTimeout time.Duration
	// HandshakeTimeout bounds a connection's TLS handshake; 30s when zero.
	HandshakeTimeout time.Duration
	// MaxStreams bounds the streams open at once on one connection;
	// forward.MaxStreams when zero.
	MaxStreams int
	// MaxHandshakes bounds the connections still in their handshake at
	// once; one past it is closed at once. Anything that reaches the port
	// can open connections, and the helper's memory limit is small: past
	// it the helper would be killed and come back with a new key, which
	// the gateway's pin refuses for the rest of the pod's life.
	// DefaultMaxHandshakes when zero.
	MaxHandshakes int
}

// DefaultMaxHandshakes is Options.MaxHandshakes when zero: the gateway
// dials once per client connection, and a handshake takes a round trip or
// two.
const DefaultMaxHandshakes = 64

// Agent is the helper's server.
type Agent struct {
	o   Options
	log *slog.Logger
	tls *tls.Config
	// handshakes holds a place for each connection in its handshake.
	handshakes chan struct{}
	// conns counts gateway connections accepted since start: the gateway
	// holds one per client connection, whatever its number of channels.
	conns atomic.Int64
	wg    sync.WaitGroup
}

// New builds the agent with a fresh key for its certificate; the gateway
// pins it per pod.
func New(o Options) (*Agent, error) {
	if o.AuthorizedKeysFile == "" || o.SandboxID == "" {
		return nil, errors.New("agent: a sandbox id and an authorized keys file are required")
	}
	if o.Log == nil {
		o.Log = slog.Default()
	}
	if o.DialTimeout == 0 {
		o.DialTimeout = 5 * time.Second
	}
	if o.HandshakeTimeout == 0 {
		o.HandshakeTimeout = 30 * time.Second
	}
	if o.MaxHandshakes == 0 {
		o.MaxHandshakes = DefaultMaxHandshakes
	}
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, err
	}
	cert, err := forward.Certificate(priv)
	if err != nil {
		return nil, err
	}
	a := &Agent{o: o, log: o.Log.With("component", "agent"), handshakes: make(chan struct{}, o.MaxHandshakes)}
	a.tls = forward.ServerConfig(cert, a.authorize)
	return a, nil
}

// authorize accepts a connection that names the helper's own sandbox and
// shows exactly a key the file lists now.
func (a *Agent) authorize(cs tls.ConnectionState) error {
	if cs.ServerName != a.o.SandboxID {
		return errors.New("not this sandbox")
	}
	key, err := forward.PeerKey(cs)
	if err != nil {
		return err
	}
	raw, err := os.ReadFile(a.o.AuthorizedKeysFile)
	if err != nil {
		return fmt.Errorf("read authorized keys: %w", err)
	}
	for len(bytes.TrimSpace(raw)) > 0 {
		k, _, _, rest, err := gossh.ParseAuthorizedKey(raw)
		if err != nil {
			break
		}
		if ck, ok := k.(gossh.CryptoPublicKey); ok {
			if pub, ok := ck.CryptoPublicKey().(ed25519.PublicKey); ok && pub.Equal(key) {
				return nil
			}
		}
		raw = rest
	}
	return errors.New("key not authorized")
}

// Conns is the number of gateway connections accepted since start.
func (a *Agent) Conns() int64 { return a.conns.Load() }

// Serve accepts connections on ln until ctx ends. A failure to accept that
// passes (out of file descriptors or memory, a connection aborted before
// it was accepted) is waited out rather than ending the helper, whose
// restart would bring a new key.
func (a *Agent) Serve(ctx context.Context, ln net.Listener) error {
	stop := context.AfterFunc(ctx, func() { ln.Close() })
	defer stop()
	defer a.wg.Wait()
	var wait time.Duration
	for {
		c, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			if !passing(err) {
				return err
			}
			wait = min(max(2*wait, 5*time.Millisecond), time.Second)
			a.log.Warn("accept failed; retrying", "err", err, "wait", wait)
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(wait):
			}
			continue
		}
		wait = 0
		select {
		case a.handshakes <- struct{}{}:
		default:
			c.Close()
			continue
		}
		a.wg.Add(1)
		go func() {
			defer a.wg.Done()
			a.handle(ctx, c)
		}()
	}
}

// passing reports whether an accept error may go away by itself.
func passing(err error) bool {
	for _, e := range []error{syscall.EMFILE, syscall.ENFILE, syscall.ENOBUFS, syscall.ENOMEM, syscall.ECONNABORTED} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

// handle serves one connection; it holds a place in a.handshakes until its
// handshake ended.
func (a *Agent) handle(ctx context.Context, c net.Conn) {
	defer c.Close()
	c.SetDeadline(time.Now().Add(a.o.HandshakeTimeout))
	tc := forward.Server(c, a.tls)
	err := tc.HandshakeContext(ctx)
	if err == nil {
		_, err = tc.Write([]byte{forward.Ready})
	}
	<-a.handshakes
	if err != nil {
		a.log.Info("handshake refused", "remote", c.RemoteAddr().String(), "err", err)
		return
	}
	c.SetDeadline(time.Time{})
	n := a.conns.Add(1)
	a.log.Info("gateway connected", "remote", c.RemoteAddr().String(), "conns", n)
	m := forward.NewMux(tc, forward.MuxOptions{Server: true, MaxStreams: a.o.MaxStreams})
	defer m.Close()
	// The connection's end, or the helper's, closes every stream's
	// loopback connection, so no copy waits on a quiet port.
	done, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(ctx, func() { m.Close() })
	defer stop()
	go func() {
		<-m.Done()
		a.log.Info("gateway disconnected", "remote", c.RemoteAddr().String(), "err", m.Err())
		cancel()
	}()
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		st, err := m.Accept()
		if err != nil {
			return
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			a.dial(done, st)
		}()
	}
}

// dial dials loopback inside the pod for one stream and copies both ways
// until both are done or ctx ends.
func (a *Agent) dial(ctx context.Context, st *forward.Stream) {
	host, port, err := forward.DecodeOpen(st.Request())
	if err != nil {
		st.Reject(forward.ConnectionFailed, "malformed open request")
		return
	}
	if reason := forward.Loopback(host, port); reason != "" {
		st.Reject(forward.Prohibited, reason)
		return
	}
	addr := "127.0.0.1"
	if host == "::1" || host == "[::1]" {
		addr = "::1"
	}
	dst, err := net.DialTimeout("tcp", net.JoinHostPort(addr, strconv.Itoa(int(port))), a.o.DialTimeout)
	if err != nil {
		st.Reject(forward.ConnectionFailed, fmt.Sprintf("nothing answers on port %d inside the sandbox", port))
		return
	}
	if err := st.Accept(); err != nil {
		dst.Close()
		return
	}
	stop := context.AfterFunc(ctx, func() { dst.Close(); st.Close() })
	defer stop()
	forward.Pipe(st, dst.(*net.TCPConn))
}
