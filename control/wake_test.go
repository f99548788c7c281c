package control

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/hiloop/hiloop/control/controltest"
	"github.com/hiloop/hiloop/internal/eventually"
	"github.com/hiloop/hiloop/receipt"
	"github.com/hiloop/hiloop/store"
)

// waiter is one call of Wake run in the background: parked is closed once
// it holds its waiting places and waits, done gets what it returned.
type waiter struct {
	parked chan struct{}
	done   chan error
	cancel context.CancelFunc
}

// wakeIn starts a Wake of sandbox id by who, with an exec's options.
func (ic *idleCore) wakeIn(who Caller, id string) *waiter {
	ctx, cancel := context.WithCancel(context.Background())
	w := &waiter{parked: make(chan struct{}), done: make(chan error, 1), cancel: cancel}
	go func() {
		w.done <- ic.Wake(ctx, who, id, WakeOptions{Transport: receipt.TransportExec, Waking: func() { close(w.parked) }})
	}()
	return w
}

// park starts a Wake that must wait: it fails the test when the call
// returns before it waits.
func (ic *idleCore) park(t *testing.T, who Caller, id string) *waiter {
	t.Helper()
	w := ic.wakeIn(who, id)
	t.Cleanup(w.cancel)
	select {
	case <-w.parked:
	case err := <-w.done:
		t.Fatalf("a wake of %s by key %s did not wait: %v", id, who.KeyID, err)
	}
	return w
}

// refused checks that a Wake by who is refused at once at the bound of its
// key or, with org, of its organization, and never waits.
func (ic *idleCore) refused(t *testing.T, who Caller, id string, org bool) {
	t.Helper()
	w := ic.wakeIn(who, id)
	defer w.cancel()
	select {
	case <-w.parked:
		t.Fatalf("a wake of %s by key %s past the bound waits", id, who.KeyID)
	case err := <-w.done:
		var wl *WaitLimitError
		if !errors.As(err, &wl) || !errors.Is(err, ErrTooManyWaits) || wl.Org != org {
			t.Fatalf("a wake of %s by key %s past the bound: %v, want a WaitLimitError with Org %v", id, who.KeyID, err, org)
		}
	}
}

// ended waits for each of ws to return and checks what it returned.
func ended(t *testing.T, want func(error) bool, ws ...*waiter) {
	t.Helper()
	for _, w := range ws {
		if err := <-w.done; !want(err) {
			t.Errorf("a waiting wake returned %v", err)
		}
	}
}

// stoppedIdleOf is stoppedIdle for a sandbox of who's organization.
func (ic *idleCore) stoppedIdleOf(t *testing.T, who Caller) store.Sandbox {
	t.Helper()
	idle := time.Minute
	sb, _, err := ic.Create(context.Background(), who, CreateRequest{Spec: store.Spec{Image: "busybox"}, IdleTimeout: &idle})
	if err != nil {
		t.Fatal(err)
	}
	ic.observe(t, sb.ID, store.StateRunning)
	ic.clk.Add(time.Minute)
	ic.stopIdle(context.Background())
	if !ic.idleStopped(t, sb.ID) {
		t.Fatal("not stopped for idleness")
	}
	ic.observe(t, sb.ID, store.StateStopped)
	return ic.get(t, sb.ID)
}

// checkWaits checks the waiting places held by key and by org, and that
// only keys and orgs entries are left in the registry.
func (ic *idleCore) checkWaits(t *testing.T, who Caller, key, org, keys, orgs int) {
	t.Helper()
	k, o, nk, no := ic.waits.counts(who.KeyID, who.OrgID)
	if k != key || o != org || nk != keys || no != orgs {
		t.Fatalf("waiting places: key %d, organization %d, %d keys and %d organizations with any; want %d, %d, %d, %d",
			k, o, nk, no, key, org, keys, orgs)
	}
}

// TestWakeWaitBound: calls that wait for a sandbox to wake are bounded per
// key and per organization. Past its key's bound a call is refused at once
// with the named error, while another key of the organization waits until
// the organization's bound; an organization at its bound neither refuses
// another organization's calls nor is refused for another's. A call on a
// running sandbox never counts. The places are given back however a wait
// ends: the caller going away, the sandbox running, the wake failing, or
// timing out.
func TestWakeWaitBound(t *testing.T) {
	ic := newIdleCore(t, func(o *Options) { o.Limits.WakeWaitsPerKey, o.Limits.WakeWaitsPerOrg = 2, 3 })
	ctx := context.Background()
	a1, a2 := ic.who, liveCaller(t, ic.db, ic.org.ID)
	orgB, err := ic.db.CreateOrg(ctx, "b", 100, 100)
	if err != nil {
		t.Fatal(err)
	}
	b1, b2 := liveCaller(t, ic.db, orgB.ID), liveCaller(t, ic.db, orgB.ID)
	sbA, sbB := ic.stoppedIdleOf(t, a1), ic.stoppedIdleOf(t, b1)
	up := ic.running(t, 0)

	// The key's bound.
	w1, w2 := ic.park(t, a1, sbA.ID), ic.park(t, a1, sbA.ID)
	ic.checkWaits(t, a1, 2, 2, 1, 1)
	ic.refused(t, a1, sbA.ID, false)
	if _, err := ic.AdmitWaking(ctx, a1, sbA.ID, WakeOptions{Transport: receipt.TransportExec}); !errors.Is(err, ErrTooManyWaits) {
		t.Fatalf("AdmitWaking past the key's bound: %v, want ErrTooManyWaits", err)
	}
	// A running sandbox costs no place, at the bound too.
	if err := ic.Wake(ctx, a1, up.ID, WakeOptions{Transport: receipt.TransportExec}); err != nil {
		t.Fatalf("a wake of a running sandbox at the key's bound: %v", err)
	}
	s, err := ic.AdmitWaking(ctx, a1, up.ID, WakeOptions{Transport: receipt.TransportExec})
	if err != nil {
		t.Fatalf("AdmitWaking of a running sandbox at the key's bound: %v", err)
	}
	s.End()
	ic.checkWaits(t, a1, 2, 2, 1, 1)

	// Another key of the organization, up to the organization's bound.
	w3 := ic.park(t, a2, sbA.ID)
	ic.refused(t, a2, sbA.ID, true)
	ic.checkWaits(t, a2, 1, 3, 2, 1)

	// Another organization is not held to the first one's bound...
	w4, w5, w6 := ic.park(t, b1, sbB.ID), ic.park(t, b1, sbB.ID), ic.park(t, b2, sbB.ID)
	ic.refused(t, b1, sbB.ID, false)
	ic.refused(t, b2, sbB.ID, true)
	ic.checkWaits(t, b1, 2, 3, 4, 2)

	// ...and, at its own bound, does not hold the first one back once
	// that one's callers went away.
	for _, w := range []*waiter{w1, w2, w3} {
		w.cancel()
	}
	ended(t, func(err error) bool { return errors.Is(err, context.Canceled) }, w1, w2, w3)
	ic.checkWaits(t, a1, 0, 0, 2, 1)
	w7, w8, w9 := ic.park(t, a1, sbA.ID), ic.park(t, a1, sbA.ID), ic.park(t, a2, sbA.ID)
	ic.refused(t, a2, sbA.ID, true)
	ic.refused(t, b2, sbB.ID, true)

	// The sandbox runs: its waits end well and give their places back.
	ic.observe(t, sbA.ID, store.StateStarting)
	ic.observe(t, sbA.ID, store.StateRunning)
	ended(t, func(err error) bool { return err == nil }, w7, w8, w9)
	ic.checkWaits(t, a1, 0, 0, 2, 1)

	// The wake fails: the same.
	ic.observe(t, sbB.ID, store.StateQuarantined)
	ended(t, func(err error) bool { return errors.Is(err, ErrQuarantined) }, w4, w5, w6)
	ic.checkWaits(t, b1, 0, 0, 0, 0)

	// The wake times out: the same, and the place is there again for the
	// next call. The sandbox is starting, so the wake asks nothing of the
	// cluster within its short timeout.
	short := newIdleCore(t, func(o *Options) {
		o.WakeTimeout = 200 * time.Millisecond
		o.Limits.WakeWaitsPerKey, o.Limits.WakeWaitsPerOrg = 1, 1
	})
	sb, _, err := short.Create(ctx, short.who, CreateRequest{Spec: store.Spec{Image: "busybox"}})
	if err != nil {
		t.Fatal(err)
	}
	short.observe(t, sb.ID, store.StateStarting)
	for range 2 {
		waited := false
		err := short.Wake(ctx, short.who, sb.ID, WakeOptions{Transport: receipt.TransportExec, Waking: func() { waited = true }})
		if we := new(WakeTimeoutError); !errors.As(err, &we) || we.State != store.StateStarting || !waited {
			t.Fatalf("a wake the sandbox never answers: %v (waited %v), want a WakeTimeoutError in state starting after waiting", err, waited)
		}
		short.checkWaits(t, short.who, 0, 0, 0, 0)
	}
}

// TestWakeWakingHoldsNoPlace: Waking is the caller's own output (the
// gateway's "waking" line on a channel whose client may never open its
// window), and a caller stuck in it neither holds a waiting place once the
// sandbox runs nor keeps the wake from starting.
func TestWakeWakingHoldsNoPlace(t *testing.T) {
	ic := newIdleCore(t, func(o *Options) { o.Limits.WakeWaitsPerKey, o.Limits.WakeWaitsPerOrg = 1, 2 })
	ctx := context.Background()
	sb := ic.stoppedIdleOf(t, ic.who)
	entered, unblock := make(chan struct{}), make(chan struct{})
	t.Cleanup(func() { close(unblock) })
	done := make(chan error, 1)
	go func() {
		done <- ic.Wake(ctx, ic.who, sb.ID, WakeOptions{Transport: receipt.TransportExec, Waking: func() {
			close(entered)
			<-unblock
		}})
	}()
	<-entered
	// The stuck caller's wake starts the sandbox all the same.
	eventually.True(t, "the stuck caller's wake to start the sandbox", func() bool {
		select {
		case err := <-done:
			t.Fatalf("the wake returned while its Waking blocks: %v", err)
		default:
		}
		return slices.Contains(ic.fc.Calls(), "mode "+sb.ID+" running")
	})
	ic.observe(t, sb.ID, store.StateRunning)
	eventually.True(t, "the stuck caller's waiting place given back once the sandbox runs", func() bool {
		k, o, _, _ := ic.waits.counts(ic.who.KeyID, ic.who.OrgID)
		return k == 0 && o == 0
	})
	// And its key may wait for another wake.
	other := ic.stoppedIdleOf(t, ic.who)
	ic.park(t, ic.who, other.ID)
}

// TestModeWritingCoversTheClusterWrite: a desired-mode change (a wake, an
// idle stop, a user's stop, a failed start) is reported by ModeWriting
// while the record already holds it and the cluster has not answered its
// write, so the mirror does not take hiloop's own change for one made
// outside hiloop; once the write is answered or failed it is reported no
// more and the sandbox is queued for the mirror again.
func TestModeWritingCoversTheClusterWrite(t *testing.T) {
	ic := newIdleCore(t, nil)
	sb := ic.stoppedIdle(t)
	other := ic.running(t, time.Minute)
	ic.TakeChanged()
	type seen struct {
		mode                  store.Mode
		writing, otherWriting bool
		desired               store.Mode
	}
	var got []seen
	ic.fc.Set(func(f *controltest.Cluster) {
		f.OnMode = func(id string, mode store.Mode) {
			got = append(got, seen{mode, ic.ModeWriting(id), ic.ModeWriting(other.ID), ic.get(t, id).DesiredMode})
		}
	})
	check := func(what string, want store.Mode) {
		t.Helper()
		if len(got) != 1 || got[0] != (seen{want, true, false, want}) {
			t.Fatalf("%s: during the cluster write %+v, want the record at %s and the change reported for it alone", what, got, want)
		}
		got = nil
		if ic.ModeWriting(sb.ID) {
			t.Fatalf("%s: still reported once the write was answered", what)
		}
		if !slices.Contains(ic.TakeChanged(), sb.ID) {
			t.Fatalf("%s: the sandbox was not queued for the mirror again", what)
		}
	}

	stop := ic.mirrorStarts(t, sb.ID)
	err := ic.Wake(context.Background(), ic.who, sb.ID, WakeOptions{Transport: receipt.TransportExec})
	stop()
	if err != nil {
		t.Fatal(err)
	}
	check("a wake", store.ModeRunning)

	if _, err := ic.SetMode(context.Background(), ic.who, sb.ID, store.ModeStopped); err != nil {
		t.Fatal(err)
	}
	check("a user's stop", store.ModeStopped)

	ic.fc.Set(func(f *controltest.Cluster) { f.ModeErr = errors.New("the API server is down") })
	if _, err := ic.SetMode(context.Background(), ic.who, sb.ID, store.ModeRunning); err == nil {
		t.Fatal("a start whose cluster write failed succeeded")
	}
	check("a failed start", store.ModeRunning)
	if rec := ic.get(t, sb.ID); rec.DesiredMode != store.ModeStopped {
		t.Fatalf("after the failed start the record asks for %s", rec.DesiredMode)
	}
}

// TestUseWakingBounded: a use that an idle stop keeps racing is tried
// wakeTries times and its last error returned; one that succeeds on a
// later try ends the loop; a refused wake ends it with the refusal.
func TestUseWakingBounded(t *testing.T) {
	c, db, org := newControl(t, &controltest.Cluster{})
	ctx := context.Background()
	who := liveCaller(t, db, org.ID)
	sb := runningSandbox(t, c, db, who)
	o := WakeOptions{Transport: receipt.TransportExec}
	raced := errors.New("raced")
	calls := 0
	err := c.UseWaking(ctx, who, sb.ID, o, func() (bool, error) { calls++; return true, raced })
	if calls != wakeTries || err != raced {
		t.Errorf("always raced: %d calls, %v; want %d, raced", calls, err, wakeTries)
	}
	calls = 0
	err = c.UseWaking(ctx, who, sb.ID, o, func() (bool, error) {
		calls++
		if calls == 1 {
			return true, raced
		}
		return false, nil
	})
	if calls != 2 || err != nil {
		t.Errorf("raced once: %d calls, %v; want 2, nil", calls, err)
	}
	if _, err := c.SetMode(ctx, who, sb.ID, store.ModeStopped); err != nil {
		t.Fatal(err)
	}
	calls = 0
	err = c.UseWaking(ctx, who, sb.ID, o, func() (bool, error) { calls++; return true, raced })
	var se *StateError
	if calls != 1 || !errors.As(err, &se) {
		t.Errorf("a sandbox its owner stopped: %d calls, %v; want 1 and the wake's refusal", calls, err)
	}
}
