package control

import (
	"context"
	"time"

	"github.com/hiloop/hiloop/cluster"
	"github.com/hiloop/hiloop/store"
)

// lockOwned takes the per-sandbox lock of one of who's sandboxes. The
// caller's key is checked first, at this use and not only where the
// request came in, so a revoke that lands in between refuses the change;
// a caller of no organization or no key is refused before any read. The
// organization is checked next, without the lock, so another
// organization's caller with a guessed id is refused at once, as for an id
// that does not exist (store.ErrNotFound): it never waits behind the
// owner's mutation, and the wait cannot tell it that the id exists. A
// sandbox never changes organization, so the check still holds once the
// lock is taken (and the writes under it scope by organization again).
func (c *Control) lockOwned(ctx context.Context, who Caller, id string) (unlock func(), err error) {
	if err := c.keyLive(ctx, who); err != nil {
		return nil, err
	}
	if _, err := c.o.Store.Sandbox(ctx, who.OrgID, id); err != nil {
		return nil, err
	}
	return c.locks.lock(id), nil
}

// SetMode stops (ModeStopped), starts (ModeRunning) or deletes (ModeDeleted)
// a sandbox. The cluster is made to match whatever the record's desired mode
// was, so a sandbox stopped or started outside hiloop can be started or
// stopped again. Deleting a terminal sandbox deletes whatever object still
// carries its name. When the cluster write fails the record is restored.
// Stopping or deleting ends the sandbox's live sessions and closes the
// connections registered for it. A stop through SetMode is the user's: no
// wake undoes it.
func (c *Control) SetMode(ctx context.Context, who Caller, id string, mode store.Mode) (store.Sandbox, error) {
	if mode == store.ModeRunning {
		if err := c.Hardened(); err != nil {
			return store.Sandbox{}, err
		}
	}
	unlock, err := c.lockOwned(ctx, who, id)
	if err != nil {
		return store.Sandbox{}, err
	}
	defer unlock()
	return c.setMode(ctx, who.OrgID, id, mode, store.StopUser)
}

// applyMode makes the cluster carry out a desired-mode change the record
// took, with the sandbox's lock held: it restores the record when the
// cluster write fails. A stop for idleness ends the sandbox's sessions and
// leaves its connections open, so that their next session wakes it; any
// other stop or delete closes them too. Both happen before the cluster
// write, so that they precede whatever the write does to the pod.
func (c *Control) applyMode(ch store.ModeChange) (store.Sandbox, error) {
	id, mode := ch.After.ID, ch.After.DesiredMode
	// The sessions end before the cluster is asked: once it is, the pod's
	// processes may be killed at any moment, and a command killed by the
	// stop must report the stop, not the signal that killed it (Exec
	// looks at the session's cause first). The record already refuses new
	// sessions; a stop whose cluster write fails has ended them all the
	// same, and the restored record admits new ones.
	this := func(_, sb string) bool { return sb == id }
	switch {
	case ch.After.IdleStopped():
		c.endSessions(ErrIdleStopped, this)
	case mode != store.ModeRunning:
		c.end(ErrSandboxChanged, this)
	}
	cctx, cancel := c.clusterCtx()
	defer cancel()
	var err error
	if mode == store.ModeDeleted {
		err = c.o.Cluster.Delete(cctx, id)
	} else {
		err = c.o.Cluster.SetMode(cctx, id, mode)
	}
	if err != nil && !cluster.IsNotFound(err) {
		if rerr := c.o.Store.RestoreMode(context.WithoutCancel(c.base), ch.Before); rerr != nil {
			c.log.Error("restore desired mode", "sandbox", id, "err", rerr)
		}
		verb := "patch"
		if mode == store.ModeDeleted {
			verb = "delete"
		}
		return store.Sandbox{}, c.clusterFailed(verb, err)
	}
	// A pending record's object may not exist yet (NotFound above): its
	// create renders the mode now recorded.
	c.touch(id)
	return ch.After, nil
}

// MaxWait bounds how long WaitWhile holds one call.
const MaxWait = time.Minute

// WaitWhile answers with one of an organization's sandboxes once its state
// is other than while, once d (at most MaxWait) has passed, or once hiloop
// begins to shut down, whichever comes first: the record as it then stands.
// A client that waits for a state gets each change as the record takes it,
// and asks again, instead of polling. The key is checked after every read:
// a caller whose key was revoked or deleted, before the call or while it
// waited, gets ErrUnauthenticated, not the record: what is read after a
// revoke is not the revoked key's.
func (c *Control) WaitWhile(ctx context.Context, who Caller, id string, while store.State, d time.Duration) (store.Sandbox, error) {
	if err := scoped(who); err != nil {
		return store.Sandbox{}, err
	}
	timer := time.NewTimer(min(d, MaxWait))
	defer timer.Stop()
	for {
		// Taken before the read, so a change between the two is not missed.
		changed, release := c.o.Store.StateChange(id)
		sb, err := c.o.Store.Sandbox(ctx, who.OrgID, id)
		if err == nil {
			err = c.keyLive(ctx, who)
		}
		if err != nil || sb.State != while {
			release()
			if err != nil {
				return store.Sandbox{}, err
			}
			return sb, nil
		}
		select {
		case <-changed:
			release()
			continue
		case <-timer.C:
		case <-c.base.Done():
		case <-ctx.Done():
			release()
			return sb, ctx.Err()
		}
		release()
		if err := c.keyLive(ctx, who); err != nil {
			return store.Sandbox{}, err
		}
		return sb, nil
	}
}

// Update is a change of a sandbox's lifetime: a nil field stays as it is.
type Update struct {
	// TTL sets the expiry to now plus TTL.
	TTL *time.Duration
	// IdleTimeout changes the idle timeout; 0 turns idle stop off. The
	// idle clock keeps running: a timeout shorter than the time the
	// sandbox has already gone unused stops it at the next check.
	IdleTimeout *time.Duration
}

// Update applies a lifetime change as one: every field or none. The
// record takes them in one transaction, then the cluster its new expiry;
// when that cluster write fails, the record is restored whole.
func (c *Control) Update(ctx context.Context, who Caller, id string, u Update) (store.Sandbox, error) {
	if err := u.check(); err != nil {
		return store.Sandbox{}, err
	}
	unlock, err := c.lockOwned(ctx, who, id)
	if err != nil {
		return store.Sandbox{}, err
	}
	defer unlock()
	var l store.Lifetime
	if u.TTL != nil {
		at := c.o.Now().Add(*u.TTL).UTC().Truncate(time.Second)
		l.ExpiresAt, l.TTLSeconds = &at, int64(*u.TTL/time.Second)
	}
	l.IdleTimeout = u.IdleTimeout
	ch, err := c.o.Store.SetLifetime(ctx, who.OrgID, id, l)
	if err != nil {
		return store.Sandbox{}, err
	}
	if l.ExpiresAt == nil {
		return ch.After, nil
	}
	cctx, cancel := c.clusterCtx()
	defer cancel()
	if err := c.o.Cluster.SetExpiry(cctx, id, *l.ExpiresAt); err != nil && !cluster.IsNotFound(err) {
		if rerr := c.o.Store.RestoreLifetime(context.WithoutCancel(c.base), ch.Before); rerr != nil {
			c.log.Error("restore lifetime", "sandbox", id, "err", rerr)
		}
		return store.Sandbox{}, c.clusterFailed("patch", err)
	}
	return ch.After, nil
}
