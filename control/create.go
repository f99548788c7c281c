package control

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/hiloop/hiloop/store"
)

// CreateRequest is a validated create. A spec with a TTL expires that long
// after the create, by the core's clock.
type CreateRequest struct {
	Spec store.Spec
	// IdempotencyKey, when set, makes a retried create return the first
	// sandbox; RequestHash is the canonical request's hash.
	IdempotencyKey string
	RequestHash    string
	// IdleTimeout stops the sandbox once it went unused for this long (0
	// never does); nil takes its organization's, else the deployment's
	// default (Options.DefaultIdleTimeout).
	IdleTimeout *time.Duration
}

// Outcome says how a create ended.
type Outcome int

const (
	// Created: the record and the cluster object were both written.
	Created Outcome = iota
	// Replayed: an earlier create with the same idempotency key is returned.
	Replayed
	// Accepted: the record was written, but whether the cluster wrote the
	// object is not known yet (the write timed out). The record stays
	// pending and is resolved from evidence in the background: the object
	// is looked up by name and adopted, or created again. It never ends as
	// an object without a record or a second sandbox.
	Accepted
)

// admit checks a spec against what the deployment backs.
func (c *Control) admit(spec store.Spec) error {
	for i, v := range spec.Volumes {
		if v.StorageClass != "" && !slices.Contains(c.o.Caps.StorageClasses, v.StorageClass) {
			return &FieldError{Field: fmt.Sprintf("volumes[%d].storage_class", i), Err: ErrUnsupported,
				Message: fmt.Sprintf("storage class %q is not backed by this deployment (backed: %s)", v.StorageClass, listOrNone(c.o.Caps.StorageClasses))}
		}
	}
	for i, t := range spec.Transports {
		if !slices.Contains(c.o.Caps.Transports, t) {
			return &FieldError{Field: fmt.Sprintf("transports[%d]", i), Err: ErrUnsupported,
				Message: fmt.Sprintf("transport %q is not backed by this deployment (backed: %s)", t, listOrNone(c.o.Caps.Transports))}
		}
	}
	return nil
}

func listOrNone[T ~string](l []T) string {
	if len(l) == 0 {
		return "none"
	}
	s := make([]string, len(l))
	for i, v := range l {
		s[i] = string(v)
	}
	return strings.Join(s, ", ")
}

// Create writes the record (checking quotas in the same transaction), then
// the cluster object. A definite cluster refusal fails the record; an
// ambiguous one (a timeout) leaves it pending for resolution and answers
// Accepted. The caller's key is checked as the record says now, as for
// every change.
func (c *Control) Create(ctx context.Context, who Caller, req CreateRequest) (store.Sandbox, Outcome, error) {
	if err := c.admit(req.Spec); err != nil {
		return store.Sandbox{}, 0, err
	}
	if err := c.keyLive(ctx, who); err != nil {
		return store.Sandbox{}, 0, err
	}
	if err := c.Hardened(); err != nil {
		return store.Sandbox{}, 0, err
	}
	var expires *time.Time
	if req.Spec.TTLSeconds > 0 {
		at := c.o.Now().Add(time.Duration(req.Spec.TTLSeconds) * time.Second).UTC().Truncate(time.Second)
		expires = &at
	}
	// The idle timeout is the sandbox's own, else its organization's (read
	// in the create's transaction), else the deployment's default. It is
	// taken at create: a sandbox keeps its timeout until it is changed.
	n := store.NewSandbox{OrgID: who.OrgID, Spec: req.Spec, ExpiresAt: expires, Receipt: c.o.Cluster.Receipt(who.OrgID, req.Spec).Encode(),
		IdleTimeout: c.o.DefaultIdleTimeout, OrgIdleTimeout: true, IdempotencyKey: req.IdempotencyKey, RequestHash: req.RequestHash}
	if req.IdleTimeout != nil {
		n.IdleTimeout, n.OrgIdleTimeout = *req.IdleTimeout, false
	}
	sb, created, err := c.o.Store.CreateSandbox(ctx, n)
	if err != nil {
		return store.Sandbox{}, 0, err
	}
	if !created {
		return sb, Replayed, nil
	}
	c.log.Debug("create: record written", "sandbox", sb.ID)
	unlock := c.locks.lock(sb.ID)
	defer unlock()
	// The answer is the record as createObject read it, under the lock
	// that every change of the sandbox's desired state takes.
	rec, outcome, err := c.createObject(sb.ID)
	if err != nil {
		return sb, 0, err
	}
	sb = rec
	if outcome == Accepted {
		c.resolveLater(sb.ID)
	}
	return sb, outcome, nil
}

// createObject makes the cluster match a pending record, with the lock held:
// it deletes the object when a delete came first, creates it otherwise, and
// fails the record when the cluster definitely refused, returning the
// refusal for its caller to report. It answers Accepted when the outcome is
// unknown. It returns the record as it read it.
func (c *Control) createObject(id string) (store.Sandbox, Outcome, error) {
	rec, err := c.o.Store.SandboxAnyOrg(context.WithoutCancel(c.base), id)
	if err != nil {
		return rec, 0, err
	}
	ctx, cancel := c.clusterCtx()
	defer cancel()
	if rec.DesiredMode == store.ModeDeleted {
		// A delete won the race with this create: make sure nothing exists.
		if err := c.o.Cluster.Delete(ctx, id); err != nil {
			return rec, Accepted, nil
		}
		c.touch(id)
		return rec, Created, nil
	}
	key, err := c.helperKey(ctx, rec)
	if err == nil {
		err = c.o.Cluster.Create(ctx, rec, key)
	}
	switch {
	case err == nil:
		c.log.Debug("create: object written", "sandbox", id)
		return rec, Created, nil
	case ambiguous(err):
		c.clusterFailed("create", err)
		c.log.Warn("create outcome unknown; resolving from evidence", "sandbox", id, "err", err)
		return rec, Accepted, nil
	default:
		err = c.clusterFailed("create", err)
		if ferr := c.o.Store.Fail(context.WithoutCancel(c.base), id, failReason(err)); ferr != nil {
			c.log.Error("record failed create", "sandbox", id, "err", ferr)
		}
		return rec, 0, err
	}
}

// failReason is what a failed record says, fit for its owner to read: never
// the cluster's own message.
func failReason(err error) string {
	var ce *ClusterError
	if errors.As(err, &ce) {
		return "cluster write failed: " + ce.Kind.Error()
	}
	return "cluster write failed"
}

// ResolvePending resolves a record left pending by an interrupted or
// ambiguous create, in the background: the mirror calls it at start-up for
// every pending record whose object it does not see.
func (c *Control) ResolvePending(id string) { c.resolveLater(id) }

// resolveLater keeps trying to resolve a pending record until it is
// resolved or Close is called. Each attempt is bounded by the cluster
// timeout, so a hung API server holds nothing else up.
func (c *Control) resolveLater(id string) {
	c.bg.Add(1)
	go func() {
		defer c.bg.Done()
		backoff := 500 * time.Millisecond
		for {
			done, err := c.resolve(id)
			if done {
				return
			}
			c.log.Warn("pending create not resolved yet", "sandbox", id, "err", err, "retry_in", backoff)
			select {
			case <-c.base.Done():
				return
			case <-time.After(backoff):
			}
			backoff = min(2*backoff, 30*time.Second)
		}
	}()
}

// resolve is one attempt: with the lock held, adopt the object if it
// exists, else create it (or delete it, if a delete came first).
func (c *Control) resolve(id string) (done bool, err error) {
	unlock := c.locks.lock(id)
	defer unlock()
	rec, err := c.o.Store.SandboxAnyOrg(context.WithoutCancel(c.base), id)
	if err != nil || rec.State != store.StatePending {
		return true, err
	}
	ctx, cancel := c.clusterCtx()
	exists, err := c.o.Cluster.Exists(ctx, id)
	cancel()
	if err != nil {
		return false, err
	}
	if exists && rec.DesiredMode != store.ModeDeleted {
		c.log.Info("adopted the object of a pending create", "sandbox", id)
		c.touch(id)
		return true, nil
	}
	_, outcome, err := c.createObject(id)
	if err != nil {
		// Failed for good, and recorded; nobody else sees the refusal.
		c.log.Warn("cluster refused a pending create", "sandbox", id, "err", err)
		return true, nil
	}
	if outcome == Accepted {
		return false, errors.New("cluster write outcome unknown")
	}
	c.log.Info("resolved pending create", "sandbox", id)
	c.touch(id)
	return true, nil
}
