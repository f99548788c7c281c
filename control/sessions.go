package control

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"

	"github.com/hiloop/hiloop/cluster"
	"github.com/hiloop/hiloop/receipt"
	"github.com/hiloop/hiloop/store"
)

// Session is one live way into a sandbox: an exec stream, a one-shot exec,
// or (through the SSH gateway) a shell. Its context ends when the session
// must end: its key was revoked, its sandbox stopped, was deleted or
// quarantined, or hiloop is shutting down. context.Cause says which.
type Session struct {
	SandboxID string
	OrgID     string
	KeyID     string
	// Preview is the preview the session came through, if any.
	Preview string
	// Transport is the way in.
	Transport receipt.Transport

	ctx    context.Context
	cancel context.CancelCauseFunc
	c      *Control
	once   sync.Once
	// in and out count the bytes moved through In and Out, reported to the
	// metrics when the session ends.
	in, out atomic.Int64
	// release ends the session's use of its sandbox (see hold); nil for a
	// forward session, whose channels count instead (Use).
	release func()
}

// In wraps the stream into the sandbox, so the bytes read through it count
// as the session's, in.
func (s *Session) In(r io.Reader) io.Reader { return &counted{r: r, n: &s.in} }

// Out wraps the stream out of the sandbox, so the bytes written through it
// count as the session's, out.
func (s *Session) Out(w io.Writer) io.Writer { return &counted{w: w, n: &s.out} }

// Moved reports bytes the session moved other than through In and Out (a
// forwarded channel that ended, a one-shot command's buffers).
func (s *Session) Moved(in, out int64) {
	s.c.o.Metrics.SessionBytes(string(s.Transport), "in", in)
	s.c.o.Metrics.SessionBytes(string(s.Transport), "out", out)
}

// counted counts the bytes read from r or written to w into n.
type counted struct {
	r io.Reader
	w io.Writer
	n *atomic.Int64
}

func (c *counted) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n.Add(int64(n))
	return n, err
}

func (c *counted) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n.Add(int64(n))
	return n, err
}

// End releases the session's slot. It is safe to call more than once.
func (s *Session) End() {
	s.once.Do(func() {
		s.cancel(context.Canceled)
		s.c.sessions.remove(s)
		if s.release != nil {
			s.release()
		}
		s.Moved(s.in.Load(), s.out.Load())
	})
}

// Admit checks that the caller may reach into a sandbox now (it is the
// caller's organization's, not quarantined, and running) and takes a
// session slot within the per-sandbox and per-organization limits. The
// session's context derives from ctx. The caller must End it. Until then
// an exec or ssh session counts as use of the sandbox, which keeps it from
// being stopped for idleness; it is refused with a *StateError while such a
// stop is under way.
func (c *Control) Admit(ctx context.Context, who Caller, id string, transport receipt.Transport) (*Session, error) {
	return c.admitSession(ctx, who, id, transport, transport != receipt.TransportForward)
}

// admitSession is Admit, with use saying whether the session counts as use of
// the sandbox: a look at its processes' state does not (see processes.go).
func (c *Control) admitSession(ctx context.Context, who Caller, id string, transport receipt.Transport, use bool) (*Session, error) {
	if c.o.Exec == nil && transport != receipt.TransportForward {
		return nil, ErrNoExec
	}
	ends := c.ends.Load()
	if err := c.Reachable(ctx, who, id, transport); err != nil {
		return nil, err
	}
	var release func()
	if use {
		var ok bool
		if release, ok = c.hold(id); !ok {
			return nil, idleStopping()
		}
	}
	sctx, cancel := context.WithCancelCause(ctx)
	s := &Session{SandboxID: id, OrgID: who.OrgID, KeyID: who.KeyID, Preview: who.Preview, Transport: transport, ctx: sctx, cancel: cancel, c: c, release: release}
	if err := c.sessions.add(s, c.o.Limits); err != nil {
		var le *limitError
		if errors.As(err, &le) {
			c.o.Metrics.SessionRefused(le.scope)
		}
		cancel(err)
		if release != nil {
			release()
		}
		return nil, err
	}
	// A revoke, stop or delete that ended sessions between the check and
	// the slot did not see this one: ask again.
	if c.ends.Load() != ends {
		if err := c.Reachable(ctx, who, id, transport); err != nil {
			s.End()
			return nil, err
		}
	}
	// Shutdown ends every session, even one whose ctx is detached.
	stop := context.AfterFunc(c.base, func() { cancel(ErrShuttingDown) })
	context.AfterFunc(sctx, func() { stop() })
	return s, nil
}

// Reachable reports whether the caller may reach into a sandbox now through
// transport, as Admit checks it, without taking a session slot:
// store.ErrNotFound, ErrQuarantined, a *StateError, a *TransportError, or
// nil.
func (c *Control) Reachable(ctx context.Context, who Caller, id string, transport receipt.Transport) error {
	// The key first: a connection outlives the moment it authenticated,
	// so every session and channel it opens asks again.
	if err := c.keyLive(ctx, who); err != nil {
		return err
	}
	sb, err := c.o.Store.Sandbox(ctx, who.OrgID, id)
	if err != nil {
		return err
	}
	if err := reachable(sb); err != nil {
		return err
	}
	if !receipt.Record(sb.Receipt).Has(transport) {
		return &TransportError{Transport: transport}
	}
	return nil
}

// HelperAddr is where the session's sandbox's helper listens and the uid of
// the pod it runs in. The pod is the one the mirror last observed for the
// record, asked of the cluster now, and its address is used only while it
// is Running and Ready: anything else is ErrPodNotServing, with the reason.
func (c *Control) HelperAddr(ctx context.Context, s *Session) (addr, podUID string, err error) {
	sb, err := c.o.Store.SandboxAnyOrg(ctx, s.SandboxID)
	if err != nil {
		return "", "", err
	}
	port := receipt.Record(sb.Receipt).SessionPort
	if port == 0 {
		return "", "", &TransportError{Transport: receipt.TransportForward}
	}
	cctx, cancel := c.clusterCtx()
	defer cancel()
	ip, err := c.o.Cluster.PodAddr(cctx, s.SandboxID, sb.PodUID)
	var pe *cluster.PodNotServingError
	if errors.As(err, &pe) {
		return "", "", fmt.Errorf("%w: %s", ErrPodNotServing, pe.Reason)
	}
	if err != nil {
		return "", "", c.clusterFailed("get", err)
	}
	return net.JoinHostPort(ip, strconv.Itoa(port)), sb.PodUID, nil
}

// reachable reports whether exec and sessions may reach a sandbox.
func reachable(sb store.Sandbox) error {
	switch {
	case sb.State == store.StateQuarantined:
		return ErrQuarantined
	case sb.State != store.StateRunning || sb.DesiredMode != store.ModeRunning:
		return stateError(sb)
	}
	return nil
}

// registry holds the live sessions and their counts per sandbox and per
// organization. Counts drop to no entry at zero, so it stays bounded by what
// is live.
type registry struct {
	mu        sync.Mutex
	live      map[*Session]bool
	bySandbox map[string]int
	byOrg     map[string]int
	idle      *sync.Cond
}

func (r *registry) init() {
	r.live, r.bySandbox, r.byOrg = map[*Session]bool{}, map[string]int{}, map[string]int{}
	r.idle = sync.NewCond(&r.mu)
}

func (r *registry) add(s *Session, lim Limits) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.bySandbox[s.SandboxID] >= lim.PerSandbox {
		return &limitError{scope: "sandbox", max: lim.PerSandbox}
	}
	if r.byOrg[s.OrgID] >= lim.PerOrg {
		return &limitError{scope: "organization", max: lim.PerOrg}
	}
	r.live[s] = true
	r.bySandbox[s.SandboxID]++
	r.byOrg[s.OrgID]++
	return nil
}

// limitError is a session refused at a limit, which it names with the
// flag that sets it.
type limitError struct {
	scope string // "sandbox" or "organization"
	max   int
}

func (e *limitError) Error() string {
	flag := "--exec-per-sandbox"
	if e.scope == "organization" {
		flag = "--exec-per-org"
	}
	return fmt.Sprintf("%s: at most %d sessions per %s (%s)", ErrSessionLimit, e.max, e.scope, flag)
}

func (e *limitError) Unwrap() error { return ErrSessionLimit }

// OrgSessions is what an organization has open against the session
// limits: its live sessions, and those of its sandbox that has the most.
func (c *Control) OrgSessions(org string) (open, busiestSandbox int) {
	r := &c.sessions
	r.mu.Lock()
	defer r.mu.Unlock()
	for s := range r.live {
		if s.OrgID == org {
			busiestSandbox = max(busiestSandbox, r.bySandbox[s.SandboxID])
		}
	}
	return r.byOrg[org], busiestSandbox
}

// SessionsBusiest counts the live sessions of the sandbox and of the
// organization that have the most, for the metrics.
func (c *Control) SessionsBusiest() (sandbox, org int) {
	r := &c.sessions
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, n := range r.bySandbox {
		sandbox = max(sandbox, n)
	}
	for _, n := range r.byOrg {
		org = max(org, n)
	}
	return sandbox, org
}

// SessionLimits are the most live sessions per sandbox and per
// organization.
func (c *Control) SessionLimits() (perSandbox, perOrg int) {
	return c.o.Limits.PerSandbox, c.o.Limits.PerOrg
}

func (r *registry) remove(s *Session) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.live[s] {
		return
	}
	delete(r.live, s)
	dec(r.bySandbox, s.SandboxID)
	dec(r.byOrg, s.OrgID)
	if len(r.live) == 0 {
		r.idle.Broadcast()
	}
}

func dec(m map[string]int, k string) {
	if m[k] <= 1 {
		delete(m, k)
		return
	}
	m[k]--
}

func (r *registry) list() []*Session {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Collect(maps.Keys(r.live))
}

func (r *registry) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.live)
}

// wait blocks until no session is live.
func (r *registry) wait() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for len(r.live) > 0 {
		r.idle.Wait()
	}
}

// Sessions is the number of live sessions.
func (c *Control) Sessions() int { return c.sessions.count() }
