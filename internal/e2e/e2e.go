// Package e2e is the shared end-to-end harness: it wraps the local cluster
// of localcluster for tests, builds the hiloop binary, starts hiloop
// against the cluster, and runs the CLI as a user does. hiloop starts
// in-process (ServeInProcess: package app on 127.0.0.1:0, in the spirit of
// net/http/httptest), or as the `hiloop serve` process a user runs (Serve),
// for a test of the process itself: its signals, its exit, its output, a
// kill. Either way the test gets an Instance with the addresses hiloop
// bound, as values (app.Addrs, or serve's --addr-file), and the admin key.
// The end-to-end tests in e2e/ use it, as do the other packages' cluster
// tests; a test that needs no cluster starts none, since the shared cluster
// starts on first use.
package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/alecthomas/kong"
	"k8s.io/klog/v2"

	"github.com/hiloop/hiloop/app"
	"github.com/hiloop/hiloop/internal/eventually"
	"github.com/hiloop/hiloop/localcluster"
	"github.com/hiloop/hiloop/store"
)

var (
	sharedOnce    sync.Once
	shared        *localcluster.Cluster
	sharedErr     error
	binOnce       sync.Once
	binPath       string
	binErr        error
	binDir        string
	clusterBudget = 3 * time.Minute
)

// Main runs the tests of a package that uses the shared cluster or the
// binary, and tears both down after: call it from TestMain as
// os.Exit(e2e.Main(m)).
func Main(m *testing.M) int {
	quietClientGo()
	code := m.Run()
	helpersStop()
	if shared != nil {
		if err := shared.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, "stop cluster:", err)
		}
	}
	if binDir != "" {
		os.RemoveAll(binDir)
	}
	return code
}

// SharedCluster is the package's one local cluster, started on first use
// and stopped by Main.
func SharedCluster(t testing.TB) *localcluster.Cluster {
	t.Helper()
	sharedOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), clusterBudget)
		defer cancel()
		shared, sharedErr = localcluster.Start(ctx, localcluster.Options{Log: os.Stderr})
		if sharedErr != nil && shared != nil {
			shared.Stop()
			shared = nil
		}
	})
	if sharedErr != nil {
		t.Fatalf("start cluster: %v", sharedErr)
	}
	return shared
}

// NewRealCluster starts a cluster with a real node, whose pods run under
// gVisor on this machine, for the test alone, and stops it in t.Cleanup:
// one real node runs per machine, so it is held no longer than its test
// needs it, and it waits for another test process's to stop. A machine
// where hiloop cannot run one skips the test when not root, and fails it
// when root (as CI runs): there, a real node is what is under test.
func NewRealCluster(t testing.TB, opts ...func(*localcluster.Options)) *localcluster.Cluster {
	t.Helper()
	bin := Binary(t)
	if err := localcluster.RealNodeSupported(os.Getenv("HILOOP_CLUSTER_BIN")); err != nil {
		if os.Geteuid() != 0 {
			t.Skipf("no real node on this machine: %v", err)
		}
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), realClusterBudget)
	defer cancel()
	o := localcluster.Options{Log: testLog{t}, RealNode: true, HiloopBinary: bin}
	for _, opt := range opts {
		opt(&o)
	}
	c, err := localcluster.Start(ctx, o)
	if c != nil {
		t.Cleanup(func() {
			if err := c.Stop(); err != nil {
				t.Errorf("stop cluster: %v", err)
			}
		})
	}
	if err != nil {
		t.Fatalf("start the real node's cluster: %v", err)
	}
	return c
}

// realClusterBudget covers waiting for another test process's real node
// and starting this one.
const realClusterBudget = 30 * time.Minute

// NewCluster starts a cluster of the test's own and stops it in t.Cleanup.
func NewCluster(t testing.TB) *localcluster.Cluster {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), clusterBudget)
	defer cancel()
	c, err := localcluster.Start(ctx, localcluster.Options{Log: testLog{t}})
	if c != nil {
		t.Cleanup(func() {
			if err := c.Stop(); err != nil {
				t.Errorf("stop cluster: %v", err)
			}
		})
	}
	if err != nil {
		t.Fatalf("start cluster: %v", err)
	}
	return c
}

type testLog struct{ t testing.TB }

func (l testLog) Write(p []byte) (int, error) {
	l.t.Logf("%s", bytes.TrimRight(p, "\n"))
	return len(p), nil
}

var (
	helpersOnce sync.Once
	helpersDir  string
	helpersStop = func() {}
	helpersDone = make(chan struct{})
)

// Helpers runs the local cluster's session helpers (localcluster.RunHelpers)
// for the shared cluster, once per test process, and returns the directory
// that holds each helper's key file and log (helpers/<pod uid>/).
func Helpers(t testing.TB) string {
	t.Helper()
	c := SharedCluster(t)
	bin := Binary(t)
	helpersOnce.Do(func() {
		helpersDir = filepath.Join(c.Workdir, "e2e-helpers")
		ctx, cancel := context.WithCancel(context.Background())
		helpersStop = func() { cancel(); <-helpersDone }
		go func() {
			defer close(helpersDone)
			localcluster.RunHelpers(ctx, localcluster.HelperOptions{Clients: c.Clients, Binary: bin, Dir: helpersDir})
		}()
	})
	return helpersDir
}

var (
	rootOnce sync.Once
	root     string
	rootErr  error
)

// moduleRoot is the directory of hiloop's go.mod, as the go command finds it
// from the working directory (a test runs in its package's directory).
func moduleRoot() (string, error) {
	rootOnce.Do(func() {
		out, err := exec.Command("go", "env", "GOMOD").Output()
		if err != nil {
			rootErr = fmt.Errorf("go env GOMOD: %w", err)
			return
		}
		gomod := strings.TrimSpace(string(out))
		if gomod == "" || gomod == os.DevNull {
			rootErr = errors.New("go env GOMOD: not inside hiloop's module")
			return
		}
		root = filepath.Dir(gomod)
	})
	return root, rootErr
}

// Path is the repository's file or directory at rel, a slash-separated path
// from the module root such as "deploy/chart", whatever the test's working
// directory.
func Path(t testing.TB, rel string) string {
	t.Helper()
	dir, err := moduleRoot()
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Join(dir, filepath.FromSlash(rel))
}

// Binary builds the hiloop binary once per test process and returns its path.
// HILOOP_E2E_BINARY names one built already instead, for a profiler that
// needs the binary to outlive the run.
func Binary(t testing.TB) string {
	t.Helper()
	binOnce.Do(func() {
		if binPath = os.Getenv("HILOOP_E2E_BINARY"); binPath != "" {
			return
		}
		var dir string
		if dir, binErr = moduleRoot(); binErr != nil {
			return
		}
		if binDir, binErr = os.MkdirTemp("", "hiloop-e2e-"); binErr != nil {
			return
		}
		binPath = filepath.Join(binDir, "hiloop")
		build := exec.Command("go", "build", "-o", binPath, ".")
		build.Dir = dir
		build.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := build.CombinedOutput(); err != nil {
			binErr = fmt.Errorf("build hiloop: %v\n%s", err, out)
		}
	})
	if binErr != nil {
		t.Fatal(binErr)
	}
	return binPath
}

// NewNamespace makes a fresh sandbox namespace in the shared cluster, with
// the chart's sandbox-namespace objects (Pod Security labels, quota,
// NetworkPolicy, hiloop's Role), so hiloop's self-check passes there.
func NewNamespace(t testing.TB) string {
	t.Helper()
	return NamespaceOn(t, SharedCluster(t))
}

// NamespaceOn is NewNamespace in cluster c.
func NamespaceOn(t testing.TB, c *localcluster.Cluster) string {
	t.Helper()
	ns := "t-" + strings.ToLower(strings.ReplaceAll(store.NewID("n")[2:], "_", ""))[:10]
	if err := c.AddSandboxNamespace(context.Background(), ns); err != nil {
		t.Fatal(err)
	}
	return ns
}

// Instance is one hiloop, in-process (ServeInProcess) or a `hiloop serve`
// process (Serve), with its own database and namespace.
type Instance struct {
	t   testing.TB
	URL string
	// Token is the admin org's key, from the bootstrap key file serve
	// writes on first start; NewKey says this start wrote it (a start on a
	// bootstrapped record leaves the file as it was).
	Token   string
	NewKey  bool
	KeyFile string
	DB      string
	NS      string
	// SSHAddr is the SSH gateway's host:port.
	SSHAddr string
	// MetricsURL is the metrics endpoint, when serve was started with one.
	MetricsURL string
	// Out is what the process wrote, stdout and stderr; in-process, the
	// log.
	Out *SyncBuffer
	// Cmd is the serve process; nil in-process.
	Cmd  *exec.Cmd
	done chan error
	// HTTP makes the API calls; http.DefaultClient when nil.
	HTTP *http.Client
	// stop ends an in-process hiloop and waits for it, once.
	stop func()
}

// KeepAlive is an HTTP client that keeps up to 512 idle connections to a
// server, for benchmarks that make hundreds of calls at once: the default
// client keeps two, so each such burst would dial anew nearly every
// connection, a cost of the client's own that competes for the same CPU.
// Tests that kill and restart a server on one address keep the default.
func KeepAlive() *http.Client {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.MaxIdleConns, t.MaxIdleConnsPerHost = 512, 512
	return &http.Client{Transport: t}
}

// TokenRE finds a printed key (serve prints the first admin key only on a
// terminal; org create and key create print theirs).
var TokenRE = regexp.MustCompile(`HILOOP_TOKEN=(hl_\S+)`)

// Serve starts a `hiloop serve` process against the shared cluster and
// waits for /readyz. A test that does not need the process itself (its
// signals, exit, output, or a kill) uses ServeInProcess.
func Serve(t testing.TB, db, ns string, args ...string) *Instance {
	t.Helper()
	return ServeOn(t, SharedCluster(t), db, ns, args...)
}

// newInstance is an Instance for db and ns, not started, with the key file
// args name, and serve's flags for cluster c: args after the harness's
// own, which they override.
func newInstance(t testing.TB, c *localcluster.Cluster, db, ns string, args []string) (in *Instance, flags []string) {
	t.Helper()
	in = &Instance{t: t, DB: db, NS: ns, KeyFile: db + ".admin-key", Out: &SyncBuffer{}, done: make(chan error, 1)}
	for i, a := range args {
		if a == "--bootstrap-key-file" && i+1 < len(args) {
			in.KeyFile = args[i+1]
		} else if f, ok := strings.CutPrefix(a, "--bootstrap-key-file="); ok {
			in.KeyFile = f
		}
	}
	if !slices.ContainsFunc(args, func(a string) bool { return strings.HasPrefix(a, "--boundary-file") }) {
		args = append([]string{"--boundary-file", LocalBoundary(t)}, args...)
	}
	// kwok's pods run exec commands on this machine, so an attestation
	// would see its kernel and quarantine every sandbox: it is off unless
	// a test asks for it, or the cluster's node is real.
	if !c.Real && !slices.ContainsFunc(args, func(a string) bool { return strings.Contains(a, "runtime-attestation") }) {
		args = append([]string{"--no-runtime-attestation"}, args...)
	}
	return in, append([]string{"--listen", "127.0.0.1:0", "--db", db, "--kubeconfig", c.Kubeconfig,
		"--namespace", ns, "--storage-classes", "kwok-volume", "--cluster-timeout", "5s", "--ssh-listen", "127.0.0.1:0"}, args...)
}

// readKey reads the admin key from the key file; NewKey says it is not the
// one the file held before the start.
func (in *Instance) readKey(before []byte) {
	if key, err := os.ReadFile(in.KeyFile); err == nil {
		in.Token, in.NewKey = strings.TrimSpace(string(key)), string(key) != string(before)
	}
}

// setAddrs takes the addresses hiloop bound.
func (in *Instance) setAddrs(addrs app.Addrs) {
	in.URL, in.SSHAddr = "http://"+addrs.API, addrs.SSH
	if addrs.Metrics != "" {
		in.MetricsURL = "http://" + addrs.Metrics + "/metrics"
	}
}

// waitReady waits for /readyz to answer 200.
func (in *Instance) waitReady() {
	in.t.Helper()
	eventually.Within(in.t, "/readyz 200", 30*time.Second, func() (bool, error) {
		resp, err := http.Get(in.URL + "/readyz")
		if err != nil {
			return false, err
		}
		resp.Body.Close()
		return resp.StatusCode == 200, fmt.Errorf("status %d", resp.StatusCode)
	})
}

// ServeOn is Serve against cluster c. serve writes the addresses it bound
// to its --addr-file, which ServeOn reads.
func ServeOn(t testing.TB, c *localcluster.Cluster, db, ns string, args ...string) *Instance {
	t.Helper()
	in, flags := newInstance(t, c, db, ns, args)
	before, _ := os.ReadFile(in.KeyFile)
	addrFile := filepath.Join(t.TempDir(), "addrs.json")
	full := append([]string{"serve", "--addr-file", addrFile}, flags...)
	in.Cmd = exec.Command(Binary(t), full...)
	// A killed test run takes its servers with it.
	in.Cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	in.Cmd.Stdout, in.Cmd.Stderr = in.Out, in.Out
	if err := in.Cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { in.done <- in.Cmd.Wait() }()
	t.Cleanup(func() {
		in.Stop()
		if t.Failed() {
			t.Logf("serve's log, its last %d bytes:\n%s", failedLogTail, tail(in.Out.String(), failedLogTail))
		}
	})
	var addrs app.Addrs
	eventually.Within(t, "serve's --addr-file", 30*time.Second, func() (bool, error) {
		select {
		case err := <-in.done:
			in.done <- err // for Stop
			t.Fatalf("serve exited before serving (%v):\n%s", err, in.Out.String())
		default:
		}
		raw, err := os.ReadFile(addrFile)
		if err != nil {
			return false, err
		}
		return true, json.Unmarshal(raw, &addrs)
	})
	if addrs.API == "" {
		t.Fatalf("serve's --addr-file names no API address")
	}
	in.setAddrs(addrs)
	// The key file is written before the addresses are.
	in.readKey(before)
	in.waitReady()
	return in
}

// ServeInProcess starts hiloop in this process against the shared cluster,
// as `hiloop serve args...` would (package app, with serve's flags parsed
// as serve parses them, the environment's HILOOP_* included), on
// 127.0.0.1:0, and waits for /readyz. Its log goes to Out. Stop, called in
// t.Cleanup, drains it as serve does on SIGINT and waits until every part
// has stopped.
func ServeInProcess(t testing.TB, db, ns string, args ...string) *Instance {
	t.Helper()
	return ServeInProcessOn(t, SharedCluster(t), db, ns, args...)
}

// ServeInProcessOn is ServeInProcess against cluster c.
func ServeInProcessOn(t testing.TB, c *localcluster.Cluster, db, ns string, args ...string) *Instance {
	t.Helper()
	in, flags := newInstance(t, c, db, ns, args)
	var cfg app.Config
	parser, err := kong.New(&cfg, kong.Name("hiloop serve"), kong.Vars(app.Vars()))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := parser.Parse(flags); err != nil {
		t.Fatalf("serve's flags %q: %v", args, err)
	}
	before, _ := os.ReadFile(in.KeyFile)
	quietClientGo()
	var level slog.Level
	level.UnmarshalText([]byte(cfg.LogLevel))
	log := slog.New(slog.NewTextHandler(in.Out, &slog.HandlerOptions{Level: level}))
	ctx, cancel := context.WithCancel(context.Background())
	a, err := app.New(ctx, app.Options{Config: cfg, Log: log, Stdout: in.Out})
	if err != nil {
		cancel()
		t.Fatalf("start hiloop: %v\n%s", err, in.Out.String())
	}
	go func() { in.done <- a.Run(ctx) }()
	var once sync.Once
	in.stop = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-in.done:
				if err != nil {
					in.t.Errorf("hiloop did not stop cleanly: %v", err)
				}
			case <-time.After(cfg.ShutdownTimeout + 30*time.Second):
				in.t.Errorf("hiloop did not stop within its shutdown timeout")
			}
		})
	}
	t.Cleanup(func() {
		in.Stop()
		if t.Failed() {
			t.Logf("hiloop's log, its last %d bytes:\n%s", failedLogTail, tail(in.Out.String(), failedLogTail))
		}
	})
	in.setAddrs(a.Addrs())
	in.readKey(before)
	in.waitReady()
	return in
}

var quietOnce sync.Once

// quietClientGo keeps client-go's own logging (klog, one for the whole
// process) at warnings and above, as serve does: its info lines, such as
// the API server's Pod Security warnings on the self-check's probes, are
// not the test's.
func quietClientGo() {
	quietOnce.Do(func() {
		klog.SetSlogLogger(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})).With("component", "client-go"))
	})
}

// Attach is an Instance for a server the test started otherwise (hiloop
// dev), for its CLI and API helpers; Stop does nothing to it.
func Attach(t testing.TB, url, token string) *Instance {
	return &Instance{t: t, URL: url, Token: token, stop: func() {}}
}

// Stop stops hiloop and waits until it has: an in-process one drains as
// serve does on SIGINT; a process gets SIGINT and must exit cleanly.
func (in *Instance) Stop() {
	if in.stop != nil {
		in.stop()
		return
	}
	if in.Cmd.ProcessState != nil {
		return
	}
	in.Cmd.Process.Signal(os.Interrupt)
	select {
	case err := <-in.done:
		if err != nil {
			in.t.Errorf("serve did not exit cleanly: %v\n%s", err, in.Out.String())
		}
	case <-time.After(30 * time.Second):
		in.Cmd.Process.Kill()
		in.t.Errorf("serve did not stop on SIGINT")
	}
}

// Signal sends sig and waits up to timeout for the process to exit,
// returning its exit error; only for a process (Serve).
func (in *Instance) Signal(sig os.Signal, timeout time.Duration) error {
	if in.Cmd == nil {
		in.t.Fatal("Signal: hiloop runs in-process; start it with Serve to signal it")
	}
	in.Cmd.Process.Signal(sig)
	select {
	case err := <-in.done:
		return err
	case <-time.After(timeout):
		in.Cmd.Process.Kill()
		return fmt.Errorf("serve did not exit within %s of %v", timeout, sig)
	}
}

// Env is the environment the CLI runs with against the instance.
func (in *Instance) Env(token string) []string {
	return append(os.Environ(), "HILOOP_URL="+in.URL, "HILOOP_TOKEN="+token, "HILOOP_DB="+in.DB)
}

// CLI runs the hiloop binary as a user would, against the instance.
func (in *Instance) CLI(token string, args ...string) (stdout, stderr string, code int) {
	in.t.Helper()
	return in.CLIInput(token, "", args...)
}

// CLIInput is CLI with stdin.
func (in *Instance) CLIInput(token, stdin string, args ...string) (stdout, stderr string, code int) {
	in.t.Helper()
	cmd := exec.Command(Binary(in.t), args...)
	cmd.Env = in.Env(token)
	cmd.Stdin = strings.NewReader(stdin)
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err := cmd.Run()
	if err != nil {
		ee, ok := err.(*exec.ExitError)
		if !ok {
			in.t.Fatalf("run hiloop %v: %v", args, err)
		}
		code = ee.ExitCode()
	}
	return o.String(), e.String(), code
}

// MustCLI runs the CLI and fails the test on a non-zero exit.
func (in *Instance) MustCLI(token string, args ...string) string {
	in.t.Helper()
	out, errOut, code := in.CLI(token, args...)
	if code != 0 {
		in.t.Fatalf("hiloop %s: exit %d\n%s%s", strings.Join(args, " "), code, out, errOut)
	}
	return out
}

// Sandbox is the part of the API's sandbox the tests read.
type Sandbox struct {
	ID         string   `json:"id"`
	State      string   `json:"state"`
	Anomaly    string   `json:"anomaly"`
	Reason     string   `json:"reason"`
	ExitCode   *int     `json:"exit_code"`
	Desired    string   `json:"desired"`
	Expires    *string  `json:"expires_at"`
	Transports []string `json:"transports"`
	Isolation  string   `json:"isolation"`
	// RuntimeObserved and KernelRelease are what runtime attestation
	// saw inside the sandbox's pod.
	RuntimeObserved string `json:"runtime_observed"`
	KernelRelease   string `json:"kernel_release"`
}

// Create makes a sandbox through the CLI.
func (in *Instance) Create(token string, args ...string) Sandbox {
	in.t.Helper()
	out := in.MustCLI(token, append([]string{"sandbox", "create", "-o", "json"}, args...)...)
	var sb Sandbox
	if err := json.Unmarshal([]byte(out), &sb); err != nil {
		in.t.Fatalf("create output %q: %v", out, err)
	}
	return sb
}

// Get reads a sandbox through the API.
func (in *Instance) Get(token, id string) Sandbox {
	in.t.Helper()
	var sb Sandbox
	status, body := in.Call(token, "GET", "/v1/sandboxes/"+id, "")
	if status != 200 {
		in.t.Fatalf("get %s: %d %s", id, status, body)
	}
	json.Unmarshal([]byte(body), &sb)
	return sb
}

// WaitState waits until the record says state.
func (in *Instance) WaitState(token, id, state string) Sandbox {
	in.t.Helper()
	var sb Sandbox
	eventually.Within(in.t, id+" "+state, 60*time.Second, func() (bool, error) {
		sb = in.Get(token, id)
		return sb.State == state, fmt.Errorf("state %s/%s: %s", sb.State, sb.Anomaly, sb.Reason)
	})
	return sb
}

// Call makes one raw HTTP request and returns status and body.
func (in *Instance) Call(token, method, path, body string, headers ...string) (int, string) {
	in.t.Helper()
	status, _, b := in.CallFull(token, method, path, body, headers...)
	return status, b
}

// CallFull is Call that returns the response headers too.
func (in *Instance) CallFull(token, method, path, body string, headers ...string) (int, http.Header, string) {
	in.t.Helper()
	status, h, b, err := in.TryCall(token, method, path, body, headers...)
	if err != nil {
		in.t.Fatal(err)
	}
	return status, h, b
}

// TryCall is CallFull that returns a transport error instead of failing the
// test, for calls to a server that may be killed under them.
func (in *Instance) TryCall(token, method, path, body string, headers ...string) (int, http.Header, string, error) {
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, in.URL+path, rd)
	if err != nil {
		return 0, nil, "", err
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	client := in.HTTP
	if client == nil {
		client = http.DefaultClient
	}
	resp, err := client.Do(req)
	if err != nil {
		return 0, nil, "", err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, string(b), nil
}

// NewOrg creates an organization offline against the live database file,
// as an operator would, and returns its key.
func (in *Instance) NewOrg(name string, maxSandboxes, maxRunning int) string {
	in.t.Helper()
	out := in.MustCLI("", "org", "create", name, "--max-sandboxes", fmt.Sprint(maxSandboxes), "--max-running", fmt.Sprint(maxRunning))
	m := TokenRE.FindStringSubmatch(out)
	if m == nil {
		in.t.Fatalf("org create printed no key: %q", out)
	}
	return m[1]
}

// Kubectl runs kubectl against the shared cluster and fails the test on
// error.
func Kubectl(t testing.TB, args ...string) string {
	t.Helper()
	out, err := SharedCluster(t).Kubectl(context.Background(), args...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// WithoutAdmission lifts a sandbox namespace's admission (the chart's
// policies, whose bindings select the namespace by name, and Pod Security)
// until the returned func restores it. A test plays with it an attacker who
// got past admission, whom the mirror must still catch. hiloop's self-check
// would see the gap: the instance serving ns must run with a
// --self-check-interval longer than the test.
func WithoutAdmission(t testing.TB, ns string) (restore func()) {
	t.Helper()
	return WithoutAdmissionOn(t, SharedCluster(t), ns)
}

// WithoutAdmissionOn is WithoutAdmission in cluster c.
func WithoutAdmissionOn(t testing.TB, c *localcluster.Cluster, ns string) (restore func()) {
	t.Helper()
	kubectl := func(args ...string) {
		if _, err := c.Kubectl(context.Background(), args...); err != nil {
			t.Fatal(err)
		}
	}
	kubectl("label", "namespace", ns, "pod-security.kubernetes.io/enforce-")
	if err := c.BindNamespace(context.Background(), ns, false); err != nil {
		t.Fatal(err)
	}
	return func() {
		kubectl("label", "namespace", ns, "pod-security.kubernetes.io/enforce=baseline")
		if err := c.BindNamespace(context.Background(), ns, true); err != nil {
			t.Fatal(err)
		}
	}
}

// LocalBoundary is the local cluster's rendering of the chart
// (values-local.yaml), which serve's and doctor's self-check hold the local
// cluster to (--boundary-file); ServeOn passes it unless told another.
func LocalBoundary(t testing.TB) string {
	t.Helper()
	return Path(t, "localcluster/assets/boundary.yaml")
}

// SyncBuffer is a bytes.Buffer that may be read while a process or
// goroutine writes to it.
type SyncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *SyncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

// String returns what was written so far.
func (s *SyncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// failedLogTail is how much of serve's log a failed test shows.
const failedLogTail = 16 << 10

// tail is the last n bytes of s.
func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[len(s)-n:]
}

var requestIDField = regexp.MustCompile(`"request_id": "[^"]*"`)

// WithoutRequestID is an error body with its request id blanked, so two
// answers can be compared byte for byte: every request has its own id.
func WithoutRequestID(body string) string {
	return requestIDField.ReplaceAllString(body, `"request_id": ""`)
}

// FreeAddr is a loopback address with a port that was free a moment ago,
// for a process the test starts to listen on.
func FreeAddr(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// WaitListening waits until something accepts TCP connections on addr.
func WaitListening(t testing.TB, what, addr string) {
	t.Helper()
	eventually.Within(t, what, 20*time.Second, func() (bool, error) {
		c, err := net.Dial("tcp", addr)
		if err == nil {
			c.Close()
		}
		return err == nil, err
	})
}

// Terminal is a program running in a tmux window of a given size, read and
// typed into as a person would.
type Terminal struct {
	t    testing.TB
	name string
}

// Tmux runs cmdline in a detached tmux session of width x height and kills
// it at the end of the test.
func Tmux(t testing.TB, width, height int, cmdline string) *Terminal {
	t.Helper()
	if _, err := exec.LookPath("tmux"); err != nil {
		t.Fatal("tmux is not installed")
	}
	term := &Terminal{t: t, name: fmt.Sprintf("hiloop-%d-%s", os.Getpid(), strings.ToLower(store.NewID("t")[2:10]))}
	term.run("-f", "/dev/null", "new-session", "-d", "-s", term.name, "-x", fmt.Sprint(width), "-y", fmt.Sprint(height), cmdline)
	term.run("set-option", "-t", term.name, "status", "off")
	t.Cleanup(func() { exec.Command("tmux", "-L", term.name, "kill-server").Run() })
	return term
}

func (term *Terminal) run(args ...string) string {
	term.t.Helper()
	out, err := exec.Command("tmux", append([]string{"-L", term.name}, args...)...).CombinedOutput()
	if err != nil {
		term.t.Fatalf("tmux %v: %v %s", args, err, out)
	}
	return string(out)
}

// Screen is what the window shows now.
func (term *Terminal) Screen() string { return term.run("capture-pane", "-p", "-t", term.name) }

// Type types a line and Enter.
func (term *Terminal) Type(line string) { term.run("send-keys", "-t", term.name, line, "Enter") }

// Resize resizes the window.
func (term *Terminal) Resize(width, height int) {
	term.run("resize-window", "-t", term.name, "-x", fmt.Sprint(width), "-y", fmt.Sprint(height))
}
