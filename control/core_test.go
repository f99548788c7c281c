package control

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"io"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hiloop/hiloop/cluster"
	"github.com/hiloop/hiloop/control/controltest"
	"github.com/hiloop/hiloop/receipt"
	"github.com/hiloop/hiloop/store"
	gossh "golang.org/x/crypto/ssh"
)

// runningSandbox creates a sandbox through the core and records it running.
func runningSandbox(t *testing.T, c *Control, db *store.Store, who Caller) store.Sandbox {
	t.Helper()
	ctx := context.Background()
	sb, _, err := c.Create(ctx, who, CreateRequest{Spec: store.Spec{Image: "busybox"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.Observe(ctx, sb.ID, store.Observation{State: store.StateRunning}); err != nil {
		t.Fatal(err)
	}
	return sb
}

// TestExecOutcome: how an exec ended is classified once, in the core, for
// every way in.
func TestExecOutcome(t *testing.T) {
	broken := errors.New("websocket: close 1006 (abnormal closure): pod-7f node-3")
	for _, tc := range []struct {
		name string
		run  func(ctx context.Context, req cluster.ExecRequest) (cluster.ExitStatus, error)
		// timeout bounds the caller's context; left cancels it first; end
		// ends the session from outside first; hang never opens the
		// stream (against a hung API server).
		timeout time.Duration
		left    bool
		end     error
		hang    bool
		want    func(cluster.ExitStatus, error) bool
	}{
		{name: "exited", run: func(context.Context, cluster.ExecRequest) (cluster.ExitStatus, error) {
			return cluster.ExitStatus{Code: 3}, nil
		}, want: func(st cluster.ExitStatus, err error) bool { return err == nil && st.Code == 3 }},
		{name: "stream broke", run: func(context.Context, cluster.ExecRequest) (cluster.ExitStatus, error) {
			return cluster.ExitStatus{}, broken
		}, want: func(_ cluster.ExitStatus, err error) bool {
			var se *StreamError
			return errors.As(err, &se) && errors.Is(err, ErrStreamBroken) && errors.Is(err, broken)
		}},
		{name: "never connected", run: func(context.Context, cluster.ExecRequest) (cluster.ExitStatus, error) {
			return cluster.ExitStatus{}, &cluster.ConnectError{Err: broken}
		}, want: func(_ cluster.ExitStatus, err error) bool {
			var ce *ClusterError
			return errors.As(err, &ce) && errors.Is(err, ErrClusterUnavailable)
		}},
		{name: "timed out", timeout: time.Millisecond,
			want: func(_ cluster.ExitStatus, err error) bool { return errors.Is(err, ErrExecTimeout) }},
		// The caller's timeout passed while the stream was being opened:
		// no command ran, so none timed out.
		{name: "timeout before the stream opened", timeout: time.Millisecond, hang: true,
			want: func(_ cluster.ExitStatus, err error) bool {
				var ce *ClusterError
				return errors.As(err, &ce) && errors.Is(err, ErrClusterUnavailable) && !errors.Is(err, ErrExecTimeout)
			}},
		{name: "caller left before the stream opened", left: true, hang: true,
			want: func(_ cluster.ExitStatus, err error) bool { return errors.Is(err, ErrCallerGone) }},
		{name: "caller left", left: true,
			want: func(_ cluster.ExitStatus, err error) bool { return errors.Is(err, ErrCallerGone) }},
		{name: "key revoked", end: ErrKeyRevoked, want: func(_ cluster.ExitStatus, err error) bool {
			var ee *EndedError
			return errors.As(err, &ee) && errors.Is(err, ErrKeyRevoked) && strings.Contains(err.Error(), "revoked")
		}},
		{name: "revoked beats a failed connect", end: ErrKeyRevoked, run: func(context.Context, cluster.ExecRequest) (cluster.ExitStatus, error) {
			return cluster.ExitStatus{}, &cluster.ConnectError{Err: broken}
		}, want: func(_ cluster.ExitStatus, err error) bool { return errors.Is(err, ErrKeyRevoked) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			db, err := store.Open(context.Background(), store.Options{Path: filepath.Join(t.TempDir(), "c.db")})
			if err != nil {
				t.Fatal(err)
			}
			defer db.Close()
			c, err := New(Options{Store: db, Cluster: &controltest.Cluster{}, Exec: controltest.Exec{Run: tc.run, Hang: tc.hang},
				Log:  slog.New(slog.NewTextHandler(io.Discard, nil)),
				Caps: Capabilities{Transports: []receipt.Transport{receipt.TransportExec}}})
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close(context.Background())
			org, _ := db.CreateOrg(context.Background(), "o", 10, 10)
			who := liveCaller(t, db, org.ID)
			sb := runningSandbox(t, c, db, who)
			sess, err := c.Admit(context.Background(), who, sb.ID, receipt.TransportExec)
			if err != nil {
				t.Fatal(err)
			}
			defer sess.End()
			ctx, cancel := context.WithCancel(sess.Context())
			if tc.timeout > 0 {
				ctx, cancel = context.WithTimeout(sess.Context(), tc.timeout)
			}
			defer cancel()
			if tc.left {
				cancel()
			}
			if tc.end != nil {
				c.end(tc.end, func(string, string) bool { return true })
			}
			st, err := sess.Exec(ctx, cluster.ExecRequest{Command: []string{"true"}})
			if !tc.want(st, err) {
				t.Errorf("Exec = %+v, %v (%T)", st, err, err)
			}
			if got := sess.Ended(); (got != nil) != (tc.end != nil) || (tc.end != nil && !errors.Is(got, tc.end)) {
				t.Errorf("Ended() = %v, want %v", got, tc.end)
			}
		})
	}
}

// TestCreateExpiryByCoreClock: a create's expiry is the core's clock plus
// the TTL, not the caller's.
func TestCreateExpiryByCoreClock(t *testing.T) {
	db, err := store.Open(context.Background(), store.Options{Path: filepath.Join(t.TempDir(), "c.db")})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	now := time.Date(2030, 1, 2, 3, 4, 5, 600, time.UTC)
	c, err := New(Options{Store: db, Cluster: &controltest.Cluster{}, Now: func() time.Time { return now },
		Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(context.Background())
	org, _ := db.CreateOrg(context.Background(), "o", 10, 10)
	who := liveCaller(t, db, org.ID)
	sb, _, err := c.Create(context.Background(), who,
		CreateRequest{Spec: store.Spec{Image: "busybox", TTLSeconds: 7200}})
	if err != nil {
		t.Fatal(err)
	}
	want := time.Date(2030, 1, 2, 5, 4, 5, 0, time.UTC)
	if sb.ExpiresAt == nil || !sb.ExpiresAt.Equal(want) {
		t.Errorf("expires at %v, want %v", sb.ExpiresAt, want)
	}
	plain, _, err := c.Create(context.Background(), who, CreateRequest{Spec: store.Spec{Image: "busybox"}})
	if err != nil || plain.ExpiresAt != nil {
		t.Errorf("a create without a TTL expires at %v (%v)", plain.ExpiresAt, err)
	}
}

// TestHelperKeyOnlyForHelpers: the core hands the cluster writer the key
// derived for the sandbox from the gateway's current key for a sandbox
// with a session helper, and none for any other.
func TestHelperKeyOnlyForHelpers(t *testing.T) {
	c, db, _ := newControl(t, &controltest.Cluster{})
	ctx := context.Background()
	plain := store.Sandbox{Receipt: receipt.Receipt{Version: 1, RuntimeClass: "gvisor", Transports: []receipt.Transport{receipt.TransportExec}}.Encode()}
	if key, err := c.helperKey(ctx, plain); err != nil || key != "" {
		t.Errorf("a sandbox without a helper got key %q (%v)", key, err)
	}
	helped := store.Sandbox{ID: "sbx_h", Receipt: receipt.Receipt{Version: 1, RuntimeClass: "gvisor", SessionPort: 2223,
		Transports: []receipt.Transport{receipt.TransportForward}}.Encode()}
	key, err := c.helperKey(ctx, helped)
	if err != nil {
		t.Fatal(err)
	}
	signers, err := c.GatewayKeys(ctx, &Session{SandboxID: helped.ID})
	if err != nil {
		t.Fatal(err)
	}
	pub, err := gossh.NewPublicKey(signers[0].Public())
	if err != nil {
		t.Fatal(err)
	}
	if want := strings.TrimSpace(string(gossh.MarshalAuthorizedKey(pub))); key != want {
		t.Errorf("helper key %q, want the sandbox's key from the gateway's current one %q", key, want)
	}
	if _, err := db.RotateGatewayKey(ctx); err != nil {
		t.Fatal(err)
	}
	if again, _ := c.helperKey(ctx, helped); again == key {
		t.Error("after a rotation the helper key is still the old one")
	}
}

// TestCreateKeyThroughCore: API keys are made by the core, for the caller's
// organization, and authenticate.
func TestCreateKeyThroughCore(t *testing.T) {
	c, db, org := newControl(t, &controltest.Cluster{})
	ctx := context.Background()
	k, secret, err := c.CreateKey(ctx, liveCaller(t, db, org.ID), "ci")
	if err != nil {
		t.Fatal(err)
	}
	got, err := db.Authenticate(ctx, secret)
	if err != nil || got.ID != k.ID || got.OrgID != org.ID {
		t.Errorf("the new key authenticates as %+v (%v), want %s of %s", got, err, k.ID, org.ID)
	}
	if _, _, err := c.CreateKey(ctx, Caller{}, "nobody"); err == nil {
		t.Error("a key was made for an empty organization")
	}
	if _, _, err := c.CreateKey(ctx, Caller{OrgID: org.ID, KeyID: "key_unknown"}, "stranger"); !errors.Is(err, ErrUnauthenticated) {
		t.Errorf("a key made by a key the record does not know: %v, want ErrUnauthenticated", err)
	}
}

// TestSSHAuthenticationPerOrganization: organization B registers organization A's
// public key. A keeps registering and using it; the registration that
// authorizes a login is the one of the organization that owns the sandbox
// named as the SSH user, so the key acts as B's key only on B's sandboxes
// and as A's only on A's, and deleting one organization's registration
// leaves the other's alone.
func TestSSHAuthenticationPerOrganization(t *testing.T) {
	c, db, orgA := newControl(t, &controltest.Cluster{})
	ctx := context.Background()
	orgB, err := db.CreateOrg(ctx, "b", 100, 100)
	if err != nil {
		t.Fatal(err)
	}
	whoA, whoB := liveCaller(t, db, orgA.ID), liveCaller(t, db, orgB.ID)
	sbA, sbB := runningSandbox(t, c, db, whoA), runningSandbox(t, c, db, whoB)
	pub, _, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	key, err := gossh.NewPublicKey(pub)
	if err != nil {
		t.Fatal(err)
	}

	// B registers A's key first: A may still register it.
	kB, err := c.AddSSHKey(ctx, whoB, "taken from a profile", key)
	if err != nil {
		t.Fatal(err)
	}
	kA, err := c.AddSSHKey(ctx, whoA, "laptop", key)
	if err != nil {
		t.Fatalf("A registering its own key after B did: %v", err)
	}
	if _, err := c.AddSSHKey(ctx, whoB, "again", key); !errors.Is(err, store.ErrKeyRegistered) {
		t.Errorf("B registering the key twice: %v, want ErrKeyRegistered", err)
	}

	check := func(when, sandbox string, want Caller, wantOK bool) {
		t.Helper()
		got, err := c.Authenticate(ctx, Credential{SSHKey: key, Sandbox: sandbox})
		if ok := err == nil; ok != wantOK || got != want || (!ok && !errors.Is(err, ErrUnauthenticated)) {
			t.Errorf("%s: Authenticate(%s) = %+v, %v; want %+v, ok %v", when, sandbox, got, err, want, wantOK)
		}
	}
	check("both registered", sbA.ID, Caller{OrgID: orgA.ID, KeyID: kA.ID}, true)
	check("both registered", sbB.ID, Caller{OrgID: orgB.ID, KeyID: kB.ID}, true)
	check("both registered", "sbx_absent", Caller{}, false)
	check("both registered", "", Caller{}, false)

	if err := c.DeleteSSHKey(ctx, whoB, kB.ID); err != nil {
		t.Fatal(err)
	}
	check("B deleted its registration", sbA.ID, Caller{OrgID: orgA.ID, KeyID: kA.ID}, true)
	check("B deleted its registration", sbB.ID, Caller{}, false)

	// B cannot delete A's registration, by id or otherwise.
	if err := c.DeleteSSHKey(ctx, whoB, kA.ID); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("B deleting A's registration: %v, want not found", err)
	}
	if err := c.DeleteSSHKey(ctx, whoA, kA.ID); err != nil {
		t.Fatal(err)
	}
	check("A deleted its registration", sbA.ID, Caller{}, false)
	if got, err := c.Authenticate(ctx, Credential{Sandbox: sbA.ID}); !errors.Is(err, ErrUnauthenticated) {
		t.Errorf("no key: %+v, %v", got, err)
	}
}

// TestKeyLimitsThroughCore: the core bounds the API and SSH keys an
// organization makes (DefaultKeysPerOrg each unless set), refusing one more
// with a *store.KeyLimitError, per organization; a negative limit is a
// configuration error.
func TestKeyLimitsThroughCore(t *testing.T) {
	c, db, org := newControl(t, &controltest.Cluster{})
	ctx := context.Background()
	if c.o.Limits.APIKeysPerOrg != DefaultKeysPerOrg || c.o.Limits.SSHKeysPerOrg != DefaultKeysPerOrg {
		t.Errorf("default limits %+v, want %d keys of each kind", c.o.Limits, DefaultKeysPerOrg)
	}
	c.o.Limits.APIKeysPerOrg, c.o.Limits.SSHKeysPerOrg = 2, 1
	other, err := db.CreateOrg(ctx, "other", 1, 1)
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range []store.Org{org, other} {
		// The caller's own key is the first of the two.
		who := liveCaller(t, db, o.ID)
		for i := range 2 {
			_, _, err := c.CreateKey(ctx, who, "k")
			if refused := errors.Is(err, store.ErrKeyLimit); refused != (i == 1) {
				t.Errorf("%s: API key %d: %v", o.Name, i+2, err)
			}
		}
		for i := range 2 {
			pub, _, err := ed25519.GenerateKey(rand.Reader)
			if err != nil {
				t.Fatal(err)
			}
			key, err := gossh.NewPublicKey(pub)
			if err != nil {
				t.Fatal(err)
			}
			_, err = c.AddSSHKey(ctx, who, "k", key)
			if refused := errors.Is(err, store.ErrKeyLimit); refused != (i == 1) {
				t.Errorf("%s: SSH key %d: %v", o.Name, i+1, err)
			}
		}
	}
	if _, err := New(Options{Store: db, Cluster: &controltest.Cluster{}, Limits: Limits{APIKeysPerOrg: -1}}); err == nil {
		t.Error("a negative key limit was accepted")
	}
}
