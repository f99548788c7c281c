package sshd_test

import (
	"context"
	"errors"
	"io"
	"strings"
	"sync/atomic"
	"testing"

	gossh "golang.org/x/crypto/ssh"

	"github.com/hiloop/hiloop/control"
	"github.com/hiloop/hiloop/receipt"
)

// TestKeysRefused: only a key registered to the organization that has the
// sandbox logs in. Another organization's key is refused for the sandbox
// exactly as for an id that does not exist, so a key cannot tell which ids
// are taken. A client with no key at all is refused (the trap of a
// gliderlabs server left with NoClientAuth on), and password and
// keyboard-interactive get nowhere (the gateway does not offer them).
func TestKeysRefused(t *testing.T) {
	g := start(t, setup{})
	orgA, orgB := g.org("a"), g.org("b")
	id := g.sandbox(orgA, receipt.TransportSSH)
	keyA, _ := g.key(orgA)
	keyB, _ := g.key(orgB)
	stranger := newSigner(t)

	if _, err := g.dial(id, gossh.PublicKeys(keyA)); err != nil {
		t.Fatalf("the organization's own key: %v", err)
	}
	refused := map[string]error{}
	for _, tc := range []struct {
		name, user string
		auth       []gossh.AuthMethod
	}{
		{"unregistered key", id, []gossh.AuthMethod{gossh.PublicKeys(stranger)}},
		{"another organization's key", id, []gossh.AuthMethod{gossh.PublicKeys(keyB)}},
		{"absent sandbox", "sbx_doesnotexist0000", []gossh.AuthMethod{gossh.PublicKeys(keyB)}},
		{"no key", id, nil},
		{"password", id, []gossh.AuthMethod{gossh.Password("x")}},
		{"keyboard-interactive", id, []gossh.AuthMethod{gossh.KeyboardInteractive(
			func(string, string, []string, []bool) ([]string, error) { return nil, nil })}},
	} {
		_, err := g.dial(tc.user, tc.auth...)
		if err == nil || !strings.Contains(err.Error(), "unable to authenticate") {
			t.Errorf("%s: %v, want refused at authentication", tc.name, err)
		}
		refused[tc.name] = err
	}
	if a, b := refused["another organization's key"], refused["absent sandbox"]; a == nil || b == nil || a.Error() != b.Error() {
		t.Errorf("another organization's sandbox (%v) and an absent one (%v) are told apart", a, b)
	}
}

// offered shows a public key whose private half it does not hold, as ssh
// does with only a .pub file: it fails to sign. A client only signs after
// the server answered a query that the key would do, so asked reports
// whether the gateway accepted the key at query time.
type offered struct {
	pub   gossh.PublicKey
	asked atomic.Bool
}

func (o *offered) PublicKey() gossh.PublicKey { return o.pub }

func (o *offered) Sign(io.Reader, []byte) (*gossh.Signature, error) {
	o.asked.Store(true)
	return nil, errors.New("no private key")
}

// inTurn authenticates with each method in turn, once: x/crypto's client
// tries a method name only once unless an AuthCallback picks the next.
func inTurn(methods ...gossh.AuthMethod) gossh.ClientConfig {
	return gossh.ClientConfig{AuthCallback: func(*gossh.ClientAuthContext) (gossh.AuthMethod, error) {
		if len(methods) == 0 {
			return nil, nil
		}
		m := methods[0]
		methods = methods[1:]
		return m, nil
	}}
}

// TestKeyThatSignedIsAuthorized is the CVE-2024-45337 pattern: a client
// offers a key it cannot sign with, which the gateway accepts at query
// time, then signs with another. The connection must act for the key that
// signed and no other (gliderlabs' s.PublicKey() is the last key its
// callback accepted, not necessarily the one that signed).
func TestKeyThatSignedIsAuthorized(t *testing.T) {
	g := start(t, setup{})
	orgA, orgB := g.org("a"), g.org("b")
	idA, idB := g.sandbox(orgA, receipt.TransportSSH), g.sandbox(orgB, receipt.TransportSSH)
	victim, _ := g.key(orgA)
	attacker, _ := g.key(orgB)
	stranger := newSigner(t)

	login := func(user string, methods ...gossh.AuthMethod) (*gossh.Client, error) {
		cfg := inTurn(methods...)
		cfg.User = user
		return g.client(g.connect(cfg))
	}

	for _, signer := range []struct {
		name string
		key  gossh.Signer
	}{{"another organization's key", attacker}, {"an unregistered key", stranger}} {
		t.Run(signer.name+" signs after the victim's key was offered", func(t *testing.T) {
			v := &offered{pub: victim.PublicKey()}
			_, err := login(idA, gossh.PublicKeys(v), gossh.PublicKeys(signer.key))
			if !v.asked.Load() {
				t.Fatal("the gateway did not accept the victim's key at query time: the pattern was not set up")
			}
			if err == nil || !strings.Contains(err.Error(), "unable to authenticate") {
				t.Fatalf("into the victim's sandbox: %v, want refused at authentication", err)
			}
		})
	}

	t.Run("the attacker into its own sandbox", func(t *testing.T) {
		v := &offered{pub: victim.PublicKey()}
		c, err := login(idB, gossh.PublicKeys(v), gossh.PublicKeys(attacker))
		if err != nil {
			t.Fatalf("the attacker's own key into its own sandbox: %v", err)
		}
		if v.asked.Load() {
			t.Error("the victim's key was accepted at query time for another organization's sandbox")
		}
		if r := run(t, c, "exit 0"); r.Exit != "exit-status 0" {
			t.Fatalf("%+v", r)
		}
	})

	// Two keys of one organization: the first is offered and accepted at
	// query time, then the second signs. The session must be the second
	// key's: deleting the first leaves it, deleting the second ends it.
	// (x/crypto now caches one callback answer, so gliderlabs' last
	// accepted key is the signer here too: what this holds is that the
	// session follows the signature, not any key accepted before it.)
	t.Run("the session is the signer's, not the one offered", func(t *testing.T) {
		first, firstKey := g.key(orgA)
		second, secondKey := g.key(orgA)
		firstOffered := &offered{pub: first.PublicKey()}
		c, err := login(idA, gossh.PublicKeys(firstOffered), gossh.PublicKeys(second))
		if err != nil {
			t.Fatal(err)
		}
		if !firstOffered.asked.Load() {
			t.Fatal("the gateway did not accept the first key at query time: the pattern was not set up")
		}
		e := startEcho(t, c)
		ctx := context.Background()
		if err := g.core.DeleteSSHKey(ctx, g.admin(orgA), firstKey.ID); err != nil {
			t.Fatal(err)
		}
		e.roundTrip(t, "deleting the key that was only offered leaves the session")
		if err := g.core.DeleteSSHKey(ctx, g.admin(orgA), secondKey.ID); err != nil {
			t.Fatal(err)
		}
		if r := e.wait(t); r.Exit != "exit-status 255" || !strings.Contains(r.Stderr, control.ErrKeyRevoked.Error()) {
			t.Errorf("deleting the key that signed: %+v, want exit 255 saying the key was revoked", r)
		}
	})
}

// TestKeyRegisteredByAnotherOrganization: organization B registers
// organization A's public key, as anyone can who read it off a public
// profile. A's key still logs in to A's sandboxes as A's registration;
// the key reaches B's sandboxes only through B's registration (which is
// B's to grant, and ends when B deletes it), and A's own registration never
// reaches B's sandboxes, nor B's A's.
func TestKeyRegisteredByAnotherOrganization(t *testing.T) {
	g := start(t, setup{})
	ctx := context.Background()
	orgA, orgB := g.org("a"), g.org("b")
	idA, idB := g.sandbox(orgA, receipt.TransportSSH), g.sandbox(orgB, receipt.TransportSSH)
	shared, _ := g.key(orgA)
	onlyA, _ := g.key(orgA)
	onlyB, _ := g.key(orgB)
	takenByB, err := g.core.AddSSHKey(ctx, g.admin(orgB), "from a profile", shared.PublicKey())
	if err != nil {
		t.Fatalf("B registering A's public key: %v", err)
	}

	inA := g.login(idA, shared)
	if r := run(t, inA, "exit 0"); r.Exit != "exit-status 0" {
		t.Fatalf("A into its own sandbox after B registered its key: %+v", r)
	}
	inB := g.login(idB, shared)
	if r := run(t, inB, "exit 0"); r.Exit != "exit-status 0" {
		t.Fatalf("the key into B's sandbox through B's registration: %+v", r)
	}
	refused := func(what, user string, key gossh.Signer) {
		t.Helper()
		if _, err := g.dial(user, gossh.PublicKeys(key)); err == nil || !strings.Contains(err.Error(), "unable to authenticate") {
			t.Errorf("%s: %v, want refused at authentication", what, err)
		}
	}
	refused("a key only A registered, into B's sandbox", idB, onlyA)
	refused("a key only B registered, into A's sandbox", idA, onlyB)

	// The connection into B's sandbox is B's registration's: B deleting
	// it closes that connection and leaves A's.
	if err := g.core.DeleteSSHKey(ctx, g.admin(orgB), takenByB.ID); err != nil {
		t.Fatal(err)
	}
	closedConn(t, inB, "B deleted its registration of the key")
	if r := run(t, inA, "exit 3"); r.Exit != "exit-status 3" {
		t.Errorf("A's connection after B deleted its registration: %+v", r)
	}
	refused("the key into B's sandbox once B deleted its registration", idB, shared)
	if r := run(t, g.login(idA, shared), "exit 0"); r.Exit != "exit-status 0" {
		t.Errorf("A logging in again after B deleted its registration: %+v", r)
	}
}

// TestUserNameVariantsRefused: the user name must be the sandbox id exactly.
// Variants a lookup folding case, trimming, matching patterns or
// normalizing Unicode could take for the id (of the key's own sandbox, so
// that only the name is wrong) are refused like an absent sandbox.
func TestUserNameVariantsRefused(t *testing.T) {
	g := start(t, setup{})
	org := g.org("a")
	id := g.sandbox(org, receipt.TransportSSH)
	key, _ := g.key(org)
	if _, err := g.dial(id, gossh.PublicKeys(key)); err != nil {
		t.Fatalf("the id itself: %v", err)
	}
	for _, user := range []string{strings.ToUpper(id), " " + id, id + " ", id + "\n", id + "\x00", id[:len(id)-1] + "%",
		id[:len(id)-1] + "_", strings.Replace(id, "_", "\uff3f", 1), strings.Replace(id, "s", "\u0455", 1), id + "/..", ""} {
		if _, err := g.dial(user, gossh.PublicKeys(key)); err == nil || !strings.Contains(err.Error(), "unable to authenticate") {
			t.Errorf("user %q: %v, want refused at authentication", user, err)
		}
	}
}
