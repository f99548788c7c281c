package main_test

// End-to-end tests: the built hiloop binary, run as a user runs it, against
// the real local cluster of k8s/k8stest.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/hiloop/hiloop/k8s/k8stest"
	"github.com/hiloop/hiloop/store"
)

var (
	hiloopBin string
	cluster   *k8stest.Cluster
)

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	dir, err := os.MkdirTemp("", "hiloop-e2e-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	hiloopBin = filepath.Join(dir, "hiloop")
	build := exec.Command("go", "build", "-o", hiloopBin, ".")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "build hiloop: %v\n%s", err, out)
		return 1
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c, err := k8stest.Start(ctx, k8stest.Options{Log: os.Stderr})
	if c != nil {
		defer c.Stop()
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "start cluster: %v\n", err)
		return 1
	}
	cluster = c
	return m.Run()
}

// instance is one `hiloop serve` process with its own database and namespace.
type instance struct {
	t     testing.TB
	URL   string
	Token string // the admin org's key, printed on first start
	DB    string
	NS    string
	cmd   *exec.Cmd
	out   *k8stest.SyncBuffer
	done  chan error
}

var servingRE = regexp.MustCompile(`serving on (http://\S+)`)
var tokenRE = regexp.MustCompile(`HILOOP_TOKEN=(hl_\S+)`)

// newNamespace makes a fresh sandbox namespace for one test.
func newNamespace(t testing.TB) string {
	t.Helper()
	ns := "t-" + strings.ToLower(strings.ReplaceAll(store.NewID("n")[2:], "_", ""))[:10]
	_, err := cluster.Clients.Kube.CoreV1().Namespaces().Create(context.Background(),
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return ns
}

// serve starts hiloop serve against the cluster and waits for /readyz.
func serve(t testing.TB, db, ns string, args ...string) *instance {
	t.Helper()
	in := &instance{t: t, DB: db, NS: ns, out: &k8stest.SyncBuffer{}, done: make(chan error, 1)}
	full := append([]string{"serve", "--listen", "127.0.0.1:0", "--db", db, "--kubeconfig", cluster.Kubeconfig,
		"--namespace", ns, "--storage-classes", "kwok-volume", "--cluster-timeout", "5s"}, args...)
	in.cmd = exec.Command(hiloopBin, full...)
	// A killed test run takes its servers with it.
	in.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stdout, err := in.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	in.cmd.Stderr = in.out
	if err := in.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { in.done <- in.cmd.Wait() }()
	t.Cleanup(in.stop)
	lines := make(chan string)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			in.out.Write([]byte(sc.Text() + "\n"))
			lines <- sc.Text()
		}
		close(lines)
	}()
	timeout := time.After(30 * time.Second)
	for in.URL == "" {
		select {
		case l, ok := <-lines:
			if !ok {
				t.Fatalf("serve exited before serving:\n%s", in.out.String())
			}
			if m := tokenRE.FindStringSubmatch(l); m != nil {
				in.Token = m[1]
			}
			if m := servingRE.FindStringSubmatch(l); m != nil {
				in.URL = m[1]
			}
		case <-timeout:
			t.Fatalf("serve did not start:\n%s", in.out.String())
		}
	}
	go func() {
		for range lines {
		}
	}()
	eventually(t, "/readyz 200", 30*time.Second, func() (bool, error) {
		resp, err := http.Get(in.URL + "/readyz")
		if err != nil {
			return false, err
		}
		resp.Body.Close()
		return resp.StatusCode == 200, fmt.Errorf("status %d", resp.StatusCode)
	})
	return in
}

// stop sends SIGTERM and waits for a clean exit.
func (in *instance) stop() {
	if in.cmd.ProcessState != nil {
		return
	}
	in.cmd.Process.Signal(os.Interrupt)
	select {
	case err := <-in.done:
		if err != nil {
			in.t.Errorf("serve did not exit cleanly: %v\n%s", err, in.out.String())
		}
	case <-time.After(30 * time.Second):
		in.cmd.Process.Kill()
		in.t.Errorf("serve did not stop on SIGINT")
	}
}

// cli runs the hiloop binary as a user would, against the instance.
func (in *instance) cli(token string, args ...string) (stdout, stderr string, code int) {
	in.t.Helper()
	cmd := exec.Command(hiloopBin, args...)
	cmd.Env = append(os.Environ(), "HILOOP_URL="+in.URL, "HILOOP_TOKEN="+token, "HILOOP_DB="+in.DB)
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err := cmd.Run()
	code = 0
	if err != nil {
		ee, ok := err.(*exec.ExitError)
		if !ok {
			in.t.Fatalf("run hiloop %v: %v", args, err)
		}
		code = ee.ExitCode()
	}
	return o.String(), e.String(), code
}

// mustCLI runs the CLI and fails the test on a non-zero exit.
func (in *instance) mustCLI(token string, args ...string) string {
	in.t.Helper()
	out, errOut, code := in.cli(token, args...)
	if code != 0 {
		in.t.Fatalf("hiloop %s: exit %d\n%s%s", strings.Join(args, " "), code, out, errOut)
	}
	return out
}

// sandboxJSON is the part of the API's sandbox the tests read.
type sandboxJSON struct {
	ID       string  `json:"id"`
	State    string  `json:"state"`
	Anomaly  string  `json:"anomaly"`
	Reason   string  `json:"reason"`
	ExitCode *int    `json:"exit_code"`
	Desired  string  `json:"desired"`
	Expires  *string `json:"expires_at"`
}

// create makes a sandbox through the CLI and returns its id.
func (in *instance) create(token string, args ...string) sandboxJSON {
	in.t.Helper()
	out := in.mustCLI(token, append([]string{"sandbox", "create", "-o", "json"}, args...)...)
	var sb sandboxJSON
	if err := json.Unmarshal([]byte(out), &sb); err != nil {
		in.t.Fatalf("create output %q: %v", out, err)
	}
	return sb
}

func (in *instance) get(token, id string) sandboxJSON {
	in.t.Helper()
	var sb sandboxJSON
	status, body := in.call(token, "GET", "/v1/sandboxes/"+id, "")
	if status != 200 {
		in.t.Fatalf("get %s: %d %s", id, status, body)
	}
	json.Unmarshal([]byte(body), &sb)
	return sb
}

// waitState waits until the record says state.
func (in *instance) waitState(token, id, state string) sandboxJSON {
	in.t.Helper()
	var sb sandboxJSON
	eventually(in.t, id+" "+state, 60*time.Second, func() (bool, error) {
		sb = in.get(token, id)
		return sb.State == state, fmt.Errorf("state %s/%s: %s", sb.State, sb.Anomaly, sb.Reason)
	})
	return sb
}

// call makes one raw HTTP request and returns status and body.
func (in *instance) call(token, method, path, body string, headers ...string) (int, string) {
	in.t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, in.URL+path, rd)
	if err != nil {
		in.t.Fatal(err)
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
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		in.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// newOrg creates an organization offline against the live database file,
// as an operator would, and returns its key.
func (in *instance) newOrg(name string, maxSandboxes, maxRunning int) string {
	in.t.Helper()
	out := in.mustCLI("", "org", "create", name, "--max-sandboxes", fmt.Sprint(maxSandboxes), "--max-running", fmt.Sprint(maxRunning))
	m := tokenRE.FindStringSubmatch(out)
	if m == nil {
		in.t.Fatalf("org create printed no key: %q", out)
	}
	return m[1]
}

func kubectl(t testing.TB, args ...string) string {
	t.Helper()
	out, err := cluster.Kubectl(context.Background(), args...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// eventually polls a condition; see k8stest.Eventually.
var eventually = k8stest.Eventually

func writeFile(path, content string) error { return os.WriteFile(path, []byte(content), 0o600) }
