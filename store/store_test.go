package store_test

import (
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/fstest"
	"time"

	"github.com/google/go-cmp/cmp"
	gossh "golang.org/x/crypto/ssh"

	"github.com/hiloop/hiloop/migrations"
	"github.com/hiloop/hiloop/receipt"
	"github.com/hiloop/hiloop/store"
)

func open(t *testing.T, path string, m fs.FS) *store.Store {
	t.Helper()
	s, err := store.Open(context.Background(), store.Options{Path: path, Migrations: m})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func allMigrations(t *testing.T) []string {
	names, err := fs.Glob(migrations.FS, "*.sql")
	if err != nil || len(names) < 2 {
		t.Fatalf("embedded migrations: %v %v", names, err)
	}
	return names
}

func TestMigrateEmptyAndRerun(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "h.db")
	s := open(t, path, nil)
	mode, err := s.JournalMode(ctx)
	if err != nil || mode != "wal" {
		t.Fatalf("journal mode %q %v, want wal", mode, err)
	}
	got, err := s.Migrations(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(allMigrations(t), got); diff != "" {
		t.Fatalf("applied migrations (-want +got):\n%s", diff)
	}
	org, err := s.CreateOrg(ctx, "acme", 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	s.Close()

	// Re-opening re-runs the migrations: a no-op that keeps the data.
	s2 := open(t, path, nil)
	got2, _ := s2.Migrations(ctx)
	if diff := cmp.Diff(got, got2); diff != "" {
		t.Fatalf("rerun changed migrations:\n%s", diff)
	}
	if _, err := s2.Org(ctx, org.ID); err != nil {
		t.Fatalf("org lost across reopen: %v", err)
	}
}

func TestMigrateOlderSchema(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "old.db")
	first := allMigrations(t)[0]
	body, err := fs.ReadFile(migrations.FS, first)
	if err != nil {
		t.Fatal(err)
	}
	old := open(t, path, fstest.MapFS{first: {Data: body}})
	org, err := old.CreateOrg(ctx, "legacy", 3, 2)
	if err != nil {
		t.Fatal(err)
	}
	old.Close()

	s := open(t, path, nil)
	applied, _ := s.Migrations(ctx)
	if diff := cmp.Diff(allMigrations(t), applied); diff != "" {
		t.Fatalf("upgrade (-want +got):\n%s", diff)
	}
	got, err := s.LookupOrg(ctx, "legacy")
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(org, got); diff != "" {
		t.Fatalf("org across upgrade (-want +got):\n%s", diff)
	}
	// The newer schema's features work on the upgraded file.
	if _, _, err := s.CreateSandbox(ctx, store.NewSandbox{OrgID: org.ID, Spec: store.Spec{Image: "busybox"}, IdempotencyKey: "k", RequestHash: "h"}); err != nil {
		t.Fatal(err)
	}
}

func TestBrokenMigrationRollsBack(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "b.db")
	m := fstest.MapFS{
		"0001_a.sql": {Data: []byte("CREATE TABLE a (x INTEGER);")},
		"0002_b.sql": {Data: []byte("CREATE TABLE b (x INTEGER); INSERT INTO nope VALUES (1);")},
	}
	if _, err := store.Open(ctx, store.Options{Path: path, Migrations: m}); err == nil {
		t.Fatal("broken migration applied")
	}
	m["0002_b.sql"] = &fstest.MapFile{Data: []byte("CREATE TABLE b (x INTEGER);")}
	s := open(t, path, m)
	got, _ := s.Migrations(ctx)
	if diff := cmp.Diff([]string{"0001_a.sql", "0002_b.sql"}, got); diff != "" {
		t.Fatal(diff)
	}
}

func TestKeysAndBootstrap(t *testing.T) {
	ctx := context.Background()
	s := open(t, filepath.Join(t.TempDir(), "k.db"), nil)
	org, secret, err := s.Bootstrap(ctx, "admin")
	if err != nil || secret == "" {
		t.Fatalf("bootstrap: %v %q", err, secret)
	}
	if _, again, err := s.Bootstrap(ctx, "admin"); err != nil || again != "" {
		t.Fatalf("second bootstrap issued a key: %q %v", again, err)
	}
	k, err := s.Authenticate(ctx, secret)
	if err != nil || k.OrgID != org.ID {
		t.Fatalf("authenticate: %+v %v", k, err)
	}
	for _, bad := range []string{"", "hl_", secret + "x", "Bearer " + secret} {
		if _, err := s.Authenticate(ctx, bad); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("Authenticate(%q) = %v, want ErrNotFound", bad, err)
		}
	}
	// The last live key cannot be revoked without force: that would lock
	// the organization out.
	if err := s.RevokeKey(ctx, org.ID, k.ID, false); !errors.Is(err, store.ErrLastKey) {
		t.Fatalf("revoking the last key: %v, want ErrLastKey", err)
	}
	second, _, err := s.CreateKey(ctx, org.ID, "second")
	if err != nil {
		t.Fatal(err)
	}
	if err := s.RevokeKey(ctx, org.ID, k.ID, false); err != nil {
		t.Fatal(err)
	}
	if err := s.RevokeKey(ctx, org.ID, second.ID, false); !errors.Is(err, store.ErrLastKey) {
		t.Fatalf("revoking the new last key: %v", err)
	}
	if err := s.RevokeKey(ctx, org.ID, second.ID, true); err != nil {
		t.Fatalf("forced revoke: %v", err)
	}
	if _, err := s.Authenticate(ctx, secret); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("revoked key authenticated: %v", err)
	}
	if _, err := s.CreateOrg(ctx, "admin", 0, 0); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("duplicate org: %v", err)
	}
	if _, _, err := s.CreateKey(ctx, "org_missing", "x"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("key for missing org: %v", err)
	}
}

// TestSSHKeyPerOrganization: a public key is registered at most once per
// organization, and any number of organizations may register it, so one
// that registers another's public key (public keys are public) neither
// blocks it nor learns that it is registered. The gateway's lookup resolves
// key and sandbox together: the registration that answers is always the one
// of the organization that owns the sandbox.
func TestSSHKeyPerOrganization(t *testing.T) {
	ctx := context.Background()
	s := open(t, filepath.Join(t.TempDir(), "s.db"), nil)
	key := newPublicKey(t)
	fp := gossh.FingerprintSHA256(key)
	var orgs, sandboxes []string
	for _, name := range []string{"a", "b"} {
		org, err := s.CreateOrg(ctx, name, 0, 0)
		if err != nil {
			t.Fatal(err)
		}
		sb, _, err := s.CreateSandbox(ctx, store.NewSandbox{OrgID: org.ID, Spec: store.Spec{Image: "busybox"}})
		if err != nil {
			t.Fatal(err)
		}
		orgs, sandboxes = append(orgs, org.ID), append(sandboxes, sb.ID)
	}
	a, err := s.AddSSHKey(ctx, orgs[0], "laptop", key, 0)
	if err != nil {
		t.Fatal(err)
	}
	b, err := s.AddSSHKey(ctx, orgs[1], "taken from a profile", key, 0)
	if err != nil {
		t.Fatalf("another organization registering the same key: %v", err)
	}
	if a.ID == b.ID || a.Fingerprint != b.Fingerprint {
		t.Fatalf("registrations %+v and %+v: want two of one key", a, b)
	}
	for i, org := range orgs {
		_, err := s.AddSSHKey(ctx, org, "again", key, 0)
		if !errors.Is(err, store.ErrKeyRegistered) {
			t.Errorf("adding the key again to org %d: %v, want ErrKeyRegistered", i, err)
		}
	}
	for i, want := range []store.SSHKey{a, b} {
		got, err := s.SSHKeyForSandbox(ctx, fp, sandboxes[i])
		if err != nil {
			t.Fatalf("key for org %d's sandbox: %v", i, err)
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("key for org %d's sandbox (-want +got):\n%s", i, diff)
		}
	}

	// Org a deletes its registration: org b's does not stand in for it.
	if err := s.DeleteSSHKey(ctx, orgs[0], a.ID); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ name, fp, id string }{
		{"org a's sandbox after a deleted its key", fp, sandboxes[0]},
		{"an unregistered key", gossh.FingerprintSHA256(newPublicKey(t)), sandboxes[1]},
		{"an absent sandbox", fp, "sbx_absent"},
		{"no fingerprint", "", sandboxes[1]},
		{"no sandbox", fp, ""},
	} {
		if k, err := s.SSHKeyForSandbox(ctx, tc.fp, tc.id); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("%s: %+v, %v; want ErrNotFound", tc.name, k, err)
		}
	}
	if got, err := s.SSHKeyForSandbox(ctx, fp, sandboxes[1]); err != nil || got.ID != b.ID {
		t.Errorf("org b's sandbox after a deleted its key: %+v, %v; want b's registration", got, err)
	}
	// Org a may register the key again.
	if _, err := s.AddSSHKey(ctx, orgs[0], "back", key, 0); err != nil {
		t.Errorf("org a registering its key again: %v", err)
	}
}

// TestSSHKeysAcrossPerOrgMigration: keys registered under the schema where
// a key was unique across organizations keep their ids, and the gateway's
// lookup finds them after the upgrade.
func TestSSHKeysAcrossPerOrgMigration(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "old.db")
	old := fstest.MapFS{}
	for _, name := range allMigrations(t) {
		if name >= "0007" {
			break
		}
		body, err := fs.ReadFile(migrations.FS, name)
		if err != nil {
			t.Fatal(err)
		}
		old[name] = &fstest.MapFile{Data: body}
	}
	before := open(t, path, old)
	org, err := before.CreateOrg(ctx, "a", 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	// The sandbox is written as that schema has it: this binary's
	// CreateSandbox writes columns of later migrations.
	sb := store.Sandbox{ID: store.NewID("sbx")}
	if err := before.ExecSQL(ctx, `INSERT INTO sandboxes (id, org_id, spec, desired_mode, state, created_at, updated_at)
		VALUES (?, ?, '{"image":"busybox"}', 'running', 'running', 0, 0)`, sb.ID, org.ID); err != nil {
		t.Fatal(err)
	}
	key := newPublicKey(t)
	k, err := before.AddSSHKey(ctx, org.ID, "laptop", key, 0)
	if err != nil {
		t.Fatal(err)
	}
	before.Close()

	s := open(t, path, nil)
	got, err := s.SSHKeyForSandbox(ctx, k.Fingerprint, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(k, got); diff != "" {
		t.Errorf("key across the upgrade (-want +got):\n%s", diff)
	}
	other, err := s.CreateOrg(ctx, "b", 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.AddSSHKey(ctx, other.ID, "same", key, 0); err != nil {
		t.Errorf("another organization registering the key after the upgrade: %v", err)
	}
	if _, err := s.AddSSHKey(ctx, org.ID, "again", key, 0); !errors.Is(err, store.ErrKeyRegistered) {
		t.Errorf("the same organization again after the upgrade: %v, want ErrKeyRegistered", err)
	}
}

func newPublicKey(t *testing.T) gossh.PublicKey {
	t.Helper()
	pub, _, err := ed25519.GenerateKey(nil)
	if err != nil {
		t.Fatal(err)
	}
	key, err := gossh.NewPublicKey(pub)
	if err != nil {
		t.Fatal(err)
	}
	return key
}

func TestQuotaUnderConcurrency(t *testing.T) {
	ctx := context.Background()
	s := open(t, filepath.Join(t.TempDir(), "q.db"), nil)
	org, _ := s.CreateOrg(ctx, "q", 5, 3)
	var wg sync.WaitGroup
	var mu sync.Mutex
	created, refused := 0, 0
	for i := 0; i < 20; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, _, err := s.CreateSandbox(ctx, store.NewSandbox{OrgID: org.ID, Spec: store.Spec{Image: "busybox"}})
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				created++
			case errors.Is(err, store.ErrQuota):
				refused++
			default:
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	if created != 3 || refused != 17 {
		t.Fatalf("created %d refused %d, want 3 and 17 (max running 3)", created, refused)
	}
}

func TestIdempotencyAndIsolation(t *testing.T) {
	ctx := context.Background()
	s := open(t, filepath.Join(t.TempDir(), "i.db"), nil)
	a, _ := s.CreateOrg(ctx, "a", 0, 0)
	b, _ := s.CreateOrg(ctx, "b", 0, 0)
	n := store.NewSandbox{OrgID: a.ID, Spec: store.Spec{Image: "busybox"}, IdempotencyKey: "k1", RequestHash: "h1"}
	first, created, err := s.CreateSandbox(ctx, n)
	if err != nil || !created {
		t.Fatal(err)
	}
	again, created, err := s.CreateSandbox(ctx, n)
	if err != nil || created || again.ID != first.ID {
		t.Fatalf("retry made a new sandbox: %v %v %v", again.ID, created, err)
	}
	n.RequestHash = "h2"
	if _, _, err := s.CreateSandbox(ctx, n); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("reused key with other body: %v", err)
	}
	// The same key in another org is another sandbox.
	other, created, err := s.CreateSandbox(ctx, store.NewSandbox{OrgID: b.ID, Spec: store.Spec{Image: "busybox"}, IdempotencyKey: "k1", RequestHash: "h1"})
	if err != nil || !created || other.ID == first.ID {
		t.Fatalf("cross-org idempotency: %v %v", created, err)
	}
	for _, tc := range []struct{ org, id string }{{b.ID, first.ID}, {a.ID, other.ID}} {
		if _, err := s.Sandbox(ctx, tc.org, tc.id); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("org %s sees %s: %v", tc.org, tc.id, err)
		}
		if _, err := s.SetDesiredMode(ctx, tc.org, tc.id, store.ModeStopped, store.StopUser); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("org %s stops %s: %v", tc.org, tc.id, err)
		}
		if _, err := s.Events(ctx, tc.org, tc.id); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("org %s reads events of %s: %v", tc.org, tc.id, err)
		}
	}
	list, _, _ := s.ListSandboxes(ctx, store.ListOptions{OrgID: b.ID})
	if len(list) != 1 || list[0].ID != other.ID {
		t.Fatalf("org b lists %+v", list)
	}
}

func TestObserveWritesOnlyOnChange(t *testing.T) {
	ctx := context.Background()
	s := open(t, filepath.Join(t.TempDir(), "o.db"), nil)
	org, _ := s.CreateOrg(ctx, "o", 0, 0)
	sb, _, _ := s.CreateSandbox(ctx, store.NewSandbox{OrgID: org.ID, Spec: store.Spec{Image: "busybox"}})
	code := 3
	steps := []struct {
		obs   store.Observation
		wrote bool
	}{
		{store.Observation{State: store.StateStarting}, true},
		{store.Observation{State: store.StateStarting}, false},
		{store.Observation{State: store.StateRunning}, true},
		{store.Observation{State: store.StateExited, ExitCode: &code, Reason: "Error"}, true},
		{store.Observation{State: store.StateExited, ExitCode: &code, Reason: "Error"}, false},
		{store.Observation{State: store.StateLost}, true},
		{store.Observation{State: store.StateRunning}, false}, // terminal is final
	}
	for i, st := range steps {
		wrote, err := s.Observe(ctx, sb.ID, st.obs)
		if err != nil || wrote != st.wrote {
			t.Fatalf("step %d: wrote %v err %v, want wrote %v", i, wrote, err, st.wrote)
		}
	}
	evs, _ := s.Events(ctx, org.ID, sb.ID)
	var got []string
	for _, e := range evs {
		got = append(got, string(e.From)+">"+string(e.To))
	}
	want := []string{">pending", "pending>starting", "starting>running", "running>exited", "exited>lost"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Fatalf("events (-want +got):\n%s", diff)
	}
}

// twoSandboxes opens a new store with one organization and two pending
// sandboxes of it.
func twoSandboxes(t *testing.T) (s *store.Store, a, b store.Sandbox) {
	t.Helper()
	ctx := context.Background()
	s = open(t, filepath.Join(t.TempDir(), "two.db"), nil)
	org, err := s.CreateOrg(ctx, "o", 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	var sbs [2]store.Sandbox
	for i := range sbs {
		if sbs[i], _, err = s.CreateSandbox(ctx, store.NewSandbox{OrgID: org.ID, Spec: store.Spec{Image: "busybox"}}); err != nil {
			t.Fatal(err)
		}
	}
	return s, sbs[0], sbs[1]
}

// TestObserveWith: the decision is made of the record as the write
// transaction holds it: two decisions queued together, before either is
// made, see each other's write; a decision that fails fails alone, and
// writes nothing; a terminal record is not decided at all.
func TestObserveWith(t *testing.T) {
	ctx := context.Background()
	s, a, b := twoSandboxes(t)
	next := map[store.State]store.State{store.StatePending: store.StateStarting, store.StateStarting: store.StateRunning}
	advance := func(rec store.Sandbox) (store.Observation, error) {
		return store.Observation{State: next[rec.State]}, nil
	}
	refused := errors.New("refused")
	release := s.HoldWriter(t)
	var wg sync.WaitGroup
	results := make([]error, 3)
	wg.Go(func() { _, results[0] = s.ObserveWith(ctx, a.ID, advance) })
	wg.Go(func() { _, results[1] = s.ObserveWith(ctx, a.ID, advance) })
	wg.Go(func() {
		_, results[2] = s.ObserveWith(ctx, b.ID, func(store.Sandbox) (store.Observation, error) {
			return store.Observation{State: store.StateRunning}, refused
		})
	})
	for s.BatchWaiting() < 3 {
		runtime.Gosched()
	}
	release()
	wg.Wait()
	if results[0] != nil || results[1] != nil || !errors.Is(results[2], refused) {
		t.Fatalf("results %v, want nil, nil, refused", results)
	}
	if got, _ := s.SandboxAnyOrg(ctx, a.ID); got.State != store.StateRunning {
		t.Errorf("a is %s after two advances, want running", got.State)
	}
	if got, _ := s.SandboxAnyOrg(ctx, b.ID); got.State != store.StatePending {
		t.Errorf("b is %s after a failed decision, want pending", got.State)
	}
	if _, err := s.Observe(ctx, b.ID, store.Observation{State: store.StateLost}); err != nil {
		t.Fatal(err)
	}
	wrote, err := s.ObserveWith(ctx, b.ID, func(store.Sandbox) (store.Observation, error) {
		t.Error("a terminal record was decided")
		return store.Observation{State: store.StateRunning}, nil
	})
	if wrote || err != nil {
		t.Errorf("observing a terminal record: wrote %v, err %v", wrote, err)
	}
	if _, err := s.ObserveWith(ctx, "sbx_none", advance); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("observing no record: %v, want ErrNotFound", err)
	}
}

// TestStateChangeWakes: a state change wakes those waiting on its sandbox,
// and only a state change; a change of another field or of another sandbox
// does not; a failed create wakes too; and once every waiter is released,
// nothing is left behind.
func TestStateChangeWakes(t *testing.T) {
	ctx := context.Background()
	s, a, b := twoSandboxes(t)
	closed := func(ch <-chan struct{}) bool {
		select {
		case <-ch:
			return true
		default:
			return false
		}
	}
	first, release1 := s.StateChange(a.ID)
	second, release2 := s.StateChange(a.ID)
	other, releaseB := s.StateChange(b.ID)
	if _, err := s.Observe(ctx, a.ID, store.Observation{State: store.StateStarting}); err != nil {
		t.Fatal(err)
	}
	if !closed(first) || !closed(second) {
		t.Error("a state change did not wake both waiters")
	}
	if closed(other) {
		t.Error("a state change of one sandbox woke a waiter on another")
	}
	again, release3 := s.StateChange(a.ID)
	if closed(again) {
		t.Error("a waiter after the change starts woken")
	}
	if _, err := s.Observe(ctx, a.ID, store.Observation{State: store.StateStarting, Reason: "pulling"}); err != nil {
		t.Fatal(err)
	}
	if closed(again) {
		t.Error("a change of reason alone woke a state waiter")
	}
	if err := s.Fail(ctx, b.ID, "refused"); err != nil {
		t.Fatal(err)
	}
	if !closed(other) {
		t.Error("a failed create did not wake its waiter")
	}
	for _, r := range []func(){release1, release2, release3, releaseB, release3} { // twice is harmless
		r()
	}
	if n := s.Waiting(); n != 0 {
		t.Errorf("%d sandboxes still waited on after every waiter released", n)
	}
}

// TestListPagination: pages follow creation order, filters apply, and a
// cursor stays valid while sandboxes are created behind it.
func TestListPagination(t *testing.T) {
	ctx := context.Background()
	s := open(t, filepath.Join(t.TempDir(), "p.db"), nil)
	org, _ := s.CreateOrg(ctx, "p", 100, 100)
	var ids []string
	for i := range 5 {
		sb, _, err := s.CreateSandbox(ctx, store.NewSandbox{OrgID: org.ID, Spec: store.Spec{Image: "busybox", Labels: map[string]string{"n": fmt.Sprint(i % 2)}}})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, sb.ID)
	}
	var got []string
	after := ""
	for page := 0; ; page++ {
		list, next, err := s.ListSandboxes(ctx, store.ListOptions{OrgID: org.ID, Limit: 2, After: after})
		if err != nil {
			t.Fatal(err)
		}
		for _, sb := range list {
			got = append(got, sb.ID)
		}
		if page == 0 {
			// Created after the first page was read: it shows up at the end.
			sb, _, _ := s.CreateSandbox(ctx, store.NewSandbox{OrgID: org.ID, Spec: store.Spec{Image: "busybox"}})
			ids = append(ids, sb.ID)
		}
		if next == "" {
			break
		}
		after = next
	}
	if diff := cmp.Diff(ids, got); diff != "" {
		t.Fatalf("pages (-want +got):\n%s", diff)
	}
	list, _, _ := s.ListSandboxes(ctx, store.ListOptions{OrgID: org.ID, Labels: map[string]string{"n": "1"}})
	if len(list) != 2 || list[0].ID != ids[1] || list[1].ID != ids[3] {
		t.Fatalf("label filter: %+v", list)
	}
	list, _, _ = s.ListSandboxes(ctx, store.ListOptions{OrgID: org.ID, State: store.StateRunning})
	if len(list) != 0 {
		t.Fatalf("state filter: %d", len(list))
	}
}

// TestScopingFailsClosed: an empty organization sees nothing and can do
// nothing, rather than everything.
func TestScopingFailsClosed(t *testing.T) {
	ctx := context.Background()
	s := open(t, filepath.Join(t.TempDir(), "f.db"), nil)
	org, _ := s.CreateOrg(ctx, "a", 0, 0)
	sb, _, err := s.CreateSandbox(ctx, store.NewSandbox{OrgID: org.ID, Spec: store.Spec{Image: "busybox"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Sandbox(ctx, "", sb.ID); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("Sandbox with empty org: %v", err)
	}
	if _, _, err := s.ListSandboxes(ctx, store.ListOptions{}); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("ListSandboxes with empty org: %v", err)
	}
	if _, err := s.SetDesiredMode(ctx, "", sb.ID, store.ModeStopped, store.StopUser); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("SetDesiredMode with empty org: %v", err)
	}
	now := time.Now()
	if _, err := s.SetLifetime(ctx, "", sb.ID, store.Lifetime{ExpiresAt: &now, TTLSeconds: 60}); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("SetLifetime with empty org: %v", err)
	}
	if _, err := s.Events(ctx, "", sb.ID); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("Events with empty org: %v", err)
	}
	if _, err := s.Keys(ctx, ""); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("Keys with empty org: %v", err)
	}
	if _, _, err := s.CreateSandbox(ctx, store.NewSandbox{Spec: store.Spec{Image: "busybox"}}); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("CreateSandbox with empty org: %v", err)
	}
	// The explicitly unscoped read is the mirror's.
	if got, err := s.SandboxAnyOrg(ctx, sb.ID); err != nil || got.ID != sb.ID {
		t.Errorf("SandboxAnyOrg: %v", err)
	}
}

// TestOrgLookupIsUnambiguous: names are DNS labels, ids start with org_, and
// a lookup uses one column.
func TestOrgLookupIsUnambiguous(t *testing.T) {
	ctx := context.Background()
	s := open(t, filepath.Join(t.TempDir(), "l.db"), nil)
	a, _ := s.CreateOrg(ctx, "acme", 0, 0)
	for _, bad := range []string{a.ID, "org_x", "Acme", "", "a b", strings.Repeat("a", 64)} {
		if _, err := s.CreateOrg(ctx, bad, 0, 0); !errors.Is(err, store.ErrInvalidName) {
			t.Errorf("CreateOrg(%q) = %v, want ErrInvalidName", bad, err)
		}
	}
	for _, ref := range []string{a.ID, "acme"} {
		if got, err := s.LookupOrg(ctx, ref); err != nil || got.ID != a.ID {
			t.Errorf("LookupOrg(%q) = %v, %v", ref, got.ID, err)
		}
	}
	if _, err := s.Org(ctx, "acme"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("Org by name: %v, want not found (Org takes an id)", err)
	}
	if _, err := s.LookupOrg(ctx, ""); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("LookupOrg empty: %v", err)
	}
}

// TestModeOutsideLeavesRunningQuota: a sandbox observed stopped while its
// desired mode is running (stopped outside hiloop) does not count against
// max_running, and starting it again checks the quota.
func TestModeOutsideLeavesRunningQuota(t *testing.T) {
	ctx := context.Background()
	s := open(t, filepath.Join(t.TempDir(), "m.db"), nil)
	org, _ := s.CreateOrg(ctx, "m", 10, 1)
	first, _, err := s.CreateSandbox(ctx, store.NewSandbox{OrgID: org.ID, Spec: store.Spec{Image: "busybox"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.CreateSandbox(ctx, store.NewSandbox{OrgID: org.ID, Spec: store.Spec{Image: "busybox"}}); !errors.Is(err, store.ErrQuota) {
		t.Fatalf("second running sandbox: %v, want ErrQuota", err)
	}
	if _, err := s.Observe(ctx, first.ID, store.Observation{State: store.StateStopped}); err != nil {
		t.Fatal(err)
	}
	if got, _ := s.Sandbox(ctx, org.ID, first.ID); !got.ModeOutside {
		t.Fatal("stopped with desired running is not marked as changed outside hiloop")
	}
	second, _, err := s.CreateSandbox(ctx, store.NewSandbox{OrgID: org.ID, Spec: store.Spec{Image: "busybox"}})
	if err != nil {
		t.Fatalf("create while the first is stopped outside hiloop: %v", err)
	}
	// Starting the first again needs room, although its desired mode is
	// already running.
	if _, err := s.SetDesiredMode(ctx, org.ID, first.ID, store.ModeRunning, ""); !errors.Is(err, store.ErrQuota) {
		t.Fatalf("start over quota: %v", err)
	}
	if _, err := s.SetDesiredMode(ctx, org.ID, second.ID, store.ModeStopped, store.StopUser); err != nil {
		t.Fatal(err)
	}
	ch, err := s.SetDesiredMode(ctx, org.ID, first.ID, store.ModeRunning, "")
	if err != nil || ch.After.ModeOutside || !ch.Before.ModeOutside {
		t.Fatalf("start: %+v %v", ch, err)
	}
	if err := s.RestoreMode(ctx, ch.Before); err != nil {
		t.Fatal(err)
	}
	if got, _ := s.Sandbox(ctx, org.ID, first.ID); !got.ModeOutside {
		t.Fatal("restore did not put the outside mark back")
	}
}

// TestDeleteTerminal: a terminal sandbox can be deleted (desired becomes
// deleted) but not started or stopped.
func TestDeleteTerminal(t *testing.T) {
	ctx := context.Background()
	s := open(t, filepath.Join(t.TempDir(), "d.db"), nil)
	org, _ := s.CreateOrg(ctx, "d", 0, 0)
	sb, _, _ := s.CreateSandbox(ctx, store.NewSandbox{OrgID: org.ID, Spec: store.Spec{Image: "busybox"}})
	if err := s.Fail(ctx, sb.ID, "cluster write failed"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.SetDesiredMode(ctx, org.ID, sb.ID, store.ModeRunning, ""); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("start a failed sandbox: %v", err)
	}
	ch, err := s.SetDesiredMode(ctx, org.ID, sb.ID, store.ModeDeleted, "")
	if err != nil || ch.After.DesiredMode != store.ModeDeleted {
		t.Fatalf("delete a failed sandbox: %+v %v", ch.After, err)
	}
	if got, _ := s.Sandbox(ctx, org.ID, sb.ID); got.DesiredMode != store.ModeDeleted || got.State != store.StateFailed {
		t.Fatalf("after delete: desired %s state %s", got.DesiredMode, got.State)
	}
}

// TestBackupWhileWriting: a backup taken while writes go on is a consistent,
// integrity-checked copy with what was committed before it, and a backup
// never overwrites a file.
func TestBackupWhileWriting(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	s := open(t, filepath.Join(dir, "live.db"), nil)
	org, _ := s.CreateOrg(ctx, "b", 10000, 10000)
	first, _, _ := s.CreateSandbox(ctx, store.NewSandbox{OrgID: org.ID, Spec: store.Spec{Image: "busybox"}})
	host, err := s.HostKey(ctx)
	if err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			if _, _, err := s.CreateSandbox(ctx, store.NewSandbox{OrgID: org.ID, Spec: store.Spec{Image: "busybox"}}); err != nil {
				t.Error(err)
				return
			}
		}
	}()
	out := filepath.Join(dir, "backup.db")
	err = s.Backup(ctx, out)
	close(stop)
	wg.Wait()
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Backup(ctx, out); err == nil {
		t.Fatal("a backup overwrote an existing file")
	}
	b := open(t, out, nil)
	if _, err := b.Sandbox(ctx, org.ID, first.ID); err != nil {
		t.Fatalf("the backup lacks a sandbox committed before it: %v", err)
	}
	bhost, err := b.HostKey(ctx)
	if err != nil || string(bhost.PublicKey().Marshal()) != string(host.PublicKey().Marshal()) {
		t.Fatalf("the backup's host key differs: %v", err)
	}
	if err := store.CheckIntegrity(ctx, out); err != nil {
		t.Fatal(err)
	}
}

// TestPruneEvents: events older than the cutoff go, in batches (120 is
// three of 40, so the loop's end on a full batch is crossed), newer ones and
// the sandboxes themselves stay.
func TestPruneEvents(t *testing.T) {
	ctx := context.Background()
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	s, err := store.Open(ctx, store.Options{Path: filepath.Join(t.TempDir(), "p.db"), Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	s.SetPruneBatch(40)
	org, _ := s.CreateOrg(ctx, "p", 2000, 2000)
	var ids []string
	for i := range 150 {
		if i == 120 {
			now = now.Add(48 * time.Hour)
		}
		sb, _, err := s.CreateSandbox(ctx, store.NewSandbox{OrgID: org.ID, Spec: store.Spec{Image: "busybox"}})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, sb.ID)
	}
	n, err := s.PruneEvents(ctx, now.Add(-24*time.Hour))
	if err != nil || n != 120 {
		t.Fatalf("pruned %d, %v; want 120 (three batches)", n, err)
	}
	if evs, _ := s.Events(ctx, org.ID, ids[0]); len(evs) != 0 {
		t.Errorf("an old event survived: %v", evs)
	}
	if evs, _ := s.Events(ctx, org.ID, ids[140]); len(evs) != 1 {
		t.Errorf("a recent event went: %v", evs)
	}
	if _, err := s.Sandbox(ctx, org.ID, ids[0]); err != nil {
		t.Errorf("the sandbox went with its events: %v", err)
	}
	if n, err := s.PruneEvents(ctx, now.Add(-24*time.Hour)); err != nil || n != 0 {
		t.Errorf("second prune: %d %v", n, err)
	}
}

// TestQueryPlans: the quota check reads one covering index, and a page of
// the list, with or without a state and a cursor, reads rows in rowid order
// without sorting every row of the organization first.
func TestQueryPlans(t *testing.T) {
	ctx := context.Background()
	s := open(t, filepath.Join(t.TempDir(), "p.db"), nil)
	org, _ := s.CreateOrg(ctx, "p", 100, 100)
	for range 20 {
		if _, _, err := s.CreateSandbox(ctx, store.NewSandbox{OrgID: org.ID, Spec: store.Spec{Image: "busybox"}}); err != nil {
			t.Fatal(err)
		}
	}
	for _, o := range []store.ListOptions{{OrgID: org.ID, Limit: 10}, {OrgID: org.ID, State: store.StateRunning, Limit: 10},
		{OrgID: org.ID, After: "sbx_x", Limit: 10}} {
		quota, list, err := s.Plans(ctx, o)
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(quota, "sandboxes") || strings.Contains(quota, "SCAN") || !strings.Contains(quota, "SEARCH c USING PRIMARY KEY") {
			t.Errorf("quota check plan:\n%s", quota)
		}
		if strings.Contains(list, "TEMP B-TREE") || !strings.Contains(list, "sandboxes_org_rowid") {
			t.Errorf("list %+v plan:\n%s", o, list)
		}
	}
}

// TestStatementCacheBounded: lists filtered by ever more labels each have a
// query of their own; past the cache's bound they still answer, unprepared,
// and the cache stays bounded.
func TestStatementCacheBounded(t *testing.T) {
	ctx := context.Background()
	s := open(t, filepath.Join(t.TempDir(), "c.db"), nil)
	org, _ := s.CreateOrg(ctx, "c", 10, 10)
	labels := map[string]string{}
	for i := range 100 {
		labels[fmt.Sprintf("k%d", i)] = "v"
	}
	sb, _, err := s.CreateSandbox(ctx, store.NewSandbox{OrgID: org.ID, Spec: store.Spec{Image: "busybox", Labels: labels}})
	if err != nil {
		t.Fatal(err)
	}
	filter := map[string]string{}
	for i := range 100 {
		filter[fmt.Sprintf("k%d", i)] = "v"
		list, _, err := s.ListSandboxes(ctx, store.ListOptions{OrgID: org.ID, Labels: filter})
		if err != nil || len(list) != 1 || list[0].ID != sb.ID {
			t.Fatalf("%d labels: %v %v", i+1, list, err)
		}
	}
	if n := s.CachedStmts(); n == 0 || n > 64 {
		t.Errorf("%d statements cached, want 1..64", n)
	}
	if _, err := s.Sandbox(ctx, org.ID, sb.ID); err != nil {
		t.Errorf("a read past the bound: %v", err)
	}
}

// TestWritesRunPrepared: every statement of the hot write transactions
// prepares on the full schema (one that did not would run unprepared, and
// silently slower), and a create, an observation and a failed create run
// through them in one transaction after another.
func TestWritesRunPrepared(t *testing.T) {
	ctx := context.Background()
	s := open(t, filepath.Join(t.TempDir(), "p.db"), nil)
	if got, want := s.PreparedWrites(); got != want {
		t.Fatalf("%d of %d write statements prepared", got, want)
	}
	org, _ := s.CreateOrg(ctx, "p", 10, 10)
	for range 3 {
		a, _, err := s.CreateSandbox(ctx, store.NewSandbox{OrgID: org.ID, Spec: store.Spec{Image: "busybox"}})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.Observe(ctx, a.ID, store.Observation{State: store.StateRunning}); err != nil {
			t.Fatal(err)
		}
		b, _, err := s.CreateSandbox(ctx, store.NewSandbox{OrgID: org.ID, Spec: store.Spec{Image: "busybox"}})
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Fail(ctx, b.ID, "refused"); err != nil {
			t.Fatal(err)
		}
		if _, err := s.SetDesiredMode(ctx, org.ID, a.ID, store.ModeDeleted, ""); err != nil {
			t.Fatal(err)
		}
		if got, _ := s.Sandbox(ctx, org.ID, b.ID); got.State != store.StateFailed {
			t.Fatalf("failed create is %s", got.State)
		}
	}
}

// TestGroupCommit: writes that queue behind the writer commit together, a
// few transactions for a hundred; a write refused for its own reason (the
// quota) leaves nothing behind and fails alone; a write whose caller gave up
// is not made; and writes after Close fail instead of hanging.
func TestGroupCommit(t *testing.T) {
	ctx := context.Background()
	s := open(t, filepath.Join(t.TempDir(), "g.db"), nil)
	org, _ := s.CreateOrg(ctx, "g", 1000, 60)
	release := s.HoldWriter(t)
	gone, cancel := context.WithCancel(ctx)
	abandoned := make(chan error, 1)
	go func() {
		_, _, err := s.CreateSandbox(gone, store.NewSandbox{OrgID: org.ID, Spec: store.Spec{Image: "busybox"}})
		abandoned <- err
	}()
	var wg sync.WaitGroup
	var created, refused atomic.Int64
	for range 100 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, _, err := s.CreateSandbox(ctx, store.NewSandbox{OrgID: org.ID, Spec: store.Spec{Image: "busybox"}})
			switch {
			case err == nil:
				created.Add(1)
			case errors.Is(err, store.ErrQuota):
				refused.Add(1)
			default:
				t.Error(err)
			}
		}()
	}
	for s.BatchWaiting() < 101 {
		runtime.Gosched()
	}
	cancel()
	before := s.Batches()
	release()
	wg.Wait()
	if err := <-abandoned; !errors.Is(err, context.Canceled) {
		t.Errorf("abandoned create: %v, want context.Canceled", err)
	}
	if created.Load() != 60 || refused.Load() != 40 {
		t.Fatalf("created %d refused %d, want 60 and 40", created.Load(), refused.Load())
	}
	if n := s.Batches() - before; n > 4 {
		t.Errorf("100 queued creates took %d transactions, want at most 4", n)
	}
	list, _, err := s.ListSandboxes(ctx, store.ListOptions{OrgID: org.ID, Limit: 1000})
	if err != nil || len(list) != 60 {
		t.Fatalf("%d records after the burst, want 60 (%v)", len(list), err)
	}
	for _, sb := range list {
		if evs, _ := s.Events(ctx, org.ID, sb.ID); len(evs) != 1 {
			t.Fatalf("%s has %d events, want 1", sb.ID, len(evs))
		}
	}
	s.Close()
	if _, err := s.Observe(ctx, list[0].ID, store.Observation{State: store.StateRunning}); err == nil {
		t.Error("an observation after Close succeeded")
	}
}

// TestBatchRollsBackAWriteAlone: in one batch, a write that fails after it
// has written leaves nothing behind, whatever comes before and after it;
// a write that only reads, and the writes around it, commit.
func TestBatchRollsBackAWriteAlone(t *testing.T) {
	ctx := context.Background()
	s := open(t, filepath.Join(t.TempDir(), "r.db"), nil)
	var orgs []store.Org
	for _, name := range []string{"a", "b", "c"} {
		o, err := s.CreateOrg(ctx, name, 1, 1)
		if err != nil {
			t.Fatal(err)
		}
		orgs = append(orgs, o)
	}
	rename := func(o store.Org, name string) func(exec func(string, ...any) error) error {
		return func(exec func(string, ...any) error) error {
			return exec(`UPDATE orgs SET name = ? WHERE id = ?`, name, o.ID)
		}
	}
	failed := errors.New("failed after writing")
	writes := []func(exec func(string, ...any) error) error{
		rename(orgs[0], "a2"),
		func(exec func(string, ...any) error) error {
			if err := rename(orgs[1], "b2")(exec); err != nil {
				return err
			}
			return failed
		},
		func(func(string, ...any) error) error { return nil }, // reads only
		rename(orgs[2], "c2"),
	}
	release := s.HoldWriter(t)
	var wg sync.WaitGroup
	results := make([]error, len(writes))
	for i, w := range writes {
		wg.Go(func() { results[i] = s.InBatch(ctx, w) })
	}
	for s.BatchWaiting() < int64(len(writes)) {
		runtime.Gosched()
	}
	release()
	wg.Wait()
	if results[0] != nil || !errors.Is(results[1], failed) || results[2] != nil || results[3] != nil {
		t.Fatalf("results %v, want nil, failed, nil, nil", results)
	}
	for i, want := range []string{"a2", "b", "c2"} {
		if o, err := s.Org(ctx, orgs[i].ID); err != nil || o.Name != want {
			t.Errorf("org %d is named %q (%v), want %q", i, o.Name, err, want)
		}
	}
}

// TestOrgCounts: the counts the triggers keep equal counting the rows with
// the quotas' predicates, after every kind of write, for both of two
// organizations: creates, observations of every state (stopped outside
// hiloop included), desired modes, failed creates, and a deleted row.
func TestOrgCounts(t *testing.T) {
	ctx := context.Background()
	s := open(t, filepath.Join(t.TempDir(), "n.db"), nil)
	a, _ := s.CreateOrg(ctx, "a", 1000, 1000)
	b, _ := s.CreateOrg(ctx, "b", 1000, 1000)
	check := func(step string) {
		t.Helper()
		for _, org := range []store.Org{a, b} {
			kept, counted, err := s.OrgCounts(ctx, org.ID)
			if err != nil || kept != counted {
				t.Fatalf("after %s, org %s: kept %v, counted %v (%v)", step, org.Name, kept, counted, err)
			}
		}
	}
	check("nothing")
	states := []store.State{store.StateStarting, store.StateRunning, store.StateStopping, store.StateStopped,
		store.StateExited, store.StateExpired, store.StateRunning, store.StateLost}
	modes := []store.Mode{store.ModeStopped, store.ModeRunning, store.ModeDeleted}
	var ids []string
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range 400 {
		org := []store.Org{a, b}[rng.IntN(2)]
		switch op := rng.IntN(5); {
		case op == 0 || len(ids) == 0:
			sb, _, err := s.CreateSandbox(ctx, store.NewSandbox{OrgID: org.ID, Spec: store.Spec{Image: "busybox"}})
			if err != nil {
				t.Fatal(err)
			}
			ids = append(ids, sb.ID)
		case op == 1:
			s.Observe(ctx, ids[rng.IntN(len(ids))], store.Observation{State: states[rng.IntN(len(states))]})
		case op == 2:
			id := ids[rng.IntN(len(ids))]
			rec, _ := s.SandboxAnyOrg(ctx, id)
			s.SetDesiredMode(ctx, rec.OrgID, id, modes[rng.IntN(len(modes))], store.StopUser) // a conflict changes nothing
		case op == 3:
			s.Fail(ctx, ids[rng.IntN(len(ids))], "refused") // only a pending one fails
		case op == 4 && i%20 == 0:
			j := rng.IntN(len(ids))
			if err := s.DeleteRow(ctx, ids[j]); err != nil {
				t.Fatal(err)
			}
			ids = append(ids[:j], ids[j+1:]...)
		}
		check(fmt.Sprintf("step %d", i))
	}
}

// TestOrgCountsBackfill: a record of the schema before the counts, with
// sandboxes in every kind of state, gets counts equal to counting its rows
// when it is upgraded, and the quota holds from them.
func TestOrgCountsBackfill(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "b.db")
	before := fstest.MapFS{}
	for _, name := range allMigrations(t) {
		if name >= "0006" {
			break
		}
		body, err := fs.ReadFile(migrations.FS, name)
		if err != nil {
			t.Fatal(err)
		}
		before[name] = &fstest.MapFile{Data: body}
	}
	old := open(t, path, before)
	org, _ := old.CreateOrg(ctx, "old", 9, 5)
	rows := []struct {
		state   store.State
		desired store.Mode
		outside int
	}{{store.StatePending, store.ModeRunning, 0}, {store.StateRunning, store.ModeRunning, 0}, {store.StateStopped, store.ModeRunning, 1},
		{store.StateExited, store.ModeRunning, 0}, {store.StateLost, store.ModeRunning, 0}, {store.StateRunning, store.ModeRunning, 0},
		{store.StateStopped, store.ModeStopped, 0}}
	for i, r := range rows {
		if err := old.ExecRaw(ctx, `INSERT INTO sandboxes (id, org_id, spec, desired_mode, state, mode_outside, created_at, updated_at)
			VALUES (?, ?, '{}', ?, ?, ?, 0, 0)`, fmt.Sprintf("sbx_%d", i), org.ID, r.desired, r.state, r.outside); err != nil {
			t.Fatal(err)
		}
	}
	old.Close()

	s := open(t, path, nil)
	kept, counted, err := s.OrgCounts(ctx, org.ID)
	if err != nil || kept != counted || counted != [2]int{6, 3} {
		t.Fatalf("after the upgrade: kept %v, counted %v, want [6 3] (%v)", kept, counted, err)
	}
	// Running quota 5: three run (pending counts), so two more may.
	for i := range 3 {
		_, _, err := s.CreateSandbox(ctx, store.NewSandbox{OrgID: org.ID, Spec: store.Spec{Image: "busybox"}})
		if want := i < 2; (err == nil) != want {
			t.Fatalf("create %d after the upgrade: %v", i, err)
		}
	}
}

// TestKeyLimitUnderConcurrency: concurrent creates of API keys and adds of
// SSH keys never pass an organization's limit together, the refused ones
// are *KeyLimitError, and another organization's keys are not counted.
func TestKeyLimitUnderConcurrency(t *testing.T) {
	ctx := context.Background()
	s := open(t, filepath.Join(t.TempDir(), "kl.db"), nil)
	org, err := s.CreateOrg(ctx, "a", 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	other, err := s.CreateOrg(ctx, "b", 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if _, _, err := s.CreateKey(ctx, other.ID, "b"); err != nil {
			t.Fatal(err)
		}
		if _, err := s.AddSSHKey(ctx, other.ID, "b", newPublicKey(t), 0); err != nil {
			t.Fatal(err)
		}
	}
	const max = 5
	var wg sync.WaitGroup
	var api, ssh, refused atomic.Int32
	for range 20 {
		wg.Add(2)
		go func() {
			defer wg.Done()
			_, _, err := s.CreateKeyWithin(ctx, org.ID, "k", max)
			count(t, err, &api, &refused, "API")
		}()
		go func() {
			defer wg.Done()
			_, err := s.AddSSHKey(ctx, org.ID, "k", newPublicKey(t), max)
			count(t, err, &ssh, &refused, "SSH")
		}()
	}
	wg.Wait()
	if api.Load() != max || ssh.Load() != max || refused.Load() != 30 {
		t.Errorf("%d API and %d SSH keys made, %d refused; want %d, %d and 30", api.Load(), ssh.Load(), refused.Load(), max, max)
	}
	keys, _ := s.Keys(ctx, org.ID)
	sshKeys, _ := s.SSHKeys(ctx, org.ID)
	if len(keys) != max || len(sshKeys) != max {
		t.Errorf("%d API and %d SSH keys recorded, want %d each", len(keys), len(sshKeys), max)
	}
	if err := s.RevokeKey(ctx, org.ID, keys[0].ID, false); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.CreateKeyWithin(ctx, org.ID, "after a revoke", max); err != nil {
		t.Errorf("a key after a revoke: %v", err)
	}
}

// count counts a create's outcome: made, or refused at the key limit.
func count(t *testing.T, err error, made, refused *atomic.Int32, kind string) {
	var kl *store.KeyLimitError
	switch {
	case err == nil:
		made.Add(1)
	case errors.As(err, &kl) && errors.Is(err, store.ErrKeyLimit) && kl.Kind == kind && kl.Max == 5:
		refused.Add(1)
	default:
		t.Errorf("create a %s key: %v", kind, err)
	}
}

// TestPinHelperKey: the first key a pod's helper shows is pinned; another
// key of the same pod is refused and recorded; a new pod's first key
// replaces the pin; and a pod that is not the record's (a dial that read
// the record before its pod was replaced) pins nothing, so it cannot
// displace the current pod's pin. (That the change is written once is
// sshd's TestPinAttackRefusalsWriteOnce.)
func TestPinHelperKey(t *testing.T) {
	ctx := context.Background()
	s := open(t, filepath.Join(t.TempDir(), "h.db"), nil)
	org, err := s.CreateOrg(ctx, "acme", 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	sb, _, err := s.CreateSandbox(ctx, store.NewSandbox{OrgID: org.ID, Spec: store.Spec{Image: "busybox"}})
	if err != nil {
		t.Fatal(err)
	}
	pin := func(pod, fp, want string) {
		t.Helper()
		got, err := s.PinHelperKey(ctx, sb.ID, pod, fp)
		if err != nil || got != want {
			t.Fatalf("pin %s %s: %q %v, want %q", pod, fp, got, err, want)
		}
	}
	stale := func(pod, fp string) {
		t.Helper()
		if _, err := s.PinHelperKey(ctx, sb.ID, pod, fp); !errors.Is(err, store.ErrStalePod) {
			t.Fatalf("pin %s %s: %v, want %v", pod, fp, err, store.ErrStalePod)
		}
	}
	observe := func(pod string) {
		t.Helper()
		if _, err := s.Observe(ctx, sb.ID, store.Observation{State: store.StateRunning, PodUID: pod}); err != nil {
			t.Fatal(err)
		}
	}
	changed := func(want string) {
		t.Helper()
		rec, err := s.SandboxAnyOrg(ctx, sb.ID)
		if err != nil || rec.HelperKeyChangedPod != want {
			t.Fatalf("helper key changed in pod %q %v, want %q", rec.HelperKeyChangedPod, err, want)
		}
	}
	stale("u1", "k1") // no pod observed yet
	observe("u1")
	pin("u1", "k1", "k1")
	pin("u1", "k1", "k1")
	changed("")
	pin("u1", "k2", "k1")
	changed("u1")
	pin("u1", "k2", "k1")

	observe("u2")
	stale("u1", "kX") // the late dial of the pod before
	pin("u2", "k2", "k2")
	stale("u1", "kX")
	pin("u2", "k3", "k2")
	changed("u2")
	if _, err := s.PinHelperKey(ctx, "sbx_nosuch", "u1", "k1"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("pin of an unknown sandbox: %v, want not found", err)
	}
}

// TestCloseWhileWriting: a write that still runs as the store closes (a
// wake a caller gave up on, at shutdown) is told the store closed; the
// close races with nothing (go test -race).
func TestCloseWhileWriting(t *testing.T) {
	ctx := context.Background()
	s, err := store.Open(ctx, store.Options{Path: filepath.Join(t.TempDir(), "h.db")})
	if err != nil {
		t.Fatal(err)
	}
	org, err := s.CreateOrg(ctx, "acme", 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	started := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; ; i++ {
			if _, _, err := s.CreateSandbox(ctx, store.NewSandbox{OrgID: org.ID, Spec: store.Spec{Image: "busybox"}}); err != nil {
				return
			}
			if i == 0 {
				close(started)
			}
		}
	}()
	<-started
	if err := s.Close(); err != nil {
		t.Logf("close: %v", err)
	}
	<-done
}

func TestRecordRuntime(t *testing.T) {
	ctx := context.Background()
	s := open(t, filepath.Join(t.TempDir(), "h.db"), nil)
	org, err := s.CreateOrg(ctx, "acme", 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	sb, _, err := s.CreateSandbox(ctx, store.NewSandbox{OrgID: org.ID, Spec: store.Spec{Image: "busybox"}})
	if err != nil {
		t.Fatal(err)
	}
	type seen struct {
		Pod, Release string
		Runtime      receipt.Runtime
	}
	record := func(pod string, r receipt.Runtime, release string, wantWrote bool, wantErr error) {
		t.Helper()
		wrote, err := s.RecordRuntime(ctx, sb.ID, pod, r, release)
		if !errors.Is(err, wantErr) || wrote != wantWrote {
			t.Fatalf("record %s %s: wrote %v, %v; want %v, %v", pod, r, wrote, err, wantWrote, wantErr)
		}
	}
	check := func(want seen) {
		t.Helper()
		rec, err := s.SandboxAnyOrg(ctx, sb.ID)
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(want, seen{rec.RuntimePod, rec.RuntimeRelease, rec.RuntimeObserved}); diff != "" {
			t.Fatalf("runtime observed (-want +got):\n%s", diff)
		}
	}
	observe := func(pod string) {
		t.Helper()
		if _, err := s.Observe(ctx, sb.ID, store.Observation{State: store.StateRunning, PodUID: pod}); err != nil {
			t.Fatal(err)
		}
	}
	record("u1", receipt.RuntimeGVisor, "4.4.0", false, store.ErrStalePod) // no pod observed yet
	check(seen{})
	observe("u1")
	record("u1", receipt.RuntimeNotGVisor, strings.Repeat("6", 1000), true, nil)
	check(seen{"u1", strings.Repeat("6", receipt.MaxKernelRelease), receipt.RuntimeNotGVisor})
	record("u1", receipt.RuntimeGVisor, "4.4.0", false, nil) // once per pod
	check(seen{"u1", strings.Repeat("6", receipt.MaxKernelRelease), receipt.RuntimeNotGVisor})

	observe("u2")
	record("u1", receipt.RuntimeGVisor, "4.4.0", false, store.ErrStalePod) // a late probe of the pod before
	check(seen{"u1", strings.Repeat("6", receipt.MaxKernelRelease), receipt.RuntimeNotGVisor})
	record("u2", receipt.RuntimeGVisor, "4.19.0-gvisor", true, nil)
	check(seen{"u2", "4.19.0-gvisor", receipt.RuntimeGVisor})
	if _, err := s.RecordRuntime(ctx, sb.ID, "u2", "linux", ""); err == nil {
		t.Fatal("an unknown observation was recorded")
	}
	if _, err := s.RecordRuntime(ctx, "sbx_nosuch", "u1", receipt.RuntimeUnknown, ""); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("record of an unknown sandbox: %v, want not found", err)
	}
}
