// Package control is the one core that every way into hiloop calls for what
// a caller may do to a sandbox: the HTTP API and the SSH gateway alike. It
// owns the write path (record first, then the cluster, with one
// compensation when the cluster write fails), the resolution of creates whose
// outcome is unknown, capability admission, and the admission and registry
// of live sessions (exec and shells), with their limits.
//
// Calls run downward: control uses store, speaks package cluster's
// vocabulary to the cluster adapter without importing it (k8s implements
// Cluster and Executor), and never calls the mirror or a way in. The mirror calls down into it (to
// resolve pending creates) and learns which records control changed
// without a cluster event from Changed and TakeChanged.
package control

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sync/singleflight"

	"github.com/hiloop/hiloop/cluster"
	"github.com/hiloop/hiloop/metrics"
	"github.com/hiloop/hiloop/receipt"
	"github.com/hiloop/hiloop/store"
)

// Cluster is what control needs of the cluster: k8s.Writer satisfies it.
// Its calls fail with a *cluster.Error.
type Cluster interface {
	// Receipt is what a sandbox of the organization with this spec is
	// promised; it is stored in the record and annotated on the object.
	Receipt(orgID string, spec store.Spec) receipt.Receipt
	// Create makes the object of a record. gatewayKey is the gateway's
	// public key (authorized_keys form) for a receipt with a session
	// helper, else empty.
	Create(ctx context.Context, sb store.Sandbox, gatewayKey string) error
	// Exists reports whether the Sandbox object of a sandbox id exists,
	// asking the API server (not a cache).
	Exists(ctx context.Context, id string) (bool, error)
	SetMode(ctx context.Context, id string, mode store.Mode) error
	SetExpiry(ctx context.Context, id string, at time.Time) error
	Delete(ctx context.Context, id string) error
	// PodAddr is the IP of a sandbox's pod, only when it is the pod of
	// this uid and it is Running and Ready now; otherwise a
	// *cluster.PodNotServingError.
	PodAddr(ctx context.Context, id, uid string) (ip string, err error)
}

// Executor runs a command in a sandbox's workload container: k8s.Execer
// satisfies it. A stream that was never set up fails with a
// *cluster.ConnectError.
type Executor interface {
	Exec(ctx context.Context, sandboxID string, req cluster.ExecRequest) (cluster.ExitStatus, error)
}

// Capabilities are what this deployment backs. A request for anything else
// is refused with ErrUnsupported rather than half-honoured.
type Capabilities struct {
	// StorageClasses a volume may name. A volume that names none gets the
	// cluster's default class, which is always backed.
	StorageClasses []string
	// Transports a sandbox may ask for.
	Transports []receipt.Transport
}

// Limits bound concurrent sessions (exec streams, one-shot execs, shells)
// and the keys an organization may hold.
type Limits struct {
	PerSandbox int
	PerOrg     int
	// APIKeysPerOrg and SSHKeysPerOrg are the most live API keys and
	// registered SSH keys one organization may have; 100 each when zero.
	// Every key holds its own rate-limit bucket and SSH connection places,
	// so a limit per key is only a limit while keys are few.
	APIKeysPerOrg int
	SSHKeysPerOrg int
	// WakeWaitsPerKey and WakeWaitsPerOrg are the most calls of one key,
	// and of all of one organization's keys together, that may wait at
	// once for a sandbox to wake (Wake); 16 and 64 when zero. Each waiting
	// call holds a goroutine and its caller's connection for up to
	// WakeTimeout, and nothing else bounds how many there are.
	WakeWaitsPerKey int
	WakeWaitsPerOrg int
	// PreviewsPerSandbox is the most live previews one sandbox may have;
	// DefaultPreviewsPerSandbox when zero.
	PreviewsPerSandbox int
}

// Default bounds of the calls waiting for sandboxes to wake.
const (
	DefaultWakeWaitsPerKey = 16
	DefaultWakeWaitsPerOrg = 64
)

// Options configure New.
type Options struct {
	Store   *store.Store
	Cluster Cluster
	// Exec runs commands; sessions are refused with ErrNoExec without it.
	Exec Executor
	Caps Capabilities
	// Limits default to 8 sessions per sandbox and 32 per organization.
	Limits Limits
	// ClusterTimeout bounds each cluster call; cluster.DefaultTimeout
	// when zero.
	ClusterTimeout time.Duration
	// SweepInterval is how often live sessions and registered connections
	// are held to their key and sandbox (a revoke offline, a stop or
	// quarantine seen by the mirror); 2s when zero.
	SweepInterval time.Duration
	Log           *slog.Logger
	Now           func() time.Time
	// Metrics records cluster errors; optional.
	Metrics *metrics.Metrics
	// Boundary is the isolation self-check (boundary.Check).
	// With it, creates and starts are refused until a check passes, and
	// whenever the last one failed. Nil runs without (the core's own tests).
	Boundary func(ctx context.Context) []cluster.Check
	// BoundaryInterval is how often Run repeats the self-check; 1m when zero.
	BoundaryInterval time.Duration
	// EventRetention is how long state transitions are kept; Run prunes
	// older ones at start and every hour. Zero keeps them forever.
	EventRetention time.Duration
	// DefaultIdleTimeout is the idle timeout of a sandbox whose create
	// names none and whose organization sets none; zero is off.
	DefaultIdleTimeout time.Duration
	// WakeTimeout bounds how long a wake waits for the sandbox to run; 2m
	// when zero.
	WakeTimeout time.Duration
	// RuntimeAttestation has Attest observe each new pod's runtime from
	// inside it (attest.go); Attest does nothing without it.
	RuntimeAttestation bool
	// AttestTimeout bounds one pod's attestation, every probe together;
	// 10s when zero.
	AttestTimeout time.Duration
	// ActivityFlush is how often, at most, the use of one sandbox is
	// written to the record beyond the start of a use; 30s when zero.
	// Run checks for idle sandboxes every SweepInterval.
	ActivityFlush time.Duration
}

// Caller is who asks: the organization and the key that actually
// authenticated the request or connection. The key id's prefix says its
// kind (an API key, an SSH key). Every change (create, stop, start,
// delete, update, touch, API key create and revoke, SSH key add and
// delete), every session and connection (Admit, Reachable, Connect, Wake)
// and WaitWhile hold it to the record at the call, not only where the
// request came in, and refuse a caller without a live key of its
// organization (ErrUnauthenticated), an empty one included: a revoke that
// lands after a request came in refuses what the request would change.
type Caller struct {
	OrgID string
	KeyID string
	// Preview, when set, is the preview a visitor came through
	// (PreviewVisitor): the caller is held to it as to its key.
	Preview string
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
	// conns holds the connections that can open sessions (Connect).
	conns connRegistry
	// ends counts calls of end, so an admission that raced one checks
	// again.
	ends atomic.Uint64

	boundary atomic.Pointer[BoundaryReport]

	// activity is the use of sandboxes; wakes makes concurrent wakes of
	// one sandbox one, and waking holds the ids of those under way.
	activity activity
	wakes    singleflight.Group
	waking   sync.Map
	// wakesBegun counts every wake begun, so a caller can tell that one
	// began while it read a record.
	wakesBegun atomic.Int64
	// waits counts the calls waiting in Wake, against Limits.WakeWaits*.
	waits waitRegistry

	changedMu sync.Mutex
	changed   map[string]bool
	notify    chan struct{}

	// attests are the pods waiting for a runtime attestation.
	attests attestations

	// modeWrites counts, per sandbox, the desired-mode changes under way
	// (see ModeWriting).
	modeWritesMu sync.Mutex
	modeWrites   map[string]int
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
		o.ClusterTimeout = cluster.DefaultTimeout
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
	if o.Limits.APIKeysPerOrg < 0 || o.Limits.SSHKeysPerOrg < 0 {
		return nil, errors.New("control: key limits must not be negative")
	}
	if o.Limits.PreviewsPerSandbox < 0 {
		return nil, errors.New("control: the preview limit must not be negative")
	}
	if o.Limits.PreviewsPerSandbox == 0 {
		o.Limits.PreviewsPerSandbox = DefaultPreviewsPerSandbox
	}
	if o.Limits.WakeWaitsPerKey < 0 || o.Limits.WakeWaitsPerOrg < 0 {
		return nil, errors.New("control: wake wait limits must not be negative")
	}
	if o.Limits.WakeWaitsPerKey == 0 {
		o.Limits.WakeWaitsPerKey = DefaultWakeWaitsPerKey
	}
	if o.Limits.WakeWaitsPerOrg == 0 {
		o.Limits.WakeWaitsPerOrg = DefaultWakeWaitsPerOrg
	}
	if o.Limits.APIKeysPerOrg == 0 {
		o.Limits.APIKeysPerOrg = DefaultKeysPerOrg
	}
	if o.Limits.SSHKeysPerOrg == 0 {
		o.Limits.SSHKeysPerOrg = DefaultKeysPerOrg
	}
	if o.DefaultIdleTimeout < 0 {
		return nil, errors.New("control: the default idle timeout must not be negative")
	}
	if o.WakeTimeout == 0 {
		o.WakeTimeout = 2 * time.Minute
	}
	if o.AttestTimeout == 0 {
		o.AttestTimeout = 10 * time.Second
	}
	if o.ActivityFlush == 0 {
		o.ActivityFlush = 30 * time.Second
	}
	base, cancel := context.WithCancelCause(context.Background())
	c := &Control{o: o, log: o.Log.With("component", "control"), base: base, cancel: cancel,
		changed: map[string]bool{}, notify: make(chan struct{}, 1), modeWrites: map[string]int{}}
	c.sessions.init()
	// Before anything is admitted: a use the previous process left open
	// is taken to have lasted until now (see activity.go).
	ctx, stop := context.WithTimeout(base, 10*time.Second)
	defer stop()
	n, err := o.Store.ResumeActivity(ctx, o.Now())
	if err != nil {
		cancel(err)
		return nil, fmt.Errorf("control: %w", err)
	}
	if n > 0 {
		c.log.Info("resumed the idle clocks of sandboxes in use when hiloop last stopped", "sandboxes", n)
	}
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

// ModeWriting reports whether a desired-mode change of sandbox id is under
// way: from before the record takes it until the cluster answered its
// write (or the record was restored after the write failed). Meanwhile the
// record and the cluster disagree on the mode by hiloop's own doing, so the
// mirror decides nothing about the sandbox (a start's pod is seen before
// the patch's answer is; a record asking to run beside an object still
// suspended): it would record hiloop's own change as a mode changed outside
// hiloop. The end of the change queues the sandbox for the mirror again.
func (c *Control) ModeWriting(id string) bool {
	c.modeWritesMu.Lock()
	defer c.modeWritesMu.Unlock()
	return c.modeWrites[id] > 0
}

// setMode records a desired-mode change of sandbox id and has the cluster
// carry it out (applyMode), with the sandbox's lock held, as one change
// that ModeWriting reports from before the record takes it until the
// cluster answered.
func (c *Control) setMode(ctx context.Context, orgID, id string, mode store.Mode, cause store.StopCause) (store.Sandbox, error) {
	c.modeWritesMu.Lock()
	c.modeWrites[id]++
	c.modeWritesMu.Unlock()
	defer func() {
		c.modeWritesMu.Lock()
		if c.modeWrites[id]--; c.modeWrites[id] <= 0 {
			delete(c.modeWrites, id)
		}
		c.modeWritesMu.Unlock()
		c.touch(id)
	}()
	ch, err := c.o.Store.SetDesiredMode(ctx, orgID, id, mode, cause)
	if err != nil {
		return store.Sandbox{}, err
	}
	return c.applyMode(ch)
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

// SandboxesByState counts the record's sandboxes by state, and its
// organizations, for the metrics.
func (c *Control) SandboxesByState(ctx context.Context) (map[string]int, int, error) {
	return c.o.Store.Counts(ctx)
}

// SessionsByTransport counts live sessions by transport, for the metrics.
func (c *Control) SessionsByTransport() map[receipt.Transport]int {
	out := map[receipt.Transport]int{}
	for _, t := range receipt.Transports() {
		out[t] = 0
	}
	for _, s := range c.sessions.list() {
		out[s.Transport]++
	}
	return out
}

// Run sweeps live sessions and registered connections every SweepInterval
// until ctx ends: a session whose key was revoked (offline too) or whose
// sandbox stopped running ends within one sweep, and so does a connection
// whose key was revoked or whose sandbox was quarantined or is gone. At
// the same pace it writes the use of sandboxes that is due and stops the
// sandboxes that went unused for their idle timeout. It repeats the
// isolation self-check every BoundaryInterval.
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
			c.flushUse(ctx, false)
			c.stopIdle(ctx)
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

// Close ends every live session and closes every registered connection
// with ErrShuttingDown, registers no more, stops background resolution,
// waits up to ctx for sessions to end, and writes the use of sandboxes
// that the record does not have yet.
func (c *Control) Close(ctx context.Context) error {
	c.cancel(ErrShuttingDown)
	c.conns.close()
	c.end(ErrShuttingDown, func(string, string) bool { return true })
	done := make(chan struct{})
	go func() {
		c.sessions.wait()
		c.bg.Wait()
		close(done)
	}()
	var err error
	select {
	case <-done:
	case <-ctx.Done():
		err = fmt.Errorf("control: %d sessions still open at shutdown", c.sessions.count())
	}
	fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	c.flushUse(fctx, true)
	return err
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
