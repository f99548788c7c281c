package control

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/hiloop/hiloop/cluster"
	"github.com/hiloop/hiloop/control/controltest"
	"github.com/hiloop/hiloop/internal/eventually"
	"github.com/hiloop/hiloop/receipt"
	"github.com/hiloop/hiloop/store"
)

func newControl(t *testing.T, fc *controltest.Cluster) (*Control, *store.Store, store.Org) {
	t.Helper()
	db, err := store.Open(context.Background(), store.Options{Path: filepath.Join(t.TempDir(), "c.db")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	c, err := New(Options{Store: db, Cluster: fc, Exec: controltest.Exec{}, ClusterTimeout: time.Second,
		Log: slog.New(slog.NewTextHandler(io.Discard, nil)), Limits: Limits{PerSandbox: 2, PerOrg: 3},
		Caps: Capabilities{Transports: []receipt.Transport{receipt.TransportExec}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := c.Close(ctx); err != nil {
			t.Error(err)
		}
	})
	org, err := db.CreateOrg(context.Background(), "o", 100, 100)
	if err != nil {
		t.Fatal(err)
	}
	return c, db, org
}

// TestCreateRacingDelete: a delete that lands between the record commit and
// the create's cluster write wins: nothing is created and whatever could
// carry the name is deleted.
func TestCreateRacingDelete(t *testing.T) {
	fc := &controltest.Cluster{}
	c, db, org := newControl(t, fc)
	ctx := context.Background()
	who := liveCaller(t, db, org.ID)
	// The record commit of a create...
	sb, _, err := db.CreateSandbox(ctx, store.NewSandbox{OrgID: org.ID, Spec: store.Spec{Image: "busybox"}})
	if err != nil {
		t.Fatal(err)
	}
	// ...then the delete...
	if _, err := c.SetMode(ctx, who, sb.ID, store.ModeDeleted); err != nil {
		t.Fatal(err)
	}
	// ...then the create's cluster step, as Create runs it under the lock,
	// whose record, the create's answer, is the one the delete left.
	rec, _, err := c.createObject(sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	if rec.DesiredMode != store.ModeDeleted {
		t.Errorf("the create's answer after a delete: desired %s, want deleted", rec.DesiredMode)
	}
	if slices.Contains(fc.Calls(), "create "+sb.ID) {
		t.Fatalf("a deleted sandbox was created: %v", fc.Calls())
	}
	if fc.Has(sb.ID) {
		t.Fatal("an object exists for a deleted record")
	}
}

// TestLocksAndSessionsBounded: the per-sandbox locks and the session
// counters hold nothing once nobody uses them.
func TestLocksAndSessionsBounded(t *testing.T) {
	c, db, org := newControl(t, &controltest.Cluster{})
	ctx := context.Background()
	var wg sync.WaitGroup
	for i := range 50 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			unlock := c.locks.lock(string(rune('a' + i%5)))
			unlock()
		}()
	}
	wg.Wait()
	if n := c.locks.size(); n != 0 {
		t.Fatalf("%d lock entries left", n)
	}
	who := liveCaller(t, db, org.ID)
	sb, _, _ := c.Create(ctx, who, CreateRequest{Spec: store.Spec{Image: "busybox"}})
	db.Observe(ctx, sb.ID, store.Observation{State: store.StateRunning})
	var live []*Session
	for range 2 {
		s, err := c.Admit(ctx, who, sb.ID, "exec")
		if err != nil {
			t.Fatal(err)
		}
		live = append(live, s)
	}
	if _, err := c.Admit(ctx, who, sb.ID, "exec"); !errors.Is(err, ErrSessionLimit) || !strings.Contains(err.Error(), "--exec-per-sandbox") {
		t.Fatalf("third session on one sandbox: %v, want the session limit naming its flag", err)
	}
	// The organization sees how close it runs to the limits.
	other, _ := db.CreateOrg(ctx, "other", 10, 10)
	type usage struct{ Open, Busiest, BusiestSandbox, BusiestOrg, PerSandbox, PerOrg int }
	var got usage
	got.Open, got.Busiest = c.OrgSessions(org.ID)
	got.BusiestSandbox, got.BusiestOrg = c.SessionsBusiest()
	got.PerSandbox, got.PerOrg = c.SessionLimits()
	if diff := cmp.Diff(usage{2, 2, 2, 2, 2, 3}, got); diff != "" {
		t.Errorf("sessions against the limits (-want +got):\n%s", diff)
	}
	if open, busiest := c.OrgSessions(other.ID); open != 0 || busiest != 0 {
		t.Errorf("another organization's sessions: %d, %d", open, busiest)
	}
	for _, s := range live {
		s.End()
		s.End() // twice is harmless
	}
	c.sessions.mu.Lock()
	left := len(c.sessions.bySandbox) + len(c.sessions.byOrg) + len(c.sessions.live)
	c.sessions.mu.Unlock()
	if left != 0 {
		t.Fatalf("%d session entries left", left)
	}
	if open, busiest := c.OrgSessions(org.ID); open != 0 || busiest != 0 {
		t.Errorf("sessions once all ended: %d, %d", open, busiest)
	}
}

// TestAdmitRefuses: another org's sandbox looks absent, a key is only
// good for its own organization, and only a running, unquarantined sandbox
// admits a session.
func TestAdmitRefuses(t *testing.T) {
	c, db, org := newControl(t, &controltest.Cluster{})
	ctx := context.Background()
	other, _ := db.CreateOrg(ctx, "other", 10, 10)
	who := liveCaller(t, db, org.ID)
	sb, _, _ := c.Create(ctx, who, CreateRequest{Spec: store.Spec{Image: "busybox"}})
	var se *StateError
	if _, err := c.Admit(ctx, who, sb.ID, "exec"); !errors.As(err, &se) || se.State != store.StatePending {
		t.Fatalf("pending: %v", err)
	}
	db.Observe(ctx, sb.ID, store.Observation{State: store.StateRunning})
	if _, err := c.Admit(ctx, liveCaller(t, db, other.ID), sb.ID, "exec"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("another org reaches the sandbox: %v", err)
	}
	for _, bad := range []Caller{{OrgID: other.ID, KeyID: who.KeyID}, {OrgID: "", KeyID: who.KeyID}} {
		if _, err := c.Admit(ctx, bad, sb.ID, "exec"); !errors.Is(err, ErrUnauthenticated) {
			t.Fatalf("org %q with a key that is not its own: %v", bad.OrgID, err)
		}
	}
	db.Observe(ctx, sb.ID, store.Observation{State: store.StateQuarantined, Anomaly: "host_namespaces"})
	if _, err := c.Admit(ctx, who, sb.ID, "exec"); !errors.Is(err, ErrQuarantined) {
		t.Fatalf("quarantined: %v", err)
	}
}

// TestShutdownEndsSessions: Close ends every live session with
// ErrShuttingDown, even one whose own context never ends.
func TestShutdownEndsSessions(t *testing.T) {
	c, db, org := newControl(t, &controltest.Cluster{})
	ctx := context.Background()
	who := liveCaller(t, db, org.ID)
	sb, _, _ := c.Create(ctx, who, CreateRequest{Spec: store.Spec{Image: "busybox"}})
	db.Observe(ctx, sb.ID, store.Observation{State: store.StateRunning})
	s, err := c.Admit(context.Background(), who, sb.ID, "exec")
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		<-s.Context().Done()
		s.End()
	}()
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := c.Close(cctx); err != nil {
		t.Fatal(err)
	}
	if cause := context.Cause(s.Context()); !errors.Is(cause, ErrShuttingDown) {
		t.Fatalf("cause %v", cause)
	}
}

// TestSweepEndsSessionsOfStoppedSandboxes: the sweep ends a session whose
// key was revoked outside control (offline) or whose sandbox stopped.
func TestSweepEndsSessions(t *testing.T) {
	c, db, org := newControl(t, &controltest.Cluster{})
	ctx := context.Background()
	k1, _, _ := db.CreateKey(ctx, org.ID, "one")
	k2, _, _ := db.CreateKey(ctx, org.ID, "two")
	sb, _, _ := c.Create(ctx, Caller{OrgID: org.ID, KeyID: k1.ID}, CreateRequest{Spec: store.Spec{Image: "busybox"}})
	db.Observe(ctx, sb.ID, store.Observation{State: store.StateRunning})
	s1, _ := c.Admit(ctx, Caller{OrgID: org.ID, KeyID: k1.ID}, sb.ID, "exec")
	s2, _ := c.Admit(ctx, Caller{OrgID: org.ID, KeyID: k2.ID}, sb.ID, "exec")
	defer s1.End()
	defer s2.End()
	db.RevokeKey(ctx, org.ID, k1.ID, false)
	c.sweep(ctx)
	if !errors.Is(context.Cause(s1.Context()), ErrKeyRevoked) || s2.Context().Err() != nil {
		t.Fatalf("after revoking k1: s1 %v, s2 %v", context.Cause(s1.Context()), s2.Context().Err())
	}
	db.Observe(ctx, sb.ID, store.Observation{State: store.StateStopped})
	c.sweep(ctx)
	if !errors.Is(context.Cause(s2.Context()), ErrSandboxChanged) {
		t.Fatalf("after stop: s2 %v", context.Cause(s2.Context()))
	}
}

// TestResolveIsBoundedAndAsync: resolving a pending create never blocks its
// caller (the mirror's start-up), each attempt is bounded by the cluster
// timeout, and Close stops the retries.
func TestResolveIsBoundedAndAsync(t *testing.T) {
	fc := &controltest.Cluster{Hang: true}
	c, db, org := newControl(t, fc)
	ctx := context.Background()
	sb, _, _ := db.CreateSandbox(ctx, store.NewSandbox{OrgID: org.ID, Spec: store.Spec{Image: "busybox"}})
	// The test holds the sandbox's lock, which every attempt takes: a
	// ResolvePending that attempted in line would never return.
	unlock := c.locks.lock(sb.ID)
	returned := make(chan struct{})
	go func() {
		c.ResolvePending(sb.ID)
		close(returned)
	}()
	select {
	case <-returned:
	case <-time.After(eventually.Patience):
		t.Fatal("ResolvePending waits for its attempt")
	}
	if calls := fc.Calls(); len(calls) != 0 {
		t.Fatalf("calls %q while the lock is held", calls)
	}
	unlock()
	// Two attempts at least, each ended by the 1s cluster timeout.
	waitCalls(t, fc, "exists "+sb.ID, 2)
	if got, _ := db.SandboxAnyOrg(ctx, sb.ID); got.State != store.StatePending {
		t.Fatalf("state %s: an unanswered attempt must leave the record pending", got.State)
	}
}

func waitCalls(t *testing.T, fc *controltest.Cluster, call string, n int) {
	t.Helper()
	eventually.True(t, fmt.Sprintf("%d calls %q", n, call), func() bool {
		got := 0
		for _, c := range fc.Calls() {
			if c == call {
				got++
			}
		}
		return got >= n
	})
}

// TestRunPrunesEvents: with a retention, Run prunes older state
// transitions at once; without one it keeps them, past its first sweep.
func TestRunPrunesEvents(t *testing.T) {
	for _, retention := range []time.Duration{0, time.Hour} {
		c, db, org := newControl(t, &controltest.Cluster{})
		ctx := context.Background()
		key, _, err := db.CreateKey(ctx, org.ID, "k")
		if err != nil {
			t.Fatal(err)
		}
		who := Caller{OrgID: org.ID, KeyID: key.ID}
		sb, _, err := c.Create(ctx, who, CreateRequest{Spec: store.Spec{Image: "busybox"}})
		if err != nil {
			t.Fatal(err)
		}
		// A session of a sandbox that stopped, which Run's first sweep
		// ends: the sign that Run is past deciding whether to prune.
		db.Observe(ctx, sb.ID, store.Observation{State: store.StateRunning})
		s, err := c.Admit(ctx, who, sb.ID, "exec")
		if err != nil {
			t.Fatal(err)
		}
		defer s.End()
		db.Observe(ctx, sb.ID, store.Observation{State: store.StateStopped})
		c.o.EventRetention = retention
		c.o.SweepInterval = 10 * time.Millisecond
		c.o.Now = func() time.Time { return time.Now().Add(2 * time.Hour) }
		runCtx, cancel := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() { c.Run(runCtx); close(done) }()
		eventually.True(t, "the first sweep", func() bool { return s.Context().Err() != nil })
		events := func() int {
			evs, err := db.Events(ctx, org.ID, sb.ID)
			if err != nil {
				t.Fatal(err)
			}
			return len(evs)
		}
		if retention > 0 {
			eventually.True(t, "the events pruned", func() bool { return events() == 0 })
		} else if n := events(); n == 0 {
			t.Errorf("no retention: the events were pruned")
		}
		cancel()
		<-done
	}
}

// TestWaitWhileEndsAtShutdown: a long poll answers, with the record as it
// stands, when hiloop begins to shut down, so that it does not hold the
// drain; a caller without an organization or a key waits on nothing.
func TestWaitWhileEndsAtShutdown(t *testing.T) {
	c, db, org := newControl(t, &controltest.Cluster{})
	who := liveCaller(t, db, org.ID)
	sb, _, err := c.Create(context.Background(), who, CreateRequest{Spec: store.Spec{Image: "busybox"}})
	if err != nil {
		t.Fatal(err)
	}
	for _, nobody := range []Caller{{}, {OrgID: org.ID}, {KeyID: who.KeyID}} {
		if _, err := c.WaitWhile(context.Background(), nobody, sb.ID, store.StatePending, time.Minute); !errors.Is(err, ErrUnauthenticated) {
			t.Errorf("long poll by %+v: %v, want unauthenticated", nobody, err)
		}
	}
	type answer struct {
		sb  store.Sandbox
		err error
	}
	done := make(chan answer, 1)
	go func() {
		got, err := c.WaitWhile(context.Background(), who, sb.ID, store.StatePending, time.Minute)
		done <- answer{got, err}
	}()
	eventually.True(t, "the long poll waiting", func() bool { return db.Waiting() > 0 })
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := c.Close(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case a := <-done:
		if a.err != nil || a.sb.ID != sb.ID || a.sb.State != store.StatePending {
			t.Errorf("long poll at shutdown: %+v %v", a.sb, a.err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the long poll held on past shutdown")
	}
}

// TestStopThatKillsTheCommandReportsTheStop: a command that the stop or
// delete of its sandbox kills (kwok and the kubelet SIGTERM it, 143) ends
// its session with ErrSandboxChanged, not with its exit status, even when
// that status arrives before the cluster write has answered.
func TestStopThatKillsTheCommandReportsTheStop(t *testing.T) {
	for _, mode := range []store.Mode{store.ModeStopped, store.ModeDeleted} {
		t.Run(string(mode), func(t *testing.T) {
			killed, exited := make(chan struct{}), make(chan struct{})
			fc := &controltest.Cluster{}
			c, db, org := newControl(t, fc)
			ctx := context.Background()
			who := liveCaller(t, db, org.ID)
			sb, _, _ := c.Create(ctx, who, CreateRequest{Spec: store.Spec{Image: "busybox"}})
			db.Observe(ctx, sb.ID, store.Observation{State: store.StateRunning})
			// The write kills the command and answers only once its
			// exit status has reached the session.
			fc.Set(func(f *controltest.Cluster) {
				f.OnMode = func(string, store.Mode) { close(killed); <-exited }
			})
			c.o.Exec = controltest.Exec{Run: func(context.Context, cluster.ExecRequest) (cluster.ExitStatus, error) {
				<-killed
				return cluster.ExitStatus{Code: 143, Signal: "terminated"}, nil
			}}
			s, err := c.Admit(ctx, who, sb.ID, "exec")
			if err != nil {
				t.Fatal(err)
			}
			defer s.End()
			type result struct {
				st  cluster.ExitStatus
				err error
			}
			res := make(chan result, 1)
			go func() {
				st, err := s.Exec(s.Context(), cluster.ExecRequest{Command: []string{"sleep", "300"}})
				res <- result{st, err}
				close(exited)
			}()
			if _, err := c.SetMode(ctx, who, sb.ID, mode); err != nil {
				t.Fatal(err)
			}
			r := <-res
			var ee *EndedError
			if !errors.As(r.err, &ee) || !errors.Is(ee.Cause, ErrSandboxChanged) {
				t.Fatalf("exec ended with %+v, %v; want the session ended with %v", r.st, r.err, ErrSandboxChanged)
			}
		})
	}
}
