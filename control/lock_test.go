package control

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/hiloop/hiloop/control/controltest"
	"github.com/hiloop/hiloop/store"
)

// TestOrgCheckBeforeLock: while the owner's mutation holds a sandbox's
// lock, another organization's caller with the sandbox's id is refused at
// once as for an id that does not exist (and a caller of no organization
// as unauthenticated), by every locked operation: it does not wait behind
// the owner, and takes no lock entry. It changes nothing, and the owner's call proceeds after.
func TestOrgCheckBeforeLock(t *testing.T) {
	fc := &controltest.Cluster{}
	c, db, org := newControl(t, fc)
	ctx := context.Background()
	owner := liveCaller(t, db, org.ID)
	sb, _, err := c.Create(ctx, owner, CreateRequest{Spec: store.Spec{Image: "busybox"}})
	if err != nil {
		t.Fatal(err)
	}
	other, err := db.CreateOrg(ctx, "other", 10, 10)
	if err != nil {
		t.Fatal(err)
	}
	before, err := db.Sandbox(ctx, org.ID, sb.ID)
	if err != nil {
		t.Fatal(err)
	}

	// The owner's mutation, in flight.
	unlock := c.locks.lock(sb.ID)
	ops := map[string]func(Caller) error{
		"stop": func(who Caller) error { _, err := c.SetMode(ctx, who, sb.ID, store.ModeStopped); return err },
		"start": func(who Caller) error {
			_, err := c.SetMode(ctx, who, sb.ID, store.ModeRunning)
			return err
		},
		"delete": func(who Caller) error { _, err := c.SetMode(ctx, who, sb.ID, store.ModeDeleted); return err },
		"update": func(who Caller) error {
			ttl := time.Hour
			_, err := c.Update(ctx, who, sb.ID, Update{TTL: &ttl})
			return err
		},
	}
	for name, op := range ops {
		for _, who := range []Caller{liveCaller(t, db, other.ID), {}} {
			done := make(chan error, 1)
			go func() { done <- op(who) }()
			select {
			case err := <-done:
				// Another organization's live key finds nothing; a caller
				// without an organization or key is refused before any read.
				want := store.ErrNotFound
				if who.OrgID == "" {
					want = ErrUnauthenticated
				}
				if !errors.Is(err, want) {
					t.Errorf("%s by org %q: %v, want %v", name, who.OrgID, err, want)
				}
			case <-time.After(10 * time.Second):
				// Released, so the waiter ends; the test has failed.
				unlock()
				<-done
				t.Fatalf("%s by org %q waited behind the owner's lock", name, who.OrgID)
			}
			if n := c.locks.size(); n != 1 {
				t.Fatalf("%s by org %q left %d lock entries, want the owner's only", name, who.OrgID, n)
			}
		}
	}
	unlock()
	after, err := db.Sandbox(ctx, org.ID, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	if after.DesiredMode != before.DesiredMode || after.ExpiresAt != nil || !after.UpdatedAt.Equal(before.UpdatedAt) {
		t.Fatalf("refused calls changed the record: %+v, was %+v", after, before)
	}
	if _, err := c.SetMode(ctx, owner, sb.ID, store.ModeStopped); err != nil {
		t.Fatalf("the owner's stop: %v", err)
	}
}

// TestChangesCheckTheKey: every change checks the caller's key in the
// core, not only where the request came in: after a revoke, a stop, start,
// delete, lifetime change, touch, create, API key create or revoke, SSH key
// add or delete, and a wait, are each refused, and nothing changed.
func TestChangesCheckTheKey(t *testing.T) {
	c, db, org := newControl(t, &controltest.Cluster{})
	ctx := context.Background()
	who := liveCaller(t, db, org.ID)
	admin := liveCaller(t, db, org.ID) // the organization keeps a live key
	sb, _, err := c.Create(ctx, who, CreateRequest{Spec: store.Spec{Image: "busybox"}})
	if err != nil {
		t.Fatal(err)
	}
	sshKey := sshCaller(t, c, org.ID)
	if err := db.RevokeKey(ctx, org.ID, who.KeyID, false); err != nil {
		t.Fatal(err)
	}
	keysBefore, sshBefore := keyIDs(t, c, admin)
	ttl := time.Hour
	for name, op := range map[string]func() error{
		"stop":   func() error { _, err := c.SetMode(ctx, who, sb.ID, store.ModeStopped); return err },
		"start":  func() error { _, err := c.SetMode(ctx, who, sb.ID, store.ModeRunning); return err },
		"delete": func() error { _, err := c.SetMode(ctx, who, sb.ID, store.ModeDeleted); return err },
		"update": func() error { _, err := c.Update(ctx, who, sb.ID, Update{TTL: &ttl}); return err },
		"touch":  func() error { _, err := c.Touch(ctx, who, sb.ID); return err },
		"create": func() error {
			_, _, err := c.Create(ctx, who, CreateRequest{Spec: store.Spec{Image: "busybox"}})
			return err
		},
		"key create": func() error { _, _, err := c.CreateKey(ctx, who, "more"); return err },
		"key revoke": func() error { return c.RevokeKey(ctx, who, admin.KeyID) },
		"ssh-key add": func() error {
			_, err := c.AddSSHKey(ctx, who, "more", newSSHKey(t))
			return err
		},
		"ssh-key delete": func() error { return c.DeleteSSHKey(ctx, who, sshKey.KeyID) },
		"wait": func() error {
			_, err := c.WaitWhile(ctx, who, sb.ID, "not a state", time.Minute)
			return err
		},
	} {
		if err := op(); !errors.Is(err, ErrUnauthenticated) {
			t.Errorf("%s with a revoked key: %v, want %v", name, err, ErrUnauthenticated)
		}
	}
	after, err := db.Sandbox(ctx, org.ID, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	if after.DesiredMode != sb.DesiredMode || after.ExpiresAt != nil || !after.LastActivityAt.Equal(sb.LastActivityAt) {
		t.Errorf("after refused changes: desired %s, expires %v, last activity %v", after.DesiredMode, after.ExpiresAt, after.LastActivityAt)
	}
	if all, _, err := c.Sandboxes(ctx, admin, store.ListOptions{}); err != nil || len(all) != 1 {
		t.Errorf("after a refused create: %d sandboxes (%v), want 1", len(all), err)
	}
	keysAfter, sshAfter := keyIDs(t, c, admin)
	if diff := cmp.Diff(keysBefore, keysAfter); diff != "" {
		t.Errorf("API keys after refused changes (-before +after):\n%s", diff)
	}
	if diff := cmp.Diff(sshBefore, sshAfter); diff != "" {
		t.Errorf("SSH keys after refused changes (-before +after):\n%s", diff)
	}
}

// keyIDs are the ids of the organization's live API keys and of its SSH
// keys, as who reads them.
func keyIDs(t *testing.T, c *Control, who Caller) (api, ssh []string) {
	t.Helper()
	keys, err := c.Keys(context.Background(), who)
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range keys {
		if k.RevokedAt == nil {
			api = append(api, k.ID)
		}
	}
	sshKeys, err := c.SSHKeys(context.Background(), who)
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range sshKeys {
		ssh = append(ssh, k.ID)
	}
	return api, ssh
}
