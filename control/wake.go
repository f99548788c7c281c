package control

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/hiloop/hiloop/receipt"
	"github.com/hiloop/hiloop/store"
)

// WakeOptions say how a caller reaches into a sandbox it may wake.
type WakeOptions struct {
	// Transport is the way in; a sandbox without it is not woken.
	Transport receipt.Transport
	// Trigger names the way in for the metrics (ssh, forward, exec,
	// files); the transport's name when empty.
	Trigger string
	// Waking, when set, is called once when the caller begins to wait
	// for a sandbox that is not running yet (the gateway prints a line),
	// beside the wait: Wake returns after it returned, or once the
	// caller's context ended.
	Waking func()
}

// Wake makes sure one of the caller's organization's sandboxes runs, for a
// caller about to reach into it through o.Transport: a sandbox stopped for
// idleness is started through the same path as a user's start (admission,
// the boundary check and the running quota apply) and waited for, up to
// WakeTimeout; one still starting is waited for. Concurrent wakes of one
// sandbox make one start, and each gets its outcome. Anything else that is
// not running is refused as Reachable refuses it (a sandbox its owner
// stopped is not woken), and a wait that times out is a
// *WakeTimeoutError. The caller's key and organization are checked at
// every call; the caller admits its session afterwards (AdmitWaking).
//
// A call that waits holds one of its key's Limits.WakeWaitsPerKey places
// and one of its organization's Limits.WakeWaitsPerOrg until its wait ends;
// past either it is refused at once with a *WaitLimitError and starts
// nothing. A call that finds the sandbox running holds none.
func (c *Control) Wake(ctx context.Context, who Caller, id string, o WakeOptions) error {
	if err := c.keyLive(ctx, who); err != nil {
		return err
	}
	// A wake under way is joined whatever the record shows meanwhile (see
	// waitRunning): one under way before the read, one begun during it, or
	// one under way after it. Checked after the read alone, a wake that
	// began before it and ended just after would be missed, and the stale
	// record it read refused.
	wasWaking, begun := c.wakingNow(id), c.wakesBegun.Load()
	sb, err := c.o.Store.Sandbox(ctx, who.OrgID, id)
	if err != nil {
		return err
	}
	if !receipt.Record(sb.Receipt).Has(o.Transport) {
		return &TransportError{Transport: o.Transport}
	}
	joins := wakeable(sb) || wasWaking || c.wakingNow(id)
	if err := reachable(sb); err == nil || !joins && c.wakesBegun.Load() == begun {
		return err
	}
	trigger := o.Trigger
	if trigger == "" {
		trigger = string(o.Transport)
	}
	// From here on the call waits: it holds one of its key's and its
	// organization's places until the wait ends, however it ends.
	release, refused := c.waits.take(who, c.o.Limits)
	if refused != nil {
		c.o.Metrics.WakeWaitRefused(trigger, refused.limit())
		return refused
	}
	// Waking is the caller's own output, which its client may never take
	// (an SSH channel whose window stays shut): it runs beside the wait,
	// neither holding the place nor holding the wake back, and the call
	// returns once it did, or once the caller went away, so the caller's
	// next output comes after it. A wake begun during the read, maybe of
	// another sandbox, is asked (startIdle reads the record again) but not
	// announced.
	announced := make(chan struct{})
	if joins && o.Waking != nil {
		go func() {
			defer close(announced)
			o.Waking()
		}()
	} else {
		close(announced)
	}
	defer func() {
		release()
		c.o.Metrics.WakeWaiting(-1)
		select {
		case <-announced:
		case <-ctx.Done():
		}
	}()
	c.o.Metrics.WakeWaiting(1)
	ch := c.wakes.DoChan(id, func() (any, error) { return nil, c.wake(id, trigger) })
	select {
	case r := <-ch:
		return r.Err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// wakeTries bounds how often UseWaking tries a use of a sandbox that an
// idle stop raced.
const wakeTries = 3

// UseWaking is the one wake-and-retry of every way in. It calls use, what
// the caller does with the sandbox (admit a session, take a use of a
// session it holds); when use reports that the sandbox was not running for
// it, or stopped for idleness under it (raced), the sandbox is handed to
// Wake, which starts it or says why not, and use is called again, up to
// wakeTries calls in all. The last use's error, or Wake's refusal, is
// returned. o.Waking is called at most once over every wake.
func (c *Control) UseWaking(ctx context.Context, who Caller, id string, o WakeOptions, use func() (raced bool, err error)) error {
	if o.Waking != nil {
		o.Waking = sync.OnceFunc(o.Waking)
	}
	for try := 1; ; try++ {
		raced, err := use()
		if !raced || try == wakeTries {
			return err
		}
		if err := c.Wake(ctx, who, id, o); err != nil {
			return err
		}
	}
}

// AdmitWaking is Admit for a caller who may wake the sandbox (ssh, ssh -L,
// exec with wake=true): a sandbox that is not running is handed to Wake
// (UseWaking) and admitted once it runs. An idle stop that lands in
// between is woken from again. A running sandbox costs nothing more than
// Admit.
func (c *Control) AdmitWaking(ctx context.Context, who Caller, id string, o WakeOptions) (*Session, error) {
	var s *Session
	err := c.UseWaking(ctx, who, id, o, func() (bool, error) {
		var err error
		s, err = c.Admit(ctx, who, id, o.Transport)
		var se *StateError
		return errors.As(err, &se), err
	})
	return s, err
}

// wakeable reports whether a wake would bring sb up: it was stopped for
// idleness and nothing else was asked since, or it was asked to run and is
// on its way (starting, or still stopped while the start is not yet
// observed: observed stopped after the start, it is marked ModeOutside).
func wakeable(sb store.Sandbox) bool {
	down := sb.State == store.StateStopping || sb.State == store.StateStopped
	switch {
	case sb.IdleStopped():
		return down || sb.State == store.StateRunning
	case sb.DesiredMode == store.ModeRunning && !sb.ModeOutside:
		return down || sb.State == store.StatePending || sb.State == store.StateStarting
	}
	return false
}

// wakingNow reports whether a wake of sandbox id is under way.
func (c *Control) wakingNow(id string) bool {
	_, ok := c.waking.Load(id)
	return ok
}

// starting reports whether sb, asked to run, may still come up.
func starting(sb store.Sandbox) bool {
	switch sb.State {
	case store.StatePending, store.StateStarting, store.StateStopping, store.StateStopped:
		return sb.DesiredMode == store.ModeRunning
	}
	return false
}

// wake is the one wake of a sandbox that its concurrent callers share: it
// starts the sandbox if it is still stopped for idleness and waits up to
// WakeTimeout for it to run, detached from any one caller.
func (c *Control) wake(id, trigger string) error {
	c.wakesBegun.Add(1)
	c.waking.Store(id, true)
	defer c.waking.Delete(id)
	ctx, cancel := context.WithTimeout(c.base, c.o.WakeTimeout)
	defer cancel()
	begun := c.o.Now()
	started, err := c.startIdle(ctx, id)
	if err != nil {
		return c.timedOut(ctx, id, err)
	}
	if started {
		c.o.Metrics.Wake(trigger)
		c.log.Info("waking an idle sandbox", "sandbox", id, "trigger", trigger)
	}
	if err := c.waitRunning(ctx, id); err != nil {
		if started {
			c.log.Warn("wake did not bring the sandbox up", "sandbox", id, "err", err)
		}
		return c.timedOut(ctx, id, err)
	}
	if started {
		c.o.Metrics.WakeTime(c.o.Now().Sub(begun))
	}
	return nil
}

// timedOut is err, or ErrShuttingDown once hiloop began to shut down
// (which cancels the step under way), or, when wake's deadline passed in
// the middle of a step (a write of the record or to the cluster, a read,
// which fail each in their own words), the *WakeTimeoutError that means,
// with the state the record holds: a wake that ran out of time says so
// whichever step it was in.
func (c *Control) timedOut(ctx context.Context, id string, err error) error {
	var we *WakeTimeoutError
	if c.base.Err() != nil {
		return ErrShuttingDown
	}
	if ctx.Err() != context.DeadlineExceeded || errors.As(err, &we) {
		return err
	}
	rctx, cancel := context.WithTimeout(c.base, 10*time.Second)
	defer cancel()
	sb, rerr := c.o.Store.SandboxAnyOrg(rctx, id)
	if rerr != nil {
		return err
	}
	return &WakeTimeoutError{State: sb.State, After: c.o.WakeTimeout}
}

// startIdle starts a sandbox stopped for idleness, with its lock held and
// its record read again, reporting whether it did. One that is already
// running or starting needs nothing; anything else is refused.
func (c *Control) startIdle(ctx context.Context, id string) (bool, error) {
	unlock := c.locks.lock(id)
	defer unlock()
	rec, err := c.o.Store.SandboxAnyOrg(ctx, id)
	if err != nil {
		return false, err
	}
	if !rec.IdleStopped() || !wakeable(rec) {
		if reachable(rec) == nil || wakeable(rec) {
			return false, nil
		}
		return false, reachable(rec)
	}
	if err := c.Hardened(); err != nil {
		return false, err
	}
	if _, err := c.setMode(ctx, rec.OrgID, id, store.ModeRunning, ""); err != nil {
		return false, err
	}
	return true, nil
}

// waitRunning waits until the record says the sandbox runs, until it is in
// a state it will not run from, or until ctx ends: a *WakeTimeoutError
// with the state it is in when ctx's deadline passed, ErrShuttingDown when
// hiloop began to shut down. While it is asked to run, stopped or stopping
// is a state it is on its way from: the mirror holds its decisions during
// the start's write and until its watch shows it (ModeWriting, Writer.Written),
// but past the hold's bound it can still decide on an object its watch has
// not seen the start of yet, and mark the sandbox stopped outside hiloop
// until the next event says otherwise.
func (c *Control) waitRunning(ctx context.Context, id string) error {
	for {
		// Taken before the read, so a change between the two is not missed.
		changed, release := c.o.Store.StateChange(id)
		sb, err := c.o.Store.SandboxAnyOrg(ctx, id)
		if err != nil {
			release()
			return err
		}
		if err := reachable(sb); err == nil || !starting(sb) {
			release()
			return err
		}
		select {
		case <-changed:
			release()
		case <-ctx.Done():
			release()
			if c.base.Err() != nil {
				return ErrShuttingDown
			}
			return &WakeTimeoutError{State: sb.State, After: c.o.WakeTimeout}
		}
	}
}

// waitRegistry counts the calls waiting in Wake, per key and per
// organization. Counts drop to no entry at zero, so it stays bounded by
// the calls waiting.
type waitRegistry struct {
	mu    sync.Mutex
	byKey map[string]int
	byOrg map[string]int
}

// take takes a waiting place of who's key and one of its organization's,
// or says whose bound refuses it. release gives both back; it is safe to
// call more than once.
func (r *waitRegistry) take(who Caller, lim Limits) (release func(), refused *WaitLimitError) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.byKey == nil {
		r.byKey, r.byOrg = map[string]int{}, map[string]int{}
	}
	if r.byKey[who.KeyID] >= lim.WakeWaitsPerKey {
		return nil, &WaitLimitError{Max: lim.WakeWaitsPerKey}
	}
	if r.byOrg[who.OrgID] >= lim.WakeWaitsPerOrg {
		return nil, &WaitLimitError{Org: true, Max: lim.WakeWaitsPerOrg}
	}
	r.byKey[who.KeyID]++
	r.byOrg[who.OrgID]++
	return sync.OnceFunc(func() {
		r.mu.Lock()
		defer r.mu.Unlock()
		dec(r.byKey, who.KeyID)
		dec(r.byOrg, who.OrgID)
	}), nil
}

// counts are the places taken of a key and of an organization, and how
// many keys and organizations hold any, for tests.
func (r *waitRegistry) counts(keyID, orgID string) (key, org, keys, orgs int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.byKey[keyID], r.byOrg[orgID], len(r.byKey), len(r.byOrg)
}
