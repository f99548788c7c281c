package e2e_test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hiloop/hiloop/internal/e2e"
	"github.com/hiloop/hiloop/internal/eventually"
)

// createTrace is one create's timestamps, from the client, from serve's own
// log lines, and from a pod informer of the benchmark's own.
type createTrace struct {
	apiStart, apiDone time.Time // the POST, as the client sees it
	record, object    time.Time // serve: record written, Sandbox object written
	podReady          time.Time // the pod's Ready condition, seen by an informer here
	running           time.Time // serve: the mirror's write of running
	eventLag          float64   // serve: from the mirror's oldest event for it to that write, ms
	reader            time.Time // the client's first read that shows running
}

// BenchmarkCreateTrace traces creates end to end, one alone and a batch of
// 100 concurrent, and reports the p50 of each step: the API call up to the
// record write, the cluster create, the cluster's own way to a Ready pod,
// the mirror from that pod's Ready to its write of running, and the reader
// (the long poll, as in BenchmarkCreateToRunning) seeing it.
// Serve's steps come from its JSON log (debug level): its clock is this
// machine's.
func BenchmarkCreateTrace(b *testing.B) {
	ns := e2e.NewNamespace(b)
	in := e2e.Serve(b, filepath.Join(b.TempDir(), "h.db"), ns, "--create-rate-limit", "0", "--rate-limit", "0", "--org-create-rate-limit", "0", "--org-rate-limit", "0",
		"--log-format", "json", "--log-level", "debug")
	in.HTTP = e2e.KeepAlive()
	key := in.NewOrg("trace", 5000, 5000)

	var mu sync.Mutex
	traces := map[string]*createTrace{}
	pods := watchReady(b, ns, true)

	batch := func(b *testing.B, n int) []*createTrace {
		var ids []string
		createEach(b, in, key, n, n, `{"image":"busybox"}`, func(id string, t0, t1 time.Time) {
			mu.Lock()
			traces[id] = &createTrace{apiStart: t0, apiDone: t1}
			ids = append(ids, id)
			mu.Unlock()
			at, _ := waitRunning(b, in, key, id) // zero, and an error, when not
			mu.Lock()
			traces[id].reader = at
			mu.Unlock()
		})()
		if b.Failed() {
			b.FailNow()
		}
		pods.waitPods(b, ids)
		pods.waitSandboxes(b, ids) // settled, before the next batch
		out := make([]*createTrace, 0, n)
		mu.Lock()
		for _, id := range ids {
			traces[id].podReady = pods.podAt(id)
			out = append(out, traces[id])
		}
		mu.Unlock()
		return out
	}
	// readLog fills in serve's steps from its log.
	readLog := func(b *testing.B) {
		eventually.Within(b, "serve logged every create", 10*time.Second, func() (bool, error) {
			sc := bufio.NewScanner(strings.NewReader(in.Out.String()))
			sc.Buffer(make([]byte, 1<<20), 1<<20)
			for sc.Scan() {
				var l struct {
					Time       time.Time
					Msg        string
					Sandbox    string
					State      string
					EventLagMS float64 `json:"event_lag_ms"`
				}
				if json.Unmarshal(sc.Bytes(), &l) != nil {
					continue
				}
				mu.Lock()
				if tr := traces[l.Sandbox]; tr != nil {
					switch {
					case l.Msg == "create: record written":
						tr.record = l.Time
					case l.Msg == "create: object written":
						tr.object = l.Time
					case l.Msg == "observed" && l.State == "running":
						tr.running, tr.eventLag = l.Time, l.EventLagMS
					}
				}
				mu.Unlock()
			}
			mu.Lock()
			defer mu.Unlock()
			for id, tr := range traces {
				if tr.record.IsZero() || tr.object.IsZero() || tr.running.IsZero() || tr.podReady.IsZero() {
					return false, fmt.Errorf("%s: incomplete trace %+v", id, *tr)
				}
			}
			return true, nil
		})
	}
	report := func(b *testing.B, trs []*createTrace) {
		step := func(name string, d func(*createTrace) time.Duration) {
			var ds []time.Duration
			for _, tr := range trs {
				ds = append(ds, d(tr))
			}
			b.ReportMetric(float64(percentile(ds, 50).Microseconds())/1000, name+"-p50-ms")
		}
		step("api-to-record", func(t *createTrace) time.Duration { return t.record.Sub(t.apiStart) })
		step("record-to-object", func(t *createTrace) time.Duration { return t.object.Sub(t.record) })
		step("object-to-answer", func(t *createTrace) time.Duration { return t.apiDone.Sub(t.object) })
		step("object-to-pod-ready", func(t *createTrace) time.Duration { return t.podReady.Sub(t.object) })
		step("pod-ready-to-running-written", func(t *createTrace) time.Duration { return t.running.Sub(t.podReady) })
		step("mirror-event-lag", func(t *createTrace) time.Duration { return time.Duration(t.eventLag * float64(time.Millisecond)) })
		step("running-written-to-reader", func(t *createTrace) time.Duration { return t.reader.Sub(t.running) })
		step("total", func(t *createTrace) time.Duration { return t.reader.Sub(t.apiStart) })
	}
	batch(b, 10) // warm the path
	b.ResetTimer()
	for _, n := range []int{1, 100} {
		b.Run(fmt.Sprintf("n=%d", n), func(b *testing.B) {
			for range b.N {
				mu.Lock()
				clear(traces)
				mu.Unlock()
				trs := batch(b, n)
				readLog(b)
				report(b, trs)
			}
		})
	}
}
