package e2e_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/agent-sandbox/api/v1beta1"
	sandboxinformers "sigs.k8s.io/agent-sandbox/clients/k8s/informers/externalversions"

	"github.com/hiloop/hiloop/internal/benchplot"
	"github.com/hiloop/hiloop/internal/e2e"
	"github.com/hiloop/hiloop/internal/eventually"
	"github.com/hiloop/hiloop/k8s"
	"github.com/hiloop/hiloop/receipt"
	"github.com/hiloop/hiloop/store"
)

// percentile returns the p-th percentile (0..100) of ds.
func percentile(ds []time.Duration, p float64) time.Duration {
	s := append([]time.Duration(nil), ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	i := int(float64(len(s)-1) * p / 100)
	return s[i]
}

// floorNamespace makes a namespace for the floor's Sandboxes, with the
// service account hiloop gives an organization's sandboxes.
func floorNamespace(b *testing.B) string {
	ns := e2e.NewNamespace(b)
	if _, err := e2e.SharedCluster(b).Clients.Kube.CoreV1().ServiceAccounts(ns).Create(context.Background(), &corev1.ServiceAccount{
		ObjectMeta: metav1.ObjectMeta{Name: k8s.ServiceAccountName("org_floor")}, AutomountServiceAccountToken: ptr.To(false)}, metav1.CreateOptions{}); err != nil {
		b.Fatal(err)
	}
	return ns
}

// floorSeq numbers the floor's Sandboxes across rounds.
var floorSeq atomic.Int64

// floorCreateToReady creates n Sandbox objects directly with client-go, with
// the service account hiloop gives an organization's sandboxes, and returns
// for each the time from its create call to its pod's Ready condition seen
// by ready's pod informer (the evidence hiloop's mirror waits for), to the
// Sandbox's own Ready=True (which the controller writes after the pod is
// Ready: a later event, kept as a second reference), the create call's own
// time, and the time from its answer to the pod's Ready. The round ends
// once every Sandbox is Ready. Rounds share ns and its readyWatch (see
// floorNamespace), as hiloop's rounds share theirs.
func floorCreateToReady(b *testing.B, ns string, n int, ready *readyWatch) (podReady, sandboxReady, calls, afterCreate []time.Duration) {
	client := e2e.SharedCluster(b).Clients.Sandbox.AgentsV1beta1().Sandboxes(ns)
	var mu sync.Mutex
	started, created := map[string]time.Time{}, map[string]time.Time{}
	var wg sync.WaitGroup
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			id := fmt.Sprintf("sbx_floor%05d", floorSeq.Add(1))
			sb, err := k8s.Render(store.Sandbox{ID: id, OrgID: "org_floor", DesiredMode: store.ModeRunning, Spec: store.Spec{Image: "busybox"}},
				k8s.RenderOptions{Namespace: ns, RuntimeClass: "gvisor", Transports: []receipt.Transport{receipt.TransportExec}})
			if err != nil {
				b.Error(err)
				return
			}
			t0 := time.Now()
			_, err = client.Create(context.Background(), sb, metav1.CreateOptions{})
			t1 := time.Now()
			if err != nil {
				b.Error(err)
				return
			}
			mu.Lock()
			started[id], created[id] = t0, t1
			calls = append(calls, t1.Sub(t0))
			mu.Unlock()
		}()
	}
	wg.Wait()
	if len(started) < n {
		b.Fatalf("floor: %d of %d created", len(started), n)
	}
	ids := make([]string, 0, n)
	for id := range started {
		ids = append(ids, id)
	}
	ready.waitPods(b, ids)
	ready.waitSandboxes(b, ids)
	for id, t0 := range started {
		podReady = append(podReady, ready.podAt(id).Sub(t0))
		sandboxReady = append(sandboxReady, ready.sandboxAt(id).Sub(t0))
		afterCreate = append(afterCreate, ready.podAt(id).Sub(created[id]))
	}
	return podReady, sandboxReady, calls, afterCreate
}

// readyWatch records, for each sandbox of a namespace, when its pod is
// first seen Ready by a pod informer (the floor's evidence) and when its
// Sandbox first shows Ready=True (the controller's last write for it).
type readyWatch struct {
	mu      sync.Mutex
	pod, sb map[string]time.Time
}

// watchReady starts a readyWatch on namespace ns of the shared cluster, of
// Sandboxes, and of pods too when pods is set; it stops with the benchmark.
func watchReady(b *testing.B, ns string, pods bool) *readyWatch {
	w := &readyWatch{pod: map[string]time.Time{}, sb: map[string]time.Time{}}
	seen := func(m map[string]time.Time, id string) {
		now := time.Now()
		w.mu.Lock()
		if m[id].IsZero() {
			m[id] = now
		}
		w.mu.Unlock()
	}
	onPod := func(obj any) {
		if p, ok := obj.(*corev1.Pod); ok && podIsReady(p) {
			seen(w.pod, p.Labels[k8s.LabelSandbox])
		}
	}
	onSandbox := func(obj any) {
		if sb, ok := obj.(*v1beta1.Sandbox); ok && meta.IsStatusConditionTrue(sb.Status.Conditions, string(v1beta1.SandboxConditionReady)) {
			seen(w.sb, sb.Labels[k8s.LabelSandbox])
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	c := e2e.SharedCluster(b).Clients
	podFactory := informers.NewSharedInformerFactoryWithOptions(c.Kube, 0, informers.WithNamespace(ns))
	podInf := podFactory.Core().V1().Pods().Informer()
	podInf.AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: onPod, UpdateFunc: func(_, o any) { onPod(o) }})
	sbFactory := sandboxinformers.NewSharedInformerFactoryWithOptions(c.Sandbox, 0, sandboxinformers.WithNamespace(ns))
	sbInf := sbFactory.Agents().V1beta1().Sandboxes().Informer()
	sbInf.AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: onSandbox, UpdateFunc: func(_, o any) { onSandbox(o) }})
	if pods {
		podFactory.Start(ctx.Done())
	}
	sbFactory.Start(ctx.Done())
	b.Cleanup(func() { cancel(); podFactory.Shutdown(); sbFactory.Shutdown() })
	synced := []cache.InformerSynced{sbInf.HasSynced}
	if pods {
		synced = append(synced, podInf.HasSynced)
	}
	cache.WaitForCacheSync(ctx.Done(), synced...)
	return w
}

// podIsReady reports whether the pod's Ready condition is True.
func podIsReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// waitPods waits until every sandbox of ids has had its pod seen Ready: a
// reader of hiloop can hear of running before this process's own informer
// sees the pod.
func (w *readyWatch) waitPods(b *testing.B, ids []string) { w.waitAll(b, ids, w.pod, "pod") }

// waitSandboxes waits until every sandbox of ids shows Ready=True: the
// controller's last write of a create, so the next round starts on a
// cluster done with this one's, as the floor's rounds do.
func (w *readyWatch) waitSandboxes(b *testing.B, ids []string) { w.waitAll(b, ids, w.sb, "Sandbox") }

func (w *readyWatch) waitAll(b *testing.B, ids []string, m map[string]time.Time, what string) {
	eventually.Within(b, "every "+what+" seen Ready", time.Minute, func() (bool, error) {
		w.mu.Lock()
		defer w.mu.Unlock()
		for _, id := range ids {
			if m[id].IsZero() {
				return false, fmt.Errorf("%s of %s not seen Ready", what, id)
			}
		}
		return true, nil
	})
}

// podAt is when sandbox id's pod was first seen Ready; zero if not yet.
func (w *readyWatch) podAt(id string) time.Time {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.pod[id]
}

// sandboxAt is when sandbox id's Sandbox was first seen Ready; zero if not
// yet.
func (w *readyWatch) sandboxAt(id string) time.Time {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.sb[id]
}

// hiloopCreateToRunning creates n sandboxes concurrently through the API and
// returns, for each, the time from its POST to the answer that says its
// record is running, read through the long poll (see waitRunning); the
// POST's own time; and the time from the POST's answer (within a
// millisecond of the object written) to running. The round ends once the
// controller has marked each Sandbox Ready, as the floor's rounds do.
func hiloopCreateToRunning(b *testing.B, in *e2e.Instance, token string, n int, ready *readyWatch) (running, calls, afterCreate []time.Duration) {
	var mu sync.Mutex
	var ids []string
	createEach(b, in, token, n, n, `{"image":"busybox"}`, func(id string, t0, t1 time.Time) {
		at, ok := waitRunning(b, in, token, id)
		mu.Lock()
		defer mu.Unlock()
		calls = append(calls, t1.Sub(t0))
		if ok {
			ids = append(ids, id)
			running = append(running, at.Sub(t0))
			afterCreate = append(afterCreate, at.Sub(t1))
		}
	})()
	if len(running) < n {
		b.Fatalf("hiloop: %d of %d running", len(running), n)
	}
	// Ended at running, a round left the controller's last writes to slow
	// the next, by half.
	ready.waitSandboxes(b, ids)
	return running, calls, afterCreate
}

// waitRunning follows sandbox id through the API's long poll, GET
// /v1/sandboxes/{id}?while=STATE, which answers when the record's state
// changes, until the record says running, and returns when that answer came
// back. This is the reader's side of hiloop as a pod informer is the
// floor's: told of each change as it is written. (A poll of the list every
// 50 ms, the reader before, was a twelfth of serve's CPU during a round, and
// cost up to 50 ms of resolution.)
func waitRunning(b *testing.B, in *e2e.Instance, token, id string) (time.Time, bool) {
	state := "pending"
	for deadline := time.Now().Add(5 * time.Minute); time.Now().Before(deadline); {
		status, body := in.Call(token, "GET", "/v1/sandboxes/"+id+"?wait=1m&while="+state, "")
		at := time.Now()
		var sb struct{ State string }
		if err := json.Unmarshal([]byte(body), &sb); status != 200 || err != nil {
			b.Errorf("long poll %s: %d %s", id, status, body)
			return time.Time{}, false
		}
		switch sb.State {
		case "running":
			return at, true
		case "pending", "starting":
			state = sb.State
		default:
			b.Errorf("%s is %s, waiting for running", id, sb.State)
			return time.Time{}, false
		}
	}
	b.Errorf("%s not running within five minutes", id)
	return time.Time{}, false
}

// createEach creates n sandboxes through the API, conc at a time, each with
// the JSON body, calling created (in the create's goroutine, within its turn
// of conc) with each one's id, the POST's start and its answer; wait waits
// for all.
func createEach(b *testing.B, in *e2e.Instance, token string, n, conc int, body string, created func(id string, t0, t1 time.Time)) (wait func()) {
	sem := make(chan struct{}, conc)
	var wg sync.WaitGroup
	for range n {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			t0 := time.Now()
			status, answer := in.Call(token, "POST", "/v1/sandboxes", body)
			t1 := time.Now()
			if status != 201 {
				b.Errorf("create: %d %s", status, answer)
				return
			}
			var sb struct{ ID string }
			json.Unmarshal([]byte(answer), &sb)
			created(sb.ID, t0, t1)
		}()
	}
	return wg.Wait
}

// BenchmarkCreateToRunning compares create-to-running through hiloop with the
// floor of the same Sandbox objects created directly, in the same run, N=100
// concurrent each. Both wait for the same evidence, a Ready pod; the floor's
// Sandbox Ready=True is reported as a second reference. Reported: p50/p99 of
// each and the p50 and p99 ratios of hiloop to the pod-Ready floor.
func BenchmarkCreateToRunning(b *testing.B) {
	const n = 100
	ns := e2e.NewNamespace(b)
	in := e2e.Serve(b, filepath.Join(b.TempDir(), "h.db"), ns, "--create-rate-limit", "0", "--rate-limit", "0", "--org-create-rate-limit", "0", "--org-rate-limit", "0")
	in.HTTP = e2e.KeepAlive()
	key := in.NewOrg("bench", 5000, 5000)
	// The test process watches hiloop's Sandboxes as it watches the
	// floor's, so both sides carry that informer, and the Sandbox's Ready
	// ends each round on a settled cluster. It does not watch hiloop's pods:
	// on the floor's side the pod informer is the reader, and on hiloop's
	// the reader is hiloop's, whose own watch of pods is its cost. (A second
	// pod watch on hiloop's side alone had the API server send every pod
	// event of hiloop's rounds twice.)
	pods := watchReady(b, ns, false)
	// Warm both paths once so neither pays for first-use costs.
	floorNS := floorNamespace(b)
	floorReady := watchReady(b, floorNS, true)
	floorCreateToReady(b, floorNS, 10, floorReady)
	hiloopCreateToRunning(b, in, key, 10, pods)
	b.ResetTimer()
	for range b.N {
		// Five blocks of four rounds, floor, hiloop, hiloop, floor: neither
		// side always runs on the cluster the other just warmed or loaded,
		// and each figure pools 1,000 sandboxes over a minute and a half,
		// so a noisy second on this shared machine moves it less (with
		// three blocks, the p50 ratio moved by a tenth from run to run).
		var floor, sbFloor, floorCalls, floorAfter, hl, hlCalls, hlAfter []time.Duration
		var cpu, floorBusy, hlBusy time.Duration
		floorRound := func() {
			busy0 := machineBusy(b)
			p, s, c, a := floorCreateToReady(b, floorNS, n, floorReady)
			floorBusy += machineBusy(b) - busy0
			b.Logf("floor round: p50 %v", percentile(p, 50).Round(time.Millisecond))
			floor, sbFloor, floorCalls, floorAfter = append(floor, p...), append(sbFloor, s...), append(floorCalls, c...), append(floorAfter, a...)
		}
		hiloopRound := func() {
			cpu0, busy0 := cpuTime(b, in.Cmd.Process.Pid), machineBusy(b)
			r, c, a := hiloopCreateToRunning(b, in, key, n, pods)
			cpu += cpuTime(b, in.Cmd.Process.Pid) - cpu0
			hlBusy += machineBusy(b) - busy0
			b.Logf("hiloop round: p50 %v", percentile(r, 50).Round(time.Millisecond))
			hl, hlCalls, hlAfter = append(hl, r...), append(hlCalls, c...), append(hlAfter, a...)
		}
		for range benchBlocks(b, 5) {
			floorRound()
			hiloopRound()
			hiloopRound()
			floorRound()
		}
		ms := func(d time.Duration) float64 { return float64(d.Milliseconds()) }
		b.ReportMetric(ms(percentile(floor, 50)), "floor-p50-ms")
		b.ReportMetric(ms(percentile(floor, 99)), "floor-p99-ms")
		b.ReportMetric(ms(percentile(sbFloor, 50)), "sandbox-ready-p50-ms")
		b.ReportMetric(ms(percentile(hl, 50)), "hiloop-p50-ms")
		b.ReportMetric(ms(percentile(hl, 99)), "hiloop-p99-ms")
		b.ReportMetric(ms(percentile(floorCalls, 50)), "floor-create-call-p50-ms")
		b.ReportMetric(ms(percentile(hlCalls, 50)), "hiloop-post-p50-ms")
		// From the object written (the create call's answer; hiloop's POST
		// answers within a millisecond of it) to the pod's Ready, and for
		// hiloop to running: the cluster's own part, which hiloop's work
		// can slow.
		b.ReportMetric(ms(percentile(floorAfter, 50)), "floor-after-create-p50-ms")
		b.ReportMetric(ms(percentile(hlAfter, 50)), "hiloop-after-create-p50-ms")
		b.ReportMetric(ms(cpu)/float64(len(hl)), "serve-cpu-ms/sandbox")
		// The whole machine's CPU per sandbox, each side's rounds: the
		// cluster, the test process, and on hiloop's side serve. Every
		// component shares these two cores, so what one side costs the
		// machine more, it waits for.
		b.ReportMetric(ms(floorBusy)/float64(len(floor)), "floor-machine-cpu-ms/sandbox")
		b.ReportMetric(ms(hlBusy)/float64(len(hl)), "hiloop-machine-cpu-ms/sandbox")
		b.ReportMetric(float64(percentile(hl, 50))/float64(percentile(floor, 50)), "p50-ratio")
		b.ReportMetric(float64(percentile(hl, 99))/float64(percentile(floor, 99)), "p99-ratio")
	}
}

// benchBlocks is how many blocks of rounds a benchmark runs: def, or
// HILOOP_BENCH_BLOCKS when set, for a quicker look while working on one
// path (the figures of fewer blocks pool fewer sandboxes and move more from
// run to run).
func benchBlocks(b *testing.B, def int) int {
	v := os.Getenv("HILOOP_BENCH_BLOCKS")
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 {
		b.Fatalf("HILOOP_BENCH_BLOCKS=%q: want a whole number of at least 1", v)
	}
	return n
}

// cpuTime is the CPU time, user and system, process pid has used.
func cpuTime(b *testing.B, pid int) time.Duration {
	raw, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		b.Fatal(err)
	}
	// The fields after the command, which is in parentheses; utime and
	// stime are the 14th and 15th of the line, in clock ticks (100 a second).
	f := strings.Fields(string(raw[bytes.LastIndexByte(raw, ')')+2:]))
	utime, _ := strconv.Atoi(f[11])
	stime, _ := strconv.Atoi(f[12])
	return time.Duration(utime+stime) * 10 * time.Millisecond
}

// machineBusy is the CPU time the whole machine has spent busy (in user,
// system and interrupt time), from /proc/stat.
func machineBusy(b *testing.B) time.Duration {
	raw, err := os.ReadFile("/proc/stat")
	if err != nil {
		b.Fatal(err)
	}
	// The first line: "cpu" and the ticks (100 a second) spent in user,
	// nice, system, idle, iowait, irq, softirq, steal...
	line, _, _ := strings.Cut(string(raw), "\n")
	f := strings.Fields(line)
	var ticks int
	for _, i := range []int{1, 2, 3, 6, 7} {
		v, _ := strconv.Atoi(f[i])
		ticks += v
	}
	return time.Duration(ticks) * 10 * time.Millisecond
}

// timeReads measures k GETs of single sandboxes and k/10 lists of 1000 items.
func timeReads(b *testing.B, in *e2e.Instance, token string, ids []string, k int) (get, list []time.Duration) {
	for i := range k {
		t0 := time.Now()
		if s, _ := in.Call(token, "GET", "/v1/sandboxes/"+ids[(i*7919)%len(ids)], ""); s != 200 {
			b.Fatalf("get: %d", s)
		}
		get = append(get, time.Since(t0))
		if i%10 == 0 {
			t0 = time.Now()
			s, body := in.Call(token, "GET", "/v1/sandboxes?limit=1000", "")
			if s != 200 || len(body) < 1000 {
				b.Fatalf("list: %d", s)
			}
			list = append(list, time.Since(t0))
		}
	}
	return get, list
}

// BenchmarkReadsDuringCreates measures GET /v1/sandboxes/{id} and a
// 1000-item list, served from SQLite, in one organization of 1,000, 3,000
// and 10,000 sandboxes (a cluster of its own, grown between sizes through
// the API): first idle, once every sandbox has started (the baseline), then
// while 300 more creates run 10 at a time. It reports p50/p99 of each with
// the loaded/idle ratio.
func BenchmarkReadsDuringCreates(b *testing.B) {
	c := e2e.NewCluster(b)
	in := e2e.ServeOn(b, c, filepath.Join(b.TempDir(), "h.db"), e2e.NamespaceOn(b, c), "--create-rate-limit", "0", "--rate-limit", "0", "--org-create-rate-limit", "0", "--org-rate-limit", "0")
	key := in.NewOrg("reads", 20000, 20000)
	var ids []string
	// What each size measured, for the plot.
	var sizes, getIdle, getP99, listIdle, listP99 []float64
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	for _, n := range []int{1000, 3000, 10000} {
		b.Run(fmt.Sprintf("n=%d", n), func(b *testing.B) {
			if n > len(ids) {
				ids = append(ids, createMany(b, in, key, n-len(ids), 25)...)
			}
			settled(b, in, key)
			b.ResetTimer()
			for range b.N {
				idleGet, idleList := timeReads(b, in, key, ids, 500)
				done := make(chan []string)
				go func() { done <- createMany(b, in, key, 300, 10) }()
				var loadGet, loadList []time.Duration
				var more []string
				for more == nil {
					g, l := timeReads(b, in, key, ids, 50)
					loadGet, loadList = append(loadGet, g...), append(loadList, l...)
					select {
					case more = <-done:
					default:
					}
				}
				ids = append(ids, more...)
				sizes = append(sizes, float64(n))
				getIdle, getP99 = append(getIdle, ms(percentile(idleGet, 50))), append(getP99, ms(percentile(loadGet, 99)))
				listIdle, listP99 = append(listIdle, ms(percentile(idleList, 50))), append(listP99, ms(percentile(loadList, 99)))
				for _, m := range []struct {
					name        string
					idle, under []time.Duration
				}{{"get", idleGet, loadGet}, {"list1000", idleList, loadList}} {
					b.ReportMetric(float64(percentile(m.idle, 50).Microseconds())/1000, m.name+"-idle-p50-ms")
					b.ReportMetric(float64(percentile(m.under, 50).Microseconds())/1000, m.name+"-load-p50-ms")
					b.ReportMetric(float64(percentile(m.under, 99).Microseconds())/1000, m.name+"-load-p99-ms")
					b.ReportMetric(float64(percentile(m.under, 50))/float64(percentile(m.idle, 50)), m.name+"-p50-load/idle")
				}
				settled(b, in, key)
			}
		})
	}
	if len(sizes) == 3 {
		if err := benchplot.Write("scale-reads.png", "BenchmarkReadsDuringCreates", sizes, []benchplot.Series{
			{Name: "GET one sandbox: p50 idle", Unit: "ms", Y: getIdle},
			{Name: "GET one sandbox: p99 while 300 creates run", Unit: "ms", Y: getP99},
			{Name: "list 1000: p50 idle", Unit: "ms", Y: listIdle},
			{Name: "list 1000: p99 while 300 creates run", Unit: "ms", Y: listP99}}); err != nil {
			b.Error(err)
		}
	}
}

// settled waits until no sandbox of the organization is pending or
// starting, so the mirror's work on them is done.
func settled(b *testing.B, in *e2e.Instance, token string) {
	eventually.Within(b, "every sandbox started", 20*time.Minute, func() (bool, error) {
		for _, state := range []string{"pending", "starting"} {
			_, body := in.Call(token, "GET", "/v1/sandboxes?limit=1&state="+state, "")
			var list struct{ Items []struct{ ID string } }
			if err := json.Unmarshal([]byte(body), &list); err != nil || len(list.Items) > 0 {
				return false, fmt.Errorf("%s: %s", state, body)
			}
		}
		return true, nil
	})
}

// createMany creates n sandboxes through the API, conc at a time, and
// returns their ids.
func createMany(b *testing.B, in *e2e.Instance, token string, n, conc int) []string {
	var mu sync.Mutex
	var ids []string
	createEach(b, in, token, n, conc, `{"image":"busybox"}`, func(id string, _, _ time.Time) {
		mu.Lock()
		ids = append(ids, id)
		mu.Unlock()
	})()
	return ids
}

// timeCmd runs a command and returns how long it took.
func timeCmd(b *testing.B, env []string, name string, args ...string) time.Duration {
	cmd := exec.Command(name, args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout = io.Discard
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	t0 := time.Now()
	if err := cmd.Run(); err != nil {
		b.Fatalf("%s %v: %v %s", name, args, err, stderr.String())
	}
	return time.Since(t0)
}

// BenchmarkExecRoundTrip compares `hiloop sandbox exec ID -- true` with
// `kubectl exec POD -- true` on the same pod, interleaved, 50 runs each.
func BenchmarkExecRoundTrip(b *testing.B) {
	in := e2e.Serve(b, filepath.Join(b.TempDir(), "h.db"), e2e.NewNamespace(b), "--create-rate-limit", "0", "--rate-limit", "0", "--org-create-rate-limit", "0", "--org-rate-limit", "0")
	sb := in.Create(in.Token, "busybox", "--wait")
	env := []string{"HILOOP_URL=" + in.URL, "HILOOP_TOKEN=" + in.Token}
	b.ResetTimer()
	for range b.N {
		var hl, kc []time.Duration
		for range 50 {
			hl = append(hl, timeCmd(b, env, e2e.Binary(b), "sandbox", "exec", sb.ID, "--", "true"))
			kc = append(kc, timeCmd(b, nil, "kubectl", "--kubeconfig", e2e.SharedCluster(b).Kubeconfig, "exec", "-n", in.NS, k8s.ObjectName(sb.ID), "--", "true"))
		}
		b.ReportMetric(float64(percentile(hl, 50).Microseconds())/1000, "hiloop-p50-ms")
		b.ReportMetric(float64(percentile(kc, 50).Microseconds())/1000, "kubectl-p50-ms")
		b.ReportMetric(float64(percentile(hl, 50))/float64(percentile(kc, 50)), "p50-ratio")
	}
}

// BenchmarkExecThroughput compares bulk output through hiloop's streaming
// API (the CLI) with `kubectl exec ... cat` of the same 256 MB file.
func BenchmarkExecThroughput(b *testing.B) {
	in := e2e.Serve(b, filepath.Join(b.TempDir(), "h.db"), e2e.NewNamespace(b), "--create-rate-limit", "0", "--rate-limit", "0", "--org-create-rate-limit", "0", "--org-rate-limit", "0")
	sb := in.Create(in.Token, "busybox", "--wait")
	env := []string{"HILOOP_URL=" + in.URL, "HILOOP_TOKEN=" + in.Token}
	const size = 256 << 20
	file := filepath.Join(b.TempDir(), "blob")
	f, err := os.Create(file)
	if err != nil {
		b.Fatal(err)
	}
	if _, err := io.CopyN(f, rand.Reader, size); err != nil {
		b.Fatal(err)
	}
	f.Close()
	b.ResetTimer()
	for range b.N {
		var hl, kc []time.Duration
		for range 3 {
			hl = append(hl, timeCmd(b, env, e2e.Binary(b), "sandbox", "exec", sb.ID, "--", "cat", file))
			kc = append(kc, timeCmd(b, nil, "kubectl", "--kubeconfig", e2e.SharedCluster(b).Kubeconfig, "exec", "-n", in.NS, k8s.ObjectName(sb.ID), "--", "cat", file))
		}
		mbps := func(d time.Duration) float64 { return float64(size) / (1 << 20) / d.Seconds() }
		b.ReportMetric(mbps(percentile(hl, 50)), "hiloop-MB/s")
		b.ReportMetric(mbps(percentile(kc, 50)), "kubectl-MB/s")
		b.ReportMetric(mbps(percentile(hl, 50))/mbps(percentile(kc, 50)), "throughput-ratio")
	}
}

// BenchmarkFloodIsolation: GET p99 for key B while key A floods the API,
// against the same GETs with no flood, in the same run. A's clients send
// their next request as soon as the last is answered, from 8 connections
// (a runaway retry loop) and from 64. The per-key rate limit answers A's
// excess with 429 before any record lookup, and holds each refusal until A
// may retry (at least 100 ms), which paces such clients.
func BenchmarkFloodIsolation(b *testing.B) {
	for _, conns := range []int{8, 64} {
		b.Run(fmt.Sprintf("conns=%d", conns), func(b *testing.B) { benchmarkFlood(b, conns) })
	}
	// The same with A at exactly its allowed rate and no excess: what A's
	// permitted traffic alone costs B.
	b.Run("paced", func(b *testing.B) { benchmarkFlood(b, 0) })
}

func benchmarkFlood(b *testing.B, conns int) {
	in := e2e.Serve(b, filepath.Join(b.TempDir(), "h.db"), e2e.NewNamespace(b))
	keyB := in.NewOrg("flood-b", 10, 10)
	sb := in.Create(keyB, "busybox")
	// Key B stays within its own rate (100/s): one GET every 15 ms.
	gets := func() []time.Duration {
		var ds []time.Duration
		for range 300 {
			t0 := time.Now()
			if s, _ := in.Call(keyB, "GET", "/v1/sandboxes/"+sb.ID, ""); s != 200 {
				b.Fatalf("key B's GET: %d", s)
			}
			ds = append(ds, time.Since(t0))
			time.Sleep(15 * time.Millisecond)
		}
		return ds
	}
	b.ResetTimer()
	for range b.N {
		quiet := gets()
		cmd := exec.Command(os.Args[0])
		cmd.Env = append(os.Environ(), "HILOOP_BENCH_FLOOD_URL="+in.URL+"/v1/sandboxes?limit=100",
			"HILOOP_BENCH_FLOOD_TOKEN="+in.Token, fmt.Sprintf("HILOOP_BENCH_FLOOD_CONNS=%d", conns))
		stdin, err := cmd.StdinPipe()
		if err != nil {
			b.Fatal(err)
		}
		var out bytes.Buffer
		cmd.Stdout = &out
		if err := cmd.Start(); err != nil {
			b.Fatal(err)
		}
		time.Sleep(500 * time.Millisecond)
		flooded := gets()
		stdin.Close()
		if err := cmd.Wait(); err != nil {
			b.Fatalf("flood: %v", err)
		}
		var sent, limited int64
		var secs float64
		if _, err := fmt.Sscan(out.String(), &sent, &limited, &secs); err != nil {
			b.Fatalf("flood output %q: %v", out.String(), err)
		}
		b.ReportMetric(float64(sent)/secs, "flood-req/s")
		b.ReportMetric(float64(percentile(quiet, 99).Microseconds())/1000, "quiet-p99-ms")
		b.ReportMetric(float64(percentile(flooded, 99).Microseconds())/1000, "flooded-p99-ms")
		b.ReportMetric(float64(percentile(flooded, 99))/float64(percentile(quiet, 99)), "p99-ratio")
		b.ReportMetric(float64(limited)/float64(max(sent, 1)), "flood-429-share")
	}
}

// flood sends GETs with token from conns keep-alive connections, each its
// next as soon as the last is answered, until stdin closes; it prints the
// requests sent, those answered 429, and the seconds it ran. With conns 0 it
// sends 100 a second from one connection instead: the default rate limit,
// no excess.
func flood(url, token, conns string) int {
	n, err := strconv.Atoi(conns)
	if err != nil {
		return 2
	}
	var tick <-chan time.Time
	if n == 0 {
		n, tick = 1, time.Tick(10*time.Millisecond)
	}
	stop := make(chan struct{})
	go func() {
		io.Copy(io.Discard, os.Stdin)
		close(stop)
	}()
	start := time.Now()
	var wg sync.WaitGroup
	var sent, limited atomic.Int64
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 1}}
			for {
				select {
				case <-stop:
					return
				default:
				}
				if tick != nil {
					<-tick
				}
				req, _ := http.NewRequest("GET", url, nil)
				req.Header.Set("Authorization", "Bearer "+token)
				resp, err := client.Do(req)
				if err != nil {
					continue
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				sent.Add(1)
				if resp.StatusCode == http.StatusTooManyRequests {
					limited.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	fmt.Println(sent.Load(), limited.Load(), time.Since(start).Seconds())
	return 0
}
