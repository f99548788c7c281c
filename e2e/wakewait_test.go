package e2e_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/hiloop/hiloop/internal/e2e"
	"github.com/hiloop/hiloop/internal/eventually"
)

// parkedCall is a call with ?wake=true made in the background: done gets
// its status once it answers.
type parkedCall struct {
	cancel context.CancelFunc
	done   chan int
}

// parkExec starts exec/run?wake=true into sandbox id with token, and does
// not wait for its answer.
func parkExec(t *testing.T, in *e2e.Instance, token, id string) *parkedCall {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	p := &parkedCall{cancel: cancel, done: make(chan int, 1)}
	req, err := http.NewRequestWithContext(ctx, "POST", in.URL+"/v1/sandboxes/"+id+"/exec/run?wake=true", strings.NewReader(`{"command":["true"]}`))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Content-Type", "application/json")
	go func() {
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			p.done <- 0
			return
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		p.done <- resp.StatusCode
	}()
	t.Cleanup(func() { cancel(); <-p.done })
	return p
}

// waitingWakes waits until hiloop_wake_waits says n calls wait.
func waitingWakes(t *testing.T, in *e2e.Instance, n float64) {
	t.Helper()
	eventually.Within(t, fmt.Sprintf("%v calls waiting for a wake", n), 60*time.Second, func() (bool, error) {
		got := metric(t, in, "hiloop_wake_waits")
		return got == n, fmt.Errorf("hiloop_wake_waits %v", got)
	})
}

// noPods keeps any pod from being made in the instance's namespace until
// the returned func lifts it: a quota of no pods beside the chart's.
func noPods(t *testing.T, in *e2e.Instance) (lift func()) {
	t.Helper()
	e2e.Kubectl(t, "create", "quota", "no-pods", "--hard=pods=0", "-n", in.NS)
	return func() { e2e.Kubectl(t, "delete", "quota", "no-pods", "-n", in.NS) }
}

// stuckSandbox creates a sandbox that stays starting while noPods holds:
// its pod is never made. A call with ?wake=true waits for it.
func stuckSandbox(t *testing.T, in *e2e.Instance, token string) string {
	t.Helper()
	status, body := in.Call(token, "POST", "/v1/sandboxes", `{"image":"busybox"}`)
	var sb struct{ ID string }
	if status != 201 || json.Unmarshal([]byte(body), &sb) != nil {
		t.Fatalf("create: %d %s", status, body)
	}
	in.WaitState(token, sb.ID, "starting")
	return sb.ID
}

// TestWakeWaitBound: calls that wait for a sandbox to wake are bounded per
// key and per organization against the real cluster, where sandboxes stay
// starting while no pod may be made. With the bounds full,
// one more exec with wake=true answers 429 too_many_waits with Retry-After,
// and one more ssh session or ssh -L channel is refused with the reason,
// while the first calls still wait; another organization's calls still
// wait. Once the waiting calls go away, a wake of a sandbox stopped for
// idleness still works.
func TestWakeWaitBound(t *testing.T) {
	requireSSH(t)
	// A wake that is let through would wait far longer than any call
	// below waits for its answer.
	// The extra quota is no gap in the boundary, but the self-check need
	// not judge it.
	in, _ := idleServe(t, "--wake-timeout", "10m", "--self-check-interval", "1h",
		"--max-waiting-wakes-per-key", "2", "--max-waiting-wakes-per-org", "3")
	status, body := in.Call(in.Token, "POST", "/v1/keys", `{"name":"second"}`)
	var second struct{ Secret string }
	if status != 201 || json.Unmarshal([]byte(body), &second) != nil || second.Secret == "" {
		t.Fatalf("create a second key: %d %s", status, body)
	}
	idle := in.Create(in.Token, "busybox", "--idle-timeout", "2s", "--wait").ID
	lift := noPods(t, in)
	stuck := stuckSandbox(t, in, in.Token)
	u := newSSHUser(t, in, in.Token)

	first := []*parkedCall{parkExec(t, in, in.Token, stuck), parkExec(t, in, in.Token, stuck)}
	waitingWakes(t, in, 2)
	refused := func(token, whose string) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, "POST", in.URL+"/v1/sandboxes/"+stuck+"/exec/run?wake=true", strings.NewReader(`{"command":["true"]}`))
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatalf("a call past %s bound: %v", whose, err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 429 || errorCode(t, string(b)) != "too_many_waits" || resp.Header.Get("Retry-After") != "2" || !strings.Contains(string(b), whose) {
			t.Fatalf("a call past %s bound: %d, Retry-After %q, %s", whose, resp.StatusCode, resp.Header.Get("Retry-After"), b)
		}
	}
	refused(in.Token, "this key")
	first = append(first, parkExec(t, in, second.Secret, stuck))
	waitingWakes(t, in, 3)
	refused(second.Secret, "your organization's keys together")

	// The gateway is held to the organization's bound by the same count.
	out, errOut, code := u.run(stuck, "true")
	if code != 255 || out != "" || !strings.Contains(errOut, "may not wait for it") || !strings.Contains(errOut, "your organization's keys together") {
		t.Fatalf("ssh past the organization's bound: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	local, _, fwdErr := forward(t, u, stuck, echoServer(t))
	c, err := net.Dial("tcp", local)
	if err != nil {
		t.Fatal(err)
	}
	c.SetDeadline(time.Now().Add(2 * time.Minute))
	if n, err := c.Read(make([]byte, 1)); n != 0 || err == nil {
		t.Fatalf("an -L channel past the organization's bound was opened: %d %v", n, err)
	}
	c.Close()
	eventually.Within(t, "ssh -L's refusal", 30*time.Second, func() (bool, error) {
		s := fwdErr.String()
		return strings.Contains(s, "resource shortage") && strings.Contains(s, "may not wait for it"), fmt.Errorf("stderr %q", s)
	})

	// Another organization is not held to it.
	other := in.NewOrg("other", 10, 10)
	otherStuck := stuckSandbox(t, in, other)
	theirs := parkExec(t, in, other, otherStuck)
	waitingWakes(t, in, 4)

	for _, p := range first {
		select {
		case status := <-p.done:
			t.Fatalf("a waiting call answered %d while its sandbox is still starting", status)
		default:
		}
	}
	for series, want := range map[string]float64{
		`hiloop_wake_waits_refused_total{limit="per_key",trigger="exec"}`: 1,
		`hiloop_wake_waits_refused_total{limit="per_org",trigger="exec"}`: 1,
		`hiloop_wake_waits_refused_total{limit="per_org",trigger="ssh"}`:  1,
	} {
		if got := metric(t, in, series); got != want {
			t.Errorf("%s %v, want %v", series, got, want)
		}
	}
	// forward's probe that ssh -L listens opened a channel too.
	if got := metric(t, in, `hiloop_wake_waits_refused_total{limit="per_org",trigger="forward"}`); got < 1 {
		t.Errorf(`hiloop_wake_waits_refused_total{limit="per_org",trigger="forward"} %v, want at least 1`, got)
	}

	// The waiting calls go away, and their places with them.
	for _, p := range append(first, theirs) {
		p.cancel()
	}
	waitingWakes(t, in, 0)
	waitIdleStopped(t, in, in.Token, idle)
	lift()
	status, body = in.Call(in.Token, "POST", "/v1/sandboxes/"+idle+"/exec/run?wake=true", `{"command":["echo","hi"]}`)
	if status != 200 || !strings.Contains(body, `"stdout": "hi\n"`) {
		t.Fatalf("exec with wake=true once the waiting calls went away: %d %s", status, body)
	}
}
