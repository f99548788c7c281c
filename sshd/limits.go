package sshd

import (
	"container/list"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/gliderlabs/ssh"
	gossh "golang.org/x/crypto/ssh"

	"github.com/hiloop/hiloop/control"
	"github.com/hiloop/hiloop/metrics"
)

// What a stranger can hold open before authenticating, and what one key can
// hold after, when Options leave them zero.
const (
	defaultLoginGrace           = 30 * time.Second
	defaultMaxStartupsPerSource = 128
	defaultStartupQueue         = 256
	defaultStartupWait          = 10 * time.Second
	defaultMaxConnsPerKey       = 32
	defaultMaxConnsPerOrg       = 256
	defaultMaxChannelsPerConn   = 32
	defaultMaxChannelsPerOrg    = 128
	defaultHelperDialTimeout    = 10 * time.Second
)

// defaultStartups is MaxStartups when Options leave it zero: 64
// handshakes at once before any waits, 256 at most.
func defaultStartups() Startups { return Startups{Start: 64, Rate: 30, Full: 256} }

// defaultPenalties is Penalties when Options leave it zero, and what
// Penalties.UnmarshalText starts from.
func defaultPenalties() Penalties {
	return Penalties{AuthFail: 5 * time.Second, NoAuth: time.Second, GraceExceeded: 10 * time.Second,
		Crash: 30 * time.Second, Min: 15 * time.Second, Max: 10 * time.Minute, MaxSources: 16384}
}

// Reasons a connection is closed or refused at a limit, as the metric
// hiloop_ssh_refused_connections_total labels them.
const (
	// refusedStartups counts connections refused because MaxStartups.Full
	// handshakes were under way and StartupQueue connections waited.
	refusedStartups  = "startups"
	refusedPerSource = "startups_per_source"
	// refusedStartupWait counts connections that waited StartupWait in the
	// queue without a place among the handshakes.
	refusedStartupWait = "startup_wait"
	// refusedSilent counts connections that sent nothing, closed to give
	// their place to one that arrived over a cap.
	refusedSilent = "silent"
	// refusedPenalty counts connections from an address under a penalty.
	refusedPenalty = "penalty"
	refusedGrace   = "login_grace"
	refusedPerKey  = "per_key"
	refusedPerOrg  = "per_org"
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

// What a source address is penalised for, as the metric
// hiloop_ssh_penalties_total labels it.
const (
	penaltyAuthFail = "authfail"
	penaltyNoAuth   = "noauth"
	penaltyGrace    = "grace_exceeded"
	penaltyCrash    = "crash"
)

// errPerKey refuses a login past MaxConnsPerKey, errPerOrg one past
// MaxConnsPerOrg.
var (
	errPerKey = errors.New("too many connections for this key")
	errPerOrg = errors.New("too many connections for this organization")
)

// maxRefusing bounds the refused connections the gateway is telling why at
// once (each holds its descriptor for up to refusalLinger); past it a
// refused connection is closed without a word.
const (
	maxRefusing    = 256
	refusalLinger  = time.Second
	refusalMaxRead = 16 << 10
)

// Startups is sshd's MaxStartups, start:rate:full: while Start handshakes
// (connections accepted and not yet authenticated) are under way, a new one
// starts at once; from Start on, a new one waits for a place with a
// probability that grows from Rate percent linearly to 100 at Full, and
// Full handshakes are the most at once. Where sshd drops such a
// connection, the gateway makes it wait (StartupWait) and refuses it only
// when the wait ends without a place.
type Startups struct {
	Start, Rate, Full int
}

// String is the start:rate:full form.
func (s Startups) String() string { return fmt.Sprintf("%d:%d:%d", s.Start, s.Rate, s.Full) }

// UnmarshalText reads start:rate:full, or a single number n as n:100:n (a
// hard cap), as sshd_config does.
func (s *Startups) UnmarshalText(b []byte) error {
	parts := strings.Split(string(b), ":")
	var v []int
	for _, p := range parts {
		n, err := strconv.Atoi(p)
		if err != nil {
			return fmt.Errorf("%q: want start:rate:full or one number", b)
		}
		v = append(v, n)
	}
	switch len(v) {
	case 1:
		*s = Startups{Start: v[0], Rate: 100, Full: v[0]}
	case 3:
		*s = Startups{Start: v[0], Rate: v[1], Full: v[2]}
	default:
		return fmt.Errorf("%q: want start:rate:full or one number", b)
	}
	return s.valid()
}

func (s Startups) valid() error {
	switch {
	case s.Start < 1:
		return errors.New("start must be at least 1")
	case s.Full < s.Start:
		return errors.New("full must be at least start")
	case s.Rate < 1 || s.Rate > 100:
		return errors.New("rate must be 1..100 percent")
	}
	return nil
}

// waitChance is the probability that a connection arriving while n
// handshakes are under way must wait for a place.
func (s Startups) waitChance(n int) float64 {
	switch {
	case n < s.Start:
		return 0
	case n >= s.Full:
		return 1
	}
	return (float64(s.Rate) + float64(100-s.Rate)*float64(n-s.Start)/float64(s.Full-s.Start)) / 100
}

// Penalties is sshd's PerSourcePenalties: what a source address is charged
// for a connection that failed authentication (AuthFail), closed without
// trying (NoAuth), let the login grace pass (GraceExceeded), or broke the
// protocol in its handshake (Crash). Charges add up, and run down in real
// time; once an address was charged at least Min since it last owed
// nothing, it is refused until it owes nothing, and it never owes more
// than Max. At most MaxSources addresses
// are tracked; past that, new ones are not charged (sshd's "permissive"
// overflow). Authenticating costs nothing, so a burst of clients that log
// in is never penalised.
type Penalties struct {
	AuthFail, NoAuth, GraceExceeded, Crash time.Duration
	Min, Max                               time.Duration
	MaxSources                             int
	// Off turns penalties off.
	Off bool
}

// String is the form UnmarshalText reads.
func (p Penalties) String() string {
	if p.Off {
		return "off"
	}
	return fmt.Sprintf("authfail:%s,noauth:%s,grace-exceeded:%s,crash:%s,min:%s,max:%s,max-sources:%d",
		p.AuthFail, p.NoAuth, p.GraceExceeded, p.Crash, p.Min, p.Max, p.MaxSources)
}

// UnmarshalText reads "off", or comma-separated name:value pairs over the
// defaults: authfail, noauth, grace-exceeded, crash, min and max
// take durations, max-sources a count.
func (p *Penalties) UnmarshalText(b []byte) error {
	s := strings.TrimSpace(string(b))
	if s == "off" {
		*p = Penalties{Off: true}
		return nil
	}
	v := defaultPenalties()
	for _, kv := range strings.Split(s, ",") {
		if kv == "" {
			continue
		}
		name, val, ok := strings.Cut(kv, ":")
		if !ok {
			return fmt.Errorf("%q: want name:value", kv)
		}
		if name == "max-sources" {
			n, err := strconv.Atoi(val)
			if err != nil || n < 1 {
				return fmt.Errorf("%q: want a count of at least 1", kv)
			}
			v.MaxSources = n
			continue
		}
		d, err := time.ParseDuration(val)
		if err != nil || d < 0 {
			return fmt.Errorf("%q: want a duration", kv)
		}
		switch name {
		case "authfail":
			v.AuthFail = d
		case "noauth":
			v.NoAuth = d
		case "grace-exceeded":
			v.GraceExceeded = d
		case "crash":
			v.Crash = d
		case "min":
			v.Min = d
		case "max":
			v.Max = d
		default:
			return fmt.Errorf("%q: unknown penalty %q", kv, name)
		}
	}
	if v.Min <= 0 || v.Max < v.Min {
		return errors.New("min must be positive and max at least min")
	}
	*p = v
	return nil
}

// limits counts what is held against the caps: the connections not yet
// authenticated, under way in their handshake or waiting for a place, in
// all and per source address; those authenticated, per key (by
// fingerprint: one private key, however many organizations registered its
// public half, since a connection holds a place only once its client
// proved it holds the private key) and per organization; and the
// penalties of source addresses. Counts drop to no entry at zero, so the
// maps stay bounded by what is open; penalties are bounded by
// Penalties.MaxSources and expire.
type limits struct {
	mu sync.Mutex
	// starting holds the connections under way in their handshake, oldest
	// first; queue those waiting for a place among them, in order.
	starting, queue list.List
	// bySource counts each source's connections under way in their
	// handshake.
	bySource map[string]int
	byKey    map[string]int
	byOrg    map[string]int
	// freed is closed, and replaced, when a key's or an organization's
	// place is given back, for logins waiting for one.
	freed chan struct{}
	// channelsByOrg counts the channels open on each organization's
	// connections together.
	channelsByOrg map[string]int
	// penalties are the sources that owe a penalty; swept is when expired
	// ones were last dropped in full.
	penalties map[string]*penalty
	swept     time.Time
	// refusing counts the refused connections being told why.
	refusing int
	// met shows how many start and wait.
	met *metrics.Metrics
}

// penalty is what a source owes: until until, and charged since it last
// owed nothing; active once charged at least Penalties.Min, after which
// it is refused until until.
type penalty struct {
	until   time.Time
	charged time.Duration
	active  bool
}

// place is where a connection not yet authenticated stands.
type place int

const (
	placeNone place = iota
	placeWaiting
	placeStarting
)

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
	// raw is the accepted connection, unwrapped, which the gateway peeks
	// at and writes refusals to.
	raw    net.Conn
	g      *Gateway
	source string
	// spoke is set once the handshake read a byte from the client.
	spoke atomic.Bool
	// authFailed is set once the client tried a key or method that
	// failed.
	authFailed atomic.Bool
	// done is closed when the connection closes.
	done chan struct{}

	// Guarded by g.limits.mu: where the connection stands before it
	// authenticates, its element in limits.starting or limits.queue, and
	// admitted, closed when a waiting connection is given a place.
	place    place
	elem     *list.Element
	admitted chan struct{}
	// started is when it took its place among the handshakes, and the
	// gateway sent its version: a client may wait for that before it
	// speaks, so its silence counts from then, not from its wait.
	started time.Time

	mu sync.Mutex
	// grace closes the connection unless it authenticates first; nil once
	// it did or it closed.
	grace *time.Timer
	// key is the fingerprint of the key whose place the connection holds,
	// org the organization whose place it holds; empty when it holds none.
	key, org string
	closed   bool
	// blameless is set when the gateway, not the client, ends a
	// connection that has not authenticated (a refusal, a place given to
	// another, shutdown): it costs its source no penalty.
	blameless bool
	// graceOver is set when the login grace closed it.
	graceOver bool
}

// Read is the handshake's read; the first byte read marks the client as
// one that speaks.
func (c *heldConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if n > 0 && !c.spoke.Load() {
		c.spoke.Store(true)
	}
	return n, err
}

// silent reports whether the client has sent nothing at all: the handshake
// read nothing and nothing waits to be read. A client that closed counts
// as silent.
func (c *heldConn) silent() bool {
	return !c.spoke.Load() && !pending(c.raw)
}

// pending reports whether bytes the client sent wait to be read from nc,
// without reading them.
func pending(nc net.Conn) bool {
	sc, ok := nc.(syscall.Conn)
	if !ok {
		return true // cannot tell: never taken for silent
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return true
	}
	// Control, not Read: Read would wait for the handshake's own read,
	// which holds the descriptor's read lock while it waits for data.
	// The peek does not block.
	waiting := true
	if err := rc.Control(func(fd uintptr) { waiting = peek(fd) }); err != nil {
		return true
	}
	return waiting
}

// hungUp reports whether the client closed its side of the connection or
// reset it, even with bytes it sent still unread.
func (c *heldConn) hungUp() bool {
	sc, ok := c.raw.(syscall.Conn)
	if !ok {
		return false
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	gone := false
	if err := rc.Control(func(fd uintptr) { gone = hungUp(fd) }); err != nil {
		return false
	}
	return gone
}

// accept is the server's ConnCallback. It refuses a connection from a
// penalised source, and otherwise holds it against the caps on
// connections not yet authenticated: it starts its handshake at once, or
// waits for a place, or takes the place of a silent connection, or is
// refused with the reason (nil, which closes it). It starts the login
// grace at accept, so the wait counts. The connection is kept in ctx for
// the authentication callbacks.
func (g *Gateway) accept(ctx ssh.Context, nc, raw net.Conn) net.Conn {
	source := control.Source(raw.RemoteAddr().String())
	if left, ok := g.limits.penalised(source, g.o.Now()); ok {
		g.refuse(raw, refusedPenalty, fmt.Sprintf("this address is refused for another %s after failed or stalled logins (--ssh-penalties)", left.Round(time.Second)))
		return nil
	}
	c := &heldConn{Conn: nc, raw: raw, g: g, source: source, done: make(chan struct{})}
	// c is kept for Shutdown before its grace can close it: a grace
	// that passed first would have Close forget c before it was kept, and
	// c kept, closed, for ever.
	c.mu.Lock()
	c.grace = time.AfterFunc(g.o.LoginGrace, c.overGrace)
	kept := g.served.add(c)
	c.mu.Unlock()
	if !kept {
		c.absolve()
		c.Close() // the gateway is shutting down
		return nil
	}
	victim, st, reason := g.limits.enter(c, &g.o)
	if victim != nil {
		g.o.Metrics.SSHRefused(refusedSilent)
		g.log.Debug("ssh connection closed: it sent nothing, and its place went to a new one", "remote", victim.source)
		victim.absolve()
		victim.Close()
	}
	if st == placeNone && reason == "" {
		return nil // closed before it took a place
	}
	if st == placeWaiting {
		var ok bool
		if reason, ok = c.await(); !ok {
			return nil // closed while it waited
		}
	}
	if reason != "" {
		c.absolve()
		c.stopGrace() // the refusal closes it
		g.limits.leave(c)
		g.refuse(raw, reason, refusalText(reason, &g.o))
		c.Close()
		return nil
	}
	ctx.SetValue(connKey{}, c)
	return c
}

// refusalText says why a connection was refused at reason, naming the
// flag that sets the limit.
func refusalText(reason string, o *Options) string {
	switch reason {
	case refusedPerSource:
		return fmt.Sprintf("too many connections in their key exchange from this address (--ssh-max-startups-per-source %d) and waiting (--ssh-startup-queue %d); try again later", o.MaxStartupsPerSource, o.StartupQueue)
	case refusedStartupWait:
		return fmt.Sprintf("too many connections in their key exchange (--ssh-max-startups %s); waited %s (--ssh-startup-wait); try again later", o.MaxStartups, o.StartupWait)
	default:
		return fmt.Sprintf("too many connections in their key exchange (--ssh-max-startups %s) and waiting (--ssh-startup-queue %d); try again later", o.MaxStartups, o.StartupQueue)
	}
}

// enter takes c's place among the connections not yet authenticated:
// placeStarting, its handshake starts; placeWaiting, it waits in the
// queue; placeNone, it is refused for reason. Over a cap, c may take the
// place of the oldest silent connection (one that has sent nothing),
// which is returned for the caller to close: a client speaks within a
// round trip of connecting, so only a connection that would never log in
// loses its place.
func (l *limits) enter(c *heldConn, o *Options) (victim *heldConn, _ place, reason string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	select {
	case <-c.done:
		// Closed already (its login grace passed at accept): Close gave
		// back no place, so it must take none.
		return nil, placeNone, ""
	default:
	}
	// Over a cap, c takes the place of a connection silent for silentAge,
	// else waits, else takes the place of one silent for any time, else
	// is refused: a good client is silent only for the moment between its
	// connect and its version, and only a full queue risks that moment.
	aged := time.Now().Add(-silentAge)
	overCap := func(source, reason string) (*heldConn, place, string) {
		if victim := l.oldestSilent(source, aged); victim != nil {
			l.takeOver(c, victim)
			return victim, placeStarting, ""
		}
		if l.queue.Len() < o.StartupQueue {
			l.add(c, placeWaiting)
			return nil, placeWaiting, ""
		}
		if victim := l.oldestSilent(source, time.Time{}); victim != nil {
			l.takeOver(c, victim)
			return victim, placeStarting, ""
		}
		return nil, placeNone, reason
	}
	if l.bySource[c.source] >= o.MaxStartupsPerSource {
		return overCap(c.source, refusedPerSource)
	}
	n := l.starting.Len()
	if n < o.MaxStartups.Start || n < o.MaxStartups.Full && rand.Float64() >= o.MaxStartups.waitChance(n) {
		l.add(c, placeStarting)
		return nil, placeStarting, ""
	}
	return overCap("", refusedStartups)
}

// add puts c in place p.
func (l *limits) add(c *heldConn, p place) {
	c.place = p
	if p == placeStarting {
		c.started = time.Now()
		c.elem = l.starting.PushBack(c)
		if l.bySource == nil {
			l.bySource = map[string]int{}
		}
		l.bySource[c.source]++
	} else {
		c.elem = l.queue.PushBack(c)
		c.admitted = make(chan struct{})
	}
	l.met.SSHStartups(l.starting.Len(), l.queue.Len())
}

// oldestSilent is the connection under way in its handshake the longest
// that has sent nothing, from source if it is not empty, and started
// before before if it is not zero; nil if there is none.
func (l *limits) oldestSilent(source string, before time.Time) *heldConn {
	for e := l.starting.Front(); e != nil; e = e.Next() {
		v := e.Value.(*heldConn)
		if (source == "" || v.source == source) && (before.IsZero() || v.started.Before(before)) && v.silent() {
			return v
		}
	}
	return nil
}

// takeOver gives c victim's place among the handshakes.
func (l *limits) takeOver(c, victim *heldConn) {
	l.remove(victim)
	l.add(c, placeStarting)
}

// remove takes c out of its place, and gives a freed handshake place to
// the connection waiting longest.
func (l *limits) remove(c *heldConn) {
	if c.place == placeNone {
		return
	}
	if c.place == placeStarting {
		l.starting.Remove(c.elem)
		dec(l.bySource, c.source)
	} else {
		l.queue.Remove(c.elem)
	}
	c.place, c.elem = placeNone, nil
	l.met.SSHStartups(l.starting.Len(), l.queue.Len())
}

// promote starts the handshakes of waiting connections, oldest first,
// while fewer than MaxStartups.Start are under way, skipping those whose
// address has MaxStartupsPerSource under way.
func (l *limits) promote(o *Options) {
	for e := l.queue.Front(); e != nil && l.starting.Len() < o.MaxStartups.Start; {
		w, next := e.Value.(*heldConn), e.Next()
		if l.bySource[w.source] < o.MaxStartupsPerSource {
			l.queue.Remove(e)
			w.place, w.elem, w.started = placeStarting, l.starting.PushBack(w), time.Now()
			l.bySource[w.source]++ // not nil: a connection waits only once others started
			close(w.admitted)
			l.met.SSHStartups(l.starting.Len(), l.queue.Len())
		}
		e = next
	}
}

// leave gives back c's place, whatever it is.
func (l *limits) leave(c *heldConn) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.remove(c)
	l.promote(&c.g.o)
}

// silentAge is how long a connection under way in its handshake must have
// sent nothing before a waiting client that speaks takes its place: a
// client sends its version within a round trip of connecting, or a
// moment later when its process is slow to be scheduled, not seconds
// later.
const silentAge = 2 * time.Second

// await waits, within StartupWait, for c to be given a place among the
// handshakes: "" once it was, refusedStartupWait when the wait ends
// first; false when the connection closed while it waited (the login
// grace, shutdown). While it waits, once its client has spoken, it takes
// the place of a connection that has sent nothing for silentAge, so that
// silent connections cannot keep a client that speaks waiting; and once
// its client hung up, it is closed, so that connections their sender
// already forgot cannot fill the queue.
func (c *heldConn) await() (string, bool) {
	l := &c.g.limits
	l.mu.Lock()
	admitted := c.admitted
	l.mu.Unlock()
	t := time.NewTimer(c.g.o.StartupWait)
	defer t.Stop()
	tick := time.NewTicker(silentAge / 4)
	defer tick.Stop()
wait:
	for {
		select {
		case <-admitted:
			break wait
		case <-c.done:
			break wait
		case <-t.C:
			break wait
		case <-tick.C:
			if c.hungUp() {
				// Its client gave up or was never there: it would hold
				// a place in the queue it cannot use until its wait
				// ends. The wait was the gateway's doing: no charge.
				c.g.log.Debug("ssh connection closed: its client hung up while it waited for a place", "remote", c.source)
				c.absolve()
				c.Close()
				break wait
			}
			if victim := l.jump(c); victim != nil {
				c.g.o.Metrics.SSHRefused(refusedSilent)
				c.g.log.Debug("ssh connection closed: it sent nothing, and its place went to a waiting one", "remote", victim.source)
				victim.absolve()
				victim.Close()
				break wait
			}
		}
	}
	c.mu.Lock()
	closed := c.closed
	c.mu.Unlock()
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case closed:
		return "", false
	case c.place == placeStarting:
		return "", true
	}
	return refusedStartupWait, true
}

// jump gives waiting c, if its client has spoken, the place of the oldest
// connection in its handshake that has sent nothing for silentAge (of its
// own address, when that address is at its cap), and returns that
// connection for the caller to close; nil when there is none.
func (l *limits) jump(c *heldConn) *heldConn {
	if c.silent() {
		return nil
	}
	o := &c.g.o
	l.mu.Lock()
	defer l.mu.Unlock()
	if c.place != placeWaiting {
		return nil
	}
	source := ""
	if l.bySource[c.source] >= o.MaxStartupsPerSource {
		source = c.source
	}
	victim := l.oldestSilent(source, time.Now().Add(-silentAge))
	if victim == nil {
		return nil
	}
	l.remove(c)
	l.takeOver(c, victim)
	close(c.admitted)
	return victim
}

// refuse tells a refused connection why, where the protocol lets it, and
// closes it: a line before the gateway's version, which RFC 4253 allows
// and newer OpenSSH clients print, then the version and an
// SSH_MSG_DISCONNECT in the clear, which every OpenSSH client prints as
// "Received disconnect". It then reads what the client sent until it
// closes, for at most refusalLinger, since closing with unread data would
// reset the connection before the client read the reason. Past
// maxRefusing refusals at once, it closes without a word.
func (g *Gateway) refuse(raw net.Conn, reason, why string) {
	g.o.Metrics.SSHRefused(reason)
	g.log.Debug("ssh connection refused", "remote", raw.RemoteAddr().String(), "reason", reason)
	l := &g.limits
	l.mu.Lock()
	room := l.refusing < maxRefusing
	if room {
		l.refusing++
	}
	l.mu.Unlock()
	if !room {
		raw.Close()
		return
	}
	defer func() {
		l.mu.Lock()
		l.refusing--
		l.mu.Unlock()
	}()
	msg := "hiloop: " + why
	out := []byte(msg + "\r\nSSH-2.0-" + g.srv.Version + "\r\n")
	out = append(out, disconnectPacket(msg)...)
	raw.SetDeadline(time.Now().Add(refusalLinger))
	if _, err := raw.Write(out); err == nil {
		if cw, ok := raw.(interface{ CloseWrite() error }); ok {
			cw.CloseWrite()
		}
		io.Copy(io.Discard, io.LimitReader(raw, refusalMaxRead))
	}
	raw.Close()
}

// disconnectPacket is an SSH_MSG_DISCONNECT (reason 2, protocol error, as
// sshd's refusals) in an unencrypted binary packet, as it may be sent
// before the key exchange.
func disconnectPacket(msg string) []byte {
	payload := []byte{1} // SSH_MSG_DISCONNECT
	payload = binary.BigEndian.AppendUint32(payload, 2)
	payload = binary.BigEndian.AppendUint32(payload, uint32(len(msg)))
	payload = append(payload, msg...)
	payload = binary.BigEndian.AppendUint32(payload, 0) // language tag
	pad := 8 - (5+len(payload))%8
	if pad < 4 {
		pad += 8
	}
	p := binary.BigEndian.AppendUint32(nil, uint32(1+len(payload)+pad))
	p = append(p, byte(pad))
	p = append(p, payload...)
	return append(p, make([]byte, pad)...)
}

// penalised reports whether source is refused now, and for how long yet.
func (l *limits) penalised(source string, now time.Time) (time.Duration, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	p := l.penalties[source]
	if p == nil {
		return 0, false
	}
	if !p.until.After(now) {
		delete(l.penalties, source)
		return 0, false
	}
	return p.until.Sub(now), p.active
}

// charge adds d to what source owes, and reports whether that made it
// penalised.
func (l *limits) charge(o *Penalties, source string, d time.Duration, now time.Time) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	p := l.penalties[source]
	if p == nil {
		if len(l.penalties) >= o.MaxSources && now.Sub(l.swept) >= time.Second {
			// At most once a second, so that a full table of live
			// penalties does not make every charge a walk of it.
			l.swept = now
			for s, q := range l.penalties {
				if !q.until.After(now) {
					delete(l.penalties, s)
				}
			}
		}
		if len(l.penalties) >= o.MaxSources {
			return false
		}
		if l.penalties == nil {
			l.penalties = map[string]*penalty{}
		}
		p = &penalty{}
		l.penalties[source] = p
	}
	from := now
	if p.until.After(now) {
		from = p.until
	} else {
		p.charged, p.active = 0, false
	}
	p.until = from.Add(d)
	p.charged += d
	if limit := now.Add(o.Max); p.until.After(limit) {
		p.until = limit
	}
	// What was charged, not what is left of it: three charges of 5s, each
	// before the last ran out, reach a minimum of 15s.
	if !p.active && p.charged >= o.Min {
		p.active = true
		return true
	}
	return false
}

// absolve marks that the gateway, not the client, ends the connection:
// should it close before it authenticates, its source is not charged.
func (c *heldConn) absolve() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.blameless = true
}

// penalise charges c's source for a connection that closed before it
// authenticated, by what it did.
func (c *heldConn) penalise(graceOver bool) {
	o := &c.g.o.Penalties
	if o.Off {
		return
	}
	kind, d := penaltyNoAuth, o.NoAuth
	switch {
	case graceOver:
		kind, d = penaltyGrace, o.GraceExceeded
	case c.authFailed.Load():
		kind, d = penaltyAuthFail, o.AuthFail
	}
	if d == 0 {
		return
	}
	c.g.o.Metrics.SSHPenalty(kind)
	if c.g.limits.charge(o, c.source, d, c.g.o.Now()) {
		c.g.log.Info("ssh source penalised: its connections failed or stalled before they authenticated", "remote", c.source, "last", kind)
	}
}

// failed is the server's ConnectionFailedCallback: a handshake that broke
// the protocol charges its source a crash. x/crypto has closed the
// connection by then, so the charge cannot wait for Close.
func (g *Gateway) failed(conn net.Conn, err error) {
	g.log.Debug("handshake failed", "remote", conn.RemoteAddr().String(), "err", err)
	o := &g.o.Penalties
	if o.Off || o.Crash == 0 || !protocolError(err) || g.served.isClosing() {
		return
	}
	source := control.Source(conn.RemoteAddr().String())
	g.o.Metrics.SSHPenalty(penaltyCrash)
	if g.limits.charge(o, source, o.Crash, g.o.Now()) {
		g.log.Info("ssh source penalised: its handshake broke the protocol", "remote", source)
	}
}

// protocolError reports whether a failed handshake broke the protocol, as
// opposed to ending: the client closed or reset the connection, sent a
// disconnect, failed to authenticate, or shares no algorithm with the
// gateway (an old client, not an attack).
func protocolError(err error) bool {
	var auth *gossh.ServerAuthError
	var algo *gossh.AlgorithmNegotiationError
	var ne net.Error
	switch {
	case err == nil, errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, net.ErrClosed),
		errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE), errors.As(err, &auth), errors.As(err, &algo),
		errors.As(err, &ne) && ne.Timeout():
		return false
	}
	return !strings.Contains(err.Error(), "ssh: disconnect")
}

// stopGrace stops c's login grace, for a connection the gateway is
// refusing, which closes it within refusalLinger.
func (c *heldConn) stopGrace() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.grace != nil {
		c.grace.Stop()
		c.grace = nil
	}
}

// loggingIn reports whether c has not yet authenticated and is open.
func (c *heldConn) loggingIn() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.grace != nil
}

// connKey keeps a connection's *heldConn in its ssh.Context.
type connKey struct{}

// overGrace closes a connection that has not authenticated within the
// login grace. One that waited in the queue all along is not to blame.
func (c *heldConn) overGrace() {
	c.mu.Lock()
	late := c.grace != nil
	c.graceOver = late
	c.mu.Unlock()
	if !late {
		return
	}
	c.g.limits.mu.Lock()
	started := c.place == placeStarting
	c.g.limits.mu.Unlock()
	if !started {
		c.absolve()
	}
	c.g.o.Metrics.SSHRefused(refusedGrace)
	c.g.log.Info("ssh connection closed: not authenticated within the login grace", "remote", c.source, "grace", c.g.o.LoginGrace)
	c.Close()
}

// wait takes a place with take, waiting for one to be given back within
// StartupWait, or until the connection closes: take's error when no place
// came in time.
func (c *heldConn) wait(take func() (bool, error)) error {
	l := &c.g.limits
	var t *time.Timer
	for {
		l.mu.Lock()
		ok, err := take()
		if l.freed == nil {
			l.freed = make(chan struct{})
		}
		freed := l.freed
		l.mu.Unlock()
		if ok || err == nil {
			return err
		}
		if t == nil {
			t = time.NewTimer(c.g.o.StartupWait)
			defer t.Stop()
		}
		select {
		case <-freed:
		case <-t.C:
			return err
		case <-c.done:
			return err
		}
	}
}

// free wakes the logins waiting for a key's or an organization's place.
// l.mu is held.
func (l *limits) free() {
	if l.freed != nil {
		close(l.freed)
		l.freed = nil
	}
}

// takeKey takes a place among the connections of the key with
// fingerprint fp, before the key is checked: a connection past
// MaxConnsPerKey costs the core nothing. Past it, it waits within
// StartupWait for a place, and fails with errPerKey; it fails at once when
// the connection closed or already holds a place.
func (c *heldConn) takeKey(fp string) error {
	return c.take(&c.key, fp, func(l *limits) *map[string]int { return &l.byKey }, c.g.o.MaxConnsPerKey, errPerKey)
}

// take takes a place for k in the counts of limits that m picks, within
// max, waiting for one as wait does, and records k in *held; full is the
// error past max.
func (c *heldConn) take(held *string, k string, m func(*limits) *map[string]int, max int, full error) error {
	l := &c.g.limits
	c.mu.Lock()
	busy := c.closed || *held != "" || k == ""
	c.mu.Unlock()
	if busy {
		return errors.New("the connection is closed or already authenticating")
	}
	err := c.wait(func() (bool, error) {
		counts := m(l)
		if (*counts)[k] >= max {
			return false, full
		}
		if *counts == nil {
			*counts = map[string]int{}
		}
		(*counts)[k]++
		return true, nil
	})
	if err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		// Close ran while the place was taken and did not see it.
		l.mu.Lock()
		dec(*m(l), k)
		l.free()
		l.mu.Unlock()
		return errors.New("the connection is closed")
	}
	*held = k
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
	l.free()
	c.key = ""
}

// takeOrg takes a place among the connections of the organization the
// connection authenticates as, once its key was checked: the cap per key
// would otherwise be multiplied by the organization's keys. Past
// MaxConnsPerOrg it waits within StartupWait for a place, and fails with
// errPerOrg; it fails at once when the connection closed or already holds
// a place.
func (c *heldConn) takeOrg(org string) error {
	return c.take(&c.org, org, func(l *limits) *map[string]int { return &l.byOrg }, c.g.o.MaxConnsPerOrg, errPerOrg)
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
	l.free()
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
	l.remove(c)
	l.promote(&c.g.o)
	return nil
}

// Close closes the connection and gives back what it held against the
// caps; one that closes before it authenticated charges its source, unless
// the gateway ended it. It is safe to call more than once.
func (c *heldConn) Close() error {
	err := c.Conn.Close()
	l := &c.g.limits
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return err
	}
	c.closed = true
	close(c.done)
	loggingIn := c.grace != nil
	blamed, graceOver := loggingIn && !c.blameless, c.graceOver
	if loggingIn {
		c.grace.Stop()
		c.grace = nil
	}
	l.mu.Lock()
	l.remove(c)
	l.promote(&c.g.o)
	if c.key != "" || c.org != "" {
		dec(l.byKey, c.key)
		dec(l.byOrg, c.org)
		l.free()
	}
	l.mu.Unlock()
	c.mu.Unlock()
	c.g.served.remove(c)
	if blamed && !c.g.served.isClosing() {
		c.penalise(graceOver)
	}
	return err
}

func dec(m map[string]int, k string) {
	if k == "" {
		return
	}
	if m[k] <= 1 {
		delete(m, k)
		return
	}
	m[k]--
}

// guard makes a successful key verification in cfg also the end of the
// connection's login grace, within MaxConnsPerKey, and the start of its
// keepalives: an authenticated connection is checked whether or not it ever
// opens a channel. It also marks a connection whose client tried a key or
// method that failed, for its penalty should it never authenticate.
func (g *Gateway) guard(ctx ssh.Context, cfg *gossh.ServerConfig) {
	c, _ := ctx.Value(connKey{}).(*heldConn)
	verified := cfg.VerifiedPublicKeyCallback
	if c == nil || verified == nil {
		return
	}
	cfg.AuthLogCallback = func(_ gossh.ConnMetadata, method string, err error) {
		if err != nil && method != "none" {
			c.authFailed.Store(true)
		}
	}
	cfg.VerifiedPublicKeyCallback = func(md gossh.ConnMetadata, key gossh.PublicKey, perms *gossh.Permissions, algo string) (*gossh.Permissions, error) {
		fp := gossh.FingerprintSHA256(key)
		if err := c.takeKey(fp); err != nil {
			if errors.Is(err, errPerKey) {
				c.absolve()
				g.o.Metrics.SSHRefused(refusedPerKey)
				g.log.Info("ssh login refused: too many connections for the key", "fingerprint", fp, "max", g.o.MaxConnsPerKey)
				return nil, &gossh.BannerError{Err: err, Message: fmt.Sprintf("hiloop: too many connections for this key (--ssh-max-conns-per-key %d); waited %s\r\n", g.o.MaxConnsPerKey, g.o.StartupWait)}
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
