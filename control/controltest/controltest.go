// Package controltest has fakes of what control needs of the cluster, for
// pure unit tests of control and of the ways in. Cluster behaviour itself is
// tested against the real local cluster.
package controltest

import (
	"context"
	"sync"
	"time"

	"github.com/hiloop/hiloop/cluster"
	"github.com/hiloop/hiloop/k8s"
	"github.com/hiloop/hiloop/receipt"
	"github.com/hiloop/hiloop/store"
)

// Cluster is a control.Cluster with programmable failures. It records every
// call as "verb id [mode]". Its failures are classified as the cluster
// writer classifies its own (k8s.Classify), so a test may set an API
// server's error.
type Cluster struct {
	mu      sync.Mutex
	calls   []string
	objects map[string]bool
	// helperKeys are the gateway keys Create was given, by sandbox id.
	helperKeys map[string]string
	// CreateErr fails Create; with CreateWrites the object is written all
	// the same (an ambiguous timeout).
	CreateErr    error
	CreateWrites bool
	ModeErr      error
	ExpiryErr    error
	DeleteErr    error
	// Hang makes Exists and Create wait for their context to end, as
	// against a hung API server.
	Hang bool
	// SessionPort is the session helper's port that receipts of sandboxes
	// with the forward transport promise (a helper a test runs on
	// 127.0.0.1:0); k8s.DefaultSessionPort when zero.
	SessionPort int
	// Transports are the deployment's transports that receipts are made
	// for; exec alone when nil.
	Transports []receipt.Transport
	// OnMode, when set, is called (without the fake's lock) by SetMode
	// and Delete (with store.ModeDeleted) before they answer: the moment
	// the API server has the write and hiloop has not its answer, when
	// what the write does to the pod (its processes killed) happens.
	OnMode func(id string, mode store.Mode)
	// OnExpiry, when set, is called (without the fake's lock) by SetExpiry
	// before it answers, as OnMode is by SetMode.
	OnExpiry func(id string)
}

// onMode calls OnMode, when set.
func (f *Cluster) onMode(id string, mode store.Mode) {
	f.mu.Lock()
	on := f.OnMode
	f.mu.Unlock()
	if on != nil {
		on(id, mode)
	}
}

// hang waits for ctx when Hang is set, with the lock released.
func (f *Cluster) hang(ctx context.Context) error {
	f.mu.Lock()
	h := f.Hang
	f.mu.Unlock()
	if !h {
		return nil
	}
	<-ctx.Done()
	return ctx.Err()
}

func (f *Cluster) record(call string) {
	f.calls = append(f.calls, call)
}

// Calls returns the calls made so far.
func (f *Cluster) Calls() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string{}, f.calls...)
}

// Set changes the failures under the lock.
func (f *Cluster) Set(fn func(f *Cluster)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	fn(f)
}

// Has reports whether the object of id exists.
func (f *Cluster) Has(id string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.objects[id]
}

// Receipt makes the receipt of a gvisor deployment backing Transports,
// with the helper on SessionPort.
func (f *Cluster) Receipt(orgID string, spec store.Spec) receipt.Receipt {
	f.mu.Lock()
	port, transports := f.SessionPort, f.Transports
	f.mu.Unlock()
	if transports == nil {
		transports = []receipt.Transport{receipt.TransportExec}
	}
	return k8s.NewReceipt(orgID, spec, k8s.RenderOptions{RuntimeClass: k8s.DefaultRuntimeClass, Transports: transports, SessionPort: port})
}

// Create records the object unless CreateErr is set (and CreateWrites is
// not).
func (f *Cluster) Create(ctx context.Context, sb store.Sandbox, gatewayKey string) error {
	if err := f.hang(ctx); err != nil {
		return k8s.Classify(err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.record("create " + sb.ID)
	if f.CreateErr == nil || f.CreateWrites {
		if f.objects == nil {
			f.objects, f.helperKeys = map[string]bool{}, map[string]string{}
		}
		f.objects[sb.ID] = true
		f.helperKeys[sb.ID] = gatewayKey
	}
	return k8s.Classify(f.CreateErr)
}

// Exists reports whether the object exists.
func (f *Cluster) Exists(ctx context.Context, id string) (bool, error) {
	f.mu.Lock()
	f.record("exists " + id)
	f.mu.Unlock()
	if err := f.hang(ctx); err != nil {
		return false, k8s.Classify(err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.objects[id], nil
}

// SetMode calls OnMode and fails with ModeErr.
func (f *Cluster) SetMode(_ context.Context, id string, mode store.Mode) error {
	f.onMode(id, mode)
	f.mu.Lock()
	defer f.mu.Unlock()
	f.record("mode " + id + " " + string(mode))
	return k8s.Classify(f.ModeErr)
}

// SetExpiry calls OnExpiry and fails with ExpiryErr.
func (f *Cluster) SetExpiry(_ context.Context, id string, _ time.Time) error {
	f.mu.Lock()
	on := f.OnExpiry
	f.mu.Unlock()
	if on != nil {
		on(id)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.record("expiry " + id)
	return k8s.Classify(f.ExpiryErr)
}

// Delete calls OnMode and removes the object unless DeleteErr is set.
func (f *Cluster) Delete(_ context.Context, id string) error {
	f.onMode(id, store.ModeDeleted)
	f.mu.Lock()
	defer f.mu.Unlock()
	f.record("delete " + id)
	if f.DeleteErr == nil {
		delete(f.objects, id)
	}
	return k8s.Classify(f.DeleteErr)
}

// Exec runs every command with Run when set; otherwise it fails with Err,
// or, with Hang, never opens the stream, or runs until its context ends (a
// command that outlives its caller's timeout).
type Exec struct {
	Err error
	Run func(ctx context.Context, req cluster.ExecRequest) (cluster.ExitStatus, error)
	// Hang makes the stream's set-up wait for the context to end, as
	// against a hung API server, and then fail as the cluster adapter
	// does: a *cluster.ConnectError wrapping the context's error.
	Hang bool
}

// Exec implements control.Executor.
func (e Exec) Exec(ctx context.Context, _ string, req cluster.ExecRequest) (cluster.ExitStatus, error) {
	if e.Run != nil {
		return e.Run(ctx, req)
	}
	if e.Err != nil {
		return cluster.ExitStatus{}, e.Err
	}
	<-ctx.Done()
	if e.Hang {
		return cluster.ExitStatus{}, &cluster.ConnectError{Err: ctx.Err()}
	}
	return cluster.ExitStatus{}, ctx.Err()
}

// PodUID is the uid of the pod the fake runs for a sandbox: a test records
// it as the mirror would, in the observation that makes the sandbox running.
func PodUID(id string) string { return "uid-" + id }

// PodAddr answers a loopback address for the pod of PodUID(id), and for any
// other uid that the pod was replaced, as the cluster writer does.
func (f *Cluster) PodAddr(_ context.Context, id, uid string) (string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.record("podaddr " + id)
	if uid != PodUID(id) {
		return "", &cluster.PodNotServingError{Reason: "the pod was replaced since it was last observed"}
	}
	return "127.0.0.1", nil
}

// HelperKey is the gateway key that Create was given for a sandbox, which
// its pod's session helper would accept; "" when there was none.
func (f *Cluster) HelperKey(id string) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.helperKeys[id]
}
