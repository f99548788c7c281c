package server

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hiloop/hiloop/api"
	"github.com/hiloop/hiloop/cluster"
	"github.com/hiloop/hiloop/control"
	"github.com/hiloop/hiloop/control/controltest"
	"github.com/hiloop/hiloop/internal/eventually"
	"github.com/hiloop/hiloop/store"
)

// TestIdleTimeoutFields: a create's idle timeout is its own, else its
// organization's, else the deployment's; PATCH changes it; bad values are
// refused naming the field, and a PATCH checks all it sets before it sets
// any.
func TestIdleTimeoutFields(t *testing.T) {
	ts := newTestServer(t, &controltest.Cluster{}, func(_ *Options, co *control.Options) { co.DefaultIdleTimeout = 10 * time.Minute })
	idle := func(body string) string {
		t.Helper()
		rec := ts.do("POST", "/v1/sandboxes", body)
		if rec.Code != 201 {
			t.Fatalf("create %s: %d %s", body, rec.Code, rec.Body.String())
		}
		return decodeSandbox(t, rec).IdleTimeout
	}
	for body, want := range map[string]string{
		`{"image":"busybox","idle_timeout":"90s"}`: "1m30s",
		`{"image":"busybox","idle_timeout":"0"}`:   "0s",
		`{"image":"busybox"}`:                      "10m0s",
	} {
		if got := idle(body); got != want {
			t.Errorf("create %s: idle_timeout %q, want %q", body, got, want)
		}
	}
	d := 30 * time.Minute
	if err := ts.db.SetOrgIdleTimeout(context.Background(), ts.org.ID, &d); err != nil {
		t.Fatal(err)
	}
	if got := idle(`{"image":"busybox"}`); got != "30m0s" {
		t.Errorf("create in an organization with a default: %q, want 30m0s", got)
	}
	if got := idle(`{"image":"busybox","idle_timeout":"0"}`); got != "0s" {
		t.Errorf("create asking for none in an organization with a default: %q, want 0s", got)
	}
	if rec := ts.do("GET", "/v1/org", ""); !strings.Contains(rec.Body.String(), `"idle_timeout": "30m0s"`) {
		t.Errorf("the organization does not show its default: %s", rec.Body.String())
	}
	for _, bad := range []string{`"abc"`, `"500ms"`, `"800h"`, `"-1m"`} {
		rec := ts.do("POST", "/v1/sandboxes", `{"image":"busybox","idle_timeout":`+bad+`}`)
		if rec.Code != 400 || errCode(t, rec) != api.CodeInvalidField || !strings.Contains(rec.Body.String(), `"field": "idle_timeout"`) {
			t.Errorf("idle_timeout %s: %d %s", bad, rec.Code, rec.Body.String())
		}
	}

	id := ts.create(`{"image":"busybox","ttl":"1h"}`)
	if rec := ts.do("PATCH", "/v1/sandboxes/"+id, `{"idle_timeout":"5m"}`); rec.Code != 200 || decodeSandbox(t, rec).IdleTimeout != "5m0s" {
		t.Fatalf("patch idle_timeout: %d %s", rec.Code, rec.Body.String())
	}
	before := ts.record(id)
	if rec := ts.do("PATCH", "/v1/sandboxes/"+id, `{"ttl":"2h","idle_timeout":"nope"}`); rec.Code != 400 {
		t.Fatalf("patch with a bad idle_timeout: %d %s", rec.Code, rec.Body.String())
	}
	if after := ts.record(id); !after.ExpiresAt.Equal(*before.ExpiresAt) || after.IdleTimeout != 5*time.Minute {
		t.Fatalf("a refused patch changed the sandbox: expiry %v, idle %v", after.ExpiresAt, after.IdleTimeout)
	}
	if rec := ts.do("PATCH", "/v1/sandboxes/"+id, `{}`); rec.Code != 400 || errCode(t, rec) != api.CodeInvalidField {
		t.Fatalf("empty patch: %d %s", rec.Code, rec.Body.String())
	}
	if rec := ts.do("PATCH", "/v1/sandboxes/"+id, `{"ttl":"2h","idle_timeout":"0"}`); rec.Code != 200 ||
		decodeSandbox(t, rec).IdleTimeout != "0s" || decodeSandbox(t, rec).TTL != "2h0m0s" {
		t.Fatalf("patch both: %d %s", rec.Code, rec.Body.String())
	}
}

// TestTouch: a touch restarts the caller's sandbox's idle clock and
// answers it; another organization's sandbox is not found.
func TestTouch(t *testing.T) {
	ts := newTestServer(t, &controltest.Cluster{})
	id := ts.create(`{"image":"busybox"}`)
	before := ts.record(id).LastActivityAt
	time.Sleep(5 * time.Millisecond)
	rec := ts.do("POST", "/v1/sandboxes/"+id+"/touch", "")
	if rec.Code != 200 || !decodeSandbox(t, rec).LastActivityAt.After(before) {
		t.Fatalf("touch: %d %s (last activity was %v)", rec.Code, rec.Body.String(), before)
	}
	otherOrg, _ := ts.db.CreateOrg(context.Background(), "other", 10, 10)
	_, secret, _ := ts.db.CreateKey(context.Background(), otherOrg.ID, "k")
	stranger := *ts
	stranger.token = secret
	if rec := stranger.do("POST", "/v1/sandboxes/"+id+"/touch", ""); rec.Code != 404 || errCode(t, rec) != api.CodeNotFound {
		t.Fatalf("another organization's touch: %d %s", rec.Code, rec.Body.String())
	}
}

// TestStoppedByAndWake: stopped_by says who stopped a sandbox; an exec into
// one stopped for idleness is refused with how to wake it, and with
// ?wake=true starts it (once it runs) or, when it does not come up in time,
// answers 504 wake_timeout; a sandbox its owner stopped is not woken.
func TestStoppedByAndWake(t *testing.T) {
	fc := &controltest.Cluster{}
	ts := newTestServer(t, fc, func(_ *Options, co *control.Options) {
		co.WakeTimeout = 200 * time.Millisecond
		co.Exec = controltest.Exec{Run: func(context.Context, cluster.ExecRequest) (cluster.ExitStatus, error) {
			return cluster.ExitStatus{Code: 3}, nil
		}}
	})
	ctx := context.Background()
	stoppedBy := func(id string) string {
		t.Helper()
		return decodeSandbox(t, ts.do("GET", "/v1/sandboxes/"+id, "")).StoppedBy
	}
	running := ts.runningIdle
	idle := ts.stopIdle(running())
	user := running()
	if rec := ts.do("POST", "/v1/sandboxes/"+user+"/stop", ""); rec.Code != 200 {
		t.Fatal(rec.Body.String())
	}
	ts.db.Observe(ctx, user, store.Observation{State: store.StateStopped})
	outside := running()
	ts.db.Observe(ctx, outside, store.Observation{State: store.StateStopped})
	expired := running()
	ts.db.Observe(ctx, expired, store.Observation{State: store.StateExpired})
	for id, want := range map[string]string{idle: "idle", user: "user", outside: "outside", expired: "ttl", running(): ""} {
		if got := stoppedBy(id); got != want {
			t.Errorf("stopped_by %q, want %q", got, want)
		}
	}

	run := func(id, query string) (int, string) {
		rec := ts.do("POST", "/v1/sandboxes/"+id+"/exec/run"+query, `{"command":["true"]}`)
		return rec.Code, rec.Body.String()
	}
	if code, body := run(idle, ""); code != 409 || !strings.Contains(body, "wake=true") || !strings.Contains(body, api.CodeSandboxNotRunning) {
		t.Errorf("exec into a sandbox stopped for idleness: %d %s", code, body)
	}
	if code, body := run(idle, "?wake=maybe"); code != 400 || !strings.Contains(body, `"field": "wake"`) {
		t.Errorf("wake=maybe: %d %s", code, body)
	}
	if code, body := run(user, "?wake=true"); code != 409 || !strings.Contains(body, "stopped by its owner") {
		t.Errorf("wake of a sandbox its owner stopped: %d %s", code, body)
	}
	if slices.Contains(fc.Calls(), "mode "+user+" running") {
		t.Error("a sandbox its owner stopped was started")
	}
	// Nothing observes the start: the wake times out, naming the state.
	if code, body := run(idle, "?wake=true"); code != 504 || !strings.Contains(body, api.CodeWakeTimeout) || !strings.Contains(body, "stopped") {
		t.Errorf("a wake that does not come up: %d %s", code, body)
	}

	// Once the record shows the start, a wake goes on to run the command:
	// the cluster's start is observed as soon as the wake asks for it.
	again := ts.stopIdle(running())
	answered, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		for !slices.Contains(fc.Calls(), "mode "+again+" running") {
			select {
			case <-answered:
				return
			case <-time.After(time.Millisecond):
			}
		}
		ts.db.Observe(ctx, again, store.Observation{State: store.StateRunning})
	}()
	code, body := run(again, "?wake=true")
	close(answered)
	<-done
	if code != 200 || !strings.Contains(body, `"exit_code": 3`) {
		t.Fatalf("exec with wake=true: %d %s", code, body)
	}
	if got := ts.record(again); got.DesiredMode != store.ModeRunning || got.StopCause != "" {
		t.Fatalf("after the wake: desired %s, cause %q", got.DesiredMode, got.StopCause)
	}
}

// TestWakeWaitLimit: a call with ?wake=true past its key's bound of calls
// waiting for a wake is answered at once with 429 too_many_waits and a
// Retry-After, exec and file calls alike, while the first one still waits;
// a call on a running sandbox is not held to the bound; once the waiting
// caller goes away, its place is free again.
func TestWakeWaitLimit(t *testing.T) {
	fc := &controltest.Cluster{}
	ts := newTestServer(t, fc, func(_ *Options, co *control.Options) {
		co.Limits.WakeWaitsPerKey, co.Limits.WakeWaitsPerOrg = 1, 4
		co.Exec = controltest.Exec{Run: func(context.Context, cluster.ExecRequest) (cluster.ExitStatus, error) {
			return cluster.ExitStatus{}, nil
		}}
	})
	ctx := context.Background()
	running := ts.runningIdle
	stopped := func() string { return ts.stopIdle(running()) }
	idle, idle2, up := stopped(), stopped(), running()

	// park makes a call with ?wake=true into sandbox id, which waits until
	// its caller goes away or the sandbox runs, and returns once the wake
	// waits for the sandbox (a wake under way of no other sandbox).
	park := func(id string) (cancel func(), done chan *httptest.ResponseRecorder) {
		t.Helper()
		rctx, cancel := context.WithCancel(ctx)
		t.Cleanup(cancel)
		done = make(chan *httptest.ResponseRecorder, 1)
		waiting := ts.db.Waiting()
		go func() {
			req := httptest.NewRequest("POST", "/v1/sandboxes/"+id+"/exec/run?wake=true", strings.NewReader(`{"command":["true"]}`)).WithContext(rctx)
			req.Header.Set("Authorization", "Bearer "+ts.token)
			rec := httptest.NewRecorder()
			ts.srv.ServeHTTP(rec, req)
			done <- rec
		}()
		eventually.True(t, "the wake to wait", func() bool {
			select {
			case rec := <-done:
				t.Fatalf("a wake that should wait answered %d %s", rec.Code, rec.Body.String())
			default:
			}
			return ts.db.Waiting() != waiting
		})
		return cancel, done
	}
	cancel, done := park(idle)
	for _, path := range []string{"/v1/sandboxes/" + idle + "/exec/run?wake=true", "/v1/sandboxes/" + idle + "/files?path=/etc/hostname&wake=true"} {
		method, body := "POST", `{"command":["true"]}`
		if strings.Contains(path, "/files") {
			method, body = "GET", ""
		}
		rec := ts.do(method, path, body)
		if rec.Code != 429 || errCode(t, rec) != api.CodeTooManyWaits || rec.Header().Get("Retry-After") != "2" ||
			!strings.Contains(rec.Body.String(), "wait for sandboxes to wake") {
			t.Errorf("%s %s past the bound: %d, Retry-After %q, %s", method, path, rec.Code, rec.Header().Get("Retry-After"), rec.Body.String())
		}
	}
	if rec := ts.do("POST", "/v1/sandboxes/"+up+"/exec/run?wake=true", `{"command":["true"]}`); rec.Code != 200 {
		t.Errorf("exec with wake=true into a running sandbox at the bound: %d %s", rec.Code, rec.Body.String())
	}
	select {
	case rec := <-done:
		t.Fatalf("the waiting call answered while the sandbox is down: %d %s", rec.Code, rec.Body.String())
	default:
	}
	cancel()
	<-done
	// Its place is free: the next call waits, and goes on once the
	// sandbox runs. (The wake of the first goes on without its caller.)
	_, done = park(idle2)
	ts.db.Observe(ctx, idle2, store.Observation{State: store.StateRunning})
	if rec := <-done; rec.Code != 200 {
		t.Fatalf("exec with wake=true once the sandbox runs: %d %s", rec.Code, rec.Body.String())
	}
}

// TestWakeAtShutdown: a call with ?wake=true that waits for a wake when
// hiloop begins to shut down, and one that asks for a wake after, are
// answered 503 with a Retry-After, never 500: nothing broke, and the
// client may try again against the next hiloop.
func TestWakeAtShutdown(t *testing.T) {
	ts := newTestServer(t, &controltest.Cluster{}, func(_ *Options, co *control.Options) {
		co.Exec = controltest.Exec{Run: func(context.Context, cluster.ExecRequest) (cluster.ExitStatus, error) {
			return cluster.ExitStatus{}, nil
		}}
	})
	ctx := context.Background()
	stopped := func() string { return ts.stopIdle(ts.runningIdle()) }
	waiting, after := stopped(), stopped()
	done := make(chan *httptest.ResponseRecorder, 1)
	go func() {
		done <- ts.do("POST", "/v1/sandboxes/"+waiting+"/exec/run?wake=true", `{"command":["true"]}`)
	}()
	eventually.True(t, "the wake to wait", func() bool {
		select {
		case rec := <-done:
			t.Fatalf("a wake that should wait answered %d %s", rec.Code, rec.Body.String())
		default:
		}
		return ts.db.Waiting() != 0
	})
	if err := ts.ctl.Close(ctx); err != nil {
		t.Fatal(err)
	}
	check := func(what string, rec *httptest.ResponseRecorder) {
		t.Helper()
		if rec.Code != 503 || rec.Header().Get("Retry-After") == "" || !strings.Contains(rec.Body.String(), "shutting down") {
			t.Errorf("%s: %d, Retry-After %q, %s; want 503 saying hiloop is shutting down", what, rec.Code, rec.Header().Get("Retry-After"), rec.Body.String())
		}
	}
	check("a wake waiting at shutdown", <-done)
	check("a wake asked for after shutdown began", ts.do("POST", "/v1/sandboxes/"+after+"/exec/run?wake=true", `{"command":["true"]}`))
}

// TestWakeCallerGone: a caller that goes away while its call with
// ?wake=true waits for the wake is not answered at all, as a caller gone
// while waiting its turn: leaving is how a client stops waiting, not a
// server error, and must not count or log as one.
func TestWakeCallerGone(t *testing.T) {
	var logs strings.Builder
	ts := newTestServer(t, &controltest.Cluster{}, func(so *Options, _ *control.Options) {
		so.Log = slog.New(slog.NewTextHandler(&lockedWriter{w: &logs}, &slog.HandlerOptions{Level: slog.LevelError}))
	})
	ctx := context.Background()
	stopped := func() string { return ts.stopIdle(ts.runningIdle()) }
	for _, path := range []string{"/v1/sandboxes/" + stopped() + "/exec/run?wake=true", "/v1/sandboxes/" + stopped() + "/files?path=/etc/hostname&wake=true"} {
		method, body := "POST", `{"command":["true"]}`
		if strings.Contains(path, "/files") {
			method, body = "GET", ""
		}
		rctx, cancel := context.WithCancel(ctx)
		done := make(chan *httptest.ResponseRecorder, 1)
		waiting := ts.db.Waiting()
		go func() {
			req := httptest.NewRequest(method, path, strings.NewReader(body)).WithContext(rctx)
			req.Header.Set("Authorization", "Bearer "+ts.token)
			rec := httptest.NewRecorder()
			ts.srv.ServeHTTP(rec, req)
			done <- rec
		}()
		// Each call wakes a sandbox of its own: the store has one more
		// waiter once it waits.
		eventually.True(t, "the wake to wait", func() bool {
			select {
			case rec := <-done:
				t.Fatalf("%s %s answered %d %s before it waited", method, path, rec.Code, rec.Body.String())
			default:
			}
			return ts.db.Waiting() != waiting
		})
		cancel()
		if rec := <-done; rec.Body.Len() != 0 {
			t.Errorf("%s %s whose caller went away was answered %d %s", method, path, rec.Code, rec.Body.String())
		}
	}
	if strings.Contains(logs.String(), "request failed") {
		t.Errorf("a caller gone while it waited for a wake is logged as a failure:\n%s", logs.String())
	}
}

// lockedWriter is a writer for a log that handlers write from several
// goroutines.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(b []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(b)
}

// runningIdle creates a sandbox with an idle timeout and observes it
// running.
func (ts *testServer) runningIdle() string {
	ts.t.Helper()
	id := ts.create(`{"image":"busybox","idle_timeout":"1m"}`)
	ts.db.Observe(context.Background(), id, store.Observation{State: store.StateRunning})
	return id
}

// stopIdle stops sandbox id for idleness in the record, observes it
// stopped, and returns id.
func (ts *testServer) stopIdle(id string) string {
	ts.t.Helper()
	ctx := context.Background()
	if _, err := ts.db.SetDesiredMode(ctx, ts.org.ID, id, store.ModeStopped, store.StopIdle); err != nil {
		ts.t.Fatal(err)
	}
	ts.db.Observe(ctx, id, store.Observation{State: store.StateStopped})
	return id
}

// TestPatchAllOrNothing: a PATCH that sets the TTL and the idle timeout
// applies both or neither. Here the sandbox is recorded lost (as the
// mirror would) while the cluster carries out the new expiry: the answer
// must not refuse the PATCH with one of its fields already applied.
func TestPatchAllOrNothing(t *testing.T) {
	ts := newTestServer(t, &controltest.Cluster{})
	id := ts.create(`{"image":"busybox","ttl":"1h","idle_timeout":"5m"}`)
	before := ts.record(id)
	ts.fc.Set(func(f *controltest.Cluster) {
		f.OnExpiry = func(id string) {
			if _, err := ts.db.Observe(context.Background(), id, store.Observation{State: store.StateLost}); err != nil {
				t.Error(err)
			}
		}
	})
	rec := ts.do("PATCH", "/v1/sandboxes/"+id, `{"ttl":"2h","idle_timeout":"10m"}`)
	after := ts.record(id)
	ttlSet, idleSet := !after.ExpiresAt.Equal(*before.ExpiresAt), after.IdleTimeout == 10*time.Minute
	switch {
	case rec.Code == http.StatusOK && !(ttlSet && idleSet):
		t.Errorf("PATCH answered 200 and applied ttl %v, idle_timeout %v", ttlSet, idleSet)
	case rec.Code != http.StatusOK && (ttlSet || idleSet):
		t.Errorf("PATCH answered %d %s and applied ttl %v, idle_timeout %v", rec.Code, errCode(t, rec), ttlSet, idleSet)
	}
}
