package sshd

import (
	"errors"
	"net"
	"sync"
	"time"

	"github.com/gliderlabs/ssh"
	gossh "golang.org/x/crypto/ssh"

	"github.com/hiloop/hiloop/control"
)

// What a stranger can hold open before authenticating, and what one key can
// hold after, when Options leave them zero.
const (
	defaultLoginGrace           = 30 * time.Second
	defaultMaxStartups          = 64
	defaultMaxStartupsPerSource = 10
	defaultMaxConnsPerKey       = 32
	defaultMaxConnsPerOrg       = 256
	defaultMaxChannelsPerConn   = 32
	defaultMaxChannelsPerOrg    = 128
	defaultHelperDialTimeout    = 10 * time.Second
)

// Reasons a connection is closed or refused at a limit, as the metric
// hiloop_ssh_refused_connections_total labels them.
const (
	refusedStartups  = "startups"
	refusedPerSource = "startups_per_source"
	refusedGrace     = "login_grace"
	refusedPerKey    = "per_key"
	refusedPerOrg    = "per_org"
	// refusedChannels counts channels (a session, an -L channel) refused
	// because their connection had MaxChannelsPerConn open; the
	// connection stays.
	refusedChannels = "channels_per_conn"
	// refusedOrgChannels counts channels refused because the
	// organization's connections had MaxChannelsPerOrg open together.
	refusedOrgChannels = "channels_per_org"
	// refusedHelperDial counts -L channels refused because the session
	// helper did not finish the dial and handshake within
	// HelperDialTimeout; the client's connection stays.
	refusedHelperDial = "helper_dial_timeout"
)

// errPerKey refuses a login past MaxConnsPerKey, errPerOrg one past
// MaxConnsPerOrg.
var (
	errPerKey = errors.New("too many connections for this key")
	errPerOrg = errors.New("too many connections for this organization")
)

// limits counts the connections that are held against the caps: those not
// yet authenticated, in all and per source address, and those
// authenticated, per key (by fingerprint: one private key, however many
// organizations registered its public half, since a connection holds a
// place only once its client proved it holds the private key). Counts drop to no entry at zero, so the maps stay bounded by what
// is open.
type limits struct {
	mu       sync.Mutex
	startups int
	bySource map[string]int
	byKey    map[string]int
	byOrg    map[string]int
	// channelsByOrg counts the channels open on each organization's
	// connections together.
	channelsByOrg map[string]int
}

// takeChannel takes a place among the channels of org's connections;
// false past max.
func (l *limits) takeChannel(org string, max int) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.channelsByOrg[org] >= max {
		return false
	}
	if l.channelsByOrg == nil {
		l.channelsByOrg = map[string]int{}
	}
	l.channelsByOrg[org]++
	return true
}

func (l *limits) dropChannel(org string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	dec(l.channelsByOrg, org)
}

// heldConn is one accepted connection, held against the caps from accept until
// it closes. Until it authenticates, a timer closes it when the login grace
// passes: the timer, not a deadline on the connection, because gliderlabs
// resets the connection's deadline on every read and write.
type heldConn struct {
	net.Conn
	g      *Gateway
	source string

	mu sync.Mutex
	// grace closes the connection unless it authenticates first; nil once
	// it did or it closed. While it is set, the connection holds a place
	// among those not yet authenticated.
	grace *time.Timer
	// key is the fingerprint of the key whose place the connection holds,
	// org the organization whose place it holds; empty when it holds none.
	key, org string
	closed   bool
}

// accept is the server's ConnCallback: it holds a new connection against
// the caps on connections not yet authenticated (nil, which closes it at
// once, past either) and starts its login grace. The connection is kept in
// ctx for the authentication callbacks.
func (g *Gateway) accept(ctx ssh.Context, nc net.Conn) net.Conn {
	source := control.Source(nc.RemoteAddr().String())
	g.limits.mu.Lock()
	reason := ""
	switch {
	case g.limits.startups >= g.o.MaxStartups:
		reason = refusedStartups
	case g.limits.bySource[source] >= g.o.MaxStartupsPerSource:
		reason = refusedPerSource
	default:
		g.limits.startups++
		if g.limits.bySource == nil {
			g.limits.bySource = map[string]int{}
		}
		g.limits.bySource[source]++
	}
	g.limits.mu.Unlock()
	if reason != "" {
		g.o.Metrics.SSHRefused(reason)
		g.log.Debug("ssh connection refused: too many not yet authenticated", "remote", source, "reason", reason)
		return nil
	}
	c := &heldConn{Conn: nc, g: g, source: source}
	// c is kept for Shutdown before its grace can close it: a grace
	// that passed first would have Close forget c before it was kept, and
	// c kept, closed, for ever.
	c.mu.Lock()
	c.grace = time.AfterFunc(g.o.LoginGrace, c.graceOver)
	kept := g.served.add(c)
	c.mu.Unlock()
	if !kept {
		c.Close() // the gateway is shutting down
		return nil
	}
	ctx.SetValue(connKey{}, c)
	return c
}

// loggingIn reports whether c has not yet authenticated and is open.
func (c *heldConn) loggingIn() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.grace != nil
}

// connKey keeps a connection's *heldConn in its ssh.Context.
type connKey struct{}

// graceOver closes a connection that has not authenticated within the login
// grace.
func (c *heldConn) graceOver() {
	c.mu.Lock()
	late := c.grace != nil
	c.mu.Unlock()
	if !late {
		return
	}
	c.g.o.Metrics.SSHRefused(refusedGrace)
	c.g.log.Info("ssh connection closed: not authenticated within the login grace", "remote", c.source, "grace", c.g.o.LoginGrace)
	c.Close()
}

// takeKey takes a place among the connections of the key with
// fingerprint fp, before the key is checked: a connection past
// MaxConnsPerKey costs the core nothing. It fails with errPerKey past it,
// and when the connection closed or already holds a place.
func (c *heldConn) takeKey(fp string) error {
	l := &c.g.limits
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed || c.key != "" {
		return errors.New("the connection is closed or already authenticating")
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.byKey[fp] >= c.g.o.MaxConnsPerKey {
		return errPerKey
	}
	if l.byKey == nil {
		l.byKey = map[string]int{}
	}
	l.byKey[fp]++
	c.key = fp
	return nil
}

// dropKey gives back the place takeKey took, for a key that did not
// authenticate.
func (c *heldConn) dropKey() {
	l := &c.g.limits
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.key == "" || c.closed {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	dec(l.byKey, c.key)
	c.key = ""
}

// takeOrg takes a place among the connections of the organization the
// connection authenticates as, once its key was checked: the cap per key
// would otherwise be multiplied by the organization's keys. It fails with
// errPerOrg past MaxConnsPerOrg, and when the connection closed or already
// holds a place.
func (c *heldConn) takeOrg(org string) error {
	l := &c.g.limits
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed || c.org != "" || org == "" {
		return errors.New("the connection is closed or already authenticated")
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.byOrg[org] >= c.g.o.MaxConnsPerOrg {
		return errPerOrg
	}
	if l.byOrg == nil {
		l.byOrg = map[string]int{}
	}
	l.byOrg[org]++
	c.org = org
	return nil
}

// dropOrg gives back the place takeOrg took, for a login that failed after
// it.
func (c *heldConn) dropOrg() {
	l := &c.g.limits
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.org == "" || c.closed {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	dec(l.byOrg, c.org)
	c.org = ""
}

// authenticated ends the login grace and gives back the connection's place
// among those not yet authenticated. It fails once the connection closed.
func (c *heldConn) authenticated() error {
	l := &c.g.limits
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed || c.grace == nil {
		return errors.New("the connection is closed")
	}
	c.grace.Stop()
	c.grace = nil
	l.mu.Lock()
	defer l.mu.Unlock()
	l.startups--
	dec(l.bySource, c.source)
	return nil
}

// Close closes the connection and gives back what it held against the
// caps; it is safe to call more than once.
func (c *heldConn) Close() error {
	err := c.Conn.Close()
	l := &c.g.limits
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return err
	}
	c.closed = true
	defer c.g.served.remove(c)
	l.mu.Lock()
	defer l.mu.Unlock()
	if c.grace != nil {
		c.grace.Stop()
		c.grace = nil
		l.startups--
		dec(l.bySource, c.source)
	}
	if c.key != "" {
		dec(l.byKey, c.key)
	}
	if c.org != "" {
		dec(l.byOrg, c.org)
	}
	return err
}

func dec(m map[string]int, k string) {
	if m[k] <= 1 {
		delete(m, k)
		return
	}
	m[k]--
}

// guard makes a successful key verification in cfg also the end of the
// connection's login grace, within MaxConnsPerKey, and the start of its
// keepalives: an authenticated connection is checked whether or not it ever
// opens a channel.
func (g *Gateway) guard(ctx ssh.Context, cfg *gossh.ServerConfig) {
	c, _ := ctx.Value(connKey{}).(*heldConn)
	verified := cfg.VerifiedPublicKeyCallback
	if c == nil || verified == nil {
		return
	}
	cfg.VerifiedPublicKeyCallback = func(md gossh.ConnMetadata, key gossh.PublicKey, perms *gossh.Permissions, algo string) (*gossh.Permissions, error) {
		fp := gossh.FingerprintSHA256(key)
		if err := c.takeKey(fp); err != nil {
			if errors.Is(err, errPerKey) {
				g.o.Metrics.SSHRefused(refusedPerKey)
				g.log.Info("ssh login refused: too many connections for the key", "fingerprint", fp, "max", g.o.MaxConnsPerKey)
			}
			return nil, err
		}
		perms, err := verified(md, key, perms, algo)
		if err != nil {
			c.dropKey()
			return nil, err
		}
		if err := c.authenticated(); err != nil {
			return nil, err
		}
		go g.keepAlive(ctx, c)
		return perms, nil
	}
}
