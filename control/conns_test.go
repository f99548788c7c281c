package control

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"sync"
	"testing"

	gossh "golang.org/x/crypto/ssh"

	"github.com/hiloop/hiloop/control/controltest"
	"github.com/hiloop/hiloop/store"
)

// liveCaller is a caller with a new API key of the organization.
func liveCaller(t *testing.T, db *store.Store, orgID string) Caller {
	t.Helper()
	k, _, err := db.CreateKey(context.Background(), orgID, "test")
	if err != nil {
		t.Fatal(err)
	}
	return Caller{OrgID: orgID, KeyID: k.ID}
}

// sshCaller is a caller with a new SSH key registered for the organization
// by a live API key of its own.
func sshCaller(t *testing.T, c *Control, orgID string) Caller {
	t.Helper()
	k, err := c.AddSSHKey(context.Background(), liveCaller(t, c.o.Store, orgID), "test", newSSHKey(t))
	if err != nil {
		t.Fatal(err)
	}
	return Caller{OrgID: orgID, KeyID: k.ID}
}

// newSSHKey is a new ed25519 public key.
func newSSHKey(t *testing.T) gossh.PublicKey {
	t.Helper()
	pub, _, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	key, err := gossh.NewPublicKey(pub)
	if err != nil {
		t.Fatal(err)
	}
	return key
}

// hangUps records how each connection was hung up.
type hangUps struct {
	mu    sync.Mutex
	cause map[string]error
	calls int
}

// connect registers a connection named name and records its hang-up.
func (h *hangUps) connect(t *testing.T, c *Control, who Caller, id, name string) *Conn {
	t.Helper()
	k, err := c.Connect(context.Background(), who, id, func(cause error) {
		h.mu.Lock()
		defer h.mu.Unlock()
		if h.cause == nil {
			h.cause = map[string]error{}
		}
		h.cause[name] = cause
		h.calls++
	})
	if err != nil {
		t.Fatalf("connect %s: %v", name, err)
	}
	t.Cleanup(k.Release)
	return k
}

// of is how the named connection was hung up; nil while it was not.
func (h *hangUps) of(name string) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.cause[name]
}

// want fails the test unless each named connection was hung up with its
// cause, or not at all for nil.
func (h *hangUps) want(t *testing.T, causes map[string]error) {
	t.Helper()
	for name, want := range causes {
		if got := h.of(name); !errors.Is(got, want) || (want == nil) != (got == nil) {
			t.Errorf("connection %q hung up with %v, want %v", name, got, want)
		}
	}
}

// TestAdmitAsksTheRecord: a caller that still carries a key id (as an SSH
// connection's permissions and an old session do) is refused once the key
// is deleted or revoked, for a session and for a -L channel alike; so is a
// caller naming no key, a key of no known kind, or another organization's
// key.
func TestAdmitAsksTheRecord(t *testing.T) {
	c, db, org := newControl(t, &controltest.Cluster{})
	ctx := context.Background()
	other, _ := db.CreateOrg(ctx, "other", 10, 10)
	apiKey := liveCaller(t, db, org.ID)
	spare := liveCaller(t, db, org.ID) // so apiKey is not the last key
	sshKey := sshCaller(t, c, org.ID)
	sb := runningSandbox(t, c, db, apiKey)

	for _, who := range []Caller{apiKey, spare, sshKey} {
		s, err := c.Admit(ctx, who, sb.ID, "exec")
		if err != nil {
			t.Fatalf("%s before the revoke: %v", who.KeyID, err)
		}
		s.End()
	}
	if err := db.DeleteSSHKey(ctx, org.ID, sshKey.KeyID); err != nil {
		t.Fatal(err)
	}
	if err := db.RevokeKey(ctx, org.ID, apiKey.KeyID, false); err != nil {
		t.Fatal(err)
	}
	refused := []Caller{
		apiKey, sshKey,
		{},
		{OrgID: org.ID},
		{KeyID: spare.KeyID},
		{OrgID: org.ID, KeyID: "tok_" + spare.KeyID[len("key_"):]},
		{OrgID: org.ID, KeyID: liveCaller(t, db, other.ID).KeyID},
	}
	for _, who := range refused {
		if s, err := c.Admit(ctx, who, sb.ID, "exec"); !errors.Is(err, ErrUnauthenticated) {
			if s != nil {
				s.End()
			}
			t.Errorf("Admit for %+v: %v, want ErrUnauthenticated", who, err)
		}
		if err := c.Reachable(ctx, who, sb.ID, "exec"); !errors.Is(err, ErrUnauthenticated) {
			t.Errorf("Reachable for %+v: %v, want ErrUnauthenticated", who, err)
		}
	}
	if n := c.Sessions(); n != 0 {
		t.Errorf("%d sessions live after the refusals", n)
	}
}

// TestConnectionsClosed: a registered connection is hung up when its SSH
// key is deleted or its API key revoked through the core, when its sandbox
// is stopped or deleted, and at Close, each once and with its cause; it is
// not registered for a key no longer live, nor after Close.
func TestConnectionsClosed(t *testing.T) {
	c, db, org := newControl(t, &controltest.Cluster{})
	ctx := context.Background()
	admin := liveCaller(t, db, org.ID)
	sshKey, apiKey := sshCaller(t, c, org.ID), liveCaller(t, db, org.ID)
	stopped, deleted := runningSandbox(t, c, db, admin), runningSandbox(t, c, db, admin)
	kept := runningSandbox(t, c, db, admin)

	var h hangUps
	h.connect(t, c, sshKey, kept.ID, "ssh key")
	h.connect(t, c, apiKey, kept.ID, "api key")
	h.connect(t, c, admin, stopped.ID, "stopped")
	h.connect(t, c, admin, deleted.ID, "deleted")
	h.connect(t, c, admin, kept.ID, "kept")
	if n := c.Connections(); n != 5 {
		t.Fatalf("%d connections registered, want 5", n)
	}

	if err := c.DeleteSSHKey(ctx, admin, sshKey.KeyID); err != nil {
		t.Fatal(err)
	}
	if err := c.RevokeKey(ctx, admin, apiKey.KeyID); err != nil {
		t.Fatal(err)
	}
	if _, err := c.SetMode(ctx, admin, stopped.ID, store.ModeStopped); err != nil {
		t.Fatal(err)
	}
	if _, err := c.SetMode(ctx, admin, deleted.ID, store.ModeDeleted); err != nil {
		t.Fatal(err)
	}
	h.want(t, map[string]error{"ssh key": ErrKeyRevoked, "api key": ErrKeyRevoked,
		"stopped": ErrSandboxChanged, "deleted": ErrSandboxChanged, "kept": nil})
	if _, err := c.Connect(ctx, sshKey, kept.ID, func(error) { t.Error("a refused connection was hung up") }); !errors.Is(err, ErrUnauthenticated) {
		t.Errorf("Connect with a deleted key: %v, want ErrUnauthenticated", err)
	}

	// The sweep finds the hung-up connections still registered (they close
	// asynchronously) and does not hang them up twice.
	c.sweep(ctx)
	if err := c.Close(ctx); err != nil {
		t.Fatal(err)
	}
	h.want(t, map[string]error{"kept": ErrShuttingDown})
	h.mu.Lock()
	calls := h.calls
	h.mu.Unlock()
	if calls != 5 {
		t.Errorf("%d hang-ups for 5 connections", calls)
	}
	if _, err := c.Connect(ctx, admin, kept.ID, func(error) {}); !errors.Is(err, ErrShuttingDown) {
		t.Errorf("Connect after Close: %v, want ErrShuttingDown", err)
	}
}

// TestSweepClosesConnections: what changed in the record behind the core's
// back (a revoke offline, the mirror's observations) closes connections
// within one sweep: a deleted SSH key, a revoked API key, a quarantined or
// vanished sandbox. A stopped sandbox keeps its connection (only sessions
// end), so a client is told what to do rather than cut off.
func TestSweepClosesConnections(t *testing.T) {
	c, db, org := newControl(t, &controltest.Cluster{})
	ctx := context.Background()
	admin := liveCaller(t, db, org.ID)
	sshKey, apiKey := sshCaller(t, c, org.ID), liveCaller(t, db, org.ID)
	kept, quarantined, stopped := runningSandbox(t, c, db, admin), runningSandbox(t, c, db, admin), runningSandbox(t, c, db, admin)

	var h hangUps
	h.connect(t, c, sshKey, kept.ID, "ssh key")
	h.connect(t, c, apiKey, kept.ID, "api key")
	h.connect(t, c, admin, quarantined.ID, "quarantined")
	h.connect(t, c, admin, stopped.ID, "stopped")
	h.connect(t, c, admin, "sbx_gone", "gone")
	h.connect(t, c, admin, kept.ID, "kept")
	s, err := c.Admit(ctx, admin, stopped.ID, "exec")
	if err != nil {
		t.Fatal(err)
	}
	defer s.End()

	c.sweep(ctx)
	h.want(t, map[string]error{"gone": ErrSandboxChanged})
	if err := db.DeleteSSHKey(ctx, org.ID, sshKey.KeyID); err != nil {
		t.Fatal(err)
	}
	if err := db.RevokeKey(ctx, org.ID, apiKey.KeyID, false); err != nil {
		t.Fatal(err)
	}
	db.Observe(ctx, quarantined.ID, store.Observation{State: store.StateQuarantined, Anomaly: "host_namespaces"})
	db.Observe(ctx, stopped.ID, store.Observation{State: store.StateExited})
	c.sweep(ctx)
	h.want(t, map[string]error{"ssh key": ErrKeyRevoked, "api key": ErrKeyRevoked,
		"quarantined": ErrSandboxChanged, "stopped": nil, "kept": nil})
	if !errors.Is(context.Cause(s.Context()), ErrSandboxChanged) {
		t.Errorf("the session in the sandbox that exited: %v", context.Cause(s.Context()))
	}
}
