package control

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hiloop/hiloop/cluster"
	"github.com/hiloop/hiloop/control/controltest"
	"github.com/hiloop/hiloop/receipt"
	"github.com/hiloop/hiloop/store"
)

// clock is the injected time of the idle tests: it moves only when told.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) Add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// idleCore is a core and its record on one injected clock.
type idleCore struct {
	*Control
	db  *store.Store
	fc  *controltest.Cluster
	clk *clock
	org store.Org
	who Caller
}

// newIdleCore builds a core whose record and core share an injected clock;
// opts adjusts its Options.
func newIdleCore(t *testing.T, opts func(*Options)) *idleCore {
	t.Helper()
	clk := &clock{t: time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)}
	path := filepath.Join(t.TempDir(), "c.db")
	db, err := store.Open(context.Background(), store.Options{Path: path, Now: clk.Now})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	fc := &controltest.Cluster{}
	ic := &idleCore{db: db, fc: fc, clk: clk}
	ic.Control = ic.newCore(t, opts)
	if ic.org, err = db.CreateOrg(context.Background(), "o", 100, 100); err != nil {
		t.Fatal(err)
	}
	ic.who = liveCaller(t, db, ic.org.ID)
	return ic
}

// newCore builds another core on the same record, as a restart does.
func (ic *idleCore) newCore(t *testing.T, opts func(*Options)) *Control {
	t.Helper()
	o := Options{Store: ic.db, Cluster: ic.fc, Exec: controltest.Exec{}, ClusterTimeout: time.Second, Now: ic.clk.Now,
		Log:  slog.New(slog.NewTextHandler(io.Discard, nil)),
		Caps: Capabilities{Transports: []receipt.Transport{receipt.TransportExec}}, ActivityFlush: 30 * time.Second}
	if opts != nil {
		opts(&o)
	}
	c, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		c.Close(ctx)
	})
	return c
}

// running creates a sandbox with an idle timeout and records it running.
func (ic *idleCore) running(t *testing.T, idle time.Duration) store.Sandbox {
	t.Helper()
	sb, _, err := ic.Create(context.Background(), ic.who, CreateRequest{Spec: store.Spec{Image: "busybox"}, IdleTimeout: &idle})
	if err != nil {
		t.Fatal(err)
	}
	ic.observe(t, sb.ID, store.StateRunning)
	return ic.get(t, sb.ID)
}

func (ic *idleCore) observe(t *testing.T, id string, st store.State) {
	t.Helper()
	if _, err := ic.db.Observe(context.Background(), id, store.Observation{State: st}); err != nil {
		t.Fatal(err)
	}
}

func (ic *idleCore) get(t *testing.T, id string) store.Sandbox {
	t.Helper()
	sb, err := ic.db.SandboxAnyOrg(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	return sb
}

// idleStopped reports whether the core asked the cluster to stop id and
// the record says it was for idleness.
func (ic *idleCore) idleStopped(t *testing.T, id string) bool {
	t.Helper()
	sb := ic.get(t, id)
	asked := slices.Contains(ic.fc.Calls(), "mode "+id+" stopped")
	if asked != sb.IdleStopped() {
		t.Fatalf("the cluster was asked to stop: %v, but the record says desired %s, cause %q", asked, sb.DesiredMode, sb.StopCause)
	}
	return asked
}

// TestIdleStop: a running sandbox is stopped, with cause idle, once it went
// unused for its idle timeout by the core's clock, and not a moment before;
// one without an idle timeout, or not running, is never stopped.
func TestIdleStop(t *testing.T) {
	ic := newIdleCore(t, nil)
	ctx := context.Background()
	sb := ic.running(t, time.Minute)
	off := ic.running(t, 0)
	starting, _, err := ic.Create(ctx, ic.who, CreateRequest{Spec: store.Spec{Image: "busybox"}, IdleTimeout: ptr(time.Minute)})
	if err != nil {
		t.Fatal(err)
	}
	ic.observe(t, starting.ID, store.StateStarting)

	ic.clk.Add(59 * time.Second)
	ic.stopIdle(ctx)
	if ic.idleStopped(t, sb.ID) {
		t.Fatal("stopped 59s into an idle timeout of 1m")
	}
	ic.clk.Add(time.Second)
	ic.stopIdle(ctx)
	if !ic.idleStopped(t, sb.ID) {
		t.Fatal("not stopped once idle for its timeout")
	}
	ic.clk.Add(time.Hour)
	ic.stopIdle(ctx)
	if ic.idleStopped(t, off.ID) || ic.idleStopped(t, starting.ID) {
		t.Fatal("a sandbox without an idle timeout, or not running, was stopped")
	}
}

// TestIdleClockStartsWhenRunning: the time a sandbox spends starting does
// not count as idle: the clock starts when it is observed running.
func TestIdleClockStartsWhenRunning(t *testing.T) {
	ic := newIdleCore(t, nil)
	ctx := context.Background()
	sb, _, err := ic.Create(ctx, ic.who, CreateRequest{Spec: store.Spec{Image: "busybox"}, IdleTimeout: ptr(time.Minute)})
	if err != nil {
		t.Fatal(err)
	}
	ic.clk.Add(10 * time.Minute)
	ic.observe(t, sb.ID, store.StateRunning)
	ic.stopIdle(ctx)
	if ic.idleStopped(t, sb.ID) {
		t.Fatal("stopped as it came up: the time it took to start counted as idle")
	}
	ic.clk.Add(time.Minute)
	ic.stopIdle(ctx)
	if !ic.idleStopped(t, sb.ID) {
		t.Fatal("not stopped a minute after it came up")
	}
}

// TestOpenUseKeepsAwake: an open session, and an open use of a session
// (a forwarded channel), keep a sandbox running whatever time passes; its
// clock starts when the last of them ends.
func TestOpenUseKeepsAwake(t *testing.T) {
	ic := newIdleCore(t, nil)
	ctx := context.Background()
	sb := ic.running(t, time.Minute)
	sess, err := ic.Admit(ctx, ic.who, sb.ID, receipt.TransportExec)
	if err != nil {
		t.Fatal(err)
	}
	channel, err := sess.Use()
	if err != nil {
		t.Fatal(err)
	}
	ic.clk.Add(24 * time.Hour)
	ic.stopIdle(ctx)
	sess.End()
	ic.clk.Add(24 * time.Hour)
	ic.stopIdle(ctx)
	if ic.idleStopped(t, sb.ID) {
		t.Fatal("stopped while a session or a channel was open")
	}
	channel()
	ic.clk.Add(59 * time.Second)
	ic.stopIdle(ctx)
	if ic.idleStopped(t, sb.ID) {
		t.Fatal("stopped 59s after the last use ended")
	}
	ic.clk.Add(time.Second)
	ic.stopIdle(ctx)
	if !ic.idleStopped(t, sb.ID) {
		t.Fatal("not stopped a minute after the last use ended")
	}
}

// TestIdleStopEndsSessionsKeepsConnections: an idle stop ends what is
// left of the sandbox's sessions with ErrIdleStopped and leaves its
// connections open, so their next session can wake it.
func TestIdleStopEndsSessionsKeepsConnections(t *testing.T) {
	ic := newIdleCore(t, func(o *Options) { o.Caps.Transports = append(o.Caps.Transports, receipt.TransportForward) })
	ic.fc.Set(func(f *controltest.Cluster) {
		f.Transports = []receipt.Transport{receipt.TransportExec, receipt.TransportForward}
	})
	ctx := context.Background()
	sb := ic.running(t, time.Minute)
	hungUp := make(chan error, 1)
	conn, err := ic.Connect(ctx, ic.who, sb.ID, func(cause error) { hungUp <- cause })
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	// A forward session alone is no use: only its channels are.
	fwd, err := ic.Admit(ctx, ic.who, sb.ID, receipt.TransportForward)
	if err != nil {
		t.Fatal(err)
	}
	defer fwd.End()
	ic.clk.Add(time.Minute)
	ic.stopIdle(ctx)
	if !ic.idleStopped(t, sb.ID) {
		t.Fatal("a forward session without a channel kept the sandbox awake")
	}
	if !errors.Is(fwd.Ended(), ErrIdleStopped) {
		t.Fatalf("forward session ended with %v, want ErrIdleStopped", context.Cause(fwd.Context()))
	}
	select {
	case cause := <-hungUp:
		t.Fatalf("an idle stop closed a connection: %v", cause)
	default:
	}
}

// TestTouch: a touch restarts the idle clock of one of the caller's own
// sandboxes only; another organization's touch is not found and changes
// nothing.
func TestTouch(t *testing.T) {
	ic := newIdleCore(t, nil)
	ctx := context.Background()
	sb := ic.running(t, time.Minute)
	other, err := ic.db.CreateOrg(ctx, "p", 10, 10)
	if err != nil {
		t.Fatal(err)
	}
	ic.clk.Add(50 * time.Second)
	if _, err := ic.Touch(ctx, liveCaller(t, ic.db, other.ID), sb.ID); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("another organization's touch: %v, want ErrNotFound", err)
	}
	if _, err := ic.Touch(ctx, Caller{OrgID: ic.org.ID, KeyID: "key_revoked"}, sb.ID); !errors.Is(err, ErrUnauthenticated) {
		t.Fatalf("a touch with a dead key: %v, want ErrUnauthenticated", err)
	}
	ic.clk.Add(10 * time.Second)
	ic.stopIdle(ctx)
	if !ic.idleStopped(t, sb.ID) {
		t.Fatal("refused touches restarted the clock")
	}

	sb = ic.running(t, time.Minute)
	ic.clk.Add(50 * time.Second)
	got, err := ic.Touch(ctx, ic.who, sb.ID)
	if err != nil || !got.LastActivityAt.Equal(ic.clk.Now()) {
		t.Fatalf("touch: last activity %v, %v; want %v", got.LastActivityAt, err, ic.clk.Now())
	}
	ic.clk.Add(50 * time.Second)
	ic.stopIdle(ctx)
	if ic.idleStopped(t, sb.ID) {
		t.Fatal("stopped 50s after a touch")
	}
	ic.clk.Add(10 * time.Second)
	ic.stopIdle(ctx)
	if !ic.idleStopped(t, sb.ID) {
		t.Fatal("not stopped a minute after a touch")
	}
}

// TestActivityWrittenCoarsely: a use is written when it begins, its end
// and touches at most every ActivityFlush (and at shutdown), never more.
func TestActivityWrittenCoarsely(t *testing.T) {
	ic := newIdleCore(t, nil)
	ctx := context.Background()
	sb := ic.running(t, time.Hour)
	start := ic.clk.Now()
	for range 5 {
		s, err := ic.Admit(ctx, ic.who, sb.ID, receipt.TransportExec)
		if err != nil {
			t.Fatal(err)
		}
		ic.clk.Add(time.Second)
		s.End()
		ic.flushUse(ctx, false)
	}
	rec := ic.get(t, sb.ID)
	if !rec.ActivityOpen || !rec.LastActivityAt.Equal(start) {
		t.Fatalf("within the flush interval the record was rewritten: open %v, last %v (want open since %v)", rec.ActivityOpen, rec.LastActivityAt, start)
	}
	ic.clk.Add(30 * time.Second)
	ic.flushUse(ctx, false)
	rec = ic.get(t, sb.ID)
	if want := start.Add(5 * time.Second); rec.ActivityOpen || !rec.LastActivityAt.Equal(want) {
		t.Fatalf("after the flush interval: open %v, last %v; want closed, %v", rec.ActivityOpen, rec.LastActivityAt, want)
	}
	if n := len(ic.activity.m); n != 0 {
		t.Errorf("%d activity entries kept after everything was written", n)
	}
	if _, err := ic.Touch(ctx, ic.who, sb.ID); err != nil {
		t.Fatal(err)
	}
	ic.clk.Add(time.Second)
	if _, err := ic.Touch(ctx, ic.who, sb.ID); err != nil {
		t.Fatal(err)
	}
	if got := ic.get(t, sb.ID).LastActivityAt; !got.Equal(ic.clk.Now().Add(-time.Second)) {
		t.Fatalf("a second touch within the flush interval was written: %v", got)
	}
	ctxc, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := ic.Close(ctxc); err != nil {
		t.Fatal(err)
	}
	if got := ic.get(t, sb.ID).LastActivityAt; !got.Equal(ic.clk.Now()) {
		t.Fatalf("shutdown did not write the last touch: %v, want %v", got, ic.clk.Now())
	}
}

// TestRestartKeepsClock: a restart of hiloop neither restarts the idle
// clocks nor stops what was in use: a sandbox idle when the previous
// process ended keeps its clock, and one with a session open then is taken
// to have been in use until the restart.
func TestRestartKeepsClock(t *testing.T) {
	ic := newIdleCore(t, nil)
	ctx := context.Background()
	idle := ic.running(t, time.Minute)
	busy := ic.running(t, time.Minute)
	sess, err := ic.Admit(ctx, ic.who, busy.ID, receipt.TransportExec)
	if err != nil {
		t.Fatal(err)
	}
	defer sess.End()
	ic.clk.Add(40 * time.Second)
	// The previous process dies here, with its session open; this one
	// starts on the same record.
	restarted := ic.clk.Now()
	c2 := ic.newCore(t, nil)
	if got := ic.get(t, idle.ID); !got.LastActivityAt.Equal(idle.LastActivityAt) {
		t.Fatalf("the restart moved an idle sandbox's clock: %v, was %v", got.LastActivityAt, idle.LastActivityAt)
	}
	if got := ic.get(t, busy.ID); got.ActivityOpen || !got.LastActivityAt.Equal(restarted) {
		t.Fatalf("a sandbox in use at the crash: open %v, last %v; want closed at the restart, %v", got.ActivityOpen, got.LastActivityAt, restarted)
	}
	ic.clk.Add(20 * time.Second)
	c2.stopIdle(ctx)
	if !ic.idleStopped(t, idle.ID) {
		t.Fatal("the idle sandbox was not stopped a minute after its last use, across the restart")
	}
	if ic.idleStopped(t, busy.ID) {
		t.Fatal("the sandbox in use at the crash was stopped before a minute after the restart")
	}
	ic.clk.Add(40 * time.Second)
	c2.stopIdle(ctx)
	if !ic.idleStopped(t, busy.ID) {
		t.Fatal("the sandbox in use at the crash was not stopped a minute after the restart")
	}
}

// TestUseRacingIdleStop: once an idle stop of a sandbox is under way no use
// of it begins, and a use that began first keeps it from being stopped.
func TestUseRacingIdleStop(t *testing.T) {
	ic := newIdleCore(t, nil)
	ctx := context.Background()
	sb := ic.running(t, time.Minute)
	ic.clk.Add(time.Minute)
	if !ic.activity.claim(ic.get(t, sb.ID), ic.clk.Now()) {
		t.Fatal("no claim on an idle sandbox")
	}
	_, err := ic.Admit(ctx, ic.who, sb.ID, receipt.TransportExec)
	var se *StateError
	if !errors.As(err, &se) || !se.Idle() {
		t.Fatalf("admit during an idle stop: %v, want an idle StateError", err)
	}
	ic.activity.unclaim(sb.ID)
	sess, err := ic.Admit(ctx, ic.who, sb.ID, receipt.TransportExec)
	if err != nil {
		t.Fatal(err)
	}
	defer sess.End()
	if ic.activity.claim(ic.get(t, sb.ID), ic.clk.Now()) {
		t.Fatal("an idle stop was claimed while a session was open")
	}
}

// mirrorStarts stands in for the cluster and the mirror of a wake: once
// the core asks the cluster to run id, the record is observed stopped
// again (as the mirror does when it decides on an object its watch has not
// seen the start of, marking it stopped outside hiloop), then starting,
// then running.
func (ic *idleCore) mirrorStarts(t *testing.T, id string) (stop func()) {
	t.Helper()
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			select {
			case <-done:
				return
			case <-time.After(5 * time.Millisecond):
			}
			if slices.Contains(ic.fc.Calls(), "mode "+id+" running") {
				ic.observe(t, id, store.StateStopped)
				if !ic.get(t, id).ModeOutside {
					t.Error("the stale observation did not mark the sandbox stopped outside hiloop")
				}
				time.Sleep(20 * time.Millisecond) // callers that come now see it so
				ic.observe(t, id, store.StateStarting)
				ic.observe(t, id, store.StateRunning)
				return
			}
		}
	})
	return func() { close(done); wg.Wait() }
}

// stoppedIdle is a sandbox the core stopped for idleness, observed
// stopped.
func (ic *idleCore) stoppedIdle(t *testing.T) store.Sandbox {
	t.Helper()
	sb := ic.running(t, time.Minute)
	ic.clk.Add(time.Minute)
	ic.stopIdle(context.Background())
	if !ic.idleStopped(t, sb.ID) {
		t.Fatal("not stopped for idleness")
	}
	ic.observe(t, sb.ID, store.StateStopped)
	return ic.get(t, sb.ID)
}

// TestConcurrentWakes: twenty concurrent wakes of one sandbox stopped for
// idleness start it once, and every one of them sees it running.
func TestConcurrentWakes(t *testing.T) {
	ic := newIdleCore(t, func(o *Options) { o.Limits.WakeWaitsPerKey = 20 })
	sb := ic.stoppedIdle(t)
	stop := ic.mirrorStarts(t, sb.ID)
	defer stop()
	var wg sync.WaitGroup
	errs := make(chan error, 20)
	var waiting atomic.Int32
	for i := range 20 {
		wg.Go(func() {
			// Spread over the start, some of them while the record shows
			// the stale observation.
			time.Sleep(time.Duration(i) * 3 * time.Millisecond)
			s, err := ic.AdmitWaking(context.Background(), ic.who, sb.ID, WakeOptions{Transport: receipt.TransportExec,
				Waking: func() { waiting.Add(1) }})
			if err == nil {
				s.End()
			}
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Errorf("a wake: %v", err)
		}
	}
	starts := 0
	for _, call := range ic.fc.Calls() {
		if call == "mode "+sb.ID+" running" {
			starts++
		}
	}
	if starts != 1 {
		t.Fatalf("%d starts for 20 concurrent wakes, want 1: %v", starts, ic.fc.Calls())
	}
	if waiting.Load() == 0 {
		t.Error("no caller was told that it waits for a wake")
	}
	if got := ic.get(t, sb.ID); got.DesiredMode != store.ModeRunning || got.StopCause != "" {
		t.Fatalf("after the wake: desired %s, cause %q", got.DesiredMode, got.StopCause)
	}
}

// TestWakeRefusals: only a stop for idleness is woken; another
// organization, a dead key, a transport the sandbox lacks, the running
// quota and a failing boundary all refuse a wake, which then starts
// nothing; a wake that does not see the sandbox run in time says so, with
// its state.
func TestWakeRefusals(t *testing.T) {
	exec := WakeOptions{Transport: receipt.TransportExec}
	noStart := func(t *testing.T, ic *idleCore, id string) {
		t.Helper()
		if slices.Contains(ic.fc.Calls(), "mode "+id+" running") {
			t.Fatalf("a refused wake started the sandbox: %v", ic.fc.Calls())
		}
		if !ic.get(t, id).IdleStopped() {
			t.Fatal("a refused wake changed the record")
		}
	}
	t.Run("stopped by its owner", func(t *testing.T) {
		ic := newIdleCore(t, nil)
		sb := ic.running(t, time.Minute)
		if _, err := ic.SetMode(context.Background(), ic.who, sb.ID, store.ModeStopped); err != nil {
			t.Fatal(err)
		}
		ic.observe(t, sb.ID, store.StateStopped)
		err := ic.Wake(context.Background(), ic.who, sb.ID, exec)
		var se *StateError
		if !errors.As(err, &se) || se.Idle() || se.StopCause != store.StopUser || !strings.Contains(err.Error(), "stopped by its owner") {
			t.Fatalf("wake of a sandbox its owner stopped: %v", err)
		}
		if slices.Contains(ic.fc.Calls(), "mode "+sb.ID+" running") {
			t.Fatal("a sandbox its owner stopped was started")
		}
	})
	t.Run("owner's stop after an idle stop", func(t *testing.T) {
		ic := newIdleCore(t, nil)
		sb := ic.stoppedIdle(t)
		if _, err := ic.SetMode(context.Background(), ic.who, sb.ID, store.ModeStopped); err != nil {
			t.Fatal(err)
		}
		var se *StateError
		if err := ic.Wake(context.Background(), ic.who, sb.ID, exec); !errors.As(err, &se) || se.Idle() {
			t.Fatalf("wake after the owner stopped it too: %v", err)
		}
	})
	t.Run("another organization", func(t *testing.T) {
		ic := newIdleCore(t, nil)
		sb := ic.stoppedIdle(t)
		other, _ := ic.db.CreateOrg(context.Background(), "p", 10, 10)
		if err := ic.Wake(context.Background(), liveCaller(t, ic.db, other.ID), sb.ID, exec); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("another organization's wake: %v, want ErrNotFound", err)
		}
		if err := ic.Wake(context.Background(), Caller{}, sb.ID, exec); !errors.Is(err, ErrUnauthenticated) {
			t.Fatalf("a wake of no organization: %v, want ErrUnauthenticated", err)
		}
		noStart(t, ic, sb.ID)
	})
	t.Run("revoked key", func(t *testing.T) {
		ic := newIdleCore(t, nil)
		sb := ic.stoppedIdle(t)
		gone := liveCaller(t, ic.db, ic.org.ID)
		if err := ic.RevokeKey(context.Background(), ic.who, gone.KeyID); err != nil {
			t.Fatal(err)
		}
		if err := ic.Wake(context.Background(), gone, sb.ID, exec); !errors.Is(err, ErrUnauthenticated) {
			t.Fatalf("a revoked key's wake: %v, want ErrUnauthenticated", err)
		}
		noStart(t, ic, sb.ID)
	})
	t.Run("transport", func(t *testing.T) {
		ic := newIdleCore(t, nil)
		sb := ic.stoppedIdle(t)
		var te *TransportError
		if err := ic.Wake(context.Background(), ic.who, sb.ID, WakeOptions{Transport: receipt.TransportForward}); !errors.As(err, &te) {
			t.Fatalf("a wake for a transport the sandbox lacks: %v, want a TransportError", err)
		}
		noStart(t, ic, sb.ID)
	})
	t.Run("running quota", func(t *testing.T) {
		ic := newIdleCore(t, nil)
		sb := ic.stoppedIdle(t)
		ic.running(t, 0)
		if err := ic.db.SetQuota(context.Background(), ic.org.ID, 100, 1); err != nil {
			t.Fatal(err)
		}
		if err := ic.Wake(context.Background(), ic.who, sb.ID, exec); !errors.Is(err, store.ErrQuota) {
			t.Fatalf("a wake over the running quota: %v, want ErrQuota", err)
		}
		noStart(t, ic, sb.ID)
	})
	t.Run("boundary", func(t *testing.T) {
		var broken atomic.Bool
		ic := newIdleCore(t, func(o *Options) {
			o.Boundary = func(context.Context) []cluster.Check {
				if broken.Load() {
					return []cluster.Check{{Object: "policy", Problem: "missing"}}
				}
				return nil
			}
		})
		ic.CheckBoundary(context.Background())
		sb := ic.stoppedIdle(t)
		broken.Store(true)
		ic.CheckBoundary(context.Background())
		if err := ic.Wake(context.Background(), ic.who, sb.ID, exec); !errors.Is(err, ErrNotHardened) {
			t.Fatalf("a wake while the boundary fails: %v, want ErrNotHardened", err)
		}
		noStart(t, ic, sb.ID)
	})
	t.Run("quarantined", func(t *testing.T) {
		ic := newIdleCore(t, nil)
		sb := ic.stoppedIdle(t)
		ic.observe(t, sb.ID, store.StateQuarantined)
		if _, err := ic.AdmitWaking(context.Background(), ic.who, sb.ID, exec); !errors.Is(err, ErrQuarantined) {
			t.Fatalf("a wake of a quarantined sandbox: %v, want ErrQuarantined", err)
		}
		noStart(t, ic, sb.ID)
	})
	t.Run("timeout", func(t *testing.T) {
		ic := newIdleCore(t, func(o *Options) { o.WakeTimeout = 50 * time.Millisecond })
		sb := ic.stoppedIdle(t)
		err := ic.Wake(context.Background(), ic.who, sb.ID, exec)
		var we *WakeTimeoutError
		if !errors.As(err, &we) || we.State != store.StateStopped || !strings.Contains(err.Error(), "stopped") {
			t.Fatalf("a wake the sandbox never answers: %v, want a WakeTimeoutError in state stopped", err)
		}
	})
}

func ptr[T any](v T) *T { return &v }
