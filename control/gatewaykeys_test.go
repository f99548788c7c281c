package control

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"net"
	"strconv"
	"testing"
	"time"

	gossh "golang.org/x/crypto/ssh"

	"github.com/hiloop/hiloop/control/controltest"
	"github.com/hiloop/hiloop/receipt"
	"github.com/hiloop/hiloop/store"
)

// TestHelperLoginKeyPerSandbox: each sandbox gets its own login key from
// the gateway key, the same one every time, never the gateway key itself;
// after a rotation the gateway logs in with the sandbox's key from the new
// gateway key first and from the one it replaced second.
func TestHelperLoginKeyPerSandbox(t *testing.T) {
	_, root, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	_, other, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	fp := func(k ed25519.PrivateKey, id string) string {
		t.Helper()
		s, err := HelperLoginKey(k, id)
		if err != nil {
			t.Fatal(err)
		}
		return fingerprint(t, s)
	}
	rootPub, _ := gossh.NewPublicKey(root.Public())
	a, b := fp(root, "sbx_a"), fp(root, "sbx_b")
	switch {
	case a != fp(root, "sbx_a"):
		t.Error("the same sandbox got two keys")
	case a == b:
		t.Error("two sandboxes share a key")
	case a == fp(other, "sbx_a"):
		t.Error("two gateway keys made one sandbox key")
	case a == gossh.FingerprintSHA256(rootPub):
		t.Error("the sandbox key is the gateway key")
	}
	if _, err := HelperLoginKey(root, ""); err == nil {
		t.Error("a key was made for no sandbox")
	}
	if _, err := HelperLoginKey(nil, "sbx_a"); err == nil {
		t.Error("a key was made from no gateway key")
	}

	c, db, _ := newControl(t, &controltest.Cluster{})
	ctx := context.Background()
	s := &Session{SandboxID: "sbx_a"}
	keys := func() []string {
		t.Helper()
		signers, err := c.GatewayKeys(ctx, s)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, k := range signers {
			out = append(out, fingerprint(t, k))
		}
		return out
	}
	before := keys()
	cur, err := db.PrivateKey(ctx, store.KeyGateway)
	if err != nil {
		t.Fatal(err)
	}
	if len(before) != 1 || before[0] != fp(cur, "sbx_a") {
		t.Fatalf("before a rotation the gateway logs in with %v, want the sandbox's key from the gateway key", before)
	}
	rotated, err := db.RotateGatewayKey(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if after := keys(); len(after) != 2 || after[0] != fp(rotated, "sbx_a") || after[1] != before[0] {
		t.Errorf("after a rotation the gateway logs in with %v, want the new sandbox key then %s", after, before[0])
	}
}

// TestHelperAddrOnlyObservedPod: the helper's address is the pod's only
// when it is the pod the record observed (the cluster checks the rest);
// a record that observed no pod, or another pod, gets ErrPodNotServing and
// no address.
func TestHelperAddrOnlyObservedPod(t *testing.T) {
	fc := &controltest.Cluster{SessionPort: 2299}
	c, db, org := newControl(t, fc)
	c.o.Caps.Transports = receipt.Transports()
	ctx := context.Background()
	sb, _, err := c.Create(ctx, liveCaller(t, db, org.ID), CreateRequest{Spec: store.Spec{Image: "busybox",
		Transports: []receipt.Transport{receipt.TransportForward}}})
	if err != nil {
		t.Fatal(err)
	}
	s := &Session{SandboxID: sb.ID}
	for _, tc := range []struct {
		name, podUID, addr string
	}{
		{"no pod observed", "", ""},
		{"another pod observed", "uid-of-a-dead-pod", ""},
		{"the observed pod", controltest.PodUID(sb.ID), net.JoinHostPort("127.0.0.1", strconv.Itoa(2299))},
	} {
		if _, err := db.Observe(ctx, sb.ID, store.Observation{State: store.StateRunning, PodUID: tc.podUID}); err != nil {
			t.Fatal(err)
		}
		addr, uid, err := c.HelperAddr(ctx, s)
		if tc.addr == "" {
			if !errors.Is(err, ErrPodNotServing) || addr != "" {
				t.Errorf("%s: %q, %v; want ErrPodNotServing", tc.name, addr, err)
			}
			continue
		}
		if err != nil || addr != tc.addr || uid != tc.podUID {
			t.Errorf("%s: %q in pod %q (%v), want %q in pod %q", tc.name, addr, uid, err, tc.addr, tc.podUID)
		}
	}
}

// fingerprint is the SSH fingerprint of k's public key.
func fingerprint(t *testing.T, k ed25519.PrivateKey) string {
	t.Helper()
	pub, err := gossh.NewPublicKey(k.Public())
	if err != nil {
		t.Fatal(err)
	}
	return gossh.FingerprintSHA256(pub)
}

// keyWriter records the keys a rotation hands each sandbox.
type keyWriter struct {
	ids  []string
	got  map[string]string
	err  error
	call time.Duration
}

func (w *keyWriter) RotateGatewayKey(_ context.Context, callTimeout time.Duration, key func(id string) (string, error)) (int, error) {
	w.call, w.got = callTimeout, map[string]string{}
	for _, id := range w.ids {
		line, err := key(id)
		if err != nil {
			return len(w.got), err
		}
		w.got[id] = line
	}
	return len(w.got), w.err
}

// TestRotateGatewayKey: a rotation records a new gateway key, hands each
// sandbox the login key derived for it from the new key (never the gateway
// key itself), and bounds each cluster call by the timeout it was given.
// A cluster failure still answers the new key, so the caller can say the
// rotation is recorded and must be finished.
func TestRotateGatewayKey(t *testing.T) {
	_, db, _ := newControl(t, &controltest.Cluster{})
	ctx := context.Background()
	w := &keyWriter{ids: []string{"sbx_a", "sbx_b"}}
	pub, n, err := RotateGatewayKey(ctx, db, w, 7*time.Second)
	if err != nil || n != 2 || w.call != 7*time.Second {
		t.Fatalf("rotation: %d, %v, timeout %s", n, err, w.call)
	}
	cur, err := db.PrivateKey(ctx, store.KeyGateway)
	if err != nil {
		t.Fatal(err)
	}
	if got := gossh.FingerprintSHA256(pub); got != fingerprint(t, cur) {
		t.Errorf("answered key %s, recorded %s", got, fingerprint(t, cur))
	}
	for _, id := range w.ids {
		want, err := HelperAuthorizedKey(cur, id)
		if err != nil {
			t.Fatal(err)
		}
		if w.got[id] != want {
			t.Errorf("%s handed %q, want its own derived key %q", id, w.got[id], want)
		}
	}
	if w.got["sbx_a"] == w.got["sbx_b"] {
		t.Error("two sandboxes were handed the same key")
	}
	w.err = errors.New("cluster away")
	if pub, _, err := RotateGatewayKey(ctx, db, w, time.Second); err == nil || pub == nil {
		t.Errorf("a rotation the cluster cut short: %v, %v; want the error and the new key", pub, err)
	}
}
