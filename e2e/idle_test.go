package e2e_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hiloop/hiloop/api"
	"github.com/hiloop/hiloop/internal/e2e"
	"github.com/hiloop/hiloop/internal/eventually"
)

// idleSandbox is what the idle tests read of a sandbox.
type idleSandbox struct {
	ID             string    `json:"id"`
	State          string    `json:"state"`
	Desired        string    `json:"desired"`
	StoppedBy      string    `json:"stopped_by"`
	IdleTimeout    string    `json:"idle_timeout"`
	LastActivityAt time.Time `json:"last_activity_at"`
}

type idleEvent struct {
	At     time.Time `json:"at"`
	From   string    `json:"from"`
	To     string    `json:"to"`
	Reason string    `json:"reason"`
}

func getIdle(t testing.TB, in *e2e.Instance, token, id string) idleSandbox {
	t.Helper()
	status, body := in.Call(token, "GET", "/v1/sandboxes/"+id, "")
	var sb idleSandbox
	if status != 200 || json.Unmarshal([]byte(body), &sb) != nil {
		t.Fatalf("get %s: %d %s", id, status, body)
	}
	return sb
}

func eventsOf(t testing.TB, in *e2e.Instance, token, id string) []idleEvent {
	t.Helper()
	status, body := in.Call(token, "GET", "/v1/sandboxes/"+id+"/events", "")
	var l struct{ Items []idleEvent }
	if status != 200 || json.Unmarshal([]byte(body), &l) != nil {
		t.Fatalf("events %s: %d %s", id, status, body)
	}
	return l.Items
}

// waitIdleStopped waits until the record says id stopped, stopped by idle,
// with its last transitions giving the reason idle.
func waitIdleStopped(t testing.TB, in *e2e.Instance, token, id string) idleSandbox {
	t.Helper()
	var sb idleSandbox
	eventually.Within(t, id+" stopped for idleness", 60*time.Second, func() (bool, error) {
		sb = getIdle(t, in, token, id)
		return sb.State == "stopped" && sb.StoppedBy == "idle", fmt.Errorf("state %s, desired %s, stopped_by %q", sb.State, sb.Desired, sb.StoppedBy)
	})
	evs := eventsOf(t, in, token, id)
	last := evs[len(evs)-1]
	if last.To != "stopped" || last.Reason != "idle" {
		t.Fatalf("%s: last event %+v, want stopped with reason idle", id, last)
	}
	return sb
}

// stillRunning fails t if any of the sandboxes (id: what keeps it awake)
// is anything but running.
func stillRunning(t testing.TB, in *e2e.Instance, token string, ids map[string]string) {
	t.Helper()
	for id, what := range ids {
		if sb := getIdle(t, in, token, id); sb.State != "running" || sb.Desired != "running" {
			t.Fatalf("%s: the sandbox went %s (desired %s, stopped_by %q)", what, sb.State, sb.Desired, sb.StoppedBy)
		}
	}
}

// metric reads one series from the instance's metrics endpoint; 0 when
// absent.
func metric(t testing.TB, in *e2e.Instance, series string) float64 {
	t.Helper()
	resp, err := http.Get(in.MetricsURL)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(series) + ` ([0-9.e+-]+)$`).FindSubmatch(b)
	if m == nil {
		return 0
	}
	v, _ := strconv.ParseFloat(string(m[1]), 64)
	return v
}

// idleServe serves backing the forward transport, with metrics and with
// extra flags.
func idleServe(t testing.TB, extra ...string) (*e2e.Instance, string) {
	t.Helper()
	dir := e2e.Helpers(t)
	in := e2e.ServeInProcess(t, filepath.Join(t.TempDir(), "h.db"), e2e.NewNamespace(t), append([]string{
		"--transports", "exec,ssh,forward", "--agent-image", "hiloop-agent:local", "--metrics-listen", "127.0.0.1:0"}, extra...)...)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("serve's output:\n%s", in.Out.String())
		}
	})
	return in, dir
}

// TestIdleStop: a sandbox nobody uses is stopped for idleness (reason
// idle, stopped_by idle, "stopped (idle)" in the list), while an open ssh
// session, an open -L channel and a running exec each keep their sandbox
// running past three idle timeouts; each of those stops once its use
// ends, and an ssh -L connection kept open across the stop moves bytes
// again by waking its sandbox.
func TestIdleStop(t *testing.T) {
	requireSSH(t)
	in, _ := idleServe(t)
	u := newSSHUser(t, in, in.Token)
	// The sandboxes to be kept awake start with idle stop off, so none
	// stops before its use is under way; then their timeout is set.
	create := func(idle string) string {
		return in.Create(in.Token, "busybox", "--idle-timeout", idle, "--transport", "ssh", "--transport", "forward",
			"--transport", "exec", "--wait").ID
	}
	idle, viaSSH, viaForward, viaExec := create("2s"), create("0"), create("0"), create("0")
	before := map[string]time.Time{}
	for _, id := range []string{viaSSH, viaForward, viaExec} {
		before[id] = getIdle(t, in, in.Token, id).LastActivityAt
	}

	// An ssh session, a -L channel and an exec, each open until the test
	// ends it.
	session := exec.Command("ssh", u.args(viaSSH+"@127.0.0.1", "read x; echo done")...)
	session.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	sessionOut := &e2e.SyncBuffer{}
	session.Stdout = sessionOut
	sessionIn, err := session.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := session.Start(); err != nil {
		t.Fatal(err)
	}
	// The echo server holds each connection until its client closes it;
	// its echo says the channel is open end to end.
	local, _, _ := forward(t, u, viaForward, echoServer(t))
	channel, err := net.Dial("tcp", local)
	if err != nil {
		t.Fatal(err)
	}
	channel.SetDeadline(time.Now().Add(30 * time.Second))
	echo := make([]byte, 4)
	if _, err := channel.Write([]byte("open")); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(channel, echo); err != nil || string(echo) != "open" {
		t.Fatalf("-L channel: %q %v", echo, err)
	}
	channel.SetDeadline(time.Time{})
	execCmd := exec.Command(e2e.Binary(t), "sandbox", "exec", "-i", viaExec, "--", "sh", "-c", "read x")
	execCmd.Env = in.Env(in.Token)
	execCmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	execIn, err := execCmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := execCmd.Start(); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{viaSSH, viaForward, viaExec} {
		eventually.Within(t, id+" in use", 20*time.Second, func() (bool, error) {
			// Each use is written to the record as it begins.
			return getIdle(t, in, in.Token, id).LastActivityAt.After(before[id]), nil
		})
		if out := in.MustCLI(in.Token, "sandbox", "idle-timeout", "-o", "json", id, "2s"); !strings.Contains(out, `"idle_timeout": "2s"`) {
			t.Fatalf("sandbox idle-timeout: %s", out)
		}
	}

	sb := waitIdleStopped(t, in, in.Token, idle)
	if sb.IdleTimeout != "2s" {
		t.Errorf("idle_timeout %q, want 2s", sb.IdleTimeout)
	}
	if out := in.MustCLI(in.Token, "sandbox", "list"); !regexp.MustCompile(idle + `\s+stopped \(idle\)`).MatchString(out) {
		t.Errorf("sandbox list does not show the sandbox stopped for idleness:\n%s", out)
	}
	// A sandbox made after each use began, with three of their idle
	// timeouts: the pass of the idle stop that stops it finds each of the
	// others unused by the record for longer, and only its use can keep
	// it running.
	waitIdleStopped(t, in, in.Token, create("6s"))
	stillRunning(t, in, in.Token, map[string]string{viaSSH: "an open ssh session", viaForward: "an open -L channel", viaExec: "a running exec"})

	sessionIn.Write([]byte("end\n"))
	execIn.Write([]byte("end\n"))
	if err := session.Wait(); err != nil || sessionOut.String() != "done\n" {
		t.Fatalf("ssh session: %v %q", err, sessionOut.String())
	}
	if err := execCmd.Wait(); err != nil {
		t.Fatalf("exec: %v", err)
	}
	channel.Close()
	for _, id := range []string{viaSSH, viaForward, viaExec} {
		waitIdleStopped(t, in, in.Token, id)
	}
	// The ssh -L connection outlived the idle stop: its next channel wakes
	// the sandbox, and bytes move.
	roundTrip(t, local, 1<<20)
	if sb := getIdle(t, in, in.Token, viaForward); sb.State != "running" {
		t.Fatalf("after a -L channel woke it: %s", sb.State)
	}
	if n := metric(t, in, "hiloop_idle_stops_total"); n < 4 {
		t.Errorf("hiloop_idle_stops_total %v, want at least 4", n)
	}
	if n := metric(t, in, `hiloop_wakes_total{trigger="forward"}`); n != 1 {
		t.Errorf(`hiloop_wakes_total{trigger="forward"} %v, want 1`, n)
	}
}

// TestWake: ssh and -L wake a sandbox stopped for idleness as if it had
// been running, with one line on stderr; an exec wakes it only with
// wake=true (without, 409 says how); a sandbox its owner stopped is not
// woken, and ssh says why.
func TestWake(t *testing.T) {
	requireSSH(t)
	in, _ := idleServe(t)
	u := newSSHUser(t, in, in.Token)
	sb := in.Create(in.Token, "busybox", "--idle-timeout", "2s", "--transport", "ssh", "--transport", "forward", "--transport", "exec", "--wait")

	waitIdleStopped(t, in, in.Token, sb.ID)
	out, errOut, code := u.run(sb.ID, "echo hi")
	if code != 0 || out != "hi\n" || !strings.Contains(errOut, "waking "+sb.ID) {
		t.Fatalf("ssh to a sandbox stopped for idleness: exit %d, stdout %q, stderr %q", code, out, errOut)
	}

	waitIdleStopped(t, in, in.Token, sb.ID)
	port := echoServer(t)
	local := e2e.FreeAddr(t)
	fwd := exec.Command("ssh", u.args("-N", "-L", local+":localhost:"+port, sb.ID+"@127.0.0.1")...)
	fwd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := fwd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { fwd.Process.Kill(); fwd.Wait() })
	e2e.WaitListening(t, "-L listening", local)
	roundTrip(t, local, 1<<20)
	fwd.Process.Kill()
	fwd.Wait()

	waitIdleStopped(t, in, in.Token, sb.ID)
	status, body := in.Call(in.Token, "POST", "/v1/sandboxes/"+sb.ID+"/exec/run", `{"command":["echo","hi"]}`)
	if status != 409 || errorCode(t, body) != "sandbox_not_running" || !strings.Contains(body, "wake=true") {
		t.Fatalf("exec without wake: %d %s", status, body)
	}
	status, body = in.Call(in.Token, "POST", "/v1/sandboxes/"+sb.ID+"/exec/run?wake=true", `{"command":["echo","hi"]}`)
	if status != 200 || !strings.Contains(body, `"stdout": "hi\n"`) {
		t.Fatalf("exec with wake=true: %d %s", status, body)
	}
	waitIdleStopped(t, in, in.Token, sb.ID)
	if out := in.MustCLI(in.Token, "sandbox", "exec", "--wake", sb.ID, "--", "echo", "cli"); out != "cli\n" {
		t.Fatalf("sandbox exec --wake: %q", out)
	}
	// The Go SDK wakes by default, for commands and files alike; with
	// NoWake it gets the plain refusal.
	waitIdleStopped(t, in, in.Token, sb.ID)
	ctx := context.Background()
	noWake := sdk(in, in.Token)
	noWake.NoWake = true
	var ae *api.Error
	if _, err := noWake.Run(ctx, sb.ID, api.ExecRunRequest{Command: []string{"true"}}); !errors.As(err, &ae) || ae.Code != api.CodeSandboxNotRunning {
		t.Fatalf("SDK run with NoWake into a sandbox stopped for idleness: %v", err)
	}
	if res, err := sdk(in, in.Token).Run(ctx, sb.ID, api.ExecRunRequest{Command: []string{"echo", "sdk"}}); err != nil || res.Stdout != "sdk\n" {
		t.Fatalf("SDK run into a sandbox stopped for idleness: %+v %v", res, err)
	}
	waitIdleStopped(t, in, in.Token, sb.ID)
	if _, err := sdk(in, in.Token).WriteFile(ctx, sb.ID, "/tmp/woken", strings.NewReader("files"), 5, 0); err != nil {
		t.Fatalf("SDK file write into a sandbox stopped for idleness: %v", err)
	}
	for trigger, want := range map[string]float64{"ssh": 1, "forward": 1, "exec": 3, "files": 1} {
		if n := metric(t, in, `hiloop_wakes_total{trigger="`+trigger+`"}`); n != want {
			t.Errorf("hiloop_wakes_total{trigger=%q} %v, want %v", trigger, n, want)
		}
	}
	if n := metric(t, in, "hiloop_wake_duration_seconds_count"); n != 6 {
		t.Errorf("hiloop_wake_duration_seconds_count %v, want 6", n)
	}

	// Its owner's stop is not undone by a connection.
	in.MustCLI(in.Token, "sandbox", "stop", sb.ID)
	in.WaitState(in.Token, sb.ID, "stopped")
	out, errOut, code = u.run(sb.ID, "echo hi")
	if code != 255 || out != "" || !strings.Contains(errOut, "stopped by its owner") || !strings.Contains(errOut, "hiloop sandbox start "+sb.ID) {
		t.Fatalf("ssh to a sandbox its owner stopped: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	if status, body := in.Call(in.Token, "POST", "/v1/sandboxes/"+sb.ID+"/exec/run?wake=true", `{"command":["true"]}`); status != 409 {
		t.Fatalf("exec with wake=true into a sandbox its owner stopped: %d %s", status, body)
	}
	if got := getIdle(t, in, in.Token, sb.ID); got.State != "stopped" || got.Desired != "stopped" || got.StoppedBy != "user" {
		t.Fatalf("a sandbox its owner stopped: state %s, desired %s, stopped_by %q", got.State, got.Desired, got.StoppedBy)
	}
}

// TestConcurrentWakes: twenty ssh connections at once to a sandbox stopped
// for idleness make exactly one start, and every one of them runs its
// command.
func TestConcurrentWakes(t *testing.T) {
	requireSSH(t)
	in, _ := idleServe(t, "--ssh-max-startups-per-source", "64", "--exec-per-sandbox", "32",
		"--max-waiting-wakes-per-key", "32")
	u := newSSHUser(t, in, in.Token)
	sb := in.Create(in.Token, "busybox", "--idle-timeout", "2s", "--wait")
	waitIdleStopped(t, in, in.Token, sb.ID)
	before := len(eventsOf(t, in, in.Token, sb.ID))

	const n = 20
	var wg sync.WaitGroup
	results := make([]string, n)
	for i := range n {
		wg.Go(func() {
			out, errOut, code := u.run(sb.ID, "echo hi "+strconv.Itoa(i))
			if code != 0 || out != fmt.Sprintf("hi %d\n", i) {
				results[i] = fmt.Sprintf("exit %d, stdout %q, stderr %q", code, out, errOut)
			}
		})
	}
	wg.Wait()
	for i, r := range results {
		if r != "" {
			t.Errorf("ssh %d: %s", i, r)
		}
	}
	if w := metric(t, in, `hiloop_wakes_total{trigger="ssh"}`); w != 1 {
		t.Errorf("hiloop_wakes_total{trigger=\"ssh\"} %v, want exactly 1", w)
	}
	// A start is the record coming up from not running: into starting, or
	// straight into running when the pod was Ready by the first decision.
	// The mirror holds its decisions until its watch of the Sandbox shows
	// the start's own write, so it never takes the start's pod, seen
	// first, for a mode changed outside hiloop (docs/states.md).
	starts := 0
	for _, e := range eventsOf(t, in, in.Token, sb.ID)[before:] {
		if e.To == "starting" || (e.To == "running" && e.From != "starting") {
			starts++
		}
		if strings.Contains(e.Reason, "mode changed outside hiloop") {
			t.Errorf("the wake was recorded as a mode changed outside hiloop: %+v", e)
		}
	}
	if starts != 1 {
		t.Errorf("%d starts after 20 concurrent wakes, want 1: %+v", starts, eventsOf(t, in, in.Token, sb.ID)[before:])
	}
}

// TestWakeOverQuota: a wake is a start: one past the organization's running
// quota is refused with the quota's error, over ssh and over the API, and
// the sandbox stays stopped for idleness. A create that names no idle
// timeout takes the organization's (hiloop org idle-timeout), else the
// deployment's (--default-idle-timeout).
func TestWakeOverQuota(t *testing.T) {
	requireSSH(t)
	in, _ := idleServe(t, "--default-idle-timeout", "1h")
	token := in.NewOrg("idle-quota", 5, 1)
	u := newSSHUser(t, in, token)
	if out := in.MustCLI(in.Token, "sandbox", "create", "-o", "json", "busybox"); !strings.Contains(out, `"idle_timeout": "1h0m0s"`) {
		t.Fatalf("a create under the deployment's default: %s", out)
	}
	if out := in.MustCLI("", "org", "idle-timeout", "idle-quota", "2s"); !strings.Contains(out, "idle-quota: idle timeout of new sandboxes 2s") {
		t.Fatalf("org idle-timeout: %q", out)
	}
	a := in.Create(token, "busybox", "--wait")
	if sb := getIdle(t, in, token, a.ID); sb.IdleTimeout != "2s" {
		t.Fatalf("a create under the organization's default: idle_timeout %q, want 2s", sb.IdleTimeout)
	}
	waitIdleStopped(t, in, token, a.ID)
	in.Create(token, "busybox", "--idle-timeout", "0", "--wait")

	out, errOut, code := u.run(a.ID, "echo hi")
	if code != 255 || out != "" || !strings.Contains(errOut, "quota exceeded") {
		t.Fatalf("ssh wake over quota: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	status, body := in.Call(token, "POST", "/v1/sandboxes/"+a.ID+"/exec/run?wake=true", `{"command":["true"]}`)
	if status != 429 || errorCode(t, body) != "quota_exceeded" {
		t.Fatalf("exec wake over quota: %d %s", status, body)
	}
	if sb := getIdle(t, in, token, a.ID); sb.State != "stopped" || sb.StoppedBy != "idle" {
		t.Fatalf("after refused wakes: state %s, stopped_by %q", sb.State, sb.StoppedBy)
	}
}

// TestIdleClockSurvivesRestart: hiloop killed mid-idle and started again
// keeps each idle clock: a sandbox idle when it died is stopped one idle
// timeout after its last use, not after the restart; one with an ssh
// session open when it died is taken to have been in use until the
// restart, so it is not stopped before a timeout after it. The idle
// sandbox has the longer timeout and runs out of it while hiloop is down:
// with its clock kept it is stopped first, at once; had the restart reset
// it, the busy sandbox's shorter timeout would stop that one first. The
// order of the two stops says which, whatever the machine's pace.
func TestIdleClockSurvivesRestart(t *testing.T) {
	requireSSH(t)
	ns := e2e.NewNamespace(t)
	db := filepath.Join(t.TempDir(), "h.db")
	in := e2e.Serve(t, db, ns)
	u := newSSHUser(t, in, in.Token)
	const idleTimeout, busyTimeout = 15 * time.Second, 10 * time.Second
	idle := in.Create(in.Token, "busybox", "--idle-timeout", idleTimeout.String(), "--wait")
	busy := in.Create(in.Token, "busybox", "--idle-timeout", busyTimeout.String(), "--wait")
	busyClock := getIdle(t, in, in.Token, busy.ID).LastActivityAt
	session := exec.Command("ssh", u.args(busy.ID+"@127.0.0.1", "sleep 120")...)
	session.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := session.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { session.Process.Kill(); session.Wait() })
	clock := getIdle(t, in, in.Token, idle.ID).LastActivityAt
	eventually.Within(t, "the session counted as use", 20*time.Second, func() (bool, error) {
		return getIdle(t, in, in.Token, busy.ID).LastActivityAt.After(busyClock), nil
	})

	if err := in.Signal(syscall.SIGKILL, 10*time.Second); err == nil {
		t.Fatal("serve survived SIGKILL")
	}
	// The idle sandbox's timeout runs out while hiloop is down.
	time.Sleep(time.Until(clock.Add(idleTimeout + time.Second)))
	restart := time.Now()
	in = e2e.Serve(t, db, ns)
	if got := getIdle(t, in, in.Token, idle.ID).LastActivityAt; !got.Equal(clock) {
		t.Fatalf("the restart moved the idle clock: last_activity_at %v, was %v", got, clock)
	}
	if got := getIdle(t, in, in.Token, busy.ID).LastActivityAt; got.Before(restart) {
		t.Fatalf("a sandbox in use at the crash: last_activity_at %v, before the restart at %v", got, restart)
	}
	stoppedAt := func(id string) time.Time {
		waitIdleStopped(t, in, in.Token, id)
		for _, e := range eventsOf(t, in, in.Token, id) {
			if e.From == "running" && e.Reason == "idle" {
				return e.At
			}
		}
		t.Fatalf("%s: no idle stop among its events", id)
		return time.Time{}
	}
	idleAt, busyAt := stoppedAt(idle.ID), stoppedAt(busy.ID)
	if idleAt.Before(clock.Add(idleTimeout)) {
		t.Errorf("idle sandbox stopped at %v, before its last use + %v (%v)", idleAt, idleTimeout, clock.Add(idleTimeout))
	}
	if busyAt.Before(restart.Add(busyTimeout)) {
		t.Errorf("the sandbox in use at the crash stopped at %v, before the restart + %v (%v)", busyAt, busyTimeout, restart.Add(busyTimeout))
	}
	if !idleAt.Before(busyAt) {
		t.Errorf("the idle sandbox stopped at %v, not before the one in use at the crash (%v): the restart reset its idle clock", idleAt, busyAt)
	}
}
