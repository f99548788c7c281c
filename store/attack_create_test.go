package store_test

import (
	"context"
	"errors"
	"path/filepath"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/hiloop/hiloop/store"
)

// TestAttackCreateOrgIdleInOneBatch: creates of three organizations queued
// into one group commit each take their own organization's idle timeout
// (or the default, or the explicit one, 0 included) and their own quota:
// nothing of one organization leaks into another's savepoint.
func TestAttackCreateOrgIdleInOneBatch(t *testing.T) {
	ctx := context.Background()
	s := open(t, filepath.Join(t.TempDir(), "a.db"), nil)
	d := func(v time.Duration) *time.Duration { return &v }
	a, _ := s.CreateOrg(ctx, "a", 4, 100)
	b, _ := s.CreateOrg(ctx, "b", 3, 100)
	c, _ := s.CreateOrg(ctx, "c", 100, 2) // running limit
	if err := s.SetOrgIdleTimeout(ctx, a.ID, d(30*time.Minute)); err != nil {
		t.Fatal(err)
	}
	if err := s.SetOrgIdleTimeout(ctx, c.ID, d(0)); err != nil {
		t.Fatal(err)
	}
	const def = 7 * time.Minute
	type res struct {
		org      string
		explicit *time.Duration
		sb       store.Sandbox
		err      error
	}
	var mu sync.Mutex
	var out []res
	release := s.HoldWriter(t)
	var wg sync.WaitGroup
	n := 0
	for _, org := range []store.Org{a, b, c} {
		for i := range 8 {
			var explicit *time.Duration
			switch i % 3 {
			case 1:
				explicit = d(0)
			case 2:
				explicit = d(11 * time.Minute)
			}
			n++
			wg.Go(func() {
				ns := store.NewSandbox{OrgID: org.ID, Spec: store.Spec{Image: "busybox"}, IdleTimeout: def, OrgIdleTimeout: true}
				if explicit != nil {
					ns.IdleTimeout, ns.OrgIdleTimeout = *explicit, false
				}
				sb, _, err := s.CreateSandbox(ctx, ns)
				mu.Lock()
				out = append(out, res{org.ID, explicit, sb, err})
				mu.Unlock()
			})
		}
	}
	for s.BatchWaiting() < int64(n) {
		runtime.Gosched()
	}
	before := s.Batches()
	release()
	wg.Wait()
	if got := s.Batches() - before; got != 1 {
		t.Logf("%d transactions (want the creates to share one)", got)
	}
	made := map[string]int{}
	for _, r := range out {
		if r.err != nil {
			if !errors.Is(r.err, store.ErrQuota) {
				t.Errorf("create in %s: %v", r.org, r.err)
			}
			continue
		}
		made[r.org]++
		if r.sb.OrgID != r.org {
			t.Errorf("a create of %s made a sandbox of %s", r.org, r.sb.OrgID)
		}
		want := def
		switch {
		case r.explicit != nil:
			want = *r.explicit
		case r.org == a.ID:
			want = 30 * time.Minute
		case r.org == c.ID:
			want = 0
		}
		if r.sb.IdleTimeout != want {
			t.Errorf("org %s explicit %v: idle %v, want %v", r.org, r.explicit, r.sb.IdleTimeout, want)
		}
		stored, err := s.Sandbox(ctx, r.org, r.sb.ID)
		if err != nil || stored.IdleTimeout != want {
			t.Errorf("stored %s: idle %v (%v), want %v", r.sb.ID, stored.IdleTimeout, err, want)
		}
	}
	if made[a.ID] != 4 || made[b.ID] != 3 || made[c.ID] != 2 {
		t.Errorf("made %d/%d/%d, want 4/3/2 (each organization's own limit)", made[a.ID], made[b.ID], made[c.ID])
	}
}

// TestAttackCreateUnknownOrg: a create naming no organization that exists
// is refused, not given a default.
func TestAttackCreateUnknownOrg(t *testing.T) {
	s := open(t, filepath.Join(t.TempDir(), "u.db"), nil)
	_, _, err := s.CreateSandbox(context.Background(), store.NewSandbox{OrgID: "org_nope", Spec: store.Spec{Image: "busybox"}, OrgIdleTimeout: true})
	if !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("create in an unknown organization: %v, want ErrNotFound", err)
	}
}
