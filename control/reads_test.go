package control

import (
	"context"
	"errors"
	"testing"

	"github.com/hiloop/hiloop/control/controltest"
	"github.com/hiloop/hiloop/store"
)

// TestReadsScopedToTheCaller: every read through the core answers the
// caller's own organization only, both ways: A sees none of B's sandboxes,
// events, keys or organization, and B none of A's; another organization's
// sandbox is not found, as an absent one is. A caller without an
// organization or a key reads nothing (fail closed), even with a real id.
func TestReadsScopedToTheCaller(t *testing.T) {
	c, db, orgA := newControl(t, &controltest.Cluster{})
	ctx := context.Background()
	orgB, err := db.CreateOrg(ctx, "b", 100, 100)
	if err != nil {
		t.Fatal(err)
	}
	whoA, whoB := liveCaller(t, db, orgA.ID), liveCaller(t, db, orgB.ID)
	sbA, sbB := runningSandbox(t, c, db, whoA), runningSandbox(t, c, db, whoB)
	for _, tc := range []struct {
		who        Caller
		own, other store.Sandbox
	}{{whoA, sbA, sbB}, {whoB, sbB, sbA}} {
		if got, err := c.Sandbox(ctx, tc.who, tc.own.ID); err != nil || got.ID != tc.own.ID {
			t.Errorf("%s reads its own sandbox: %v", tc.who.OrgID, err)
		}
		if _, err := c.Sandbox(ctx, tc.who, tc.other.ID); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("%s reads the other's sandbox: %v, want not found", tc.who.OrgID, err)
		}
		if _, err := c.Events(ctx, tc.who, tc.other.ID); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("%s reads the other's events: %v, want not found", tc.who.OrgID, err)
		}
		// A list naming the other organization still lists the caller's.
		list, _, err := c.Sandboxes(ctx, tc.who, store.ListOptions{OrgID: tc.other.OrgID, Limit: 10})
		if err != nil || len(list) != 1 || list[0].ID != tc.own.ID {
			t.Errorf("%s lists %v (%v), want only its own %s", tc.who.OrgID, list, err, tc.own.ID)
		}
		keys, err := c.Keys(ctx, tc.who)
		if err != nil || len(keys) != 1 || keys[0].ID != tc.who.KeyID {
			t.Errorf("%s lists keys %v (%v), want only its own", tc.who.OrgID, keys, err)
		}
		if org, err := c.Org(ctx, tc.who); err != nil || org.ID != tc.who.OrgID {
			t.Errorf("%s reads organization %q (%v)", tc.who.OrgID, org.ID, err)
		}
	}
	for _, who := range []Caller{{}, {KeyID: whoA.KeyID}, {OrgID: orgA.ID}} {
		reads := map[string]error{}
		_, reads["sandbox"] = c.Sandbox(ctx, who, sbA.ID)
		_, _, reads["sandboxes"] = c.Sandboxes(ctx, who, store.ListOptions{OrgID: orgA.ID, Limit: 10})
		_, reads["events"] = c.Events(ctx, who, sbA.ID)
		_, reads["org"] = c.Org(ctx, who)
		_, reads["keys"] = c.Keys(ctx, who)
		_, reads["ssh keys"] = c.SSHKeys(ctx, who)
		for read, err := range reads {
			if !errors.Is(err, ErrUnauthenticated) {
				t.Errorf("%s by %+v: %v, want unauthenticated", read, who, err)
			}
		}
	}
}

// TestAuthenticateAPIKey: an API key's secret authenticates as its key and
// organization until it is revoked; a made-up secret, an empty one and a
// credential of two kinds at once authenticate nobody.
func TestAuthenticateAPIKey(t *testing.T) {
	c, db, org := newControl(t, &controltest.Cluster{})
	ctx := context.Background()
	keep, _, err := db.CreateKey(ctx, org.ID, "keep")
	if err != nil {
		t.Fatal(err)
	}
	k, secret, err := db.CreateKey(ctx, org.ID, "k")
	if err != nil {
		t.Fatal(err)
	}
	if who, err := c.Authenticate(ctx, Credential{Secret: secret}); err != nil || who != (Caller{OrgID: org.ID, KeyID: k.ID}) {
		t.Fatalf("Authenticate = %+v, %v", who, err)
	}
	for name, cred := range map[string]Credential{
		"made up": {Secret: "hl_" + secret[3:len(secret)-1] + "x"},
		"empty":   {},
		"mixed":   {Secret: secret, Sandbox: "sbx_x"},
	} {
		if who, err := c.Authenticate(ctx, cred); !errors.Is(err, ErrUnauthenticated) {
			t.Errorf("%s: %+v, %v; want unauthenticated", name, who, err)
		}
	}
	if err := c.RevokeKey(ctx, Caller{OrgID: org.ID, KeyID: keep.ID}, k.ID); err != nil {
		t.Fatal(err)
	}
	if who, err := c.Authenticate(ctx, Credential{Secret: secret}); !errors.Is(err, ErrUnauthenticated) {
		t.Errorf("revoked: %+v, %v; want unauthenticated", who, err)
	}
}
