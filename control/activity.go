package control

import (
	"context"
	"sync"
	"time"

	"github.com/hiloop/hiloop/store"
)

// What counts as use of a sandbox is what its users do through hiloop,
// never what its workload does: a live exec, SSH session or -L channel for
// as long as it is open, a touch (an explicit one, or a call such as a file
// call that ends at once). A background process is the workload's: only
// its calls count, and reading its output for as long as that is open. Its idle clock starts when the last such use
// ends, or when the sandbox comes up running (the mirror records that). A
// running sandbox whose clock reaches its idle timeout is stopped through
// the same path as a user's stop, with cause idle; only such a stop may be
// woken (Wake).
//
// The record is written coarsely: when a use begins that the record does not
// show yet, and otherwise at most every ActivityFlush per sandbox, never per
// packet. Across a restart, the record keeps every clock; a sandbox that had
// a use open when the previous process ended is taken to have been in use
// until the restart (store.ResumeActivity), the only conservative reading
// of an end nobody saw.

// activity is the use of sandboxes as this process sees it. An entry lives
// while it has something the record does not: a use open, an unwritten
// change, or an idle stop under way.
type activity struct {
	mu sync.Mutex
	m  map[string]*use
}

// use is one sandbox's entry; its fields are guarded by activity.mu.
type use struct {
	// open counts the sessions and channels open now.
	open int
	// last is when a use last ended or a touch came.
	last time.Time
	// written is when this entry was last written to the record, recOpen
	// the activity_open written then, and dirty says last or open changed
	// since.
	written time.Time
	recOpen bool
	dirty   bool
	// stopping is set while an idle stop of the sandbox is under way: no
	// use may begin then.
	stopping bool
	// wmu orders the entry's writes, so that the record ends with the last
	// thing decided.
	wmu sync.Mutex
}

// entry is the entry of id, made if there is none; a.mu is held.
func (a *activity) entry(id string) *use {
	if a.m == nil {
		a.m = map[string]*use{}
	}
	e := a.m[id]
	if e == nil {
		e = &use{}
		a.m[id] = e
	}
	return e
}

// hold counts one use of sandbox id from now until release is called. It
// refuses (false) while an idle stop of the sandbox is under way. A use
// the record does not show yet is written at once, so a restart finds it.
func (c *Control) hold(id string) (release func(), ok bool) {
	a := &c.activity
	a.mu.Lock()
	e := a.entry(id)
	if e.stopping {
		a.mu.Unlock()
		return nil, false
	}
	e.open++
	a.mu.Unlock()
	c.writeUse(context.WithoutCancel(c.base), id, e, false)
	var once sync.Once
	return func() {
		once.Do(func() {
			a.mu.Lock()
			e.open--
			e.last, e.dirty = c.o.Now(), true
			a.mu.Unlock()
		})
	}, true
}

// idleStopping is the refusal of a use that begins while an idle stop of
// its sandbox is under way: a way in that wakes wakes it again.
func idleStopping() *StateError {
	return &StateError{State: store.StateStopping, Mode: store.ModeStopped, StopCause: store.StopIdle}
}

// Use counts one use of the session's sandbox, such as one forwarded
// channel, until done is called. Sessions of the exec and ssh transports
// count from Admit to End by themselves; a forward session, which lives as
// long as its client's connection, counts only while a channel is open. It
// fails with a *StateError while an idle stop of the sandbox is under way.
func (s *Session) Use() (done func(), err error) {
	release, ok := s.c.hold(s.SandboxID)
	if !ok {
		return nil, idleStopping()
	}
	return release, nil
}

// Touch counts a use of one of the caller's organization's sandboxes that
// ends at once: an explicit touch, or a call (a file call) that holds no
// session. It answers the sandbox with its idle clock restarted.
func (c *Control) Touch(ctx context.Context, who Caller, id string) (store.Sandbox, error) {
	if err := c.keyLive(ctx, who); err != nil {
		return store.Sandbox{}, err
	}
	sb, err := c.o.Store.Sandbox(ctx, who.OrgID, id)
	if err != nil {
		return store.Sandbox{}, err
	}
	now := c.o.Now()
	a := &c.activity
	a.mu.Lock()
	e := a.entry(id)
	e.last, e.dirty = now, true
	a.mu.Unlock()
	c.writeUse(ctx, id, e, false)
	if now.After(sb.LastActivityAt) {
		sb.LastActivityAt = now.UTC().Truncate(time.Millisecond)
	}
	return sb, nil
}

// writeUse writes an entry to the record when it is due: at once when a
// use is open that the record does not show, else when something changed
// (or a use is open) and the last write is ActivityFlush old, or whenever
// force is set and something changed.
func (c *Control) writeUse(ctx context.Context, id string, e *use, force bool) {
	e.wmu.Lock()
	defer e.wmu.Unlock()
	a := &c.activity
	now := c.o.Now()
	a.mu.Lock()
	open := e.open > 0
	stale := now.Sub(e.written) >= c.o.ActivityFlush
	if !(open && !e.recOpen || (e.dirty || open) && (stale || force && e.dirty)) {
		a.mu.Unlock()
		return
	}
	at := e.last
	if open {
		at = now
	}
	e.written, e.recOpen, e.dirty = now, open, false
	a.mu.Unlock()
	if err := c.o.Store.RecordActivity(ctx, id, at, open); err != nil {
		if ctx.Err() == nil {
			c.log.Warn("record activity", "sandbox", id, "err", err)
		}
		// Whatever the record holds, write it again next time.
		a.mu.Lock()
		e.dirty, e.recOpen = true, !open
		a.mu.Unlock()
	}
}

// flushUse writes every entry that is due (all that changed, with force)
// and forgets the entries that hold nothing the record does not.
func (c *Control) flushUse(ctx context.Context, force bool) {
	a := &c.activity
	a.mu.Lock()
	ids := make([]string, 0, len(a.m))
	entries := make([]*use, 0, len(a.m))
	for id, e := range a.m {
		ids, entries = append(ids, id), append(entries, e)
	}
	a.mu.Unlock()
	for i, e := range entries {
		c.writeUse(ctx, ids[i], e, force)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	for id, e := range a.m {
		if e.open == 0 && !e.dirty && !e.recOpen && !e.stopping {
			delete(a.m, id)
		}
	}
}

// idleSince is when the idle clock of a sandbox started, from the record
// and from what this process saw since; busy while a use is open or an
// idle stop is under way.
func (a *activity) idleSince(id string, recorded time.Time) (since time.Time, busy bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	e := a.m[id]
	if e == nil {
		return recorded, false
	}
	if e.last.After(recorded) {
		recorded = e.last
	}
	return recorded, e.open > 0 || e.stopping
}

// claim marks an idle stop of sb under way, if sb has gone unused for its
// idle timeout by now: from then on no use of it begins (hold refuses)
// until unclaim. It reports whether it did.
func (a *activity) claim(sb store.Sandbox, now time.Time) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	e := a.entry(sb.ID)
	since := sb.LastActivityAt
	if e.last.After(since) {
		since = e.last
	}
	if e.open > 0 || e.stopping || now.Sub(since) < sb.IdleTimeout {
		return false
	}
	e.stopping = true
	return true
}

func (a *activity) unclaim(id string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if e := a.m[id]; e != nil {
		e.stopping = false
	}
}

// idleBatch is the most sandboxes one idle check stops; the next check,
// a SweepInterval later, goes on.
const idleBatch = 100

// stopIdle stops the running sandboxes that went unused for their idle
// timeout.
func (c *Control) stopIdle(ctx context.Context) {
	now := c.o.Now()
	list, err := c.o.Store.IdleSandboxes(ctx, now, idleBatch)
	if err != nil {
		if ctx.Err() == nil {
			c.log.Warn("idle check", "err", err)
		}
		return
	}
	for _, sb := range list {
		if since, busy := c.activity.idleSince(sb.ID, sb.LastActivityAt); busy || now.Sub(since) < sb.IdleTimeout {
			continue
		}
		c.idleStop(ctx, sb.ID)
	}
}

// idleStop stops one sandbox for idleness through the core's stop path,
// once its lock is taken and its record read again: a start, stop or use
// that came first wins.
func (c *Control) idleStop(ctx context.Context, id string) {
	unlock := c.locks.lock(id)
	defer unlock()
	rec, err := c.o.Store.SandboxAnyOrg(ctx, id)
	if err != nil {
		return
	}
	now := c.o.Now()
	if rec.State != store.StateRunning || rec.DesiredMode != store.ModeRunning || rec.ModeOutside || rec.IdleTimeout <= 0 ||
		!c.activity.claim(rec, now) {
		return
	}
	defer c.activity.unclaim(id)
	if _, err := c.setMode(ctx, rec.OrgID, id, store.ModeStopped, store.StopIdle); err != nil {
		if ctx.Err() == nil {
			c.log.Warn("idle stop", "sandbox", id, "err", err)
		}
		return
	}
	c.o.Metrics.IdleStop()
	since, _ := c.activity.idleSince(id, rec.LastActivityAt)
	c.log.Info("stopped an idle sandbox", "sandbox", id, "org", rec.OrgID, "idle_for", now.Sub(since).Round(time.Second).String(),
		"idle_timeout", rec.IdleTimeout.String())
}
