package control

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/hiloop/hiloop/cluster"
	"github.com/hiloop/hiloop/receipt"
)

// Runtime attestation: the receipt says a sandbox's pod was promised gVisor;
// this checks, from inside each new pod, that it got it. Once the mirror
// first sees a pod running it asks (Attest), and a probe reads
// /proc/version in the pod through the exec path every exec takes
// (Options.Exec). gVisor serves its own fixed line there; any other runtime
// shows the host kernel's. What was seen is recorded per pod
// (store.RecordRuntime), and the mirror holds a pod seen outside gVisor to
// be quarantined (runtime_not_gvisor), which refuses every transport.
//
// The probe is hiloop's, not a caller's: it takes no session slot and is no
// use of the sandbox (its idle clock does not start again).

// probe is one way to read the first line of /proc/version in a pod.
type probe struct {
	helper bool // in the session helper's container, else the workload's
	argv   []string
}

// helperProbe runs hiloop's own binary in the session helper's container:
// it needs nothing of the tenant's image, and the workload cannot replace
// it.
var helperProbe = probe{true, []string{"/hiloop", "runtime-probe"}}

// workloadProbes are tried in the workload container, in order: the image
// may have no cat, or no shell at all (then the observation is unknown,
// which is allowed).
var workloadProbes = []probe{
	{false, []string{"cat", "/proc/version"}},
	{false, []string{"sh", "-c", `read -r l </proc/version && echo "$l"`}},
}

const (
	// attestWorkers bounds the probes running at once: a restart of
	// hiloop beside thousands of running pods must not open thousands of
	// exec streams at once.
	attestWorkers = 4
	// maxAttestQueue bounds the pods waiting for a probe. Past it a pod is
	// not queued; the mirror asks again at its next decision about it.
	maxAttestQueue = 10_000
	// maxProbeOutput is what a probe's output is read up to; a kernel's
	// line is a few hundred bytes.
	maxProbeOutput = 4096
	// attestRetry is how long after an attestation that could not reach
	// its pod the mirror is asked to decide again (and so to ask again).
	attestRetry = 5 * time.Second
)

// attestations are the pods waiting for a probe or being probed.
type attestations struct {
	mu      sync.Mutex
	pending map[string]bool // pod uids, queued or being probed
	queue   []attestJob
	workers int
}

type attestJob struct{ id, pod string }

// Attest asks for the runtime of sandbox id's pod podUID to be observed
// from inside it, in the background, once. It returns at once: the mirror
// calls it from its decisions. It does nothing without
// Options.RuntimeAttestation, for a pod already queued or being probed,
// and once the core is closed.
func (c *Control) Attest(id, podUID string) {
	if !c.o.RuntimeAttestation || c.o.Exec == nil || podUID == "" {
		return
	}
	a := &c.attests
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.pending[podUID] || len(a.pending) >= maxAttestQueue || c.base.Err() != nil {
		return
	}
	if a.pending == nil {
		a.pending = map[string]bool{}
	}
	a.pending[podUID] = true
	a.queue = append(a.queue, attestJob{id, podUID})
	if a.workers < attestWorkers {
		a.workers++
		c.bg.Add(1)
		go c.attestLoop()
	}
}

// attestLoop probes queued pods until none is left or the core closes.
func (c *Control) attestLoop() {
	defer c.bg.Done()
	a := &c.attests
	for {
		a.mu.Lock()
		if len(a.queue) == 0 || c.base.Err() != nil {
			a.workers--
			a.mu.Unlock()
			return
		}
		j := a.queue[0]
		a.queue[0] = attestJob{}
		a.queue = a.queue[1:]
		a.mu.Unlock()

		c.attest(j.id, j.pod)

		a.mu.Lock()
		delete(a.pending, j.pod)
		a.mu.Unlock()
	}
}

// attest observes and records the runtime of sandbox id's pod pod. It
// records nothing for a pod that is not the record's, or not serving (the
// mirror asks again when it sees it running), or that was replaced while
// it was probed.
func (c *Control) attest(id, pod string) {
	ctx, cancel := context.WithTimeout(c.base, c.o.AttestTimeout)
	defer cancel()
	rec, err := c.o.Store.SandboxAnyOrg(ctx, id)
	if err != nil || rec.PodUID != pod || rec.RuntimePod == pod {
		return
	}
	promise := receipt.Record(rec.Receipt)
	if promise.Insecure != "" {
		return // nothing was promised
	}
	// The probe runs in the pod of the sandbox's name. The pod was the
	// one probed only when it stood before and still stands after: a
	// pod's name is not reused while it exists.
	if _, err := c.o.Cluster.PodAddr(ctx, id, pod); err != nil {
		// A pod that is not serving changes, and the mirror sees it; a
		// cluster that did not answer is asked again.
		var ns *cluster.PodNotServingError
		if !errors.As(err, &ns) {
			c.retryAttest(id, err)
		}
		return
	}
	seen, release, reached := c.probeRuntime(ctx, id, promise)
	if !reached {
		// No probe got as far as the pod (the API server or the node did
		// not answer): that says nothing of the pod, so nothing is
		// recorded.
		c.retryAttest(id, errors.New("no probe reached the pod"))
		return
	}
	cctx, ccancel := c.clusterCtx()
	defer ccancel()
	if _, err := c.o.Cluster.PodAddr(cctx, id, pod); err != nil {
		return
	}
	wrote, err := c.o.Store.RecordRuntime(cctx, id, pod, seen, release)
	if err != nil || !wrote {
		return
	}
	c.o.Metrics.Attestation(seen)
	if seen == receipt.RuntimeNotGVisor {
		c.log.Warn("sandbox pod seen running outside gVisor; it is quarantined", "sandbox", id, "kernel_release", release)
	} else {
		c.log.Info("runtime attested", "sandbox", id, "runtime_observed", seen, "kernel_release", release)
	}
	c.touch(id)
}

// retryAttest asks the mirror, in attestRetry, to decide about sandbox id
// again: it asks again for the pod it still sees running.
func (c *Control) retryAttest(id string, err error) {
	c.log.Warn("runtime attestation could not reach the cluster; trying again", "sandbox", id, "err", err, "retry_in", attestRetry)
	time.AfterFunc(attestRetry, func() { c.touch(id) })
}

// probeRuntime reads /proc/version in the sandbox's pod, trying the
// session helper first when the pod has one, and classifies the first
// answer that is a kernel's line; unknown when none is. reached reports
// whether any probe's stream was set up (a *cluster.ConnectError says it was
// not): a probe that never reached the pod says nothing of its image.
//
// The workload's probes run the tenant's programs, so their line is the
// image's word. In a pod with a session helper, hiloop's own binary is
// there to answer; when it did not, the workload may have made it fail
// (it shares the helper's network and pod), so the workload's line is
// believed only when it says the pod runs outside gVisor, never to vouch
// for gVisor: that is unknown.
func (c *Control) probeRuntime(ctx context.Context, id string, promise receipt.Receipt) (seen receipt.Runtime, release string, reached bool) {
	probes := workloadProbes
	helper := promise.SessionPort != 0
	if helper {
		probes = append([]probe{helperProbe}, probes...)
	}
	for _, p := range probes {
		answer, ok, r := c.runProbe(ctx, id, p)
		reached = reached || r
		if ok {
			if seen, release := receipt.ClassifyKernel(answer); seen != receipt.RuntimeUnknown {
				if seen == receipt.RuntimeGVisor && helper && !p.helper {
					return receipt.RuntimeUnknown, "", true
				}
				return seen, release, true
			}
		}
		if ctx.Err() != nil {
			break
		}
	}
	return receipt.RuntimeUnknown, "", reached
}

// runProbe runs one probe and returns what it printed when it exited 0
// (ok). A probe that prints past maxProbeOutput is cut there and is no
// answer (a kernel's line is a few hundred bytes): a workload that prints
// without end does not hold the exec stream, and hiloop reading it, until
// the attestation's deadline. reached is as for probeRuntime.
func (c *Control) runProbe(ctx context.Context, id string, p probe) (out string, ok, reached bool) {
	pctx, cancel := context.WithCancel(ctx)
	defer cancel()
	buf := cappedBuffer{full: cancel}
	st, err := c.o.Exec.Exec(pctx, id, cluster.ExecRequest{Helper: p.helper, Command: p.argv, Stdout: &buf})
	var ce *cluster.ConnectError
	reached = !errors.As(err, &ce)
	if err != nil || st.Code != 0 || buf.cut {
		return "", false, reached
	}
	return buf.String(), true, reached
}

// cappedBuffer keeps the first maxProbeOutput bytes written to it; a
// write past them calls full (which cuts the probe) and is not kept. It
// is no bytes.Buffer: io.Copy, as the SPDY exec path copies output, would
// call a buffer's ReadFrom and read past any cap.
type cappedBuffer struct {
	buf  []byte
	full func()
	cut  bool
}

func (b *cappedBuffer) Write(p []byte) (int, error) {
	room := maxProbeOutput - len(b.buf)
	b.buf = append(b.buf, p[:min(len(p), max(room, 0))]...)
	if len(p) > room && !b.cut {
		b.cut = true
		if b.full != nil {
			b.full()
		}
	}
	return len(p), nil
}

func (b *cappedBuffer) String() string { return string(b.buf) }
