// Package agent is the session helper, `hiloop agent`: a small SSH server
// that runs as a hardened helper container in a sandbox pod, sharing the
// pod's network namespace, so the gateway can reach the sandbox's loopback
// under gVisor, where the runtime's port-forward cannot. It accepts only a
// login whose user name is its own sandbox's id, with the key the gateway
// derived for that sandbox (read from a file the kubelet projects from a
// pod annotation, re-read at every login, so a rotation needs no restart),
// serves only direct-tcpip, and dials only loopback. A gateway dial that
// lands on another sandbox's helper is refused either way.
package agent

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hiloop/hiloop/forward"
	gossh "golang.org/x/crypto/ssh"
)

// Options configure New.
type Options struct {
	// SandboxID is the sandbox whose pod the helper runs in, the only user
	// name it accepts.
	SandboxID string
	// AuthorizedKeysFile holds the gateway's public key(s) for this
	// sandbox, authorized_keys form.
	AuthorizedKeysFile string
	Log                *slog.Logger
	// DialTimeout bounds a dial to a loopback port; 5s when zero.
	DialTimeout time.Duration
}

// Agent is the helper's SSH server.
type Agent struct {
	o      Options
	log    *slog.Logger
	config *gossh.ServerConfig
	// conns counts gateway connections accepted since start: the gateway
	// holds one per client connection, whatever its number of channels.
	conns atomic.Int64
	wg    sync.WaitGroup
}

// New builds the agent with a fresh host key; the gateway pins it per pod.
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
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, err
	}
	signer, err := gossh.NewSignerFromKey(priv)
	if err != nil {
		return nil, err
	}
	a := &Agent{o: o, log: o.Log.With("component", "agent")}
	a.config = &gossh.ServerConfig{PublicKeyCallback: a.authorize, ServerVersion: "SSH-2.0-hiloop-agent"}
	a.config.Ciphers = forward.Ciphers()
	a.config.AddHostKey(signer)
	return a, nil
}

// authorize accepts exactly the keys the file lists now, for a user named
// after the helper's own sandbox.
func (a *Agent) authorize(meta gossh.ConnMetadata, key gossh.PublicKey) (*gossh.Permissions, error) {
	if meta.User() != a.o.SandboxID {
		return nil, errors.New("not this sandbox")
	}
	raw, err := os.ReadFile(a.o.AuthorizedKeysFile)
	if err != nil {
		return nil, fmt.Errorf("read authorized keys: %w", err)
	}
	want := key.Marshal()
	for len(bytes.TrimSpace(raw)) > 0 {
		k, _, _, rest, err := gossh.ParseAuthorizedKey(raw)
		if err != nil {
			break
		}
		if bytes.Equal(k.Marshal(), want) {
			return &gossh.Permissions{}, nil
		}
		raw = rest
	}
	return nil, errors.New("key not authorized")
}

// Conns is the number of gateway connections accepted since start.
func (a *Agent) Conns() int64 { return a.conns.Load() }

// Serve accepts connections on ln until ctx ends.
func (a *Agent) Serve(ctx context.Context, ln net.Listener) error {
	stop := context.AfterFunc(ctx, func() { ln.Close() })
	defer stop()
	defer a.wg.Wait()
	for {
		c, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		a.wg.Add(1)
		go func() {
			defer a.wg.Done()
			a.handle(ctx, c)
		}()
	}
}

func (a *Agent) handle(ctx context.Context, c net.Conn) {
	defer c.Close()
	c.SetDeadline(time.Now().Add(30 * time.Second))
	conn, chans, reqs, err := gossh.NewServerConn(c, a.config)
	if err != nil {
		a.log.Info("handshake refused", "remote", c.RemoteAddr().String(), "err", err)
		return
	}
	c.SetDeadline(time.Time{})
	defer conn.Close()
	n := a.conns.Add(1)
	a.log.Info("gateway connected", "remote", c.RemoteAddr().String(), "conns", n)
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()
	go gossh.DiscardRequests(reqs) // no global requests: no -R
	var wg sync.WaitGroup
	defer wg.Wait()
	for nc := range chans {
		if nc.ChannelType() != "direct-tcpip" {
			nc.Reject(gossh.UnknownChannelType, "only direct-tcpip")
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			a.dial(nc)
		}()
	}
}

// dial dials loopback inside the pod and copies both ways.
func (a *Agent) dial(nc gossh.NewChannel) {
	var p forward.DirectTCPIP
	if err := gossh.Unmarshal(nc.ExtraData(), &p); err != nil {
		nc.Reject(gossh.ConnectionFailed, "malformed direct-tcpip request")
		return
	}
	if reason := forward.Loopback(p.Host, p.Port); reason != "" {
		nc.Reject(gossh.Prohibited, reason)
		return
	}
	host := "127.0.0.1"
	if p.Host == "::1" || p.Host == "[::1]" {
		host = "::1"
	}
	dst, err := net.DialTimeout("tcp", net.JoinHostPort(host, strconv.Itoa(int(p.Port))), a.o.DialTimeout)
	if err != nil {
		nc.Reject(gossh.ConnectionFailed, fmt.Sprintf("nothing answers on port %d inside the sandbox", p.Port))
		return
	}
	ch, reqs, err := nc.Accept()
	if err != nil {
		dst.Close()
		return
	}
	go gossh.DiscardRequests(reqs)
	forward.Pipe(ch, dst.(*net.TCPConn))
}
