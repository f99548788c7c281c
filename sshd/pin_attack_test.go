package sshd_test

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/tls"
	"database/sql"
	"errors"
	"io"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	gossh "golang.org/x/crypto/ssh"

	"github.com/hiloop/hiloop/control/controltest"
	"github.com/hiloop/hiloop/internal/eventually"
	"github.com/hiloop/hiloop/receipt"
	"github.com/hiloop/hiloop/sshd"
	"github.com/hiloop/hiloop/store"
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

// holdWriter takes SQLite's write lock from a connection of the test's own
// (a write to sandbox id's row, not committed) until release.
func holdWriter(t *testing.T, g *gateway, id string) (release func()) {
	t.Helper()
	db, err := sql.Open("sqlite", "file:"+g.dbPath)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	tx, err := db.Begin()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(`UPDATE sandboxes SET updated_at = updated_at WHERE id = ?`, id); err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	release = func() {
		once.Do(func() {
			if err := tx.Rollback(); err != nil {
				t.Error(err)
			}
		})
	}
	t.Cleanup(release)
	return release
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

// forwardSandbox starts a gateway with one sandbox that takes -L, whose
// helper is changedKeyHelper's; swap makes the helper show another key
// from then on.
func forwardSandbox(t *testing.T, dialTimeout time.Duration) (g *gateway, key gossh.Signer, id string, swap func()) {
	t.Helper()
	port, swap := changedKeyHelper(t)
	g, _ = limited(t, setup{sessionPort: port}, func(o *sshd.Options) { o.HelperDialTimeout = dialTimeout })
	org := g.org("a")
	key, _ = g.key(org)
	id = g.sandbox(org, receipt.TransportSSH, receipt.TransportForward)
	return g, key, id, swap
}

// pinnedSandbox is forwardSandbox with the helper's first key pinned.
func pinnedSandbox(t *testing.T, dialTimeout time.Duration) (g *gateway, key gossh.Signer, id string, swap func()) {
	t.Helper()
	g, key, id, swap = forwardSandbox(t, dialTimeout)
	pinFirstKey(t, g, id, key)
	return g, key, id, swap
}

// changeRecorded waits for sandbox id's record to hold a helper key change.
func changeRecorded(t *testing.T, g *gateway, id string) {
	t.Helper()
	eventually.True(t, "the change recorded", func() bool {
		sb, err := g.db.SandboxAnyOrg(context.Background(), id)
		return err == nil && sb.HelperKeyChangedPod != ""
	})
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
	eventually.True(t, "the first session ended", func() bool { return g.core.Sessions() == 0 })
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
	g, key, id, swap := pinnedSandbox(t, 5*time.Second)
	marks := countMarks(t, g)
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
	eventually.True(t, "every session ended", func() bool { return g.core.Sessions() == 0 })
}

// TestPinAttackConcurrentRefusals: with the writer busy, the refused dials
// of one sandbox do not each wait on a write of their own: the first
// refusal writes the change, and the others, as many as the sandbox's
// session slots, are refused at once, before that write is made.
func TestPinAttackConcurrentRefusals(t *testing.T) {
	g, key, id, swap := pinnedSandbox(t, 30*time.Second)
	swap()

	const n = 8 // control's default Limits.PerSandbox
	clients := make([]*gossh.Client, n)
	for i := range clients {
		clients[i] = g.login(id, key)
		defer clients[i].Close()
	}

	release := holdWriter(t, g, id)
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
	release()
	wantRefused(t, <-errs)
	changeRecorded(t, g, id)
	for _, c := range clients {
		c.Close()
	}
	eventually.True(t, "every session ended", func() bool { return g.core.Sessions() == 0 })
}

// TestPinHoldsAcrossRestart: the pin is the record's, not the gateway's
// memory: after a restart (a new gateway on the same record), the helper of
// the same pod showing another key is still refused, and the change is
// recorded.
func TestPinHoldsAcrossRestart(t *testing.T) {
	g, key, id, swap := pinnedSandbox(t, 5*time.Second)
	swap()

	g.serveAnother(setup{}, func(o *sshd.Options) { o.HelperDialTimeout = 5 * time.Second })
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
	eventually.True(t, "every session ended", func() bool { return g.core.Sessions() == 0 })
}

// TestPinAttackOtherPodDisplacesPin: a pin call for a pod that is not the
// record's (the late dial of a pod from before a stop and wake, here made
// directly as the gateway would make it) is refused and leaves the record's
// pin alone, so the current pod's helper, showing another key after it, is
// still refused.
func TestPinAttackOtherPodDisplacesPin(t *testing.T) {
	g, key, id, swap := pinnedSandbox(t, 5*time.Second)

	if _, err := g.db.PinHelperKey(context.Background(), id, "uid-an-earlier-pod", "SHA256:whatever"); !errors.Is(err, store.ErrStalePod) {
		t.Fatalf("a pin for a pod that is not the record's: %v, want %v", err, store.ErrStalePod)
	}
	swap()

	c := g.login(id, key)
	defer c.Close()
	ch, err := openWithin(t, c, 20*time.Second)
	if err == nil {
		ch.Close()
		sb, _ := g.db.SandboxAnyOrg(context.Background(), id)
		t.Errorf("pod %s's helper changed its key within the pod's life and -L went through it (changed pod recorded: %q)",
			controltest.PodUID(id), sb.HelperKeyChangedPod)
	} else {
		wantRefused(t, err)
	}
	c.Close()
	eventually.True(t, "every session ended", func() bool { return g.core.Sessions() == 0 })
}

// TestPinAttackReportOutlastsBusyWriter: the first refusal of a changed
// key finds the writer busy past HelperDialTimeout. That dial is refused
// at its timeout, and the change is still recorded once the writer is
// free: no later refusal is spared the check for a claim that came to
// nothing.
func TestPinAttackReportOutlastsBusyWriter(t *testing.T) {
	g, key, id, swap := pinnedSandbox(t, time.Second)
	swap()

	release := holdWriter(t, g, id)
	c := g.login(id, key)
	defer c.Close()
	released := make(chan struct{})
	go func() {
		time.Sleep(3 * time.Second) // past HelperDialTimeout, within busy_timeout
		release()
		close(released)
	}()
	if _, err := openWithin(t, c, 30*time.Second); err == nil {
		t.Fatal("-L through a changed key went through")
	}
	<-released

	for range 5 {
		if _, err := openWithin(t, c, 20*time.Second); err == nil {
			t.Fatal("-L through a changed key went through")
		}
	}
	sb, err := g.db.SandboxAnyOrg(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	if sb.HelperKeyChangedPod == "" {
		t.Errorf("6 refusals of a changed key, the store free for the last 5, and the change was never recorded")
	}
	c.Close()
	eventually.True(t, "every session ended", func() bool { return g.core.Sessions() == 0 })
}

// pinWaiters counts the goroutines pinInRecord started that still wait on
// the store.
func pinWaiters() int {
	buf := make([]byte, 1<<22)
	buf = buf[:runtime.Stack(buf, true)]
	n := 0
	for _, g := range strings.Split(string(buf), "\n\n") {
		if strings.Contains(g, "sshd.(*Gateway).pinInRecord.func") {
			n++
		}
	}
	return n
}

// TestPinAttackStalledStoreOneQuestionPerPod: while the store's writer is
// busy past HelperDialTimeout, every dial of a changed key is refused at
// its timeout and forgets the pod's pin, so the next dial asks the record
// again. The question outlives its dial (so that the change is recorded
// even if the client left), but there is one question per pod and key at
// a time, with a deadline: dial after dial does not pile up waiters on the
// store.
func TestPinAttackStalledStoreOneQuestionPerPod(t *testing.T) {
	g, key, id, swap := pinnedSandbox(t, 200*time.Millisecond)
	swap()

	release := holdWriter(t, g, id)
	c := g.login(id, key)
	defer c.Close()
	const dials = 10
	for range dials {
		if _, err := openWithin(t, c, 20*time.Second); err == nil {
			t.Fatal("-L through a changed key went through")
		}
	}
	if n := pinWaiters(); n > 1 {
		t.Errorf("after %d refused dials of one pod, %d goroutines wait on the store for its pin, want at most 1", dials, n)
	}
	release()
	c.Close()
	eventually.True(t, "the pin's waiters ended", func() bool { return pinWaiters() == 0 })
	eventually.True(t, "every session ended", func() bool { return g.core.Sessions() == 0 })
}

// TestPinAttackJoinedDialIsNotReported: two first dials of a pod race,
// the helper's key and another, while the record's writer is busy. The
// second asks a question of its own (one per pod and key), not the first's:
// had it taken the first's answer, it would have been refused without its
// key ever being put to the record, and counted as reported, so that the
// change was never recorded. Here the first key is pinned and the change
// is recorded.
func TestPinAttackJoinedDialIsNotReported(t *testing.T) {
	g, key, id, swap := forwardSandbox(t, 30*time.Second)

	// A session that stays open (cat, stdin never closed) puts the
	// sandbox in use, so the dials below write no activity of their own.
	busy := g.login(id, key)
	defer busy.Close()
	sess, err := busy.NewSession()
	if err != nil {
		t.Fatal(err)
	}
	stdin, err := sess.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := sess.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := sess.Start("cat"); err != nil {
		t.Fatal(err)
	}
	if _, err := stdin.Write([]byte("x\n")); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(stdout, make([]byte, 2)); err != nil {
		t.Fatal(err)
	}

	first, second := g.login(id, key), g.login(id, key)
	defer first.Close()
	defer second.Close()
	release := holdWriter(t, g, id)
	asked := func(n int) func() bool {
		return func() bool { return strings.Count(g.logs.String(), "host key against the record") == n }
	}
	firstOpen := make(chan error, 1)
	go func() {
		ch, err := openWithin(t, first, 40*time.Second)
		if err == nil {
			ch.Close()
		}
		firstOpen <- err
	}()
	eventually.True(t, "the first dial's question asked", asked(1))
	swap()
	secondOpen := make(chan error, 1)
	go func() {
		_, err := openWithin(t, second, 40*time.Second)
		secondOpen <- err
	}()
	eventually.True(t, "the second dial's question asked", asked(2))
	release()
	if err := <-firstOpen; err != nil {
		t.Fatalf("the first key's dial: %v", err)
	}
	wantRefused(t, <-secondOpen)

	third := g.login(id, key)
	defer third.Close()
	_, err = openWithin(t, third, 20*time.Second)
	wantRefused(t, err)
	changeRecorded(t, g, id)
	stdin.Close()
	sess.Wait()
}
