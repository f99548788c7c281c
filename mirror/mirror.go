// Package mirror converges what the cluster observed into the product record.
// It watches Sandbox objects and sandbox pods (label-selected, cached as
// compact views of what Decide reads), decides each sandbox's state with the
// pure function Decide when an update changed what it reads, and writes only
// when the decision changes. It never writes to the cluster.
package mirror

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/agent-sandbox/api/v1beta1"

	"github.com/hiloop/hiloop/k8s"
	"github.com/hiloop/hiloop/metrics"
	"github.com/hiloop/hiloop/store"
)

// Options configure New.
type Options struct {
	Clients   *k8s.Clients
	Store     *store.Store
	Namespace string
	Log       *slog.Logger
	Now       func() time.Time
	// Resync is how often every cached object is re-decided, a safety net:
	// cluster events drive the mirror, and a sandbox with a shutdown time is
	// queued again for that moment. 10m when zero: at 10,000 sandboxes a
	// pass is 10,000 decisions, which every 30 s competed with the API.
	Resync time.Duration
	// SyncTimeout bounds the wait for the informers' first sync; 60s when zero.
	SyncTimeout time.Duration
	// Workers is the number of concurrent reconcilers; 4 when zero.
	Workers int
	// Control resolves pending creates and says which records it changed
	// without a cluster event; optional.
	Control Control
	// Metrics records the queue depth and the lag from event to write;
	// optional.
	Metrics *metrics.Metrics
	// Written is the uid of a sandbox's object and the generation hiloop's
	// own latest write of it produced (k8s.Writer.Written): a decision
	// waits until the Sandbox watch shows it, for at most maxHold.
	// Optional.
	Written func(id string) (uid string, generation int64)
	// Writing reports whether hiloop is changing a sandbox's mode: the
	// record may already ask for the new mode while the cluster's answer
	// to the write has not come (control.Control.ModeWriting). Meanwhile
	// nothing is decided about the sandbox, however long the change's own
	// cluster call takes; its end queues the sandbox again through
	// Control, and the decision then waits on Written as above. Optional.
	Writing func(id string) bool
}

// Control is what the mirror needs of the control plane's core
// (*control.Control): the mirror calls down into it, never the reverse.
type Control interface {
	// ResolvePending resolves, in the background, a record left pending by
	// a create whose outcome is unknown.
	ResolvePending(id string)
	// Changed is signalled when records changed that no cluster event will
	// show; TakeChanged says which.
	Changed() <-chan struct{}
	TakeChanged() []string
	// Attest asks, without waiting, for the runtime of a sandbox's pod to
	// be observed from inside it; the record says what was seen
	// (store.Sandbox.RuntimePod), and the core's own Changed queues the
	// sandbox again once it does.
	Attest(id, podUID string)
}

// Mirror is the status mirror.
type Mirror struct {
	o       Options
	log     *slog.Logger
	queue   workqueue.TypedRateLimitingInterface[string]
	objects cache.Store
	pods    cache.Indexer
	synced  []cache.InformerSynced

	// informers watch Sandboxes (through sandboxListWatch) and pods
	// (protobuf, which client-go decodes cheaply). Each calls the handler on
	// its own delivery goroutine: a shared informer would hand every event
	// on through two goroutines more, and nothing here shares them.
	informers []cache.Controller

	// receipts memoizes the receipts Decide reads (see receiptCache).
	receipts receiptCache

	mu    sync.Mutex
	ready bool
	// seen is when the oldest unhandled event of each queued sandbox came.
	seen map[string]time.Time
	// held is when each sandbox whose decisions wait for the watch to show
	// hiloop's own write (see behind) began to wait.
	held map[string]time.Time
}

// errBehindWrite: the cache's Sandbox is older than hiloop's own latest
// write of it, so nothing is decided until the watch delivers that write
// (or maxHold passes).
var errBehindWrite = errors.New("the Sandbox watch is behind hiloop's own write")

// maxHold bounds how long a sandbox's decisions wait for the watch to show
// hiloop's own write: past it, the mirror decides on what it has. The watch
// shows a write within milliseconds; writes coming faster than it (a
// tenant's starts and stops one after another) must not keep a failed pod
// from being recorded. maxHeld bounds the sandboxes whose wait is timed;
// past it the timing starts over.
const (
	maxHold = 3 * time.Second
	maxHeld = 10_000
)

// podOwnerIndex indexes pods by the id of the sandbox they belong to.
const podOwnerIndex = "sandbox"

// New builds a mirror. It starts nothing until Run.
func New(o Options) (*Mirror, error) {
	if o.Clients == nil || o.Store == nil || o.Namespace == "" {
		return nil, errors.New("mirror: clients, store and namespace are required")
	}
	if o.Log == nil {
		o.Log = slog.Default()
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Resync == 0 {
		o.Resync = 10 * time.Minute
	}
	if o.SyncTimeout == 0 {
		o.SyncTimeout = 60 * time.Second
	}
	if o.Workers == 0 {
		o.Workers = 4
	}
	m := &Mirror{o: o, log: o.Log.With("component", "mirror"), seen: map[string]time.Time{}, held: map[string]time.Time{},
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(workqueue.DefaultTypedControllerRateLimiter[string](),
			workqueue.TypedRateLimitingQueueConfig[string]{Name: "mirror"})}

	handler := cache.ResourceEventHandlerFuncs{
		AddFunc: m.enqueueObject,
		UpdateFunc: func(old, obj any) {
			if changed(old, obj) {
				m.enqueueObject(obj)
			}
		},
		DeleteFunc: m.enqueueObject,
	}
	objects, sbInformer := cache.NewInformerWithOptions(cache.InformerOptions{
		ListerWatcher: sandboxListWatch(o.Clients.Sandbox.AgentsV1beta1().RESTClient(), o.Namespace, k8s.Selector),
		ObjectType:    &v1beta1.Sandbox{}, Handler: handler, ResyncPeriod: o.Resync, Transform: compact})
	pods, podInformer := cache.NewInformerWithOptions(cache.InformerOptions{
		ListerWatcher: cache.NewFilteredListWatchFromClient(o.Clients.Kube.CoreV1().RESTClient(), "pods", o.Namespace,
			func(lo *metav1.ListOptions) { lo.LabelSelector = k8s.Selector }),
		ObjectType: &corev1.Pod{}, Handler: handler, ResyncPeriod: o.Resync, Transform: compact,
		Indexers: cache.Indexers{podOwnerIndex: podSandboxIDs}})
	m.objects, m.pods = objects, pods.(cache.Indexer)
	m.informers = []cache.Controller{sbInformer, podInformer}
	m.synced = []cache.InformerSynced{sbInformer.HasSynced, podInformer.HasSynced}
	return m, nil
}

// podSandboxIDs indexes a pod under the sandbox its controller reference
// names, else under its sandbox label.
func podSandboxIDs(obj any) ([]string, error) {
	if id := podSandboxID(obj); id != "" {
		return []string{id}, nil
	}
	return nil, nil
}

func podSandboxID(obj any) string {
	pod, ok := obj.(*podView)
	if !ok {
		return ""
	}
	if ref := pod.owner; ref != nil && ref.Kind == "Sandbox" {
		if id, ok := k8s.IDFromName(ref.Name); ok {
			return id
		}
	}
	return pod.sandbox
}

func (m *Mirror) enqueueObject(obj any) {
	if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = t.Obj
	}
	obj, _ = compact(obj)
	switch o := obj.(type) {
	case *sandboxView:
		if id, ok := k8s.IDFromName(o.name); ok {
			m.add(id)
		}
	case *podView:
		if id := podSandboxID(o); id != "" {
			m.add(id)
		}
	}
}

// sandbox is the cached Sandbox object of a sandbox, or nil.
func (m *Mirror) sandbox(id string) *v1beta1.Sandbox {
	item, ok, err := m.objects.GetByKey(m.o.Namespace + "/" + k8s.ObjectName(id))
	if err != nil || !ok {
		return nil
	}
	return item.(*sandboxView).object()
}

// add queues a sandbox for a cluster event, remembering when the oldest
// unhandled one came.
func (m *Mirror) add(id string) {
	m.mu.Lock()
	if _, ok := m.seen[id]; !ok {
		m.seen[id] = m.o.Now()
	}
	m.mu.Unlock()
	m.queue.Add(id)
	m.o.Metrics.MirrorQueue(m.queue.Len())
}

// Ready reports whether the informers synced and the start-up reconcile of
// every unsettled record is done.
func (m *Mirror) Ready() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.ready
}

// Run starts the informers, waits for their sync, reconciles every unsettled
// record, then mirrors until ctx ends.
func (m *Mirror) Run(ctx context.Context) error {
	// One teardown for every return: end the context (the informers and
	// the change listener stop with it), shut the queue down once (the
	// workers stop), wait for the workers, then for the informers.
	ctx, stop := context.WithCancel(ctx)
	var wg, watching sync.WaitGroup
	defer func() {
		stop()
		m.queue.ShutDown()
		wg.Wait()
		watching.Wait()
	}()
	for _, inf := range m.informers {
		watching.Go(func() { inf.RunWithContext(ctx) })
	}

	syncCtx, cancel := context.WithTimeout(ctx, m.o.SyncTimeout)
	ok := cache.WaitForCacheSync(syncCtx.Done(), m.synced...)
	cancel()
	if !ok {
		if ctx.Err() != nil {
			return nil
		}
		return fmt.Errorf("mirror: informers did not sync within %s", m.o.SyncTimeout)
	}

	for range m.o.Workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for m.processNext(ctx) {
			}
		}()
	}
	if c := m.o.Control; c != nil {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-ctx.Done():
					return
				case <-c.Changed():
					for _, id := range c.TakeChanged() {
						m.queue.Add(id)
					}
				}
			}
		}()
	}

	if err := m.startupReconcile(ctx); err != nil {
		return err
	}
	m.mu.Lock()
	m.ready = true
	m.mu.Unlock()
	m.log.Info("mirror synced")
	<-ctx.Done()
	return nil
}

// startupReconcile decides every unsettled record against the synced cache,
// so whatever changed while hiloop was down converges, and reports objects
// no record knows.
func (m *Mirror) startupReconcile(ctx context.Context) error {
	recs, err := m.o.Store.Unsettled(ctx)
	if err != nil {
		return fmt.Errorf("mirror: %w", err)
	}
	known := map[string]bool{}
	for _, rec := range recs {
		known[rec.ID] = true
		if rec.State == store.StatePending && m.o.Control != nil {
			if m.sandbox(rec.ID) == nil {
				// Resolved in the background, each attempt bounded: a hung
				// API server does not keep the mirror from being ready.
				m.o.Control.ResolvePending(rec.ID)
				continue
			}
		}
		// The record just read decides first: only a sandbox whose record
		// is behind the cluster takes a turn on the writer.
		_, behind, err := m.decide(rec)
		if errors.Is(err, errBehindWrite) {
			err = nil
		}
		if err == nil && behind {
			_, err = m.reconcile(ctx, rec.ID, time.Time{})
		}
		if err != nil {
			m.log.Error("startup reconcile", "sandbox", rec.ID, "err", err)
		}
	}
	for _, item := range m.objects.List() {
		o := item.(*sandboxView)
		id, ok := k8s.IDFromName(o.name)
		if ok && known[id] {
			continue
		}
		if ok {
			if _, err := m.o.Store.SandboxAnyOrg(ctx, id); err == nil {
				continue
			}
		}
		m.log.Warn("sandbox object with hiloop labels that no record knows; leaving it alone", "object", o.name, "namespace", o.namespace)
	}
	return nil
}

func (m *Mirror) processNext(ctx context.Context) bool {
	id, quit := m.queue.Get()
	if quit {
		return false
	}
	defer m.queue.Done(id)
	m.o.Metrics.MirrorQueue(m.queue.Len())
	m.mu.Lock()
	since, seen := m.seen[id]
	delete(m.seen, id)
	m.mu.Unlock()
	if !seen {
		since = time.Time{}
	}
	changed, err := m.reconcile(ctx, id, since)
	if changed && seen {
		m.o.Metrics.MirrorLag(m.o.Now().Sub(since))
	}
	if err != nil {
		if ctx.Err() == nil {
			m.log.Warn("reconcile", "sandbox", id, "err", err)
			m.queue.AddRateLimited(id)
		}
		return true
	}
	m.queue.Forget(id)
	return true
}

// deadline is the next moment at which time alone changes what Decide says
// of a sandbox: its shutdown time, or the record's expiry; zero when none.
func deadline(obj *v1beta1.Sandbox, rec store.Sandbox) time.Time {
	var t time.Time
	if obj != nil && obj.Spec.ShutdownTime != nil {
		t = obj.Spec.ShutdownTime.Time
	}
	if rec.ExpiresAt != nil && (t.IsZero() || rec.ExpiresAt.Before(t)) {
		t = *rec.ExpiresAt
	}
	return t
}

// wakeAt queues a sandbox again at its deadline when that is still to come.
// The queue keeps one wake-up per sandbox, the earliest.
func (m *Mirror) wakeAt(id string, at, now time.Time) {
	if !at.IsZero() && at.After(now) {
		m.queue.AddAfter(id, at.Sub(now))
	}
}

// reconcile decides one sandbox from the cache against its record and
// records the result, reporting whether it wrote. It decides in the store's
// write transaction (see store.ObserveWith), so a decision is never made
// from a record another write has changed since. since is when the oldest
// cluster event behind it arrived (zero when none did); the log line gives
// the lag from it.
func (m *Mirror) reconcile(ctx context.Context, id string, since time.Time) (bool, error) {
	var obs store.Observation
	changed, err := m.o.Store.ObserveWith(ctx, id, func(rec store.Sandbox) (store.Observation, error) {
		var err error
		obs, _, err = m.decide(rec)
		return obs, err
	})
	switch {
	case errors.Is(err, store.ErrNotFound):
		return false, nil // an orphan: reported at start-up, otherwise ignored
	case errors.Is(err, errBehindWrite):
		return false, nil
	}
	if err != nil {
		return false, err
	}
	if changed {
		attrs := []any{"sandbox", id, "state", obs.State, "anomaly", obs.Anomaly, "reason", obs.Reason}
		if !since.IsZero() {
			attrs = append(attrs, "event_lag_ms", float64(m.o.Now().Sub(since).Microseconds())/1000)
		}
		m.log.Info("observed", attrs...)
	}
	return changed, nil
}

// behind reports whether the decisions about sandbox id wait: hiloop is
// changing its mode (Options.Writing), or its cached object obj is older
// (by generation, the same uid) than hiloop's own latest write of it, and
// has been for less than maxHold. The watch event of the write queues the
// sandbox again; so does the end of the wait, in case the event never
// comes.
func (m *Mirror) behind(id string, obj *v1beta1.Sandbox, now time.Time) bool {
	if m.o.Writing != nil && m.o.Writing(id) {
		// The hold on Written is timed from its own first wait, once the
		// change's write has been answered.
		m.mu.Lock()
		delete(m.held, id)
		m.mu.Unlock()
		// The change's end queues the sandbox again; this is in case
		// nothing tells the mirror of it.
		m.queue.AddAfter(id, maxHold)
		return true
	}
	if m.o.Written == nil {
		return false
	}
	uid, gen := "", int64(0)
	if obj != nil {
		uid, gen = m.o.Written(id)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if obj == nil || uid != string(obj.UID) || obj.Generation >= gen {
		delete(m.held, id)
		return false
	}
	since, ok := m.held[id]
	if !ok {
		if len(m.held) >= maxHeld {
			clear(m.held)
		}
		since = now
		m.held[id] = now
	}
	wait := maxHold - now.Sub(since)
	if wait <= 0 {
		return false
	}
	m.queue.AddAfter(id, wait)
	return true
}

// decide says what the cache shows of the sandbox of rec, a record not yet
// terminal, and whether that differs from the record; it queues the sandbox
// again for its next deadline, and asks for a running pod's runtime to be
// attested. It reads only the cache: it runs on the
// store's writer.
func (m *Mirror) decide(rec store.Sandbox) (store.Observation, bool, error) {
	obj := m.sandbox(rec.ID)
	now := m.o.Now()
	if m.behind(rec.ID, obj, now) {
		return store.Observation{}, false, errBehindWrite
	}
	items, err := m.pods.ByIndex(podOwnerIndex, rec.ID)
	if err != nil {
		return store.Observation{}, false, err
	}
	pods := make([]*corev1.Pod, 0, len(items))
	for _, it := range items {
		pods = append(pods, it.(*podView).object())
	}
	obs := Decide(obj, pods, rec, now, m.receipts.parse)
	m.wakeAt(rec.ID, deadline(obj, rec), now)
	// A pod seen running that nothing was seen inside of yet: every start
	// and every wake makes a new pod, and each is attested once.
	if c := m.o.Control; c != nil && obs.State == store.StateRunning && obs.PodUID != "" && rec.RuntimePod != obs.PodUID {
		c.Attest(rec.ID, obs.PodUID)
	}
	return obs, !obs.Unchanged(rec), nil
}
