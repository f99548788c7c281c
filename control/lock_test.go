package control

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/hiloop/hiloop/control/controltest"
	"github.com/hiloop/hiloop/store"
)

// TestOrgCheckBeforeLock: while the owner's mutation holds a sandbox's
// lock, another organization's caller with the sandbox's id (and a caller
// of no organization) is refused at once as for an id that does not exist,
// by every locked operation: it does not wait behind the owner, and takes
// no lock entry. It changes nothing, and the owner's call proceeds after.
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
				if !errors.Is(err, store.ErrNotFound) {
					t.Errorf("%s by org %q: %v, want not found", name, who.OrgID, err)
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
