package store_test

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/hiloop/hiloop/store"
)

// TestIdleSandboxes: the idle check reads exactly the running sandboxes
// with an idle timeout whose clock passed it, the longest idle first,
// through its index; recorded use restarts a clock, and a start of hiloop
// takes a use left open to have lasted until then.
func TestIdleSandboxes(t *testing.T) {
	ctx := context.Background()
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	clock := func() time.Time { return now }
	s, err := store.Open(ctx, store.Options{Path: filepath.Join(t.TempDir(), "i.db"), Now: clock})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	org, _ := s.CreateOrg(ctx, "i", 0, 0)
	add := func(idle time.Duration, st store.State) string {
		sb, _, err := s.CreateSandbox(ctx, store.NewSandbox{OrgID: org.ID, Spec: store.Spec{Image: "busybox"}, IdleTimeout: idle})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.Observe(ctx, sb.ID, store.Observation{State: st}); err != nil {
			t.Fatal(err)
		}
		return sb.ID
	}
	short := add(time.Minute, store.StateRunning)
	long := add(time.Hour, store.StateRunning)
	add(0, store.StateRunning)
	add(time.Minute, store.StateStopped)
	ids := func(at time.Time) []string {
		t.Helper()
		list, err := s.IdleSandboxes(ctx, at, 10)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, sb := range list {
			out = append(out, sb.ID)
		}
		return out
	}
	if got := ids(now.Add(59 * time.Second)); len(got) != 0 {
		t.Fatalf("idle before any timeout passed: %v", got)
	}
	if diff := cmp.Diff([]string{short, long}, ids(now.Add(2*time.Hour))); diff != "" {
		t.Fatalf("idle after both timeouts (-want +got):\n%s", diff)
	}
	if err := s.RecordActivity(ctx, short, now.Add(time.Hour), true); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{long}, ids(now.Add(time.Hour+30*time.Second))); diff != "" {
		t.Fatalf("after a recorded use (-want +got):\n%s", diff)
	}
	// An older use never moves a clock back.
	if err := s.RecordActivity(ctx, short, now, true); err != nil {
		t.Fatal(err)
	}
	if got, _ := s.SandboxAnyOrg(ctx, short); !got.LastActivityAt.Equal(now.Add(time.Hour)) || !got.ActivityOpen {
		t.Fatalf("last activity %v open %v, want %v and open", got.LastActivityAt, got.ActivityOpen, now.Add(time.Hour))
	}
	if n, err := s.ResumeActivity(ctx, now.Add(3*time.Hour)); err != nil || n != 1 {
		t.Fatalf("resume: %d, %v; want 1", n, err)
	}
	if got, _ := s.SandboxAnyOrg(ctx, short); !got.LastActivityAt.Equal(now.Add(3*time.Hour)) || got.ActivityOpen {
		t.Fatalf("after resume: last activity %v open %v", got.LastActivityAt, got.ActivityOpen)
	}
	if got, _ := s.SandboxAnyOrg(ctx, long); !got.LastActivityAt.Equal(now) {
		t.Fatalf("resume moved the clock of a sandbox not in use: %v", got.LastActivityAt)
	}
	plan, err := s.IdlePlan(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(plan, "sandboxes_idle") || strings.Contains(plan, "TEMP B-TREE") {
		t.Errorf("the idle check does not read its index in order:\n%s", plan)
	}
}

// TestStopCause: a stop records who asked for it, a start clears it, and
// a failed cluster write's undo puts it back.
func TestStopCause(t *testing.T) {
	ctx := context.Background()
	s := open(t, filepath.Join(t.TempDir(), "c.db"), nil)
	org, _ := s.CreateOrg(ctx, "c", 0, 0)
	sb, _, _ := s.CreateSandbox(ctx, store.NewSandbox{OrgID: org.ID, Spec: store.Spec{Image: "busybox"}})
	ch, err := s.SetDesiredMode(ctx, org.ID, sb.ID, store.ModeStopped, store.StopIdle)
	if err != nil || !ch.After.IdleStopped() {
		t.Fatalf("idle stop: %+v %v", ch.After, err)
	}
	ch, err = s.SetDesiredMode(ctx, org.ID, sb.ID, store.ModeRunning, "")
	if err != nil || ch.After.StopCause != "" {
		t.Fatalf("start: cause %q %v", ch.After.StopCause, err)
	}
	if err := s.RestoreMode(ctx, ch.Before); err != nil {
		t.Fatal(err)
	}
	if got, _ := s.Sandbox(ctx, org.ID, sb.ID); !got.IdleStopped() {
		t.Fatalf("undo of a failed start: desired %s cause %q, want stopped for idleness", got.DesiredMode, got.StopCause)
	}
	if _, err := s.SetDesiredMode(ctx, org.ID, sb.ID, store.ModeStopped, store.StopUser); err != nil {
		t.Fatal(err)
	}
	if got, _ := s.Sandbox(ctx, org.ID, sb.ID); got.IdleStopped() || got.StopCause != store.StopUser {
		t.Fatalf("the owner's stop: cause %q", got.StopCause)
	}
}

// TestOrgIdleTimeout: an organization's default idle timeout is unset (the
// deployment's), a duration, or 0 (off), and another organization's is its
// own.
func TestOrgIdleTimeout(t *testing.T) {
	ctx := context.Background()
	s := open(t, filepath.Join(t.TempDir(), "o.db"), nil)
	a, _ := s.CreateOrg(ctx, "a", 0, 0)
	b, _ := s.CreateOrg(ctx, "b", 0, 0)
	idle := func(id string) *time.Duration {
		t.Helper()
		o, err := s.Org(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		return o.IdleTimeout
	}
	if d := idle(a.ID); d != nil {
		t.Fatalf("a new organization's idle timeout: %v, want unset", *d)
	}
	for _, want := range []time.Duration{30 * time.Minute, 0} {
		if err := s.SetOrgIdleTimeout(ctx, a.ID, &want); err != nil {
			t.Fatal(err)
		}
		if d := idle(a.ID); d == nil || *d != want {
			t.Fatalf("idle timeout %v: got %v", want, d)
		}
		if orgs, _ := s.Orgs(ctx); orgs[0].IdleTimeout == nil || *orgs[0].IdleTimeout != want {
			t.Fatalf("listed: %+v", orgs[0])
		}
	}
	if d := idle(b.ID); d != nil {
		t.Fatalf("another organization's idle timeout changed: %v", *d)
	}
	if err := s.SetOrgIdleTimeout(ctx, a.ID, nil); err != nil {
		t.Fatal(err)
	}
	if d := idle(a.ID); d != nil {
		t.Fatalf("unset: %v", *d)
	}
	if err := s.SetOrgIdleTimeout(ctx, "org_none", nil); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("an absent organization: %v, want ErrNotFound", err)
	}
}
