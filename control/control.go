// Package control is the one core that every way into hiloop calls for what
// a caller may do to a sandbox: the HTTP API and the SSH gateway alike. It
// owns the write path (record first, then the cluster, with one
// compensation when the cluster write fails), the resolution of creates whose
// outcome is unknown, capability admission, and the admission and registry
// of live sessions (exec and shells), with their limits.
//
// Calls run downward: control uses store and the cluster vocabulary of k8s
// and never calls the mirror or a way in. The mirror calls down into it (to
// resolve pending creates) and learns which records control changed
// without a cluster event from Changed and TakeChanged.
package control

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hiloop/hiloop/k8s"
	"github.com/hiloop/hiloop/metrics"
	"github.com/hiloop/hiloop/store"
)

// Cluster is what control needs of the cluster: k8s.Writer satisfies it.
type Cluster interface {
	// Receipt is what a sandbox of the organization with this spec is
	// promised, as the JSON stored in its record and its annotation.
	Receipt(orgID string, spec store.Spec) (string, error)
	Create(ctx context.Context, sb store.Sandbox) error
	// Exists reports whether the Sandbox object of a sandbox id exists,
	// asking the API server (not a cache).
	Exists(ctx context.Context, id string) (bool, error)
	SetMode(ctx context.Context, id string, mode store.Mode) error
	SetExpiry(ctx context.Context, id string, at time.Time) error
	Delete(ctx context.Context, id string) error
	// PodAddr is the IP and uid of a sandbox's live pod.
	PodAddr(ctx context.Context, id string) (ip, uid string, err error)
}

// Executor runs a command in a sandbox's workload container: k8s.Execer
// satisfies it.
type Executor interface {
	Exec(ctx context.Context, sandboxID string, req k8s.ExecRequest) (k8s.ExitStatus, error)
}

// Capabilities are what this deployment backs. A request for anything else
// is refused with ErrUnsupported rather than half-honoured.
type Capabilities struct {
	// StorageClasses a volume may name. A volume that names none gets the
	// cluster's default class, which is always backed.
	StorageClasses []string
	// Transports a sandbox may ask for.
	Transports []string
}

// Limits bound concurrent sessions (exec streams, one-shot execs, shells).
type Limits struct {
	PerSandbox int
	PerOrg     int
}

// Options configure New.
type Options struct {
	Store   *store.Store
	Cluster Cluster
	// Exec runs commands; sessions are refused with ErrNoExec without it.
	Exec Executor
	Caps Capabilities
	// Limits default to 8 sessions per sandbox and 32 per organization.
	Limits Limits
	// ClusterTimeout bounds each cluster call; 15s when zero.
	ClusterTimeout time.Duration
	// SweepInterval is how often live sessions are held to their key and
	// sandbox (a revoke offline, a stop seen by the mirror); 2s when zero.
	SweepInterval time.Duration
	Log           *slog.Logger
	Now           func() time.Time
	// Metrics records cluster errors; optional.
	Metrics *metrics.Metrics
	// Boundary is the isolation self-check (k8s.Clients.CheckBoundary).
	// With it, creates and starts are refused until a check passes, and
	// whenever the last one failed. Nil runs without (the core's own tests).
	Boundary func(ctx context.Context) []k8s.Check
	// BoundaryInterval is how often Run repeats the self-check; 1m when zero.
	BoundaryInterval time.Duration
	// EventRetention is how long state transitions are kept; Run prunes
	// older ones at start and every hour. Zero keeps them forever.
	EventRetention time.Duration
}

// Caller is who asks: the organization and the key that actually
// authenticated the request or connection.
type Caller struct {
	OrgID string
	KeyID string
}

// Control is the core.
type Control struct {
	o   Options
	log *slog.Logger

	locks keyedMutex

	// base ends every session and background resolution on Close.
	base   context.Context
	cancel context.CancelCauseFunc
	bg     sync.WaitGroup

	sessions registry

	boundary atomic.Pointer[BoundaryReport]

	changedMu sync.Mutex
	changed   map[string]bool
	notify    chan struct{}
}

// New builds the core.
func New(o Options) (*Control, error) {
	if o.Store == nil || o.Cluster == nil {
		return nil, errors.New("control: store and cluster are required")
	}
	if o.Log == nil {
		o.Log = slog.Default()
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.ClusterTimeout == 0 {
		o.ClusterTimeout = 15 * time.Second
	}
	if o.BoundaryInterval == 0 {
		o.BoundaryInterval = time.Minute
	}
	if o.SweepInterval == 0 {
		o.SweepInterval = 2 * time.Second
	}
	if o.Limits.PerSandbox == 0 {
		o.Limits.PerSandbox = 8
	}
	if o.Limits.PerOrg == 0 {
		o.Limits.PerOrg = 32
	}
	base, cancel := context.WithCancelCause(context.Background())
	c := &Control{o: o, log: o.Log.With("component", "control"), base: base, cancel: cancel,
		changed: map[string]bool{}, notify: make(chan struct{}, 1)}
	c.sessions.init()
	return c, nil
}

// clusterCtx bounds one cluster call. It is detached from the caller's
// request, so a client that hangs up cannot leave the record and the
// cluster half-done.
func (c *Control) clusterCtx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(c.base), c.o.ClusterTimeout)
}

// touch tells the mirror that a record changed in a way no cluster event
// will show (a delete of an object that never existed, for example).
func (c *Control) touch(id string) {
	c.changedMu.Lock()
	c.changed[id] = true
	c.changedMu.Unlock()
	select {
	case c.notify <- struct{}{}:
	default:
	}
}

// Changed is signalled after records changed that the mirror should
// re-decide; TakeChanged says which.
func (c *Control) Changed() <-chan struct{} { return c.notify }

// TakeChanged returns and forgets the ids touched since the last call.
func (c *Control) TakeChanged() []string {
	c.changedMu.Lock()
	defer c.changedMu.Unlock()
	out := make([]string, 0, len(c.changed))
	for id := range c.changed {
		out = append(out, id)
	}
	clear(c.changed)
	return out
}

// CreateRequest is a validated create.
type CreateRequest struct {
	Spec      store.Spec
	ExpiresAt *time.Time
	// IdempotencyKey, when set, makes a retried create return the first
	// sandbox; RequestHash is the canonical request's hash.
	IdempotencyKey string
	RequestHash    string
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

func listOrNone(l []string) string {
	if len(l) == 0 {
		return "none"
	}
	return strings.Join(l, ", ")
}

// Create writes the record (checking quotas in the same transaction), then
// the cluster object. A definite cluster refusal fails the record; an
// ambiguous one (a timeout) leaves it pending for resolution and answers
// Accepted.
func (c *Control) Create(ctx context.Context, who Caller, req CreateRequest) (store.Sandbox, Outcome, error) {
	if err := c.admit(req.Spec); err != nil {
		return store.Sandbox{}, 0, err
	}
	if err := c.Hardened(); err != nil {
		return store.Sandbox{}, 0, err
	}
	receipt, err := c.o.Cluster.Receipt(who.OrgID, req.Spec)
	if err != nil {
		return store.Sandbox{}, 0, err
	}
	sb, created, err := c.o.Store.CreateSandbox(ctx, store.NewSandbox{OrgID: who.OrgID, Spec: req.Spec, ExpiresAt: req.ExpiresAt,
		Receipt: receipt, IdempotencyKey: req.IdempotencyKey, RequestHash: req.RequestHash})
	if err != nil {
		return store.Sandbox{}, 0, err
	}
	if !created {
		return sb, Replayed, nil
	}
	c.log.Debug("create: record written", "sandbox", sb.ID)
	unlock := c.locks.lock(sb.ID)
	defer unlock()
	outcome, err := c.createObject(sb.ID)
	if err != nil {
		return sb, 0, err
	}
	if fresh, ferr := c.o.Store.SandboxAnyOrg(context.WithoutCancel(ctx), sb.ID); ferr == nil {
		sb = fresh
	}
	if outcome == Accepted {
		c.resolveLater(sb.ID)
	}
	return sb, outcome, nil
}

// createObject makes the cluster match a pending record, with the lock held:
// it deletes the object when a delete came first, creates it otherwise, and
// fails the record when the cluster definitely refused. It answers Accepted
// when the outcome is unknown.
func (c *Control) createObject(id string) (Outcome, error) {
	rec, err := c.o.Store.SandboxAnyOrg(context.WithoutCancel(c.base), id)
	if err != nil {
		return 0, err
	}
	ctx, cancel := c.clusterCtx()
	defer cancel()
	if rec.DesiredMode == store.ModeDeleted {
		// A delete won the race with this create: make sure nothing exists.
		if err := c.o.Cluster.Delete(ctx, id); err != nil {
			return Accepted, nil
		}
		c.touch(id)
		return Created, nil
	}
	err = c.o.Cluster.Create(ctx, rec)
	switch {
	case err == nil:
		c.log.Debug("create: object written", "sandbox", id)
		return Created, nil
	case ambiguous(err):
		c.clusterFailed("create", err)
		c.log.Warn("create outcome unknown; resolving from evidence", "sandbox", id, "err", err)
		return Accepted, nil
	default:
		err = c.clusterFailed("create", err)
		c.log.Warn("cluster refused create", "sandbox", id, "err", err)
		if ferr := c.o.Store.Fail(context.WithoutCancel(c.base), id, failReason(err)); ferr != nil {
			c.log.Error("record failed create", "sandbox", id, "err", ferr)
		}
		return 0, err
	}
}

// clusterFailed classifies a failed cluster call and counts it by verb and
// kind.
func (c *Control) clusterFailed(verb string, err error) error {
	err = classify(err)
	kind := "unavailable"
	switch {
	case errors.Is(err, ErrClusterRejected):
		kind = "rejected"
	case errors.Is(err, ErrClusterForbidden):
		kind = "forbidden"
	case errors.Is(err, ErrClusterQuota):
		kind = "quota"
	}
	c.o.Metrics.ClusterError(verb, kind)
	return err
}

// SandboxesByState counts the record's sandboxes by state, and its
// organizations, for the metrics.
func (c *Control) SandboxesByState(ctx context.Context) (map[string]int, int, error) {
	return c.o.Store.Counts(ctx)
}

// SessionsByTransport counts live sessions by transport, for the metrics.
func (c *Control) SessionsByTransport() map[string]int {
	out := map[string]int{"exec": 0, "ssh": 0, k8s.TransportForward: 0}
	for _, s := range c.sessions.list() {
		out[s.Transport]++
	}
	return out
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
	outcome, err := c.createObject(id)
	if err != nil {
		return true, nil // failed for good, and recorded
	}
	if outcome == Accepted {
		return false, errors.New("cluster write outcome unknown")
	}
	c.log.Info("resolved pending create", "sandbox", id)
	c.touch(id)
	return true, nil
}

// SetMode stops (ModeStopped), starts (ModeRunning) or deletes (ModeDeleted)
// a sandbox. The cluster is made to match whatever the record's desired mode
// was, so a sandbox stopped or started outside hiloop can be started or
// stopped again. Deleting a terminal sandbox deletes whatever object still
// carries its name. When the cluster write fails the record is restored.
func (c *Control) SetMode(ctx context.Context, who Caller, id string, mode store.Mode) (store.Sandbox, error) {
	if mode == store.ModeRunning {
		if err := c.Hardened(); err != nil {
			return store.Sandbox{}, err
		}
	}
	unlock := c.locks.lock(id)
	defer unlock()
	ch, err := c.o.Store.SetDesiredMode(ctx, who.OrgID, id, mode)
	if err != nil {
		return store.Sandbox{}, err
	}
	cctx, cancel := c.clusterCtx()
	defer cancel()
	if mode == store.ModeDeleted {
		err = c.o.Cluster.Delete(cctx, id)
	} else {
		err = c.o.Cluster.SetMode(cctx, id, mode)
	}
	if err != nil && !k8s.IsNotFound(err) {
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
	if mode != store.ModeRunning {
		c.endSessionsIf(func(s *Session) bool { return s.SandboxID == id }, ErrSandboxChanged)
	}
	c.touch(id)
	return ch.After, nil
}

// MaxWait bounds how long WaitWhile holds one call.
const MaxWait = time.Minute

// WaitWhile answers with one of an organization's sandboxes once its state
// is other than while, once d (at most MaxWait) has passed, or once hiloop
// begins to shut down, whichever comes first: the record as it then stands.
// A client that waits for a state gets each change as the record takes it,
// and asks again, instead of polling.
func (c *Control) WaitWhile(ctx context.Context, who Caller, id string, while store.State, d time.Duration) (store.Sandbox, error) {
	timer := time.NewTimer(min(d, MaxWait))
	defer timer.Stop()
	for {
		// Taken before the read, so a change between the two is not missed.
		changed, release := c.o.Store.StateChange(id)
		sb, err := c.o.Store.Sandbox(ctx, who.OrgID, id)
		if err != nil || sb.State != while {
			release()
			return sb, err
		}
		select {
		case <-changed:
			release()
			continue
		case <-timer.C:
		case <-c.base.Done():
		case <-ctx.Done():
			err = ctx.Err()
		}
		release()
		return sb, err
	}
}

// SetTTL sets a sandbox's expiry to now plus ttl, restoring the record's
// expiry when the cluster write fails.
func (c *Control) SetTTL(ctx context.Context, who Caller, id string, ttl time.Duration) (store.Sandbox, error) {
	unlock := c.locks.lock(id)
	defer unlock()
	before, err := c.o.Store.Sandbox(ctx, who.OrgID, id)
	if err != nil {
		return store.Sandbox{}, err
	}
	at := c.o.Now().Add(ttl).UTC().Truncate(time.Second)
	after, err := c.o.Store.SetExpiry(ctx, who.OrgID, id, at, int64(ttl/time.Second))
	if err != nil {
		return store.Sandbox{}, err
	}
	cctx, cancel := c.clusterCtx()
	defer cancel()
	if err := c.o.Cluster.SetExpiry(cctx, id, at); err != nil && !k8s.IsNotFound(err) {
		if rerr := c.o.Store.RestoreExpiry(context.WithoutCancel(c.base), before); rerr != nil {
			c.log.Error("restore expiry", "sandbox", id, "err", rerr)
		}
		return store.Sandbox{}, c.clusterFailed("patch", err)
	}
	return after, nil
}

// RevokeKey revokes one of the caller's organization's keys (never its last
// live one) and ends every live session opened with it.
func (c *Control) RevokeKey(ctx context.Context, who Caller, keyID string) error {
	if err := c.o.Store.RevokeKey(ctx, who.OrgID, keyID, false); err != nil {
		return err
	}
	c.endSessionsIf(func(s *Session) bool { return s.KeyID == keyID }, ErrKeyRevoked)
	return nil
}

// Run sweeps live sessions until ctx ends: a session whose key was revoked
// (offline too) or whose sandbox stopped running ends within one sweep. It
// repeats the isolation self-check every BoundaryInterval.
func (c *Control) Run(ctx context.Context) error {
	if c.o.Boundary != nil {
		// The first check ran before serving (CheckBoundary).
		c.every(ctx, c.o.BoundaryInterval, false, func(ctx context.Context) { c.CheckBoundary(ctx) })
	}
	if c.o.EventRetention > 0 {
		c.every(ctx, time.Hour, true, c.pruneEvents)
	}
	t := time.NewTicker(c.o.SweepInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			c.sweep(ctx)
		}
	}
}

// pruneEvents deletes state transitions older than EventRetention.
func (c *Control) pruneEvents(ctx context.Context) {
	n, err := c.o.Store.PruneEvents(ctx, c.o.Now().Add(-c.o.EventRetention))
	switch {
	case err != nil && ctx.Err() == nil:
		c.log.Warn("prune events", "err", err)
	case n > 0:
		c.log.Info("pruned old events", "events", n, "older_than", c.o.EventRetention.String())
	}
}

// every runs fn every interval (and once at once when now is set) in the
// background, until ctx ends or the core closes.
func (c *Control) every(ctx context.Context, interval time.Duration, now bool, fn func(context.Context)) {
	c.bg.Add(1)
	go func() {
		defer c.bg.Done()
		if now {
			fn(ctx)
		}
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-c.base.Done():
				return
			case <-t.C:
				fn(ctx)
			}
		}
	}()
}

// Close ends every live session with ErrShuttingDown, stops background
// resolution, and waits up to ctx for sessions to end.
func (c *Control) Close(ctx context.Context) error {
	c.cancel(ErrShuttingDown)
	c.endSessionsIf(func(*Session) bool { return true }, ErrShuttingDown)
	done := make(chan struct{})
	go func() {
		c.sessions.wait()
		c.bg.Wait()
		close(done)
	}()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("control: %d sessions still open at shutdown", c.sessions.count())
	}
}

// keyedMutex serialises mutations of one sandbox, so that the record and the
// cluster see them in the same order. An entry lives only while someone
// holds or waits for it.
type keyedMutex struct {
	mu sync.Mutex
	m  map[string]*refMutex
}

type refMutex struct {
	sync.Mutex
	refs int
}

func (k *keyedMutex) lock(id string) (unlock func()) {
	k.mu.Lock()
	if k.m == nil {
		k.m = map[string]*refMutex{}
	}
	e := k.m[id]
	if e == nil {
		e = &refMutex{}
		k.m[id] = e
	}
	e.refs++
	k.mu.Unlock()
	e.Lock()
	return func() {
		e.Unlock()
		k.mu.Lock()
		e.refs--
		if e.refs == 0 {
			delete(k.m, id)
		}
		k.mu.Unlock()
	}
}

// size is the number of live entries, for tests of boundedness.
func (k *keyedMutex) size() int {
	k.mu.Lock()
	defer k.mu.Unlock()
	return len(k.m)
}
