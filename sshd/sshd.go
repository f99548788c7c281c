// Package sshd is hiloop's SSH gateway: `ssh -p 2222 <sandbox-id>@host`
// runs a shell or a command in the sandbox through the same exec path as
// the HTTP API, admitted by the same core (package control), so limits,
// quarantine, revocation and shutdown hold for both ways in.
//
// The gliderlabs/ssh server is configured explicitly: only public-key
// authentication; the organization is taken from the key that completed
// authentication (x/crypto's VerifiedPublicKeyCallback), never from the last
// key offered; the session channel is handled here, so env, agent and X11
// requests and subsystems are refused; tcpip-forward (-R) has no handler and
// is refused; direct-tcpip (-L) is checked and refused while no session
// helper backs it.
package sshd

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"runtime/debug"
	"sync"
	"time"

	"github.com/gliderlabs/ssh"
	gossh "golang.org/x/crypto/ssh"

	"github.com/hiloop/hiloop/control"
	"github.com/hiloop/hiloop/forward"
	"github.com/hiloop/hiloop/metrics"
)

// Options configure New.
type Options struct {
	Control *control.Control
	HostKey gossh.Signer
	Log     *slog.Logger
	// KeepAlive is how often the gateway asks an idle client whether it is
	// still there (gVisor's TCP keepalive default is two hours); 15s when
	// zero. KeepAliveMax unanswered asks close the connection; 3 when zero.
	KeepAlive    time.Duration
	KeepAliveMax int
	// IdleTimeout closes a connection that moved no bytes for this long
	// (keepalives count); off when zero.
	IdleTimeout time.Duration
	// LoginGrace closes a connection that has not authenticated this long
	// after it was accepted, version and key exchange included, as sshd's
	// LoginGraceTime; 30s when zero.
	LoginGrace time.Duration
	// MaxStartups bounds the connections in their handshake (accepted and
	// not yet authenticated) as sshd's MaxStartups start:rate:full does,
	// except that a connection sshd would drop waits in a queue first
	// (StartupQueue places, for at most StartupWait), and that one arriving
	// over a cap takes the place of the oldest connection that has sent
	// nothing, if there is one. 64:30:256 when zero.
	MaxStartups Startups
	// MaxStartupsPerSource bounds the connections in their handshake from
	// one address (an IPv6 /64), as sshd's PerSourceMaxStartups: one more
	// takes the place of the address's oldest silent connection, or
	// waits in the queue; 128 when zero, half of MaxStartups.Full, so
	// that one address cannot hold every handshake.
	MaxStartupsPerSource int
	// StartupQueue bounds the connections waiting for a place among the
	// handshakes, and StartupWait how long each waits, and how long a
	// login waits for a place of its key or organization
	// (MaxConnsPerKey, MaxConnsPerOrg) before it is refused; 256 and 10s
	// when zero. The login grace runs while they wait.
	StartupQueue int
	StartupWait  time.Duration
	// Penalties charge a source address for connections that fail or stall
	// before they authenticate, as sshd's PerSourcePenalties;
	// authfail:5s,noauth:1s,grace-exceeded:10s,crash:30s,min:15s,max:10m,
	// max-sources:16384 when zero.
	Penalties Penalties
	// MaxConnsPerKey bounds the authenticated connections of one SSH key; a
	// login past it waits (StartupWait), then fails. 32 when zero.
	MaxConnsPerKey int
	// MaxConnsPerOrg bounds the authenticated connections of all of one
	// organization's SSH keys together, so that registering more keys
	// does not multiply MaxConnsPerKey; a login past it waits
	// (StartupWait), then fails. 256 when zero.
	MaxConnsPerOrg int
	// MaxChannelsPerConn bounds the channels open at once on one
	// authenticated connection, sessions and -L channels together, as
	// sshd's MaxSessions: each holds up to an SSH window (2 MiB) of what
	// its client sent and nobody read yet, so without a bound one
	// connection could hold any amount of the process's memory. One past
	// it is refused, and the connection stays. 32 when zero.
	MaxChannelsPerConn int
	// MaxChannelsPerOrg bounds the channels open at once on all of one
	// organization's connections together, which MaxChannelsPerConn times
	// MaxConnsPerOrg would not bound usefully: what one tenant can hold of
	// the gateway's memory is this many SSH windows. 128 when zero.
	MaxChannelsPerOrg int
	// HelperDialTimeout bounds dialling a sandbox's session helper, TCP
	// connect, TLS handshake and the helper's ready together, and, apart,
	// the check of the helper's key against the record's pin; 10s when
	// zero.
	// It also bounds the helper's answer to each -L channel's open, and
	// each write to the helper: one that takes longer stopped reading, and
	// its upstream ends.
	HelperDialTimeout time.Duration
	// Metrics records refused keys, connections refused at a limit and
	// bytes moved; optional.
	Metrics *metrics.Metrics
	// Now is the clock of penalties; time.Now when nil.
	Now func() time.Time
}

// Gateway is the SSH server.
type Gateway struct {
	o   Options
	log *slog.Logger
	srv *ssh.Server
	// limits counts the connections held against MaxStartups,
	// MaxStartupsPerSource, MaxConnsPerKey and MaxConnsPerOrg, and the
	// penalties of source addresses.
	limits limits
	// upstreams holds each client connection's upstream to its sandbox's
	// session helper.
	upstreams sync.Map
	// pins are the helpers' host keys learnt from the record (forward.go).
	pins pins
	// served is every listener served and connection accepted
	// (shutdown.go).
	served served
}

// permKey and permOrg carry the authenticated key in the connection's
// permissions, which x/crypto hands over only for the key that signed.
const (
	permKey = "hiloop-key"
	permOrg = "hiloop-org"
)

// New builds the gateway.
func New(o Options) (*Gateway, error) {
	if o.Control == nil || o.HostKey == nil {
		return nil, errors.New("sshd: control and host key are required")
	}
	if err := o.setDefaults(); err != nil {
		return nil, err
	}
	g := &Gateway{o: o, log: o.Log.With("component", "sshd")}
	g.limits.met = o.Metrics
	g.srv = &ssh.Server{
		Version:     "hiloop",
		HostSigners: []ssh.Signer{o.HostKey},
		IdleTimeout: o.IdleTimeout,
		// Every connection is held against the caps on connections not
		// yet authenticated, and closed unless it authenticates within
		// the login grace. Until it authenticates, what it sends is
		// acknowledged at once (quickAckConn).
		ConnCallback: func(ctx ssh.Context, nc net.Conn) net.Conn {
			qc := &quickAckConn{Conn: nc}
			ctx.SetValue(quickAckKey{}, qc)
			return g.accept(ctx, qc, nc)
		},
		// Setting a public-key handler keeps NoClientAuth off; no password
		// or keyboard-interactive handler means those methods fail.
		PublicKeyHandler: g.publicKey,
		ServerConfigCallback: func(ctx ssh.Context) *gossh.ServerConfig {
			cfg := &gossh.ServerConfig{VerifiedPublicKeyCallback: func(md gossh.ConnMetadata, key gossh.PublicKey, perms *gossh.Permissions, algo string) (*gossh.Permissions, error) {
				return g.verified(ctx, md, key, perms, algo)
			}}
			cfg.Ciphers = forward.Ciphers()
			g.guard(ctx, cfg)
			return cfg
		},
		ChannelHandlers: map[string]ssh.ChannelHandler{
			"session":      g.recovered(g.session),
			"direct-tcpip": g.recovered(g.directTCPIP),
		},
		// No global request handlers: tcpip-forward (-R) and every other
		// global request is answered false.
		RequestHandlers:          map[string]ssh.RequestHandler{},
		ConnectionFailedCallback: g.failed,
	}
	return g, nil
}

// setDefaults fills the limits Options leave zero, and checks MaxStartups.
func (o *Options) setDefaults() error {
	if o.Log == nil {
		o.Log = slog.Default()
	}
	if o.KeepAlive == 0 {
		o.KeepAlive = 15 * time.Second
	}
	if o.KeepAliveMax == 0 {
		o.KeepAliveMax = 3
	}
	if o.LoginGrace == 0 {
		o.LoginGrace = defaultLoginGrace
	}
	if o.MaxStartups == (Startups{}) {
		o.MaxStartups = defaultStartups()
	}
	if err := o.MaxStartups.valid(); err != nil {
		return fmt.Errorf("sshd: max startups: %w", err)
	}
	if o.MaxStartupsPerSource == 0 {
		o.MaxStartupsPerSource = defaultMaxStartupsPerSource
	}
	if o.StartupQueue == 0 {
		o.StartupQueue = defaultStartupQueue
	}
	if o.StartupWait == 0 {
		o.StartupWait = defaultStartupWait
	}
	if o.Penalties == (Penalties{}) {
		o.Penalties = defaultPenalties()
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.MaxConnsPerKey == 0 {
		o.MaxConnsPerKey = defaultMaxConnsPerKey
	}
	if o.MaxConnsPerOrg == 0 {
		o.MaxConnsPerOrg = defaultMaxConnsPerOrg
	}
	if o.MaxChannelsPerConn == 0 {
		o.MaxChannelsPerConn = defaultMaxChannelsPerConn
	}
	if o.MaxChannelsPerOrg == 0 {
		o.MaxChannelsPerOrg = defaultMaxChannelsPerOrg
	}
	if o.HelperDialTimeout == 0 {
		o.HelperDialTimeout = defaultHelperDialTimeout
	}
	return nil
}

// publicKey answers whether key may log in as the connection's user (a
// sandbox id). It may be called for keys the client only offers; what it
// decides is re-checked for the key that signed, in verified.
func (g *Gateway) publicKey(ctx ssh.Context, key ssh.PublicKey) bool {
	_, ok := g.caller(ctx, key, ctx.User())
	if !ok {
		g.o.Metrics.AuthFailure("ssh_key_refused")
		g.log.Info("ssh key refused", "fingerprint", gossh.FingerprintSHA256(key), "user", ctx.User(), "remote", ctx.RemoteAddr().String())
	}
	return ok
}

// caller is who key authenticates as for sandbox id (control.Authenticate),
// and false for anyone else. A record that cannot answer refuses the key
// too, and is logged.
func (g *Gateway) caller(ctx context.Context, key gossh.PublicKey, id string) (control.Caller, bool) {
	if key == nil || id == "" {
		return control.Caller{}, false
	}
	who, err := g.o.Control.Authenticate(ctx, control.Credential{SSHKey: key, Sandbox: id})
	if err != nil {
		if !errors.Is(err, control.ErrUnauthenticated) {
			g.log.Error("ssh key lookup", "sandbox", id, "err", err)
		}
		return control.Caller{}, false
	}
	return who, true
}

// verified runs once the client proved it holds key: the permissions it
// returns are the connection's, so the session acts for this key and no
// other. The connection is registered with the core under this key, so
// that it is closed when the key goes, and not only its sessions.
func (g *Gateway) verified(ctx ssh.Context, conn gossh.ConnMetadata, key gossh.PublicKey, _ *gossh.Permissions, _ string) (*gossh.Permissions, error) {
	who, ok := g.caller(ctx, key, conn.User())
	if !ok {
		return nil, errors.New("permission denied")
	}
	c, _ := ctx.Value(connKey{}).(*heldConn)
	if c == nil {
		return nil, errors.New("permission denied")
	}
	if err := c.takeOrg(who.OrgID); err != nil {
		if errors.Is(err, errPerOrg) {
			c.absolve()
			g.o.Metrics.SSHRefused(refusedPerOrg)
			g.log.Info("ssh login refused: too many connections for the organization", "org", who.OrgID, "max", g.o.MaxConnsPerOrg)
			return nil, &gossh.BannerError{Err: err, Message: fmt.Sprintf("hiloop: too many connections for this organization (--ssh-max-conns-per-org %d); waited %s\r\n", g.o.MaxConnsPerOrg, g.o.StartupWait)}
		}
		return nil, err
	}
	if err := g.register(ctx, conn, who); err != nil {
		c.dropOrg()
		return nil, err
	}
	if qc, ok := ctx.Value(quickAckKey{}).(*quickAckConn); ok {
		qc.stop()
	}
	g.log.Info("ssh login", "fingerprint", gossh.FingerprintSHA256(key), "sandbox", conn.User(), "org", who.OrgID, "key", who.KeyID)
	return &gossh.Permissions{Extensions: map[string]string{permKey: who.KeyID, permOrg: who.OrgID}}, nil
}

// caller is who the connection authenticated as.
func caller(conn *gossh.ServerConn) (control.Caller, bool) {
	if conn.Permissions == nil {
		return control.Caller{}, false
	}
	who := control.Caller{OrgID: conn.Permissions.Extensions[permOrg], KeyID: conn.Permissions.Extensions[permKey]}
	return who, who.OrgID != "" && who.KeyID != ""
}

// recovered runs a channel handler with a panic confined to its channel.
func (g *Gateway) recovered(h ssh.ChannelHandler) ssh.ChannelHandler {
	return func(srv *ssh.Server, conn *gossh.ServerConn, ch gossh.NewChannel, ctx ssh.Context) {
		defer func() {
			if v := recover(); v != nil {
				g.log.Error("panic in ssh channel", "type", ch.ChannelType(), "panic", v, "stack", string(debug.Stack()))
			}
		}()
		h(srv, conn, ch, ctx)
	}
}

// keepAlive asks an authenticated connection's client every KeepAlive
// whether it is still there, from authentication until the connection
// closes, and closes the connection after KeepAliveMax asks without an
// answer: TCP keepalive inside gVisor fires after two hours, far too late to
// notice a client that went away.
func (g *Gateway) keepAlive(ctx ssh.Context, c *heldConn) {
	t := time.NewTicker(g.o.KeepAlive)
	defer t.Stop()
	missed := 0
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		// The handshake finishes right after authentication; until then
		// there is no connection to ask, which counts as no answer.
		reply := make(chan error, 1)
		if conn, ok := ctx.Value(ssh.ContextKeyConn).(*gossh.ServerConn); ok {
			go func() {
				_, _, err := conn.SendRequest("keepalive@openssh.com", true, nil)
				reply <- err
			}()
		}
		wait := time.NewTimer(g.o.KeepAlive)
		select {
		case err := <-reply:
			wait.Stop()
			if err != nil {
				return // the connection is gone
			}
			missed = 0
		case <-ctx.Done():
			wait.Stop()
			return
		case <-wait.C:
			missed++
			if missed >= g.o.KeepAliveMax {
				g.log.Info("ssh client stopped answering keepalives; closing", "remote", c.RemoteAddr().String())
				c.Close()
				return
			}
		}
	}
}
