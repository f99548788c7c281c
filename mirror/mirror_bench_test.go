package mirror_test

import (
	"context"
	"io"
	"log/slog"
	"path/filepath"
	"runtime"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/hiloop/hiloop/internal/e2e"
	"github.com/hiloop/hiloop/k8s"
	"github.com/hiloop/hiloop/k8s/localcluster"
	"github.com/hiloop/hiloop/mirror"
	"github.com/hiloop/hiloop/store"
)

func heap() uint64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// BenchmarkMirrorMemory mirrors N=2000 running sandboxes (2000 Sandbox
// objects and 2000 pods in the informer caches) and reports the heap the
// mirror holds per sandbox after GC.
func BenchmarkMirrorMemory(b *testing.B) {
	const n = 2000
	c := e2e.NewCluster(b)
	ctx := context.Background()
	db, err := store.Open(ctx, store.Options{Path: filepath.Join(b.TempDir(), "m.db")})
	if err != nil {
		b.Fatal(err)
	}
	defer db.Close()
	org, _ := db.CreateOrg(ctx, "mem", n, n)
	w, err := k8s.NewWriter(c.Clients, k8s.RenderOptions{Namespace: c.Namespace, RuntimeClass: localcluster.RuntimeClass, Transports: []string{"exec"}}, nil)
	if err != nil {
		b.Fatal(err)
	}
	sem := make(chan struct{}, 50)
	var wg sync.WaitGroup
	for range n {
		sb, _, err := db.CreateSandbox(ctx, store.NewSandbox{OrgID: org.ID, Spec: store.Spec{Image: "busybox", ShutdownPolicy: "retain"}})
		if err != nil {
			b.Fatal(err)
		}
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			if err := w.Create(ctx, sb); err != nil {
				b.Error(err)
			}
		}()
	}
	wg.Wait()
	deadline := time.Now().Add(10 * time.Minute)
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
			break
		}
		if time.Now().After(deadline) {
			b.Fatalf("%d of %d pods running", ready, n)
		}
		time.Sleep(time.Second)
	}
	b.ResetTimer()
	for range b.N {
		before := heap()
		m, err := mirror.New(mirror.Options{Clients: c.Clients, Store: db, Namespace: c.Namespace,
			Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
		if err != nil {
			b.Fatal(err)
		}
		mctx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- m.Run(mctx) }()
		for !m.Ready() {
			time.Sleep(50 * time.Millisecond)
		}
		running, _, _ := db.ListSandboxes(ctx, store.ListOptions{OrgID: org.ID, State: store.StateRunning, Limit: n})
		if len(running) != n {
			b.Fatalf("mirror observed %d of %d running", len(running), n)
		}
		after := heap()
		b.ReportMetric(float64(after-before)/n, "heap-bytes/sandbox")
		runtime.KeepAlive(m)
		cancel()
		<-done
	}
}
