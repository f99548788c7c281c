package sshd_test

import (
	"bufio"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http/httptest"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	gossh "golang.org/x/crypto/ssh"

	"github.com/hiloop/hiloop/control"
	"github.com/hiloop/hiloop/internal/eventually"
	"github.com/hiloop/hiloop/metrics"
	"github.com/hiloop/hiloop/receipt"
	"github.com/hiloop/hiloop/sshd"
)

// limited is start's gateway replaced by one over the same core whose
// options tune changes, recording its metrics in the returned registry.
func limited(t *testing.T, s setup, tune func(*sshd.Options)) (*gateway, *metrics.Metrics) {
	t.Helper()
	g := start(t, s)
	return g, g.serveAnother(s, tune)
}

// serveAnother starts a second gateway on g's core and store, as a restart
// of serve would, points g at it, and stops it when the test ends.
func (g *gateway) serveAnother(s setup, tune func(*sshd.Options)) *metrics.Metrics {
	t := g.t
	t.Helper()
	hostKey, err := g.db.HostKey(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	met := metrics.New()
	o := sshd.Options{Control: g.core, HostKey: hostKey, Metrics: met, KeepAlive: s.keepAlive, KeepAliveMax: s.keepAliveMax,
		Log: slog.New(slog.NewTextHandler(g.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))}
	tune(&o)
	gw, err := sshd.New(o)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- gw.Serve(ln) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := gw.Shutdown(ctx); err != nil {
			t.Errorf("shut the limited gateway down: %v", err)
		}
		if err := <-served; err != nil {
			t.Errorf("serve: %v", err)
		}
	})
	g.gw, g.addr = gw, ln.Addr().String()
	return met
}

// refused is how many connections the gateway refused or closed for reason,
// as its metrics say.
func refused(t *testing.T, met *metrics.Metrics, reason string) int {
	t.Helper()
	return counter(t, met, `hiloop_ssh_refused_connections_total{reason="`+reason+`"}`)
}

// counter is the value of series in met.
func counter(t *testing.T, met *metrics.Metrics, series string) int {
	t.Helper()
	rec := httptest.NewRecorder()
	met.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	prefix := series + " "
	for _, line := range strings.Split(rec.Body.String(), "\n") {
		if v, ok := strings.CutPrefix(line, prefix); ok {
			n, err := strconv.Atoi(v)
			if err != nil {
				t.Fatalf("metric line %q: %v", line, err)
			}
			return n
		}
	}
	return 0
}

// silent opens a TCP connection to the gateway from source, a loopback
// address, that never says anything. It is closed when the test ends.
func silent(t *testing.T, addr, source string) net.Conn {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(source)}}
	nc, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	return nc
}

// held reports whether the gateway keeps nc open: it sends its version
// line to a connection it keeps, and closes one it refuses without a word.
func held(t *testing.T, nc net.Conn) bool {
	t.Helper()
	nc.SetReadDeadline(time.Now().Add(clientDeadline))
	line, err := bufio.NewReader(nc).ReadString('\n')
	if errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("the gateway neither greeted nor closed a new connection")
	}
	return strings.HasPrefix(line, "SSH-2.0-")
}

// closedByServer fails the test unless the gateway closes nc (a read
// returns EOF or a reset, not the test's own deadline).
func closedByServer(t *testing.T, nc net.Conn, what string) {
	t.Helper()
	nc.SetReadDeadline(time.Now().Add(clientDeadline))
	if _, err := io.Copy(io.Discard, nc); errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("the gateway did not close %s", what)
	}
}

// loginFrom logs in as user with key from source, a loopback address.
func loginFrom(t *testing.T, g *gateway, source, user string, key gossh.Signer) *gossh.Client {
	t.Helper()
	c, err := tryLoginFrom(t, g, source, user, key)
	if err != nil {
		t.Fatalf("login as %s from %s: %v", user, source, err)
	}
	return c
}

// tryLoginFrom is loginFrom that reports a failed login instead of
// failing the test.
func tryLoginFrom(t *testing.T, g *gateway, source, user string, key gossh.Signer) (*gossh.Client, error) {
	t.Helper()
	nc := silent(t, g.addr, source)
	nc.SetDeadline(time.Now().Add(clientDeadline))
	conn, chans, reqs, err := gossh.NewClientConn(nc, g.addr, &gossh.ClientConfig{
		User: user, Auth: []gossh.AuthMethod{gossh.PublicKeys(key)}, HostKeyCallback: gossh.FixedHostKey(g.host)})
	if err != nil {
		nc.Close()
		return nil, err
	}
	c := gossh.NewClient(conn, chans, reqs)
	t.Cleanup(func() { c.Close() })
	return c, nil
}

// TestSilentConnections: a thousand TCP connections from one address that
// say nothing hold at most MaxStartupsPerSource handshakes and
// StartupQueue places in the queue, and so few of the gateway's
// goroutines: past those, each one takes the place of an older silent one,
// which is closed and counted, and those that waited are refused when
// their wait ends. A client from the same address, and one from another,
// still log in and run a command, and the silent ones held are closed when
// the login grace passes, which penalises their address.
func TestSilentConnections(t *testing.T) {
	const (
		grace     = 4 * time.Second
		perSource = 10
		queue     = 8
		silents   = 1000
	)
	g, met := limited(t, setup{}, func(o *sshd.Options) {
		o.LoginGrace, o.StartupWait, o.MaxStartups, o.MaxStartupsPerSource, o.StartupQueue = grace, 3*time.Second, sshd.Startups{Start: 64, Rate: 100, Full: 64}, perSource, queue
	})
	org := g.org("a")
	key, _ := g.key(org)
	id := g.sandbox(org, receipt.TransportSSH)

	before := runtime.NumGoroutine()
	conns := make([]net.Conn, 0, silents)
	for range silents {
		conns = append(conns, silent(t, g.addr, "127.0.0.1"))
	}
	gone := func() int {
		return refused(t, met, "silent") + refused(t, met, "startup_wait") + refused(t, met, "startups_per_source")
	}
	eventually.True(t, "the silent connections past the caps closed", func() bool { return gone() >= silents-perSource-queue })
	// Each connection held before authentication costs the gateway a few
	// goroutines (its handler and x/crypto's transport); one closed, none
	// once it is gone.
	eventually.True(t, "the silent connections' goroutines gone", func() bool {
		return runtime.NumGoroutine()-before <= 4*(perSource+queue)
	})

	for _, from := range []string{"127.0.0.1", "127.0.0.2"} {
		c := loginFrom(t, g, from, id, key)
		if r := run(t, c, "print"); r.Exit != "exit-status 0" || r.Stdout != "out\n" {
			t.Errorf("a command from %s: %+v", from, r)
		}
	}
	c := loginFrom(t, g, "127.0.0.3", id, key)
	for _, nc := range conns {
		closedByServer(t, nc, "a connection that never authenticated")
	}
	if got := gone() + refused(t, met, "login_grace"); got != silents {
		t.Errorf("%d silent connections closed and counted, want %d", got, silents)
	}
	if refused(t, met, "login_grace") == 0 {
		t.Error("no silent connection was held until the login grace")
	}
	if r := run(t, c, "exit 3"); r.Exit != "exit-status 3" {
		t.Errorf("the authenticated connection after the grace: %+v", r)
	}
	if _, err := tryLoginFrom(t, g, "127.0.0.1", id, key); err == nil || !strings.Contains(err.Error(), "--ssh-penalties") {
		t.Errorf("a login from the address whose silent connections passed the grace: %v, want refused naming --ssh-penalties", err)
	}
}

// TestLoginGraceCoversKeyExchange: a client that completes the version and
// key exchange and then never finishes authenticating is closed when the
// login grace passes.
func TestLoginGraceCoversKeyExchange(t *testing.T) {
	g, met := limited(t, setup{}, func(o *sshd.Options) { o.LoginGrace = time.Second })
	nc := silent(t, g.addr, "127.0.0.1")
	nc.SetDeadline(time.Now().Add(clientDeadline))
	watched := &readErrConn{Conn: nc, failed: make(chan struct{})}
	authenticating, release := make(chan struct{}), make(chan struct{})
	stall := gossh.PublicKeysCallback(func() ([]gossh.Signer, error) {
		close(authenticating)
		<-release
		return nil, errors.New("gave up")
	})
	done := make(chan error, 1)
	go func() {
		_, _, _, err := gossh.NewClientConn(watched, g.addr, &gossh.ClientConfig{
			User: "sbx_x", Auth: []gossh.AuthMethod{stall}, HostKeyCallback: gossh.FixedHostKey(g.host)})
		done <- err
	}()
	<-authenticating
	<-watched.failed
	close(release)
	if err := <-done; err == nil {
		t.Fatal("logged in without a key")
	}
	if errors.Is(watched.err(), os.ErrDeadlineExceeded) {
		t.Fatal("the gateway did not close a connection stalled in authentication")
	}
	if got := refused(t, met, "login_grace"); got != 1 {
		t.Errorf("closed for the login grace: %d, want 1", got)
	}
}

// readErrConn is a client connection that says when a read from it fails.
type readErrConn struct {
	net.Conn
	once   sync.Once
	failed chan struct{}
	mu     sync.Mutex
	first  error
}

func (c *readErrConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if err != nil {
		c.mu.Lock()
		if c.first == nil {
			c.first = err
		}
		c.mu.Unlock()
		c.once.Do(func() { close(c.failed) })
	}
	return n, err
}

func (c *readErrConn) err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.first
}

// speaking opens a connection from source that sends its version line and
// then nothing; it reports whether the gateway greeted it.
func speaking(t *testing.T, addr, source string) (net.Conn, bool) {
	t.Helper()
	nc := silent(t, addr, source)
	if _, err := nc.Write([]byte("SSH-2.0-stalls\r\n")); err != nil {
		t.Fatal(err)
	}
	return nc, held(t, nc)
}

// refusedWith fails the test unless the gateway refuses nc with a line
// naming flag before its version, and closes it.
func refusedWith(t *testing.T, nc net.Conn, flag string) {
	t.Helper()
	nc.SetReadDeadline(time.Now().Add(clientDeadline))
	all, err := io.ReadAll(nc)
	if errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("the gateway did not close a refused connection")
	}
	line, _, _ := strings.Cut(string(all), "\n")
	if !strings.HasPrefix(line, "hiloop: ") || !strings.Contains(line, flag) {
		t.Errorf("refused with %q, want a line naming %s", all, flag)
	}
}

// TestStartupsCaps: handshakes are held up to MaxStartupsPerSource from
// one address and MaxStartups in all. One more waits, and once it spoke
// takes the place of a silent one; when all of them speak, it waits in
// the queue for a place, and past the queue or the wait it is refused with a line naming
// the flag, which the x/crypto client reports as a disconnect. A place
// freed goes to the connection waiting longest that may take it, and an
// authenticated connection no longer holds one.
func TestStartupsCaps(t *testing.T) {
	g, met := limited(t, setup{}, func(o *sshd.Options) {
		o.MaxStartups, o.MaxStartupsPerSource, o.StartupQueue, o.StartupWait = sshd.Startups{Start: 4, Rate: 100, Full: 4}, 2, 1, 5*time.Second
	})
	org := g.org("a")
	key, _ := g.key(org)
	id := g.sandbox(org, receipt.TransportSSH)
	waiting := func(n int) {
		t.Helper()
		eventually.True(t, fmt.Sprintf("%d waiting", n), func() bool { return counter(t, met, `hiloop_ssh_startups{state="waiting"}`) == n })
	}
	// greeted reports, once the gateway speaks, whether it greeted nc.
	greeted := func(nc net.Conn) <-chan bool {
		ch := make(chan bool, 1)
		go func() {
			line, err := bufio.NewReader(nc).ReadString('\n')
			ch <- err == nil && strings.HasPrefix(line, "SSH-2.0-")
		}()
		return ch
	}

	quiet := silent(t, g.addr, "127.0.0.1")
	if !held(t, quiet) {
		t.Fatal("a connection within the caps was refused")
	}
	a2, ok := speaking(t, g.addr, "127.0.0.1")
	if !ok {
		t.Fatal("a connection within the caps was refused")
	}
	if _, ok := speaking(t, g.addr, "127.0.0.1"); !ok {
		t.Fatal("a connection past MaxStartupsPerSource was refused while a silent one held a place")
	}
	closedByServer(t, quiet, "the silent connection whose place went to a new one")
	if got := refused(t, met, "silent"); got != 1 {
		t.Errorf("closed as silent: %d, want 1", got)
	}
	// Past the address's cap, with no silent one to give way, the next
	// waits; the one after, with the queue full, is refused.
	w1 := silent(t, g.addr, "127.0.0.1")
	if _, err := w1.Write([]byte("SSH-2.0-waits\r\n")); err != nil {
		t.Fatal(err)
	}
	waiting(1)
	w1Greeted := greeted(w1)
	refusedWith(t, silent(t, g.addr, "127.0.0.1"), "--ssh-max-startups-per-source")
	if _, err := tryLoginFrom(t, g, "127.0.0.1", id, key); err == nil || !strings.Contains(err.Error(), "--ssh-max-startups-per-source") {
		t.Errorf("a login past MaxStartupsPerSource: %v, want a disconnect naming the flag", err)
	}
	if got := refused(t, met, "startups_per_source"); got != 2 {
		t.Errorf("refused per source: %d, want 2", got)
	}
	a2.Close()
	if !<-w1Greeted {
		t.Fatal("the connection waiting for a place of its address was not given the freed one")
	}

	// Four handshakes in all: the next waits, the one after is refused.
	if _, ok := speaking(t, g.addr, "127.0.0.2"); !ok {
		t.Fatal("a connection from another address was refused within MaxStartups")
	}
	b2, ok := speaking(t, g.addr, "127.0.0.2")
	if !ok {
		t.Fatal("a connection from another address was refused within MaxStartups")
	}
	w2 := silent(t, g.addr, "127.0.0.3")
	if _, err := w2.Write([]byte("SSH-2.0-waits\r\n")); err != nil {
		t.Fatal(err)
	}
	waiting(1)
	w2Greeted := greeted(w2)
	refusedWith(t, silent(t, g.addr, "127.0.0.4"), "--ssh-startup-queue")
	if got := refused(t, met, "startups"); got != 1 {
		t.Errorf("refused past the queue: %d, want 1", got)
	}
	b2.Close()
	if !<-w2Greeted {
		t.Error("the waiting connection was not given the freed place")
	}

	// A login waits for a place, and gives it back once it authenticated.
	login := make(chan error, 1)
	go func() {
		c, err := tryLoginFrom(t, g, "127.0.0.5", id, key)
		if err == nil {
			c.Close()
		}
		login <- err
	}()
	waiting(1)
	w1.Close()
	if err := <-login; err != nil {
		t.Fatalf("a login that waited for a place: %v", err)
	}
	if _, ok := speaking(t, g.addr, "127.0.0.5"); !ok {
		t.Error("an authenticated connection still holds a place of the connections not yet authenticated")
	}
	// Every place is taken by a client that speaks: the next waits, and
	// is refused when its wait ends.
	refusedWith(t, silent(t, g.addr, "127.0.0.6"), "--ssh-startup-wait")
	if got := refused(t, met, "startup_wait"); got != 1 {
		t.Errorf("refused after the wait: %d, want 1", got)
	}
}

// TestWaiterTakesSilentPlace: a client that waits for a place, and has
// spoken, takes the place of a connection in its handshake that has sent
// nothing for a second, rather than wait for the login grace to free one;
// a silent one waiting does not, and gets the next place freed.
func TestWaiterTakesSilentPlace(t *testing.T) {
	g, met := limited(t, setup{}, func(o *sshd.Options) {
		o.MaxStartups, o.StartupWait = sshd.Startups{Start: 2, Rate: 100, Full: 4}, 20*time.Second
	})
	org := g.org("a")
	key, _ := g.key(org)
	id := g.sandbox(org, receipt.TransportSSH)
	quiet := []net.Conn{silent(t, g.addr, "127.0.0.1"), silent(t, g.addr, "127.0.0.1")}
	for _, nc := range quiet {
		if !held(t, nc) {
			t.Fatal("a connection within the caps was refused")
		}
	}
	// Two handshakes are under way, at start: the next ones wait.
	waiter := silent(t, g.addr, "127.0.0.3")
	eventually.True(t, "a silent connection waiting", func() bool { return counter(t, met, `hiloop_ssh_startups{state="waiting"}`) == 1 })
	c := loginFrom(t, g, "127.0.0.2", id, key)
	if r := run(t, c, "print"); r.Stdout != "out\n" {
		t.Errorf("a command from the client that waited: %+v", r)
	}
	if got := refused(t, met, "silent"); got != 1 {
		t.Errorf("closed as silent: %d, want the 1 whose place the login took", got)
	}
	// The silent one waiting took no one's place (it never spoke); it got
	// the place the login gave back once it authenticated.
	if !held(t, waiter) {
		t.Error("the connection waiting longest did not get the place a login gave back")
	}
}

// TestBurstFromOneAddress: clients that log in promptly are a burst, not an
// attack: many at once from one address all log in and run a command with
// the default limits before authentication, and their address is not
// penalised. The session caps after it are the tenant's own, set here to
// the burst: how many of its sessions overlap depends on the machine's
// speed, not on the limits under test.
func TestBurstFromOneAddress(t *testing.T) {
	const burst = 100
	g, met := limited(t, setup{limits: control.Limits{PerSandbox: burst, PerOrg: burst}}, func(o *sshd.Options) { o.MaxConnsPerKey = burst })
	org := g.org("a")
	key, _ := g.key(org)
	ids := []string{g.sandbox(org, receipt.TransportSSH), g.sandbox(org, receipt.TransportSSH)}
	errs := make(chan error, burst)
	var wg sync.WaitGroup
	for i := range burst {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := tryLoginFrom(t, g, "127.0.0.1", ids[i%2], key)
			if err != nil {
				errs <- err
				return
			}
			defer c.Close()
			s, err := c.NewSession()
			if err != nil {
				errs <- err
				return
			}
			defer s.Close()
			errs <- s.Run("exit 0")
		}()
	}
	wg.Wait()
	close(errs)
	failed := 0
	for err := range errs {
		if err != nil {
			failed++
			t.Log(err)
		}
	}
	if failed > 0 {
		t.Errorf("%d of %d logins at once from one address failed", failed, burst)
	}
	for _, reason := range []string{"startups", "startups_per_source", "startup_wait", "silent", "penalty", "per_key"} {
		if n := refused(t, met, reason); n != 0 {
			t.Errorf("refused for %s: %d", reason, n)
		}
	}
	loginFrom(t, g, "127.0.0.1", ids[0], key)
}

// TestPenalties: an address whose logins fail is refused, with a line
// naming --ssh-penalties, once what it owes reaches the minimum, for a
// good key too; another address is not; and an address whose handshake
// breaks the protocol is refused at once.
func TestPenalties(t *testing.T) {
	g, met := limited(t, setup{}, func(o *sshd.Options) {
		o.Penalties = sshd.Penalties{AuthFail: 5 * time.Second, NoAuth: time.Second, GraceExceeded: 10 * time.Second, Crash: time.Hour, Min: 15 * time.Second, Max: time.Hour, MaxSources: 100}
	})
	org := g.org("a")
	key, _ := g.key(org)
	id := g.sandbox(org, receipt.TransportSSH)
	_, stranger, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	bad, err := gossh.NewSignerFromKey(stranger)
	if err != nil {
		t.Fatal(err)
	}

	failures := 0
	for range 50 {
		_, err := tryLoginFrom(t, g, "127.0.0.2", id, bad)
		if err == nil {
			t.Fatal("an unregistered key logged in")
		}
		if strings.Contains(err.Error(), "--ssh-penalties") {
			break
		}
		failures++
		// The gateway charges the address once it sees the close.
		eventually.True(t, "the failed login charged", func() bool {
			return counter(t, met, `hiloop_ssh_penalties_total{event="authfail"}`) == failures
		})
	}
	if failures != 3 {
		t.Errorf("refused for its penalty after %d failed logins, want 3 (authfail 5s, min 15s)", failures)
	}
	if _, err := tryLoginFrom(t, g, "127.0.0.2", id, key); err == nil || !strings.Contains(err.Error(), "--ssh-penalties") {
		t.Errorf("a good key from the penalised address: %v, want refused naming --ssh-penalties", err)
	}
	if got := refused(t, met, "penalty"); got != 2 {
		t.Errorf("refused for a penalty: %d, want 2", got)
	}
	loginFrom(t, g, "127.0.0.1", id, key)

	nc := silent(t, g.addr, "127.0.0.3")
	if !held(t, nc) {
		t.Fatal("a first connection from a new address was refused")
	}
	// A version line, then a packet far longer than any SSH allows.
	if _, err := nc.Write([]byte("SSH-2.0-fuzz\r\n\xff\xff\xff\xff\x00\x00\x00\x00")); err != nil {
		t.Fatal(err)
	}
	closedByServer(t, nc, "a connection that broke the protocol")
	// x/crypto closes the connection before the gateway hears of the
	// failure and charges the address: a connection made in between is
	// admitted, and would wait out the login grace.
	eventually.True(t, "the broken handshake charged", func() bool {
		return counter(t, met, `hiloop_ssh_penalties_total{event="crash"}`) == 1
	})
	eventually.True(t, "the address that broke the protocol refused", func() bool {
		nc := silent(t, g.addr, "127.0.0.3")
		nc.SetReadDeadline(time.Now().Add(clientDeadline))
		all, _ := io.ReadAll(nc)
		return strings.Contains(string(all), "--ssh-penalties")
	})
}

// TestConnsPerKeyCap: one key holds at most MaxConnsPerKey authenticated
// connections; one more waits StartupWait for a place, then fails to log
// in with a banner naming the flag and is counted, another key of the
// organization still logs in, and a connection closed frees its place.
func TestConnsPerKeyCap(t *testing.T) {
	g, met := limited(t, setup{}, func(o *sshd.Options) { o.MaxConnsPerKey, o.StartupWait = 2, time.Second })
	org := g.org("a")
	key, _ := g.key(org)
	other, _ := g.key(org)
	id := g.sandbox(org, receipt.TransportSSH)

	first := g.login(id, key)
	g.login(id, key)
	var banner string
	if _, _, _, err := g.connect(gossh.ClientConfig{User: id, Auth: []gossh.AuthMethod{gossh.PublicKeys(key)},
		BannerCallback: func(msg string) error { banner += msg; return nil }}); err == nil {
		t.Error("a third connection of one key logged in, past MaxConnsPerKey 2")
	}
	if !strings.Contains(banner, "--ssh-max-conns-per-key") {
		t.Errorf("the login refused past MaxConnsPerKey was told %q, want the flag named", banner)
	}
	if got := refused(t, met, "per_key"); got != 1 {
		t.Errorf("refused per key: %d, want 1", got)
	}
	g.login(id, other)
	first.Close()
	eventually.True(t, "a closed connection's place free for its key", func() bool {
		c, err := g.dial(id, gossh.PublicKeys(key))
		if err == nil {
			c.Close()
		}
		return err == nil
	})
}

// TestConnsPerOrgCap: all of one organization's SSH keys together hold at
// most MaxConnsPerOrg authenticated connections, so registering more keys
// does not multiply MaxConnsPerKey; one more fails to log in and is
// counted, another organization still logs in, and a connection closed
// frees its place.
func TestConnsPerOrgCap(t *testing.T) {
	g, met := limited(t, setup{}, func(o *sshd.Options) { o.MaxConnsPerKey, o.MaxConnsPerOrg = 10, 2 })
	orgA, orgB := g.org("a"), g.org("b")
	first, _ := g.key(orgA)
	second, _ := g.key(orgA)
	third, _ := g.key(orgA)
	keyB, _ := g.key(orgB)
	idA, idB := g.sandbox(orgA, receipt.TransportSSH), g.sandbox(orgB, receipt.TransportSSH)

	c := g.login(idA, first)
	g.login(idA, second)
	if _, err := g.dial(idA, gossh.PublicKeys(third)); err == nil {
		t.Error("a third connection of one organization logged in with a third key, past MaxConnsPerOrg 2")
	}
	if got := refused(t, met, "per_org"); got != 1 {
		t.Errorf("refused per organization: %d, want 1", got)
	}
	g.login(idB, keyB)
	g.login(idB, keyB)
	c.Close()
	eventually.True(t, "a closed connection's place free for its organization", func() bool {
		c, err := g.dial(idA, gossh.PublicKeys(third))
		if err == nil {
			c.Close()
		}
		return err == nil
	})
}

// TestKeepAliveWithoutChannel: keepalives start at authentication, so an
// authenticated connection that never opens a channel and stops answering
// is closed.
func TestKeepAliveWithoutChannel(t *testing.T) {
	g := start(t, setup{keepAlive: 200 * time.Millisecond, keepAliveMax: 2})
	org := g.org("a")
	key, _ := g.key(org)
	id := g.sandbox(org, receipt.TransportSSH)
	conn, chans, reqs, err := g.raw(id, gossh.PublicKeys(key))
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		for nc := range chans {
			nc.Reject(gossh.Prohibited, "no")
		}
	}()
	asked := 0
	for req := range reqs {
		if req.Type == "keepalive@openssh.com" {
			asked++ // and never answered
		}
	}
	if err := conn.Wait(); errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatal("the gateway never closed an idle connection that stopped answering")
	}
	if asked == 0 || !strings.Contains(g.logs.String(), "stopped answering keepalives") {
		t.Errorf("closed after %d keepalives, not for want of answers", asked)
	}
}

// mute listens on 127.0.0.1:0 as a session helper that accepts and never
// speaks; accepted carries each connection it took.
func mute(t *testing.T) (port int, accepted <-chan net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ch := make(chan net.Conn, 64)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			ch <- c
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		<-done
		close(ch)
		for c := range ch {
			c.Close()
		}
	})
	return ln.Addr().(*net.TCPAddr).Port, ch
}

// TestHelperDialDeadline: the dial to a session helper that accepts and
// never speaks fails within HelperDialTimeout, for every -L channel waiting
// on it, and frees its session; a later channel dials again.
func TestHelperDialDeadline(t *testing.T) {
	port, accepted := mute(t)
	g, met := limited(t, setup{sessionPort: port}, func(o *sshd.Options) { o.HelperDialTimeout = time.Second })
	org := g.org("a")
	key, _ := g.key(org)
	id := g.sandbox(org, receipt.TransportSSH, receipt.TransportForward)
	c := g.login(id, key)

	errs := make(chan error, 2)
	for range 2 {
		go func() {
			_, err := forward(c, "127.0.0.1", 8080)
			errs <- err
		}()
	}
	for range 2 {
		var oce *gossh.OpenChannelError
		if err := <-errs; !errors.As(err, &oce) || oce.Reason != gossh.ConnectionFailed || !strings.Contains(oce.Message, "did not answer") {
			t.Errorf("-L through a helper that never speaks: %v, want connection failed, did not answer", err)
		}
	}
	if n := g.core.Sessions(); n != 0 {
		t.Errorf("%d sessions live after the dial failed", n)
	}
	if n := refused(t, met, "helper_dial_timeout"); n != 1 {
		t.Errorf("%d helper dials counted as timed out, want the 1 that was made", n)
	}
	helperSide := <-accepted
	closedByServer(t, helperSide, "the connection to a helper that never spoke")
	if _, err := forward(c, "127.0.0.1", 8080); err == nil {
		t.Fatal("-L through a helper that never speaks opened")
	}
	select {
	case <-accepted:
	default:
		t.Error("a channel after a failed dial did not dial again")
	}
}

// TestHelperDialAbandoned: a pending dial to a session helper that never
// speaks is abandoned when its client leaves, or when the core closes,
// freeing its session, so shutdown finds nothing open.
func TestHelperDialAbandoned(t *testing.T) {
	for _, tc := range []struct {
		name string
		// end ends the pending dial; the client leaves after it.
		end func(t *testing.T, g *gateway, c *gossh.Client)
	}{
		{"client leaves", func(_ *testing.T, _ *gateway, c *gossh.Client) { c.Close() }},
		{"shutdown", func(t *testing.T, g *gateway, _ *gossh.Client) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if err := g.core.Close(ctx); err != nil {
				t.Errorf("close the core with a dial pending: %v", err)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			port, accepted := mute(t)
			g, _ := limited(t, setup{sessionPort: port}, func(o *sshd.Options) { o.HelperDialTimeout = time.Hour })
			org := g.org("a")
			key, _ := g.key(org)
			id := g.sandbox(org, receipt.TransportSSH, receipt.TransportForward)
			c := g.login(id, key)

			errs := make(chan error, 2)
			for range 2 {
				go func() {
					_, err := forward(c, "127.0.0.1", 8080)
					errs <- err
				}()
			}
			helperSide := <-accepted
			eventually.True(t, "the pending dial's session admitted", func() bool { return g.core.Sessions() == 1 })
			tc.end(t, g, c)
			for range 2 {
				if err := <-errs; err == nil {
					t.Error("-L through a helper that never speaks opened")
				}
			}
			eventually.True(t, "the abandoned dial's session ended", func() bool { return g.core.Sessions() == 0 })
			closedByServer(t, helperSide, "the abandoned connection to the helper")
			c.Close()

			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if err := g.core.Close(ctx); err != nil {
				t.Errorf("close the core: %v", err)
			}
			if err := g.gw.Shutdown(ctx); err != nil {
				t.Errorf("shut the gateway down: %v", err)
			}
		})
	}
}

// TestChannelsPerConnCap: one connection holds at most MaxChannelsPerConn
// channels, sessions and -L channels together: each may hold an SSH window
// of data its client sent and nobody read, so without a cap one connection
// could hold any amount of the gateway's memory. Sessions that never start
// count. One past the cap is refused with the reason and counted, the
// connection stays, another connection has its own, and a channel closed
// frees its place.
func TestChannelsPerConnCap(t *testing.T) {
	g, met := limited(t, setup{sessionPort: 2223}, func(o *sshd.Options) { o.MaxChannelsPerConn = 3 })
	org := g.org("a")
	key, _ := g.key(org)
	id := g.sandbox(org, receipt.TransportSSH, receipt.TransportForward)
	c := g.login(id, key)
	var open []gossh.Channel
	for range 3 {
		ch, _, err := c.OpenChannel("session", nil)
		if err != nil {
			t.Fatalf("a session within the cap: %v", err)
		}
		open = append(open, ch)
	}
	for _, tc := range []struct {
		typ   string
		extra []byte
	}{
		{"session", nil},
		{"direct-tcpip", gossh.Marshal(directTCPIP{"localhost", 8080, "127.0.0.1", 40000})},
	} {
		_, _, err := c.OpenChannel(tc.typ, tc.extra)
		var oce *gossh.OpenChannelError
		if !errors.As(err, &oce) || oce.Reason != gossh.ResourceShortage || !strings.Contains(oce.Message, "too many channels") {
			t.Errorf("a %s channel past MaxChannelsPerConn 3: %v, want refused as too many channels", tc.typ, err)
		}
	}
	if got := refused(t, met, "channels_per_conn"); got != 2 {
		t.Errorf("channels refused per connection: %d, want 2", got)
	}
	// Another connection of the same key has places of its own.
	if got := run(t, g.login(id, key), "print"); got.Stdout != "out\n" {
		t.Errorf("a command on a second connection: %+v", got)
	}
	open[0].Close()
	eventually.True(t, "a closed channel's place free on its connection", func() bool {
		ch, _, err := c.OpenChannel("session", nil)
		if err == nil {
			ch.Close()
		}
		return err == nil
	})
}

// TestChannelsPerOrgCap: all of one organization's connections together
// hold at most MaxChannelsPerOrg channels, so that its many connections do
// not multiply MaxChannelsPerConn: one more, on any of them, is refused
// with the reason and counted; another organization opens its own, and a
// channel closed frees its place.
func TestChannelsPerOrgCap(t *testing.T) {
	g, met := limited(t, setup{}, func(o *sshd.Options) { o.MaxChannelsPerOrg = 3 })
	orgA, orgB := g.org("a"), g.org("b")
	keyA, _ := g.key(orgA)
	otherA, _ := g.key(orgA)
	keyB, _ := g.key(orgB)
	idA, idB := g.sandbox(orgA, receipt.TransportSSH), g.sandbox(orgB, receipt.TransportSSH)
	first, second := g.login(idA, keyA), g.login(idA, otherA)
	var open []gossh.Channel
	for _, c := range []*gossh.Client{first, first, second} {
		ch, _, err := c.OpenChannel("session", nil)
		if err != nil {
			t.Fatalf("a session within the organization's cap: %v", err)
		}
		open = append(open, ch)
	}
	for _, c := range []*gossh.Client{first, second, g.login(idA, keyA)} {
		_, _, err := c.OpenChannel("session", nil)
		var oce *gossh.OpenChannelError
		if !errors.As(err, &oce) || oce.Reason != gossh.ResourceShortage || !strings.Contains(oce.Message, "organization") {
			t.Errorf("a session past MaxChannelsPerOrg 3: %v, want refused naming the organization", err)
		}
	}
	if got := refused(t, met, "channels_per_org"); got != 3 {
		t.Errorf("channels refused per organization: %d, want 3", got)
	}
	if got := run(t, g.login(idB, keyB), "print"); got.Stdout != "out\n" {
		t.Errorf("a command of another organization: %+v", got)
	}
	open[2].Close()
	eventually.True(t, "a closed channel's place free for its organization", func() bool {
		ch, _, err := first.OpenChannel("session", nil)
		if err == nil {
			ch.Close()
		}
		return err == nil
	})
}
