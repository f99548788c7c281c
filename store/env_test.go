package store_test

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/hiloop/hiloop/store"
)

// TestEnvRoundTrip: a sandbox's env is written with it and read back by
// every read, exactly; a sandbox without one reads back none; a TTL
// change, which rewrites the spec, leaves it be.
func TestEnvRoundTrip(t *testing.T) {
	ctx := context.Background()
	s := open(t, filepath.Join(t.TempDir(), "h.db"), nil)
	org, err := s.CreateOrg(ctx, "acme", 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	env := map[string]string{"A": "1", "QUOTES": `"'$(x)` + "\n", "EMPTY": ""}
	with, _, err := s.CreateSandbox(ctx, store.NewSandbox{OrgID: org.ID, Spec: store.Spec{Image: "busybox", Env: env, TTLSeconds: 60}})
	if err != nil {
		t.Fatal(err)
	}
	without, _, err := s.CreateSandbox(ctx, store.NewSandbox{OrgID: org.ID, Spec: store.Spec{Image: "busybox"}})
	if err != nil {
		t.Fatal(err)
	}
	got, err := s.Sandbox(ctx, org.ID, with.ID)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(env, got.Spec.Env); diff != "" {
		t.Errorf("env (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(env, got.API().Env); diff != "" {
		t.Errorf("API env (-want +got):\n%s", diff)
	}
	if got, err := s.Sandbox(ctx, org.ID, without.ID); err != nil || got.Spec.Env != nil || len(got.API().Env) != 0 || got.API().Env == nil {
		t.Errorf("a sandbox without env: %v %v", got.Spec.Env, err)
	}
	ttl := 2 * time.Hour
	expires := time.Now().Add(ttl)
	if _, err := s.SetLifetime(ctx, org.ID, with.ID, store.Lifetime{ExpiresAt: &expires, TTLSeconds: int64(ttl / time.Second)}); err != nil {
		t.Fatal(err)
	}
	page, _, err := s.ListSandboxes(ctx, store.ListOptions{OrgID: org.ID, Limit: 10})
	if err != nil {
		t.Fatal(err)
	}
	for _, sb := range page {
		if sb.ID == with.ID {
			if diff := cmp.Diff(env, sb.Spec.Env); diff != "" {
				t.Errorf("listed env (-want +got):\n%s", diff)
			}
		}
	}
}
