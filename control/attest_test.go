package control

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/hiloop/hiloop/cluster"
	"github.com/hiloop/hiloop/control/controltest"
	"github.com/hiloop/hiloop/receipt"
	"github.com/hiloop/hiloop/store"
)

const (
	gvisorLine = "Linux version 4.19.0-gvisor #1 SMP Sun Jan 10 15:06:54 PST 2016\n"
	hostLine   = "Linux version 6.1.0-28-amd64 (debian-kernel@lists.debian.org) #1 SMP PREEMPT_DYNAMIC Debian 6.1.119-1 (2024-11-22)\n"
)

// answer is what a fake pod does with one probe: print out and exit with
// code, or fail to run it at all (err). An endless answer prints out
// again and again until its stream is closed, and counts what it wrote in
// wrote.
type answer struct {
	out     string
	code    int
	err     error
	endless bool
	wrote   *int
}

// probeName names a probe as the tests do: the container ("helper" or
// "workload") and the program.
func probeName(req cluster.ExecRequest) string {
	c := "workload"
	if req.Helper {
		c = "helper"
	}
	return c + " " + req.Command[0]
}

// attestCore is a core whose exec answers each probe from answers (a probe
// not in it cannot run), and a running sandbox with or without the session
// helper, observed in the fake's pod.
func attestCore(t *testing.T, helper bool, answers map[string]answer) (*Control, *store.Store, string, func() []string) {
	t.Helper()
	ctx := context.Background()
	db, err := store.Open(ctx, store.Options{Path: filepath.Join(t.TempDir(), "c.db")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	var mu sync.Mutex
	var probes []string
	exec := controltest.Exec{Run: func(ctx context.Context, req cluster.ExecRequest) (cluster.ExitStatus, error) {
		name := probeName(req)
		mu.Lock()
		probes = append(probes, name)
		mu.Unlock()
		a, ok := answers[name]
		if !ok {
			return cluster.ExitStatus{}, &cluster.RemoteError{Message: "executable file not found in $PATH"}
		}
		if a.endless {
			for ctx.Err() == nil {
				n, _ := io.WriteString(req.Stdout, a.out)
				*a.wrote += n
			}
			return cluster.ExitStatus{}, ctx.Err()
		}
		io.WriteString(req.Stdout, a.out)
		return cluster.ExitStatus{Code: a.code}, a.err
	}}
	fc := &controltest.Cluster{}
	if helper {
		fc.Transports = []receipt.Transport{receipt.TransportExec, receipt.TransportForward}
	}
	c, err := New(Options{Store: db, Cluster: fc, Exec: exec, ClusterTimeout: time.Second, RuntimeAttestation: true,
		Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := c.Close(ctx); err != nil {
			t.Error(err)
		}
	})
	org, err := db.CreateOrg(ctx, "o", 100, 100)
	if err != nil {
		t.Fatal(err)
	}
	spec := store.Spec{Image: "busybox"}
	receipt, _ := json.Marshal(fc.Receipt(org.ID, spec))
	sb, _, err := db.CreateSandbox(ctx, store.NewSandbox{OrgID: org.ID, Spec: spec, Receipt: string(receipt)})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.Observe(ctx, sb.ID, store.Observation{State: store.StateRunning, PodUID: controltest.PodUID(sb.ID)}); err != nil {
		t.Fatal(err)
	}
	return c, db, sb.ID, func() []string {
		mu.Lock()
		defer mu.Unlock()
		return append([]string(nil), probes...)
	}
}

// TestAttestProbes: the probes run in order (the session helper's own
// binary first when the pod has one, then cat, then sh) until one prints a
// kernel's line, and the record keeps what it showed; when none does, the
// runtime is unknown.
func TestAttestProbes(t *testing.T) {
	type seen struct {
		Runtime receipt.Runtime
		Release string
		Probes  []string
	}
	endless := strings.Repeat(hostLine, 10_000)
	tests := []struct {
		name    string
		helper  bool
		answers map[string]answer
		want    seen
	}{
		{"the helper reads gVisor's line", true, map[string]answer{"helper /hiloop": {out: gvisorLine}, "workload cat": {out: hostLine}},
			seen{receipt.RuntimeGVisor, "4.19.0-gvisor", []string{"helper /hiloop"}}},
		{"a helper that cannot run leaves it to cat, which cannot vouch for gVisor", true, map[string]answer{"workload cat": {out: gvisorLine}},
			seen{receipt.RuntimeUnknown, "", []string{"helper /hiloop", "workload cat"}}},
		{"a helper that cannot run leaves it to cat, which can show the host", true, map[string]answer{"workload cat": {out: hostLine}},
			seen{receipt.RuntimeNotGVisor, "6.1.0-28-amd64", []string{"helper /hiloop", "workload cat"}}},
		{"a helper that exits non-zero leaves it to cat, which cannot vouch for gVisor", true, map[string]answer{"helper /hiloop": {code: 137}, "workload cat": {out: gvisorLine}, "workload sh": {out: gvisorLine}},
			seen{receipt.RuntimeUnknown, "", []string{"helper /hiloop", "workload cat"}}},
		{"cat reads the host's line", false, map[string]answer{"workload cat": {out: hostLine}},
			seen{receipt.RuntimeNotGVisor, "6.1.0-28-amd64", []string{"workload cat"}}},
		{"no cat: the shell reads it", false, map[string]answer{"workload sh": {out: gvisorLine}},
			seen{receipt.RuntimeGVisor, "4.19.0-gvisor", []string{"workload cat", "workload sh"}}},
		{"cat exits non-zero", false, map[string]answer{"workload cat": {out: hostLine, code: 1}, "workload sh": {out: gvisorLine}},
			seen{receipt.RuntimeGVisor, "4.19.0-gvisor", []string{"workload cat", "workload sh"}}},
		{"cat prints garbage", false, map[string]answer{"workload cat": {out: "garbage\n"}, "workload sh": {out: hostLine}},
			seen{receipt.RuntimeNotGVisor, "6.1.0-28-amd64", []string{"workload cat", "workload sh"}}},
		{"the stream breaks", false, map[string]answer{"workload cat": {out: hostLine, err: errors.New("stream reset")}},
			seen{receipt.RuntimeUnknown, "", []string{"workload cat", "workload sh"}}},
		{"no shell, no cat, no helper", false, nil,
			seen{receipt.RuntimeUnknown, "", []string{"workload cat", "workload sh"}}},
		{"output past the cap is no answer", false, map[string]answer{"workload cat": {out: endless}, "workload sh": {out: gvisorLine}},
			seen{receipt.RuntimeGVisor, "4.19.0-gvisor", []string{"workload cat", "workload sh"}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c, db, id, probes := attestCore(t, tc.helper, tc.answers)
			c.attest(id, controltest.PodUID(id))
			rec, err := db.SandboxAnyOrg(context.Background(), id)
			if err != nil {
				t.Fatal(err)
			}
			if rec.RuntimePod != controltest.PodUID(id) {
				t.Fatalf("attested pod %q, want %q", rec.RuntimePod, controltest.PodUID(id))
			}
			if diff := cmp.Diff(tc.want, seen{rec.RuntimeObserved, rec.RuntimeRelease, probes()}); diff != "" {
				t.Errorf("attestation (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff([]string{id}, c.TakeChanged()); diff != "" {
				t.Errorf("sandboxes the mirror is told of (-want +got):\n%s", diff)
			}
		})
	}
}

// TestAttestEndlessOutput: a workload whose cat prints without end is cut
// once its output passes the cap, rather than read until the
// attestation's deadline, and the next probe runs.
func TestAttestEndlessOutput(t *testing.T) {
	wrote := 0
	c, db, id, probes := attestCore(t, false, map[string]answer{
		"workload cat": {out: strings.Repeat("x", 1000), endless: true, wrote: &wrote},
		"workload sh":  {out: hostLine},
	})
	c.attest(id, controltest.PodUID(id))
	rec, err := db.SandboxAnyOrg(context.Background(), id)
	if err != nil || rec.RuntimeObserved != receipt.RuntimeNotGVisor {
		t.Fatalf("runtime observed %q %v, want not-gvisor from sh", rec.RuntimeObserved, err)
	}
	if diff := cmp.Diff([]string{"workload cat", "workload sh"}, probes()); diff != "" {
		t.Errorf("probes (-want +got):\n%s", diff)
	}
	if wrote > 2*maxProbeOutput {
		t.Errorf("the endless probe wrote %d bytes before it was cut, want at most %d", wrote, 2*maxProbeOutput)
	}
}

// TestProbeOutputCapped: a probe's output is kept up to the cap however
// it is copied in; io.Copy (the SPDY exec path) reads through a
// destination's ReadFrom when it has one.
func TestProbeOutputCapped(t *testing.T) {
	cut := false
	b := cappedBuffer{full: func() { cut = true }}
	if _, err := io.Copy(&b, strings.NewReader(strings.Repeat("x", 1<<20))); err != nil {
		t.Fatal(err)
	}
	if got := len(b.String()); got != maxProbeOutput || !cut {
		t.Errorf("kept %d bytes (cut %v), want %d and cut", got, cut, maxProbeOutput)
	}
}

// TestAttestOnlyTheObservedPod: a pod that is not the record's, or that the
// cluster no longer serves, is not probed; a pod already attested is not
// probed again; Attest runs in the background and tells the mirror.
func TestAttestOnlyTheObservedPod(t *testing.T) {
	c, db, id, probes := attestCore(t, false, map[string]answer{"workload cat": {out: hostLine}})
	c.attest(id, "uid-other") // not the record's pod
	if p := probes(); len(p) != 0 {
		t.Fatalf("a pod that is not the record's was probed: %v", p)
	}
	ctx := context.Background()
	if _, err := db.Observe(ctx, id, store.Observation{State: store.StateRunning, PodUID: "uid-other"}); err != nil {
		t.Fatal(err)
	}
	c.attest(id, "uid-other") // the record's, but the cluster does not serve it
	if p := probes(); len(p) != 0 {
		t.Fatalf("a pod the cluster does not serve was probed: %v", p)
	}
	if _, err := db.Observe(ctx, id, store.Observation{State: store.StateRunning, PodUID: controltest.PodUID(id)}); err != nil {
		t.Fatal(err)
	}

	c.Attest(id, controltest.PodUID(id))
	select {
	case <-c.Changed():
	case <-time.After(30 * time.Second):
		t.Fatal("the attestation never told the mirror")
	}
	rec, err := db.SandboxAnyOrg(ctx, id)
	if err != nil || rec.RuntimeObserved != receipt.RuntimeNotGVisor {
		t.Fatalf("runtime observed %q %v, want not-gvisor", rec.RuntimeObserved, err)
	}
	c.attest(id, controltest.PodUID(id))
	if diff := cmp.Diff([]string{"workload cat"}, probes()); diff != "" {
		t.Errorf("probes (-want +got):\n%s", diff)
	}
}

// TestAttestUnreachable: probes that never reach the pod (the API server
// or the node does not answer) record nothing, and the mirror is asked
// again later rather than told the runtime is unknown.
func TestAttestUnreachable(t *testing.T) {
	unreachable := answer{err: &cluster.ConnectError{Err: errors.New("connection refused")}}
	c, db, id, probes := attestCore(t, false, map[string]answer{"workload cat": unreachable, "workload sh": unreachable})
	c.attest(id, controltest.PodUID(id))
	rec, err := db.SandboxAnyOrg(context.Background(), id)
	if err != nil || rec.RuntimePod != "" || rec.RuntimeObserved != "" {
		t.Fatalf("attested %q as %q (%v) without reaching it", rec.RuntimePod, rec.RuntimeObserved, err)
	}
	if diff := cmp.Diff([]string{"workload cat", "workload sh"}, probes()); diff != "" {
		t.Errorf("probes (-want +got):\n%s", diff)
	}
	select {
	case <-c.Changed():
	case <-time.After(30 * time.Second):
		t.Fatal("the mirror was never asked again")
	}
	if diff := cmp.Diff([]string{id}, c.TakeChanged()); diff != "" {
		t.Errorf("sandboxes the mirror is asked about (-want +got):\n%s", diff)
	}
}

// TestAttestOff: without RuntimeAttestation, Attest probes nothing.
func TestAttestOff(t *testing.T) {
	c, _, id, probes := attestCore(t, false, map[string]answer{"workload cat": {out: hostLine}})
	c.o.RuntimeAttestation = false
	c.Attest(id, controltest.PodUID(id))
	c.attests.mu.Lock()
	queued := len(c.attests.pending)
	c.attests.mu.Unlock()
	if queued != 0 || len(probes()) != 0 {
		t.Fatalf("attestation off: %d queued, probes %v", queued, probes())
	}
}
