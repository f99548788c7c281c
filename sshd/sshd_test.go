package sshd_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	gossh "golang.org/x/crypto/ssh"

	"github.com/hiloop/hiloop/cluster"
	"github.com/hiloop/hiloop/control"
	"github.com/hiloop/hiloop/control/controltest"
	"github.com/hiloop/hiloop/receipt"
	"github.com/hiloop/hiloop/sshd"
	"github.com/hiloop/hiloop/store"
)

// gateway is a real gateway on 127.0.0.1:0 over a real core and record (in
// t.TempDir()), with the cluster faked by controltest and the sandbox's
// workload by workload.
type gateway struct {
	t  *testing.T
	db *store.Store
	// dbPath is the database's file.
	dbPath string
	core   *control.Control
	fc     *controltest.Cluster
	gw     *sshd.Gateway
	addr   string
	host   gossh.PublicKey
	logs   *lockedBuffer

	adminsMu sync.Mutex
	// admins are a live API key of each organization, by its id.
	admins map[string]control.Caller
}

// setup is what a test changes of the gateway and its fakes.
type setup struct {
	keepAlive    time.Duration
	keepAliveMax int
	// sessionPort is the session helper's port that receipts promise.
	sessionPort int
	// limits are the core's.
	limits control.Limits
}

// clientDeadline bounds every client connection a test makes, so that a
// gateway that hangs fails the test instead of blocking it.
const clientDeadline = time.Minute

// start runs a gateway until the test ends; its clean-up drains it as serve
// does (the core's sessions first, then the server) and fails the test if
// that does not finish.
func start(t *testing.T, s setup) *gateway {
	t.Helper()
	ctx := context.Background()
	dbPath := filepath.Join(t.TempDir(), "h.db")
	db, err := store.Open(ctx, store.Options{Path: dbPath})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	logs := &lockedBuffer{}
	log := slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	fc := &controltest.Cluster{SessionPort: s.sessionPort}
	core, err := control.New(control.Options{Store: db, Cluster: fc, Exec: controltest.Exec{Run: workload},
		Caps: control.Capabilities{Transports: receipt.Transports()}, ClusterTimeout: 10 * time.Second, Log: log, Limits: s.limits})
	if err != nil {
		t.Fatal(err)
	}
	hostKey, err := db.HostKey(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// Penalties off: the tests of authentication make many failing logins
	// from one address on purpose. Penalties are tested on gateways of
	// their own (limits_test.go), which keep the defaults.
	gw, err := sshd.New(sshd.Options{Control: core, HostKey: hostKey, Log: log, KeepAlive: s.keepAlive, KeepAliveMax: s.keepAliveMax,
		Penalties: sshd.Penalties{Off: true}})
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
		if err := core.Close(ctx); err != nil {
			t.Errorf("close the core: %v", err)
		}
		if err := gw.Shutdown(ctx); err != nil {
			t.Errorf("shut the gateway down: %v", err)
		}
		if err := <-served; err != nil {
			t.Errorf("serve: %v", err)
		}
		if t.Failed() {
			t.Logf("gateway log:\n%s", logs)
		}
	})
	return &gateway{t: t, db: db, dbPath: dbPath, core: core, fc: fc, gw: gw, addr: ln.Addr().String(), host: hostKey.PublicKey(), logs: logs}
}

// org makes an organization.
func (g *gateway) org(name string) store.Org {
	g.t.Helper()
	o, err := g.db.CreateOrg(context.Background(), name, 10, 10)
	if err != nil {
		g.t.Fatal(err)
	}
	return o
}

// admin is a live API key of the organization, made on first use: the core
// checks the caller's key at every change, so the changes a test makes as
// the organization go through a key of its own that the test never revokes.
func (g *gateway) admin(o store.Org) control.Caller {
	g.t.Helper()
	g.adminsMu.Lock()
	defer g.adminsMu.Unlock()
	if who, ok := g.admins[o.ID]; ok {
		return who
	}
	k, _, err := g.db.CreateKey(context.Background(), o.ID, "admin")
	if err != nil {
		g.t.Fatal(err)
	}
	if g.admins == nil {
		g.admins = map[string]control.Caller{}
	}
	g.admins[o.ID] = control.Caller{OrgID: o.ID, KeyID: k.ID}
	return g.admins[o.ID]
}

// sandbox creates a sandbox of the organization with these transports
// through the core, and records it running, as the mirror would once its
// pod is up.
func (g *gateway) sandbox(o store.Org, transports ...receipt.Transport) string {
	g.t.Helper()
	ctx := context.Background()
	sb, _, err := g.core.Create(ctx, g.admin(o),
		control.CreateRequest{Spec: store.Spec{Image: "busybox", Transports: transports}})
	if err != nil {
		g.t.Fatal(err)
	}
	g.observe(sb.ID, store.StateRunning)
	return sb.ID
}

// observe records a sandbox's state, and its pod, as the mirror would.
func (g *gateway) observe(id string, st store.State) {
	g.t.Helper()
	if _, err := g.db.Observe(context.Background(), id, store.Observation{State: st, PodUID: controltest.PodUID(id)}); err != nil {
		g.t.Fatal(err)
	}
}

// key makes a key pair and registers its public key for the organization.
func (g *gateway) key(o store.Org) (gossh.Signer, store.SSHKey) {
	g.t.Helper()
	s := newSigner(g.t)
	k, err := g.core.AddSSHKey(context.Background(), g.admin(o), "k", s.PublicKey())
	if err != nil {
		g.t.Fatal(err)
	}
	return s, k
}

func newSigner(t *testing.T) gossh.Signer {
	t.Helper()
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	s, err := gossh.NewSignerFromKey(priv)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// raw connects to the gateway as user (a sandbox id) and leaves the
// connection's global requests and channels to the caller. The connection
// is closed when the test ends.
func (g *gateway) raw(user string, auth ...gossh.AuthMethod) (gossh.Conn, <-chan gossh.NewChannel, <-chan *gossh.Request, error) {
	g.t.Helper()
	return g.connect(gossh.ClientConfig{User: user, Auth: auth})
}

// connect is raw with the client's authentication configured by cfg.
func (g *gateway) connect(cfg gossh.ClientConfig) (gossh.Conn, <-chan gossh.NewChannel, <-chan *gossh.Request, error) {
	g.t.Helper()
	nc, err := net.Dial("tcp", g.addr)
	if err != nil {
		g.t.Fatal(err)
	}
	nc.SetDeadline(time.Now().Add(clientDeadline))
	cfg.HostKeyCallback = gossh.FixedHostKey(g.host)
	conn, chans, reqs, err := gossh.NewClientConn(nc, g.addr, &cfg)
	if err != nil {
		nc.Close()
		return nil, nil, nil, err
	}
	g.t.Cleanup(func() { conn.Close() })
	return conn, chans, reqs, nil
}

// dial connects as an ordinary client, which answers the gateway's
// keepalives.
func (g *gateway) dial(user string, auth ...gossh.AuthMethod) (*gossh.Client, error) {
	g.t.Helper()
	return g.client(g.raw(user, auth...))
}

func (g *gateway) client(conn gossh.Conn, chans <-chan gossh.NewChannel, reqs <-chan *gossh.Request, err error) (*gossh.Client, error) {
	if err != nil {
		return nil, err
	}
	return gossh.NewClient(conn, chans, reqs), nil
}

// login is dial with one key, which must get in.
func (g *gateway) login(user string, key gossh.Signer) *gossh.Client {
	g.t.Helper()
	c, err := g.dial(user, gossh.PublicKeys(key))
	if err != nil {
		g.t.Fatalf("login as %s: %v", user, err)
	}
	return c
}

// result is how a command ended, as a client sees it. Exit is
// "exit-status N", "exit-signal NAME MESSAGE", or empty when the channel
// closed with neither.
type result struct {
	Exit           string
	Stdout, Stderr string
}

// run runs cmd in a new session channel of c; see execute.
func run(t *testing.T, c *gossh.Client, cmd string) result {
	t.Helper()
	ch, reqs, err := c.OpenChannel("session", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	return execute(t, ch, reqs, cmd)
}

// execute runs cmd on an open session channel and reads its output and how
// it ended until the gateway closes the channel. Like the stock client, it
// takes the exit status whether or not the exec request was answered first:
// the gateway can close a session before it answers (see
// TestExecAnsweredBeforeClose), which x/crypto's Session.Run reports as EOF
// with the status lost.
func execute(t *testing.T, ch gossh.Channel, reqs <-chan *gossh.Request, cmd string) result {
	t.Helper()
	var out, errOut bytes.Buffer
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); io.Copy(&out, ch) }()
	go func() { defer wg.Done(); io.Copy(&errOut, ch.Stderr()) }()
	if _, err := ch.SendRequest("exec", false, gossh.Marshal(struct{ Command string }{cmd})); err != nil {
		t.Fatalf("exec %q: %v", cmd, err)
	}
	var exit string
	for req := range reqs {
		switch req.Type {
		case "exit-status":
			var st struct{ Status uint32 }
			if err := gossh.Unmarshal(req.Payload, &st); err != nil {
				t.Errorf("exit-status %x: %v", req.Payload, err)
			}
			exit = fmt.Sprintf("exit-status %d", st.Status)
		case "exit-signal":
			var sig struct {
				Signal     string
				CoreDumped bool
				Message    string
				Lang       string
			}
			if err := gossh.Unmarshal(req.Payload, &sig); err != nil {
				t.Errorf("exit-signal %x: %v", req.Payload, err)
			}
			exit = "exit-signal " + sig.Signal + " " + sig.Message
		}
		if req.WantReply {
			req.Reply(false, nil)
		}
	}
	wg.Wait()
	return result{Exit: exit, Stdout: out.String(), Stderr: errOut.String()}
}

// ended makes a result of what Session.Wait returned.
func ended(t *testing.T, err error, out, errOut string) result {
	t.Helper()
	r := result{Exit: "exit-status 0", Stdout: out, Stderr: errOut}
	var ee *gossh.ExitError
	switch {
	case errors.As(err, &ee) && ee.Signal() != "":
		r.Exit = "exit-signal " + ee.Signal() + " " + ee.Msg()
	case errors.As(err, &ee):
		r.Exit = fmt.Sprintf("exit-status %d", ee.ExitStatus())
	case err != nil:
		t.Fatalf("the session ended without an exit status: %v (stderr %q)", err, errOut)
	}
	return r
}

// echoSession is `cat` running in a session: a line written to it comes
// back while the session is live.
type echoSession struct {
	sess   *gossh.Session
	in     io.WriteCloser
	out    *bufio.Reader
	errOut *lockedBuffer
}

func startEcho(t *testing.T, c *gossh.Client) *echoSession {
	t.Helper()
	sess, err := c.NewSession()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sess.Close() })
	in, err := sess.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := sess.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	e := &echoSession{sess: sess, in: in, out: bufio.NewReader(out), errOut: &lockedBuffer{}}
	sess.Stderr = e.errOut
	if err := sess.Start("cat"); err != nil {
		t.Fatal(err)
	}
	e.roundTrip(t, "started")
	return e
}

// roundTrip fails the test unless the line comes back: only a live session
// echoes.
func (e *echoSession) roundTrip(t *testing.T, line string) {
	t.Helper()
	if _, err := io.WriteString(e.in, line+"\n"); err != nil {
		t.Fatalf("write %q: %v", line, err)
	}
	got, err := e.out.ReadString('\n')
	if err != nil || got != line+"\n" {
		t.Fatalf("echo of %q: %q, %v (stderr %q)", line, got, err, e.errOut)
	}
}

// wait waits for the session to end and returns how.
func (e *echoSession) wait(t *testing.T) result {
	t.Helper()
	err := e.sess.Wait()
	rest, _ := io.ReadAll(e.out)
	return ended(t, err, string(rest), e.errOut.String())
}

// workload stands in for the sandbox's workload container behind exec. The
// gateway runs `/bin/sh -c <wrapper> $0` for a shell and `/bin/sh -c
// <wrapper> $0 <command>` for a command; workload runs the command:
//
//	exit N               exits N
//	signal N DESCRIPTION dies of a signal, as the exec API reports it (128+n)
//	print                writes "out" to stdout and "err" to stderr
//	tty                  prints whether it has a terminal, and $0 (TERM)
//	cat                  echoes stdin line by line while the session is live
//	nostatus             the stream ends without a status frame
//	unreachable          the stream cannot be set up
//
// A shell (no command) prints whether it has a terminal and TERM, then the
// first two terminal sizes it is given, and exits 0. Anything long-running
// ends, as a real stream does, when its context ends.
func workload(ctx context.Context, req cluster.ExecRequest) (cluster.ExitStatus, error) {
	if len(req.Command) < 4 || req.Command[0] != "/bin/sh" || req.Command[1] != "-c" {
		return cluster.ExitStatus{}, fmt.Errorf("unexpected argv %q", req.Command)
	}
	if len(req.Command) == 4 {
		return shell(ctx, req)
	}
	name, args, _ := strings.Cut(req.Command[4], " ")
	switch name {
	case "exit":
		code, err := strconv.Atoi(args)
		return cluster.ExitStatus{Code: code}, err
	case "signal":
		n, desc, _ := strings.Cut(args, " ")
		code, err := strconv.Atoi(n)
		return cluster.ExitStatus{Code: code, Signal: desc}, err
	case "print":
		io.WriteString(req.Stdout, "out\n")
		io.WriteString(req.Stderr, "err\n")
		return cluster.ExitStatus{}, nil
	case "tty":
		fmt.Fprintf(req.Stdout, "tty=%v $0=%s\n", req.TTY, req.Command[3])
		return cluster.ExitStatus{}, nil
	case "cat":
		return cat(ctx, req)
	case "nostatus":
		return cluster.ExitStatus{}, cluster.ErrNoStatus
	case "unreachable":
		return cluster.ExitStatus{}, &cluster.ConnectError{Err: errors.New("dial tcp 10.96.0.1:443: connect: connection refused")}
	}
	return cluster.ExitStatus{Code: 127}, nil
}

func shell(ctx context.Context, req cluster.ExecRequest) (cluster.ExitStatus, error) {
	fmt.Fprintf(req.Stdout, "tty=%v TERM=%s\n", req.TTY, req.Command[3])
	for range 2 {
		select {
		case size, ok := <-req.Resize:
			if !ok {
				return cluster.ExitStatus{}, errors.New("resize closed")
			}
			fmt.Fprintf(req.Stdout, "%dx%d\n", size.Width, size.Height)
		case <-ctx.Done():
			return cluster.ExitStatus{}, ctx.Err()
		}
	}
	return cluster.ExitStatus{}, nil
}

// cat echoes each line, unless its context ended before the line came: a
// line echoed after something ended the session would prove nothing.
func cat(ctx context.Context, req cluster.ExecRequest) (cluster.ExitStatus, error) {
	lines := make(chan string)
	done := make(chan struct{})
	defer close(done)
	go func() {
		defer close(lines)
		br := bufio.NewReader(req.Stdin)
		for {
			l, err := br.ReadString('\n')
			if l != "" {
				select {
				case lines <- l:
				case <-done:
					return
				}
			}
			if err != nil {
				return
			}
		}
	}()
	for {
		select {
		case <-ctx.Done():
			return cluster.ExitStatus{}, ctx.Err()
		case l, ok := <-lines:
			if !ok {
				return cluster.ExitStatus{}, nil
			}
			if ctx.Err() != nil {
				return cluster.ExitStatus{}, ctx.Err()
			}
			io.WriteString(req.Stdout, l)
		}
	}
}

// lockedBuffer is a buffer written from several goroutines: the gateway's
// and the core's log, shown when a test fails, and a session's stderr.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
