package control

import (
	"context"
	"errors"
	"maps"
	"slices"
	"sync"

	"github.com/hiloop/hiloop/store"
)

// Conn is one authenticated connection that can open sessions for as long
// as it stays open: an SSH connection, whose client opens a new session
// channel whenever it likes (OpenSSH's ControlMaster keeps one open for
// exactly that). It is registered under the key that authenticated it and
// the sandbox it is for, so that whatever ends that key's or that sandbox's
// sessions closes the connection too: a connection that outlived its key
// would be a way in that no longer answers to anyone.
type Conn struct {
	OrgID     string
	KeyID     string
	SandboxID string

	c      *Control
	hangUp func(cause error)
	once   sync.Once
}

// Connect registers a connection that who authenticated for sandbox id.
// hangUp closes the connection, for cause (ErrKeyRevoked, ErrSandboxChanged
// or ErrShuttingDown); it is called at most once and must not block. The
// connection is closed when its key is revoked or deleted (through control
// at once, offline within one SweepInterval), when its sandbox is stopped or
// deleted through control, when the sweep finds the sandbox quarantined,
// gone or being deleted, and at Close. The caller must Release the
// connection once it has closed.
//
// Connect fails with ErrUnauthenticated when who's key is no longer live
// and with ErrShuttingDown after Close. It registers before it looks at the
// key, so a revoke that lands in between still finds the connection.
func (c *Control) Connect(ctx context.Context, who Caller, id string, hangUp func(cause error)) (*Conn, error) {
	k := &Conn{OrgID: who.OrgID, KeyID: who.KeyID, SandboxID: id, c: c, hangUp: hangUp}
	if !c.conns.add(k) {
		return nil, ErrShuttingDown
	}
	if err := c.keyLive(ctx, who); err != nil {
		k.Release()
		return nil, err
	}
	return k, nil
}

// Release unregisters the connection. It is safe to call more than once.
func (k *Conn) Release() { k.c.conns.remove(k) }

// close hangs the connection up, once.
func (k *Conn) close(cause error) {
	k.once.Do(func() { k.hangUp(cause) })
}

// Connections is the number of registered connections.
func (c *Control) Connections() int { return c.conns.count() }

// keyLive is nil when who names a live key of its organization, and, if it
// names a preview, a preview of its organization that works now, as the
// record says now: ErrUnauthenticated when the key was revoked or deleted,
// when who names no organization, no key or a key of no known kind, or
// when its preview was revoked or expired.
func (c *Control) keyLive(ctx context.Context, who Caller) error {
	live, err := c.o.Store.KeyLive(ctx, who.OrgID, who.KeyID)
	switch {
	case err != nil:
		return err
	case !live:
		return ErrUnauthenticated
	}
	return c.previewLive(ctx, who)
}

// end ends the live sessions and closes the registered connections whose
// key and sandbox match, with cause.
func (c *Control) end(cause error, match func(keyID, sandboxID string) bool) {
	c.endSessions(cause, match)
	for _, k := range c.conns.list() {
		if match(k.KeyID, k.SandboxID) {
			k.close(cause)
		}
	}
}

// endSessions ends the live sessions whose key and sandbox match, with
// cause, and leaves the connections open.
func (c *Control) endSessions(cause error, match func(keyID, sandboxID string) bool) {
	c.ends.Add(1)
	for _, s := range c.sessions.list() {
		if match(s.KeyID, s.SandboxID) {
			s.cancel(cause)
		}
	}
}

// holdsConn reports whether a connection for sb may stay open. A stopped
// or starting sandbox keeps one (its sessions are refused, with what to
// do, until it runs); a quarantined sandbox, a record that is gone or
// terminal, or a delete under way does not.
func holdsConn(sb store.Sandbox) bool {
	return sb.State != store.StateQuarantined && !sb.State.Terminal() && sb.DesiredMode != store.ModeDeleted
}

// sweep holds the live sessions and the registered connections to the
// record as it stands now, which another process may have changed (a
// revoke offline) and the mirror does change (a quarantine, a sandbox that
// stopped or vanished): it ends the sessions whose key is no longer live
// or whose sandbox is no longer reachable, and closes the connections whose
// key is no longer live or whose sandbox may no longer hold one.
func (c *Control) sweep(ctx context.Context) {
	sessions, conns := c.sessions.list(), c.conns.list()
	if len(sessions) == 0 && len(conns) == 0 {
		return
	}
	keys := map[Caller]bool{}
	records := map[string]store.Sandbox{}
	gone := map[string]bool{}
	// why is ErrKeyRevoked when who's key is no longer live,
	// ErrSandboxChanged when sandbox id is gone, another organization's,
	// or not held by holds, else nil. A read error is no verdict.
	why := func(who Caller, id string, holds func(store.Sandbox) bool) error {
		live, ok := keys[who]
		if !ok {
			live = true
			switch err := c.keyLive(ctx, who); {
			case errors.Is(err, ErrUnauthenticated):
				live = false
			case err != nil && ctx.Err() == nil:
				c.log.Warn("sweep: read key", "key", who.KeyID, "preview", who.Preview, "err", err)
			}
			keys[who] = live
		}
		if !live {
			return ErrKeyRevoked
		}
		sb, read := records[id]
		if !read && !gone[id] {
			var err error
			sb, err = c.o.Store.SandboxAnyOrg(ctx, id)
			switch {
			case err == nil:
				records[id], read = sb, true
			case errors.Is(err, store.ErrNotFound):
				gone[id] = true
			}
		}
		if gone[id] || read && (sb.OrgID != who.OrgID || !holds(sb)) {
			return ErrSandboxChanged
		}
		return nil
	}
	running := func(sb store.Sandbox) bool { return reachable(sb) == nil }
	for _, s := range sessions {
		if err := why(Caller{OrgID: s.OrgID, KeyID: s.KeyID, Preview: s.Preview}, s.SandboxID, running); err != nil {
			s.cancel(err)
		}
	}
	for _, k := range conns {
		if err := why(Caller{OrgID: k.OrgID, KeyID: k.KeyID}, k.SandboxID, holdsConn); err != nil {
			k.close(err)
		}
	}
}

// connRegistry holds the registered connections. Once closed (at Close) it
// registers none.
type connRegistry struct {
	mu     sync.Mutex
	live   map[*Conn]bool
	closed bool
}

// add registers k; false once the registry is closed.
func (r *connRegistry) add(k *Conn) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return false
	}
	if r.live == nil {
		r.live = map[*Conn]bool{}
	}
	r.live[k] = true
	return true
}

func (r *connRegistry) remove(k *Conn) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.live, k)
}

func (r *connRegistry) list() []*Conn {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Collect(maps.Keys(r.live))
}

// close stops registering.
func (r *connRegistry) close() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.closed = true
}

func (r *connRegistry) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.live)
}
