package sshd_test

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/tls"
	"database/sql"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	gossh "golang.org/x/crypto/ssh"

	"github.com/hiloop/hiloop/sandbox"
	"github.com/hiloop/hiloop/sshd"
)

// countMarks installs, from a connection of the test's own, a trigger that
// counts every write of helper_key_changed_pod, and returns the count.
func countMarks(t *testing.T, g *gateway) func() int {
	t.Helper()
	db, err := sql.Open("sqlite", "file:"+g.dbPath)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	for _, q := range []string{
		`CREATE TABLE pin_attack_marks (n INTEGER)`,
		`CREATE TRIGGER pin_attack_count AFTER UPDATE OF helper_key_changed_pod ON sandboxes BEGIN INSERT INTO pin_attack_marks VALUES (1); END`,
	} {
		if _, err := db.Exec(q); err != nil {
			t.Fatal(err)
		}
	}
	return func() int {
		var n int
		if err := db.QueryRow(`SELECT count(*) FROM pin_attack_marks`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
}

// changedKeyHelper is a helper whose key is k1 until swap is called, then
// k2, pinned as k1 by one dial of id.
func changedKeyHelper(t *testing.T) (port int, swap func()) {
	_, k1, _ := ed25519.GenerateKey(rand.Reader)
	_, k2, _ := ed25519.GenerateKey(rand.Reader)
	var mu sync.Mutex
	current := k1
	port = impostor(t, func(int) ed25519.PrivateKey {
		mu.Lock()
		defer mu.Unlock()
		return current
	}, func(_ int, c *tls.Conn) { echoHelper(c) })
	return port, func() {
		mu.Lock()
		current = k2
		mu.Unlock()
	}
}

func pinFirstKey(t *testing.T, g *gateway, id string, key gossh.Signer) {
	t.Helper()
	c := g.login(id, key)
	ch, err := openWithin(t, c, 20*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	echoes(t, ch, "-L through the first key")
	c.Close()
	eventually(t, "the first session ended", func() bool { return g.core.Sessions() == 0 })
}

func wantRefused(t *testing.T, err error) {
	t.Helper()
	var oce *gossh.OpenChannelError
	if !errors.As(err, &oce) || oce.Reason != gossh.ConnectionFailed {
		t.Fatalf("-L through a changed key: %v, want connection failed", err)
	}
}

// TestPinAttackRefusalsWriteOnce: the tenant of a sandbox, whose program
// holds the helper's port with another key, opens -L channel after -L
// channel: each is refused, and the change is written to the record once,
// not once a dial.
func TestPinAttackRefusalsWriteOnce(t *testing.T) {
	port, swap := changedKeyHelper(t)
	g, _ := limited(t, setup{sessionPort: port}, func(o *sshd.Options) { o.HelperDialTimeout = 5 * time.Second })
	marks := countMarks(t, g)
	org := g.org("a")
	key, _ := g.key(org)
	id := g.sandbox(org, sandbox.TransportSSH, sandbox.TransportForward)
	pinFirstKey(t, g, id, key)
	swap()

	const n = 20
	c := g.login(id, key)
	defer c.Close()
	for range n {
		_, err := openWithin(t, c, 20*time.Second)
		wantRefused(t, err)
	}
	if got := marks(); got != 1 {
		t.Fatalf("%d refused dials made %d writes of the change, want 1", n, got)
	}
	c.Close()
	eventually(t, "every session ended", func() bool { return g.core.Sessions() == 0 })
}

// TestPinAttackConcurrentRefusals: with the writer busy, the refused dials
// of one sandbox do not each wait on a write of their own: the first
// refusal writes the change, and the others, as many as the sandbox's
// session slots, are refused at once, before that write is made.
func TestPinAttackConcurrentRefusals(t *testing.T) {
	port, swap := changedKeyHelper(t)
	g, _ := limited(t, setup{sessionPort: port}, func(o *sshd.Options) { o.HelperDialTimeout = 30 * time.Second })
	org := g.org("a")
	key, _ := g.key(org)
	id := g.sandbox(org, sandbox.TransportSSH, sandbox.TransportForward)
	pinFirstKey(t, g, id, key)
	swap()

	const n = 8 // control's default Limits.PerSandbox
	clients := make([]*gossh.Client, n)
	for i := range clients {
		clients[i] = g.login(id, key)
		defer clients[i].Close()
	}

	lock, err := sql.Open("sqlite", "file:"+g.dbPath)
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Close()
	tx, err := lock.Begin()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(`UPDATE sandboxes SET updated_at = updated_at WHERE id = ?`, id); err != nil {
		t.Fatal(err)
	}
	errs := make(chan error, n)
	for _, c := range clients {
		go func() {
			_, err := openWithin(t, c, 60*time.Second)
			errs <- err
		}()
	}
	for range n - 1 {
		wantRefused(t, <-errs)
	}
	select {
	case err := <-errs:
		t.Fatalf("every dial ended (the last: %v) while the write of the change could not be made", err)
	default:
	}
	if got := strings.Count(g.logs.String(), "host key against the record"); got != 2 {
		t.Errorf("%d checks against the record, want 2 (the first key's, the first refusal's)", got)
	}
	if err := tx.Rollback(); err != nil {
		t.Fatal(err)
	}
	wantRefused(t, <-errs)
	eventually(t, "the change recorded", func() bool {
		sb, err := g.db.SandboxAnyOrg(context.Background(), id)
		return err == nil && sb.HelperKeyChangedPod != ""
	})
	for _, c := range clients {
		c.Close()
	}
	eventually(t, "every session ended", func() bool { return g.core.Sessions() == 0 })
}

// TestPinHoldsAcrossRestart: the pin is the record's, not the gateway's
// memory: after a restart (a new gateway on the same record), the helper of
// the same pod showing another key is still refused, and the change is
// recorded.
func TestPinHoldsAcrossRestart(t *testing.T) {
	port, swap := changedKeyHelper(t)
	tune := func(o *sshd.Options) { o.HelperDialTimeout = 5 * time.Second }
	g, _ := limited(t, setup{sessionPort: port}, tune)
	org := g.org("a")
	key, _ := g.key(org)
	id := g.sandbox(org, sandbox.TransportSSH, sandbox.TransportForward)
	pinFirstKey(t, g, id, key)
	swap()

	g.serveAnother(setup{sessionPort: port}, tune)
	c := g.login(id, key)
	defer c.Close()
	_, err := openWithin(t, c, 20*time.Second)
	wantRefused(t, err)
	sb, err := g.db.SandboxAnyOrg(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	if sb.HelperKeyChangedPod == "" {
		t.Error("the change after a restart was not recorded")
	}
	c.Close()
	eventually(t, "every session ended", func() bool { return g.core.Sessions() == 0 })
}
