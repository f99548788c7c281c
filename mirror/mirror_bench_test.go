package mirror_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/hiloop/hiloop/internal/benchplot"
	"github.com/hiloop/hiloop/internal/e2e"
	"github.com/hiloop/hiloop/k8s"
	"github.com/hiloop/hiloop/localcluster"
	"github.com/hiloop/hiloop/mirror"
	"github.com/hiloop/hiloop/receipt"
	"github.com/hiloop/hiloop/store"
)

func heap() uint64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// BenchmarkMirrorScale grows one cluster to 1,000, 3,000 and 10,000
// running sandboxes (Sandbox objects and kwok pods, records in the store)
// and at each size starts a mirror as a restarted serve does, reporting:
// the time until it is ready with every record reconciled (startup-s), the
// heap it holds per sandbox after GC, and the record's size on disk and
// events per sandbox.
func BenchmarkMirrorScale(b *testing.B) {
	c := e2e.NewCluster(b)
	ctx := context.Background()
	path := filepath.Join(b.TempDir(), "m.db")
	db, err := store.Open(ctx, store.Options{Path: path})
	if err != nil {
		b.Fatal(err)
	}
	defer db.Close()
	org, _ := db.CreateOrg(ctx, "scale", 20000, 20000)
	w, err := k8s.NewWriter(c.Clients, k8s.RenderOptions{Namespace: c.Namespace, RuntimeClass: localcluster.RuntimeClass, Transports: []receipt.Transport{receipt.TransportExec}})
	if err != nil {
		b.Fatal(err)
	}
	have := 0
	grow := func(b *testing.B, n int) {
		sem := make(chan struct{}, 50)
		var wg sync.WaitGroup
		for ; have < n; have++ {
			sb, _, err := db.CreateSandbox(ctx, store.NewSandbox{OrgID: org.ID, Spec: store.Spec{Image: "busybox", ShutdownPolicy: "retain"}})
			if err != nil {
				b.Fatal(err)
			}
			wg.Add(1)
			sem <- struct{}{}
			go func() {
				defer wg.Done()
				defer func() { <-sem }()
				if err := w.Create(ctx, sb, ""); err != nil {
					b.Error(err)
				}
			}()
		}
		wg.Wait()
		deadline := time.Now().Add(20 * time.Minute)
		for {
			pods, err := c.Clients.Kube.CoreV1().Pods(c.Namespace).List(ctx, metav1.ListOptions{ResourceVersion: "0"})
			ready := 0
			if err == nil {
				for _, p := range pods.Items {
					if p.Status.Phase == corev1.PodRunning {
						ready++
					}
				}
			}
			if ready == n {
				return
			}
			if time.Now().After(deadline) {
				b.Fatalf("%d of %d pods running", ready, n)
			}
			time.Sleep(3 * time.Second) // a list of 10,000 pods is not free for the API server
		}
	}
	// What each size measured, for the plot.
	var sizes, startups, heaps, records []float64
	for _, n := range []int{1000, 3000, 10000} {
		b.Run(fmt.Sprintf("n=%d", n), func(b *testing.B) {
			grow(b, n)
			b.ResetTimer()
			for range b.N {
				before := heap()
				start := time.Now()
				m, err := mirror.New(mirror.Options{Clients: c.Clients, Store: db, Namespace: c.Namespace,
					Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
				if err != nil {
					b.Fatal(err)
				}
				mctx, cancel := context.WithCancel(ctx)
				done := make(chan error, 1)
				go func() { done <- m.Run(mctx) }()
				for !m.Ready() {
					time.Sleep(10 * time.Millisecond)
				}
				startup := time.Since(start)
				running, _, _ := db.ListSandboxes(ctx, store.ListOptions{OrgID: org.ID, State: store.StateRunning, Limit: n})
				if len(running) != n {
					b.Fatalf("mirror observed %d of %d running", len(running), n)
				}
				after := heap()
				b.ReportMetric(startup.Seconds(), "startup-s")
				b.ReportMetric(float64(after-before)/float64(n), "heap-bytes/sandbox")
				runtime.KeepAlive(m)
				cancel()
				<-done
				// The record on disk, WAL folded in, and the history of a
				// sample of sandboxes.
				copyPath := filepath.Join(b.TempDir(), "copy.db")
				if err := db.Backup(ctx, copyPath); err != nil {
					b.Fatal(err)
				}
				fi, err := os.Stat(copyPath)
				if err != nil {
					b.Fatal(err)
				}
				b.ReportMetric(float64(fi.Size())/float64(n), "db-bytes/sandbox")
				sizes, startups = append(sizes, float64(n)), append(startups, startup.Seconds())
				heaps, records = append(heaps, float64(after-before)/float64(n)/1024), append(records, float64(fi.Size())/float64(n))
				events := 0
				for _, sb := range running[:20] {
					evs, _ := db.Events(ctx, org.ID, sb.ID)
					events += len(evs)
				}
				b.ReportMetric(float64(events)/20, "events/sandbox")
			}
		})
	}
	if len(sizes) == 3 {
		if err := benchplot.Write("scale-mirror.png", "BenchmarkMirrorScale", sizes, []benchplot.Series{
			{Name: "start-up after a restart, until every record is reconciled", Unit: "s", Y: startups},
			{Name: "mirror heap per sandbox", Unit: "KB", Y: heaps},
			{Name: "record on disk per sandbox", Unit: "bytes", Y: records}}); err != nil {
			b.Error(err)
		}
	}
}
