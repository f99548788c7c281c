package store_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/hiloop/hiloop/store"
)

func startProcess(t *testing.T, s *store.Store, sb store.Sandbox, lim store.ProcessLimits) (store.Process, []string, error) {
	t.Helper()
	return s.StartProcess(context.Background(), sb.OrgID, store.Process{ID: store.NewID("proc"), SandboxID: sb.ID, Command: []string{"sleep", "1"}}, lim)
}

// TestProcessLimits: a sandbox runs at most Running processes; a start
// forgets the oldest finished processes past Finished and names them.
func TestProcessLimits(t *testing.T) {
	s, a, b := twoSandboxes(t)
	ctx := context.Background()
	lim := store.ProcessLimits{Running: 2, Finished: 2}
	var ids []string
	for range 2 {
		p, _, err := startProcess(t, s, a, lim)
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, p.ID)
	}
	if _, _, err := startProcess(t, s, a, lim); !errors.Is(err, store.ErrProcessLimit) {
		t.Fatalf("third running process: %v; want %v", err, store.ErrProcessLimit)
	}
	if _, _, err := startProcess(t, s, b, lim); err != nil {
		t.Fatalf("another sandbox's limit is its own: %v", err)
	}
	if ok, err := s.ExitProcess(ctx, ids[0], 7); !ok || err != nil {
		t.Fatal(ok, err)
	}
	if ok, _ := s.ExitProcess(ctx, ids[0], 8); ok {
		t.Error("a finished process was finished again")
	}
	if ok, err := s.EndProcess(ctx, ids[1], store.EndStateLost); !ok || err != nil {
		t.Fatal(ok, err)
	}
	p, forgot, err := startProcess(t, s, a, lim)
	if err != nil || len(forgot) != 0 {
		t.Fatalf("start with 2 finished kept: %v, forgot %v", err, forgot)
	}
	if ok, err := s.ExitProcess(ctx, p.ID, 0); !ok || err != nil {
		t.Fatal(ok, err)
	}
	_, forgot, err = startProcess(t, s, a, lim)
	if err != nil || fmt.Sprint(forgot) != fmt.Sprint([]string{ids[0]}) {
		t.Fatalf("start with 3 finished: %v, forgot %v; want the oldest, %s", err, forgot, ids[0])
	}
	got, err := s.Process(ctx, a.OrgID, a.ID, ids[1])
	if err != nil || got.State != store.ProcessEnded || got.Reason != store.EndStateLost || got.EndedAt == nil {
		t.Fatalf("ended process: %+v, %v", got, err)
	}
	if _, err := s.Process(ctx, a.OrgID, a.ID, ids[0]); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("forgotten process: %v", err)
	}
}

// TestProcessScoping: a process is found only through its own sandbox and
// organization; an empty organization finds nothing.
func TestProcessScoping(t *testing.T) {
	s, a, b := twoSandboxes(t)
	ctx := context.Background()
	other, err := s.CreateOrg(ctx, "other", 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	p, _, err := startProcess(t, s, a, store.ProcessLimits{Running: 1, Finished: 1})
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range []struct{ org, sb string }{{other.ID, a.ID}, {"", a.ID}, {a.OrgID, b.ID}} {
		if _, err := s.Process(ctx, q.org, q.sb, p.ID); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("process through org %q sandbox %s: %v; want not found", q.org, q.sb, err)
		}
	}
	if _, err := s.Processes(ctx, other.ID, a.ID); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("another organization's list: %v", err)
	}
	if _, _, err := s.StartProcess(ctx, other.ID, store.Process{ID: store.NewID("proc"), SandboxID: a.ID, Command: []string{"x"}},
		store.ProcessLimits{Running: 9, Finished: 9}); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("another organization's start: %v", err)
	}
}

// TestObservationEndsProcesses: a process lives no longer than its pod.
// Observing the sandbox stop ends its running processes (sandbox_stopped),
// observing another pod ends those of the old one (pod_replaced), and an
// attention says nothing sure of the pod, so ends none.
func TestObservationEndsProcesses(t *testing.T) {
	s, a, _ := twoSandboxes(t)
	ctx := context.Background()
	lim := store.ProcessLimits{Running: 9, Finished: 9}
	observe := func(o store.Observation) {
		t.Helper()
		if _, err := s.Observe(ctx, a.ID, o); err != nil {
			t.Fatal(err)
		}
	}
	state := func(id string) (store.ProcessState, store.EndReason) {
		t.Helper()
		p, err := s.Process(ctx, a.OrgID, a.ID, id)
		if err != nil {
			t.Fatal(err)
		}
		return p.State, p.Reason
	}
	observe(store.Observation{State: store.StateRunning, PodUID: "u1"})
	p1, _, err := startProcess(t, s, a, lim)
	if err != nil || p1.PodUID != "u1" {
		t.Fatalf("%+v, %v; want started in pod u1", p1, err)
	}
	observe(store.Observation{State: store.StateAttention, Anomaly: "multiple_pods"})
	if st, _ := state(p1.ID); st != store.ProcessRunning {
		t.Errorf("after attention: %s", st)
	}
	observe(store.Observation{State: store.StateRunning, PodUID: "u1"})
	observe(store.Observation{State: store.StateRunning, PodUID: "u2"})
	if st, why := state(p1.ID); st != store.ProcessEnded || why != store.EndPodReplaced {
		t.Errorf("after the pod was replaced: %s %s", st, why)
	}
	p2, _, err := startProcess(t, s, a, lim)
	if err != nil {
		t.Fatal(err)
	}
	p3, _, err := startProcess(t, s, a, lim)
	if err != nil {
		t.Fatal(err)
	}
	s.ExitProcess(ctx, p3.ID, 4)
	observe(store.Observation{State: store.StateStopping, PodUID: "u2"})
	if st, why := state(p2.ID); st != store.ProcessEnded || why != store.EndSandboxStopped {
		t.Errorf("after the stop: %s %s", st, why)
	}
	if st, _ := state(p3.ID); st != store.ProcessExited {
		t.Errorf("an exited process after the stop: %s", st)
	}
}
